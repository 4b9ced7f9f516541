from fairseq_posattn.models import (  # noqa: F401
    attentive_lstm,
    san_tagger,
    transformer_classifier_posattn,
    transformer_lm_posattn,
    transformer_posattn,
)
