"""The papers' claims the suite judges, each stated as its paper states it, with the comparisons that test it.

A comparison is a per-seed difference Δ = system − reference of one metric (the runs of one seed share their
training stream and test examples, so Δ is paired by seed): two methods on the same splits, or one method on
two splits (a length against the training length). The verdict rule is the results page's: **reproduced in
direction** when the mean Δ has the claimed sign and so does every seed's; **not reproduced** when the mean Δ
and every seed's have the opposite sign; otherwise **inconclusive**; and **inconclusive at this size** when both
sides sit at the ceiling or at chance, or when no method learns the task in distribution (:data:`LEARNED`), where
our small models cannot show a difference. The paired t-test's p over seeds is reported beside it.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from posattn_tasks.statistics import mean_sd, paired_t_test

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced in direction", "not reproduced", "inconclusive"
AT_THIS_SIZE = "inconclusive at this size"
NOT_RUN = "not run yet"
#: a side at or above this accuracy is at the ceiling
CEILING = 0.99
#: a task is learned at a tier when its best method answers this fraction right in distribution (the suite's
#: calibration target); below it, a comparison on the task says little
LEARNED = 0.95


@dataclass(frozen=True)
class Side:
    """A method's metric on a task, averaged over ``splits`` within each seed."""

    method: str
    task: str
    splits: Tuple[str, ...]
    #: ``answer_accuracy`` (higher is better) or ``perplexity`` (the language model's, non-overlapping windows)
    metric: str = "answer_accuracy"

    def describe(self) -> str:
        return f"{self.method} on {self.task} {'/'.join(self.splits)}"


@dataclass(frozen=True)
class Comparison:
    system: Side
    reference: Side
    #: +1: the claim says the system's metric is higher; -1: lower
    direction: int


@dataclass(frozen=True)
class Claim:
    key: str
    paper: str
    #: the claim, as the paper states it
    statement: str
    comparisons: Tuple[Comparison, ...]
    #: the paper's own numbers for these comparisons, or why none is given
    paper_numbers: str
    #: what our size means for the verdict
    caveat: str = ""


def compare_methods(system: str, references: Sequence[str], tasks: Sequence[str], splits: Sequence[str],
                    direction: int = 1, metric: str = "answer_accuracy") -> Tuple[Comparison, ...]:
    return tuple(Comparison(Side(system, task, (split,), metric), Side(reference, task, (split,), metric), direction)
                 for task in tasks for split in splits for reference in references)



CLAIMS: Tuple[Claim, ...] = (
    Claim("cope", "Golovneva et al. 2024 (CoPE), arXiv 2405.18719, abstract and section 4",
          "\"CoPE can solve the selective copy, counting and Flip-Flop tasks where popular position embeddings "
          "fail\"",
          compare_methods("cope", ("rotary", "absolute"), ("flip-flop", "selective-copy", "counting"),
                          ("1x", "dense", "sparse")),
          "The paper's tables (absolute PE, RoPE and CoPE on the in-distribution, dense and sparse splits) could "
          "not be read here; its claim is judged in direction only.",
          "The paper trains 4-layer, d 256 models (counting: 100 epochs of 10,000 programs of up to 512 "
          "statements); ours are 2-layer, d 64, trained minutes on a CPU."),
    Claim("nope", "Kazemnejad et al. 2023, arXiv 2305.19466, abstract and section 4",
          "\"NoPE outperforms other explicit positional encoding methods\" at length generalisation; ALiBi, "
          "Rotary and APE \"are not well suited for length generalization\"",
          compare_methods("nope", ("t5-bias", "alibi", "rotary", "absolute"), ("copy", "reverse", "addition"),
                          ("2x",)),
          "The paper reports accuracy curves against length (train up to L, test up to 2L) and a mean reciprocal "
          "rank over tasks in which NoPE is first; its per-task numbers could not be read here.",
          "The paper's models are T5-base sized decoders (about 107M parameters) trained 40,000 steps; ours are "
          "2-layer, d 64 (about 0.1M), and the test is at twice the training length, as theirs."),
    Claim("alibi-passkey", "Press et al. 2022 (ALiBi) and the passkey test of Mohtashami and Jaggi 2023, "
          "arXiv 2305.16300 (the contrast as Chi et al. 2023, arXiv 2212.10356, explain it)",
          "ALiBi's perplexity extrapolates past the training length, but its retrieval does not reach past its "
          "window: \"when two tokens are distant, ALiBi becomes highly similar to windowed attention\"",
          (Comparison(Side("alibi", "language-model", ("32x",), "perplexity"),
                      Side("rotary", "language-model", ("32x",), "perplexity"), -1),
           Comparison(Side("alibi", "language-model", ("32x",), "perplexity"),
                      Side("nope", "language-model", ("32x",), "perplexity"), -1),
           Comparison(Side("alibi", "passkey", ("8x-depth0", "8x-depth25")),
                      Side("alibi", "passkey", ("1x-depth0", "1x-depth25")), -1)),
          "No paper found reports both numbers for one model; the contrast is judged in direction.",
          "The language model and the passkey model are trained apart (the passkey task trains on its own "
          "sequences); the window is ALiBi's learned-free slopes at 4 heads of a 2-layer model."),
    Claim("state-tracking", "Merrill, Petty and Sabharwal 2024, arXiv 2404.08819; Yang et al. 2025 (PaTH), "
          "arXiv 2505.16381",
          "Transformers with position-only encodings cannot track state (permutation composition) at a fixed "
          "depth; data-dependent position methods improve upon RoPE on state tracking",
          compare_methods("path-attention", ("rotary",), ("state-tracking",), ("1x", "2x"))
          + compare_methods("forget-gate", ("rotary",), ("state-tracking",), ("1x", "2x"))
          + compare_methods("cope", ("rotary",), ("state-tracking",), ("1x", "2x")),
          "The papers report the depth needed per length (Merrill et al.) and accuracies of PaTH against RoPE "
          "(Yang et al.); those numbers could not be read here.",
          "S3 at 4 moves with 2 layers on the CPU tier; the papers' A5 is the GPU tier's."),
)


def side_values(side: Side, records: Mapping[Tuple[str, str, int], Mapping[str, Any]]) -> Dict[int, float]:
    """Seed -> the side's metric, for the seeds whose record has every split of the side."""
    values = {}
    for (task, method, seed), record in records.items():
        if task != side.task or method != side.method:
            continue
        found = [metric_of(record, split, side.metric) for split in side.splits]
        if all(v is not None for v in found):
            values[seed] = sum(found) / len(found)  # type: ignore[arg-type]
    return values


def metric_of(record: Mapping[str, Any], split: str, metric: str) -> Optional[float]:
    scores = record["scores"]
    if metric == "perplexity":
        return scores.get("perplexity", {}).get(split, {}).get("nonoverlapping")
    return scores.get(split, {}).get(metric)


@dataclass
class ComparisonResult:
    comparison: Comparison
    deltas: Dict[int, float] = field(default_factory=dict)
    system: Dict[int, float] = field(default_factory=dict)
    reference: Dict[int, float] = field(default_factory=dict)
    p_value: Optional[float] = None
    verdict: str = NOT_RUN


def judge(comparison: Comparison, records: Mapping[Tuple[str, str, int], Mapping[str, Any]],
          seeds: Sequence[int], chance: Mapping[str, float], best: Mapping[str, float]) -> ComparisonResult:
    """The verdict of one comparison from the records of ``seeds`` (every seed must be recorded on both sides);
    ``chance`` and ``best`` (the best method's in-distribution accuracy) per task."""
    system, reference = side_values(comparison.system, records), side_values(comparison.reference, records)
    result = ComparisonResult(comparison, system=system, reference=reference)
    if not seeds or any(seed not in system or seed not in reference for seed in seeds):
        return result
    result.deltas = {seed: system[seed] - reference[seed] for seed in seeds}
    result.p_value = paired_t_test(list(result.deltas.values()))
    mean = mean_sd(list(result.deltas.values()))[0]
    task = comparison.system.task
    if comparison.system.metric == "answer_accuracy" and (best.get(task, 1.0) < LEARNED or at_ceiling_or_chance(
            [system[s] for s in seeds], [reference[s] for s in seeds], chance.get(task, 0.0))):
        result.verdict = AT_THIS_SIZE
    elif mean * comparison.direction > 0 and all(d * comparison.direction > 0 for d in result.deltas.values()):
        result.verdict = REPRODUCED
    elif mean * comparison.direction < 0 and all(d * comparison.direction < 0 for d in result.deltas.values()):
        result.verdict = NOT_REPRODUCED
    else:
        result.verdict = INCONCLUSIVE
    return result


def at_ceiling_or_chance(system: Sequence[float], reference: Sequence[float], chance: float) -> bool:
    both = list(system) + list(reference)
    return min(both) >= CEILING or max(both) <= chance + 0.02


def claim_verdict(results: Sequence[ComparisonResult]) -> str:
    """The claim's verdict: the comparisons' if they agree, else a count of each."""
    verdicts = [result.verdict for result in results]
    if NOT_RUN in verdicts:
        return NOT_RUN
    if len(set(verdicts)) == 1:
        return verdicts[0]
    counts = {v: verdicts.count(v) for v in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, AT_THIS_SIZE)}
    return "mixed: " + ", ".join(f"{n} of {len(verdicts)} {v}" for v, n in counts.items() if n)
