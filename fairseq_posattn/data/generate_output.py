"""Read ``fairseq-generate`` output and score it with sacrebleu against raw references.

``fairseq-generate`` prints, per sentence and in batch order (not id order), lines
``H-<id>\\t<score>\\t<text>``; with ``--remove-bpe`` the text is Moses-tokenized words. The scorer
orders them by id, detokenizes them with sacremoses and computes corpus BLEU on detokenized text
against the untouched reference file, as sacrebleu expects.

Hypotheses still in subword-nmt BPE (``fairseq-generate`` run without ``--remove-bpe``) would be scored
piece by piece, far too low (8.58 BLEU instead of 17.03 in one report), without any error.
:func:`without_bpe` refuses them: ``--remove-bpe`` removes every ``"@@ "`` (and a final ``"@@"``), so a
post-processed output has none,
while BPE text has them on most lines; a literal ``@@`` token followed by a space is rare in real text.
Rule: more than :data:`BPE_LINE_FRACTION` (1%) of the hypotheses holding a continuation marker is an
error; fewer (but some) is a warning, and the hypotheses are scored as written. ``remove_bpe=True``
(``posattn-score --remove-bpe``) joins the pieces exactly as ``fairseq-generate --remove-bpe`` does.

Scored against the reference of another split (``--gen-subset valid`` against ``test.de``), BLEU is a small
number and nothing says why. fairseq-generate also prints each sentence's reference, ``T-<id>\\t<text>``
(tokenized like the hypotheses, ``<<unk>>`` for words outside the dictionary): :func:`check_targets`
detokenizes those as it does the hypotheses and compares them with the reference file's lines, ignoring
whitespace and control characters (which tokenization and detokenization may change). Case counts unless
BLEU ignores it (``--lowercase``): a perfect translation scored 21.86 against a lowercased copy of its
references. An output without ``T-`` lines (fairseq-interactive's, or a split without targets) cannot be
checked: a warning says so. An empty line in a reference file is refused (:func:`read_reference`).

Hypotheses missing from the output are refused, naming their ids and the causes that fit their number
(:func:`hypotheses_in_order`): fairseq-generate drops an incomplete last batch (fewer than
``--required-batch-size-multiple`` sentences) and, with ``--skip-invalid-size-inputs-valid-test``, every
sentence longer than the model's positions.
"""

import logging
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, TypeVar

from sacrebleu.metrics import BLEU

from fairseq_posattn.atomic_io import read_lines, refuse_output_that_is_an_input, write_lines
from fairseq_posattn.data.text_pipeline import detokenize_lines, moses_detokenizer
from fairseq_posattn.data.text_pipeline import remove_bpe as join_bpe_pieces

T = TypeVar("T")

logger = logging.getLogger(__name__)

HYPOTHESIS_PREFIX = "H-"
TARGET_PREFIX = "T-"
#: How fairseq-generate prints a target word that is not in the dictionary (``escape_unk=True``).
ESCAPED_UNKNOWN = "<<unk>>"
#: What the check of the ``T-`` lines ignores: whitespace and the control characters Moses deletes.
_NOT_COMPARED = re.compile(r"[\s\x00-\x1f]+")
#: A subword-nmt piece that is not the last of its word ends with ``@@``: followed by a space, or the
#: line's end (where ``fairseq-generate --remove-bpe`` also removes it).
_BPE_CONTINUATION = re.compile(r"@@( |$)")
#: A file in which more than this share of the hypotheses hold a BPE continuation marker is refused.
BPE_LINE_FRACTION = 0.01
#: fairseq-generate's default ``--required-batch-size-multiple``: the incomplete last batch it drops holds fewer
#: sentences than this
DEFAULT_BATCH_SIZE_MULTIPLE = 8
#: the override that lets a model whose positions are not learned read longer sentences in fairseq-generate
LONGER_POSITIONS = "--model-overrides \"{'max_source_positions': 1024, 'max_target_positions': 1024}\""


@dataclass
class BleuResult:
    """Corpus BLEU of detokenized hypotheses, with sacrebleu's signature."""

    score: float
    text: str  # sacrebleu's "BLEU = 34.12 65.1/41.0/... (BP = ...)" line
    signature: str
    hypotheses: List[str]  # detokenized, in id order


def parse_hypotheses(path: str) -> Dict[int, str]:
    """Map sentence id -> hypothesis text for every ``H-<id>`` line of a fairseq-generate output."""
    return {sent_id: text for sent_id, (_, text) in numbered_hypotheses(path).items()}


def numbered_hypotheses(path: str) -> Dict[int, Tuple[int, str]]:
    """Map sentence id -> (line number, hypothesis text) for every ``H-<id>`` line of a fairseq-generate
    output.

    Other lines (``S-``, ``T-``, ``D-``, ``P-``, logging) are ignored. Raises ValueError on a
    malformed ``H-`` line or an id seen twice (two generate runs appended to one file).
    """
    hypotheses: Dict[int, Tuple[int, str]] = {}
    for number, line in enumerate(read_lines(path), start=1):
        if not line.startswith(HYPOTHESIS_PREFIX):
            continue
        fields = line.split("\t", 2)
        try:
            sent_id = int(fields[0][len(HYPOTHESIS_PREFIX):])
            float(fields[1])
        except (ValueError, IndexError):
            raise ValueError(f"{path}:{number}: not a fairseq-generate hypothesis line "
                             f"'H-<id>\\t<score>\\t<text>': {line!r}") from None
        if sent_id in hypotheses:
            raise ValueError(f"{path}:{number}: hypothesis id {sent_id} appears twice; was the output "
                             "of several fairseq-generate runs (or --nbest > 1) written to one file?")
        hypotheses[sent_id] = (number, fields[2] if len(fields) > 2 else "")
    return hypotheses


def hypotheses_in_order(hypotheses: Dict[int, T], gen_path: str, ref_path: str, n_refs: int) -> List[T]:
    """Hypotheses (texts, or anything else by id) sorted by id, after checking they are exactly ids
    0 .. n_refs - 1.

    Raises ValueError naming both files, the missing (or out-of-range) ids, why fairseq-generate leaves
    sentences out and how to generate them all, when the ids do not match the references.
    """
    if not hypotheses:
        raise ValueError(f"{gen_path} holds no hypotheses (H-<id> lines): fairseq-generate prints them unless it "
                         "is run with --quiet, which prints only its own score. Rerun it without --quiet and score "
                         "its output (stdout, or generate-SUBSET.txt in --results-path)")
    expected = set(range(n_refs))
    if len(hypotheses) == n_refs and set(hypotheses) == expected:
        return [hypotheses[i] for i in range(n_refs)]
    counts = f"{gen_path} has {len(hypotheses)} hypotheses (H- lines) but the reference {ref_path} has {n_refs} lines"
    extra = sorted(set(hypotheses) - expected)
    if extra:
        raise ValueError(f"{counts}, and ids out of range {_abbreviate(extra)}: the output translates a larger split "
                         f"or another test set. Score it against the raw reference file of the split it translates")
    missing = sorted(expected - set(hypotheses))
    raise ValueError(f"{counts} (missing ids {_abbreviate(missing)}). {_why_missing(len(missing))}")


def _why_missing(n_missing: int) -> str:
    """Why fairseq-generate left ``n_missing`` sentences out, and the rerun that translates every one."""
    skipped = ("with --skip-invalid-size-inputs-valid-test it skips every sentence longer than the model's positions "
               "(it logs \"N samples have invalid sizes and will be skipped\")")
    generate_all = (f"rerun fairseq-generate without --skip-invalid-size-inputs-valid-test; if it then stops at a "
                    f"sentence longer than the model's positions (\"Size of sample #K is invalid\"), let the model "
                    f"read longer ones with {LONGER_POSITIONS} (sinusoidal or relative positions read any length; "
                    f"learned ones cannot: retrain with larger --max-source-positions / --max-target-positions)")
    if n_missing >= DEFAULT_BATCH_SIZE_MULTIPLE:
        return (f"These {n_missing} sentences are more than the incomplete last batch that fairseq-generate drops "
                f"(fewer than --required-batch-size-multiple, {DEFAULT_BATCH_SIZE_MULTIPLE} by default): {skipped}. "
                f"BLEU without them is not the score of the test set: {generate_all}. An interrupted run, or one "
                f"shard of several (--num-shards), also leaves sentences out")
    return (f"fairseq-generate drops its last batch when it holds fewer than --required-batch-size-multiple "
            f"sentences ({DEFAULT_BATCH_SIZE_MULTIPLE} by default), and {skipped}. BLEU without them is not the score "
            f"of the test set: add --required-batch-size-multiple 1 if it was not given, and {generate_all}")


def read_generate_output(gen_path: str, ref_path: str, n_refs: int, remove_bpe: bool = False) -> List[str]:
    """The hypotheses of a fairseq-generate output in id order, checked against the reference's
    ``n_refs`` lines and for BPE left in (:func:`without_bpe`)."""
    numbered = hypotheses_in_order(numbered_hypotheses(gen_path), gen_path, ref_path, n_refs)
    return without_bpe(gen_path, numbered, remove_bpe)


def without_bpe(path: str, numbered: Sequence[Tuple[int, str]], remove_bpe: bool = False) -> List[str]:
    """Texts of ``numbered`` ``(line number in path, text)`` hypotheses, checked to hold no BPE pieces.

    ``remove_bpe``: join the pieces as ``fairseq-generate --remove-bpe`` does. Otherwise raises
    ValueError naming ``path:line`` of the first hypothesis with a continuation marker when more than
    :data:`BPE_LINE_FRACTION` of them have one, and warns when fewer do.
    """
    if remove_bpe:
        return [join_bpe_pieces(text) for _, text in numbered]
    with_bpe = [number for number, text in numbered if _BPE_CONTINUATION.search(text)]
    if with_bpe:
        share = f"{len(with_bpe)} of {len(numbered)} hypotheses hold BPE continuation markers ('@@ ')"
        if len(with_bpe) > BPE_LINE_FRACTION * len(numbered):
            raise ValueError(
                f"{path}:{min(with_bpe)}: hypotheses still in BPE: {share}. Scored as they are, BLEU counts the "
                "pieces as words and comes out far too low. Rerun fairseq-generate with --remove-bpe, or "
                "pass --remove-bpe to join the pieces as fairseq-generate --remove-bpe does")
        logger.warning("%s:%d: %s, too few for BPE text (more than %g%% is refused): they are scored as "
                       "written; pass --remove-bpe if they are BPE pieces", path, min(with_bpe), share,
                       100 * BPE_LINE_FRACTION)
    return [text for _, text in numbered]


def read_reference(path: str) -> List[str]:
    """The lines of a raw reference file, one reference translation per line.

    An empty line is refused, naming ``path:line``: no test set has empty references, and an extra blank line
    at the end would otherwise be reported as hypotheses missing from the fairseq-generate output.
    """
    lines = list(read_lines(path))
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            where = ("an extra blank line at the end of the file" if not "".join(lines[number:]).strip()
                     else "every later reference is shifted against its hypothesis")
            raise ValueError(f"{path}:{number}: empty line in the reference file ({where}); every line must hold the "
                             f"reference translation of one sentence: remove line {number} from {path}")
    return lines


def numbered_targets(path: str) -> Dict[int, Tuple[int, str]]:
    """Map sentence id -> (line number, reference text) for every ``T-<id>`` line of a fairseq-generate output."""
    targets: Dict[int, Tuple[int, str]] = {}
    for number, line in enumerate(read_lines(path), start=1):
        if line.startswith(TARGET_PREFIX):
            ident, _, text = line.partition("\t")
            try:
                targets[int(ident[len(TARGET_PREFIX):])] = (number, text)
            except ValueError:
                raise ValueError(f"{path}:{number}: not a fairseq-generate reference line 'T-<id>\\t<text>': "
                                 f"{line!r}") from None
    return targets


def check_targets(gen_path: str, ref_path: str, references: Sequence[Sequence[str]], lang: str,
                  remove_bpe: bool = False, ignore_case: bool = False) -> None:
    """Check that the references fairseq-generate printed (``T-<id>`` lines) are those of the reference files.

    ``references`` holds the lines of every reference file (several for multi-reference BLEU), ``ref_path`` is
    the first one. Each ``T-`` line is detokenized for ``lang`` (its BPE pieces first joined if ``remove_bpe``)
    and must be line ``id + 1`` of one of the files, up to :func:`same_sentence` (case too, unless
    ``ignore_case``: case-insensitive BLEU); otherwise ValueError names the generate file's line, the sentence and
    the reference line. No ``T-`` line at all is a warning.
    """
    targets = numbered_targets(gen_path)
    if not targets:
        logger.warning("%s has no reference lines (T-<id>), so nothing shows that it translates the sentences "
                       "of %s: fairseq-generate prints them for a split with a target side (fairseq-interactive "
                       "never does). Make sure the reference is that of the translated split", gen_path, ref_path)
        return
    detokenize = moses_detokenizer(lang)
    for sent_id, (number, text) in sorted(targets.items()):
        target = detokenize(join_bpe_pieces(text) if remove_bpe else text)
        candidates = [lines[sent_id] for lines in references if sent_id < len(lines)]
        if any(same_sentence(target, line, ignore_case) for line in candidates):
            continue
        if any(same_sentence(target, line, ignore_case=True) for line in candidates):
            raise ValueError(_case_mismatch(gen_path, number, sent_id, target, ref_path, references))
        raise ValueError(_target_mismatch(gen_path, number, sent_id, target, ref_path, references))


def same_sentence(target: str, reference: str, ignore_case: bool = False) -> bool:
    """Whether a detokenized ``T-`` line holds the sentence of a raw reference line: the same text once
    whitespace and control characters (and case, if ``ignore_case``) are ignored, each ``<<unk>>`` standing for
    some text."""
    pieces = [re.escape(_compared(piece, ignore_case)) for piece in target.split(ESCAPED_UNKNOWN)]
    return re.fullmatch(".+?".join(pieces), _compared(reference, ignore_case), flags=re.DOTALL) is not None


def _compared(text: str, ignore_case: bool) -> str:
    text = _NOT_COMPARED.sub("", text)
    return text.casefold() if ignore_case else text


def _target_mismatch(gen_path: str, number: int, sent_id: int, target: str, ref_path: str,
                     references: Sequence[Sequence[str]]) -> str:
    others = f" (nor of the {len(references) - 1} other reference files)" if len(references) > 1 else ""
    return (f"{_mismatch(gen_path, number, sent_id, target, ref_path, references, 'is not {line}' + others)}. The "
            f"output translates another split or test set (e.g. fairseq-generate --gen-subset valid scored against "
            f"test references): score it against the raw reference file of the split it translates, or generate the "
            f"split of --ref")


def _case_mismatch(gen_path: str, number: int, sent_id: int, target: str, ref_path: str,
                   references: Sequence[Sequence[str]]) -> str:
    others = f" (or of one of the {len(references) - 1} other reference files)" if len(references) > 1 else ""
    relation = "is {line}" + others + " only when case is ignored"
    return (f"{_mismatch(gen_path, number, sent_id, target, ref_path, references, relation)}. Case-sensitive BLEU "
            f"against references cased otherwise than the translated test set is far too low (a perfect translation "
            f"scores far below 100): score against the reference file the test set was binarized from, with its case "
            f"(not a lowercased or truecased copy), or pass --lowercase for case-insensitive BLEU")


def _mismatch(gen_path: str, number: int, sent_id: int, target: str, ref_path: str,
              references: Sequence[Sequence[str]], relation: str) -> str:
    """``gen:line: the reference of sentence K (T-K) RELATION: what each holds``, ``{line}`` in ``relation``
    standing for ``line K+1 of REF``."""
    first = references[0]
    found = f'reads "{_shortened(first[sent_id])}"' if sent_id < len(first) else f"has only {len(first)} lines"
    where = relation.format(line=f"line {sent_id + 1} of {ref_path}")
    return (f"{gen_path}:{number}: the reference of sentence {sent_id} (T-{sent_id}) {where}: fairseq-generate "
            f"printed \"{_shortened(target)}\", {ref_path}:{sent_id + 1} {found}")


def _shortened(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _abbreviate(ids: List[int], limit: int = 10) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return f"{shown}, ... ({len(ids)} in all)" if len(ids) > limit else shown


def score_generate_output(gen_path: str, ref_path: str, lang: str, write_detok: Optional[str] = None,
                          remove_bpe: bool = False, lowercase: bool = False) -> BleuResult:
    """Corpus BLEU of a ``fairseq-generate --remove-bpe`` output against a raw reference file.

    ``lang`` is the target language (for the Moses detokenizer). ``write_detok``, if given, receives
    the detokenized hypotheses in id order, one per line. ``remove_bpe`` joins BPE pieces first (for an
    output generated without ``--remove-bpe``, which is otherwise refused: :func:`without_bpe`). ``lowercase``:
    case-insensitive BLEU. The output's ``T-`` lines must be the reference's, in case too unless ``lowercase``
    (:func:`check_targets`), which has no empty line (:func:`read_reference`).
    """
    if write_detok:
        refuse_output_that_is_an_input(write_detok, gen_path, ref_path)
    references = read_reference(ref_path)
    hypotheses = read_generate_output(gen_path, ref_path, len(references), remove_bpe)
    check_targets(gen_path, ref_path, [references], lang, remove_bpe, ignore_case=lowercase)
    detok = detokenize_lines(hypotheses, lang)
    if write_detok:
        write_lines(write_detok, detok)
        logger.info("wrote %d detokenized hypotheses to %s", len(detok), write_detok)
    return bleu(detok, references, lowercase)


def bleu(hypotheses: List[str], references: List[str], lowercase: bool = False) -> BleuResult:
    """sacrebleu corpus BLEU (default 13a tokenization; case-insensitive if ``lowercase``) of detokenized text
    against one reference."""
    metric = BLEU(lowercase=lowercase)
    score = metric.corpus_score(hypotheses, [references])
    return BleuResult(score=score.score, text=str(score), signature=str(metric.get_signature()),
                      hypotheses=hypotheses)
