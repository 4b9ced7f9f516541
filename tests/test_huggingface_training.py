"""posattn_huggingface models trained as Hugging Face users train them (docs/huggingface.md), on real text: the PTB
sample (data/ptb_sample) by characters, with small Llama and GPT-2 models (tests/huggingface_helpers.py).

- ``transformers.Trainer`` on the CPU in one process, with no method, ALiBi, the T5 bias, KERPLE-log and the posattn
  rotation: the loss falls over 30 steps, the method's parameters are trained, ``trainer.evaluate`` is the loss of
  every token computed by hand, and the model ``trainer.save_model`` wrote loads in a fresh process with the same
  logits;
- ``Trainer`` with DDP over two CPU processes (gloo), launched with ``torch.distributed.run`` as a user launches it
  (tests/huggingface_ddp_train.py): both ranks end with the parameters of one process with their batches together
  (the method's included), the same losses, and the saved model loads with its method;
- activation checkpointing (``activation_checkpointing_enable()``, ``TrainingArguments(activation_checkpointing=
  True)``; transformers 5.24's names, ``gradient_checkpointing*`` are their deprecated aliases): the gradients of
  every parameter are those without it (fp64, no dropout);
- bf16 on the CPU (``TrainingArguments(bf16=True)``'s autocast, and a model cast with ``to(torch.bfloat16)``): finite
  losses and gradients, outputs within bf16's rounding of fp32's.

Every model here runs on one thread (faster for models this small on shared cores), as do the processes started.
"""

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install '.[hf]')")

import posattn_huggingface as hf  # noqa: E402
from cli_helpers import run_python  # noqa: E402
from huggingface_ddp_train import METHOD as DDP_METHOD, STEPS as DDP_STEPS, train as train_like_ddp  # noqa: E402
from huggingface_helpers import (DECODERS, DECODING_METHODS, METHODS, MODELS, collate, cpu_trainer,  # noqa: E402
                                 one_thread, output, ptb_blocks, ptb_lines, training_losses)
from model_helpers import REPO  # noqa: E402
from posattn.kernel_self_check import forget_verdicts  # noqa: E402

#: the methods Trainer trains (position_options' names); "none": the switched model with no method
TRAINED_METHODS: Dict[str, Dict[str, Any]] = {"none": {}, **{name: METHODS[name] for name in (
    "alibi", "t5-bias", "kerple-log")}, "rotary": DECODING_METHODS["rotary"]}
#: the trained methods that have parameters of their own
LEARNED = ("t5-bias", "kerple-log")
TRAINED = [(kind, method) for kind in DECODERS for method in TRAINED_METHODS]
STEPS = 30
#: bf16 keeps 8 bits of mantissa (a relative rounding of 2 ** -8): outputs within a few roundings of fp32's, relative
#: to the largest
BF16_TOLERANCE = 2e-2




def model(kind: str, options: Dict[str, Any], **config: Any) -> Any:
    """A model of ``kind`` (fp32, weights drawn from seed 0) switched to ``options``; ``config``: other values of its
    configuration."""
    torch.manual_seed(0)
    return hf.apply_position_method(MODELS[kind](**config), **options)


def method_parameters(model: Any) -> Dict[str, torch.Tensor]:
    """The learned parameters of the model's methods, by name."""
    return {name: parameter for name, parameter in model.named_parameters() if f".{hf.METHOD_ATTRIBUTE}." in name}


def validation_ids(count: int = 16) -> torch.Tensor:
    """``count`` blocks of 32 characters of the validation text."""
    return torch.tensor([block["input_ids"] for block in ptb_blocks("valid", count, 32)])


def ptb_batch() -> Dict[str, torch.Tensor]:
    """Four sentences of the training text, to 24 characters, padded on the right."""
    return collate(ptb_lines("train", 4, 24))


def falls(losses: List[float], by: float) -> bool:
    """Whether the mean of the last 5 losses is ``by`` below the mean of the first 5."""
    return sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - by


# ----------------------------------------------------------------- (a) Trainer in one process
@dataclass
class Run:
    """One model trained by Trainer: the trainer, its method's parameters before training, where it was saved."""

    trainer: Any
    initial: Dict[str, torch.Tensor]
    saved: Path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Dict[Tuple[str, str], Run]:
    """Every model of :data:`TRAINED`, trained for :data:`STEPS` steps on sentences of the training text (their first
    40 characters, short ones padded on the right), then saved with ``trainer.save_model``."""
    runs = {}
    root = tmp_path_factory.mktemp("trainer")
    for kind, method in TRAINED:
        switched = model(kind, TRAINED_METHODS[method])
        initial = {name: parameter.detach().clone() for name, parameter in method_parameters(switched).items()}
        trainer = cpu_trainer(switched, str(root / "out"), ptb_lines("train", 8 * STEPS, 40), max_steps=STEPS)
        trainer.train()
        saved = root / f"{kind}-{method}"
        trainer.save_model(str(saved))
        runs[kind, method] = Run(trainer, initial, saved)
    return runs


@pytest.mark.parametrize("kind, method", TRAINED)
def test_the_loss_falls_on_real_text(trained, kind, method):
    """From about ln 100 (every token of the vocabulary alike) by more than half a nat in 30 steps."""
    losses = training_losses(trained[kind, method].trainer)
    assert len(losses) == STEPS and all(math.isfinite(loss) for loss in losses)
    assert falls(losses, by=0.5), losses


@pytest.mark.parametrize("kind", DECODERS)
@pytest.mark.parametrize("method", LEARNED)
def test_the_methods_parameters_are_trained(trained, kind, method):
    run = trained[kind, method]
    learned = method_parameters(run.trainer.model)
    assert learned and set(learned) == set(run.initial)
    assert all(not torch.equal(learned[name], run.initial[name]) for name in learned), "a parameter did not change"


#: the labels of a block of 32 characters that transformers 5.24's Trainer divides the loss by: 31 predicted, but for
#: GPT-2 it counts them before the model's shift (GPT2LMHeadModel's loss_type is None, not "ForCausalLM"), so its
#: losses are the mean over the predicted tokens times 31/32 (stock transformers, with or without a method)
COUNTED_LABELS = {"llama": 31, "gpt2": 32}


@pytest.mark.parametrize("kind, method", TRAINED)
def test_evaluate_gives_the_loss_of_every_token(trained, kind, method):
    """Blocks of the validation text, in two batches; the manual loss: one forward pass without a mask."""
    run = trained[kind, method]
    ids = validation_ids()
    metrics = run.trainer.evaluate([{"input_ids": row.tolist()} for row in ids])
    with torch.no_grad():
        logits = run.trainer.model.eval()(input_ids=ids).logits
    total = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
    assert metrics["eval_loss"] == pytest.approx(total.item() / (len(ids) * COUNTED_LABELS[kind]), rel=1e-5)


RELOAD = """
import torch, transformers
import posattn_huggingface as hf
ids = torch.tensor(INPUTS["ids"])
for folder in INPUTS["folders"]:
    model = hf.from_pretrained(getattr(transformers, INPUTS["classes"][folder]), folder).eval()
    with torch.no_grad():
        torch.save(model(input_ids=ids).logits, folder + "/reloaded_logits.pt")
    OUTPUTS[folder] = model.config.posattn_position_method["options"]
"""


def test_a_saved_model_loads_in_a_fresh_process_with_the_same_logits(trained, tmp_path):
    ids = validation_ids(4)
    folders = {str(run.saved): type(run.trainer.model).__name__ for run in trained.values()}
    options = run_python(RELOAD, tmp_path, threads=1, ids=ids.tolist(), folders=list(folders), classes=folders)
    for (kind, method), run in trained.items():
        assert options[str(run.saved)] == TRAINED_METHODS[method], (kind, method)
        with torch.no_grad():
            expected = run.trainer.model.eval()(input_ids=ids).logits
        torch.testing.assert_close(torch.load(run.saved / "reloaded_logits.pt"), expected, rtol=0, atol=0)


# ----------------------------------------------------------------- (b) Trainer with DDP over two processes
@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    """tests/huggingface_ddp_train.py on two processes (gloo): its output folder."""
    out = tmp_path_factory.mktemp("ddp")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               os.path.join(REPO, "tests", "huggingface_ddp_train.py"), str(out)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return out


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Any:
    """The DDP run's model trained in this process, each update on both ranks' batches: its trainer."""
    return train_like_ddp(str(tmp_path_factory.mktemp("one-process")))


def test_ddp_ranks_end_with_the_parameters_of_one_process_with_their_batches(ddp_run, one_process):
    ranks = [torch.load(ddp_run / f"rank{rank}.pt") for rank in (0, 1)]
    expected = dict(one_process.model.named_parameters())
    assert set(ranks[0]) == set(ranks[1]) == set(expected) and method_parameters(one_process.model)
    for name in expected:
        assert torch.equal(ranks[0][name], ranks[1][name]), name
        torch.testing.assert_close(ranks[0][name], expected[name].detach(), rtol=0, atol=1e-10, msg=name)


def test_ddp_losses_fall_and_are_one_processs(ddp_run, one_process):
    losses = json.loads((ddp_run / "losses.json").read_text())
    assert len(losses) == DDP_STEPS and all(math.isfinite(loss) for loss in losses)
    assert falls(losses, by=0.5), losses
    assert losses == pytest.approx(training_losses(one_process), rel=1e-5)


def test_the_ddp_model_loads_with_its_method(ddp_run, one_process):
    loaded = hf.from_pretrained(transformers.LlamaForCausalLM, str(ddp_run / "model"), expected_options=DDP_METHOD,
                                dtype=torch.float64).eval()
    assert method_parameters(loaded)
    ids = validation_ids(4)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, one_process.model.eval()(input_ids=ids).logits,
                                   rtol=0, atol=1e-10)


# ----------------------------------------------------------------- (c) activation checkpointing
NO_DROPOUT = {"llama": {}, "bert": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}}
#: methods with parameters: biases shared by the layers (T5, KERPLE) and BERT's post-softmax 2D convolution
CHECKPOINTED_METHODS = {"t5-bias": METHODS["t5-bias"], "kerple-log": METHODS["kerple-log"],
                        "conv-2d": {"conv_attention": "2d"}}
CHECKPOINTED = [("llama", "t5-bias"), ("llama", "kerple-log"), ("bert", "t5-bias"), ("bert", "conv-2d")]


def gradients(switched: Any, batch: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], int]:
    """The gradient of every parameter that a sum of the outputs' squares reaches (all but BERT's pooler), and how
    many times the layers' self-attention modules ran (twice as many with activation checkpointing: the backward
    pass recomputes them)."""
    switched.train().zero_grad()
    calls = []
    hooks = [module.register_forward_hook(lambda *_: calls.append(1)) for module in switched.modules()
             if hasattr(module, hf.METHOD_ATTRIBUTE)]
    output(switched, batch["input_ids"], batch["attention_mask"]).square().sum().backward()
    for hook in hooks:
        hook.remove()
    return {name: p.grad.clone() for name, p in switched.named_parameters() if p.grad is not None}, len(calls)


@pytest.mark.parametrize("kind, method", CHECKPOINTED)
@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_gives_the_same_gradients(kind, method, reentrant):
    """``use_reentrant=False`` is transformers' default."""
    switched = model(kind, CHECKPOINTED_METHODS[method], **NO_DROPOUT[kind]).double()
    batch = ptb_batch()
    expected, calls = gradients(switched, batch)
    switched.activation_checkpointing_enable({"use_reentrant": reentrant})
    got, recomputed = gradients(switched, batch)
    learned = set(method_parameters(switched))
    assert recomputed == 2 * calls and learned and set(got) == set(expected) >= learned
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-12, msg=name)


def test_trainer_with_activation_checkpointing_trains_as_without_it(tmp_path):
    """A Llama with the T5 bias in fp64, 3 steps: the same parameters."""
    trainers = []
    for checkpointing in (False, True):
        switched = model("llama", METHODS["t5-bias"]).double()
        trainers.append(cpu_trainer(switched, str(tmp_path), ptb_lines("train", 24, 40), max_steps=3,
                                    activation_checkpointing=checkpointing))
        trainers[-1].train()
    assert [trainer.model.is_activation_checkpointing for trainer in trainers] == [False, True]
    expected = dict(trainers[0].model.named_parameters())
    for name, parameter in trainers[1].model.named_parameters():
        torch.testing.assert_close(parameter, expected[name], rtol=0, atol=1e-12, msg=name)


# ----------------------------------------------------------------- (d) bf16
BF16 = [(kind, method) for kind in DECODERS for method in DECODING_METHODS]


@pytest.fixture
def fresh_verdicts() -> Iterator[None]:
    """The fused kernels' self-check runs again in the test, and after it (posattn.kernel_self_check)."""
    forget_verdicts()
    yield
    forget_verdicts()


def assert_bf16_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=BF16_TOLERANCE * expected.abs().max().item())


def assert_trains_finitely(switched: Any, output_dir: str, **arguments: Any) -> None:
    """4 steps of Trainer (``arguments``: other ``TrainingArguments``): finite losses and gradient norms, the loss
    lower at the end, finite parameters."""
    trainer = cpu_trainer(switched, output_dir, ptb_lines("train", 32, 40), max_steps=4, **arguments)
    trainer.train()
    losses = training_losses(trainer)
    norms = [entry["grad_norm"] for entry in trainer.state.log_history if "grad_norm" in entry]
    assert len(losses) == len(norms) == 4 and all(map(math.isfinite, losses + norms)), (losses, norms)
    assert losses[-1] < losses[0], losses
    assert all(torch.isfinite(parameter).all() for parameter in switched.parameters())


@pytest.mark.parametrize("kind, method", BF16)
def test_trainer_bf16_autocast_trains_close_to_fp32(kind, method, tmp_path, fresh_verdicts):
    switched = model(kind, DECODING_METHODS[method]).eval()
    batch = ptb_batch()
    with torch.no_grad():
        expected = output(switched, batch["input_ids"], batch["attention_mask"])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = output(switched, batch["input_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    assert_bf16_close(got[real], expected[real])
    autocast = []
    module = next(module for module in switched.modules() if hasattr(module, hf.METHOD_ATTRIBUTE))
    module.register_forward_hook(lambda *_: autocast.append(torch.is_autocast_enabled("cpu")))
    assert_trains_finitely(switched, str(tmp_path), bf16=True)
    assert autocast and all(autocast), "Trainer(bf16=True) did not autocast"


@pytest.mark.parametrize("kind, method", BF16)
def test_a_bf16_model_trains_close_to_fp32(kind, method, tmp_path, fresh_verdicts):
    switched = model(kind, DECODING_METHODS[method]).eval()
    batch = ptb_batch()
    with torch.no_grad():
        expected = output(switched, batch["input_ids"], batch["attention_mask"])
        got = output(switched.to(torch.bfloat16), batch["input_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    assert_bf16_close(got[real], expected[real])
    assert all(tensor.dtype == torch.bfloat16 for name, tensor in switched.state_dict().items()
               if f".{hf.METHOD_ATTRIBUTE}." in name and tensor.is_floating_point())
    assert_trains_finitely(switched, str(tmp_path))


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_the_kernels_self_check_passes_under_autocast(kind, caplog, fresh_verdicts):
    """The first training pass of a configuration checks the fused path against the explicit one
    (posattn.kernel_self_check) in the dtype autocast computes in: bf16, also where the query reaches the kernel in
    fp32 (Llama's identity rotation gives fp32 cos and sin)."""
    switched = model(kind, METHODS["t5-bias"]).train()
    batch = ptb_batch()
    with caplog.at_level("WARNING", logger="posattn.kernel_self_check"), torch.autocast("cpu", dtype=torch.bfloat16):
        output(switched, batch["input_ids"], batch["attention_mask"])
    assert [record.getMessage() for record in caplog.records if "disagrees" in record.getMessage()] == []
