"""Mixed precision (issue 14): the tagger's RMSprop under fairseq's fp16 / bf16 optimizers, the tagging
criterion's counts without host reads, and a few ``fairseq-train`` updates on CPU with ``--bf16`` and
``--memory-efficient-bf16`` for every model family, on the shipped samples, each checkpoint reloaded.
fp16 training, which fairseq runs on CUDA only, is refused on a CPU with a message naming --bf16
(docs/mixed_precision.md)."""

import copy
import math
import os
import re
from typing import Dict, List

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils, metrics, options
from torch.utils._python_dispatch import TorchDispatchMode

from cli_helpers import (add_structure_in_process, binarize, binarize_classification_in_process, prepare_sample,
                         preprocess_in_process, run, run_failing)
from fairseq_posattn.criterions.pos_tagging import PosTaggingCriterion, tagging_counts
from fairseq_posattn.data.tagged_corpus import AMBIGUOUS_FLAG, OOV_FLAG
from fairseq_posattn.data.tagging_binarize import prepare_tagging_data
from fairseq_posattn.optim.rmsprop import FairseqRMSprop, RMSprop, RMSpropConfig
from model_helpers import REPO, USER_DIR

# ------------------------------------------------------------------------------------ RMSprop --

SHAPES = [(4, 3), (5,), (2, 2, 2)]


def gradients(steps: int, dtype: torch.dtype = torch.float32, seed: int = 1) -> List[List[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=generator).to(dtype) for shape in SHAPES] for _ in range(steps)]


def start_weights(dtype: torch.dtype = torch.float32) -> List[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in SHAPES]


def run_steps(optimizer: torch.optim.Optimizer, params: List[torch.nn.Parameter],
              grads: List[List[torch.Tensor]]) -> None:
    for step in grads:
        for param, grad in zip(params, step):
            param.grad = grad.clone()
        optimizer.step()


@pytest.mark.parametrize("settings", [
    {},  # the paper's: Keras defaults
    {"momentum": 0.9},
    {"weight_decay": 0.01},
    {"momentum": 0.5, "weight_decay": 0.1, "alpha": 0.99, "eps": 1e-3},
], ids=["keras", "momentum", "weight-decay", "all"])
def test_rmsprop_equals_torch_rmsprop(settings):
    config = RMSpropConfig(lr=[0.01], rmsprop_rho=settings.get("alpha", 0.9), rmsprop_eps=settings.get("eps", 1e-7),
                           rmsprop_momentum=settings.get("momentum", 0.0),
                           weight_decay=settings.get("weight_decay", 0.0))
    ours = [torch.nn.Parameter(w) for w in start_weights()]
    theirs = [torch.nn.Parameter(w) for w in start_weights()]
    fairseq_optimizer = FairseqRMSprop(config, ours)
    reference = torch.optim.RMSprop(theirs, lr=0.01, alpha=config.rmsprop_rho, eps=config.rmsprop_eps,
                                    momentum=config.rmsprop_momentum, weight_decay=config.weight_decay)
    grads = gradients(5)
    run_steps(fairseq_optimizer.optimizer, ours, grads)
    run_steps(reference, theirs, grads)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        for key in reference.state[b]:
            if key != "step":
                torch.testing.assert_close(fairseq_optimizer.optimizer.state[a][key], reference.state[b][key])


def test_rmsprop_defaults_are_keras():
    optimizer = FairseqRMSprop(RMSpropConfig(lr=[1e-3]), [torch.nn.Parameter(torch.zeros(2))])
    assert optimizer.optimizer_config == {"lr": 1e-3, "alpha": 0.9, "eps": 1e-7, "momentum": 0.0, "weight_decay": 0.0,
                                          "eps_placement": "outside-root"}


def keras3_rmsprop(weights: np.ndarray, grads: List[np.ndarray], lr: float, rho: float, eps: float,
                   momentum: float) -> np.ndarray:
    """Keras 3's (and tf.keras's) non-centered RMSprop step, written out in float64:
    v <- rho v + (1 - rho) g^2; m <- momentum m + lr g / sqrt(v + eps); w <- w - m."""
    velocity, buffer = np.zeros_like(weights), np.zeros_like(weights)
    for grad in grads:
        velocity = rho * velocity + (1 - rho) * grad ** 2
        buffer = momentum * buffer + lr * grad / np.sqrt(velocity + eps)
        weights = weights - buffer
    return weights


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_rmsprop_inside_root_is_keras3(momentum):
    """``--rmsprop-eps-placement inside-root`` against Keras 3's rule, with an eps large enough
    (1e-3) that the two placements differ clearly."""
    config = RMSpropConfig(lr=[0.01], rmsprop_eps=1e-3, rmsprop_momentum=momentum,
                           rmsprop_eps_placement="inside-root")
    start = [w.double() for w in start_weights()]
    ours = [torch.nn.Parameter(w.clone()) for w in start]
    grads = [[g.double() for g in step] for step in gradients(5)]
    run_steps(FairseqRMSprop(config, ours).optimizer, ours, grads)
    for index, (param, weights) in enumerate(zip(ours, start)):
        expected = keras3_rmsprop(weights.numpy(), [step[index].numpy() for step in grads], lr=0.01, rho=0.9,
                                  eps=1e-3, momentum=momentum)
        np.testing.assert_allclose(param.detach().numpy(), expected, rtol=1e-10, atol=1e-12)
    outside = [torch.nn.Parameter(w.clone()) for w in start]
    run_steps(FairseqRMSprop(RMSpropConfig(lr=[0.01], rmsprop_eps=1e-3, rmsprop_momentum=momentum), outside).optimizer,
              outside, grads)
    assert max((a - b).abs().max().item() for a, b in zip(ours, outside)) > 1e-4


def test_rmsprop_eps_placement_from_the_command_line():
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "data", "--arch", "transformer", "--optimizer", "rmsprop", "--lr", "0.001",
        "--rmsprop-eps-placement", "inside-root"])
    assert args.rmsprop_eps_placement == "inside-root"
    with pytest.raises(ValueError, match="--rmsprop-eps-placement must be one of outside-root, inside-root"):
        FairseqRMSprop(RMSpropConfig(lr=[1e-3], rmsprop_eps_placement="inside"), [torch.nn.Parameter(torch.zeros(2))])


def test_rmsprop_on_one_flat_parameter_equals_per_parameter():
    """What ``--fp16`` hands the optimizer: one flat fp32 copy of all parameters."""
    separate = [torch.nn.Parameter(w) for w in start_weights()]
    flat = torch.nn.Parameter(torch.cat([w.view(-1) for w in start_weights()]))
    config = RMSpropConfig(lr=[0.01], rmsprop_momentum=0.9)
    on_separate, on_flat = FairseqRMSprop(config, separate), FairseqRMSprop(config, [flat])
    assert on_flat.supports_flat_params
    grads = gradients(4)
    run_steps(on_separate.optimizer, separate, grads)
    run_steps(on_flat.optimizer, [flat], [[torch.cat([g.view(-1) for g in step])] for step in grads])
    torch.testing.assert_close(flat.detach(), torch.cat([p.detach().view(-1) for p in separate]), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsprop_memory_efficient_keeps_fp32_state(dtype):
    """What ``--memory-efficient-{fp16,bf16}`` hands the optimizer: the half-precision parameters.
    Reference: torch's RMSprop on fp32 weights that are rounded to ``dtype`` after each step."""
    config = RMSpropConfig(lr=[0.01], rmsprop_momentum=0.5)
    ours = [torch.nn.Parameter(w) for w in start_weights(dtype)]
    reference = [torch.nn.Parameter(w.float()) for w in start_weights(dtype)]
    optimizer = FairseqRMSprop(config, ours)
    assert optimizer.supports_memory_efficient_fp16
    torch_rmsprop = torch.optim.RMSprop(reference, lr=0.01, alpha=0.9, eps=1e-7, momentum=0.5)
    for step in gradients(5, dtype):
        for param, grad in zip(ours, step):
            param.grad = grad.clone()
        optimizer.step()
        for param, grad in zip(reference, step):
            param.grad = grad.float()
        torch_rmsprop.step()
        with torch.no_grad():
            for param in reference:
                param.copy_(param.to(dtype).float())
    for a, b in zip(ours, reference):
        assert a.dtype == dtype
        torch.testing.assert_close(a.detach().float(), b.detach(), rtol=0, atol=0)
        state = optimizer.optimizer.state[a]
        assert state["square_avg"].dtype == state["momentum_buffer"].dtype == torch.float32
        torch.testing.assert_close(state["square_avg"], torch_rmsprop.state[b]["square_avg"], rtol=1e-6, atol=1e-9)


def test_rmsprop_resumes_from_a_torch_rmsprop_state():
    """Checkpoints written while ``--optimizer rmsprop`` wrapped torch.optim.RMSprop still resume."""
    ours, theirs = [torch.nn.Parameter(w) for w in start_weights()], [torch.nn.Parameter(w) for w in start_weights()]
    reference = torch.optim.RMSprop(theirs, lr=0.01, alpha=0.9, eps=1e-7)
    grads = gradients(6)
    run_steps(reference, theirs, grads[:3])
    with torch.no_grad():
        for a, b in zip(ours, theirs):
            a.copy_(b)
    optimizer = RMSprop(ours, lr=0.01)
    optimizer.load_state_dict(copy.deepcopy(reference.state_dict()))  # as from a checkpoint file
    run_steps(optimizer, ours, grads[3:])
    run_steps(reference, theirs, grads[3:])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("field, value, option", [
    ("rmsprop_rho", 1.0, "--rmsprop-rho must be in \\[0, 1\\)"),
    ("rmsprop_eps", -1e-7, "--rmsprop-eps must be >= 0"),
    ("weight_decay", -0.1, "--weight-decay must be >= 0"),
])
def test_rmsprop_option_errors_name_the_option(field, value, option):
    with pytest.raises(ValueError, match=option):
        FairseqRMSprop(RMSpropConfig(lr=[0.01], **{field: value}), [torch.nn.Parameter(torch.zeros(2))])


# ---------------------------------------------------------------------- the tagging criterion --

class HostReads(TorchDispatchMode):
    """Counts reads of a tensor's value by the host (``int()``, ``bool()``, ``.item()``: on a GPU,
    each waits for the device)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def test_tagging_counts_stay_on_the_device_and_reduce_to_percentages():
    pad = 1
    target = torch.tensor([[4, 5, 6, pad], [5, 5, pad, pad]])
    predicted = torch.tensor([[4, 4, 6, 5], [5, 6, 4, 4]])
    flags = torch.tensor([[OOV_FLAG, AMBIGUOUS_FLAG, 0, 0], [AMBIGUOUS_FLAG, OOV_FLAG, 0, 0]])
    with HostReads() as reads:
        counts = tagging_counts(predicted, target, flags, pad)
    assert reads.count == 0
    assert all(torch.is_tensor(v) and v.dim() == 0 for v in counts.values())
    assert {k: int(v) for k, v in counts.items()} == {
        "n_words": 5, "n_correct": 3, "n_oov": 2, "n_correct_oov": 1, "n_ambiguous": 2, "n_correct_ambiguous": 1}
    logs = [{"loss": torch.tensor(4.0), "sample_size": 5, **counts}, {"loss": torch.tensor(2.0), "sample_size": 1,
            **tagging_counts(target[:1, :1], target[:1, :1], flags[:1, :1], pad)}]
    with metrics.aggregate() as aggregated:
        PosTaggingCriterion.reduce_metrics(logs)
        values = aggregated.get_smoothed_values()
    assert values["accuracy"] == pytest.approx(100 * 4 / 6, abs=0.01)  # logged to 2 decimals
    assert values["oov_accuracy"] == pytest.approx(100 * 2 / 3, abs=0.01)
    assert values["ambiguous_accuracy"] == pytest.approx(50.0)
    assert values["loss"] == pytest.approx(6.0 / 6 / math.log(2), abs=1e-3)


# ---------------------------------------------------- fairseq-train --bf16 on CPU, every family --

PTB = os.path.join(REPO, "data", "ptb_sample")
SST2 = os.path.join(REPO, "data", "sst2_sample")
EWT = os.path.join(REPO, "data", "ud_ewt_sample")
UPDATES = 3
TRAINING = ["--user-dir", USER_DIR, "--cpu", "--seed", "1", "--max-update", str(UPDATES), "--num-workers", "0",
            "--log-format", "simple", "--log-interval", "1", "--no-epoch-checkpoints",
            "--required-batch-size-multiple", "1"]
ONE_THREAD = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
ADAM = ["--optimizer", "adam", "--lr", "0.001"]
TRANSFORMER = [
    "--arch", "transformer_posattn", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--max-source-positions", "128", "--max-target-positions", "128", "--share-all-embeddings",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "2000", *ADAM,
]
LM = ["--task", "language_modeling", "--sample-break-mode", "eos", "--tokens-per-sample", "64",
      "--batch-size", "16", *ADAM]
FAMILIES = {  # name -> (data fixture, flags)
    "transformer": ("translation_bin", [
        *TRANSFORMER, "--encoder-no-token-positional-embeddings", "--encoder-direct-position", "both",
        "--encoder-learnable-temperature", "--encoder-conv-attention", "2d", "--encoder-distance-aware",
        "--encoder-relative-positions", "4", "--decoder-direct-position", "both", "--decoder-conv-attention", "1d",
        "--decoder-distance-aware", "--decoder-relative-positions", "4", "--decoder-learnable-temperature"]),
    "structural": ("structural_bin", [
        *TRANSFORMER, "--task", "translation_structural", "--encoder-structural-positions", "both",
        "--encoder-structural-fusion", "nonlinear", "--encoder-relative-positions", "4"]),
    "transformer_lm": ("ptb_bin", [
        *LM, "--arch", "transformer_lm_posattn", "--decoder-layers", "1", "--decoder-embed-dim", "32",
        "--decoder-input-dim", "32", "--decoder-output-dim", "32", "--decoder-ffn-embed-dim", "64",
        "--decoder-attention-heads", "2", "--share-decoder-input-output-embed", "--max-target-positions", "64",
        "--decoder-direct-position", "both", "--decoder-distance-aware", "--decoder-relative-positions", "4",
        "--decoder-conv-attention", "2d", "--decoder-learnable-temperature"]),
    "attentive_lstm_lm": ("ptb_bin", [
        *LM, "--arch", "attentive_lstm_lm", "--decoder-embed-dim", "32", "--decoder-hidden-size", "32"]),
    "positional_attentive_lstm_lm": ("ptb_bin", [
        *LM, "--arch", "positional_attentive_lstm_lm", "--decoder-embed-dim", "32", "--decoder-hidden-size", "32",
        "--positional-attention-hidden", "8"]),
    "san_tagger": ("tagging_bin", [
        "--task", "pos_tagging", "--criterion", "pos_tagging", "--arch", "san_tagger", "--word-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--char-cnn-filters", "16", "--position-embedding", "none",
        "--encoder-direct-position", "both", "--encoder-learnable-temperature", "--encoder-conv-attention", "1d",
        "--optimizer", "rmsprop", "--lr", "0.003", "--max-tokens", "1000"]),
    "classifier": ("classification_bin", [
        "--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
        "--max-positions", "64", "--arch", "transformer_posattn_classifier", "--encoder-layers", "1",
        "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--no-token-positional-embeddings", "--encoder-distance-aware", "--encoder-relative-positions", "4",
        "--batch-size", "32", *ADAM]),
}


def train(args: List[str], failing: bool = False):
    """fairseq-train in a subprocess, one thread (the test machine's cores are shared)."""
    return (run_failing if failing else run)("fairseq-train", [*args, *TRAINING], env=ONE_THREAD)


@pytest.fixture(scope="module")
def translation_corpus(tmp_path_factory) -> Dict[str, str]:
    """The first 120 lines of each Multi30k split, tokenized, BPE-split and binarized."""
    root = tmp_path_factory.mktemp("multi30k_mixed")
    prepared = prepare_sample(str(root), lines=120)
    data_bin = str(root / "data-bin")
    binarize(prepared, data_bin)
    return {"prepared": prepared, "data_bin": data_bin}


@pytest.fixture(scope="module")
def translation_bin(translation_corpus) -> str:
    return translation_corpus["data_bin"]


@pytest.fixture(scope="module")
def structural_bin(translation_corpus) -> str:
    """The same corpus with spaCy parses of its source side as structural side data."""
    data_bin = translation_corpus["data_bin"]
    add_structure_in_process(translation_corpus["prepared"], data_bin, ["train", "valid"])
    return data_bin


@pytest.fixture(scope="module")
def ptb_bin(tmp_path_factory) -> str:
    destdir = str(tmp_path_factory.mktemp("ptb_mixed") / "data-bin")
    preprocess_in_process(["--only-source", "--task", "language_modeling", "--trainpref", f"{PTB}/train.txt",
                           "--validpref", f"{PTB}/valid.txt", "--destdir", destdir, "--workers", "1"])
    return destdir


@pytest.fixture(scope="module")
def tagging_bin(tmp_path_factory) -> str:
    destdir = str(tmp_path_factory.mktemp("ewt_mixed") / "data-bin")
    prepare_tagging_data({"train": [f"{EWT}/en_ewt-ud-train.sample.conllu"],
                          "valid": [f"{EWT}/en_ewt-ud-dev.sample.conllu"]}, destdir)
    return destdir


@pytest.fixture(scope="module")
def classification_bin(tmp_path_factory) -> str:
    sources = {"train": f"{SST2}/stsa.binary.train", "valid": f"{SST2}/stsa.binary.dev"}
    return binarize_classification_in_process(sources, str(tmp_path_factory.mktemp("sst2_mixed")), labels=["0", "1"])


def logged(output: str, kind: str) -> List[Dict[str, float]]:
    """The ``key=value`` (train_inner) or ``| key value`` (valid) fields of fairseq's simple log lines."""
    if kind == "train_inner":
        lines = [l.split("train_inner |", 1)[1] for l in output.splitlines() if "| train_inner |" in l]
        return [{k: float(v) for k, v in re.findall(r"(\w+)=([-+\w.]+)", l)} for l in lines]
    lines = [l.split("valid on 'valid' subset", 1)[1] for l in output.splitlines() if "valid on 'valid' subset" in l]
    return [{k: float(v) for k, v in re.findall(r"\| (\w+) ([-+\w.]+)", l)} for l in lines]


def floating(tensors) -> List[torch.Tensor]:
    return [t for t in tensors if torch.is_tensor(t) and t.is_floating_point()]


def bf16_values(tensor: torch.Tensor) -> bool:
    """Whether every value is a bfloat16 number (fairseq writes bf16 tensors to checkpoints as fp32)."""
    return torch.equal(tensor, tensor.to(torch.bfloat16).to(tensor.dtype))


def reloaded_loss(checkpoint: str, data: str) -> float:
    """Load the checkpoint in this process, as fairseq-generate / -validate do, and score a validation batch."""
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    model, criterion = models[0].eval(), task.build_criterion(cfg.criterion)
    task.load_dataset("valid")
    batches = task.get_batch_iterator(task.dataset("valid"), max_sentences=16, ignore_invalid_inputs=True)
    sample = next(batches.next_epoch_itr(shuffle=False))
    with torch.no_grad():
        loss, sample_size, _ = criterion(model, sample)
    return float(loss) / sample_size


# --memory-efficient-bf16 changes only the optimizer wrapper (bf16 gradients handed to the optimizer,
# which keeps fp32 state): run it for the tagger's RMSprop and for fairseq's Adam on two families.
RUNS = [(family, "--bf16") for family in FAMILIES] + [
    (family, "--memory-efficient-bf16") for family in ("san_tagger", "transformer", "positional_attentive_lstm_lm")]


@pytest.mark.slow
@pytest.mark.parametrize("family, mode", RUNS, ids=[f"{family}{mode[1:]}" for family, mode in RUNS])
def test_bf16_training_on_cpu(family, mode, request, tmp_path):
    fixture, flags = FAMILIES[family]
    data, save_dir = request.getfixturevalue(fixture), str(tmp_path / "checkpoints")
    result = train([data, *flags, mode, "--save-dir", save_dir])
    output = result.stdout + result.stderr
    steps = logged(output, "train_inner")
    assert [int(s["num_updates"]) for s in steps] == list(range(1, UPDATES + 1)), output[-3000:]
    assert all(math.isfinite(s["loss"]) for s in steps), steps
    validation = logged(output, "valid")
    assert validation and math.isfinite(validation[-1]["loss"]), output[-3000:]

    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)
    assert state["optimizer_history"][-1]["num_updates"] == UPDATES
    # fairseq saves in fp32; the model's weights are bf16 numbers, the optimizer's state is not
    assert all(bf16_values(t) for t in floating(state["model"].values()))
    optimizer_state = [t for s in state["last_optimizer_state"]["state"].values() for t in s.values()]
    assert not all(bf16_values(t) for t in floating(optimizer_state))
    assert math.isfinite(reloaded_loss(checkpoint, data))


@pytest.mark.slow
def test_fp16_training_is_refused_on_cpu(tagging_bin):
    """--memory-efficient-fp16 (like --fp16-no-flatten-grads) would start, then crash at the first overflow."""
    _, flags = FAMILIES["san_tagger"]
    result = train([tagging_bin, *flags, "--memory-efficient-fp16", "--no-save"], failing=True)
    assert "--fp16 / --memory-efficient-fp16 need a CUDA GPU" in result.stderr
    assert "On a CPU use --bf16 or --memory-efficient-bf16" in result.stderr
