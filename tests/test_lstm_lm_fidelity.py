"""``attentive_lstm_lm`` / ``positional_attentive_lstm_lm`` against the authors' released code
(gautierdag/pytorch-attentive-lm), where the papers leave a detail open: the Gaussian's eps (1e-3,
``--positional-attention-eps``; models trained when it was 1e-6 keep 1e-6 through the ``version``
buffer, also through fairseq's checkpoint loading), the initialisation (``--attentive-lm-init
authors`` as the released code, ``uniform`` U(+-0.1) as the paper's text) and the recipe's update
(run_ptb.sh's OPTIMIZER=paper: the gradient per sentence, whose clipped step is the authors')."""

import copy
import math
import os
import re
import subprocess
from typing import Dict, List

import pytest
import torch

from fairseq_posattn.models.attentive_lstm.positional_attention import (
    GAUSSIAN_EPS,
    LEGACY_GAUSSIAN_EPS,
    PositionalAttention,
)
from cli_helpers import BIN, run
from model_helpers import REPO, USER_DIR, TinyTask, build_model

ARCHS = ["attentive_lstm_lm", "positional_attentive_lstm_lm"]
BLOCK = 12
TINY = ["--task", "language_modeling", "--decoder-embed-dim", "32", "--decoder-hidden-size", "32",
        "--decoder-layers", "2", "--tokens-per-sample", str(BLOCK)]
TOKENS = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 11, 12], [2, 13, 14, 15, 16, 17, 18, 19, 20]])
VERSION = "decoder.attention.version"
RECORD = "decoder.position_record.flags"  # the record of the options, which models of that time did not save


def positional(extra: List[str] = (), seed: int = 0):
    torch.manual_seed(seed)
    return build_model("positional_attentive_lstm_lm", [*TINY, *extra], task=TinyTask(24), tiny=[]).eval()


def sharpen(model) -> None:
    """A sharp Gaussian (sigma = 0.01, 2 sigma^2 = 2e-4) centred between two positions (mu_t =
    0.45 t/N), where eps 1e-3 and 1e-6 give clearly different attentions, and the context's weight
    in the concatenation layer large enough to move the outputs."""
    attention = model.decoder.attention
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in attention.parameters():
            p.copy_(torch.rand(p.shape, generator=generator) * 2 - 1)
        attention.W_mu.weight.zero_()
        attention.W_mu.bias.copy_(torch.tensor([0.0, 0.0, 0.45]))
        attention.w_sigma.weight.zero_()
        attention.w_sigma.bias.fill_(math.log(0.01 / 0.99))
        model.decoder.concat_proj.weight.mul_(20)


def log_probs(model) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(TOKENS)[0], dim=-1)


# ---------------------------------------------------------------------------------------------- eps
def test_a_new_model_has_the_authors_eps_and_saves_version_2():
    model = positional()
    attention = model.decoder.attention
    assert GAUSSIAN_EPS == 1e-3 and attention.eps == 1e-3
    state = model.state_dict()
    assert torch.equal(state[VERSION], torch.tensor([2])) and state[VERSION].dtype == torch.int64
    assert VERSION not in dict(model.named_parameters())
    for cast in (model.half(), model.bfloat16(), model.double()):  # what --fp16 / --bf16 do to the model
        assert cast.decoder.attention.version.dtype == torch.int64
    salton = build_model("attentive_lstm_lm", TINY, task=TinyTask(24), tiny=[])
    assert not any("version" in key for key in salton.state_dict())  # eps is Dagan's only


def test_the_flag_sets_eps():
    assert positional(["--positional-attention-eps", "1e-5"]).decoder.attention.eps == 1e-5
    assert positional(["--positional-attention-eps", "0"]).decoder.attention.eps == 0.0  # not the default
    with pytest.raises(ValueError, match="--positional-attention-eps"):
        positional(["--positional-attention-eps=-1e-3"])


def test_eps_changes_the_function():
    model = positional()
    sharpen(model)
    legacy = copy.deepcopy(model)
    legacy.decoder.attention.eps = LEGACY_GAUSSIAN_EPS
    assert not torch.allclose(log_probs(model), log_probs(legacy), atol=1e-3)
    with torch.no_grad():
        moved = model(TOKENS)[1]["memory_attention"] - legacy(TOKENS)[1]["memory_attention"]
    assert float(moved.abs().max()) > 0.1


def test_a_state_dict_without_version_loads_with_eps_1e6():
    """A model trained before the default became 1e-3 saved no ``version``: loaded (fairseq's
    ``load_state_dict``, which upgrades the state dict first) into a model built with the new
    defaults, it computes exactly what a model built with eps 1e-6 computes, and saved again it
    keeps version 1."""
    trained = positional(seed=1)
    sharpen(trained)
    old_state = {k: v for k, v in trained.state_dict().items() if k not in (VERSION, RECORD)}  # as saved then

    loaded = positional(seed=2)
    assert loaded.decoder.attention.eps == 1e-3
    loaded.load_state_dict(copy.copy(old_state), strict=True)
    assert loaded.decoder.attention.eps == LEGACY_GAUSSIAN_EPS == 1e-6
    assert torch.equal(loaded.state_dict()[VERSION], torch.tensor([1]))  # saved again: still version 1

    built_with_1e6 = positional(["--positional-attention-eps", "1e-6"], seed=3)
    built_with_1e6.load_state_dict({**old_state, VERSION: torch.tensor([2])}, strict=True)
    assert built_with_1e6.decoder.attention.eps == 1e-6
    assert torch.equal(log_probs(loaded), log_probs(built_with_1e6))
    assert not torch.allclose(log_probs(loaded), log_probs(trained), atol=1e-3)  # trained: eps 1e-3

    # a legacy model saved again loads as legacy; a version-2 state dict gives back the built eps
    again = positional(seed=4)
    again.load_state_dict(loaded.state_dict(), strict=True)
    assert again.decoder.attention.eps == 1e-6 and torch.equal(log_probs(again), log_probs(loaded))
    again.load_state_dict(trained.state_dict(), strict=True)
    assert again.decoder.attention.eps == 1e-3 and torch.equal(log_probs(again), log_probs(trained))


def test_upgrade_of_a_bare_module():
    attention = PositionalAttention(8, generator_size=4, eps=1e-4)
    state = {k: v for k, v in attention.state_dict().items() if k != "version"}
    attention.upgrade_state_dict_named(state, "")
    assert attention.eps == 1e-6 and torch.equal(state["version"], torch.tensor([1]))
    attention.upgrade_state_dict_named({**state, "version": torch.tensor([2])}, "")
    assert attention.eps == 1e-4


# ---------------------------------------------------------------------------------------------- init
def _bounds(model, names):
    return {name: float(p.abs().max()) for name, p in model.decoder.named_parameters() if name.startswith(names)}


@pytest.mark.parametrize("arch", ARCHS)
def test_authors_initialisation(arch):
    """The default: PyTorch's defaults for the LSTMs (U(+-1/sqrt(H)), biases too), the concatenation
    layer and the position generator, W_mu, w_sigma; xavier for Salton's W_1 and w_2, b_1 = 0; the
    embedding U(+-0.1) with a zero pad row; the output bias 0. Paper sizes (H = 400)."""
    torch.manual_seed(0)
    model = build_model(arch, ["--task", "language_modeling", "--tokens-per-sample", "35"],
                        task=TinyTask(200), tiny=[])
    dec = model.decoder
    H = dec.hidden_size
    assert H == 400
    for name, largest in _bounds(model, "lstm.").items():  # U(+-0.05), not U(+-0.1)
        assert 0.98 / math.sqrt(H) < largest <= 1 / math.sqrt(H), (name, largest)
    concat = _bounds(model, "concat_proj.")
    assert 0.98 / math.sqrt(2 * H) < concat["concat_proj.weight"] <= 1 / math.sqrt(2 * H)
    assert 0.9 / math.sqrt(2 * H) < concat["concat_proj.bias"] <= 1 / math.sqrt(2 * H)
    embed = dec.embed_tokens.weight
    assert 0.099 < float(embed.abs().max()) <= 0.1 and not embed[dec.padding_idx].any()
    assert not dec.output_bias.any() and dec.share_input_output_embed
    attention = dec.attention
    if arch == "attentive_lstm_lm":
        xavier_1, xavier_2 = math.sqrt(6 / (2 * H)), math.sqrt(6 / (H + 1))
        assert 0.98 * xavier_1 < float(attention.W_1.weight.abs().max()) <= xavier_1
        assert 0.9 * xavier_2 < float(attention.w_2.weight.abs().max()) <= xavier_2
        assert not attention.W_1.bias.any() and attention.w_2.bias is None
    else:
        bound = 1 / math.sqrt(20)
        generator = _bounds(model, "attention.position_generator.")
        assert len(generator) == 4 and all(0.9 * bound < v <= bound for v in generator.values()), generator
        heads = torch.cat([attention.W_mu.weight.flatten(), attention.w_sigma.weight.flatten(),
                           attention.W_mu.bias, attention.w_sigma.bias])
        assert float(heads.abs().max()) <= bound and float(attention.W_mu.weight.abs().max()) > 0.1


def test_the_baseline_starts_as_the_authors_model_without_attention():
    """Dagan's LSTM baseline (their model with attention off): PyTorch's LSTM defaults over 3 layers, the
    embedding U(+-0.1) with a zero pad row, tied, output bias 0; nothing else."""
    torch.manual_seed(0)
    model = build_model("baseline_lstm_lm", ["--task", "language_modeling"], task=TinyTask(200), tiny=[])
    dec = model.decoder
    lstm = _bounds(model, "lstm.")
    assert len(lstm) == 12 and all(0.98 / 20 < largest <= 1 / 20 for largest in lstm.values()), lstm  # 1/sqrt(400)
    embed = dec.embed_tokens.weight
    assert 0.099 < float(embed.abs().max()) <= 0.1 and not embed[dec.padding_idx].any()
    assert not dec.output_bias.any() and dec.share_input_output_embed
    assert {name for name, _ in dec.named_parameters()} == {"embed_tokens.weight", "output_bias", *lstm}


@pytest.mark.parametrize("arch", ARCHS)
def test_uniform_initialisation(arch):
    """``--attentive-lm-init uniform``: every weight and bias U(+-0.1) (the paper's text), output bias 0."""
    torch.manual_seed(0)
    model = build_model(arch, ["--task", "language_modeling", "--tokens-per-sample", "35",
                               "--attentive-lm-init", "uniform"], task=TinyTask(200), tiny=[])
    dec = model.decoder
    for name, p in dec.named_parameters():
        largest = float(p.abs().max())
        if name == "output_bias":
            assert largest == 0.0
        elif p.numel() >= 400:  # enough draws to reach near the bound
            assert 0.099 < largest <= 0.1, (name, largest)
        else:
            assert largest <= 0.1, (name, largest)
    attention = dec.attention
    if arch == "attentive_lstm_lm":
        assert float(attention.W_1.bias.abs().max()) > 0.09  # U(+-0.1), not 0
    assert not dec.embed_tokens.weight[dec.padding_idx].any()


def test_untied_output_layer_and_unknown_init():
    torch.manual_seed(0)
    model = build_model("attentive_lstm_lm", [*TINY, "--no-share-decoder-input-output-embed"],
                        task=TinyTask(200), tiny=[])
    fc_out = model.decoder.fc_out
    assert 0.099 < float(fc_out.weight.abs().max()) <= 0.1 and not fc_out.bias.any()
    from fairseq_posattn.models.attentive_lstm.decoder import AttentiveLSTMDecoder

    with pytest.raises(ValueError, match="--attentive-lm-init"):
        AttentiveLSTMDecoder(TinyTask().target_dictionary, embed_dim=8, hidden_size=8, out_embed_dim=8,
                             init="xavier")


def test_initialisation_is_only_for_new_models():
    """Loading a checkpoint replaces the initialisation: ``uniform`` and ``authors`` models that load
    the same state dict compute the same function."""
    uniform = positional(["--attentive-lm-init", "uniform"], seed=5)
    authors = positional(seed=6)
    authors.load_state_dict(uniform.state_dict(), strict=True)
    assert torch.equal(log_probs(authors), log_probs(uniform))


# ---------------------------------------------------------------------------------------------- real tools
SAMPLE = os.path.join(REPO, "data", "ptb_sample")


def eval_loss(data_bin: str, checkpoint: str, *extra: str) -> str:
    """fairseq-eval-lm's loss (base 2) on the valid split, as printed, from a fresh process."""
    result = run("fairseq-eval-lm", [data_bin, "--path", checkpoint, "--user-dir", USER_DIR, "--gen-subset", "valid",
                                     "--batch-size", "20", "--cpu", "--num-workers", "0", "--tokens-per-sample", "35",
                                     *extra])
    found = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity", result.stdout + result.stderr)
    assert found, (result.stdout + result.stderr)[-3000:]
    return found[1]


@pytest.mark.slow
def test_a_checkpoint_of_fairseq_train_without_version_evaluates_with_eps_1e6(tmp_path):
    """fairseq-train (2 updates, defaults: eps 1e-3), then its checkpoint as a model trained before
    the change had saved it (no ``version``): fairseq's loading (checkpoint_utils, fairseq-eval-lm in
    a fresh process) computes it with eps 1e-6, the same loss as the checkpoint with its eps
    overridden to 1e-6, and another than the checkpoint as trained."""
    from fairseq import checkpoint_utils

    data_bin = str(tmp_path / "data-bin")
    run("fairseq-preprocess", ["--only-source", "--task", "language_modeling", "--workers", "1", "--destdir", data_bin,
                               "--trainpref", f"{SAMPLE}/train.txt", "--validpref", f"{SAMPLE}/valid.txt"])
    save_dir = tmp_path / "checkpoints"
    run("fairseq-train", [data_bin, "--task", "language_modeling", "--user-dir", USER_DIR,
                          "--arch", "positional_attentive_lstm_lm", "--decoder-embed-dim", "32",
                          "--decoder-hidden-size", "32", "--positional-attention-hidden", "8",
                          "--sample-break-mode", "eos", "--tokens-per-sample", "35", "--max-target-positions", "128",
                          "--optimizer", "sgd", "--lr", "1", "--clip-norm", "0.25", "--batch-size", "20",
                          "--max-update", "2", "--cpu", "--seed", "1", "--num-workers", "0", "--disable-validation",
                          "--no-epoch-checkpoints", "--save-dir", str(save_dir), "--log-format", "simple"])
    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert torch.equal(state["model"][VERSION], torch.tensor([2]))
    # as sharpen(): a sharp Gaussian between two positions, where eps decides the attention, and
    # (after 2 updates the model predicts about uniformly) the tied embedding 10x: eps 1e-3 and 1e-6
    # then differ by about 0.01 in the loss, where fairseq-eval-lm prints 4 decimals
    weights = state["model"]
    weights["decoder.embed_tokens.weight"].mul_(10)
    weights["decoder.attention.W_mu.weight"].zero_()
    weights["decoder.attention.W_mu.bias"].copy_(torch.tensor([0.0, 0.0, 0.45]))
    weights["decoder.attention.w_sigma.weight"].zero_()
    weights["decoder.attention.w_sigma.bias"].fill_(math.log(0.01 / 0.99))
    weights["decoder.concat_proj.weight"].mul_(20)
    current, legacy = str(tmp_path / "current.pt"), str(tmp_path / "legacy.pt")
    torch.save(state, current)
    del state["model"][VERSION], state["model"][RECORD]
    torch.save(state, legacy)

    (model,), _ = checkpoint_utils.load_model_ensemble([legacy])
    assert model.decoder.attention.eps == 1e-6 and torch.equal(model.decoder.attention.version, torch.tensor([1]))
    (model,), _ = checkpoint_utils.load_model_ensemble([current])
    assert model.decoder.attention.eps == 1e-3
    overrides = {"positional_attention_eps": 1e-6, "decoder_reset_position_options": True}  # another function: said
    (model,), _ = checkpoint_utils.load_model_ensemble([current], arg_overrides=overrides)
    assert model.decoder.attention.eps == 1e-6

    as_legacy = eval_loss(data_bin, legacy)
    forced = eval_loss(data_bin, current, "--model-overrides", str(overrides))
    as_trained = eval_loss(data_bin, current)
    print(f"\nvalid loss (base 2): without version {as_legacy}, eps overridden to 1e-6 {forced}, "
          f"as trained (1e-3) {as_trained}")
    assert as_legacy == forced != as_trained, (as_legacy, forced, as_trained)


# ---------------------------------------------------------------------------------------------- recipe
AUTHORS_LR, AUTHORS_CLIP, AUTHORS_WEIGHT_DECAY = 30.0, 0.25, 1.2e-6


def one_update(data_bin: str, save_dir: str, lr: float, *extra: str) -> Dict[str, torch.Tensor]:
    """The weights after fairseq-train's first update: a tiny fairseq ``lstm_lm`` without dropout, seed 1, the
    whole training set (20 sentences) as one batch, SGD without momentum, weight decay and clip-norm as the
    authors' (run_ptb.sh's OPTIMIZER=paper); lr 0 leaves the initial weights."""
    run("fairseq-train", [data_bin, "--task", "language_modeling", "--user-dir", USER_DIR, "--arch", "lstm_lm",
                          "--decoder-embed-dim", "32", "--decoder-hidden-size", "32", "--decoder-out-embed-dim", "32",
                          "--decoder-layers", "2", "--share-decoder-input-output-embed", "--dropout", "0",
                          "--sample-break-mode", "eos", "--tokens-per-sample", "35", "--max-target-positions", "128",
                          "--optimizer", "sgd", "--lr", str(lr), "--weight-decay", str(AUTHORS_WEIGHT_DECAY),
                          "--clip-norm", str(AUTHORS_CLIP), "--batch-size", "20", "--required-batch-size-multiple", "1",
                          "--max-update", "1", "--cpu", "--seed", "1", "--num-workers", "0", "--disable-validation",
                          "--no-epoch-checkpoints", "--save-dir", save_dir, "--log-format", "simple", *extra])
    return torch.load(os.path.join(save_dir, "checkpoint_last.pt"), map_location="cpu", weights_only=False)["model"]


@pytest.mark.slow
def test_the_gradient_per_sentence_takes_the_authors_step(tmp_path):
    """The authors' update (train.py): the cross-entropy *summed* over the batch's target tokens, its gradient
    clipped to norm 0.25 (torch's clip_grad_norm_), SGD lr 30 with weight decay 1.2e-6. Re-implemented here from
    the initial weights, it is the update fairseq-train makes with --sentence-avg (OPTIMIZER=paper's default):
    clipping rescales any gradient longer than 0.25 to 0.25, and the one per sentence is. fairseq's default
    gradient per target token is shorter than 0.25 here, so it is not clipped and its step is another."""
    from fairseq import checkpoint_utils
    from cli_helpers import preprocess_in_process

    for split, lines in (("train", 20), ("valid", 5)):
        with open(os.path.join(SAMPLE, f"{split}.txt")) as source, open(tmp_path / f"{split}.txt", "w") as sample:
            sample.writelines(source.readlines()[:lines])
    data_bin = str(tmp_path / "data-bin")
    preprocess_in_process(["--only-source", "--task", "language_modeling", "--workers", "1", "--destdir", data_bin,
                           "--trainpref", tmp_path / "train.txt", "--validpref", tmp_path / "valid.txt"])
    initial = str(tmp_path / "initial")
    start = one_update(data_bin, initial, 0.0)
    per_sentence = one_update(data_bin, str(tmp_path / "sentence"), AUTHORS_LR, "--sentence-avg")
    per_token = one_update(data_bin, str(tmp_path / "token"), AUTHORS_LR)

    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task([os.path.join(initial, "checkpoint_last.pt")])
    model.train()  # no dropout: the same function as in training
    task.load_dataset("train")
    dataset = task.dataset("train")
    batch = dataset.collater([dataset[i] for i in range(len(dataset))])
    assert batch["nsentences"] == 20
    logits = model(**batch["net_input"])[0]
    summed = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["target"].reshape(-1),
                                               ignore_index=task.dictionary.pad(), reduction="sum")
    summed.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), AUTHORS_CLIP).item()
    torch.optim.SGD(model.parameters(), lr=AUTHORS_LR, weight_decay=AUTHORS_WEIGHT_DECAY).step()
    authors = model.state_dict()
    assert norm / batch["ntokens"] < AUTHORS_CLIP < norm / batch["nsentences"]  # per token: not clipped

    for name, weight in authors.items():  # steps up to ~1 at lr 30: fp32 rounding of the gradient moves them by ~1e-6
        torch.testing.assert_close(per_sentence[name], weight, rtol=0, atol=1e-5)
    length = torch.cat([(authors[name] - weight).flatten() for name, weight in start.items()]).norm().item()
    token_length = torch.cat([(per_token[name] - weight).flatten() for name, weight in start.items()]).norm().item()
    print(f"\nstep lengths: the authors' {length:.3f} (lr x 0.25 = 7.5), per token {token_length:.3f}")
    assert length == pytest.approx(AUTHORS_LR * AUTHORS_CLIP, rel=1e-3)  # the weight decay adds next to nothing
    assert token_length < 0.99 * length


def test_the_evidence_plan_keeps_the_recorded_lstm_settings(tmp_path):
    """run_ptb.sh's OPTIMIZER=paper now adds the authors' weight decay and averages the gradient per sentence,
    and the attentive models start as the authors' code: the evidence plan's LSTM runs pass the settings they were
    recorded with (no weight decay, per-token gradient, U(+-0.1), eps 1e-6, lr patience 5), so that running their
    command again trains the same models; its runs at the authors' budget halve the lr as the authors' runs did
    (Salton's after 6 epochs)."""
    import evidence_plan as plan  # examples/evidence/ is on pytest's pythonpath

    settings = plan.Settings.from_env({"EVIDENCE_OUT": str(tmp_path), "TASKS": "lm", "LM_SEEDS": "1",
                                       "PTB_DIR": str(tmp_path / "ptb")})
    runs = {run.system: run for run in plan.build_plan(settings)}
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}

    def dry_run(settings: Dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", os.path.join(REPO, plan.RECIPES["lm"]), "--dry-run"],
                              env={**env, **settings}, capture_output=True, text=True)

    def train_line(settings: Dict[str, str]) -> str:
        printed = dry_run(settings)
        assert printed.returncode == 0, printed.stderr
        return next(line for line in printed.stdout.splitlines() if "fairseq-train" in line)

    for system in plan.LSTM_SYSTEMS:
        train = train_line(runs[system].env)
        assert "--optimizer sgd" in train and "--weight-decay 0 " in train and "--sentence-avg" not in train, train
        assert ("--attentive-lm-init uniform" in train) == (system != "lstm_lm"), train
        assert ("--positional-attention-eps 1e-6" in train) == (system == "positional_attentive_lstm_lm"), train
        assert "--lr-patience 5 " in train, train
    for system, model in plan.LSTM_AUTHORS_SYSTEMS.items():  # the authors' runs: Salton's model waits 6 epochs
        train = train_line(runs[system].env)
        patience = 6 if model == "attentive_lstm_lm" else 5
        assert f"--lr-patience {patience} " in train and "--weight-decay 1.2e-6 " in train, train
        assert "--sentence-avg" in train, train
    train = train_line({"OUT": str(tmp_path / "plain"), "MODELS": "positional_attentive_lstm_lm", "OPTIMIZER": "paper"})
    assert "--weight-decay 1.2e-6" in train and "--attentive-lm-init" not in train and "--sentence-avg" in train
    assert "--positional-attention-eps" not in train
    assert "--sentence-avg" not in train_line({"OUT": str(tmp_path / "adam"), "MODELS": "positional_attentive_lstm_lm"})
    refused = dry_run({"OUT": str(tmp_path / "refused"), "LOSS_AVG": "words"})
    assert refused.returncode == 2 and "LOSS_AVG must be sentence or token, got 'words'" in refused.stderr
    refused = dry_run({"OUT": str(tmp_path / "refused"), "PATIENCE": "3"})
    assert refused.returncode == 2 and "PATIENCE needs VALIDATE=1" in refused.stderr
