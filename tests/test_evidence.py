"""examples/evidence: the plan of the evidence runs (every system of the five comparisons x seeds, each the
existing recipe with its budget; the PTB LSTMs at the short budget as recorded and at the authors' budget, with
its script and claims), the verdict rule and the tagging bootstrap, the trainings' progress reports, and, on the
shipped PTB sample, a tiny set of runs interrupted by SIGTERM and resumed without redoing its finished runs, their
records (a fresh output folder, as on another machine, redoes nothing), then the results page generated
from the records alone; a raised budget, which trains a recorded run on from its last checkpoint
instead of recording its old evaluations again; and length-extrapolation runs, their records and section."""

import collections
import datetime
import gzip
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

from model_helpers import REPO

import evidence_plan as plan  # examples/evidence/ is on pytest's pythonpath (pyproject.toml)
import paper_claims
from results import (INCONCLUSIVE, MEASURED, NO_EFFECT_REPRODUCED, NOT_REPRODUCED, NOT_RUN,
                     PTB_VALID_UNIGRAM_PERPLEXITY, REPRODUCED, context_free_note, verdict)
from results_readers import paired_accuracy_bootstrap, sentence_counts

EVIDENCE = Path(REPO) / "examples" / "evidence"

PTB_SAMPLE = os.path.join(REPO, "data", "ptb_sample")
EWT_DEV = os.path.join(REPO, "data", "ud_ewt_sample", "en_ewt-ud-dev.sample.conllu")
SHARED_PTB = Path(REPO).parent / "shared" / "data" / "ptb_lm"


# ---------------------------------------------------------------------------------------------- the plan
def test_the_plan_has_every_system_of_the_issue_with_its_seeds_and_budget(tmp_path):
    settings = plan.Settings.from_env({"EVIDENCE_OUT": str(tmp_path)})
    runs = plan.build_plan(settings)
    by_task: Dict[str, set] = {}
    for run in runs:
        if run.seed is not None:
            by_task.setdefault(run.task, set()).add((run.group, run.system, run.seed))
    assert {s for _, s, _ in by_task["translation"]} == {"1", "2", "3", "4", "5", "6", "7", "9",
                                                        "da", "rpr", "pr", "conv2d", "temp"}
    assert {s for _, s, _ in by_task["lm"]} == {"lstm_lm", "attentive_lstm_lm", "positional_attentive_lstm_lm",
                                               "tf_vanilla", "tf_da", "tf_shaw16", "tf_direct_both", "tf_conv2d",
                                               "lstm_lm_authors", "attentive_lstm_lm_authors",
                                               "positional_attentive_lstm_lm_authors"}
    assert {s for _, s, _ in by_task["tagging"]} == {"pe_add", "p_r", "temp", "conv", "conv2d", "pe_con", "san",
                                                    "p_r_zero", "conv_pt", "conv2d_pt"}  # + our earlier inits
    assert {s for _, s, _ in by_task["classification"]} == {"vanilla", "shaw", "da", "nopos"}
    # length extrapolation: every causal variant of the registry (read here from the registry itself), the
    # position-free and classic decoders and the attentive LSTMs
    from posattn.position_terms.catalogue import all_variants

    methods = {s for _, s, _ in by_task["extrapolation"]}
    assert methods == set(all_variants("decoder")) | {"sinusoidal", "none", "learned", "rotary-yarn-zero-shot",
                                                      "rotary-dynamic-zero-shot", "rotary-none-interleaved",
                                                      "attentive_lstm_lm", "positional_attentive_lstm_lm"}
    assert {"alibi", "rotary", "t5-bias", "distance-aware", "direct-absolute", "conv-2d"} <= methods
    seeds = {task: sorted({seed for _, _, seed in runs_}) for task, runs_ in by_task.items()}
    assert seeds == {"translation": [1, 2, 3], "lm": [1, 2], "tagging": [1, 2, 3], "classification": [1, 2, 3, 4, 5],
                     "extrapolation": [1, 2, 3]}
    assert len(by_task["translation"]) == 13 * 3 and len(by_task["lm"]) == 11 * 2
    assert len(by_task["tagging"]) == 10 * 2 * 3 and len(by_task["classification"]) == 4 * 5
    assert len({run.out_dir for run in runs}) == len(runs)  # every run in its own folder
    assert len({run.id for run in runs}) == len(runs) == 1 + 39 + 22 + 60 + 20 + 1 + len(methods) * 3
    # the same budget for all the systems of a task, passed to the recipe
    for run in runs:
        assert run.out_dir.is_relative_to(tmp_path) and f"bash {run.recipe}" in run.shell()
        if run.task == "translation" and run.seed:
            assert run.env["MAX_UPDATE"] == "1500" and run.env["SEED"] == str(run.seed)
            assert run.depends_on == "translation/data" and run.env["GEN_SUBSETS"] == "valid test"
        if run.task == "lm":
            # the transformers: about the short-budget LSTMs' wall time
            lstm = run.system in plan.LSTM_SYSTEMS or run.system in plan.LSTM_AUTHORS_SYSTEMS
            assert run.env["MAX_EPOCH"] == ("6" if run.system in plan.LSTM_SYSTEMS else "40" if lstm else "20")
            assert run.env["VALIDATE"] == "1" and run.env["MAX_UPDATE"] == "0"
            assert run.env["OPTIMIZER"] == ("paper" if lstm else "adam")
        if run.task == "tagging":
            assert run.env["PATIENCE"] == "3" and run.env["VALIDATE_EVERY"] == "0"
            assert run.env["CHECKPOINT"] == "checkpoint_best.pt" and run.env["TAG_COLUMN"] == run.group
        if run.task == "classification":
            assert run.env["MAX_UPDATE"] == "434" and run.env["SEEDS"] == str(run.seed)
        if run.task == "extrapolation" and run.seed:
            # the LSTM LMs train longer (after 500 updates they are still at the unigram level)
            lstm = run.system.endswith("attentive_lstm_lm")
            updates = "2000" if lstm else "500"
            assert run.env["LSTM_MAX_UPDATE" if lstm else "MAX_UPDATE"] == updates
            assert (run.train_log, f"'max_update': {updates},") in run.done_when
            assert run.env["L_TRAIN"] == "64" and run.env["METHODS"] == run.system
            assert run.env["MULTIPLIERS"] == "1 2 4 8 16" and run.depends_on == "extrapolation/data"
            assert run.env["DATA_OUT"] == str(tmp_path / "extrapolation" / "data")
            assert len([path for path, _ in run.done_when if path.name.startswith("eval.")]) == 10
    # every claim names planned systems
    for claim in paper_claims.CLAIMS + paper_claims.claims_for("extrapolation"):
        assert {claim.system, claim.reference} <= set(plan.systems_of(claim.task)), claim


def test_selection_and_cap_from_the_environment(tmp_path):
    settings = plan.Settings.from_env({"EVIDENCE_OUT": str(tmp_path), "TASKS": "tagging lm", "SEEDS": "7",
                                       "TAGGING_SYSTEMS": "pe_add conv", "TAG_SETS": "xpos", "LM_SYSTEMS": "tf_da",
                                       "MAX_UPDATE": "3", "LM_EPOCHS": "4", "LM_TF_EPOCHS": "2"})
    runs = plan.build_plan(settings)
    assert [r.id for r in runs] == ["tagging/xpos/pe_add/seed7", "tagging/xpos/conv/seed7", "lm/tf_da/seed7"]
    assert runs[0].env["MAX_UPDATE"] == "3" and runs[2].env["MAX_EPOCH"] == "2"
    for env, name in (({"TASKS": "translation parsing"}, "TASKS"), ({"LM_SYSTEMS": "gpt"}, "LM_SYSTEMS"),
                      ({"SEEDS": "one"}, "SEEDS"), ({"JOBS": "-1"}, "JOBS"), ({"TAG_SETS": "lemma"}, "TAG_SETS")):
        with pytest.raises(plan.PlanError, match=name):
            plan.Settings.from_env(env)


def test_every_planned_system_has_flags_in_its_recipe(tmp_path):
    """The names the plan passes (VARIANTS, MODELS) are the recipes' own."""
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    translation = " ".join(plan.SYSTEMS["translation"])
    printed = subprocess.run(["bash", os.path.join(REPO, plan.RECIPES["translation"]), "--dry-run"],
                             env={**env, "OUT": str(tmp_path), "VARIANTS": translation, "STEPS": "train"},
                             capture_output=True, text=True, check=True).stdout
    assert printed.count("+ fairseq-train ") == 13
    assert "--encoder-distance-aware --decoder-distance-aware" in printed
    assert "--encoder-no-token-positional-embeddings --encoder-direct-position both" in printed
    variants = os.path.join(REPO, "examples", "pos_tagging", "variants.sh")
    tagging = subprocess.run(["bash", "-c", f"source {shlex.quote(variants)}; echo ${{!VARIANT_FLAGS[@]}}"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert set(plan.SYSTEMS["tagging"]) <= set(tagging)
    refused = subprocess.run(["bash", os.path.join(REPO, plan.RECIPES["classification"]), str(tmp_path / "none")],
                             env={**env, "VARIANTS": " ".join(plan.SYSTEMS["classification"])},
                             capture_output=True, text=True)
    assert "not found" in refused.stderr and "unknown variant" not in refused.stderr  # names checked before data
    with open(os.path.join(REPO, plan.RECIPES["lm"]), encoding="utf-8") as f:
        models = set(re.findall(r"^\s+(\w+)\)\s+echo", f.read(), re.M))
    assert {plan.lm_model(system) for system in plan.SYSTEMS["lm"]} <= models
    assert "lstm_lm_authors" not in models  # a system of the plan, not a model of the recipe
    methods = " ".join(plan.systems_of("extrapolation"))
    printed = subprocess.run(["bash", os.path.join(REPO, plan.RECIPES["extrapolation"]), "--dry-run"],
                             env={**env, "OUT": str(tmp_path), "METHODS": methods, "STEPS": "train",
                                  "MULTIPLIERS": "1"},
                             capture_output=True, text=True, check=True).stdout
    assert printed.count("+ fairseq-train ") == len(methods.split())
    assert "--decoder-alibi --no-token-positional-embeddings" in printed


AUTHORS = {"lstm_lm_authors": "baseline_lstm_lm", "attentive_lstm_lm_authors": "attentive_lstm_lm",
           "positional_attentive_lstm_lm_authors": "positional_attentive_lstm_lm"}


def short_budget_system(system: str) -> str:
    """The short budget's system of the claim that an authors'-budget system makes again."""
    return system.removesuffix(paper_claims.AUTHORS_BUDGET)
SCRIPT = EVIDENCE / "run_lstm_authors_budget.sh"


def test_the_lstms_at_the_authors_budget_run_the_same_models_with_the_authors_settings(tmp_path):
    """The three systems of the authors' budget: the attentive models of the short budget and the authors' LSTM
    baseline (baseline_lstm_lm, 3 layers, batch 20), lr 30, weight decay 1.2e-6, batch 32, 40 epochs, the lr
    halved after 5 epochs without improvement (Salton's model: 6, as the authors' run of it), the architectures'
    own dropout, initialisation and eps and OPTIMIZER=paper's gradient per sentence (nothing passed), 2 seeds,
    their own folders and budget, whatever the short budget's settings; last in the plan."""
    assert plan.LSTM_AUTHORS_SYSTEMS == AUTHORS
    runs = plan.build_plan(plan.Settings.from_env({"EVIDENCE_OUT": str(tmp_path)}))
    authors = [r for r in runs if r.system in AUTHORS]
    assert [r.id for r in authors] == [f"lm/{system}/seed{seed}" for seed in (1, 2) for system in AUTHORS]
    assert runs[-len(authors):] == authors  # the long trainings after every other run
    short = {r.system: r for r in runs if r.system in plan.LSTM_SYSTEMS and r.seed == 1}
    for run in authors:
        model, baseline = AUTHORS[run.system], run.system == "lstm_lm_authors"
        same_claim = short_budget_system(run.system)
        assert run.out_dir == tmp_path / "lm" / run.system / f"seed{run.seed}" != short[same_claim].out_dir
        assert {k: run.env[k] for k in ("MODELS", "LR", "WEIGHT_DECAY", "BATCH_SIZE", "MAX_EPOCH", "OPTIMIZER",
                                        "LSTM_DIM", "LSTM_LAYERS", "VALIDATE", "EVAL_CHECKPOINT", "MAX_UPDATE",
                                        "SEED", "DROPOUT", "PRECISION")} == {
            "MODELS": model, "LR": "30", "WEIGHT_DECAY": "1.2e-6", "BATCH_SIZE": "20" if baseline else "32",
            "MAX_EPOCH": "40", "OPTIMIZER": "paper", "LSTM_DIM": "400", "LSTM_LAYERS": "3" if baseline else "2",
            "VALIDATE": "1", "EVAL_CHECKPOINT": "checkpoint_best.pt", "MAX_UPDATE": "0", "SEED": str(run.seed),
            "DROPOUT": "", "PRECISION": "fp32"}
        assert "ATTENTIVE_LM_INIT" not in run.env and "POSITIONAL_ATTENTION_EPS" not in run.env  # the defaults
        assert "LOSS_AVG" not in run.env  # OPTIMIZER=paper's: the gradient per sentence, the authors' step
        assert run.env.get("LR_PATIENCE") == ("6" if model == "attentive_lstm_lm" else None)  # else run_ptb.sh's 5
        assert run.train_log == run.out_dir / "logs" / f"train.{model}.log"  # run_ptb.sh names its logs by model
        assert (run.train_log, "'max_epoch': 40,") in run.done_when
        assert [k.source.name for k in run.kept] == [f"eval.{model}.valid.log", f"eval.{model}.test.log"]
        assert f"MODELS={model} " in run.shell() and "LR=30 " in run.shell() and "WEIGHT_DECAY=1.2e-6 " in run.shell()
        for text in ("the authors' settings", "SGD, lr 30, no momentum, weight decay 1.2e-6", "batches of 32",
                     "40 epochs of PTB", "--attentive-lm-init authors", "eps 1e-3", "clip-norm 0.25",
                     "lr x 0.5 after 5 epochs without a lower valid loss, Salton's model after 6",
                     "the gradient averaged per sentence (--sentence-avg",
                     "baseline_lstm_lm: their model without attention, 3 LSTM layers of 400", "batches of 20"):
            assert text in run.budget, text
        assert run.budget != short[same_claim].budget
    # the short budget's settings (LM_EPOCHS, LM_LSTM_LR) change the short budget only
    other = plan.build_plan(plan.Settings.from_env({"EVIDENCE_OUT": str(tmp_path), "LM_EPOCHS": "3", "TASKS": "lm",
                                                    "LM_LSTM_LR": "5", "LM_SYSTEMS": " ".join(AUTHORS)}))
    assert [(r.env, r.budget) for r in other] == [(r.env, r.budget) for r in authors]
    capped, = plan.build_plan(plan.Settings.from_env({"EVIDENCE_OUT": str(tmp_path), "MAX_UPDATE": "3", "TASKS": "lm",
                                                      "LM_SYSTEMS": "attentive_lstm_lm_authors", "LM_SEEDS": "1"}))
    assert capped.env["MAX_UPDATE"] == "3" and "at most 3 updates" in capped.budget  # a smoke run: another budget
    labels = plan.system_labels(plan.Settings.from_env({}), "lm")
    assert [labels[s] for s in AUTHORS] == ["LSTM baseline (the authors' code, 3 layers), authors' budget",
                                           "attentive LSTM (Salton et al.), authors' budget",
                                           "positional attentive LSTM (Dagan), authors' budget"]
    assert labels["positional_attentive_lstm_lm"] == "positional attentive LSTM (Dagan), 6 epochs at lr 10"


def test_the_short_budget_lstms_are_planned_as_recorded(monkeypatch):
    """The 6-epoch LSTMs keep their commands and budget: their committed records stay finished."""
    import records

    monkeypatch.delenv("EVIDENCE_RECORDS", raising=False)
    runs = plan.build_plan(plan.Settings.from_env({"TASKS": "lm", "LM_SYSTEMS": " ".join(plan.LSTM_SYSTEMS)}))
    assert [r.id for r in runs] == [f"lm/{s}/seed{seed}" for seed in (1, 2) for s in plan.LSTM_SYSTEMS]
    common = ("THREADS=1 PTB_DIR=../shared/data/ptb_lm MODELS={0} PARALLEL=1 SEED=1 MAX_UPDATE=0 MAX_EPOCH=6 "
              "STOP_TIME_HOURS=0 VALIDATE=1 EVAL_CHECKPOINT=checkpoint_best.pt LSTM_DIM=400 LSTM_LAYERS=2 "
              "BATCH_SIZE=20 OPTIMIZER=paper LR=10 DROPOUT={1} WEIGHT_DECAY=0 LOSS_AVG=token")
    assert [r.shell() for r in runs[:3]] == [
        f"OUT=evidence-output/lm/{system}/seed1 " + common.format(system, dropout) + extra
        + " bash examples/language_model/run_ptb.sh"
        for system, dropout, extra in (
            ("lstm_lm", "0.5", ""), ("attentive_lstm_lm", "''", " ATTENTIVE_LM_INIT=uniform"),
            ("positional_attentive_lstm_lm", "''", " ATTENTIVE_LM_INIT=uniform POSITIONAL_ATTENTION_EPS=1e-6"))]
    for run in runs:
        assert "lr 10 instead of 30" in run.budget and "6 epochs of PTB" in run.budget
        if (records.record_dir(run) / records.RUN_FILE).exists():  # committed with the code
            assert records.is_recorded(run), f"{run.id}: its record's budget is no longer the plan's"


def test_the_claims_on_the_lstms_are_made_at_both_budgets(tmp_path, monkeypatch):
    """Dagan's three claims on the short budget's LSTMs (as before) and, as claims of their own, on the same
    models at the authors' budget; verdicts once their runs have values; the page plans the new systems even
    where the records' settings predate them, and a runner of a part of the plan removes no system from them."""
    import evidence
    import records
    import results

    lm = paper_claims.claims_for("lm")
    dagan = [c for c in lm if c.source == paper_claims.DAGAN]
    assert len(dagan) == 6
    short = [c for c in dagan if c.system in plan.LSTM_SYSTEMS]
    authors = [c for c in dagan if c.system in AUTHORS]
    assert [(c.system, c.reference) for c in short] == [
        ("positional_attentive_lstm_lm", "attentive_lstm_lm"), ("lstm_lm", "attentive_lstm_lm"),
        ("lstm_lm", "positional_attentive_lstm_lm")]
    assert [(short_budget_system(c.system), short_budget_system(c.reference), c.paper_system, c.paper_reference,
             c.reading) for c in authors] \
        == [(c.system, c.reference, c.paper_system, c.paper_reference, c.reading) for c in short]
    assert all(c.metric == "test_ppl" and c.is_paper_claim for c in authors)

    settings = plan.Settings.from_env({"EVIDENCE_OUT": str(tmp_path), "TASKS": "lm"})
    runs = [r for r in plan.build_plan(settings) if r.seed is not None]
    data = results.TaskData("lm", "", runs, {})
    positional_first = next(c for c in authors if c.system == "positional_attentive_lstm_lm_authors")
    assert results.evaluate(positional_first, data).judged()[0] == NOT_RUN
    ppl = {"attentive_lstm_lm_authors": {1: 80.0, 2: 81.0}, "positional_attentive_lstm_lm_authors": {1: 75.0, 2: 77.0},
           "lstm_lm_authors": {1: 85.0}}
    for run in runs:
        if run.seed in ppl.get(run.system, {}):
            data.metrics[run.id] = {"test_ppl": ppl[run.system][run.seed]}
    result = results.evaluate(positional_first, data)
    assert result.deltas == {1: -5.0, 2: -4.0} and result.judged()[0] == REPRODUCED
    lstm_first = next(c for c in authors
                      if c.reference == "attentive_lstm_lm_authors" and c.system == "lstm_lm_authors")
    assert results.evaluate(lstm_first, data).judged()[0].startswith("incomplete")  # seed 2 of lstm_lm missing
    labels = plan.system_labels(settings, "lm")
    assert "| positional attentive LSTM (Dagan), authors' budget vs attentive LSTM (Salton et al.), authors' budget |" \
        in results.claim_row(result, labels)

    # records' settings from before the new systems: the page plans them too ("not run yet")
    root = tmp_path / "records"
    monkeypatch.setenv("EVIDENCE_RECORDS", str(root))
    old = [s for s in plan.SYSTEMS["lm"] if s not in AUTHORS]
    records.save_settings(plan.Settings.from_env({"EVIDENCE_OUT": str(tmp_path), "LM_SYSTEMS": " ".join(old)}))
    monkeypatch.delenv("LM_SYSTEMS", raising=False)
    assert results.load_settings(str(tmp_path)).systems["lm"] == list(plan.SYSTEMS["lm"])
    # the script's runner (TASKS=lm LM_SYSTEMS=the authors') adds its systems to the recorded ones
    partial = plan.Settings.from_env({"EVIDENCE_OUT": str(tmp_path), "TASKS": "lm", "LM_SYSTEMS": " ".join(AUTHORS)})
    records.save_settings(evidence.with_recorded_systems(partial))
    saved = json.loads((root / "settings.json").read_text(encoding="utf-8"))
    assert saved["systems"]["lm"] == list(plan.SYSTEMS["lm"])
    assert saved["systems"]["tagging"] == list(plan.SYSTEMS["tagging"])


def test_the_script_dry_run_lists_the_six_runs(tmp_path):
    """``run_lstm_authors_budget.sh --dry-run``: the runner's plan of exactly the six trainings."""
    env = {**os.environ, "EVIDENCE_OUT": str(tmp_path), "EVIDENCE_RECORDS": str(tmp_path / "records"),
           "TASKS": "translation tagging", "LM_SYSTEMS": "tf_da"}  # the script's own selection wins
    printed = subprocess.run(["bash", str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=120,
                             check=True).stdout.splitlines()
    assert [line.split("\t")[:2] for line in printed] == [[f"lm/{system}/seed{seed}", "pending"]
                                                          for seed in (1, 2) for system in AUTHORS]
    for line in printed:
        run_id, _, command = line.split("\t")
        system = run_id.split("/")[1]
        assert f"MODELS={AUTHORS[system]} " in command and f"SEED={run_id[-1]} " in command
        batch = "BATCH_SIZE=20" if system == "lstm_lm_authors" else "BATCH_SIZE=32"
        for setting in ("LR=30", "WEIGHT_DECAY=1.2e-6", batch, "MAX_EPOCH=40", "OPTIMIZER=paper"):
            assert f" {setting} " in command, setting
        assert command.endswith("bash examples/language_model/run_ptb.sh")
    assert not (tmp_path / "manifest.json").exists()  # nothing run, nothing written


# ---------------------------------------------------------------------------------------------- progress
def fairseq_log(epochs: int, done: bool = False) -> str:
    """A fairseq-train log of ``epochs`` epochs of 1315 updates, each 2 minutes, valid every epoch."""
    lines = []
    for epoch in range(1, epochs + 1):
        start = datetime.datetime(2026, 11, 27, 10, 0) + datetime.timedelta(minutes=2 * (epoch - 1))
        stamp = lambda seconds: (start + datetime.timedelta(seconds=seconds)).isoformat(sep=" ")  # noqa: E731
        lines += [f"{stamp(0)} | INFO | fairseq.trainer | begin training epoch {epoch}",
                  f"{stamp(10)} | INFO | train_inner | epoch {epoch:03d}:    100 / 1315 loss=9.1, ppl=549.2, "
                  "wps=5000, ups=12.5, wpb=700, bsz=32, num_updates=100, lr=30, gnorm=1.2, clip=100, train_wall=8, "
                  "wall=10",
                  f"{stamp(118)} | INFO | valid | epoch {epoch:03d} | valid on 'valid' subset | loss 8.1 | "
                  f"ppl {300 - epoch:.2f} | wps 9000 | wpb 436.4 | bsz 31.9 | num_updates {1315 * epoch}",
                  f"{stamp(120)} | INFO | train | epoch {epoch:03d} | loss 9 | ppl 512 | wps 5000 | ups 11 | "
                  f"wpb 700 | bsz 32 | num_updates {1315 * epoch} | lr 30 | gnorm 1 | clip 100 | train_wall 110 | "
                  f"wall {120 * epoch}"]
    if done:
        lines.append("2026-11-27 12:00:00 | INFO | fairseq_cli.train | done training in 4800.0 seconds")
    return "\n".join(lines) + "\n"


def test_progress_reports_the_time_per_epoch_as_soon_as_it_is_known(tmp_path):
    """``evidence.py progress``: from the first logged updates an estimate, then the measured epochs (each
    reported at epochs 1-3, every fifth and the last), the whole set's time; ``--changed`` prints only what
    changed, ``--collect`` writes the records and logs so far into two archives."""
    import tarfile

    import evidence

    env = {"EVIDENCE_OUT": str(tmp_path / "out"), "EVIDENCE_RECORDS": str(tmp_path / "records"), "TASKS": "lm",
           "LM_SYSTEMS": "attentive_lstm_lm_authors positional_attentive_lstm_lm_authors", "LM_SEEDS": "1"}
    attentive, positional = plan.build_plan(plan.Settings.from_env(env))
    assert evidence.training_progress(attentive) is None and evidence.progress_stage(attentive, None) == ("", "")
    positional.train_log.parent.mkdir(parents=True)
    positional.train_log.write_text(fairseq_log(1).splitlines()[0] + "\n" + fairseq_log(1).splitlines()[1] + "\n",
                                    encoding="utf-8")
    progress = evidence.training_progress(positional)
    assert (progress.epochs_done, progress.updates_per_epoch, progress.first_ups) == (0, 1315, 12.5)
    assert progress.seconds_per_epoch == pytest.approx(1315 / 12.5)
    stage, line = evidence.progress_stage(positional, progress)
    assert stage == "estimate" and line == (
        "lm/positional_attentive_lstm_lm_authors/seed1: epoch 1, 12.5 updates/s over its first 100 of 1315 updates: "
        "about 1.8 min per epoch (training only, validation not counted), about 70.1 min for 40 epochs")
    stages = {}
    for epochs in (1, 3, 4, 7, 40):
        positional.train_log.write_text(fairseq_log(epochs), encoding="utf-8")
        stages[epochs] = evidence.progress_stage(positional, evidence.training_progress(positional))
    assert [stage for stage, _ in stages.values()] == ["epoch 1", "epoch 3", "epoch 3", "epoch 5", "epoch 40"]
    assert stages[4][1] == ("lm/positional_attentive_lstm_lm_authors/seed1: 4 of 40 epochs in 8.0 min, 2.0 min "
                            "per epoch (validation included): about 80.0 min for 40 epochs, 72.0 min left, "
                            "valid ppl 296")
    # the command: every line once, then only what changed
    (attentive.train_log.parent).mkdir(parents=True)
    attentive.train_log.write_text(fairseq_log(2), encoding="utf-8")
    positional.train_log.write_text(fairseq_log(40, done=True), encoding="utf-8")
    record = tmp_path / "records" / positional.id
    record.mkdir(parents=True)
    (record / "run.json").write_text(json.dumps({"budget": positional.budget}), encoding="utf-8")
    state = tmp_path / "state.json"
    state.write_text("", encoding="utf-8")  # as mktemp leaves it
    command = [sys.executable, str(EVIDENCE / "evidence.py"), "progress", "--changed", str(state),
               "--collect", str(tmp_path / "dest")]
    first = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
    assert [line.split("] ", 1)[1] for line in first.splitlines()] == [
        "lm/attentive_lstm_lm_authors/seed1: 2 of 40 epochs in 4.0 min, 2.0 min per epoch (validation included): "
        "about 80.0 min for 40 epochs, 76.0 min left, valid ppl 298",
        "lm/positional_attentive_lstm_lm_authors/seed1: training done, 40 epochs in 80.0 min (2.0 min per epoch), "
        "valid ppl 260",
        "all 2 trainings side by side: about 80.0 min in all (the slowest, lm/attentive_lstm_lm_authors/seed1); "
        "1 of 2 done"]
    again = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
    assert again == ""
    attentive.train_log.write_text(fairseq_log(3), encoding="utf-8")
    third = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
    assert len(third.splitlines()) == 1 and "attentive_lstm_lm_authors/seed1: 3 of 40 epochs" in third
    with tarfile.open(tmp_path / "dest" / "records.tar.gz") as archive:
        assert archive.getnames() == [f"{positional.id}/run.json"]
    with tarfile.open(tmp_path / "dest" / "logs.tar.gz") as archive:
        assert archive.getnames() == [f"{attentive.id}/train.attentive_lstm_lm.log",
                                      f"{positional.id}/train.positional_attentive_lstm_lm.log"]
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["logs.tar.gz", "records.tar.gz"]


def test_a_record_is_complete_or_absent(tmp_path):
    """A translation run whose output does not cover its references: no record, no temporary left, and the
    error names both files; with the missing hypothesis added, a record of detokenized text."""
    import records

    reference = tmp_path / "test.de"
    reference.write_text("Ein Hund läuft.\nZwei Männer, die reden.\nEine Frau.\n", encoding="utf-8")
    generated = tmp_path / "generate-test.txt"
    lines = ["H-1\t-0.2\tZwei Männer , die reden .", "H-0\t-0.1\tEin Hund läuft ."]
    generated.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = plan.Run(id="translation/4/seed9", task="translation", system="4", seed=9, group="", out_dir=tmp_path,
                   recipe=plan.RECIPES["translation"], args=(), env={}, budget="b",
                   kept=(plan.Kept("hypotheses.test.de", generated, translations_of=reference),))
    root = tmp_path / "records"
    with pytest.raises(ValueError, match=f"{generated}.*{reference}|{reference}.*{generated}"):
        records.write_record(run, [{"seconds": 1.0}], root)
    assert not records.is_recorded(run, root) and [p.name for p in (root / "translation" / "4").iterdir()] == []
    generated.write_text("\n".join(lines + ["H-2\t-0.3\tEine Frau ."]) + "\n", encoding="utf-8")
    folder = records.write_record(run, [{"seconds": 1.5}, {"seconds": 2.0}], root)
    assert (folder / "hypotheses.test.de").read_text(encoding="utf-8").splitlines() == [
        "Ein Hund läuft.", "Zwei Männer, die reden.", "Eine Frau."]
    assert records.read_record(run, root)["seconds"] == 3.5
    run.budget = "another budget"
    assert not records.is_recorded(run, root)  # made under another budget: not finished


def test_a_second_runner_on_the_same_folder_is_refused(tmp_path):
    import evidence

    with evidence.exclusive(tmp_path):
        second = subprocess.run([sys.executable, str(EVIDENCE / "evidence.py"), "run", "--no-results"],
                                env={**os.environ, "EVIDENCE_OUT": str(tmp_path), "TASKS": "classification"},
                                capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert f"another runner is working in {tmp_path} (process {os.getpid()})" in second.stderr
    assert not (tmp_path / "manifest.json").exists()


def test_an_attempt_cut_by_a_killed_runner_ends_at_the_last_write_of_its_run(tmp_path, monkeypatch):
    """SIGKILL (the end of a machine's session) leaves the manifest saying "running", with an attempt that has
    a start and no end: the next runner marks the run interrupted and ends that attempt at the last write into
    the run's folder, so that the run's wall time counts it."""
    import evidence

    monkeypatch.setenv("EVIDENCE_RECORDS", str(tmp_path / "records"))
    settings = plan.Settings.from_env({**os.environ, "EVIDENCE_OUT": str(tmp_path), "TASKS": "lm",
                                       "LM_SYSTEMS": "tf_vanilla", "LM_SEEDS": "1", "PTB_DIR": PTB_SAMPLE})
    run, = plan.build_plan(settings)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a process that is gone: the killed runner's recipe, once stopped
    killed = evidence.Manifest(settings.out / evidence.MANIFEST)
    killed.entry(run).update(status=evidence.RUNNING, pgid=dead.pid, pgid_start="0",
                             attempts=[{"start": "2026-11-25T22:47:21"}])
    killed.save(settings)
    last_write = run.out_dir / "logs" / "train.tf_vanilla.log"
    last_write.parent.mkdir(parents=True)
    last_write.write_text("epoch 001\n", encoding="utf-8")
    ended = datetime.datetime(2026, 11, 25, 23, 11, 5).timestamp()
    os.utime(last_write, (ended, ended))
    runner = evidence.Runner(settings, [run])
    runner.sync_with_disk()
    attempt, = evidence.Manifest(settings.out / evidence.MANIFEST).runs[run.id]["attempts"]
    assert runner.status(run) == evidence.INTERRUPTED
    assert attempt == {"start": "2026-11-25T22:47:21", "end": "2026-11-25T23:11:05", "seconds": 1424.0,
                       "outcome": evidence.INTERRUPTED, "end_from": "the last write in its folder"}


def test_a_run_trained_under_another_budget_is_not_finished(tmp_path):
    """Raising a budget (LM_TF_EPOCHS 6 -> 8) leaves the old training's evaluations on disk: the run is not
    finished under the new plan. At its start the runner keeps the old log as an attempt, so that the recipe
    trains on from checkpoint_last.pt, and removes the old evaluations, so that a cut attempt cannot look
    finished; under the old plan the same finished log is kept."""
    import evidence

    env = {"EVIDENCE_OUT": str(tmp_path), "TASKS": "lm", "LM_SYSTEMS": "tf_vanilla", "LM_SEEDS": "1",
           "PTB_DIR": PTB_SAMPLE}
    old, = plan.build_plan(plan.Settings.from_env({**env, "LM_TF_EPOCHS": "6"}))
    new, = plan.build_plan(plan.Settings.from_env({**env, "LM_TF_EPOCHS": "8"}))
    logs = old.out_dir / "logs"
    logs.mkdir(parents=True)
    trained = ("2026-11-25 18:39:10 | INFO | fairseq_cli.train | {'_name': None, 'optimization': {'_name': None, "
               "'max_epoch': 6, 'max_update': 0, 'stop_time_hours': 0.0, 'clip_norm': 1.0}}\n"
               "2026-11-25 19:00:59 | INFO | fairseq_cli.train | done training in 1303.0 seconds\n")
    old.train_log.write_text(trained, encoding="utf-8")
    evaluations = [logs / f"eval.tf_vanilla.{subset}.log" for subset in ("valid", "test")]
    for path in evaluations:
        path.write_text("| Loss (base 2): 7.5, Perplexity: 182.88\n", encoding="utf-8")
    assert old.finished() and not new.finished()
    evidence.rotate_train_log(old)
    assert old.train_log.read_text(encoding="utf-8") == trained  # finished under its plan: the recipe skips it
    evidence.rotate_train_log(new)
    evidence.remove_final_artifacts(new)
    assert not new.train_log.exists() and not any(path.exists() for path in evaluations)
    assert (logs / "train.tf_vanilla.log.attempt1").read_text(encoding="utf-8") == trained


def evidence(action: str, env: Dict[str, str]) -> subprocess.CompletedProcess:
    """``bash examples/evidence/run.sh ACTION`` (the runner's entry point; ``evidence.py record`` for ``record``,
    which the runner does at its start) with ``env`` over this environment."""
    command = ([sys.executable, str(EVIDENCE / "evidence.py")] if action == "record" else
               ["bash", str(EVIDENCE / "run.sh")])
    return subprocess.run([*command, action], env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_a_training_killed_after_its_start_is_not_finished_whatever_its_recipe_left(tmp_path):
    """Two length-extrapolation runs whose folders hold every evaluation and results.json, and a training log that
    shows the plan's budget (printed at the training's start): the one whose training was killed at update 66 of
    300 (no "done training") is not finished, and ``record`` (what the runner does at its start) records only
    the other one."""
    env = {"EVIDENCE_OUT": str(tmp_path / "out"), "EVIDENCE_RECORDS": str(tmp_path / "records"),
           "TASKS": "extrapolation", "EXTRAPOLATION_SYSTEMS": "alibi", "EXTRAPOLATION_SEEDS": "1 2",
           "EXTRAPOLATION_MULTIPLIERS": "1", "EXTRAPOLATION_MAX_UPDATE": "300", "PTB_DIR": PTB_SAMPLE}
    killed, done = [r for r in plan.build_plan(plan.Settings.from_env(env)) if r.seed]
    started = ("2026-11-28 09:00:00 | INFO | fairseq_cli.train | {'optimization': {'_name': None, 'max_epoch': 0, "
               "'max_update': 300, 'stop_time_hours': 0.0}}\n2026-11-28 09:00:09 | INFO | train_inner | epoch 001:"
               "     66 / 2071 loss=9.5, ppl=724.1, num_updates=66, lr=0.00066, train_wall=8, wall=9\n")
    for run, log in ((killed, started), (done, started + "2026-11-28 09:01:00 | INFO | fairseq_cli.train | "
                                                    "done training in 52.0 seconds\n")):
        run.train_log.parent.mkdir(parents=True)
        run.train_log.write_text(log + "wall_seconds 60.5\n", encoding="utf-8")
        for path, _ in run.done_when[:2]:
            path.write_text("| Evaluated 4,722 tokens in 1.0s\n| Loss (base 2): 9.0, Perplexity: 512.0\n"
                            "wall_seconds 5.2\nexit_status 0\n", encoding="utf-8")
        (run.out_dir / "results.json").write_text("[]\n", encoding="utf-8")
    assert not killed.finished() and done.finished()
    recorded = evidence("record", env)
    assert recorded.returncode == 0, recorded.stdout[-2000:] + recorded.stderr[-2000:]
    assert f"recorded {done.id} " in recorded.stdout and killed.id not in recorded.stdout
    assert sorted(p.name for p in (tmp_path / "records" / "extrapolation" / "alibi").iterdir()) == ["seed2"]


def test_a_damaged_manifest_or_record_is_one_line_naming_it_and_what_to_do(tmp_path):
    """A manifest, a record's run.json and its results.json cut short (a full disk, a machine gone while they were
    written, a bad merge): ``run.sh status``, ``run.sh plan`` and results.py each stop in one line naming the file
    and what to do, with status 1; the manifest deleted as it says, status works again."""
    records, out = tmp_path / "records", tmp_path / "out"
    env = {"EVIDENCE_OUT": str(out), "EVIDENCE_RECORDS": str(records), "TASKS": "classification",
           "CLASSIFICATION_SYSTEMS": "vanilla", "CLASSIFICATION_SEEDS": "1"}
    out.mkdir()
    (out / "manifest.json").write_text('{"runs": {"classification/vanilla/seed1": {"status": "fin', encoding="utf-8")
    status = evidence("status", env)
    assert status.returncode == 1 and len(status.stderr.splitlines()) == 1, status.stderr
    assert status.stderr.startswith(f"evidence.py: error: {out / 'manifest.json'} is cut short or damaged (not valid "
                                    "JSON: Unterminated string starting at: line 1 column 54")
    assert status.stderr.rstrip().endswith("delete it: the next command rebuilds it from the records and the runs' "
                                           "folders (only the attempts of runs not yet recorded are forgotten)")
    (out / "manifest.json").unlink()
    assert evidence("status", env).returncode == 0

    run_json = records / "classification" / "vanilla" / "seed1" / "run.json"
    run_json.parent.mkdir(parents=True)
    run_json.write_text('{"budget": "434 upd', encoding="utf-8")
    planned = evidence("plan", env)
    assert planned.returncode == 1 and len(planned.stderr.splitlines()) == 1, planned.stderr
    assert f"error: {run_json} is cut short or damaged (not valid JSON: " in planned.stderr
    assert planned.stderr.rstrip().endswith(f"restore it from git (git checkout -- {run_json.parent}), or delete the "
                                            f"record {run_json.parent} to run it again")

    env.update(TASKS="extrapolation", EXTRAPOLATION_SYSTEMS="alibi", EXTRAPOLATION_SEEDS="1")
    run, = [r for r in plan.build_plan(plan.Settings.from_env(env)) if r.seed]
    folder = records / run.id
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"id": run.id, "budget": run.budget, "seconds": 1.0}), encoding="utf-8")
    (folder / "results.json").write_text('[{"method": "alibi", "seed": "1", "mode": "nonoverl', encoding="utf-8")
    shutil.rmtree(records / "classification")
    page = subprocess.run([sys.executable, str(EVIDENCE / "results.py"), "--output", str(tmp_path / "page.md")],
                          env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert page.returncode == 1 and "Traceback" not in page.stderr, page.stderr
    assert page.stderr.splitlines()[-1].startswith(f"results.py: error: {folder / 'results.json'} is cut short or "
                                                   "damaged (not valid JSON: ")
    assert not (tmp_path / "page.md").exists()


@pytest.mark.slow
def test_a_raised_budget_trains_on_from_the_last_checkpoint(tmp_path):
    """The same command with MAX_UPDATE 2, then 4: the second runner resumes the recorded run's training at
    update 2 (fairseq's checkpoint_last.pt), evaluates again and replaces the record, whose training log
    holds both attempts and whose wall time counts both."""
    env = {**os.environ, "EVIDENCE_OUT": str(tmp_path), "EVIDENCE_RECORDS": str(tmp_path / "records"),
           "TASKS": "lm", "LM_SYSTEMS": "tf_vanilla", "LM_SEEDS": "1", "PTB_DIR": PTB_SAMPLE, "THREADS": "1"}
    command = [sys.executable, str(EVIDENCE / "evidence.py"), "run", "--no-results"]
    runs = []
    for updates in ("2", "4"):
        runs.append(subprocess.run(command, env={**env, "MAX_UPDATE": updates}, cwd=REPO, capture_output=True,
                                   text=True, timeout=300))
        assert runs[-1].returncode == 0, runs[-1].stdout[-3000:] + runs[-1].stderr[-3000:]
    assert "start lm/tf_vanilla/seed1 (attempt 2;" in runs[1].stdout
    record_dir = tmp_path / "records" / "lm" / "tf_vanilla" / "seed1"
    record = json.loads((record_dir / "run.json").read_text(encoding="utf-8"))
    assert "at most 4 updates" in record["budget"]
    assert [a["outcome"] for a in record["attempts"]] == ["finished", "finished"]
    assert record["seconds"] == round(sum(a["seconds"] for a in record["attempts"]), 1)
    train = (record_dir / "train.log").read_text(encoding="utf-8")
    assert re.search(r"loaded checkpoint \S*checkpoint_last\.pt \(epoch 1 @ 2 updates\)", train, re.I), train[-3000:]
    assert [int(n) for n in re.findall(r"valid on 'valid' subset .*num_updates (\d+)", train)] == [2, 4]
    evaluated = tmp_path / "lm" / "tf_vanilla" / "seed1" / "logs" / "eval.tf_vanilla.test.log"
    assert (record_dir / "eval.test.log").read_text(encoding="utf-8") == \
        evaluated.read_text(encoding="utf-8").replace(f"{REPO}/", "")
    assert evaluated.stat().st_mtime > (tmp_path / "lm" / "tf_vanilla" / "seed1" / "checkpoints" / "tf_vanilla"
                                        / "checkpoint_last.pt").stat().st_mtime


# ---------------------------------------------------------------------------------------------- statistics
def test_verdicts_follow_the_stated_rule():
    better = paper_claims.Claim("translation", "6", "4", "bleu_test", 45.10, 44.31)
    assert verdict(better, {}, {}, 3)[0] == NOT_RUN
    assert verdict(better, {1: 0.4, 2: 0.1, 3: 0.3}, {1: 0.01, 2: 0.3, 3: 0.04}, 3) == (
        REPRODUCED, "Δ > 0 in all 3 seeds (significant in 2 of 3), as in the paper.")
    assert verdict(better, {1: -0.4, 2: -0.1, 3: -0.3}, {}, 3)[0] == NOT_REPRODUCED
    assert verdict(better, {1: 0.9, 2: -0.1, 3: 0.3}, {}, 3)[0] == INCONCLUSIVE  # mean > 0, one seed against
    assert verdict(better, {1: 0.4}, {}, 3)[0].startswith("incomplete")
    lower_ppl = paper_claims.Claim("lm", "positional_attentive_lstm_lm", "attentive_lstm_lm", "test_ppl", 70.92, 76.56)
    assert verdict(lower_ppl, {1: -2.0, 2: -0.5}, {}, 2)[0] == REPRODUCED
    unclaimed = paper_claims.Claim("lm", "tf_da", "tf_vanilla", "test_ppl")
    assert verdict(unclaimed, {1: -5.5, 2: 0.3}, {}, 2) == (
        MEASURED, "the system is better in 1 of 2 seeds; the paper has no number for this.")
    alike = paper_claims.Claim("tagging", "temp", "pe_add", "accuracy", 92.49, 92.40, kind=paper_claims.NO_EFFECT)
    assert verdict(alike, {1: 0.1, 2: 0.2, 3: -0.1}, {1: 0.4, 2: 0.2, 3: 0.7}, 3)[0] == NO_EFFECT_REPRODUCED
    assert verdict(alike, {1: 0.5, 2: 0.6, 3: 0.4}, {1: 0.01, 2: 0.001, 3: 0.02}, 3)[0] == NOT_REPRODUCED
    assert verdict(alike, {1: 0.5, 2: 0.6, 3: 0.4}, {1: 0.01, 2: 0.3, 3: 0.02}, 3)[0] == INCONCLUSIVE
    # a difference that prints as 0.00 is a tie: never significant, whatever the bootstrap's p
    assert verdict(alike, {1: 0.004, 2: 0.0, 3: -0.003}, {1: 0.001, 2: 0.001, 3: 0.001}, 3) == (
        NO_EFFECT_REPRODUCED, "no seed differs significantly (largest |Δ| 0.00).")


def test_models_no_better_than_word_frequencies_are_named_as_such():
    """The extrapolation section names the methods whose perplexity at the training length (mean over seeds)
    is not below the unigram level, with the recurrent models' note; none when every method is below it."""
    def entry(method: str, ppl: float, length: int = plan.EXTRAPOLATION_TRAIN_LENGTH) -> Dict:
        return {"method": method, "mode": "nonoverlapping", "length": length, "status": "ok", "ppl": ppl}

    learnt = [entry("alibi", 277.9), entry("attentive_lstm_lm", 650.0), entry("attentive_lstm_lm", 700.0)]
    assert context_free_note(learnt, ["alibi", "attentive_lstm_lm"]) == []  # mean 675: below
    flat = [entry("alibi", 277.9), entry("attentive_lstm_lm", 711.0), entry("attentive_lstm_lm", 709.0),
            entry("attentive_lstm_lm", 300.0, length=1024)]  # only the training length counts
    note, blank = context_free_note(flat, ["alibi", "attentive_lstm_lm"])
    assert note.startswith("**Not yet using their context**: attentive_lstm_lm (710.0): ") and blank == ""
    assert "alibi" not in note and f"({PTB_VALID_UNIGRAM_PERPLEXITY:.1f}, a unigram model" in note
    assert "recurrent LM" in note
    assert "recurrent LM" not in context_free_note([entry("alibi", 900.0)], ["alibi"])[0]


@pytest.mark.skipif(not SHARED_PTB.is_dir(), reason=f"no PTB text at {SHARED_PTB} (the shared data folder)")
def test_the_unigram_level_is_that_of_ptb():
    """PTB_VALID_UNIGRAM_PERPLEXITY recomputed from the shared PTB: the valid split's perplexity under the
    train split's word frequencies, one </s> per line as fairseq's one-stream binarization adds."""
    def words(split: str) -> List[str]:
        with gzip.open(SHARED_PTB / f"ptb.{split}.txt.gz", "rt", encoding="utf-8") as f:
            return [word for line in f for word in line.split() + ["</s>"]]

    counts = collections.Counter(words("train"))
    total = sum(counts.values())
    valid = words("valid")
    assert all(counts[word] for word in valid)  # PTB's closed vocabulary: no unseen word to smooth
    bits = -sum(math.log2(counts[word] / total) for word in valid) / len(valid)
    assert round(2 ** bits, 1) == PTB_VALID_UNIGRAM_PERPLEXITY


def test_tagging_bootstrap_on_real_sentences(tmp_path):
    """Gold EWT dev tags against predictions with every n-th word's tag wrong (counted from ``offset``)."""
    gold = open(EWT_DEV, encoding="utf-8").read().splitlines()

    def corrupt(every: int, offset: int = 0) -> str:
        """The predicted tags as a run's record keeps them: one sentence per line."""
        lines, word = [], 0
        for line in gold:
            cols = line.split("\t")
            if len(cols) == 10 and cols[0].isdigit():
                word += 1
                if (word + offset) % every == 0:
                    cols[3] = "X" if cols[3] != "X" else "NOUN"
            lines.append("\t".join(cols))
        conllu = tmp_path / f"every{every}-{offset}.conllu"
        conllu.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return kept_tags(conllu)

    def kept_tags(conllu) -> str:
        path = tmp_path / f"{Path(conllu).name}.upos"
        path.write_text("".join(line + "\n" for line in plan.Kept("dev.pred.upos", Path(conllu), tags="upos").lines()),
                        encoding="utf-8")
        return str(path)

    right, words = sentence_counts(EWT_DEV, kept_tags(EWT_DEV), "upos")
    assert (right == words).all() and words.sum() > 800
    worse, _ = sentence_counts(EWT_DEV, corrupt(5), "upos")
    assert words.sum() - worse.sum() == sum(1 for line in gold if re.match(r"^\d+\t", line)) // 5
    assert paired_accuracy_bootstrap(right, right, words) == 1.0
    assert paired_accuracy_bootstrap(worse, right, words) < 0.01
    # as many errors, on other words: the same accuracy, no significant difference
    one, other = sentence_counts(EWT_DEV, corrupt(20), "upos")[0], sentence_counts(EWT_DEV, corrupt(20, 10), "upos")[0]
    assert abs(int(one.sum()) - int(other.sum())) <= 1 and not np.array_equal(one, other)
    assert paired_accuracy_bootstrap(one, other, words) > 0.3
    train_sample = os.path.join(REPO, "data", "ud_ewt_sample", "en_ewt-ud-train.sample.conllu")
    with pytest.raises(ValueError, match="sentence by sentence"):
        sentence_counts(EWT_DEV, kept_tags(train_sample), "upos")


# ---------------------------------------------------------------------------------------------- end to end
def manifest(out: Path) -> dict:
    with open(out / "manifest.json", encoding="utf-8") as f:
        return json.load(f)["runs"]


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """2 transformer LMs x 2 seeds, 2 updates each, on the PTB sample, 2 at a time: SIGTERM once a run has
    finished and another is running, then the same command again."""
    out = tmp_path_factory.mktemp("evidence")
    env = {**os.environ, "EVIDENCE_OUT": str(out), "EVIDENCE_RECORDS": str(out / "records"), "TASKS": "lm",
           "LM_SYSTEMS": "tf_vanilla tf_da", "LM_SEEDS": "1 2",
           "MAX_UPDATE": "2", "PTB_DIR": PTB_SAMPLE, "JOBS": "2", "THREADS": "1"}
    command = [sys.executable, str(EVIDENCE / "evidence.py"), "run", "--no-results"]
    first = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and first.poll() is None:
        runs = manifest(out) if (out / "manifest.json").exists() else {}
        statuses = [r["status"] for r in runs.values()]
        if "finished" in statuses and "running" in statuses:
            break
        time.sleep(0.5)
    first.send_signal(signal.SIGTERM)
    interrupted_output, _ = first.communicate(timeout=120)
    after_stop = manifest(out)
    for entry in after_stop.values():  # stopped while writing its summary table, after its final artifacts?
        eval_log = Path(entry["out_dir"]) / "logs" / f"eval.{entry['system']}.test.log"
        entry["complete_on_disk"] = eval_log.exists() and "Perplexity:" in eval_log.read_text(encoding="utf-8")
        train_log = Path(entry["out_dir"]) / "logs" / f"train.{entry['system']}.log"
        entry["training_cut"] = train_log.exists() and "done training" not in train_log.read_text(encoding="utf-8")
    finished = {k: r for k, r in after_stop.items() if r["status"] == "finished"}
    stamps = {k: os.stat(Path(r["out_dir"]) / "logs" / f"eval.{r['system']}.test.log").st_mtime_ns
              for k, r in finished.items()}
    second = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    elsewhere = {**env, "EVIDENCE_OUT": str(out / "elsewhere")}  # another machine: only the records
    third = subprocess.run(command, env=elsewhere, cwd=REPO, capture_output=True, text=True, timeout=300)
    return {"out": out, "env": env, "first": first, "first_output": interrupted_output, "after_stop": after_stop,
            "stamps": stamps, "second": second, "third": third}


@pytest.mark.slow
def test_an_interrupted_set_resumes_without_redoing_finished_runs(tiny_runs):
    first, after_stop, second = tiny_runs["first"], tiny_runs["after_stop"], tiny_runs["second"]
    assert first.returncode == 128 + signal.SIGTERM, tiny_runs["first_output"][-3000:]
    assert "SIGTERM: stopping" in tiny_runs["first_output"]
    statuses = sorted(r["status"] for r in after_stop.values())
    assert "finished" in statuses and "interrupted" in statuses, statuses
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "4 runs planned" in second.stdout and "runs: 4 finished" in second.stdout
    final = manifest(tiny_runs["out"])
    assert len(final) == 4 and all(r["status"] == "finished" for r in final.values())
    for run_id, stamp in tiny_runs["stamps"].items():  # finished runs were not run again
        assert f"start {run_id} " not in second.stdout
        assert len(final[run_id]["attempts"]) == 1
        log = Path(final[run_id]["out_dir"]) / "logs" / f"eval.{final[run_id]['system']}.test.log"
        assert os.stat(log).st_mtime_ns == stamp
    assert all(entry["complete_on_disk"] == (entry["status"] == "finished") for entry in after_stop.values())
    for run_id, entry in after_stop.items():
        if entry["status"] == "interrupted":  # resumed, as a second attempt
            assert f"start {run_id} (attempt {len(entry['attempts']) + 1}" in second.stdout
            assert [a["outcome"] for a in final[run_id]["attempts"]][-2:] == ["interrupted", "finished"]
            if entry["training_cut"]:  # the log of the cut training is kept beside the new one
                logs = Path(entry["out_dir"]) / "logs"
                assert (logs / f"train.{entry['system']}.log.attempt1").exists()
                assert "done training" in (logs / f"train.{entry['system']}.log").read_text(encoding="utf-8")
    # the records: a fresh output folder redoes nothing; their logs hold no path of this machine
    records = tiny_runs["out"] / "records"
    assert tiny_runs["third"].returncode == 0, tiny_runs["third"].stdout[-3000:] + tiny_runs["third"].stderr[-3000:]
    assert "4 finished already" in tiny_runs["third"].stdout and " start " not in tiny_runs["third"].stdout
    for run_id, entry in final.items():
        record = json.loads((records / run_id / "run.json").read_text(encoding="utf-8"))
        assert record["budget"] == entry["budget"] and record["attempts"] == final[run_id]["attempts"]
        assert {p.name for p in (records / run_id).iterdir()} == {"run.json", "train.log", "eval.valid.log",
                                                                  "eval.test.log"}
        eval_log = Path(entry["out_dir"]) / "logs" / f"eval.{entry['system']}.test.log"
        assert (records / run_id / "eval.test.log").read_text(encoding="utf-8") == \
            eval_log.read_text(encoding="utf-8").replace(f"{REPO}/", "")
        assert str(REPO) not in (records / run_id / "train.log").read_text(encoding="utf-8")
    # the page from the records alone (the output folder of another machine): measured rows filled in
    page_path = tiny_runs["out"] / "page" / "results.md"
    subprocess.run([sys.executable, str(EVIDENCE / "results.py"), "--evidence-out", str(tiny_runs["out"] / "elsewhere"),
                    "--output", str(page_path)], cwd=REPO, check=True, capture_output=True, env=tiny_runs["env"])
    page = page_path.read_text(encoding="utf-8")
    ppl = {}
    for entry in final.values():
        with open(Path(entry["out_dir"]) / "logs" / f"eval.{entry['system']}.test.log", encoding="utf-8") as f:
            ppl[(entry["system"], entry["seed"])] = float(re.findall(r"Perplexity: ([0-9.]+)", f.read())[-1])
    vanilla = next(line for line in page.splitlines() if line.startswith("| Transformer LM | 2 of 2 |"))
    assert f"s1: {ppl[('tf_vanilla', 1)]:.2f}, s2: {ppl[('tf_vanilla', 2)]:.2f}" in vanilla
    da_row = next(line for line in page.splitlines() if line.startswith("| Transformer LM + DA vs Transformer LM |"))
    deltas = [ppl[("tf_da", s)] - ppl[("tf_vanilla", s)] for s in (1, 2)]
    assert f"s1: {deltas[0]:+.2f}, s2: {deltas[1]:+.2f}" in da_row and "**measured only**" in da_row
    dagan = next(line for line in page.splitlines()
                 if line.startswith("| positional attentive LSTM (Dagan), 6 epochs at lr 10 vs"))
    assert "70.92 vs 76.56 (-5.64)" in dagan and "**not run yet**" in dagan
    authors = next(line for line in page.splitlines()
                   if line.startswith("| positional attentive LSTM (Dagan), authors' budget vs attentive LSTM"))
    assert "70.92 vs 76.56 (-5.64)" in authors and "**not run yet**" in authors
    assert page.count("**not run yet**") > 40  # translation, tagging, classification: nothing ran
    assert re.search(r"\(4 of \d+ runs finished\)", page)  # of every task's planned runs, however many the plan has
    for picture in ("lm_seeds.png", "lm_valid_ppl.png"):
        assert (page_path.parent / "images" / "results" / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(images/results/{picture})" in page
    assert "MODELS=tf_da" in page and "bash examples/language_model/run_ptb.sh" in page


def test_a_page_of_records_elsewhere_is_written_beside_them_not_over_the_repositorys(tmp_path):
    """results.py with EVIDENCE_RECORDS naming another folder (a smoke run's, as the runner calls it at its end)
    and no --output writes results.md inside that folder; docs/results.md and its pictures stay as they are."""
    page = Path(REPO) / "docs" / "results.md"
    before = page.read_bytes()
    pictures_before = sorted((page.parent / "images" / "results").iterdir())
    env = {**os.environ, "EVIDENCE_RECORDS": str(tmp_path / "records"), "EVIDENCE_OUT": str(tmp_path / "out")}
    (tmp_path / "records").mkdir()
    wrote = subprocess.run([sys.executable, str(EVIDENCE / "results.py")], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300)
    assert wrote.returncode == 0, wrote.stderr[-2000:]
    assert (tmp_path / "records" / "results.md").read_text(encoding="utf-8").startswith("# Results")
    assert page.read_bytes() == before and sorted((page.parent / "images" / "results").iterdir()) == pictures_before


@pytest.mark.slow
def test_length_extrapolation_runs_are_recorded_and_make_their_section(tmp_path):
    """Three methods (one refusing longer blocks) x 1 seed, 2 updates each, on the PTB sample, evaluated at 1,024
    tokens (16 x 64) both ways: their records (results.json, the training log), then the page's section from the
    records alone: the claim with its per-seed Δ, the recipe's table with the refusal, the picture."""
    env = {**os.environ, "EVIDENCE_OUT": str(tmp_path / "out"), "EVIDENCE_RECORDS": str(tmp_path / "records"),
           "TASKS": "extrapolation", "EXTRAPOLATION_SYSTEMS": "sinusoidal alibi direct-absolute",
           "EXTRAPOLATION_SEEDS": "1", "EXTRAPOLATION_MULTIPLIERS": "16", "MAX_UPDATE": "2", "PTB_DIR": PTB_SAMPLE,
           "JOBS": "2", "THREADS": "1"}
    ran = subprocess.run([sys.executable, str(EVIDENCE / "evidence.py"), "run", "--no-results"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0 and "runs: 4 finished" in ran.stdout, ran.stdout[-3000:] + ran.stderr[-3000:]
    records = tmp_path / "records" / "extrapolation"
    assert {p.name for p in (records / "data").iterdir()} == {"run.json", "preprocess.log"}
    ppl = {}
    for method in ("sinusoidal", "alibi", "direct-absolute"):
        assert {p.name for p in (records / method / "seed1").iterdir()} == {"run.json", "train.log", "results.json"}
        evaluations = json.loads((records / method / "seed1" / "results.json").read_text(encoding="utf-8"))
        assert len(evaluations) == 2 and str(REPO) not in json.dumps(evaluations)
        ppl[method] = {(e["mode"], e["length"]): e.get("ppl") for e in evaluations}
    assert ppl["direct-absolute"][("nonoverlapping", 1024)] is None  # refused: nothing scored
    page_path = tmp_path / "page" / "results.md"
    subprocess.run([sys.executable, str(EVIDENCE / "results.py"), "--evidence-out", str(tmp_path / "elsewhere"),
                    "--output", str(page_path)], cwd=REPO, check=True, capture_output=True, env=env)
    page = page_path.read_text(encoding="utf-8")
    section = page[page.index("Length extrapolation: train short, test long"):]
    claim = next(line for line in section.splitlines()
                 if line.startswith("| alibi vs sinusoidal | valid perplexity at 16 x 64 tokens, non-overlapping |"))
    delta = ppl["alibi"][("nonoverlapping", 1024)] - ppl["sinusoidal"][("nonoverlapping", 1024)]
    assert f"s1: {delta:+.2f}" in claim and "lower (text and curves)" in claim and "not run yet" not in claim
    assert "| shaw vs sinusoidal |" in section  # planned, not run: shown as such
    assert "| direct-absolute vs sinusoidal |" not in section  # it refuses 16 x 64 tokens: no comparison there
    table = section[section.index("### non-overlapping windows"):]
    refusing = next(line for line in table.splitlines() if line.startswith("| direct-absolute | "))
    assert refusing.endswith(" | refuses (limit 64) |")
    assert f"| sinusoidal | {ppl['sinusoidal'][('nonoverlapping', 1024)]:.1f} |" in table
    assert (page_path.parent / "images" / "results" / "extrapolation_perplexity.png").read_bytes()[:4] == b"\x89PNG"
    assert "METHODS=alibi" in section and "STEPS=prepare" in section
