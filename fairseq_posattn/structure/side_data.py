"""Per-token structural side data, in the form the model reads (SPEC.md section 6).

Instead of an O(n^2) relative matrix per sentence, each binarized source token carries three
integers: its word's tree depth (``abs``), and the entry and exit times ``tin``/``tout`` of its word
in a depth-first walk of the parse (a forest: each root in word order). Word a is an ancestor of (or
is) word b exactly when ``tin[a] <= tin[b]`` and ``tout[b] <= tout[a]``, so the model rebuilds every
relative structural position of a batch at once
(:func:`fairseq_posattn.modules.position_context.structural_relative`). The EOS that
fairseq-preprocess appends gets ``abs = 1 + max abs`` and ``tin = tout = -1`` (on no path).
"""

from typing import List, Sequence, Tuple

import numpy as np

from fairseq_posattn.structure.tree import tree_depths

#: rows of the side data array
DEPTH, TIN, TOUT = 0, 1, 2


def euler_times(heads: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
    """Entry and exit times of every word in a depth-first walk of the (valid) tree or forest."""
    n = len(heads)
    children: List[List[int]] = [[] for _ in range(n + 1)]  # 0 = virtual root of the forest
    for word, head in enumerate(heads, start=1):
        children[head].append(word)
    tin = np.empty(n + 1, dtype=np.int64)
    tout = np.empty(n + 1, dtype=np.int64)
    clock = 0
    stack = [(0, iter(children[0]))]
    tin[0] = clock
    while stack:
        node, pending = stack[-1]
        child = next(pending, None)
        if child is None:
            stack.pop()
            clock += 1
            tout[node] = clock
        else:
            clock += 1
            tin[child] = clock
            stack.append((child, iter(children[child])))
    return tin[1:], tout[1:]


def token_side_data(heads: Sequence[int], piece_to_word: np.ndarray, append_eos: bool = True) -> np.ndarray:
    """``(3, m + 1)`` int32 array (depth, tin, tout) for m pieces and the EOS.

    ``heads`` are the words' CoNLL-U heads (validated: a bad tree raises ValueError naming it);
    ``piece_to_word`` the 0-based word of every piece (:func:`~fairseq_posattn.structure.alignment.align_pieces`).
    """
    depth = np.asarray(tree_depths(heads), dtype=np.int64)
    tin, tout = euler_times(heads)
    words = np.stack([depth, tin, tout])[:, piece_to_word]
    if not append_eos:
        return words.astype(np.int32)
    eos = np.array([[depth.max(initial=-1) + 1], [-1], [-1]])
    return np.concatenate([words, eos], axis=1).astype(np.int32)
