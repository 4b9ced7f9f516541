from fairseq_posattn.tasks import pos_tagging, translation_structural  # noqa: F401
