"""Structural positions of dependency trees (Wang et al. 2019; docs/methods.md, Structural positions).

A tree is given CoNLL-U style: ``heads[w]`` is the 1-based index of word w's head, 0 for a root.
Several roots make a forest; every word then measures to its own root.

- absolute structural position ``abs(w)``: number of edges from w up to its root (a root has 0);
- relative structural position of query word a (index i) and key word b (index j):
  ``abs(a) - abs(b)`` when one is an ancestor of the other (a == b included), otherwise
  ``sign(i - j) * (abs(a) + abs(b))``; clipped to ``[-clip, clip]`` when ``clip`` is given.

Everything is vectorized with numpy, over the words of a sentence and over the sentences of a batch:
the ancestor relation is a boolean matrix built by pointer doubling (``log2(n)`` rounds of row gathers),
so a batch costs a handful of array operations on ``B x (n+1) x (n+1)`` arrays, with no Python loop
over words or pairs.
"""

from functools import lru_cache
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

Heads = Union[Sequence[int], np.ndarray]


class TreeError(ValueError):
    """A malformed dependency tree.

    ``word`` is the 1-based index of the offending word and ``sentence`` the 0-based index of the
    sentence in a batch (each None where it does not apply).
    """

    def __init__(self, message: str, word: Optional[int] = None, sentence: Optional[int] = None):
        super().__init__(message)
        self.word = word
        self.sentence = sentence


def tree_depths(heads: Heads) -> List[int]:
    """Absolute structural position of every word: edges on its path to its root (Wang et al. eq. 5).

    >>> tree_depths([2, 0, 2])
    [1, 0, 1]

    Raises :class:`TreeError` (a ``ValueError``) naming the word and head of a bad tree.
    """
    depth, _ = tree_structure(heads)
    return depth[:-1].tolist()


def structural_relative_positions(heads: Heads, clip: Optional[int] = None) -> np.ndarray:
    """``[n, n]`` int64 matrix, ``[i, j]`` = rel(word i, word j) with i the query (Wang et al. 3.1).

    >>> structural_relative_positions([2, 0, 2])
    array([[ 0,  1, -2],
           [-1,  0, -1],
           [ 2,  1,  0]])
    """
    depth, anc = tree_structure(heads)
    n = len(depth) - 1
    return relative_from_structure(depth[:n], anc[:n, :n], clip)


def tree_structure(heads: Heads) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`batch_tree_structure` of one sentence: ``depth`` (n+1) and ``ancestor`` ((n+1) x (n+1))."""
    try:
        depth, anc = batch_tree_structure(integer_heads(heads)[None, :])
    except TreeError as e:
        raise TreeError(str(e), word=e.word) from None
    return depth[0], anc[0]


def batch_tree_structure(heads: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Check B trees of n words each (int64, B x n) and return their depths and ancestor matrices.

    Returns ``depth`` (int64, B x (n+1)) and ``ancestor`` (bool, B x (n+1) x (n+1)), where
    ``ancestor[b, w, a]`` is True when a is w or an ancestor of w. Slot n after the words is the
    EOS: its depth is ``1 + max abs`` of the sentence (1 for an empty one), Wang et al.'s EOS value,
    and it is related to nothing but itself. A bad tree raises :class:`TreeError` naming the word,
    with ``sentence`` set to its row.
    """
    heads = heads.astype(np.int64, copy=False)
    _check_batch(heads)
    anc, jump, sentinel = _ancestor_matrices(heads)
    if (jump != sentinel).any():
        b = int(np.flatnonzero((jump != sentinel).any(axis=1))[0])
        text, word = describe_cycle(heads[b] - 1, start=int(np.argmax(jump[b] != sentinel[b])))
        raise TreeError(f"cycle: {text}", word=word, sentence=b)
    n = heads.shape[1]
    anc[:, :n, n] = False
    depth = anc.sum(axis=2) - 1
    depth[:, n] = depth[:, :n].max(axis=1, initial=0) + 1
    return depth, anc


def _check_batch(heads: np.ndarray) -> None:
    """Vectorized range and root checks; the first bad row is re-checked alone for the message."""
    n = heads.shape[1]
    # viewed unsigned, a negative head is huge: one reduction checks both ends of the range
    if n and (heads.view(np.uint64).max() > n or not (heads == 0).any(axis=1).all()):
        for b, row in enumerate(heads):
            try:
                check_heads(row)
            except TreeError as e:
                raise TreeError(str(e), word=e.word, sentence=b) from None


def _ancestor_matrices(heads: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ancestor-or-self matrices by pointer doubling over the whole batch at once.

    The rows of all sentences are stacked, so ``jump`` holds global row indices; a root points to its
    sentence's slot n, the sentinel, which points to itself. After round k, ``anc[w]`` holds w's
    ancestors at distance < 2^k and ``jump[w]`` its 2^k-th ancestor (the sentinel past the root).
    Depths are < n, so ``n.bit_length()`` rounds (2^k > n) reach every root; a jump still off the
    sentinel afterwards means a cycle. A fixed number of rounds costs less than testing for an
    early stop after each. Returns ``anc`` (B x (n+1) x (n+1)), the last jumps (B x (n+1)) and
    each sentence's sentinel row (B x 1).
    """
    batch, n_words = heads.shape
    size = n_words + 1
    sentinel = np.arange(batch)[:, None] * size + n_words
    jump = np.empty((batch, size), dtype=np.int64)
    jump[:, :n_words] = (heads - 1) % size + (sentinel - n_words)  # a root's -1 becomes n, its sentinel
    jump[:, n_words:] = sentinel
    jump = jump.ravel()
    anc = np.empty((batch, size, size), dtype=bool)
    anc[...] = _identity(size)
    flat = anc.reshape(batch * size, size)
    for _ in range(n_words.bit_length()):
        flat |= flat.take(jump, axis=0)
        jump = jump[jump]
    return anc, jump.reshape(batch, size), sentinel


@lru_cache(maxsize=512)
def _identity(n: int) -> np.ndarray:
    eye = np.eye(n, dtype=bool)
    eye.flags.writeable = False
    return eye


def relative_from_structure(depth: np.ndarray, anc: np.ndarray, clip: Optional[int] = None) -> np.ndarray:
    """Structural rel of every pair from depths (..., n) and ancestor-or-self matrices (..., n, n)."""
    if clip is not None and clip < 0:
        raise ValueError(f"clip must be >= 0, got {clip}")
    on_path = anc | anc.swapaxes(-1, -2)
    rows, cols = depth[..., :, None], depth[..., None, :]
    rel = np.where(on_path, rows - cols, _sign_matrix(depth.shape[-1]) * (rows + cols))
    if clip is not None:
        np.minimum(rel, clip, out=rel)  # np.clip costs several times more on small arrays
        np.maximum(rel, -clip, out=rel)
    return rel


@lru_cache(maxsize=512)
def _sign_matrix(n: int) -> np.ndarray:
    """``sign(i - j)`` for an n x n matrix (read-only, cached per length)."""
    idx = np.arange(n)
    sign = np.sign(idx[:, None] - idx[None, :])
    sign.flags.writeable = False
    return sign


def integer_heads(heads: Heads) -> np.ndarray:
    """``heads`` as a flat int64 array; integral floats are accepted, anything else names the word."""
    arr = np.asarray(heads)
    if arr.ndim != 1:
        raise TreeError(f"heads must be a flat sequence of integers, got shape {arr.shape}")
    if arr.dtype.kind in "iu" or len(arr) == 0:
        return arr.astype(np.int64, copy=False)  # a copy only for other integer widths
    if arr.dtype.kind == "f" and np.isfinite(arr).all() and (arr == np.round(arr)).all():
        return arr.astype(np.int64)
    w = next((k for k, head in enumerate(heads, start=1) if not _is_integral(head)), None)
    if w is None:  # integers beyond int64, which numpy keeps as objects
        w = next(k for k, head in enumerate(heads, start=1) if not 0 <= head <= len(arr))
        raise TreeError(f"head out of range: word {w} has head {heads[w - 1]}, but heads must be 0 (root) "
                        f"or a word index 1..{len(arr)}", word=w)
    raise TreeError(f"word {w} has head {heads[w - 1]!r}, which is not an integer", word=w)


def _is_integral(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) or (
        isinstance(value, (float, np.floating)) and float(value).is_integer())


def check_heads(arr: np.ndarray) -> None:
    """Raise :class:`TreeError` for a head out of range or a missing root (cycles: see
    :func:`batch_tree_structure`)."""
    n = len(arr)
    if n == 0:
        return
    lowest, highest = arr.min(), arr.max()
    if lowest < 0 or highest > n:
        w = int(np.flatnonzero((arr < 0) | (arr > n))[0]) + 1
        raise TreeError(f"head out of range: word {w} has head {int(arr[w - 1])}, but heads must be "
                        f"0 (root) or a word index 1..{n}", word=w)
    if lowest > 0:
        text, word = describe_cycle(arr - 1, start=0)
        raise TreeError(f"no root: no word has head 0, so the heads contain a cycle: {text}", word=word)


def describe_cycle(parents: np.ndarray, start: int) -> Tuple[str, int]:
    """Text naming the words and heads of the cycle reached from ``start`` (0-based parents, -1 for a
    root; ``start`` must lead into the cycle), and the cycle's first word (1-based).

    Error path only, so plain Python.
    """
    w = start
    for _ in range(len(parents)):  # n steps up end on the cycle
        w = int(parents[w])
    cycle = [w]
    while int(parents[cycle[-1]]) != w:
        cycle.append(int(parents[cycle[-1]]))
    first = cycle.index(min(cycle))
    cycle = cycle[first:] + cycle[:first]
    if len(cycle) == 1:
        return f"word {w + 1} has head {w + 1}, itself", w + 1
    return ", ".join(f"word {a + 1} has head {int(parents[a]) + 1}" for a in cycle), cycle[0] + 1
