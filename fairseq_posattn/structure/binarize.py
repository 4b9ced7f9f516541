"""Write the structural side data of one split next to fairseq-preprocess's output.

For sentence k: the parse (words, heads) from CoNLL-U and line k of the BPE text that
fairseq-preprocess binarized; the pieces are aligned to the words, and ``(3, pieces + 1)`` int32
values (depth, tin, tout; :mod:`fairseq_posattn.structure.side_data`) are stored as one item of a
fairseq mmap indexed dataset. :func:`check_sentence_counts` compares the number of sentences of the
three inputs before anything is aligned, so a missing or extra line is reported as such (not as a word
mismatch at the first shifted line); the pieces are then checked sentence by sentence against the
binarized source. The output is written under temporary names and renamed only when complete
(:mod:`fairseq_posattn.atomic_io`).
"""

import logging
from typing import Iterable, Optional, Sequence, Tuple

import numpy as np
import torch
from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder, data_file_path, index_file_path
from tqdm import tqdm

from fairseq_posattn.atomic_io import atomic_paths, count_lines, read_lines
from fairseq_posattn.structure.alignment import align_pieces
from fairseq_posattn.structure.conllu_io import count_sentences
from fairseq_posattn.structure.side_data import token_side_data

logger = logging.getLogger(__name__)

#: (words, heads, CoNLL-U line number where the sentence starts)
ParsedSentence = Tuple[Sequence[str], Sequence[int], int]


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
    final_paths = (data_file_path(out_prefix), index_file_path(out_prefix))
    with atomic_paths(*final_paths) as (tmp_data, tmp_index):
        builder = MMapIndexedDatasetBuilder(tmp_data, dtype=np.int32)
        for count, (line, parse) in enumerate(_paired(read_lines(bpe_path), parses, bpe_path, conllu_path),
                                              start=1):
            words, heads, conllu_line = parse
            where = f"{bpe_path}:{count} / {conllu_path}:{conllu_line}"
            try:
                side = token_side_data(heads, align_pieces(line, words, where=where))
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
            _check_size(side.shape[1], expected_sizes, count, where)
            builder.add_item(torch.from_numpy(side.ravel()))
        if expected_sizes is not None and count != len(expected_sizes):
            raise ValueError(f"{bpe_path}: {count} sentences, but the binarized source has "
                             f"{len(expected_sizes)}: use the BPE file that fairseq-preprocess read")
        builder.finalize(tmp_index)
    logger.info("wrote structural side data of %d sentences to %s.{bin,idx}", count, out_prefix)
    return count


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
