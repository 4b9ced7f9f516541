"""The comparison suite (posattn_tasks, `posattn-tasks`): every generator against its reference solver, an
untrained model at chance and a model given the answers at 100%, the loop learning a task on the real model,
the records' resume and refusals, and `posattn-tasks run --quick` + `report` through the console script."""

import json
import os
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from torch import Tensor, nn

from cli_helpers import BIN
from model_helpers import REPO
from posattn_tasks import methods as suite_methods
from posattn_tasks.evaluation import score, split_examples
from posattn_tasks.model import ModelSize, TaskDecoder
from posattn_tasks.records import RecordError, RunKey, finished, read_record, write_record
from posattn_tasks.statistics import paired_t_test, t_two_sided_p
from posattn_tasks.tasks import GENERATED, TASKS, build_task
from posattn_tasks.tasks.base import Example, Sizes, examples
from posattn_tasks.training import train

SAMPLE_SIZE = 400


def all_splits_sample(name: str) -> List[Example]:
    task = GENERATED[name]()
    size = task.tiers["cpu"].size
    return [e for split in task.splits() for e in split_examples(task, split, size, seed=7, count=SAMPLE_SIZE //
                                                                     len(task.splits()) + 5)]


@pytest.mark.parametrize("name", list(GENERATED))
def test_the_reference_solver_agrees_with_the_generator_on_every_example(name: str) -> None:
    task = GENERATED[name]()
    sample = all_splits_sample(name) + examples(task, "training", SAMPLE_SIZE, task.tiers["cpu"].size)
    for example in sample:
        assert task.solve(example.tokens) == dict(example.answers), example
        assert all(answer in task.answer_tokens() for answer in example.answers.values())
        assert max(example.tokens) < task.vocabulary_size() and example.answers
        assert len(example.tokens) <= task.tokens_at(task.tiers["cpu"].size * 8)


@pytest.mark.parametrize("name", list(GENERATED))
def test_generators_are_deterministic_by_seed(name: str) -> None:
    task = GENERATED[name]()
    size = task.tiers["quick"].size
    assert examples(task, 1, 20, size) == examples(task, 1, 20, size)
    assert examples(task, 1, 20, size) != examples(task, 2, 20, size)


def test_a_solver_catches_a_wrong_label() -> None:
    """Negative control: a label changed in one example is not what the solver computes."""
    task = GENERATED["flip-flop"]()
    example = examples(task, 3, 1, 16)[0]
    position, answer = next(iter(example.answers.items()))
    wrong = {**example.answers, position: 7 - answer}  # the other bit (3 <-> 4)
    assert task.solve(example.tokens) != wrong


class Oracle(nn.Module):
    """Logits that put every answer on the token the task's solver computes, ``shift`` positions late."""

    def __init__(self, task, shift: int = 0):
        super().__init__()
        self.task, self.shift = task, shift

    def forward(self, tokens: Tensor) -> Tensor:
        logits = torch.zeros(*tokens.shape, self.task.vocabulary_size())
        for row, sequence in enumerate(tokens.tolist()):
            for position, answer in self.task.solve(sequence).items():
                if position + self.shift < tokens.shape[1]:
                    logits[row, position + self.shift, answer] = 1.0
        return logits


@pytest.mark.parametrize("name", ["flip-flop", "selective-copy", "counting", "associative-recall", "passkey",
                                  "reverse", "addition", "state-tracking"])
def test_a_model_given_the_answers_scores_every_answer_and_one_a_position_late_does_not(name: str) -> None:
    task = GENERATED[name]()
    test = split_examples(task, task.splits()[0], task.tiers["cpu"].size, 1, 32)
    assert score(Oracle(task), task, test, torch.device("cpu")) == {
        "answer_accuracy": 1.0, "example_accuracy": 1.0, "answers": sum(len(e.answers) for e in test)}
    assert score(Oracle(task, shift=1), task, test, torch.device("cpu"))["answer_accuracy"] < 0.9


@pytest.mark.parametrize("name", list(GENERATED))
def test_an_untrained_model_scores_no_better_than_the_most_frequent_answer(name: str) -> None:
    task = GENERATED[name]()
    test = split_examples(task, task.splits()[0], task.tiers["cpu"].size, 1, 64)
    torch.manual_seed(0)
    options = suite_methods.side_options("rotary", 4096, 4096)
    model = TaskDecoder(task.vocabulary_size(), ModelSize(), options).eval()
    answers = [a for e in test for a in e.answers.values()]
    most_frequent = max(answers.count(a) for a in set(answers)) / len(answers)
    assert score(model, task, test, torch.device("cpu"))["answer_accuracy"] <= most_frequent + 0.05


def test_the_loop_learns_a_task_on_the_real_model() -> None:
    """Flip-flop of 8 pairs: the suite's decoder (width 32) with RoPE learns it in 200 steps, and scores every
    read right in distribution."""
    task = GENERATED["flip-flop"]()
    torch.manual_seed(0)
    model = TaskDecoder(task.vocabulary_size(), ModelSize(32, 2, 2), suite_methods.side_options("rotary", 16, 128))
    log = train(model, task, Sizes(size=8, steps=200, batch_size=32), seed=0, device=torch.device("cpu"))
    assert log.losses[-1] < 0.05 * log.losses[0]
    assert task.evaluate(model, 8, 0, 64, torch.device("cpu"))["1x"]["answer_accuracy"] >= 0.95


def test_every_registered_causal_variant_is_a_method_and_unknown_names_are_one_line() -> None:
    from posattn.position_terms.catalogue import all_variants

    assert set(all_variants("decoder")) <= set(suite_methods.method_names())
    assert {"nope", "absolute"} <= set(suite_methods.method_names())
    with pytest.raises(suite_methods.UnknownMethod, match="unknown method 'flash'; the methods: nope"):
        suite_methods.method_options("flash")


def test_the_t_distribution_and_the_paired_test() -> None:
    assert t_two_sided_p(4.302652729911275, 2) == pytest.approx(0.05, abs=1e-9)  # t(0.975, 2)
    assert t_two_sided_p(2.570581835636314, 5) == pytest.approx(0.05, abs=1e-9)  # t(0.975, 5)
    assert paired_t_test([1.0]) is None and paired_t_test([0.0, 0.0]) is None
    assert paired_t_test([0.1, 0.2, 0.15]) == pytest.approx(0.0351, abs=1e-4)


def test_records_are_resumed_and_refused_with_other_settings_or_damaged(tmp_path: Path) -> None:
    key = RunKey("cpu", "posattn", "flip-flop", "alibi", 1)
    settings = {"sizes": {"steps": 600}}
    assert not finished(key, tmp_path, settings)
    path = write_record(key, tmp_path, {"settings": settings, "scores": {}})
    assert finished(key, tmp_path, settings) and os.listdir(path.parent) == ["seed1.json"]
    with pytest.raises(RecordError, match=r"seed1.json was made with other settings \(sizes differ\)"):
        finished(key, tmp_path, {"sizes": {"steps": 700}})
    path.write_text('{"settings": {', encoding="utf-8")
    with pytest.raises(RecordError, match="is cut short or damaged"):
        read_record(path)


def run_suite(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([os.path.join(BIN, "posattn-tasks"), *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=900)


def test_quick_tier_runs_every_task_resumes_and_reports(tmp_path: Path) -> None:
    """`posattn-tasks run --quick` (as CI runs it): a record per run, a second run does nothing, the report has
    the method x task table, the claims and a plot per task; bad input is one line and writes nothing."""
    records = tmp_path / "records"
    first = run_suite("run", "--quick", "--jobs", "2", "--records", str(records), "--corpus",
                      os.path.join(REPO, "data", "ptb_sample"), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    written = sorted(records.rglob("seed1.json"))
    assert len(written) == len(TASKS) * 3
    assert all(json.loads(p.read_text())["training"]["losses"] for p in written)
    again = run_suite("run", "--quick", "--records", str(records), "--corpus",
                      os.path.join(REPO, "data", "ptb_sample"), cwd=tmp_path)
    assert again.returncode == 0 and "runs," not in again.stderr
    page = tmp_path / "docs" / "comparison.md"
    report = run_suite("report", "--records", str(records), "--out", str(page), cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    text = page.read_text()
    assert "| method | flip-flop 1x / 8x |" in text and "| NoPE |" in text and "Verdict:" in text
    assert (tmp_path / "docs" / "images" / "comparison" / "quick-posattn-passkey.png").is_file()
    for bad, message in ((["run", "--quick", "--tasks", "sorting"], "unknown task 'sorting'"),
                         (["run", "--quick", "--methods", "flash"], "unknown method 'flash'"),
                         (["run", "--quick", "--tasks", "language-model", "--corpus", str(tmp_path)],
                          "no train split in")):
        result = run_suite(*bad, "--records", str(tmp_path / "other"), cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1
        assert not (tmp_path / "other").exists()


def test_the_llama_model_flag_trains_a_switched_llama_and_refuses_the_absolute_baseline(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from posattn_tasks.model_huggingface import LlamaRefusal
    from posattn_tasks.run import build_model, execute

    task = GENERATED["flip-flop"]()
    sizes = task.tiers["quick"]
    tokens = torch.tensor([examples(task, 0, 1, sizes.size)[0].tokens])
    torch.manual_seed(0)
    nope = build_model("llama", task, sizes, "quick", "nope").eval()
    torch.manual_seed(0)
    alibi = build_model("llama", task, sizes, "quick", "alibi").eval()
    assert type(nope.llama).__name__ == "LlamaForCausalLM"
    assert alibi.llama.config._attn_implementation != nope.llama.config._attn_implementation
    assert not torch.allclose(nope(tokens), alibi(tokens))  # the same weights, another method
    with pytest.raises(LlamaRefusal, match="absolute .* is the suite decoder's"):
        build_model("llama", task, sizes, "quick", "absolute")
    record = execute(RunKey("quick", "llama", "flip-flop", "alibi", 1), tmp_path, "cpu", 1, None)
    assert record["model"] == "llama" and record["scores"]["8x"]["answer_accuracy"] is not None
    assert (tmp_path / "quick" / "llama" / "flip-flop" / "alibi" / "seed1.json").is_file()


def test_sigterm_lets_the_running_run_finish_and_says_how_to_resume(tmp_path: Path) -> None:
    import signal
    import time

    records = tmp_path / "records"
    command = [os.path.join(BIN, "posattn-tasks"), "run", "--quick", "--tasks", "flip-flop", "--methods", "nope",
               "--seeds", "1", "2", "3", "4", "5", "6", "--records", str(records)]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 300
    while not list(records.rglob("seed*.json")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    assert "interrupted: the finished runs are recorded; the same command runs the rest" in stderr
    written = list(records.rglob("*"))
    assert 1 <= len([p for p in written if p.name.startswith("seed")]) < 6
    assert not [p for p in written if p.name.endswith(".tmp")]
    assert all(json.loads(p.read_text())["scores"] for p in written if p.suffix == ".json")
