from fairseq_posattn.models import transformer_posattn  # noqa: F401
