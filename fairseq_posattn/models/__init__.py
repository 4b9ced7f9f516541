from fairseq_posattn.models import attentive_lstm_lm, transformer_lm_posattn, transformer_posattn  # noqa: F401
