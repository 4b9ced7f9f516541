"""Structural positions from dependency trees (Wang et al. 2019; docs/methods.md, Structural positions).

Public API (docs/methods.md, Structural positions)::

    tree_depths(heads) -> list[int]
    structural_relative_positions(heads, clip=None) -> numpy int array [n, n]

plus the pieces the preprocessing builds on: :func:`align_pieces`, :func:`piece_structural_positions`
and :func:`batch_piece_structural_positions` (BPE pieces and the EOS), CoNLL-U reading and writing
(:mod:`~fairseq_posattn.structure.conllu_io`), the parser backends
(:mod:`~fairseq_posattn.structure.parsers`, imported on demand: spaCy and stanza are heavy) and the
sharded, resumable parsing of a whole corpus (:mod:`~fairseq_posattn.structure.parse_pipeline`).
"""

from fairseq_posattn.structure.alignment import (BPE_SEPARATOR, align_pieces, batch_piece_structural_positions,
                                                 piece_structural_positions)
from fairseq_posattn.structure.tree import TreeError, structural_relative_positions, tree_depths

__all__ = [
    "BPE_SEPARATOR",
    "TreeError",
    "align_pieces",
    "batch_piece_structural_positions",
    "piece_structural_positions",
    "structural_relative_positions",
    "tree_depths",
]
