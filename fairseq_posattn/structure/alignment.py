"""Structural positions for BPE pieces (Wang et al. 2019, 3.1; docs/methods.md, Structural positions).

The parse is over words (e.g. Moses tokens); the model sees subword-nmt BPE pieces, where every piece
but the last of a word ends with the separator (``"@@"``), and fairseq-preprocess appends an EOS.
:func:`align_pieces` maps each piece to its word and checks that the pieces rebuild exactly the parsed
words; :func:`piece_structural_positions` gives every piece its word's ``abs`` and every pair of
pieces their words' ``rel``, with the EOS rule, so the side data has one entry per binarized token.
:func:`align_lines` aligns many lines at once, with a few string and array operations per call.
"""

from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from fairseq_posattn.structure.tree import (Heads, TreeError, batch_tree_structure, integer_heads,
                                            relative_from_structure, tree_structure)

BPE_SEPARATOR = "@@"
PieceIndex = Union[Sequence[int], np.ndarray]


def align_pieces(pieces: Union[str, Sequence[str]], words: Sequence[str], separator: str = BPE_SEPARATOR,
                 where: str = "", closed_end: bool = False) -> np.ndarray:
    """Index (0-based, int64) of the word each BPE piece belongs to.

    ``pieces`` is one BPE-segmented line (or its pieces); ``words`` the parsed words of the same
    sentence. Raises ValueError, prefixed with ``where`` (e.g. ``"train.bpe.en:17"``), naming the first
    word where pieces and words disagree: its index, the word and the pieces that were rebuilt there.

    A last piece that ends with the separator is an error (BPE text as subword-nmt writes it after
    Moses never has one) unless ``closed_end``: then it ends the last word, whose text keeps it, as
    :func:`words_of_pieces` rebuilds it (a hand-typed line in fairseq-interactive, ``"... b@@"``).
    """
    if isinstance(pieces, str):
        pieces = pieces.split()
    continues = [p.endswith(separator) for p in pieces]
    if closed_end and continues:
        continues[-1] = False
    if words_of_pieces(pieces, separator) != list(words) or (continues and continues[-1]):
        raise ValueError(_mismatch_message(list(pieces), continues, list(words), separator, where))
    ends = np.logical_not(continues)
    return np.cumsum(ends) - ends


def align_lines(lines: Sequence[str], words: Sequence[Sequence[str]]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """:func:`align_pieces` of many BPE lines (``"@@"`` separator) and their parsed words at once.

    Returns the word of every piece of all lines, numbering the words of all sentences in order
    (int64: the indices of :func:`align_pieces` of line k plus the words before sentence k), and the
    number of pieces of every line; None when some line's pieces do not rebuild its words (or its last
    piece ends with the separator): :func:`align_pieces` of each line then finds the first and names it.

    No string is made per piece or word: the lines are joined into one text (its pieces split by
    single spaces, as ``line.split()`` splits them, each line's first respaced if not), the pieces
    found in its UTF-8 bytes, and the text without the separators compared with the parsed words'.
    """
    text = "\n".join(lines)
    if not _single_spaced(text, len(lines)):
        text = "\n".join(" ".join(line.split()) for line in lines)
    ends, line_of_piece = _piece_ends(text)
    counts = np.bincount(line_of_piece, minlength=len(lines))
    words_before = np.concatenate(((0,), np.cumsum(ends)))  # word ends before each piece, and in all
    piece_starts = np.concatenate(((0,), np.cumsum(counts)))
    if not ends[piece_starts[1:][counts > 0] - 1].all() or not np.array_equal(
            np.diff(words_before[piece_starts]), np.fromiter(map(len, words), dtype=np.int64, count=len(words))):
        return None
    # With every line's last piece closing a word and the word counts equal, equal texts mean equal
    # words: a word with whitespace in it would bring a space or a line break more than the pieces'.
    try:
        parsed = "\n".join(map(" ".join, words))
    except TypeError:  # a word that is not a string
        return None
    if text.replace(BPE_SEPARATOR + " ", "") != parsed:
        return None
    return words_before[:-1], counts


#: the characters that ``str.split()`` splits on besides the space and the line break (all below U+3001)
OTHER_WHITESPACE = tuple(c for c in map(chr, range(0x3001)) if c.isspace() and c not in " \n")


def _single_spaced(text: str, n_lines: int) -> bool:
    """Whether the lines joined in ``text`` hold no whitespace but single spaces between pieces."""
    return (text.count("\n") == n_lines - 1 and "  " not in text and " \n" not in text and "\n " not in text
            and not text.startswith(" ") and not text.endswith(" ")
            and not any(c in text for c in OTHER_WHITESPACE))


def _piece_ends(text: str) -> Tuple[np.ndarray, np.ndarray]:
    """For every piece of ``text`` (lines of single-spaced pieces): whether it ends a word (does not end
    with the separator), and its line. Spaces, line breaks and the separator are ASCII bytes, which no
    other character's UTF-8 bytes contain, so the pieces are the runs of bytes between them."""
    data = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    breaks = data == ord("\n")
    bounds = np.concatenate(((-1,), np.flatnonzero(breaks | (data == ord(" "))), (len(data),)))
    lengths = np.diff(bounds) - 1
    stops = bounds[1:][lengths > 0]  # the byte after each piece
    continues = lengths[lengths > 0] >= len(BPE_SEPARATOR)
    for back, char in enumerate(reversed(BPE_SEPARATOR.encode("ascii")), start=1):
        continues &= data[np.maximum(stops - back, 0)] == char
    return ~continues, np.searchsorted(np.flatnonzero(breaks), stops)


def words_of_pieces(pieces: Sequence[str], separator: str = BPE_SEPARATOR) -> List[str]:
    """The words that BPE pieces spell: every piece ending with the separator is joined to the next,
    without the separator, as ``fairseq-generate --remove-bpe`` joins them; a separator at the very
    end stays, as there is no next piece (``["a", "b@@"]`` spells ``["a", "b@@"]``)."""
    return " ".join(pieces).replace(separator + " ", "").split()


def piece_structural_positions(heads: Heads, piece_to_word: PieceIndex, clip: Optional[int] = None,
                               append_eos: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """``(abs, rel)`` per piece: int64 arrays of length m (+1) and shape (m (+1)) x (m (+1)).

    Every piece carries its word's ``abs``; a pair of pieces carries its words' ``rel`` (0 for two
    pieces of one word). With ``append_eos`` a last slot stands for the EOS fairseq-preprocess
    appends: ``abs(EOS) = 1 + max abs``, ``rel(EOS, x) = sign(i - j) * (abs(EOS) + abs(x))``,
    ``rel(EOS, EOS) = 0``. ``rel`` is clipped to ``[-clip, clip]`` (clipping commutes with the
    piece indexing, so it is applied to the smaller word-level matrix).
    """
    depth, anc = tree_structure(heads)
    index = _checked_piece_index(piece_to_word, len(depth) - 1)
    return _gather(depth, relative_from_structure(depth, anc, clip), index, append_eos)


def batch_piece_structural_positions(heads: Sequence[Heads], piece_to_word: Sequence[PieceIndex],
                                     clip: Optional[int] = None, append_eos: bool = True,
                                     max_cells: int = 1 << 18) -> List[Tuple[np.ndarray, np.ndarray]]:
    """:func:`piece_structural_positions` of many sentences, in their order, computed in batches.

    Sentences of equal word count are stacked (at most ``max_cells`` matrix cells per stack), so the
    word-level work is a few array operations per stack and only each sentence's piece gathering is
    per sentence. A bad tree raises :class:`TreeError` whose ``sentence`` is its index in ``heads``.
    """
    if len(heads) != len(piece_to_word):
        raise ValueError(f"{len(heads)} trees but {len(piece_to_word)} piece alignments")
    trees = [_integer_heads_of(h, b) for b, h in enumerate(heads)]
    lengths = np.fromiter(map(len, trees), dtype=np.int64, count=len(trees))
    results: List[Tuple[np.ndarray, np.ndarray]] = [None] * len(trees)  # type: ignore[list-item]
    for group in _length_groups(lengths, max_cells):
        try:
            depth, anc = batch_tree_structure(np.stack([trees[b] for b in group]))
        except TreeError as e:
            b = group[e.sentence]
            raise TreeError(f"sentence {b + 1}: {e}", word=e.word, sentence=b) from None
        rel = relative_from_structure(depth, anc, clip)
        for k, b in enumerate(group):
            index = _checked_piece_index(piece_to_word[b], len(trees[b]), b)
            results[b] = _gather(depth[k], rel[k], index, append_eos)
    return results


def _integer_heads_of(heads: Heads, sentence: int) -> np.ndarray:
    try:
        return integer_heads(heads)
    except TreeError as e:
        raise TreeError(f"sentence {sentence + 1}: {e}", word=e.word, sentence=sentence) from None


def _length_groups(lengths: np.ndarray, max_cells: int) -> Iterator[List[int]]:
    """Indices of sentences with equal word count, at most ``max_cells // (n + 1)^2`` per group."""
    order = np.argsort(lengths, kind="stable")
    for same in np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1):
        if len(same):
            size = max(1, max_cells // (int(lengths[same[0]]) + 1) ** 2)
            for start in range(0, len(same), size):
                yield same[start:start + size].tolist()


def _gather(depth: np.ndarray, rel: np.ndarray, index: np.ndarray, append_eos: bool
            ) -> Tuple[np.ndarray, np.ndarray]:
    """Piece-level ``(abs, rel)`` from a sentence's word-level arrays with the EOS in slot n."""
    if append_eos:
        index = np.concatenate((index, (len(depth) - 1,)))
    return depth.take(index), rel.take(index, axis=0).take(index, axis=1)


def _checked_piece_index(piece_to_word: PieceIndex, n: int, sentence: Optional[int] = None) -> np.ndarray:
    """``piece_to_word`` as int64, checked to cover words 0..n-1 in order (steps of 0 or 1)."""
    index = np.asarray(piece_to_word, dtype=np.int64)
    if index.ndim == 1 and len(index) == 0 and n == 0:
        return index
    if index.ndim != 1 or len(index) == 0 or index[0] != 0 or index[-1] != n - 1 \
            or ((index[1:] - index[:-1]) & -2).any():  # steps other than 0 or 1
        prefix = "" if sentence is None else f"sentence {sentence + 1}: "
        raise ValueError(f"{prefix}piece_to_word must run over the words 0..{n - 1} in order, each word at "
                         f"least once, as align_pieces returns it; got {index.tolist()}")
    return index


def _mismatch_message(pieces: List[str], continues: List[bool], words: List[str], separator: str,
                      where: str) -> str:
    """Name the first word whose pieces do not rebuild it (error path, plain Python)."""
    groups: List[List[Tuple[str, bool]]] = [[]]
    for piece, cont in zip(pieces, continues):
        groups[-1].append((piece, cont))
        if not cont:
            groups.append([])
    if not groups[-1]:
        groups.pop()
    prefix = f"{where}: " if where else ""
    for k, group in enumerate(groups):
        built = "".join(p[:-len(separator)] if cont else p for p, cont in group)
        shown = " ".join(p for p, _ in group)
        if k >= len(words):
            return (f"{prefix}BPE pieces do not rebuild the parsed words: the parse has {len(words)} words "
                    f"but the pieces go on with word {k + 1} {built!r} (pieces {shown!r})")
        open_end = group[-1][1]
        if built != words[k] or open_end:
            detail = " (its last piece still ends with the separator)" if open_end else ""
            return (f"{prefix}BPE pieces do not rebuild the parsed words at word {k + 1} of {len(words)}: "
                    f"the parse has {words[k]!r}, the pieces {shown!r} rebuild {built!r}{detail}")
    return (f"{prefix}BPE pieces do not rebuild the parsed words: the pieces end after word {len(groups)} "
            f"but the parse has {len(words)} words, next {words[len(groups)]!r}")
