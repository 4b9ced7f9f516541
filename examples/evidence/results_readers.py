"""What each finished evidence run measured, read from its record (:mod:`records`: the files the runner
keeps of it in ``examples/evidence/records/<run id>/``).

Per run a dictionary of metrics (``bleu_test``, ``test_ppl``, ``accuracy``, ``final_accuracy``, ...) and
its learning curve; per pair of runs of one seed the paired bootstrap p-value: sacrebleu's for BLEU
(:func:`fairseq_posattn.data.significance.paired_bootstrap`), the same resampling over dev sentences for
tagging accuracy (:func:`paired_accuracy_bootstrap`).

A record's ``train.log`` holds the logs of every attempt of an interrupted and resumed training, oldest
first (:func:`records.train_log_lines`): a later validation of the same x replaces an earlier one. The logs'
lines are read by :mod:`posattn_tools.runs`, the tools' one reader of fairseq's logs.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from evidence_plan import EXTRAPOLATION_TRAIN_LENGTH, recipe_module
from paper_claims import extrapolation_metric
from records import TRAIN_LOG, record_remedy

from posattn_tools.json_files import read_json
from posattn_tools.runs import VALIDATE_ACCURACY, read_log, train_wall_by_epoch, validations

from fairseq_posattn.data.generate_output import bleu as corpus_bleu
from fairseq_posattn.data.significance import MetricComparison, paired_bootstrap, read_references, read_system
from fairseq_posattn.data.tagged_corpus import read_tagged_conllu

#: the records folders of the length-extrapolation recipe's replicas (``<method>/seed<N>/``): the plain-PyTorch
#: runs (examples/pytorch), the Hugging Face ones (examples/huggingface)
PYTORCH_EXTRAPOLATION = "pytorch_extrapolation"
HUGGINGFACE_EXTRAPOLATION = "huggingface_extrapolation"
BOOTSTRAP_SEED = 12345  # sacrebleu's default resampling seed, for the tagging bootstrap too


LM_TABLE = recipe_module("lm_results_table", "examples/language_model/results_table.py")
TAGGING_TABLE = recipe_module("tagging_results_table", "examples/pos_tagging/results_table.py")


def curve(log: Path, metric: str, x: str) -> List[Tuple[float, float]]:
    return [(at, stats[metric]) for at, stats in validations(log, x).items() if metric in stats]


def training_hours_by_epoch(log: Path) -> Dict[int, float]:
    """Cumulative training time (fairseq's train_wall, validation excluded) at the end of each epoch."""
    per_epoch = train_wall_by_epoch(log)
    hours, total = {}, 0.0
    for epoch in sorted(per_epoch):
        total += per_epoch[epoch]
        hours[epoch] = total / 3600
    return hours


# --------------------------------------------------------------------------------- per-task metrics
def lm_metrics(record: Path) -> Dict[str, float]:
    valid = LM_TABLE.parse_eval(LM_TABLE.read(str(record / "eval.valid.log")))
    test = LM_TABLE.parse_eval(LM_TABLE.read(str(record / "eval.test.log")))
    metrics = {"valid_ppl": valid.get("ppl"), "test_ppl": test.get("ppl"), "test_tokens": test.get("tokens")}
    epochs = validations(record / TRAIN_LOG, "epoch")
    if epochs:
        metrics["epochs"] = max(epochs)
    hours = training_hours_by_epoch(record / TRAIN_LOG)
    if hours:
        metrics["train_hours"] = hours[max(hours)]
    return {k: float(v) for k, v in metrics.items() if v is not None}


def tagging_metrics(record: Path) -> Dict[str, float]:
    scores = TAGGING_TABLE.read_validation(str(record / "validate.log"))["valid"]
    metrics = dict(scores)
    by_epoch = validations(record / TRAIN_LOG, "epoch")
    if by_epoch:
        metrics["epochs"] = max(by_epoch)
        first = by_epoch.get(1.0, {})
        if "accuracy" in first:
            metrics["accuracy_epoch1"] = first["accuracy"]
    return metrics


def classification_metrics(record: Path) -> Dict[str, float]:
    metrics: Dict[str, float] = {}
    found = VALIDATE_ACCURACY.findall(read_log(record / "validate.log"))
    if found:
        metrics["best_accuracy"] = float(found[-1])
    points = curve(record / TRAIN_LOG, "accuracy", "num_updates")
    if points:
        metrics["final_accuracy"] = points[-1][1]
    return metrics


def extrapolation_records(record: Path) -> List[Dict]:
    """A length-extrapolation run's evaluations (its ``results.json``: one entry per mode and length, as
    ``extrapolation.py table`` writes them); a damaged one stops the command in one line."""
    return read_json(record / "results.json", record_remedy(record), list)  # type: ignore[return-value]


def replica_extrapolation_records(root: Path, folder: str) -> List[Dict]:
    """A replica's evaluations (examples/pytorch/extrapolation.py, examples/huggingface/extrapolation.py: same
    fields as :func:`extrapolation_records`'s), from every run's ``results.json`` under ``root/folder/``."""
    paths = sorted((root / folder).glob("*/seed*/results.json"))
    return [entry for path in paths for entry in read_json(path, record_remedy(path.parent), list)]  # type: ignore


def pytorch_extrapolation_records(root: Path) -> List[Dict]:
    """The plain-PyTorch recipe's evaluations, under ``root/pytorch_extrapolation/``."""
    return replica_extrapolation_records(root, PYTORCH_EXTRAPOLATION)


def huggingface_extrapolation_records(root: Path) -> List[Dict]:
    """The Hugging Face recipe's evaluations, under ``root/huggingface_extrapolation/``."""
    return replica_extrapolation_records(root, HUGGINGFACE_EXTRAPOLATION)


#: a logged training interval's loss (base 2) and the updates it ends at: fairseq-train's ``train_inner`` lines,
#: the replicas' (plain PyTorch, Hugging Face) ``update N | loss X`` lines
TRAIN_INTERVAL_LINES = (re.compile(r"train_inner \| .*?loss=([\d.]+), .*?num_updates=(\d+),"),
                        re.compile(r"\| update (\d+) \| loss ([\d.]+) \|"))


def interval_training_losses(log: Path) -> Dict[int, float]:
    """The training loss (base 2, dropout on) of every logged interval, by the updates it ends at."""
    text = log.read_text(encoding="utf-8")
    fairseq_lines, pytorch_lines = TRAIN_INTERVAL_LINES
    losses = {int(updates): float(loss) for loss, updates in fairseq_lines.findall(text)}
    losses.update({int(updates): float(loss) for updates, loss in pytorch_lines.findall(text)})
    return losses


def extrapolation_metric_of(evaluation: Dict) -> str:
    """The metric an entry of ``results.json`` measures: ``ppl_<mode>_x<multiplier>``."""
    return extrapolation_metric(evaluation["mode"], evaluation["length"] // EXTRAPOLATION_TRAIN_LENGTH)


def extrapolation_metrics(record: Path) -> Dict[str, float]:
    """The perplexity of every evaluation that scored the split, by metric (refusals have none)."""
    return {extrapolation_metric_of(r): float(r["ppl"]) for r in extrapolation_records(record) if r["status"] == "ok"}


# --------------------------------------------------------------------------------- translation
@dataclass
class BleuComparison:
    """One seed and subset: every system's BLEU and p-value against ``reference``, with the signature."""

    reference: str
    bleu: Dict[str, float]
    p_value: Dict[str, Optional[float]]
    signature: str


def translations(record: Path, subset: str) -> Path:
    """A recorded run's detokenized translations of ``subset``, one per reference line."""
    return record / f"hypotheses.{subset}.de"


def bleu(record: Path, subset: str, ref_path: Path) -> float:
    """sacreBLEU of one recorded run's translations of ``subset``."""
    references = read_references([str(ref_path)])[0]
    return corpus_bleu(read_system(str(translations(record, subset)), "de", str(ref_path), len(references), "text"),
                       references).score


def compare_translations(reference: Tuple[str, Path], systems: Sequence[Tuple[str, Path]], subset: str,
                         ref_path: Path, n_samples: int) -> BleuComparison:
    """sacreBLEU of ``reference`` and ``systems`` (``(system, record)`` of one seed) and each system's paired
    bootstrap p-value against ``reference``."""
    references = read_references([str(ref_path)])
    n_lines = len(references[0])
    named = [(system, read_system(str(translations(record, subset)), "de", str(ref_path), n_lines, "text"))
             for system, record in [reference, *systems]]
    result: MetricComparison = paired_bootstrap(named, references, "sacreBLEU", n_samples=n_samples)
    return BleuComparison(reference[0], {r.name: r.score for r in result.results},
                          {r.name: r.p_value for r in result.results}, result.signature)


# --------------------------------------------------------------------------------- tagging significance
def sentence_counts(gold_path: str, predicted_path: str, column: str) -> Tuple[np.ndarray, np.ndarray]:
    """Per dev sentence: words tagged right, and words. ``predicted_path``: a record's predicted tags, one
    sentence per line (:class:`evidence_plan.Kept`)."""
    gold = [s.tags for s in read_tagged_conllu(gold_path, column)]
    with open(predicted_path, encoding="utf-8") as f:
        predicted = [line.split() for line in f.read().splitlines()]
    if [len(tags) for tags in gold] != [len(tags) for tags in predicted]:
        raise ValueError(f"{predicted_path} does not hold one tag per word of {gold_path}, sentence by sentence")
    right = np.array([sum(g == p for g, p in zip(tags, guess)) for tags, guess in zip(gold, predicted)])
    return right, np.array([len(tags) for tags in gold])


def paired_accuracy_bootstrap(system: np.ndarray, baseline: np.ndarray, words: np.ndarray,
                              n_samples: int = 1000) -> float:
    """p-value of the accuracy difference of two taggers on the same sentences, by paired bootstrap
    resampling of sentences, computed as sacrebleu's paired bootstrap computes it for BLEU (Koehn 2004):
    resampled absolute differences, centred, counted where they exceed the observed one; ``(c + 1) /
    (n + 1)``. Identical predictions have no difference to test: p = 1."""
    if np.array_equal(system, baseline):
        return 1.0
    observed = abs(system.sum() - baseline.sum()) / words.sum()
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    idx = rng.choice(len(words), size=(n_samples, len(words)), replace=True)
    diffs = np.abs(system[idx].sum(1) - baseline[idx].sum(1)) / words[idx].sum(1)
    centred = diffs - diffs.mean()
    return float((np.sum(centred > observed) + 1) / (n_samples + 1))
