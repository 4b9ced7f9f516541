"""Build small models through fairseq's own argument parsing, as fairseq-train does."""

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from fairseq.data import Dictionary

from fairseq_posattn.models import building
from posattn.position_options import SidePositionOptions
from fairseq_posattn.modules.attention import PositionAwareMultiheadAttention
from posattn.position_terms.catalogue import all_variants, combined_options, variant_flags
from posattn.position_terms.registry import SIDES
from core_helpers import SIDE_DATA
from reference_attention import randomize_

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "fairseq_posattn")

TINY_LM = [
    "--task", "language_modeling", "--decoder-layers", "2", "--decoder-embed-dim", "16",
    "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
    "--tokens-per-sample", "24", "--max-target-positions", "24",
]
TINY = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--max-source-positions", "24", "--max-target-positions", "24",
]



class TinyTask:
    """What ``build_model`` reads from a translation task: the two dictionaries, and the keys of the side data
    its batches carry (by default every registered method's, as the tests' batches do: :func:`side_inputs`)."""

    def __init__(self, vocab_size: int = 20, collated_side_data: Optional[Sequence[str]] = None):
        self.source_dictionary = Dictionary()
        for i in range(vocab_size):
            self.source_dictionary.add_symbol(f"w{i}")
        self.target_dictionary = self.source_dictionary
        self.collated_side_data = tuple(SIDE_DATA if collated_side_data is None else collated_side_data)


def side_inputs(tokens: torch.Tensor, pad: int = 1) -> Dict[str, torch.Tensor]:
    """Every registered method's side data for a batch of ``tokens`` ``(batch, length)``, collated as a task
    collates it (each method's example data, padded as the tokens are): the model reads what its methods need."""
    return {key: data.collate(tokens.eq(pad)) for key, data in SIDE_DATA.items()}


def parse_model_args(arch: str, extra: List[str], tiny: List[str] = TINY):
    return building.parse_model_args(["--arch", arch, *tiny, *extra])


def build_model(arch: str, extra: List[str], task: TinyTask = None, tiny: List[str] = TINY):
    """Build as fairseq-train does: parse, convert to the hydra config, ``models.build_model``."""
    return building.build_model(["--arch", arch, *tiny, *extra], task or TinyTask())


def build_lm(arch: str, extra: List[str]):
    return build_model(arch, extra, tiny=TINY_LM)


#: by side, every registered method's variants that the side takes (the registry's), and all of them at once
SIDE_VARIANTS: Dict[str, Dict[str, Mapping[str, Any]]] = {
    side: {**all_variants(side), "combined": combined_options(side)} for side in SIDES}


def reads_side_data(side: str, variant: str) -> bool:
    """``variant``'s methods read side data from every batch (a parse...), which only some tasks collate."""
    options = SidePositionOptions(side, side == "decoder", 24, "--max-positions", **SIDE_VARIANTS[side][variant])
    return bool(options.side_data())


def side_flags(side: str, variant: str) -> List[str]:
    return variant_flags(side, SIDE_VARIANTS[side][variant])


def both_sides(variant: str) -> List[str]:
    """The flags of ``variant`` on each side that takes it (FoX and CoPE: the decoder only)."""
    return [flag for side in SIDES if variant in SIDE_VARIANTS[side] for flag in side_flags(side, variant)]


def randomized(model):
    """Random values for position parameters (most start at zero or one)."""
    assert any(isinstance(m, PositionAwareMultiheadAttention) for m in model.modules()), \
        "the options did not reach the model: no position-aware attention was built"
    for module in model.modules():
        if isinstance(module, PositionAwareMultiheadAttention):
            for name, term in module.named_children():
                if name not in ("q_proj", "k_proj", "v_proj", "out_proj", "dropout_module"):
                    randomize_(term, seed=len(name))
        for shared in getattr(module, "position_shared", {}).values():  # a side's modules (T5's table)
            randomize_(shared, seed=1)
    return model.eval()
