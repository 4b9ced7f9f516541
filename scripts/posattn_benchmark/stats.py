"""The ratios to vanilla that the report prints and the targets are checked on."""

import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from posattn_benchmark.groups import Group
from posattn_benchmark.variants import GREEDY_SPEED, TARGETS, Target


def time_ratio(group: Group, name: str, default_malloc: bool = False) -> Optional[float]:
    """Median over the rounds of ``name``'s step time over vanilla's (with glibc's default malloc:
    ``default_malloc``); None if either was not timed."""
    reference = group.reference.name
    timing = group.timing_default_malloc if default_malloc else group.timing
    if name not in timing or reference not in timing:
        return None
    return statistics.median(t / r for t, r in zip(timing[name], timing[reference]))


def peak_mb(group: Group, name: str) -> Optional[float]:
    """Mean peak memory of ``name``'s memory runs; None if it crashed."""
    if name not in group.memory:
        return None
    return statistics.mean(run["peak_mb"] for run in group.memory[name])


def memory_ratio(group: Group, name: str) -> Optional[float]:
    mb, reference = peak_mb(group, name), peak_mb(group, group.reference.name)
    return None if mb is None or reference is None else mb / reference


def speed_ratio(group: Group, name: str) -> Optional[float]:
    """Median over the rounds of vanilla's decoding time over ``name``'s (above 1: faster)."""
    reference = group.reference.name
    if name not in group.decoding or reference not in group.decoding:
        return None
    return statistics.median(r / t for t, r in zip(group.decoding[name], group.decoding[reference]))


#: what each kind of target bounds: the ratio's name and the comparison
CHECKS: Dict[str, Tuple[str, str]] = {"time": ("time ratio", "<="), "memory": ("memory ratio", "<="),
                                      "speed": ("speed ratio", ">=")}


def ratio_of(group: Group, name: str, kind: str) -> Optional[float]:
    return {"time": time_ratio, "memory": memory_ratio, "speed": speed_ratio}[kind](group, name)


def target_checks(group: Group, name: str, kinds: Sequence[str]) -> List[Tuple[str, float, float, bool]]:
    """``(kind, ratio, bound, met)`` for each of ``kinds`` that ``name`` has a target for and was
    measured; ratios are compared as printed (two decimals)."""
    target = TARGETS.get(name, Target())
    checks = []
    for kind, (_, sign) in CHECKS.items():
        bound, ratio = getattr(target, kind), ratio_of(group, name, kind)
        if kind == "speed" and group.greedy and bound is not None:
            bound = GREEDY_SPEED.get(name, bound)
        if kind in kinds and bound is not None and ratio is not None:
            met = round(ratio, 2) <= bound if sign == "<=" else round(ratio, 2) >= bound
            checks.append((kind, ratio, bound, met))
    return checks


#: the structural prepare (align + side data + binarize) must be at least this many times as fast as
#: fairseq-preprocess binarizing the same BPE text, both timed in one process (a ratio, so that it
#: holds on any machine)
PREPARE_TARGET = 2.0


def prepare_check(prepare: Dict[str, Any]) -> Tuple[float, bool]:
    """The structural prepare's speed ratio to fairseq-preprocess (``scripts/benchmark_structure.py``:
    median over paired rounds of fairseq's CPU time over the structural one's) and whether it meets
    :data:`PREPARE_TARGET`, compared as printed (two decimals)."""
    ratio = prepare["fairseq_preprocess"]["cpu"]["ratio"]
    return ratio, round(ratio, 2) >= PREPARE_TARGET
