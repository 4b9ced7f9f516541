"""The compiled mu recurrence of ``positional_attentive_lstm_lm`` (Dagan 2019,
``fairseq_posattn/models/attentive_lstm/positional_attention.py``) computes what the eager loop computes:
mu and its gradients (of the weights and of mu before the first step) on random inputs whose clamps bind
at 0 and at t/N, over several compiled calls with a padded last one; the whole model's loss and gradients,
plain, checkpointed and offloaded; step-by-step decoding after a compiled prefix. A compiler that fails
leaves one warning and the eager loop's numbers.

The compiled recurrence is forced on (on the CPU it is off by default) for the module, with one compiled
graph for all its tests (gradients on, batches above 1); on the CPU in calls of 4 steps instead of 35 (the
same function unrolled 4 times, which also puts several calls into every test): its compilation takes
about 20 s on 2 busy cores with an empty inductor cache, that of 35 steps 30-40 s. Every test takes the
``device`` fixture (``pytest --device cuda`` runs them on a GPU, in calls of 35 steps). Where torch is installed
under a path with whitespace (a clone in such a folder), inductor cannot compile C++ (pytorch issue #149713): the
tests that compile skip there, naming the cause, and the model's fallback warning names it with the remedy.
"""

import logging
from typing import Dict, List, Tuple

import pytest
import torch
from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from torch import Tensor

from fairseq_posattn.models.attentive_lstm import positional_attention as pa
from fairseq_posattn.models.attentive_lstm.positional_attention import PositionalAttention
from model_helpers import TinyTask, build_model

CPU_CHUNK = 4
TASK = TinyTask(24)
TINY = ["--task", "language_modeling", "--decoder-embed-dim", "16", "--decoder-hidden-size", "16",
        "--decoder-layers", "2", "--tokens-per-sample", "12", "--dropout", "0",
        "--positional-attention-hidden", "6"]


@pytest.fixture(scope="module")
def chunk(device: torch.device) -> int:
    """The compiled recurrence on for this module (restored afterwards); the steps of one compiled call."""
    saved = pa.COMPILED_MU_STEPS, pa.set_mu_recurrence("compiled")
    pa.COMPILED_MU_STEPS = CPU_CHUNK if device.type == "cpu" else saved[0]
    yield pa.COMPILED_MU_STEPS
    pa.COMPILED_MU_STEPS, _ = saved
    pa.set_mu_recurrence(saved[1])


#: the tests that need inductor's C++ compiler, skipped where it cannot build (torch under a path with whitespace)
needs_inductor = pytest.mark.skipif(pa.inductor_path_obstacle() is not None, reason=str(pa.inductor_path_obstacle()))


def relative_difference(value: Tensor, expected: Tensor) -> float:
    """The largest absolute difference relative to the largest magnitude of ``expected``."""
    return float((value - expected).abs().max() / expected.abs().max().clamp(min=1e-30))


def recurrence(mu_weights: Tensor, prev_mu: Tensor, normalizer: Tensor, offset: int,
               cotangent: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """mu and the gradients of (mu * cotangent).sum() of the weights and of prev_mu."""
    mu_weights, prev_mu = mu_weights.detach().requires_grad_(), prev_mu.detach().requires_grad_()
    mu = PositionalAttention.recur_mu(mu_weights, prev_mu, normalizer, offset)
    return (mu.detach(), *torch.autograd.grad((mu * cotangent).sum(), (mu_weights, prev_mu)))


def eager(function, *args):
    previous = pa.set_mu_recurrence("eager")
    try:
        return function(*args)
    finally:
        pa.set_mu_recurrence(previous)


# kind of weights, batch, steps (in compiled calls: chunks plus), offset
CASES = {
    "relu": ("relu", 4, (2, 3), 0),           # the model's domain: ReLU outputs, exact zeros among them
    "saturated": ("large", 3, (1, 0), 0),     # a_t and b_t large: mu at t/N at almost every step
    "signed": ("signed", 5, (1, 5), 7),       # negative weights too: mu clamped at 0 as well
    "short": ("relu", 3, (0, 2), 2),          # fewer steps than one call
}


@needs_inductor
@pytest.mark.parametrize("case", CASES)
def test_compiled_recurrence_equals_the_eager_loop(chunk, device, case):
    kind, batch, (calls, extra), offset = CASES[case]
    steps = calls * chunk + extra
    generator = torch.Generator().manual_seed(len(case))
    raw = torch.randn(batch, steps, 3, generator=generator)
    mu_weights = {"relu": torch.relu(2 * raw), "large": 2 + 4 * raw.abs(), "signed": 3 * raw}[kind]
    prev_mu = torch.rand(batch, generator=generator) * (offset + 1) / 12
    normalizer = torch.tensor([12.0, 35.0, 20.0, 12.0, 7.0][:batch]).unsqueeze(1)
    cotangent = torch.randn(batch, steps, generator=generator)
    args = [t.to(device) for t in (mu_weights, prev_mu, normalizer)] + [offset, cotangent.to(device)]
    assert pa.uses_compiled_mu(args[0])
    compiled = recurrence(*args)
    expected = eager(recurrence, *args)
    differences = {name: relative_difference(value, reference) for name, value, reference
                   in zip(("mu", "grad mu_weights", "grad prev_mu"), compiled, expected)}
    print(f"\n{case} (B={batch}, S={steps}, offset {offset}, calls of {chunk}): {differences}")
    assert not pa._compile_failures, pa._compile_failures
    assert all(difference <= 1e-6 for difference in differences.values()), differences
    mu, bound = expected[0], (torch.arange(1, steps + 1, device=device) + offset) / args[2]
    if kind == "large":
        assert (mu == bound).float().mean() > 0.9
    if kind == "signed":
        assert (mu == 0).any() and (mu == bound).any() and ((mu > 0) & (mu < bound)).any()
    assert all(torch.isfinite(t).all() for t in compiled)


def positional_model(device: torch.device, flags: List[str] = ()):
    torch.manual_seed(0)
    model = build_model("positional_attentive_lstm_lm", [*TINY, *flags], task=TASK, tiny=[])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # order-1 attention weights: mu moves, and the clamps bind (as test_lstm_lm's)
        for p in model.decoder.attention.parameters():
            p.copy_(torch.rand(p.shape, generator=generator) * 2 - 1)
    return model.to(device)


def loss_and_gradients(model, tokens: Tensor) -> Tuple[Tensor, Dict[str, Tensor]]:
    model.zero_grad()
    target = tokens[:, 1:].contiguous()
    sample = {"net_input": {"src_tokens": tokens[:, :-1]}, "target": target, "ntokens": target.numel()}
    loss, _, _ = CrossEntropyCriterion(TASK, sentence_avg=False)(model, sample)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@needs_inductor
@pytest.mark.parametrize("flags", [[], ["--checkpoint-activations"], ["--offload-activations"]],
                         ids=["plain", "checkpointed", "offloaded"])
def test_whole_model_compiled_equals_eager(chunk, device, flags):
    model = positional_model(device, flags).train()
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, 24, (3, 2 * chunk + 4), generator=generator).to(device)  # 3 calls, the last padded
    loss, grads = loss_and_gradients(model, tokens)
    loss_eager, grads_eager = eager(loss_and_gradients, model, tokens)
    assert not pa._compile_failures, pa._compile_failures
    torch.testing.assert_close(loss, loss_eager, rtol=1e-6, atol=0.0)
    worst = max(grads, key=lambda name: relative_difference(grads[name], grads_eager[name]))
    print(f"\n{flags}: loss {loss.item():.6f} vs {loss_eager.item():.6f}, largest gradient difference "
          f"{relative_difference(grads[worst], grads_eager[worst]):.2e} ({worst})")
    for name, grad in grads.items():
        assert relative_difference(grad, grads_eager[name]) <= 1e-6, name


@needs_inductor
def test_step_by_step_decoding_after_a_compiled_prefix(chunk, device):
    """A compiled prefix (more than one call), then single steps (the eager loop) and a compiled chunk
    continue mu from the cache as the full pass does; gradients on, eval mode (the module's one graph)."""
    model = positional_model(device).eval()
    tokens = torch.randint(4, 24, (2, 2 * chunk + 6), generator=torch.Generator().manual_seed(2)).to(device)
    full = model(tokens)[0]
    state: Dict = {}
    prefix = chunk + 3
    outputs = [model.decoder(tokens[:, :prefix], incremental_state=state)[0]]
    for end in (prefix + 1, prefix + 2, tokens.size(1)):  # two single steps, then the rest at once
        outputs.append(model.decoder(tokens[:, :end], incremental_state=state)[0])
    torch.testing.assert_close(torch.cat(outputs, 1), full, rtol=1e-5, atol=1e-5)
    assert not pa._compile_failures, pa._compile_failures


def test_a_torch_path_with_whitespace_is_the_obstacle_named(monkeypatch):
    for folder in ("/a clone/.venv/lib/python3.11/site-packages/torch", "/envs/a\tb/torch"):
        monkeypatch.setattr(pa, "TORCH_DIR", folder)
        assert pa.inductor_path_obstacle() == (
            f"torch is installed under a path with whitespace ({folder!r}), which inductor passes to the C++ compiler "
            "unquoted (pytorch issue #149713): an environment whose path has no spaces compiles it")
    monkeypatch.setattr(pa, "TORCH_DIR", "/a_clone/.venv/lib/python3.11/site-packages/torch")
    assert pa.inductor_path_obstacle() is None


@pytest.mark.parametrize("torch_dir", ["/envs/plain/torch", "/a clone/.venv/torch"], ids=["plain", "with-space"])
def test_failing_compiler_warns_once_and_gives_the_eager_numbers(chunk, device, caplog, monkeypatch, torch_dir):
    """The warning names the compiler's error; where torch's path has a space, also that cause and the remedy."""
    def failing(*args):
        raise RuntimeError("no C++ compiler found\nsecond line")

    saved = (dict(pa._compile_failures), set(pa._compile_checked))
    monkeypatch.setattr(pa, "compiled_mu_steps", lambda: failing)
    monkeypatch.setattr(pa, "TORCH_DIR", torch_dir)
    pa._compile_failures.clear()  # a real failure of an earlier test (this worker's process) must not hide this one
    pa._compile_checked.clear()
    generator = torch.Generator().manual_seed(3)
    args = (torch.rand(2, chunk + 1, 3, generator=generator).to(device), torch.zeros(2, device=device),
            torch.full((2, 1), 12.0, device=device), 0)
    try:
        with caplog.at_level(logging.WARNING, logger=pa.__name__):
            first = PositionalAttention.recur_mu(*args)
            second = PositionalAttention.recur_mu(*args)
        failures = dict(pa._compile_failures)
    finally:
        pa._compile_failures.clear(), pa._compile_failures.update(saved[0])
        pa._compile_checked.clear(), pa._compile_checked.update(saved[1])
    expected = eager(PositionalAttention.recur_mu, *args)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert failures == {device.type: "RuntimeError: no C++ compiler found"}
    warnings = [r.getMessage() for r in caplog.records if r.name == pa.__name__]
    assert len(warnings) == 1 and "RuntimeError: no C++ compiler found" in warnings[0], warnings
    remedy = f"torch is installed under a path with whitespace ({torch_dir!r}), which inductor passes to the C++ "
    assert (remedy in warnings[0] and warnings[0].endswith("an environment whose path has no spaces compiles it")) \
        == (" " in torch_dir), warnings
