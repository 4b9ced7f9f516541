from fairseq_posattn.tasks import translation_structural  # noqa: F401
