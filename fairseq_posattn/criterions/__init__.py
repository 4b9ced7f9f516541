from fairseq_posattn.criterions import pos_tagging  # noqa: F401
