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
"""

import logging
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, TypeVar

from sacrebleu.metrics import BLEU

from fairseq_posattn.atomic_io import read_lines, write_lines
from fairseq_posattn.data.text_pipeline import detokenize_lines
from fairseq_posattn.data.text_pipeline import remove_bpe as join_bpe_pieces

T = TypeVar("T")

logger = logging.getLogger(__name__)

HYPOTHESIS_PREFIX = "H-"
#: A subword-nmt piece that is not the last of its word ends with ``@@``: followed by a space, or the
#: line's end (where ``fairseq-generate --remove-bpe`` also removes it).
_BPE_CONTINUATION = re.compile(r"@@( |$)")
#: A file in which more than this share of the hypotheses hold a BPE continuation marker is refused.
BPE_LINE_FRACTION = 0.01


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

    Raises ValueError naming both files when the counts or ids do not match the references.
    """
    expected = set(range(n_refs))
    if len(hypotheses) == n_refs and set(hypotheses) == expected:
        return [hypotheses[i] for i in range(n_refs)]
    missing = sorted(expected - set(hypotheses))
    extra = sorted(set(hypotheses) - expected)
    detail = []
    if missing:
        detail.append(f"missing ids {_abbreviate(missing)}")
    if extra:
        detail.append(f"ids out of range {_abbreviate(extra)}")
    raise ValueError(
        f"{gen_path} has {len(hypotheses)} hypotheses (H- lines) but the reference {ref_path} has "
        f"{n_refs} lines ({'; '.join(detail)}). fairseq-generate silently drops the last, incomplete "
        "batch unless it is run with --required-batch-size-multiple 1; rerun it with that option (and "
        "check that --gen-subset, --max-sentences/--batch-size and the reference file match)."
    )


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


def _abbreviate(ids: List[int], limit: int = 10) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return f"{shown}, ... ({len(ids)} in all)" if len(ids) > limit else shown


def score_generate_output(gen_path: str, ref_path: str, lang: str, write_detok: Optional[str] = None,
                          remove_bpe: bool = False) -> BleuResult:
    """Corpus BLEU of a ``fairseq-generate --remove-bpe`` output against a raw reference file.

    ``lang`` is the target language (for the Moses detokenizer). ``write_detok``, if given, receives
    the detokenized hypotheses in id order, one per line. ``remove_bpe`` joins BPE pieces first (for an
    output generated without ``--remove-bpe``, which is otherwise refused: :func:`without_bpe`).
    """
    references = list(read_lines(ref_path))
    hypotheses = read_generate_output(gen_path, ref_path, len(references), remove_bpe)
    detok = detokenize_lines(hypotheses, lang)
    if write_detok:
        write_lines(write_detok, detok)
        logger.info("wrote %d detokenized hypotheses to %s", len(detok), write_detok)
    return bleu(detok, references)


def bleu(hypotheses: List[str], references: List[str]) -> BleuResult:
    """sacrebleu corpus BLEU (default 13a tokenization) of detokenized text against one reference."""
    metric = BLEU()
    score = metric.corpus_score(hypotheses, [references])
    return BleuResult(score=score.score, text=str(score), signature=str(metric.get_signature()),
                      hypotheses=hypotheses)
