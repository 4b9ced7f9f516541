from fairseq_posattn.models import transformer_lm_posattn, transformer_posattn  # noqa: F401
from fairseq_posattn.models import attentive_lstm_lm  # noqa: F401,E402
