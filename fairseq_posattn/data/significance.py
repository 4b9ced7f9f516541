"""Compare translation systems against a baseline: BLEU with sacrebleu signatures, 95% confidence
intervals and p-values from sacrebleu's paired bootstrap resampling (Koehn 2004).

Two BLEU flavours, both computed by sacrebleu and both printed with their signature:

- **sacreBLEU**: detokenized hypotheses against the raw references, sacrebleu's own tokenization
  (``13a`` by default). This is the comparable number.
- **tokenized BLEU** (:func:`tokenize_for_bleu`): the number the WMT14 English-German papers report
  (tensor2tensor's ``get_ende_bleu.sh``, fairseq's ``compound_split_bleu.sh``): hypotheses and
  references Moses-tokenized (sacremoses), hyphenated compounds split as ``a ##AT##-##AT## b``, then
  BLEU on those tokens as they stand (sacrebleu ``tokenize='none'``, i.e. ``multi-bleu.perl``).

Systems come as ``fairseq-generate --remove-bpe`` outputs (``H-<id>`` lines, Moses-tokenized: they are
put in id order and detokenized) or as plain detokenized text, one hypothesis per line. Either is
refused when it is still in BPE (:func:`fairseq_posattn.data.generate_output.without_bpe`): one system
scored on pieces would differ "significantly" from the others for no reason but the missing post-processing.
So is a generate output whose references (``T-`` lines) are not those of the reference files
(:func:`fairseq_posattn.data.generate_output.check_targets`): every system is checked against the same
references, so systems that translate different splits are never compared.
"""

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest
from sacremoses import MosesTokenizer

from fairseq_posattn.atomic_io import read_lines
from fairseq_posattn.data.generate_output import check_targets, read_generate_output, read_reference, without_bpe
from fairseq_posattn.data.text_pipeline import detokenize_lines

#: ``a-b`` -> ``a ##AT##-##AT## b``, non-overlapping left to right exactly like the Perl original
#: ``s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g`` (so ``a-b-c`` becomes ``a ##AT##-##AT## b-c``).
_COMPOUND = re.compile(r"(\S)-(\S)")
#: A ``fairseq-generate`` hypothesis line, ``H-<id>\t<score>\t<text>``, or one of its log lines (all that
#: ``--quiet`` leaves).
_GENERATE_LINE = re.compile(r"^H-\d+\t[-+0-9.eEinfa]+(\t|$)|.* \| fairseq_cli\.generate \| |Generate \S+ with beam=")
INPUT_FORMATS = ("auto", "generate", "text")
SIGNIFICANCE_LEVEL = 0.05
#: decimals of the printed BLEU scores and differences; a difference that prints as +0.00 is a tie
PRINTED_DECIMALS = 2
#: differences smaller than this print as 0.00: a tie, never significant
TIE = 0.5 * 10 ** -PRINTED_DECIMALS


def compound_split(line: str) -> str:
    """Split hyphenated compounds the way the WMT14 English-German BLEU scripts do."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tokenize_for_bleu(lines: Sequence[str], lang: str, split_compounds: bool = True) -> List[str]:
    """Moses-tokenize detokenized lines (sacremoses, no aggressive hyphen splitting, no escaping) and
    optionally split hyphenated compounds: the text the customary tokenized BLEU is computed on."""
    tokenizer = MosesTokenizer(lang=lang)
    tokenized = (tokenizer.tokenize(line, return_str=True, escape=False) for line in lines)
    return [compound_split(line) if split_compounds else line for line in tokenized]


def is_generate_output(path: str) -> bool:
    """True if ``path`` holds ``fairseq-generate`` output, i.e. has at least one ``H-<id>\\t<score>\\t``
    line or one of its log lines; plain hypothesis files have neither."""
    return any(_GENERATE_LINE.match(line) for line in read_lines(path))


def read_system(path: str, lang: str, ref_path: str, n_lines: int, input_format: str = "auto",
                remove_bpe: bool = False, references: Optional[Sequence[Sequence[str]]] = None,
                ignore_case: bool = False) -> List[str]:
    """A system's detokenized hypotheses, in the order of the reference ``ref_path`` (``n_lines`` lines).

    ``input_format``: ``generate`` (a ``fairseq-generate --remove-bpe`` output, ordered by id and
    Moses-detokenized with ``lang``), ``text`` (already detokenized, one line per reference line) or
    ``auto`` (``generate`` when :func:`is_generate_output`). Raises ValueError naming the files when
    the hypotheses do not match the reference lines one to one, or when they are still in BPE (unless
    ``remove_bpe``, which joins the pieces first). ``references`` (the lines of every reference file,
    ``ref_path``'s first): a generate output's ``T-`` lines must be these, in case too unless ``ignore_case``
    (case-insensitive BLEU; :func:`~fairseq_posattn.data.generate_output.check_targets`).
    """
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input format must be one of {INPUT_FORMATS}, got {input_format!r}")
    if input_format == "generate" or (input_format == "auto" and is_generate_output(path)):
        hypotheses = read_generate_output(path, ref_path, n_lines, remove_bpe)
        if references is not None:
            check_targets(path, ref_path, references, lang, remove_bpe, ignore_case)
        return detokenize_lines(hypotheses, lang)
    lines = list(read_lines(path))
    if len(lines) != n_lines:
        raise ValueError(f"{path} has {len(lines)} lines but the reference {ref_path} has {n_lines}: a "
                         "plain hypothesis file needs one detokenized hypothesis per reference line")
    return without_bpe(path, list(enumerate(lines, start=1)), remove_bpe)


def read_references(paths: Sequence[str]) -> List[List[str]]:
    """One list of lines per reference file (several for multi-reference test sets such as NIST); raises
    ValueError if the files differ in length or one has an empty line
    (:func:`~fairseq_posattn.data.generate_output.read_reference`)."""
    references = [read_reference(path) for path in paths]
    lengths = {len(ref) for ref in references}
    if len(lengths) > 1:
        counts = ", ".join(f"{path}: {len(ref)}" for path, ref in zip(paths, references))
        raise ValueError(f"reference files differ in length ({counts}); each must have one line per "
                         "source sentence")
    return references


@dataclass
class SystemResult:
    """One system's BLEU and its paired bootstrap statistics against the baseline."""

    name: str
    score: float  # corpus BLEU on the whole test set
    mean: float  # mean BLEU over the bootstrap resamples
    ci: float  # half-width of the 95% interval of the resampled BLEU (mean +- ci)
    p_value: Optional[float]  # paired bootstrap p-value against the baseline; None for the baseline
    difference: float  # score minus the baseline's score (0 for the baseline)

    @property
    def tie(self) -> bool:
        """The difference to the baseline is below the printed precision (it prints as +0.00)."""
        return abs(self.difference) < TIE

    @property
    def significant(self) -> bool:
        """p below :data:`SIGNIFICANCE_LEVEL`, for a difference that is not a :attr:`tie`."""
        return self.p_value is not None and self.p_value < SIGNIFICANCE_LEVEL and not self.tie


@dataclass
class MetricComparison:
    """The systems' results for one BLEU flavour, with sacrebleu's signature for it."""

    title: str
    signature: str
    short_signature: str
    results: List[SystemResult]


def paired_bootstrap(systems: Sequence[Tuple[str, List[str]]], references: Sequence[List[str]], title: str,
                     n_samples: int = 1000, n_jobs: int = 1, **bleu_options) -> MetricComparison:
    """BLEU of every system and sacrebleu's paired bootstrap test of each against the first.

    ``bleu_options`` go to :class:`sacrebleu.metrics.BLEU` (``tokenize``, ``lowercase``, ...). The
    resampling seed is sacrebleu's (``SACREBLEU_SEED``, default 12345) and is part of the signature.

    sacrebleu's p-value is ``(c + 1) / (n_samples + 1)`` with ``c`` the resamples whose centred
    difference exceeds the observed one. Where the observed difference is zero (the same hypotheses, or
    hypotheses that differ only in what BLEU's tokenization removes, such as the spacing around punctuation)
    every resample differs by zero too, ``c = 0``, and sacrebleu would report its smallest p-value as if the
    two differed. There is no difference to test: such a system gets ``p = 1``. A non-zero difference too small
    to print (:attr:`SystemResult.tie`) keeps sacrebleu's p-value but is never :attr:`SystemResult.significant`.
    """
    if len(systems) < 2:
        raise ValueError("a paired comparison needs a baseline and at least one other system")
    names = [name for name, _ in systems]
    if len(set(names)) != len(names):
        raise ValueError(f"system names must differ, got {names}")
    metric = BLEU(**bleu_options)
    signatures, scores = PairedTest(list(systems), {"BLEU": metric}, references, test_type="bs",
                                    n_samples=n_samples, n_jobs=n_jobs)()
    (metric_name, signature), = signatures.items()
    baseline_score = scores[metric_name][0].score
    results = []
    for (name, _), result in zip(systems, scores[metric_name]):
        difference = result.score - baseline_score
        p_value = 1.0 if result.p_value is not None and difference == 0 else result.p_value
        results.append(SystemResult(name, result.score, result.mean, result.ci, p_value, difference))
    return MetricComparison(title, signature.format(), signature.format(short=True), results)


def compare_systems(systems: Sequence[Tuple[str, List[str]]], references: Sequence[List[str]], lang: str,
                    tokenized_bleu: bool = False, split_compounds: bool = True, lowercase: bool = False,
                    n_samples: int = 1000, n_jobs: int = 1) -> List[MetricComparison]:
    """sacreBLEU comparison of detokenized systems, and optionally the tokenized BLEU one.

    ``lang`` is the target language (Moses tokenizer of the tokenized BLEU); ``lowercase`` makes both
    case-insensitive (the NIST Chinese-English convention).
    """
    comparisons = [paired_bootstrap(systems, references, "sacreBLEU (detokenized)", n_samples, n_jobs,
                                    lowercase=lowercase)]
    if tokenized_bleu:
        how = "Moses-tokenized" + (", compounds split as ##AT##-##AT##" if split_compounds else "")
        tokenized = [(name, tokenize_for_bleu(hyps, lang, split_compounds)) for name, hyps in systems]
        tokenized_refs = [tokenize_for_bleu(ref, lang, split_compounds) for ref in references]
        comparisons.append(paired_bootstrap(tokenized, tokenized_refs, f"tokenized BLEU ({how}; tok:none)",
                                            n_samples, n_jobs, tokenize="none", lowercase=lowercase,
                                            force=True))  # tokenized on purpose: no "forgot to detokenize?"
    return comparisons


def _cell(text: str) -> str:
    """Markdown table cell text: a literal ``|`` would end the cell."""
    return text.replace("|", "\\|")


def markdown_table(comparison: MetricComparison, baseline: str) -> str:
    """``| system | BLEU | delta | 95% CI | p-value | signature |``, the baseline first."""
    lines = [f"**{comparison.title}**", "",
             "| system | BLEU | Δ vs baseline | 95% CI (bootstrap) | p-value vs baseline | signature |",
             "|---|---:|---:|---:|---:|---|"]
    for result in comparison.results:
        if result.p_value is None:
            delta, p_value = "", "(baseline)"
        else:
            delta = f"{result.difference:+.{PRINTED_DECIMALS}f}"
            small_tie = result.tie and result.p_value < SIGNIFICANCE_LEVEL  # no star, and the reason why
            p_value = f"{result.p_value:.4f}" + (" *" if result.significant else " (tie)" if small_tie else "")
        lines.append(f"| {_cell(result.name)} | {result.score:.2f} | {delta} | "
                     f"{result.mean:.2f} ± {result.ci:.2f} | {p_value} | `{_cell(comparison.short_signature)}` |")
    lines += ["", f"Signature: `{comparison.signature}`", "",
              f"p-value: sacrebleu's paired bootstrap resampling against {baseline}; "
              f"* p < {SIGNIFICANCE_LEVEL}; a difference that prints as ±0.00 is a tie, never significant. "
              f"95% CI: mean ± half-width of the resampled BLEU."]
    return "\n".join(lines)
