"""Per-token structural side data, in the form the model reads (docs/methods.md, Structural positions).

Instead of an O(n^2) relative matrix per sentence, each binarized source token carries three
integers: its word's tree depth (``abs``), and the entry and exit times ``tin``/``tout`` of its word
in a depth-first walk of the parse (a forest: each root in word order). Word a is an ancestor of (or
is) word b exactly when ``tin[a] <= tin[b]`` and ``tout[b] <= tout[a]``, so the model rebuilds every
relative structural position of a batch at once
(:func:`posattn.position_context.structural_relative`). The EOS that
fairseq-preprocess appends gets ``abs = 1 + max abs`` and ``tin = tout = -1`` (on no path).
"""

import itertools
from typing import List, Optional, Sequence

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


def forest_walk(heads: Sequence[Sequence[int]]) -> Optional[np.ndarray]:
    """:func:`tree_walk` of many trees at once: ``(3, words)``
    int64 depth, entry and exit time of the words of all sentences, in order, then one column per
    sentence for its EOS (``abs = 1 + max abs``, ``tin = tout = -1``). None when a head is not an
    integer in 0..n or a tree has a cycle (``tree_walk`` then names the problem).

    The walk enters and leaves every node, children in word order, one tick each. A word at place
    ``order`` of the walk's preorder (its sentence's virtual root at 0) comes after the entries of the
    ``order`` nodes before it and the exits of all of them but its ``depth + 1`` ancestors (the virtual
    root included), so it enters at tick ``tin = 2 order - depth`` and leaves ``2 size - 1`` ticks later,
    its subtree of ``size`` nodes entered and left. ``order`` is its parent's plus one plus the sizes of
    its earlier siblings; depths come from pointer doubling (log2 n rounds), sizes and orders from one
    pass each over the depth levels.
    """
    lengths = np.fromiter(map(len, heads), dtype=np.int64, count=len(heads))
    flat = np.array(list(itertools.chain.from_iterable(heads)))
    if flat.size and flat.dtype.kind not in "iu":
        return None
    flat = flat.astype(np.int64)
    first_word = np.repeat(np.cumsum(lengths) - lengths, lengths)
    if ((flat < 0) | (flat > np.repeat(lengths, lengths))).any():
        return None
    parent = np.where(flat > 0, first_word + flat - 1, -1)
    depth = _depths(parent, int(lengths.max(initial=0)))
    if depth is None:
        return None
    levels = _levels(depth)
    size = _subtree_sizes(parent, levels)
    order = _preorder(parent, np.repeat(np.arange(len(lengths)), lengths), size, levels)
    tin = 2 * order - depth
    eos_depth = np.zeros(len(lengths), dtype=np.int64)
    words = lengths > 0
    if words.any():
        eos_depth[words] = np.maximum.reduceat(depth, (np.cumsum(lengths) - lengths)[words]) + 1
    eos = np.stack((eos_depth, np.full_like(eos_depth, -1), np.full_like(eos_depth, -1)))
    return np.concatenate((np.stack((depth, tin, tin + 2 * size - 1)), eos), axis=1)


def _depths(parent: np.ndarray, longest: int) -> Optional[np.ndarray]:
    """Edges from every node up to its root, by pointer doubling; None if some node is on a cycle."""
    depth = (parent >= 0).astype(np.int64)  # edges up to jump
    jump = parent.copy()
    for _ in range(longest.bit_length() + 1):  # 2^rounds > longest > any depth
        live = np.flatnonzero(jump >= 0)
        if not len(live):
            return depth
        up = jump[live]
        depth[live] += depth[up]
        jump[live] = jump[up]
    return None


def _levels(depth: np.ndarray) -> List[np.ndarray]:
    """The nodes of each depth, 0 first."""
    deepest = int(depth.max(initial=-1))
    by_depth = np.argsort(depth.astype(np.min_scalar_type(max(deepest, 0))), kind="stable")  # radix sort
    bounds = np.searchsorted(depth[by_depth], np.arange(deepest + 2))
    return [by_depth[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _subtree_sizes(parent: np.ndarray, levels: List[np.ndarray]) -> np.ndarray:
    """Nodes in every node's subtree, itself included, adding each level to its parents, deepest first."""
    size = np.ones(len(parent), dtype=np.int64)
    for level in reversed(levels[1:]):
        np.add.at(size, parent[level], size[level])
    return size


def _preorder(parent: np.ndarray, sentence: np.ndarray, size: np.ndarray, levels: List[np.ndarray]) -> np.ndarray:
    """Place of every node in its sentence's preorder walk (children in word order, the sentence's
    virtual root at 0), given each node's ``sentence``, subtree ``size`` and the depth ``levels``."""
    siblings = np.where(parent >= 0, parent, len(parent) + sentence)  # a root's parent: its sentence
    by_parent = np.argsort(siblings, kind="stable")  # siblings together, in word order
    sizes = size[by_parent]
    before = np.cumsum(sizes) - sizes
    group = np.flatnonzero(np.diff(siblings[by_parent], prepend=-1))
    earlier = np.empty_like(size)  # the sizes of its earlier siblings
    earlier[by_parent] = before - np.repeat(before[group], np.diff(group, append=len(by_parent)))
    order = earlier + 1
    for level in levels[1:]:
        order[level] += order[parent[level]]
    return order


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
