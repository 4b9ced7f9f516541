from fairseq_posattn.optim import rmsprop  # noqa: F401
