"""``posattn-score``: sacreBLEU of a ``fairseq-generate --remove-bpe`` output.

Takes the ``H-<id>`` lines, puts them in id order, Moses-detokenizes them and scores them against the
raw (untokenized) reference file with sacrebleu. Prints ``BLEU = ...`` and sacrebleu's signature.
Fails if the hypotheses do not cover the references one to one, naming the missing ids and why
fairseq-generate leaves sentences out (an incomplete last batch, sentences skipped as longer than the model's
positions). Fails too if they are still in BPE (more
than 1% of them hold ``@@ `` continuation markers: generated without ``--remove-bpe``); ``--remove-bpe``
joins the pieces here instead, exactly as fairseq-generate would have. Fails when the references the output
carries (``T-<id>`` lines) are not those of ``--ref`` (another split or test set was translated; or cased
otherwise, unless ``--lowercase`` makes BLEU case-insensitive), or when ``--ref`` has an empty line.
"""

import argparse
import os
from typing import List, Optional

from fairseq_posattn.cli import reported_errors, setup_logging
from fairseq_posattn.data.generate_output import score_generate_output


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posattn-score", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("generate_output", help="stdout of fairseq-generate ... --remove-bpe "
                        "(or its --results-path generate-SUBSET.txt)")
    parser.add_argument("--ref", required=True, help="raw reference file, one sentence per line")
    parser.add_argument("--target-lang", "-t", default=None,
                        help="language of the hypotheses for the detokenizer "
                             "(default: the reference file's suffix, e.g. de for test.de)")
    parser.add_argument("--write-detok", metavar="PATH", default=None,
                        help="also write the detokenized hypotheses, in id order, to PATH")
    parser.add_argument("--lowercase", "-lc", action="store_true",
                        help="case-insensitive BLEU; the references the output carries (T- lines) may then differ "
                             "from --ref in case")
    add_remove_bpe_option(parser)
    return parser


def add_remove_bpe_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remove-bpe", action="store_true",
                        help="join subword-nmt BPE pieces ('@@ ') first, as fairseq-generate --remove-bpe does, "
                             "for output generated without it (which is otherwise refused)")


def target_language(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    if args.target_lang:
        return args.target_lang
    suffix = os.path.splitext(args.ref)[1].lstrip(".")
    if not suffix.isalpha() or len(suffix) > 3:
        parser.error(f"cannot tell the language from {args.ref}; pass --target-lang")
    return suffix


def main(argv: Optional[List[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    lang = target_language(args, parser)
    with reported_errors("posattn-score"):
        result = score_generate_output(args.generate_output, args.ref, lang, write_detok=args.write_detok,
                                       remove_bpe=args.remove_bpe, lowercase=args.lowercase)
    print(result.text)
    print(result.signature)


if __name__ == "__main__":
    main()
