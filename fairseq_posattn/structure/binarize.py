"""Write the structural side data of one split next to fairseq-preprocess's output.

For sentence k: the parse (words, heads) from CoNLL-U and line k of the BPE text that
fairseq-preprocess binarized; the pieces are aligned to the words, and ``(3, pieces + 1)`` int32
values (depth, tin, tout; :mod:`fairseq_posattn.structure.side_data`) are stored as one item of a
fairseq mmap indexed dataset. :func:`check_sentence_counts` compares the number of sentences of the
three inputs before anything is aligned, so a missing or extra line is reported as such (not as a word
mismatch at the first shifted line); the pieces are then checked sentence by sentence against the
binarized source. The output is written under temporary names and renamed only when complete
(:mod:`fairseq_posattn.atomic_io`).

The sentences are handled :data:`CHUNK` at a time, with array operations over all of them: the
alignment (:func:`~fairseq_posattn.structure.alignment.align_lines`), the depth-first walk of every
tree (:func:`~fairseq_posattn.structure.side_data.forest_walk`) and the chunk's bytes, written at
once. A chunk with anything wrong in it goes through
:func:`~fairseq_posattn.structure.side_data.token_side_data` sentence by sentence instead,
which names the first problem; errors come in the order of the lines either way.
"""

import itertools
import logging
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from fairseq.data.indexed_dataset import MMapIndexedDataset, data_file_path, index_file_path
from tqdm import tqdm

from fairseq_posattn.atomic_io import atomic_paths, count_lines, read_lines
from fairseq_posattn.structure.alignment import align_lines, align_pieces
from fairseq_posattn.structure.conllu_io import count_sentences
from fairseq_posattn.structure.side_data import DEPTH, TIN, TOUT, forest_walk, token_side_data

logger = logging.getLogger(__name__)

#: (words, heads, CoNLL-U line number where the sentence starts)
ParsedSentence = Tuple[Sequence[str], Sequence[int], int]
#: (line k of the BPE text, the parse of sentence k)
Pair = Tuple[str, ParsedSentence]
#: sentences aligned, walked and written together
CHUNK = 4096


def check_sentence_counts(bpe_path: str, conllu_path: str, binarized: Optional[str] = None,
                          binarized_count: Optional[int] = None) -> int:
    """Check that the BPE text, its CoNLL-U parse and (if given) the binarized source ``binarized`` hold
    the same number of sentences; return it. Raises ValueError giving every count and file otherwise."""
    n_bpe, n_conllu = count_lines(bpe_path), count_sentences(conllu_path)
    counts = {n_bpe, n_conllu}
    found = [f"{bpe_path} has {n_bpe} lines", f"{conllu_path} has {n_conllu} sentences"]
    if binarized is not None:
        counts.add(binarized_count)
        found.append(f"the binarized source {binarized}.{{bin,idx}} has {binarized_count} sentences")
    if len(counts) == 1:
        return n_bpe
    raise ValueError(f"the inputs differ in length: {', '.join(found)}. A line is missing or extra: use "
                     "the BPE file that fairseq-preprocess binarized and the posattn-parse output of the "
                     "tokenized text that BPE was applied to, both of the same split")


def write_side_data(
    parses: Iterable[ParsedSentence],
    bpe_path: str,
    out_prefix: str,
    conllu_path: str = "<parses>",
    expected_sizes: Optional[np.ndarray] = None,
) -> int:
    """Align, compute and binarize; return the number of sentences written.

    ``expected_sizes`` are the binarized source lengths (EOS included), checked sentence by sentence.
    Raises ValueError naming the file and line of the first mismatch.
    """
    count = 0
    sizes: List[int] = []
    final_paths = (data_file_path(out_prefix), index_file_path(out_prefix))
    with atomic_paths(*final_paths) as (tmp_data, tmp_index):
        with open(tmp_data, "wb") as data:
            pairs = _paired(read_lines(bpe_path), parses, bpe_path, conllu_path)
            while True:
                chunk, error = _next_chunk(pairs)
                side, chunk_sizes = _chunk_side_data(chunk, count, bpe_path, conllu_path, expected_sizes)
                data.write(side.tobytes())
                sizes += chunk_sizes
                count += len(chunk)
                if error is not None:
                    raise error
                if len(chunk) < CHUNK:
                    break
        if expected_sizes is not None and count != len(expected_sizes):
            raise ValueError(f"{bpe_path}: {count} sentences, but the binarized source has "
                             f"{len(expected_sizes)}: use the BPE file that fairseq-preprocess read")
        with MMapIndexedDataset.Index.writer(tmp_index, np.int32) as index:
            index.write(sizes)
    logger.info("wrote structural side data of %d sentences to %s.{bin,idx}", count, out_prefix)
    return count


def _next_chunk(pairs: Iterator[Pair]) -> Tuple[List[Pair], Optional[Exception]]:
    """Up to :data:`CHUNK` pairs, and the error that ended them early, if any: it is raised once the
    pairs read before it are checked, so that an earlier line's error comes first."""
    chunk: List[Pair] = []
    try:
        for pair in itertools.islice(pairs, CHUNK):
            chunk.append(pair)
    except Exception as error:  # noqa: BLE001 (re-raised by the caller)
        return chunk, error
    return chunk, None


def _chunk_side_data(chunk: List[Pair], done: int, bpe_path: str, conllu_path: str,
                     expected_sizes: Optional[np.ndarray]) -> Tuple[np.ndarray, List[int]]:
    """The items of sentences ``done + 1``... (``chunk``) one after the other (int32) and their sizes."""
    words = [parse[0] for _, parse in chunk]
    heads = [parse[1] for _, parse in chunk]
    aligned = None
    if list(map(len, heads)) == list(map(len, words)):
        aligned = align_lines([line for line, _ in chunk], words)
    walk = forest_walk(heads) if aligned is not None else None
    if walk is None or expected_sizes is not None and not np.array_equal(
            aligned[1] + 1, expected_sizes[done:done + len(chunk)]):
        return _one_by_one(chunk, done, bpe_path, conllu_path, expected_sizes)
    piece_word, pieces = aligned
    return _items(walk, piece_word, pieces), (3 * (pieces + 1)).tolist()


def _one_by_one(chunk: List[Pair], done: int, bpe_path: str, conllu_path: str,
                expected_sizes: Optional[np.ndarray]) -> Tuple[np.ndarray, List[int]]:
    """:func:`_chunk_side_data` a sentence at a time; raises ValueError at the first bad one."""
    items = []
    for number, (line, (words, heads, conllu_line)) in enumerate(chunk, start=done + 1):
        where = f"{bpe_path}:{number} / {conllu_path}:{conllu_line}"
        try:
            side = token_side_data(heads, align_pieces(line, words, where=where))
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        _check_size(side.shape[1], expected_sizes, number, where)
        items.append(side.ravel())
    return np.concatenate(items or [np.empty(0, dtype=np.int32)]), [item.size for item in items]


def _items(walk: np.ndarray, piece_word: np.ndarray, pieces: np.ndarray) -> np.ndarray:
    """The items of the sentences one after the other (int32): sentence k's ``(3, pieces + 1)`` rows
    (depth, tin, tout) of its pieces' words and its EOS, row after row as ``side.ravel()`` lays them."""
    tokens = pieces + 1
    start = np.cumsum(tokens) - tokens
    columns = np.empty(int(tokens.sum()), dtype=np.int64)
    is_eos = np.zeros(len(columns), dtype=bool)
    is_eos[start + pieces] = True
    columns[~is_eos] = piece_word
    columns[is_eos] = walk.shape[1] - len(pieces) + np.arange(len(pieces))
    length = np.repeat(tokens, tokens)
    first = np.arange(len(columns)) + 2 * np.repeat(start, tokens)
    items = np.empty(3 * len(columns), dtype=np.int32)
    for row in (DEPTH, TIN, TOUT):
        items[first + row * length] = walk[row, columns]
    return items


def _paired(bpe_lines: Iterable[str], parses: Iterable[ParsedSentence], bpe_path: str, conllu_path: str):
    """Yield (BPE line, parse) pairs; a different number of sentences is an error naming both files."""
    parses = iter(parses)
    for number, line in enumerate(tqdm(bpe_lines, desc="structure", unit=" sent", mininterval=2), start=1):
        parse = next(parses, None)
        if parse is None:
            raise ValueError(f"{conllu_path} has {number - 1} sentences but {bpe_path} has more lines: "
                             "parse every line of the tokenized text the BPE was applied to")
        yield line, parse
    if next(parses, None) is not None:
        raise ValueError(f"{conllu_path} has more sentences than the {bpe_path} has lines")


def _check_size(tokens: int, expected_sizes: Optional[np.ndarray], number: int, where: str) -> None:
    if expected_sizes is None:
        return
    if number > len(expected_sizes):
        raise ValueError(f"{where}: more sentences than the binarized source ({len(expected_sizes)})")
    if tokens != expected_sizes[number - 1]:
        raise ValueError(f"{where}: {tokens - 1} pieces + EOS, but the binarized source sentence has "
                         f"{expected_sizes[number - 1]} tokens: use the BPE file that fairseq-preprocess read")
