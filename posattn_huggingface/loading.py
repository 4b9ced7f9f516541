"""Loading a model that ``save_pretrained`` wrote after the switch: the record read from config.json, the model
loaded by transformers, switched again, and the methods' tensors loaded from the folder's safetensors files."""

import json
import os
from typing import Any, Dict, List, Optional, Type

import transformers
from torch import Tensor
from transformers import PreTrainedModel

from posattn_huggingface.families import family_of
from posattn_huggingface.names import CONFIG_RECORD, METHOD_ATTRIBUTE, HuggingFaceRefusal
from posattn_huggingface.switch import attach, describe, register_functions


def from_pretrained(model_class: Type[PreTrainedModel], path: str, *, expected_options: Optional[Dict[str, Any]] = None,
                    **load_kwargs: Any) -> PreTrainedModel:
    """Load a model that ``save_pretrained`` wrote after :func:`~posattn_huggingface.apply_position_method`, with its
    method.

    Args:
        model_class: the class to load (``LlamaForCausalLM``, ``BertModel``, ...).
        path: the folder ``save_pretrained`` wrote.
        expected_options: the method the caller expects (``position_options``' names); another recorded one is
            refused. None: the recorded one.
        load_kwargs: ``model_class.from_pretrained``'s other arguments (``dtype``, ...).

    Raises:
        HuggingFaceRefusal: the folder records no method, or another than ``expected_options``, or its weights
            lack some of the method's.
    """
    config = model_class.config_class.from_pretrained(path)
    record = getattr(config, CONFIG_RECORD, None)
    if record is None:
        raise HuggingFaceRefusal(f"{path} was saved without a position method: load it with "
                                 f"{model_class.__name__}.from_pretrained (apply_position_method to fine-tune it)")
    if expected_options is not None and dict(expected_options) != record["options"]:
        raise HuggingFaceRefusal(f"{path} was saved with {describe(record)}, not "
                                 f"{describe(dict(record, options=expected_options))}")
    delattr(config, CONFIG_RECORD)
    register_functions()  # the implementation config.json names (the modules get their methods below)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the method's weights are loaded below, not by transformers
    try:
        model = model_class.from_pretrained(path, config=config, **load_kwargs)
    finally:
        transformers.logging.set_verbosity(verbosity)
    attach(model, family_of(model), record)
    _load_method_weights(model, path)
    return model


def _load_method_weights(model: PreTrainedModel, path: str) -> None:
    """Load the methods' parameters and buffers from the folder's safetensors files; refuse if some are absent."""
    from safetensors.torch import load_file

    wanted = {name for name in model.state_dict() if f".{METHOD_ATTRIBUTE}." in name}
    found: Dict[str, Tensor] = {}
    for file in _weight_files(path):
        found.update({name: tensor for name, tensor in load_file(file).items() if name in wanted})
    missing = sorted(wanted - set(found))
    if missing:
        raise HuggingFaceRefusal(f"{path} lacks {len(missing)} of the method's tensors ({missing[0]}, ...): it "
                                 "was saved with another method or without one")
    model.load_state_dict(found, strict=False)


def _weight_files(path: str) -> List[str]:
    """The folder's safetensors files (one, or the shards its index names)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(path, shard) for shard in shards]
    return [os.path.join(path, "model.safetensors")]
