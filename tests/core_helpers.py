"""What the tests of the library build, with torch alone (no fairseq): every registered variant, on the sides
that take it, as a :class:`posattn.SelfAttention` or as the fairseq plugin's attention (its tests), and padded
batches with the side data every registered method reads."""

from typing import List, Mapping, Optional, Sequence, Tuple

import torch

import posattn
from posattn.position_context import PositionContext
from posattn.position_options import side_defaults
from posattn.position_terms.catalogue import all_side_data, all_variants, combined_options
from reference_attention import randomize_

#: the tests' layer: width, heads, and t (the positions of the terms that keep parameters per position)
E, H, T_MAX = 8, 2, 9

#: the side data that registered methods read from batches, by ``net_input`` key (a parse, ...)
SIDE_DATA = all_side_data()
#: the all-at-once model: every method's ``combined`` options
COMBINED = combined_options()


class AllAtOnce(dict):
    """Option values of several methods, built on each side with the methods that side takes."""


#: every registered method's variants, and all methods at once (with the 2d or the 1d convolution)
VARIANTS = {
    **all_variants(),
    "all-at-once": AllAtOnce(COMBINED),
    "all-with-conv-1d": AllAtOnce(COMBINED, conv_attention="1d"),
}


def applies(variant: dict, causal: bool) -> bool:
    """The side takes every method of ``variant`` (an all-at-once variant: always, with the side's methods)."""
    return isinstance(variant, AllAtOnce) or set(variant) <= set(side_defaults("decoder" if causal else "encoder"))


def on_side(variant: dict, causal: bool) -> dict:
    """``variant``'s options that the side takes (causal: a decoder's, else an encoder's); the all-at-once
    variants keep every method the side takes. A variant of methods the side does not take (FoX and CoPE are
    causal only) is a mistake of the test's cases (:func:`side_cases`)."""
    assert applies(variant, causal), f"an encoder takes no {sorted(set(variant) - set(side_defaults('encoder')))}"
    known = side_defaults("decoder" if causal else "encoder")
    return {name: value for name, value in variant.items() if name in known}


def side_cases(variants: Mapping[str, dict], cases: Sequence[Tuple[bool, str]]) -> List[Tuple[str, bool, str]]:
    """``(variant, causal, padding)`` of every variant with every case whose side takes it."""
    return [(name, causal, padding) for name in sorted(variants) for causal, padding in cases
            if applies(variants[name], causal)]


def reads_side_data(variant: dict, causal: bool) -> bool:
    """A method of ``variant`` reads side data from batches (the structural one reads a parse)."""
    options = posattn.position_options(causal, T_MAX, **on_side(variant, causal))
    return bool(options.side_data())


def batch(padding: str, lengths: Sequence[int] = (7, 4, 5)) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """T x B x E inputs (fp64) and a B x T padding mask, padded on the ``left`` or the ``right`` (None for equal
    lengths)."""
    generator = torch.Generator().manual_seed(1)
    T = max(lengths)
    x = torch.randn(T, len(lengths), E, generator=generator, dtype=torch.double)
    mask = torch.zeros(len(lengths), T, dtype=torch.bool)
    for b, n in enumerate(lengths):
        if padding == "left":
            mask[b, : T - n] = True
        else:
            mask[b, n:] = True
    return x, (mask if mask.any() else None)


def side_rows(mask: torch.Tensor) -> dict:
    """Every registered method's side data for a batch padded as ``mask`` ``(batch, length)``, by row name."""
    return {name: values for data in SIDE_DATA.values() for name, values in data.example(mask).items()}


def context(mask: Optional[torch.Tensor], x: torch.Tensor, causal: bool = False) -> PositionContext:
    """The context of the T x B x E batch ``x`` as a side builds it: right padding (or none) as a decoder, left
    padding as an encoder (token positions from the mask), with every registered method's side data for it."""
    if mask is None:
        mask = torch.zeros(x.size(1), x.size(0), dtype=torch.bool)
    return PositionContext.from_padding(mask, right_padded=not bool(mask[:, 0].any()), side_data=side_rows(mask),
                                        causal=causal)


def build_self_attention(variant: dict, causal: bool, seed: int = 0, **options) -> posattn.SelfAttention:
    """The library's self-attention of ``variant`` on the side ``causal`` picks, fp64, every parameter random."""
    attn = posattn.SelfAttention(E, H, causal=causal, max_positions=T_MAX, **on_side(variant, causal), **options)
    randomize_(attn.double(), seed)
    return attn.eval()
