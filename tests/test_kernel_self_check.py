"""The fused paths' self-check (posattn/kernel_self_check.py): the check's batch, every
fused path of every registered method passing it on the CPU, and a faulty kernel injected where the
kernel calls it (wrong values; NaN gradients): one warning, the explicit path from then on, the explicit
path's numbers; ``error`` stops fairseq-train with one line."""

import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from posattn import attention, kernel_self_check, position_method, position_options
from posattn.attention import FLEX, SDPA
from posattn.kernel_self_check import FusedKernelMismatch, compare_paths, forget_verdicts
from posattn.position_context import PositionContext
from posattn.position_terms.structural import PARSE, StructuralRelativeEmbeddings, \
    binary_tree_side_data
from cli_helpers import error_line, preprocess_in_process
from faulty_kernels import nan_gradient_sdpa, shifted_flex, uncompilable_flex
from model_helpers import REPO, USER_DIR
from test_attention_terms import VARIANTS, applies, batch, build_attention, causal_mask, context
from test_kernel_paths import FUSABLE

CPU = torch.device("cpu")
SDPA_VARIANTS = {name: VARIANTS[name] for name in ("t5-bias", "direct-both-all-layers", "alibi", "rotary")}


@pytest.fixture(autouse=True)
def fresh_verdicts():
    """Every test starts from a process that has checked nothing."""
    forget_verdicts()
    yield
    forget_verdicts()


def test_the_tree_of_the_check_batch_nests_as_its_heap_order_says():
    """tin / tout intervals nest exactly where word a is an ancestor of word b in the heap (a's index
    reached from b's by halving), the depth is the number of halvings, and EOS lies on no path."""
    depth, tin, tout = binary_tree_side_data(23)
    assert (tin[-1], tout[-1]) == (-1, -1)
    words = sorted({token // 2 for token in range(22)})
    token_of = {word: 2 * word for word in words}

    def ancestors(word: int):
        while True:
            yield word
            if word == 0:
                return
            word = (word - 1) // 2
    for a in words:
        assert depth[token_of[a]] == len(list(ancestors(a))) - 1
        for b in words:
            nested = tin[token_of[a]] <= tin[token_of[b]] and tout[token_of[b]] <= tout[token_of[a]]
            assert nested == (a in ancestors(b)), (a, b)


@pytest.mark.parametrize("right_padded,causal", [(False, False), (True, False), (True, True)])
def test_the_check_batch_is_padded_as_the_side_pads(right_padded, causal):
    """The check's batch is padded as the side pads, causal as the side is, and carries the side data its terms
    need: a structural term's parse, on the real tokens only."""
    structural = StructuralRelativeEmbeddings(head_dim=4, clip=2)
    ctx = PositionContext.example((9, 4), right_padded, causal, CPU, [structural])
    assert ctx.padding_mask.sum(dim=1).tolist() == [0, 5]
    assert bool(ctx.padding_mask[1, 0]) == (not right_padded)
    assert ctx.causal == causal and (ctx.positions is None) == right_padded
    assert sorted(ctx.side_data) == sorted(PARSE.fields)
    tin = ctx.side_data["tin"][1]
    assert tin[ctx.padding_mask[1]].eq(-1).all() and tin[~ctx.padding_mask[1]].tolist() == binary_tree_side_data(4)[1]
    assert not PositionContext.example((9, 4), right_padded, causal, CPU).side_data


@pytest.mark.parametrize("variant,causal", [(name, causal) for name in sorted(FUSABLE) for causal in (False, True)
                                            if applies(FUSABLE[name], causal)])
def test_every_flex_form_passes_the_check_on_the_cpu(variant, causal):
    """flex_attention's CPU implementation (forward; torch has no CPU backward) at the check's lengths,
    padded to its block, against the explicit path."""
    attn = build_attention(FUSABLE[variant], causal)
    ctx = PositionContext.example((9, 6), right_padded=causal, causal=causal, device=CPU, terms=attn.all_terms())
    comparison = compare_paths(attn, FLEX, ctx, torch.float64, gradients=False)
    assert comparison.agrees and comparison.largest[1] < 1e-12, comparison


@pytest.mark.parametrize("variant", sorted(SDPA_VARIANTS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_every_sdpa_form_passes_the_check_with_its_gradients(variant, dtype):
    attn = build_attention(SDPA_VARIANTS[variant], causal=True).to(dtype).train()
    ctx = PositionContext.example((9, 6), True, True, device=CPU)
    comparison = compare_paths(attn, SDPA, ctx, dtype, gradients=True)
    learned = {name for name in comparison.errors if name.startswith("grad ") and "." in name}
    assert learned == {f"grad {name}" for name, _ in attn.learned_position_parameters()}
    assert comparison.agrees, comparison


def test_a_parameter_whose_exact_gradient_is_zero_raises_no_false_alarm():
    """FIRE's output bias adds one constant per head to every logit of a row, which the softmax cancels: its exact
    gradient is zero, and both paths give rounding noise (next to the direct positions the SDPA path's order of
    sums differs). Measured against its own magnitude the noise read as a relative error of 0.6 to 1.2 in fp32 and
    the configuration fell back to the explicit path; against the largest gradient of FIRE's parameters, 2e-6."""
    options = position_options(True, 64, fire=True, direct_position="both")
    attn = position_method(4, 8, causal=True, options=options, layer_index=0).train()
    comparison = compare_paths(attn, SDPA, PositionContext.example((9, 6), True, True, device=CPU), torch.float32,
                               gradients=True)
    assert comparison.agrees and comparison.largest[1] < 1e-4, comparison
    assert kernel_self_check.module_scales(["q", "FireBias.c", "FireBias.mlp_out.bias"],
                                           [torch.ones(1), torch.full((1,), -3.0), torch.zeros(4)]) == {
        "q": 1.0, "FireBias": 3.0}


def test_the_check_is_no_longer_than_the_sequences_its_side_takes():
    """FIRE's MLP runs on every (query, key) pair: a 200-token check of a model built for 16 tokens would cost
    (200 / 16)^2 times its own batches (4 GB at 8,000 hidden units, where training used 26 MB)."""
    short = position_method(2, 8, causal=True, options=position_options(True, 16, fire=True, fire_hidden=8000))
    assert kernel_self_check.check_lengths(short) == (16, 10)
    long = position_method(2, 8, causal=True, options=position_options(True, 4096, fire=True))
    assert kernel_self_check.check_lengths(long) == kernel_self_check.CHECK_LENGTHS


def test_a_flex_kernel_with_wrong_values_warns_once_and_scores_as_the_explicit_path(monkeypatch, caplog):
    monkeypatch.setattr(attention, "flex_kernel", shifted_flex)
    attn = build_attention(FUSABLE["distance-aware"], causal=False)
    attn.kernel = "flex"
    x, mask = batch("left")
    with caplog.at_level(logging.INFO), torch.no_grad():
        outputs = [attn(x, x, x, key_padding_mask=context(mask, x), need_weights=False)[0] for _ in range(2)]
        attn.kernel = "explicit"
        explicit = attn(x, x, x, key_padding_mask=context(mask, x), need_weights=False)[0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert re.search(r"the flex_attention kernel against the explicit path \(float64, bidirectional, "
                     r"left-padded, scoring, lengths 9/6\) disagrees: largest relative error .* in output "
                     r"\(tolerance 1e-09\); torch .*, CUDA .*\. This configuration takes the explicit path "
                     r"for the rest of the process \(--encoder-attention-self-check error stops instead\)",
                     warnings[0]), warnings[0]
    for output in outputs:
        torch.testing.assert_close(output, explicit, rtol=0, atol=0)


def test_a_flex_kernel_that_fails_to_compile_warns_with_its_error_and_scores_as_the_explicit_path(
        monkeypatch, caplog):
    monkeypatch.setattr(attention, "flex_kernel", uncompilable_flex)
    attn = build_attention(FUSABLE["t5-bias"], causal=True)
    attn.kernel = "flex"
    x, mask = batch("right")
    call = dict(key_padding_mask=context(mask, x, causal=True), attn_mask=causal_mask(x.size(0)), need_weights=False)
    with caplog.at_level(logging.WARNING), torch.no_grad():
        output = attn(x, x, x, **call)[0]
        attn.kernel = "explicit"
        explicit = attn(x, x, x, **call)[0]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert ("disagrees: it failed to run (RuntimeError: No valid triton configs. OutOfMemoryError: out of "
            "resource: triton_tem_fused_flex_attention_0 Required: 245760 Hardware limit:232448); torch") in warning
    torch.testing.assert_close(output, explicit, rtol=0, atol=0)


def train_step_gradients(attn, x, mask):
    attn.zero_grad()
    xs = x.detach().requires_grad_()
    out = attn(xs, xs, xs, key_padding_mask=context(mask, xs, causal=True),
               attn_mask=causal_mask(x.size(0)), need_weights=False)[0]
    out.square().sum().backward()
    return [xs.grad, *(p.grad for p in attn.parameters())]


def test_nan_gradients_of_sdpa_fall_back_in_training_to_the_explicit_gradients(monkeypatch, caplog):
    """T5's learned bias takes SDPA on the CPU; its NaN backward is caught before the first step."""
    x, mask = batch("right")
    attn = build_attention(VARIANTS["t5-bias"], causal=True).train()
    assert attn.path(False, CPU, decoding=False)[0] == SDPA
    attn.kernel = "explicit"
    expected = train_step_gradients(attn, x, mask)
    attn.kernel = "auto"
    monkeypatch.setattr(attention, "masked_sdpa", nan_gradient_sdpa)
    with caplog.at_level(logging.WARNING):
        got = train_step_gradients(attn, x, mask)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == kernel_self_check.__name__]
    assert "the sdpa (float mask) kernel against the explicit path (float64, causal, right-padded, training" in warning
    assert "largest relative error inf in grad q" in warning
    for g, e in zip(got, expected):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_error_mode_raises_a_user_error(monkeypatch):
    monkeypatch.setattr(attention, "flex_kernel", shifted_flex)
    attn = build_attention(FUSABLE["t5-bias"], causal=False)
    attn.kernel, attn.self_check = "flex", "error"
    x, mask = batch("right")
    with pytest.raises(FusedKernelMismatch, match="Stopped by --encoder-attention-self-check error"), \
            torch.no_grad():
        attn(x, x, x, key_padding_mask=context(mask, x), need_weights=False)


def test_one_check_per_configuration_and_none_when_off(monkeypatch):
    calls = []
    real_check = kernel_self_check.self_check
    monkeypatch.setattr(kernel_self_check, "self_check", lambda *args: calls.append(args[1]) or real_check(*args))
    x, mask = batch("right")
    layers = [build_attention(VARIANTS["alibi"], causal=True, seed=seed).train() for seed in range(3)]
    for attn in layers:  # three layers of one configuration, two calls each
        for _ in range(2):
            attn(x, x, x, key_padding_mask=context(mask, x, causal=True), attn_mask=causal_mask(x.size(0)),
                 need_weights=False)
    assert calls == [SDPA]
    layers[0].eval()(x, x, x, key_padding_mask=context(mask, x, causal=True), attn_mask=causal_mask(x.size(0)),
                     need_weights=False)
    assert calls == [SDPA, SDPA]  # scoring is another configuration
    off = build_attention(VARIANTS["t5-bias"], causal=True)
    off.self_check = "off"
    off(x, x, x, key_padding_mask=context(mask, x, causal=True), attn_mask=causal_mask(x.size(0)), need_weights=False)
    assert calls == [SDPA, SDPA]


def captured_tensors(function, seen=None):
    """Every tensor a (composed) score_mod closes over, through the closures it calls."""
    seen = set() if seen is None else seen
    if id(function) in seen or not callable(function):
        return []
    seen.add(id(function))
    found = []
    for cell in getattr(function, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                found += captured_tensors(item, seen)
        else:
            found += captured_tensors(value, seen)
    return found


@pytest.mark.parametrize("variant", sorted(FUSABLE))
def test_every_learned_tensor_a_score_mod_captures_is_a_table_in_fp32(variant):
    """A 0-dim learned scalar captured in a score_mod fails to lower on CUDA (pytorch#145208), and flex's
    backward adds a captured tensor's gradient atomically in its dtype (bf16 lost T5's on an H200): every
    learned tensor a score_mod of a bf16 layer reads has a dimension (heads, a table) and is fp32."""
    attn = build_attention(FUSABLE[variant], causal=not applies(FUSABLE[variant], False)).to(torch.bfloat16)
    for term in attn.score_terms():
        for module in term.side_modules():  # a side's own (the model converts them with the side)
            module.to(torch.bfloat16)
    x, mask = batch("left")
    x = x.to(torch.bfloat16)
    ctx = context(mask, x)
    q, k, _ = attn._project(x)
    tensors = captured_tensors(attn.score_mod(ctx, q, k.size(2), attn.token_values(x, ctx)))
    assert tensors or not attn.score_terms()  # RoPE and the temperature change q and k only
    learned = [t for t in tensors if t.requires_grad]
    assert all(t.dim() > 0 and t.dtype == torch.float32 for t in learned), [(t.shape, t.dtype) for t in learned]


#: fairseq-train with the faulty SDPA put where the kernel calls it (tests/ on PYTHONPATH)
FAULTY_TRAIN = """
import sys
import faulty_kernels
from posattn import attention
attention.masked_sdpa = faulty_kernels.nan_gradient_sdpa
sys.argv[0] = "fairseq-train"
from fairseq_cli.train import cli_main
cli_main()
"""


@pytest.fixture(scope="module")
def ptb_bin(tmp_path_factory):
    destdir = str(tmp_path_factory.mktemp("ptb") / "data-bin")
    ptb = os.path.join(REPO, "data", "ptb_sample")
    preprocess_in_process(["--only-source", "--task", "language_modeling", "--workers", "1",
                           "--trainpref", f"{ptb}/train.txt", "--validpref", f"{ptb}/valid.txt",
                           "--destdir", destdir])
    return destdir


def train_t5_lm(ptb_bin, save_dir, *extra, faulty: bool):
    command = [sys.executable, "-c", textwrap.dedent(FAULTY_TRAIN)] if faulty else \
        [os.path.join(os.path.dirname(sys.executable), "fairseq-train")]
    return subprocess.run([
        *command, ptb_bin, "--user-dir", USER_DIR, "--task", "language_modeling",
        "--arch", "transformer_lm_posattn", "--decoder-layers", "2", "--decoder-embed-dim", "32",
        "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2", "--decoder-t5-relative-bias", "8",
        "--tokens-per-sample", "32", "--optimizer", "adam", "--lr", "0.001", "--batch-size", "8",
        "--max-update", "3", "--cpu", "--seed", "1", "--disable-validation", "--no-save",
        "--num-workers", "0", "--log-format", "simple", "--log-interval", "1", "--save-dir", str(save_dir),
        *extra], capture_output=True, text=True, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), REPO])))


def train_losses(log: str):
    """The loss and gradient norm of every update (``--log-interval 1``)."""
    return re.findall(r"loss=([0-9.]+), .* gnorm=([0-9.]+)", log)


@pytest.mark.slow
def test_fairseq_train_with_a_faulty_kernel_warns_and_trains_as_the_explicit_path(ptb_bin, tmp_path):
    explicit = train_t5_lm(ptb_bin, tmp_path / "a", "--decoder-attention-kernel", "explicit", faulty=False)
    assert explicit.returncode == 0, explicit.stderr[-3000:]
    faulty = train_t5_lm(ptb_bin, tmp_path / "b", faulty=True)
    assert faulty.returncode == 0, faulty.stderr[-3000:]
    log = faulty.stdout + faulty.stderr
    warnings = [line for line in log.splitlines() if "self-check" in line and "WARNING" in line]
    assert len(warnings) == 1, warnings
    assert "decoder self-attention, layer 0: the sdpa (float mask) kernel" in warnings[0], warnings
    assert "explicit kernel (the sdpa (float mask) kernel failed its self-check here)" in log
    assert len(train_losses(log)) == 3 and train_losses(log) == train_losses(explicit.stdout + explicit.stderr)

    stopped = train_t5_lm(ptb_bin, tmp_path / "c", "--decoder-attention-self-check", "error", faulty=True)
    assert stopped.returncode == 1
    line = error_line(stopped, "fairseq-train")
    assert "disagrees: largest relative error inf in grad q" in line and "--decoder-attention-self-check warn" in line
