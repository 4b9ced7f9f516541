"""The position terms, one file per method; importing the package registers every method.

The import order below is the registration order: the order of the options in ``--help`` and of
the terms within a kind (see :mod:`posattn.position_terms.registry`).
"""

from posattn.position_terms import (  # noqa: F401  (each file registers its method)
    direct,
    temperature,
    convolution,
    distance_aware,
    relative_embeddings,
    structural,
    t5_bias,
    alibi,
    rotary,
    kerple,
    sandwich,
    fire,
    xpos,
    p_rope,
    hope,
    polar,
    forget_gate,
    contextual,
    scalable_softmax,
    cable,
    selective,
    stick_breaking,
    path_attention,
    multi_token,
    dape,
)
