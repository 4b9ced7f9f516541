"""Parse a tokenized corpus into CoNLL-U: sharding, worker processes, resuming and merging.

This is the engine of ``posattn-parse`` (:mod:`fairseq_posattn.cli.parse` only reads its options).
The input holds one tokenized sentence per line; the parse words are exactly its space-separated
tokens, and sentence IDs are input line numbers. An empty line is an error naming ``file:line``:
skipping it would shift the parses against the target side of a parallel corpus.

Sharding cuts the input into K contiguous, near-equal line ranges. Shard I of K goes to
``OUTPUT.shard-I-of-K``, written atomically (:mod:`fairseq_posattn.atomic_io`), so a shard file
exists only when complete; its first line records the line range and a checksum of the input lines.
A finished shard is never parsed again (which makes an interrupted run resumable), and one made from
other input is an error. :func:`merge_shards` checks every shard against the input and concatenates
them in order into ``OUTPUT``.

:class:`ParseRunner` parses chunks of ``batch_size`` lines in this process or in a pool of worker
processes, each with its own parser; models are loaded only when something is left to parse.
"""

import hashlib
import itertools
import logging
import multiprocessing
import multiprocessing.pool
import os
from dataclasses import dataclass
from typing import IO, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from tqdm import tqdm

from fairseq_posattn.atomic_io import atomic_write, read_lines, refuse_output_that_is_an_input
from fairseq_posattn.structure.conllu_io import write_conllu
from fairseq_posattn.structure.parser_input import check_parser_input
from fairseq_posattn.structure.parsers import ConlluReader, Parse, SpacyParser, StanzaParser

logger = logging.getLogger(__name__)

#: Start of the first comment line of a shard file (after ``# ``).
SHARD_TAG = "posattn-parse shard"


@dataclass(frozen=True)
class BackendSpec:
    """What a (worker) process needs to build its parser, and the input it parses.

    ``backend`` is ``stanza``, ``spacy`` or ``conllu``; ``model`` the spaCy pipeline; ``lang``,
    ``use_gpu`` (None: when torch sees a GPU) and ``stanza_dir`` configure stanza; ``parses`` is the
    CoNLL-U file of the ``conllu`` backend; ``input`` the tokenized text.
    """

    backend: str
    model: str
    lang: str
    use_gpu: Optional[bool]
    batch_size: int
    stanza_dir: Optional[str]
    parses: Optional[str]
    input: str


def parse_corpus(spec: BackendSpec, output: str, num_shards: int = 1, shard_id: Optional[int] = None,
                 merge_only: bool = False, workers: int = 1) -> None:
    """Parse ``spec.input`` into ``output``: every shard (then merge them), one shard, or only the merge.

    With ``num_shards == 1`` and no ``shard_id`` the whole input is parsed straight into ``output``. An output
    (or shard file) that is the input text or the ``conllu`` backend's parses is refused before anything is read;
    text that the spaCy or stanza parser cannot parse (another language, or not tokenized:
    :func:`~fairseq_posattn.structure.parser_input.check_parser_input`) before anything is parsed.
    """
    shards = [shard_path(output, num_shards, k) for k in range(num_shards)] if num_shards > 1 else []
    for written in (output, *shards):
        refuse_output_that_is_an_input(written, spec.input, spec.parses)
    n_lines = count_nonempty_lines(spec.input)
    if merge_only:
        merge_shards(spec.input, output, num_shards, n_lines)
        return
    if spec.backend != "conllu":
        check_parser_input(spec.input, n_lines, spec.backend, spec.model, spec.lang)
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

    def __init__(self, spec: BackendSpec, workers: int = 1) -> None:
        self.spec = spec
        self.workers = workers
        self._parser: Optional[Union[SpacyParser, StanzaParser]] = None
        self._pool: Optional[multiprocessing.pool.Pool] = None

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


def make_backend(spec: BackendSpec) -> Union[SpacyParser, StanzaParser]:
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
    """Where shard ``shard_id`` of ``num_shards`` of ``output`` is written."""
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


def _check_shard_header(path: str, expected: str) -> None:
    with open(path, encoding="utf-8") as f:
        first = f.readline().rstrip("\n")
    if first != f"# {expected}":
        raise ValueError(f"{path}:1: this shard was made from other input or another --num-shards\n"
                         f"  it says:  {first[2:] if first.startswith('# ') else first!r}\n"
                         f"  expected: {expected}\ndelete it (or restore the input) and run again")


def _copy_shard(path: str, out: IO[str]) -> int:
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


_WORKER_PARSER: Optional[Union[SpacyParser, StanzaParser]] = None
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
