"""posattn: position-aware self-attention for PyTorch, every method behind one kernel; needs torch alone.

The public interface (shapes in each docstring):

- :func:`position_attention` ``(q, k, v, method, ...)``: attention with a layer's position method, called as
  ``torch.nn.functional.scaled_dot_product_attention`` is (padding, causality, a decoding cache, the kernel path);
- :class:`SelfAttention`: a self-attention module with projections and a :class:`DecodingCache`, for plain
  PyTorch models (``SelfAttention(d, heads, causal=True, **method_options)``);
- :func:`position_method`: a layer's method alone (its terms), for a model that keeps its projections;
- :func:`position_options`: a side's options from Python, by the command-line options' names without the side,
  shared by a model's layers; :func:`describe_options` lists every option with its values, default and meaning;
- :func:`batch_context`: one batch's positions, built once and passed to every layer;
- :func:`fully_shard_layers`: FSDP2 sharding of a model's layers that keeps side-wide modules whole where they are
  read (:mod:`posattn.sharding`).

Misuse is refused in one line, a :class:`UserError` (:class:`ArgumentError`, :class:`MisuseError`,
:class:`PositionOptionError`, ...). docs/pytorch.md is the interface's reference.

The methods are registered in :mod:`posattn.position_terms` (one file each); the fairseq plugin
(``fairseq_posattn``) is a front-end of this package.
"""

__version__ = "0.5.0"  # the one source of the version (setup.py reads it; CHANGELOG.md)

from posattn.decoding import DecodingCache  # noqa: E402
from posattn.errors import ArgumentError, MisuseError, UserError  # noqa: E402
from posattn.functional import batch_context, position_attention  # noqa: E402
from posattn.position_method import position_method  # noqa: E402
from posattn.position_options import (  # noqa: E402
    OptionTypeError,
    PositionOptionError,
    SidePositionOptions,
    describe_options,
    position_options,
)
from posattn.position_terms.base import SequenceTooLongError  # noqa: E402
from posattn.self_attention import SelfAttention  # noqa: E402
from posattn.sharding import fully_shard_layers, keep_side_wide_modules_gathered  # noqa: E402

__all__ = ["ArgumentError", "DecodingCache", "MisuseError", "OptionTypeError", "PositionOptionError", "SelfAttention",
           "SequenceTooLongError", "SidePositionOptions", "UserError", "batch_context", "describe_options",
           "fully_shard_layers", "keep_side_wide_modules_gathered", "position_attention", "position_method",
           "position_options"]
