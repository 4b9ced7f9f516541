"""Sharded data parallelism (FSDP2, ``torch.distributed.fsdp.fully_shard``) for models whose layers share side-wide
modules (docs/distributed.md, "Sharded training").

FSDP2 gathers a sharded module's parameters before its forward and, by default, frees them again after it. A
side-wide module (a bias table of the whole side, with :func:`~posattn.position_options.position_options` shared by a
model's layers) is registered on the first layer (``position_shared``) and read by every later layer,
after the first has freed it: sharded per layer as usual, the later layers would read a shard. Sharding it apart
(``ignored_params``) leaves its gradient unreduced, each rank's table drifting from the others'. So the layer that
owns it stays gathered through the forward pass (``reshard_after_forward=False``, as FSDP2 already keeps the root);
every other layer is sharded as asked. A term that reads a side-wide parameter still sharded refuses in one line
(:func:`gathered`).

``torch.distributed`` is imported where it is used: the core runs on builds of torch without it.
"""

import sys
from typing import Any, Iterable, List

from torch import Tensor, nn

from posattn.errors import MisuseError

#: what a refusal points to
RECIPE = ("shard the model with posattn.fully_shard_layers(model, layers), which keeps the layer that owns "
          "side-wide modules gathered through the forward pass; a model sharded by another tool (accelerate): "
          "posattn.keep_side_wide_modules_gathered(model) after it is sharded")


def owns_side_wide_modules(module: nn.Module) -> bool:
    """Whether ``module`` or a module under it registers side-wide modules (a non-empty ``position_shared``)."""
    return any(len(getattr(sub, "position_shared", None) or ()) > 0 for sub in module.modules())


def fully_shard_layers(model: nn.Module, layers: Iterable[nn.Module], **fsdp_arguments: Any) -> nn.Module:
    """Shard each of ``layers`` (a model's blocks, in order) and then ``model`` with FSDP2's ``fully_shard``
    (``fsdp_arguments``: its keywords, such as ``mesh`` or ``mp_policy``), the layers that own side-wide modules
    gathered through the forward pass. Needs an initialised process group. Returns ``model``, sharded in place."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not dist.is_available() or not dist.is_initialized():
        raise MisuseError("fully_shard_layers needs an initialised process group "
                          "(torch.distributed.init_process_group, or a launcher such as torchrun)")
    layers = list(layers)
    if not layers or not all(isinstance(layer, nn.Module) for layer in layers):
        raise MisuseError(f"layers must be the model's blocks (nn.Module), got {[type(x).__name__ for x in layers]}")
    within = {id(module) for module in model.modules()}
    outside = [index for index, layer in enumerate(layers) if id(layer) not in within]
    if outside:
        raise MisuseError(f"layers {outside} are not modules of model: give the blocks of the model to shard")
    side_wide = {id(p) for sub in model.modules() for p in (getattr(sub, "position_shared", None) or nn.ModuleDict())
                 .parameters()}
    if any(id(p) in side_wide for p in fsdp_arguments.get("ignored_params") or ()):
        raise MisuseError("ignored_params holds side-wide parameters (position_shared): their gradients would not "
                          "be reduced across processes and each rank's copy would drift; leave them to "
                          "fully_shard_layers, which keeps them gathered where they are read")
    for layer in layers:
        owner = {"reshard_after_forward": False} if owns_side_wide_modules(layer) else {}
        fully_shard(layer, **{**fsdp_arguments, **owner})
    fully_shard(model, **fsdp_arguments)
    return model


def keep_side_wide_modules_gathered(model: nn.Module) -> List[str]:
    """For a model another tool sharded with FSDP2 (accelerate's ``fsdp_version: 2``): the sharded modules that
    own side-wide modules stay gathered through the forward pass from the next step on. Returns their names."""
    from torch.distributed.fsdp import FSDPModule

    kept = []
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule) and owns_side_wide_modules(module) and not any(
                isinstance(sub, FSDPModule) and owns_side_wide_modules(sub) for sub in list(module.modules())[1:]):
            module.set_reshard_after_forward(False, recurse=False)
            kept.append(name)
    return kept


def gathered(parameter: Tensor, where: str) -> Tensor:
    """``parameter``, a side-wide module's, refused in one line where it is still a shard (a ``DTensor``): the
    layer that owns it was sharded to free it after its forward. A type check, no synchronisation."""
    if type(parameter) not in (nn.Parameter, Tensor) and "torch.distributed.tensor" in sys.modules:
        from torch.distributed.tensor import DTensor
        if isinstance(parameter, DTensor):
            raise MisuseError(f"{where}: the side-wide parameter is still sharded across processes where a later "
                              f"layer reads it (FSDP freed it after the first layer's forward pass); {RECIPE}")
    return parameter
