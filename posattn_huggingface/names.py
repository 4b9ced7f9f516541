"""The names this front-end registers with transformers and records in a model, and its refusal."""

from posattn.errors import UserError

#: the name under which the attention and mask functions are registered (the model's ``attn_implementation``),
#: also written to config.json (:data:`IMPLEMENTATION_KEY`): transformers' own ``from_pretrained`` of a saved folder
#: then asks for it, and refuses it where this package has not registered it, naming it
IMPLEMENTATION = "posattn_huggingface"
#: the key of config.json from which transformers' configurations take their attention implementation
IMPLEMENTATION_KEY = "attn_implementation"
#: the configuration's attribute (a key of ``config.json``) that records the model's method
CONFIG_RECORD = "posattn_position_method"
#: the submodule of each self-attention module that holds its layer's method
METHOD_ATTRIBUTE = "position_method"
#: the keyword arguments by which the forward pre-hook hands the attention function the layer input (for
#: token-difference terms), the cache's layer that keeps the method's decoding state (``DecodingStateLayer``,
#: ``StaticDecodingStateLayer``) and whether the call returns the attention weights (``output_attentions``)
LAYER_INPUT, DECODING_STATE, NEED_WEIGHTS = "posattn_layer_input", "posattn_decoding_state", "posattn_need_weights"


class HuggingFaceRefusal(UserError, ValueError):
    """A model, method or checkpoint that this front-end does not take; the message names what would work."""
