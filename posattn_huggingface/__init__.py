"""Position methods in Hugging Face transformers models: one call turns a model of a family the front-end takes
(``families.FAMILIES``: Llama, GPT-2, BERT, Qwen2, Qwen3, Mistral, Gemma 2 and 3, Phi-3, OLMo-2, GPT-NeoX, RoBERTa,
ModernBERT) into the same model with a position method, through transformers' own extension points (no patch of its
functions).

:func:`apply_position_method` gives every self-attention module of the model its layer's method
(:func:`posattn.position_method`, all built from one :func:`posattn.position_options` of the model, so that
side-wide tables are shared), registered as the submodule ``position_method`` (saved, trained, moved with the
model), and switches the model to the attention implementation ``"posattn_huggingface"``: a mask function registered
with ``AttentionMaskInterface`` turns transformers' 2D padding mask into the batch's
:class:`~posattn.position_context.PositionContext` once per forward pass (every layer receives it as its
``attention_mask``), and an attention function registered with ``AttentionInterface`` computes each layer's
attention with its method. :func:`from_pretrained` loads a model that ``save_pretrained`` wrote with its method
(recorded in ``config.json`` with the implementation, which transformers' own ``from_pretrained`` refuses where this
package has not registered it).

A file per job: ``families`` (the models taken and how each turns its own positions off), ``layer_features`` (what
a family's layers bring beside q, k and v: sliding windows, logit soft-capping), ``switch`` (the one
call, the registration, the record), ``mask_function``, ``attention_function`` (with the forward pre-hook),
``decoding_state`` (the method's state in transformers' cache), ``static_cache`` (generation with a static cache,
compiled), ``loading``; ``names`` (what is registered and
recorded, and the refusal).

This package, beside the library and on top of it, imports transformers (the extra ``[hf]``); ``import posattn``
needs torch alone. docs/huggingface.md says what works and what is refused.
"""

from posattn_huggingface.compatibility import require_versions

require_versions()  # before transformers is imported: a transformers or torch outside the tested ranges, one line

from posattn_huggingface.attention_function import method_attention, pass_input_and_state
from posattn_huggingface.decoding_state import DecodingStateLayer, decoding_state_layer, keeps_decoding_state, \
    reads_layer_input
from posattn_huggingface.families import FAMILIES, Family, UnrotatedPositions, family_of
from posattn_huggingface.loading import from_pretrained
from posattn_huggingface.mask_function import BatchPositions, batch_positions
from posattn_huggingface.names import CONFIG_RECORD, DECODING_STATE, IMPLEMENTATION, IMPLEMENTATION_KEY, \
    LAYER_INPUT, METHOD_ATTRIBUTE, NEED_WEIGHTS, HuggingFaceRefusal
from posattn_huggingface.static_cache import StaticDecodingStateLayer
from posattn_huggingface.switch import apply_position_method, logger, register_functions, side_options

# registered on import: a folder saved with a method (config.json names the implementation) then loads with
# transformers' own from_pretrained, and its modules, which lack their methods, refuse the first call in one line
register_functions()

__all__ = [
    "apply_position_method", "from_pretrained", "HuggingFaceRefusal", "Family", "FAMILIES", "family_of",
    "UnrotatedPositions", "side_options", "register_functions", "batch_positions", "method_attention",
    "pass_input_and_state", "DecodingStateLayer", "decoding_state_layer", "keeps_decoding_state", "reads_layer_input",
    "BatchPositions", "StaticDecodingStateLayer", "IMPLEMENTATION", "IMPLEMENTATION_KEY", "CONFIG_RECORD",
    "METHOD_ATTRIBUTE", "LAYER_INPUT", "DECODING_STATE", "NEED_WEIGHTS", "logger",
]
