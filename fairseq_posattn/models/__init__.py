from fairseq_posattn.models import transformer_lm_posattn, transformer_posattn  # noqa: F401
