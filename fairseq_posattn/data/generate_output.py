"""Read ``fairseq-generate`` output and score it with sacrebleu against raw references.

``fairseq-generate`` prints, per sentence and in batch order (not id order), lines
``H-<id>\\t<score>\\t<text>``; with ``--remove-bpe`` the text is Moses-tokenized words. The scorer
orders them by id, detokenizes them with sacremoses and computes corpus BLEU on detokenized text
against the untouched reference file, as sacrebleu expects.
"""

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

from sacrebleu.metrics import BLEU

from fairseq_posattn.atomic_io import read_lines, write_lines
from fairseq_posattn.data.text_pipeline import detokenize_lines

logger = logging.getLogger(__name__)

HYPOTHESIS_PREFIX = "H-"


@dataclass
class BleuResult:
    """Corpus BLEU of detokenized hypotheses, with sacrebleu's signature."""

    score: float
    text: str  # sacrebleu's "BLEU = 34.12 65.1/41.0/... (BP = ...)" line
    signature: str
    hypotheses: List[str]  # detokenized, in id order


def parse_hypotheses(path: str) -> Dict[int, str]:
    """Map sentence id -> hypothesis text for every ``H-<id>`` line of a fairseq-generate output.

    Other lines (``S-``, ``T-``, ``D-``, ``P-``, logging) are ignored. Raises ValueError on a
    malformed ``H-`` line or an id seen twice (two generate runs appended to one file).
    """
    hypotheses: Dict[int, str] = {}
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
        hypotheses[sent_id] = fields[2] if len(fields) > 2 else ""
    return hypotheses


def hypotheses_in_order(hypotheses: Dict[int, str], gen_path: str, ref_path: str, n_refs: int) -> List[str]:
    """Hypotheses sorted by id, after checking they are exactly ids 0 .. n_refs - 1.

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


def _abbreviate(ids: List[int], limit: int = 10) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return f"{shown}, ... ({len(ids)} in all)" if len(ids) > limit else shown


def score_generate_output(gen_path: str, ref_path: str, lang: str,
                          write_detok: Optional[str] = None) -> BleuResult:
    """Corpus BLEU of a ``fairseq-generate --remove-bpe`` output against a raw reference file.

    ``lang`` is the target language (for the Moses detokenizer). ``write_detok``, if given, receives
    the detokenized hypotheses in id order, one per line.
    """
    references = list(read_lines(ref_path))
    hypotheses = hypotheses_in_order(parse_hypotheses(gen_path), gen_path, ref_path, len(references))
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
