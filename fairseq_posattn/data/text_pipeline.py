"""Text pipeline for translation data: Moses tokenization, joint BPE, parallel-corpus checks.

Raw ``{split}.{lang}`` files go through :func:`prepare_translation_corpus` to
``{split}.tok.{lang}`` (sacremoses), a joint ``bpe.codes`` learned on the tokenized training data of
both languages (subword-nmt) and ``{split}.bpe.{lang}``, ready for ``fairseq-preprocess``.

The outputs are written together (:mod:`fairseq_posattn.atomic_io`): into a temporary folder, whose files
replace those of the output folder only when all of them are complete. A failed or interrupted run thus
never leaves a half-written file, nor new tokenized text beside old BPE codes.
"""

import functools
import logging
import os
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe as _subword_nmt_learn_bpe
from tqdm import tqdm

from fairseq_posattn.atomic_io import atomic_directory_update, atomic_write, count_lines, read_lines, write_lines

logger = logging.getLogger(__name__)

#: subword-nmt's continuation marker; ``fairseq-generate --remove-bpe`` removes ``"@@ "``.
BPE_SEPARATOR = "@@"
#: sacremoses options of the pipeline: ``'``, ``&``, ``"`` stay as they are (no ``&apos;`` and friends)
#: and ``well-known`` stays one token (no aggressive dash splitting). Moses puts every ``@`` in a token
#: of its own in every language, so no tokenized word holds a literal ``@@`` that could be read as
#: :data:`BPE_SEPARATOR`: raw ``a@@b`` becomes ``a @ @ b``.
MOSES_OPTIONS = {"escape": False, "aggressive_dash_splits": False}
DEFAULT_SPLITS: Tuple[str, ...] = ("train", "valid", "test")
#: The first line subword-nmt writes to a file of BPE codes.
BPE_CODES_HEADER = "#version: 0.2"


def moses_tokenizer(lang: str) -> Callable[[str], str]:
    """The pipeline's Moses tokenization of one line of ``lang`` (:data:`MOSES_OPTIONS`).

    :func:`moses_tokenize_file` (``posattn-prepare-translation``) and ``--tokenizer posattn_moses``
    (fairseq-interactive and the hub, :mod:`fairseq_posattn.data.encoders`) both tokenize with it.
    """
    from sacremoses import MosesTokenizer  # here, not at the top: importing it costs every fairseq command ~0.5 s

    return functools.partial(MosesTokenizer(lang=lang).tokenize, return_str=True, **MOSES_OPTIONS)


def moses_detokenizer(lang: str) -> Callable[[str], str]:
    """Moses detokenization of one whitespace-tokenized line of ``lang`` (also unescapes ``&apos;`` etc.)."""
    from sacremoses import MosesDetokenizer  # as in moses_tokenizer

    detokenizer = MosesDetokenizer(lang=lang)
    return lambda line: detokenizer.detokenize(line.split())


def moses_tokenize_file(src_path: str, out_path: str, lang: str, max_lines: Optional[int] = None) -> int:
    """Moses-tokenize ``src_path`` line by line into ``out_path`` (:func:`moses_tokenizer`); return the
    number of lines."""
    tokenize = moses_tokenizer(lang)
    lines = tqdm(read_lines(src_path, max_lines), desc=f"tokenize {os.path.basename(src_path)}",
                 unit=" lines", disable=None)
    n = write_lines(out_path, (tokenize(line) for line in lines))
    logger.info("tokenized %d lines (%s): %s -> %s", n, lang, src_path, out_path)
    return n


def detokenize_lines(lines: Iterable[str], lang: str) -> List[str]:
    """Moses-detokenize whitespace-tokenized lines (:func:`moses_detokenizer`)."""
    detokenize = moses_detokenizer(lang)
    return [detokenize(line) for line in lines]


class _NamedLines:
    """Iterable over the lines of several files, with the ``name`` attribute subword-nmt reads."""

    def __init__(self, paths: Sequence[str]):
        self.paths = list(paths)
        self.name = "+".join(self.paths)

    def __iter__(self) -> Iterator[str]:
        for path in self.paths:
            with open(path, encoding="utf-8") as f:
                yield from f


def learn_bpe(input_paths: Sequence[str], codes_path: str, num_merges: int, min_frequency: int = 2) -> int:
    """Learn ``num_merges`` joint BPE merges on the concatenation of ``input_paths``.

    Returns the number of merges written to ``codes_path`` (fewer when no pair reaches
    ``min_frequency``; none when no word has two characters, on which subword-nmt itself fails).
    """
    with atomic_write(codes_path) as out:
        if any(len(word) > 1 for path in input_paths for line in read_lines(path) for word in line.split()):
            _subword_nmt_learn_bpe(_NamedLines(input_paths), out, num_merges, min_frequency=min_frequency)
        else:
            out.write(f"{BPE_CODES_HEADER}\n")
    n = count_lines(codes_path) - 1  # first line is BPE_CODES_HEADER
    logger.info("learned %d BPE merges on %s -> %s", n, ", ".join(input_paths), codes_path)
    return n


def load_bpe(codes_path: str) -> BPE:
    """A subword-nmt segmenter for ``codes_path`` with the ``@@`` separator."""
    with open(codes_path, encoding="utf-8") as codes:
        return BPE(codes, separator=BPE_SEPARATOR)


def apply_bpe_file(codes_path: str, in_path: str, out_path: str) -> int:
    """Segment a tokenized file with the BPE codes; return the number of lines written."""
    bpe = load_bpe(codes_path)
    lines = tqdm(read_lines(in_path), desc=f"bpe {os.path.basename(in_path)}", unit=" lines", disable=None)
    n = write_lines(out_path, (bpe.segment(line) for line in lines))
    logger.info("applied BPE to %d lines: %s -> %s", n, in_path, out_path)
    return n


def remove_bpe(line: str) -> str:
    """Undo BPE the way ``fairseq-generate --remove-bpe`` does."""
    return (line + " ").replace(BPE_SEPARATOR + " ", "").rstrip()


def first_empty_line(path: str) -> Optional[int]:
    """1-based number of the first empty (or whitespace-only) line of ``path``, or None."""
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            return number
    return None


def check_parallel(src_path: str, tgt_path: str) -> int:
    """Check that two sides of a parallel corpus align; return their common line count.

    Raises ValueError naming both files and their line counts if the counts differ or are 0, or the first
    empty line as ``file:line`` (fairseq-preprocess would keep an empty sentence and
    ``LanguagePairDataset`` then trains on a pair that is not a translation).
    """
    n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)
    if n_src == n_tgt == 0:
        raise ValueError(f"{src_path} and {tgt_path} are empty: every split needs sentence pairs, one per line")
    counts = f"{src_path} has {n_src} lines, {tgt_path} has {n_tgt} lines"
    if n_src != n_tgt:
        raise ValueError(f"parallel files differ in length: {counts}. Every line of one must be the "
                         "translation of the same line of the other: realign them (remove the extra "
                         "or missing lines in both files together).")
    for path in (src_path, tgt_path):
        number = first_empty_line(path)
        if number is not None:
            raise ValueError(f"empty line at {path}:{number} ({counts}). Remove line {number} from "
                             f"both {src_path} and {tgt_path} so that they stay aligned.")
    return n_src


def prepare_translation_corpus(raw_dir: str, out_dir: str, src: str, tgt: str,
                               splits: Sequence[str] = DEFAULT_SPLITS, bpe_merges: int = 10000,
                               max_lines: Optional[int] = None) -> str:
    """Tokenize, learn joint BPE on ``train`` (both languages) and apply it to every split.

    Reads ``{raw_dir}/{split}.{lang}``; writes ``{out_dir}/{split}.tok.{lang}``,
    ``{out_dir}/bpe.codes`` and ``{out_dir}/{split}.bpe.{lang}``. ``max_lines`` keeps only the first
    lines of each split (quick experiments). Returns the path of the BPE codes.

    The settings and every raw file (present, aligned, not empty) are checked before anything is written
    (ValueError naming the option or ``file:line``). The outputs are made in a temporary folder and replace
    those of ``out_dir`` only once all are complete: an error leaves ``out_dir`` as it was.
    """
    check_translation_settings(splits, src, tgt, bpe_merges, max_lines)
    raw = {(split, lang): os.path.join(raw_dir, f"{split}.{lang}") for split in splits for lang in (src, tgt)}
    missing = [path for path in raw.values() if not os.path.isfile(path)]
    if missing:
        raise ValueError(f"no raw file {', '.join(missing)}: --raw-dir needs {{split}}.{{lang}} for every split "
                         f"({', '.join(splits)}) and both languages ({src}, {tgt})")
    for split in splits:
        check_parallel(raw[split, src], raw[split, tgt])
    with atomic_directory_update(out_dir) as staging:
        for split in splits:
            pair = [raw[split, lang] for lang in (src, tgt)]
            for path, lang in zip(pair, (src, tgt)):
                moses_tokenize_file(path, os.path.join(staging, f"{split}.tok.{lang}"), lang, max_lines=max_lines)
            check_tokenized(pair, [os.path.join(staging, f"{split}.tok.{lang}") for lang in (src, tgt)])
        codes = os.path.join(staging, "bpe.codes")
        if learn_bpe([os.path.join(staging, f"train.tok.{lang}") for lang in (src, tgt)], codes, bpe_merges) == 0:
            raise ValueError(f"no BPE merge learned from the tokenized {raw['train', src]} and {raw['train', tgt]}: "
                             "no pair of symbols occurs twice; the training text is too small")
        for split in splits:
            for lang in (src, tgt):
                apply_bpe_file(codes, os.path.join(staging, f"{split}.tok.{lang}"),
                               os.path.join(staging, f"{split}.bpe.{lang}"))
    logger.info("prepared %s-%s splits %s in %s", src, tgt, ", ".join(splits), out_dir)
    return os.path.join(out_dir, "bpe.codes")


def check_translation_settings(splits: Sequence[str], src: str, tgt: str, bpe_merges: int,
                               max_lines: Optional[int]) -> None:
    """The settings of :func:`prepare_translation_corpus`; ValueError naming the option otherwise."""
    if bpe_merges < 1:
        raise ValueError(f"bpe_merges (--bpe-merges) must be at least 1, got {bpe_merges}")
    if max_lines is not None and max_lines < 1:
        raise ValueError(f"max_lines (--max-lines) must be at least 1 (or None for all lines), got {max_lines}")
    if "train" not in splits:
        raise ValueError(f"splits {list(splits)} lack 'train', on which BPE is learned")
    if len(set(splits)) != len(splits) or src == tgt:
        raise ValueError(f"splits {list(splits)} and languages {src!r}, {tgt!r} must all differ: the outputs "
                         "of one would overwrite the other's")


def check_tokenized(raw_pair: Sequence[str], tok_pair: Sequence[str]) -> None:
    """A raw line that Moses tokenization empties (it held only control characters) would misalign the pair:
    ValueError naming the raw ``file:line``."""
    for raw_path, tok_path in zip(raw_pair, tok_pair):
        number = first_empty_line(tok_path)
        if number is not None:
            raise ValueError(f"{raw_path}:{number}: nothing is left of the line after Moses tokenization (it holds "
                             f"only control characters); remove line {number} from both {' and '.join(raw_pair)}")
