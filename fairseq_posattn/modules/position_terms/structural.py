"""Relative structural position representations (Wang et al. 2019, 3.2; SPEC.md section 6).

Shaw-style key and value embeddings indexed by the clipped relative structural position of each
(query, key) pair, a table of their own; with sequential Shaw embeddings also on, both tables add.
"""

from torch import Tensor

from fairseq_posattn.modules.position_context import PositionContext
from fairseq_posattn.modules.position_terms.relative_embeddings import RelativePositionEmbeddings


class StructuralRelativeEmbeddings(RelativePositionEmbeddings):
    """Bucket ``rel_stru(i, j) + r`` with ``rel_stru`` clipped to ``[-r, r]``."""

    def buckets(self, ctx: PositionContext, tgt_len: int, src_len: int) -> Tensor:
        return ctx.structural_buckets(tgt_len, src_len) + self.clip
