"""Train short, test long (examples/length_extrapolation/): every causal position method trained on blocks of
16 tokens of real PTB text, then read at 64 tokens by fairseq-eval-lm (non-overlapping windows,
``--context-window 0``, and ALiBi's sliding window, ``--context-window 63``), by the hub's ``score`` and by
incremental generation, each in a fresh process; the methods whose parameters are tied to 16 positions refuse
at start-up in one line naming the method and the limit. Then the recipe: ``--dry-run`` prints every command of
every registered causal variant, and a tiny run writes its table, JSON and PNG and resumes without redoing
anything.

Each model is trained once for the module. A process start costs 5 s on an idle 2-core machine (more under
load), so the trainings run in one subprocess that calls fairseq-train's own entry point
(``fairseq_cli.train.cli_main``, what the console script runs) once per method, and the evaluations in a second
one (``fairseq_cli.eval_lm.cli_main``); the hub runs in a third. The one-line refusals on stderr are checked on
the real ``fairseq-eval-lm`` console script, and the recipe runs its commands as a user would.
"""

import gzip
import importlib.util
import json
import math
import os
import re
import signal
import struct
import subprocess
from typing import Dict, List

import pytest
import torch

from cli_helpers import BIN, error_line, preprocess_in_process, run_failing, run_python
from model_helpers import REPO, USER_DIR
from process_helpers import running, session_commands, start_recipe, wait_until

pytestmark = pytest.mark.slow

SHARED_PTB = os.path.join(REPO, "..", "shared", "data", "ptb_lm")
SAMPLE_PTB = os.path.join(REPO, "data", "ptb_sample")
RECIPE = os.path.join(REPO, "examples", "length_extrapolation", "run.sh")
HELPER = os.path.join(REPO, "examples", "length_extrapolation", "extrapolation.py")
LINES = {"train": 300, "valid": 40, "test": 40}  # PTB's first lines: 6,350 / 890 / 777 words
L_TRAIN, L_EVAL = 16, 64
#: the base-2 loss fairseq-eval-lm prints has 4 decimals; the hub's sum runs in another order (~1e-6)
LOSS_TOLERANCE = 6e-5

TF = ["--decoder-layers", "1", "--decoder-embed-dim", "16",
      "--decoder-input-dim", "16", "--decoder-output-dim", "16", "--decoder-ffn-embed-dim", "32",
      "--decoder-attention-heads", "2", "--share-decoder-input-output-embed"]
LSTM = ["--decoder-embed-dim", "16", "--decoder-hidden-size", "16", "--decoder-out-embed-dim", "16",
        "--decoder-layers", "1", "--share-decoder-input-output-embed"]
TRAINING = ["--task", "language_modeling", "--user-dir", USER_DIR, "--sample-break-mode", "none",
            "--tokens-per-sample", str(L_TRAIN), "--optimizer", "adam", "--lr", "0.003", "--batch-size", "16",
            "--required-batch-size-multiple", "1", "--max-update", "3", "--cpu", "--seed", "1",
            "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0", "--log-format", "simple"]
#: the methods whose parameters are learned for t = --max-target-positions positions, and what their
#: refusal names (the term, or the option)
TIED = {"direct-absolute": "A^p", "direct-relative": "a^r", "direct-both-all-layers": "A^p",
        "conv-1d": "1d attention convolution", "learned": "--decoder-learned-pos"}
MODES = {"nonoverlapping": 0, "sliding": L_EVAL - 1}


def load_helper():
    """examples/length_extrapolation/extrapolation.py, the recipe's Python half."""
    spec = importlib.util.spec_from_file_location("length_extrapolation_helper", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HELPER_MODULE = load_helper()


def helper_methods() -> Dict[str, List[str]]:
    """The recipe's methods (every causal variant of the registry, sinusoidal, none, learned, the LSTM LMs)
    and their own flags (``--arch`` for the LSTM LMs), as ``extrapolation.py methods`` lists them."""
    return {name: flags if family == "lstm" else ["--arch", "transformer_lm_posattn", *flags]
            for name, family, flags in HELPER_MODULE.list_methods([])}


#: method -> its flags (the recipe's), and the tiny sizes of its family here
METHODS = helper_methods()
SIZES = {name: LSTM if "lstm" in name else TF for name in METHODS}


def count_tokens(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return sum(len(line.split()) for line in lines) + len(lines)


# ------------------------------------------------------------------------------------- data and models
TRAIN_ALL = """
from fairseq_cli.preprocess import cli_main as preprocess
from fairseq_cli.train import cli_main as train
raw, data = INPUTS["raw"], INPUTS["data_bin"]
sys.argv = ["fairseq-preprocess", "--only-source", "--task", "language_modeling", "--workers", "1",
            "--trainpref", raw + "/train.txt", "--validpref", raw + "/valid.txt", "--testpref", raw + "/test.txt",
            "--destdir", data]
preprocess()
for name, flags in INPUTS["methods"].items():
    sys.argv = ["fairseq-train", data, *INPUTS["training"], *flags, "--save-dir", INPUTS["root"] + "/ckpt/" + name]
    train()
    OUTPUTS[name] = os.path.exists(INPUTS["root"] + "/ckpt/" + name + "/checkpoint_last.pt")
"""


@pytest.fixture(scope="module")
def ptb_slice(tmp_path_factory):
    """The first lines of PTB's splits (../shared's if present, else the shipped sample), as text files."""
    if os.path.isdir(SHARED_PTB):
        source = {split: os.path.join(SHARED_PTB, f"ptb.{split}.txt.gz") for split in LINES}
    elif os.path.isdir(SAMPLE_PTB):
        source = {split: os.path.join(SAMPLE_PTB, f"{split}.txt") for split in LINES}
    else:
        pytest.skip(f"no PTB text: neither {SHARED_PTB} nor the shipped {SAMPLE_PTB}")
    raw = tmp_path_factory.mktemp("ptb_slice")
    for split, path in source.items():
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            lines = [line for _, line in zip(range(LINES[split]), f)]
        (raw / f"{split}.txt").write_text("".join(lines), encoding="utf-8")
    return str(raw)


@pytest.fixture(scope="module")
def trained(ptb_slice, tmp_path_factory):
    """The slice binarized, and one tiny model per method trained a few updates on blocks of 16 tokens, all in
    one subprocess."""
    root = tmp_path_factory.mktemp("length_extrapolation")
    done = run_python(TRAIN_ALL, root, cwd=root, threads=1, root=str(root), raw=ptb_slice, data_bin=str(root / "data-bin"),
                      training=TRAINING, methods={name: flags + SIZES[name] for name, flags in METHODS.items()})
    assert done == {name: True for name in METHODS}
    return {"root": root, "raw": ptb_slice, "data_bin": str(root / "data-bin"),
            "checkpoints": {name: str(root / "ckpt" / name / "checkpoint_last.pt") for name in METHODS}}


EVAL_ALL = """
import io, logging, re
from fairseq_cli.eval_lm import cli_main
from fairseq_posattn.user_errors import user_error_in
for name, path in INPUTS["checkpoints"].items():
    OUTPUTS[name] = {}
    for mode, window in INPUTS["modes"].items():
        sys.argv = ["fairseq-eval-lm", INPUTS["data_bin"], "--user-dir", INPUTS["user_dir"], "--path", path,
                    "--gen-subset", "test", "--sample-break-mode", "none", "--tokens-per-sample", str(INPUTS["length"]),
                    "--context-window", str(window), "--max-tokens", "2048", "--cpu", "--num-workers", "0",
                    "--model-overrides", INPUTS["overrides"][name]]
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        logging.getLogger().addHandler(handler)
        try:
            cli_main()
            log = stream.getvalue()
            loss, ppl = re.search(r"Loss \\(base 2\\): (\\S+), Perplexity: (\\S+)", log).groups()
            tokens = re.search(r"Evaluated ([0-9,]+) tokens", log).group(1)
            OUTPUTS[name][mode] = {"loss": float(loss.rstrip(",")), "ppl": float(ppl), "tokens": int(tokens.replace(",", ""))}
        except Exception as error:
            cause = user_error_in(error)
            OUTPUTS[name][mode] = {"refused": str(cause) if cause else None, "error": repr(error)[:2000],
                                   "scored": "Evaluated" in stream.getvalue()}
        finally:
            logging.getLogger().removeHandler(handler)
"""


#: each method's --model-overrides at 64 tokens, as the recipe gives them: the limit raised to 64 (and a zero-shot
#: context extension's options)
OVERRIDES = {name: HELPER_MODULE.evaluation_overrides(name, L_EVAL, L_TRAIN) for name in METHODS}


@pytest.fixture(scope="module")
def evaluations(trained):
    """fairseq-eval-lm of every checkpoint at 64 tokens, both ways, with the recipe's overrides (the model's
    position limit raised to 64), in one fresh process."""
    return run_python(EVAL_ALL, trained["root"], cwd=trained["root"], threads=1, checkpoints=trained["checkpoints"], data_bin=trained["data_bin"],
                      user_dir=USER_DIR, length=L_EVAL, modes=MODES,
                      overrides={name: repr(overrides) for name, overrides in OVERRIDES.items()})


HUB_ALL = """
import math, torch
import fairseq_posattn
from fairseq_posattn.hub import from_pretrained
from fairseq_posattn.user_errors import user_error_in
lines = open(INPUTS["text"], encoding="utf-8").read().splitlines()
length = INPUTS["length"]

def refusal(call):
    try:
        call()
    except Exception as error:
        cause = user_error_in(error)
        return str(cause) if cause else "not a one-line refusal: " + repr(error)[:2000]
    return None

for name, path in INPUTS["checkpoints"].items():
    folder, file = os.path.dirname(path), os.path.basename(path)
    out = OUTPUTS[name] = {}
    hub = from_pretrained(folder, file, INPUTS["data_bin"])  # as trained: 16 positions
    out["fixed_limit"] = getattr(hub.models[0], "fixed_position_limit", None)
    out["refused_without_override"] = refusal(lambda: hub.score(lines, sample_break_mode="none", tokens_per_sample=length))
    overrides = INPUTS["overrides"][name]  # the recipe's: max_target_positions=length (a zero-shot extension's too)
    out["refused_with_override"] = refusal(lambda: from_pretrained(folder, file, INPUTS["data_bin"], **overrides))
    if out["refused_with_override"]:
        continue
    hub = from_pretrained(folder, file, INPUTS["data_bin"], **overrides)
    for mode, window in INPUTS["modes"].items():
        kwargs = dict(sample_break_mode="none", tokens_per_sample=length, context_window=window)
        blocks = hub.score(lines, **kwargs)
        out[mode] = {"log2_ppl": math.log2(hub.perplexity(lines, **kwargs)),
                     "tokens": sum(len(block["tokens"]) for block in blocks)}
    one = hub.score(" ".join(" ".join(lines).split()[:50]))  # one sentence of 51 tokens, as eval-lm's eos mode
    out["sentence"] = {"tokens": len(one["tokens"]), "finite": bool(torch.isfinite(one["positional_scores"]).all())}
    # incremental generation (the decoder's cache) well past the 16 training positions = the full pass
    prompt = hub.encode(" ".join(lines[0].split()[:3]))[:-1]
    hypo = hub.generate([prompt], beam=1, min_len=length - 16, max_len_b=length - 16)[0][0]
    full = hub.score_tokens([hypo["tokens"]])[0]
    out["generation"] = {"tokens": len(hypo["tokens"]),
                         "max_difference": (full["positional_scores"] - hypo["positional_scores"]).abs().max().item()}
"""


@pytest.fixture(scope="module")
def hub_outputs(trained):
    """Every checkpoint through the hub, in one fresh process: the limit each model declares, its refusals, its
    score at 64 tokens both ways, one long sentence, and incremental generation past 16 positions."""
    return run_python(HUB_ALL, trained["root"], cwd=trained["root"], threads=1, checkpoints=trained["checkpoints"], data_bin=trained["data_bin"],
                      text=os.path.join(trained["raw"], "test.txt"), length=L_EVAL, modes=MODES, overrides=OVERRIDES)


# ------------------------------------------------------------------------------------------------- tests
def test_the_tied_methods_are_those_whose_models_declare_a_fixed_limit(hub_outputs):
    """The recipe's methods cover every causal variant of the registry; the models tied to their positions
    (the direct interactions, the 1d convolution, learned position embeddings) are exactly those expected."""
    from posattn.position_terms.catalogue import all_variants

    assert set(all_variants("decoder")) <= set(METHODS)
    assert {"sinusoidal", "none", "learned", "attentive_lstm_lm", "positional_attentive_lstm_lm"} <= set(METHODS)
    assert {name for name, out in hub_outputs.items() if out["fixed_limit"]} == set(TIED)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_eval_lm_reads_64_tokens_or_refuses_at_start_up(trained, evaluations, name):
    """Every method that can scores every test token at 64 tokens (4x its training length), both ways, with a
    finite perplexity; a tied one refuses before scoring anything, in one line naming the method and 16."""
    tokens = count_tokens(os.path.join(trained["raw"], "test.txt"))
    for mode in MODES:
        found = evaluations[name][mode]
        if name in TIED:
            assert found.get("refused"), found
            assert "\n" not in found["refused"] and not found["scored"]
            assert TIED[name] in found["refused"] and f"{L_TRAIN} positions" in found["refused"], found
        else:
            assert "loss" in found, found
            assert found["tokens"] == tokens
            assert math.isfinite(found["ppl"]) and 1.5 < found["ppl"] < 1e5
            assert found["ppl"] == pytest.approx(2 ** found["loss"], rel=1e-3)
    if name not in TIED:  # the sliding window gives each token more context: another number
        assert evaluations[name]["sliding"]["loss"] != evaluations[name]["nonoverlapping"]["loss"]


@pytest.mark.parametrize("name", sorted(set(METHODS) - set(TIED)))
def test_hub_score_beyond_the_training_length_equals_eval_lm(evaluations, hub_outputs, name):
    """``score`` / ``perplexity`` with ``sample_break_mode="none", tokens_per_sample=64, context_window=0 | 63``
    = fairseq-eval-lm's loss (to its 4 printed decimals) over the same tokens; a sentence beyond 16 tokens is
    scored too; without ``max_target_positions=64`` the hub refuses in one line naming that keyword."""
    out = hub_outputs[name]
    for mode in MODES:
        assert out[mode]["tokens"] == evaluations[name][mode]["tokens"]
        assert out[mode]["log2_ppl"] == pytest.approx(evaluations[name][mode]["loss"], abs=LOSS_TOLERANCE)
    assert out["sentence"]["tokens"] > L_TRAIN and out["sentence"]["finite"]
    assert out["refused_without_override"] and "max_target_positions=64" in out["refused_without_override"]


@pytest.mark.parametrize("name", sorted(set(METHODS) - set(TIED)))
def test_incremental_generation_past_the_training_length_equals_the_full_pass(hub_outputs, name):
    generation = hub_outputs[name]["generation"]
    assert generation["tokens"] > 2 * L_TRAIN
    assert generation["max_difference"] < 1e-4


@pytest.mark.parametrize("name", sorted(TIED))
def test_the_hub_refuses_a_tied_model_beyond_its_positions(hub_outputs, name):
    """Loaded as trained, ``score`` at 64 tokens names what ties the model and its 16 positions; loaded with
    ``max_target_positions=64`` it is refused at load, naming the term and the limit (one line each)."""
    out = hub_outputs[name]
    for message in (out["refused_without_override"], out["refused_with_override"]):
        assert message and "\n" not in message and f"{L_TRAIN} positions" in message, message
    assert TIED[name] in out["refused_with_override"]
    assert "tied to its 16 positions" in out["refused_without_override"]


@pytest.mark.parametrize("name", sorted(HELPER_MODULE.ZERO_SHOT_EXTENSIONS))
def test_a_zero_shot_extension_reads_ropes_own_model_with_the_extension_past_the_training_length(
        trained, evaluations, name):
    """``rotary-yarn-zero-shot`` and ``rotary-dynamic-zero-shot`` train RoPE's model (the same weights as
    ``rotary``'s: its flags, its seed) and read it at 64 tokens with the extension switched on by --model-overrides
    (YaRN with s = 64 / 16, dynamic NTK with L = 16): another loss than RoPE's own reading of the same weights (the
    negative control), finite; at the training length the overrides are RoPE's."""
    weights = {method: torch.load(trained["checkpoints"][method], map_location="cpu", weights_only=False)["model"]
               for method in (name, "rotary")}
    assert weights[name].keys() == weights["rotary"].keys()
    assert all(torch.equal(weights[name][key], weights["rotary"][key]) for key in weights[name])
    extension = HELPER_MODULE.ZERO_SHOT_EXTENSIONS[name]
    assert OVERRIDES[name] == {"max_target_positions": L_EVAL, "decoder_rotary_scaling": extension,
                               "decoder_rotary_scaling_factor": L_EVAL / L_TRAIN if extension == "yarn" else 1.0,
                               "decoder_rotary_original_positions": L_TRAIN, "decoder_reset_position_options": True}
    assert HELPER_MODULE.evaluation_overrides(name, L_TRAIN, L_TRAIN) == {"max_target_positions": L_TRAIN}
    for mode in MODES:
        assert math.isfinite(evaluations[name][mode]["loss"])
        assert abs(evaluations[name][mode]["loss"] - evaluations["rotary"][mode]["loss"]) > 1e-3, mode


def test_eval_lm_refuses_a_tied_model_in_one_line_on_stderr(trained):
    """The real console script: ALiBi's command for a model with learned position embeddings (PyTorch would
    print a "size mismatch" traceback), and a sliding window without the override for the direct relative
    vector (fairseq checks the blocks without their context); the recipe's table reads the refusal."""
    extrapolation = HELPER_MODULE
    common = [trained["data_bin"], "--user-dir", USER_DIR, "--gen-subset", "test", "--sample-break-mode", "none",
              "--tokens-per-sample", str(L_EVAL), "--max-tokens", str(L_EVAL), "--cpu", "--num-workers", "0"]
    alibi = run_failing("fairseq-eval-lm", [*common, "--path", trained["checkpoints"]["learned"], "--context-window",
                                            "0", "--model-overrides",
                                            f"{{'tokens_per_sample': {L_EVAL}, 'max_target_positions': {L_EVAL}}}"])
    line = error_line(alibi, "fairseq-eval-lm")
    assert "--decoder-learned-pos" in line and "learned for 16 positions" in line, line
    record = extrapolation.parse_eval(alibi.stdout + alibi.stderr)
    assert record["status"] == "refused" and record["limit"] == L_TRAIN
    assert extrapolation.cell([record]) == "refuses (limit 16)"

    sliding = run_failing("fairseq-eval-lm", [*common, "--path", trained["checkpoints"]["direct-relative"],
                                              "--context-window", str(L_EVAL - 1)])
    line = error_line(sliding, "fairseq-eval-lm")
    assert "--context-window 63" in line and "--decoder-direct-position relative" in line, line
    assert "tied to its 16 positions" in line and "--tokens-per-sample 16 or less" in line


# ------------------------------------------------------------------------------------------------ recipe
def recipe(env: Dict[str, str], *args: str) -> subprocess.CompletedProcess:
    path = BIN + os.pathsep + os.environ.get("PATH", "")
    result = subprocess.run(["bash", RECIPE, *args], capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", **env})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def commands(output: str, tool: str) -> List[str]:
    return [line for line in output.splitlines() if line.startswith(f"+ {tool} ")]


def test_recipe_dry_run_prints_every_command_of_every_method(tmp_path):
    """Every registered causal variant (and sinusoidal, none, learned, RoPE read with a zero-shot extension, RoPE
    and none interleaved, the LSTM LMs): one training on blocks of 64 (500 updates; the LSTM LMs 2,000), then
    fairseq-eval-lm at 64 ... 1024 tokens both ways, with the override (past 64, a zero-shot extension's options
    too); nothing is written."""
    out = tmp_path / "out"
    printed = recipe({"OUT": str(out), "DATA_DIR": str(tmp_path / "absent")}, "--dry-run").stdout
    assert not out.exists()
    trainings, evaluations = commands(printed, "fairseq-train"), commands(printed, "fairseq-eval-lm")
    assert len(commands(printed, "fairseq-preprocess")) == 1
    assert len(trainings) == len(METHODS) and len(evaluations) == len(METHODS) * 5 * 2
    for name, flags in METHODS.items():
        (line,) = [t for t in trainings if f"/checkpoints/{name}/seed1 " in t]
        own = " ".join(flags[2:] if flags[1] == "transformer_lm_posattn" else flags) + " "
        assert own in line.replace("\\,", ",")  # the printed command quotes a comma
        keeps_embeddings = {"sinusoidal", "learned", "attentive_lstm_lm", "positional_attentive_lstm_lm"}
        assert ("--no-token-positional-embeddings" in line) == (name not in keeps_embeddings)
        assert "--sample-break-mode none --tokens-per-sample 64 " in line
        # the LSTM LMs' own budget (LSTM_MAX_UPDATE): after 500 updates they are still at the unigram level
        assert f"--max-update {2000 if 'lstm' in name else 500} " in line
    for length in (64, 128, 256, 512, 1024):
        same = [e for e in evaluations if f"--tokens-per-sample {length} " in e]
        assert len(same) == 2 * len(METHODS)
        assert sum("--context-window 0 " in e for e in same) == len(METHODS)
        assert sum(f"--context-window {length // 2} " in e for e in same) == len(METHODS)  # stride L/2
        assert all(f"max_target_positions\\':\\ {length}" in e for e in same)
        for name, extension in HELPER_MODULE.ZERO_SHOT_EXTENSIONS.items():  # past 64: the extension's options
            (reading,) = {e for e in same if f"/checkpoints/{name}/seed1/" in e and "--context-window 0 " in e}
            assert (f"decoder_rotary_scaling\\':\\ \\'{extension}\\'" in reading) == (length > 64), reading
    assert "extrapolation.py table" in printed


def test_recipe_smoke_run_writes_table_json_and_png_then_resumes(ptb_slice, tmp_path):
    """ALiBi, one seed, evaluated at 16 and 64 tokens both ways on the slice of PTB: results.md (two perplexity
    tables and the wall times), results.json (every evaluation), perplexity.png; run again, nothing is trained or
    evaluated again and the logs stay as they were; a training run again redoes its evaluations; another output folder
    on the same prepared data; unknown steps and unprepared data are refused in one line."""
    out = tmp_path / "out"
    env = {"OUT": str(out), "DATA_DIR": ptb_slice, "METHODS": "alibi", "L_TRAIN": "16", "MULTIPLIERS": "1 4",
           "SLIDE_STRIDE": "8", "MAX_UPDATE": "2", "BATCH_SIZE": "8", "TF_DIM": "16", "TF_FFN": "32",
           "TF_LAYERS": "1", "TF_HEADS": "2", "EVAL_TOKENS": "1024"}
    first = recipe(env).stdout
    assert len(commands(first, "fairseq-train")) == 1 and len(commands(first, "fairseq-eval-lm")) == 4
    table = (out / "results.md").read_text(encoding="utf-8")
    assert len([line for line in table.splitlines() if line.startswith("| alibi | ")]) == 3, table
    assert "| method | 16 (x1) | 64 (x4) |" in table
    records = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert sorted((r["mode"], r["length"]) for r in records) == [("nonoverlapping", 16), ("nonoverlapping", 64),
                                                               ("sliding", 16), ("sliding", 64)]
    for record in records:
        assert record["status"] == "ok" and math.isfinite(record["ppl"]) and record["wall_seconds"] > 0
        assert f"{record['ppl']:.1f}" in table
    png = (out / "perplexity.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 300 and height > 200

    logs = {p.name: p.stat().st_mtime_ns for p in (out / "logs").iterdir()}
    again = recipe(env).stdout
    assert not commands(again, "fairseq-train") and not commands(again, "fairseq-eval-lm")
    assert {p.name: p.stat().st_mtime_ns for p in (out / "logs").iterdir()} == logs
    assert (out / "results.md").read_text(encoding="utf-8") == table

    # a training that runs again (its log deleted, as to raise MAX_UPDATE) makes its evaluations again
    (out / "logs" / "train.alibi.seed1.log").unlink()
    retrained = recipe({**env, "MAX_UPDATE": "3"}).stdout
    assert len(commands(retrained, "fairseq-train")) == 1 and len(commands(retrained, "fairseq-eval-lm")) == 4
    # another output folder on these prepared data (DATA_OUT, as the evidence runner's runs share one)
    second = recipe({**env, "DATA_OUT": str(out), "OUT": str(tmp_path / "second"), "STEPS": "train"}, "--dry-run")
    trainings = commands(second.stdout, "fairseq-train")
    assert not commands(second.stdout, "fairseq-preprocess") and len(trainings) == 1
    assert trainings[0].startswith(f"+ fairseq-train {out / 'data-bin'} ") and str(tmp_path / "second") in trainings[0]
    for steps, message in (("bogus", "STEPS are prepare, train and table"), ("train", "run the prepare step")):
        refused = subprocess.run(["bash", RECIPE], capture_output=True, text=True, cwd=REPO,
                                 env={**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), **env,
                                      "STEPS": steps, "DATA_OUT": str(tmp_path / "none")})
        assert refused.returncode != 0 and message in refused.stderr.splitlines()[-1], refused.stderr


def test_recipe_never_evaluates_a_killed_training_stops_with_its_jobs_and_runs_once_per_folder(ptb_slice, tmp_path):
    """A training killed by SIGKILL after its first checkpoint (as the out-of-memory killer would) is reported as
    failed, in one line naming the run and its log, and never evaluated (status 1); a second recipe on the same
    output folder meanwhile stops at once, naming the first one's process; run again, the training resumes from
    its checkpoint; SIGTERM to the recipe alone during an evaluation stops that evaluation with it (status 143,
    no process of it left, no log under a finished name); a complete log of a failed evaluation under the
    finished name (what a Ctrl-C used to leave) is redone by the next run, which scores the split. The slice is
    binarized in this process, as the recipe's prepare step does (DATA_OUT), to spare a process start."""
    out, data = tmp_path / "out", tmp_path / "data"
    preprocess_in_process(["--only-source", "--task", "language_modeling", "--workers", "1", "--destdir",
                           data / "data-bin", *[arg for split in LINES for arg in (f"--{split}pref",
                                                                                  f"{ptb_slice}/{split}.txt")]])
    env = {"OUT": str(out), "DATA_OUT": str(data), "METHODS": "alibi", "L_TRAIN": "16", "MULTIPLIERS": "1",
           "MODES": "nonoverlapping", "BATCH_SIZE": "4", "TF_DIM": "16", "TF_FFN": "32", "TF_LAYERS": "1",
           "TF_HEADS": "2", "EVAL_TOKENS": "1024", "MAX_UPDATE": "100000", "STEPS": "train"}
    checkpoint = out / "checkpoints" / "alibi" / "seed1" / "checkpoint_last.pt"
    train_log, logs = out / "logs" / "train.alibi.seed1.log", out / "logs"

    first = start_recipe(RECIPE, env)
    wait_until(checkpoint.exists, 240, "first checkpoint", first)
    second = subprocess.run(["bash", RECIPE], capture_output=True, text=True, cwd=REPO, timeout=60,
                            env={**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"], **env})
    assert second.returncode == 1 and len(second.stderr.splitlines()) == 1, second.stderr
    assert f"another run is working in {out} (process {first.pid}" in second.stderr
    os.kill(wait_until(lambda: running(first.pid, "fairseq-train"), 30, "fairseq-train", first)[0], signal.SIGKILL)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 1, stderr
    assert (f"run.sh: error: the training of alibi seed 1 did not finish (fairseq-train: killed by SIGKILL (the "
            f"out-of-memory killer, or kill -9); see {train_log}): its model is not evaluated") in stderr
    assert not list(logs.glob("eval.*")), "a killed training was evaluated"

    updates = torch.load(checkpoint, map_location="cpu", weights_only=False)["optimizer_history"][-1]["num_updates"]
    resumed = start_recipe(RECIPE, {**env, "MAX_UPDATE": str(updates + 1)})
    wait_until(lambda: running(resumed.pid, "fairseq-eval-lm"), 240, "fairseq-eval-lm", resumed)
    resumed.send_signal(signal.SIGTERM)  # the recipe alone, as `kill -TERM <its pid>`
    _, stderr = resumed.communicate(timeout=60)
    assert resumed.returncode == 143 and "SIGTERM: stopping its 1 running job(s)" in stderr, stderr
    wait_until(lambda: not session_commands(resumed.pid), 10, "end of every process of the stopped recipe")
    assert not list(logs.glob("eval.*.log"))
    trained = train_log.read_text(encoding="utf-8")
    assert re.search(rf"Loaded checkpoint {re.escape(str(checkpoint))} \(epoch \d+ @ {updates} updates\)", trained)
    assert "done training" in trained

    evaluation = logs / "eval.alibi.seed1.nonoverlapping.L16.log"
    evaluation.write_text("Traceback (most recent call last):\nKeyboardInterrupt\nwall_seconds 2.5\nexit_status 130\n",
                          encoding="utf-8")
    again = recipe({**env, "MAX_UPDATE": str(updates + 1)})
    assert not commands(again.stdout, "fairseq-train") and len(commands(again.stdout, "fairseq-eval-lm")) == 1
    record, = HELPER_MODULE.collect(str(logs), ["alibi"], ["1"], ["nonoverlapping"], [16])
    assert record["status"] == "ok" and math.isfinite(record["ppl"]), record
    assert not list(logs.glob("*.failed.log")) and not list(logs.glob("*.part"))
