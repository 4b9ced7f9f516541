"""Per-token structural side data, in the form the model reads (docs/methods.md, Structural positions).

Instead of an O(n^2) relative matrix per sentence, each binarized source token carries three
integers: its word's tree depth (``abs``), and the entry and exit times ``tin``/``tout`` of its word
in a depth-first walk of the parse (a forest: each root in word order). Word a is an ancestor of (or
is) word b exactly when ``tin[a] <= tin[b]`` and ``tout[b] <= tout[a]``, so the model rebuilds every
relative structural position of a batch at once
(:func:`fairseq_posattn.modules.position_context.structural_relative`). The EOS that
fairseq-preprocess appends gets ``abs = 1 + max abs`` and ``tin = tout = -1`` (on no path).
"""

from typing import List, Sequence

import numpy as np

from fairseq_posattn.structure.tree import tree_depths

#: rows of the side data array
DEPTH, TIN, TOUT = 0, 1, 2


def tree_walk(heads: Sequence[int]) -> np.ndarray:
    """``(3, n)`` depth, entry time and exit time of every word, in one depth-first walk of the forest.

    A bad tree (head out of range, a cycle, no root) leaves words unreached or out of range; then
    :func:`~fairseq_posattn.structure.tree_depths` raises its ValueError that names the problem.
    """
    n = len(heads)
    children: List[List[int]] = [[] for _ in range(n + 1)]  # 0 = virtual root of the forest
    try:
        for word, head in enumerate(heads, start=1):
            children[head].append(word)
    except (IndexError, TypeError):
        tree_depths(heads)
        raise
    depth, tin, tout = [-1] * (n + 1), [0] * (n + 1), [0] * (n + 1)
    depth[0] = -1
    clock = 0
    stack = [0]  # node to enter, or ~node to leave
    while stack:
        node = stack.pop()
        clock += 1
        if node < 0:
            tout[~node] = clock
            continue
        tin[node] = clock
        stack.append(~node)
        for child in reversed(children[node]):
            depth[child] = depth[node] + 1
            stack.append(child)
    if min(depth[1:], default=0) < 0:  # unreached: a cycle, or no root
        tree_depths(heads)
        raise ValueError(f"malformed dependency tree (heads {list(heads)})")
    return np.array([depth, tin, tout], dtype=np.int32)[:, 1:]


def token_side_data(heads: Sequence[int], piece_to_word: np.ndarray, append_eos: bool = True) -> np.ndarray:
    """``(3, m + 1)`` int32 array (depth, tin, tout) for m pieces and the EOS.

    ``heads`` are the words' CoNLL-U heads (validated: a bad tree raises ValueError naming it);
    ``piece_to_word`` the 0-based word of every piece (:func:`~fairseq_posattn.structure.alignment.align_pieces`).
    """
    walk = tree_walk(heads)
    m = len(piece_to_word)
    side = np.empty((3, m + 1 if append_eos else m), dtype=np.int32)
    side[:, :m] = walk[:, piece_to_word]
    if append_eos:
        side[:, m] = (walk[DEPTH].max(initial=-1) + 1, -1, -1)
    return side
