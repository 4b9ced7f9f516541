"""``posattn-compare``: a markdown table of several systems' BLEU against a baseline, with sacrebleu
signatures, 95% confidence intervals and paired bootstrap p-values.

    posattn-compare --ref test.de baseline=gen-baseline.txt struct-abs=gen-abs.txt struct-both=gen-both.txt

Each system is NAME=PATH; the first is the baseline. PATH is a ``fairseq-generate --remove-bpe`` output
(its ``H-<id>`` lines are put in id order and Moses-detokenized) or a plain file of detokenized
hypotheses, one per reference line (``--input-format`` to force either). A system still in BPE (more
than 1% of its hypotheses hold ``@@ `` markers: generated without ``--remove-bpe``) is refused;
``--remove-bpe`` joins the pieces of every system instead. ``--ref`` takes the raw reference file;
repeat it for multi-reference test sets (NIST: four). The references a fairseq-generate output carries
(``T-<id>`` lines) must be those of ``--ref``: systems that translated another split or test set are refused,
and so are references cased otherwise than the translated ones, unless ``--lowercase``.

Columns: sacreBLEU on detokenized text; the difference to the baseline; the bootstrap mean and the
half-width of its 95% interval; the p-value of sacrebleu's paired bootstrap resampling (Koehn 2004)
against the baseline (a system whose score equals the baseline's gets 1; a difference below 0.005, printed
+0.00, is a tie and never marked significant); the short signature.
``--tokenized-bleu`` adds the same table for the customary tokenized BLEU of the WMT14 English-German
papers (Moses tokenization, compounds split as ``##AT##-##AT##``, sacrebleu ``--tokenize none``);
``--no-compound-split`` leaves hyphens alone (the usual tokenized BLEU for other targets). The seed of
the resampling is sacrebleu's: ``SACREBLEU_SEED`` (default 12345), shown in the signatures.
"""

import argparse
from typing import List, Optional

from fairseq_posattn.cli import name_and_path, reported_errors, setup_logging
from fairseq_posattn.cli.score import add_remove_bpe_option, target_language
from fairseq_posattn.data.significance import (INPUT_FORMATS, compare_systems, markdown_table, read_references,
                                               read_system)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posattn-compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("systems", nargs="+", type=name_and_path("NAME"), metavar="NAME=PATH",
                        help="systems to compare; the first is the baseline")
    parser.add_argument("--ref", required=True, action="append",
                        help="raw reference file, one sentence per line; repeat the option for "
                             "multi-reference BLEU (--ref ref0 --ref ref1 ...)")
    parser.add_argument("--target-lang", "-t", default=None,
                        help="target language for the Moses detokenizer and tokenizer "
                             "(default: the first reference file's suffix, e.g. de for test.de)")
    parser.add_argument("--input-format", choices=INPUT_FORMATS, default="auto",
                        help="auto: fairseq-generate output when a file has H-<id> lines or generate's log "
                             "lines, else plain detokenized text (default: %(default)s)")
    parser.add_argument("--tokenized-bleu", action="store_true",
                        help="also the tokenized BLEU of the WMT14 en-de papers (Moses tokens, "
                             "compounds split as ##AT##-##AT##), with its own significance")
    parser.add_argument("--no-compound-split", action="store_true",
                        help="tokenized BLEU without the ##AT## compound splitting")
    parser.add_argument("--lowercase", "-lc", action="store_true", help="case-insensitive BLEU (every table)")
    parser.add_argument("--paired-bs-n", type=int, default=1000,
                        help="bootstrap resamples (default: %(default)s, as sacrebleu)")
    parser.add_argument("--paired-jobs", type=int, default=1,
                        help="processes for the paired tests, one per system at most; 0 = automatic "
                             "(default: %(default)s)")
    add_remove_bpe_option(parser)
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.systems) < 2:
        parser.error("give a baseline and at least one other system")
    setup_logging()
    lang = target_language(argparse.Namespace(target_lang=args.target_lang, ref=args.ref[0]), parser)
    with reported_errors("posattn-compare"):
        references = read_references(args.ref)
        systems = [(name, read_system(path, lang, args.ref[0], len(references[0]), args.input_format,
                                      args.remove_bpe, references, ignore_case=args.lowercase))
                   for name, path in args.systems]
        comparisons = compare_systems(systems, references, lang, tokenized_bleu=args.tokenized_bleu,
                                      split_compounds=not args.no_compound_split, lowercase=args.lowercase,
                                      n_samples=args.paired_bs_n, n_jobs=args.paired_jobs)
    print("\n\n".join(markdown_table(comparison, args.systems[0][0]) for comparison in comparisons))


if __name__ == "__main__":
    main()
