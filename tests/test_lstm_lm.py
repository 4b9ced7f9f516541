"""``attentive_lstm_lm`` (Salton et al. 2017), ``positional_attentive_lstm_lm`` (Dagan 2019) and
``baseline_lstm_lm`` (Dagan's LSTM baseline): attention and whole models against a loop-by-loop
re-implementation of the papers' equations, causality (the paper's sentence normalizer leaks, by design of
the option), incremental decoding, no NaN at the first step, and end to end through fairseq-preprocess /
fairseq-train / fairseq-eval-lm on a PTB slice."""

import math
import os
import re
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

import pytest
import torch
from torch import Tensor

from fairseq_posattn.models.attentive_lstm.decoder import AttentiveLSTMDecoder
from fairseq_posattn.models.attentive_lstm.numerics import SUBNORMAL_GUARD
from fairseq_posattn.models.attentive_lstm.positional_attention import PositionalAttention
from fairseq_posattn.models.attentive_lstm.salton_attention import SaltonAttention
from cli_helpers import run
from model_helpers import REPO, USER_DIR, TinyTask, build_model

ARCHS = ["attentive_lstm_lm", "positional_attentive_lstm_lm"]  # the attentive models
EVERY_ARCH = [*ARCHS, "baseline_lstm_lm"]
BLOCK = 12
TINY_LSTM = [
    "--task", "language_modeling", "--decoder-embed-dim", "32", "--decoder-hidden-size", "32",
    "--decoder-layers", "2", "--tokens-per-sample", str(BLOCK),
]
PAD = TinyTask().target_dictionary.pad()
TOKENS = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 11, 12], [2, 13, 14, 15, 16, 17, 18, 19, 20]])


def build_lstm_lm(arch: str, extra: List[str] = (), seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(arch, [*TINY_LSTM, *extra], task=TinyTask(24), tiny=[])
    assert isinstance(model.decoder, AttentiveLSTMDecoder)
    if model.decoder.attention is not None:
        randomize_attention(model.decoder.attention, seed)
    return model.eval()


def randomize_attention(attention: torch.nn.Module, seed: int, mu_bias: Optional[List[float]] = None) -> None:
    """Weights of order 1 (the initialisation, U(+-0.1) or the authors', makes every attention
    almost uniform, which would test little)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in attention.parameters():
            p.copy_(torch.rand(p.shape, generator=generator) * 2 - 1)
        if mu_bias is not None:
            attention.W_mu.bias.copy_(torch.tensor(mu_bias))


def log_probs(model, tokens: Tensor) -> Tensor:
    return torch.log_softmax(model(tokens)[0], dim=-1)


# ---------------------------------------------------------------------------- reference (loops)
def reference_salton(attention: SaltonAttention, h: Tensor) -> Tensor:
    """c_t = sum_{i<t} softmax_i(w_2 . tanh(W_1 h_i + b_1)) h_i, c_1 = 0; h: B x T x H (float64)."""
    W_1, b_1 = attention.W_1.weight.double(), attention.W_1.bias.double()
    w_2 = attention.w_2.weight.double()[0]
    B, T, H = h.shape
    context = torch.zeros(B, T, H, dtype=torch.float64)
    for b in range(B):
        for t in range(1, T + 1):  # 1-based step
            if t == 1:
                continue
            scores = [float(w_2 @ torch.tanh(W_1 @ h[b, i - 1] + b_1)) for i in range(1, t)]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for i in range(1, t):
                context[b, t - 1] += weights[i - 1] / total * h[b, i - 1]
    return context


def _lstm_cell(x: Tensor, h: Tensor, c: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor):
    """PyTorch's LSTM cell written out (gate order i, f, g, o)."""
    gates = w_ih @ x + b_ih + w_hh @ h + b_hh
    i, f, g, o = gates.chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def reference_positional(attention: PositionalAttention, h: Tensor, N: List[float]) -> Tuple[Tensor, int, int]:
    """Dagan eq. 5-13 as written in docs/methods.md, one sentence and one step at a time.

    Returns the contexts (B x T x H) and how often mu_t hit its upper bound t/N and how often not,
    so that a test can show both branches of the clamp were exercised."""
    gen = attention.position_generator
    w_ih, w_hh = gen.weight_ih_l0.double(), gen.weight_hh_l0.double()
    b_ih, b_hh = gen.bias_ih_l0.double(), gen.bias_hh_l0.double()
    W_mu, b_mu = attention.W_mu.weight.double(), attention.W_mu.bias.double()
    w_sigma, b_sigma = attention.w_sigma.weight.double()[0], float(attention.w_sigma.bias)
    B, T, H = h.shape
    context = torch.zeros(B, T, H, dtype=torch.float64)
    clamped = free = 0
    for b in range(B):
        n = N[b]
        h_tilde = torch.zeros(gen.hidden_size, dtype=torch.float64)
        cell = torch.zeros(gen.hidden_size, dtype=torch.float64)
        mu_prev = 0.0  # mu_0
        for t in range(1, T + 1):
            h_tilde, cell = _lstm_cell(h[b, t - 1], h_tilde, cell, w_ih, w_hh, b_ih, b_hh)  # eq. 5
            mu_weights = torch.relu(W_mu @ h_tilde + b_mu)  # eq. 7
            building_blocks = torch.tensor([mu_prev, 1 / n, t / n], dtype=torch.float64)  # eq. 6
            raw = float(mu_weights @ building_blocks)
            mu = min(max(raw, 0.0), t / n)  # eq. 8, the clamp
            clamped += raw > t / n
            free += raw <= t / n
            sigma = 1 / (1 + math.exp(-(float(w_sigma @ h_tilde) + b_sigma)))  # eq. 9
            mu_prev = mu
            if t == 1:
                continue  # empty memory: c_1 = 0
            gammas = [math.exp(-((i / n - mu) ** 2) / (2 * sigma ** 2 + attention.eps)) for i in range(1, t)]
            total = sum(gammas)  # eq. 11
            if total == 0.0:  # every Gaussian underflowed in float64: not in these tests
                raise AssertionError("choose other random parameters")
            for i in range(1, t):
                context[b, t - 1] += gammas[i - 1] / total * h[b, i - 1]  # eq. 13
    return context, clamped, free


def reference_model_log_probs(model, tokens: Tensor, N: Optional[List[float]] = None) -> Tensor:
    """The whole model with explicit loops over layers and time (eval mode, float64)."""
    dec = model.decoder
    B, T = tokens.shape
    x = dec.embed_tokens.weight.double()[tokens]
    for layer in range(dec.num_layers):
        w = [getattr(dec.lstm, f"{name}_l{layer}").double() for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        outputs = torch.zeros(B, T, dec.hidden_size, dtype=torch.float64)
        for b in range(B):
            h = c = torch.zeros(dec.hidden_size, dtype=torch.float64)
            for t in range(T):
                h, c = _lstm_cell(x[b, t], h, c, *w)
                outputs[b, t] = h
        x = outputs
    if dec.attention_type == "none":  # the baseline: the top layer's states
        out = x
    else:
        if dec.attention_type == "salton":
            context = reference_salton(dec.attention, x)
        else:
            context = reference_positional(dec.attention, x, N or [float(BLOCK)] * B)[0]
        weight, bias = dec.concat_proj.weight.double(), dec.concat_proj.bias.double()
        out = torch.tanh(torch.cat([context, x], -1) @ weight.t() + bias)
    logits = out @ dec.embed_tokens.weight.double().t() + dec.output_bias.double()
    return torch.log_softmax(logits, dim=-1)


# ---------------------------------------------------------------------------- (a) equations
def test_salton_attention_matches_the_equations():
    torch.manual_seed(1)
    attention = SaltonAttention(8)
    randomize_attention(attention, seed=1)
    h = torch.randn(3, 9, 8)
    context, weights = attention(h, attention.score(h), offset=0, steps=9)
    torch.testing.assert_close(context.double(), reference_salton(attention, h.double()), rtol=1e-5, atol=1e-5)
    assert torch.equal(weights.triu(), torch.zeros_like(weights))  # only i < t


@pytest.mark.parametrize("mu_bias,normalizer", [
    (None, [6.0, 6.0, 6.0]),             # mu mostly free (below t/N)
    ([0.9, 3.0, 2.0], [6.0, 6.0, 6.0]),  # mu pushed above t/N: the clamp acts
    (None, [9.0, 5.0, 7.0]),             # one N per sentence (the sentence normalizer's shape)
])
def test_positional_attention_matches_the_equations(mu_bias, normalizer):
    torch.manual_seed(2)
    attention = PositionalAttention(8, generator_size=5)
    randomize_attention(attention, seed=2, mu_bias=mu_bias)
    h = torch.randn(3, 9, 8)
    N = torch.tensor(normalizer).unsqueeze(1)
    context, weights, mu, _ = attention(h, h, offset=0, normalizer=N)
    expected, clamped, free = reference_positional(attention, h.double(), normalizer)
    torch.testing.assert_close(context.double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(weights.triu(), torch.zeros_like(weights))
    steps = torch.arange(1, 10).unsqueeze(0) / N
    assert (mu >= 0).all() and (mu <= steps + 1e-6).all()
    assert (clamped > 0) if mu_bias is not None else (free > 0)


@pytest.mark.parametrize("arch", EVERY_ARCH)
@torch.no_grad()
def test_whole_model_matches_the_equations(arch):
    model = build_lstm_lm(arch)
    torch.testing.assert_close(log_probs(model, TOKENS).double(), reference_model_log_probs(model, TOKENS),
                               rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_sentence_normalizer_is_each_sentences_length():
    model = build_lstm_lm("positional_attentive_lstm_lm", ["--positional-attention-normalizer", "sentence"])
    tokens = TOKENS.clone()
    tokens[1, 6:] = PAD  # second sentence has 6 real tokens
    expected = reference_model_log_probs(model, tokens, N=[9.0, 6.0])
    out = log_probs(model, tokens).double()
    torch.testing.assert_close(out[0], expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1, :6], expected[1, :6], rtol=1e-5, atol=1e-5)


def test_paper_sizes_and_parameter_counts():
    """Defaults: 400/400, two layers, tied, position generator 20, block normalizer. On PTB's 10k
    vocabulary this gives the paper's parameter counts (7.06M attentive, 6.9M positional)."""
    counts = {}
    for arch in ARCHS:
        model = build_model(arch, ["--task", "language_modeling"], task=TinyTask(10000 - 4), tiny=[])
        dec = model.decoder
        assert (dec.lstm.input_size, dec.hidden_size, dec.num_layers) == (400, 400, 2)
        assert dec.share_input_output_embed and not hasattr(dec, "fc_out")
        assert dec.dropout_in_module.p == 0.5 and dec.lstm.dropout == 0.2 and dec.dropout_out_module.p == 0.5
        counts[arch] = sum(p.numel() for p in model.parameters())
    assert round(counts["attentive_lstm_lm"] / 1e6, 2) == 7.06
    assert round(counts["positional_attentive_lstm_lm"] / 1e6, 1) == 6.9
    # the baseline: 3 layers, dropout 0.4 / 0.25 / 0.5, no attention nor concatenation layer, 7.86M (Table 1)
    baseline = build_model("baseline_lstm_lm", ["--task", "language_modeling"], task=TinyTask(10000 - 4), tiny=[])
    dec = baseline.decoder
    assert (dec.lstm.input_size, dec.hidden_size, dec.num_layers) == (400, 400, 3) and dec.share_input_output_embed
    assert dec.dropout_in_module.p == 0.4 and dec.lstm.dropout == 0.25 and dec.dropout_out_module.p == 0.5
    assert dec.attention is None and dec.concat_proj is None
    assert round(sum(p.numel() for p in baseline.parameters()) / 1e6, 2) == 7.86
    positional = build_model("positional_attentive_lstm_lm", ["--task", "language_modeling"], task=TinyTask(), tiny=[])
    assert positional.decoder.attention.position_generator.hidden_size == 20
    assert positional.decoder.normalizer_type == "block" and positional.decoder.block_length == 1024


def test_options_reach_the_model():
    model = build_model("positional_attentive_lstm_lm", [
        "--task", "language_modeling", "--decoder-embed-dim", "24", "--decoder-hidden-size", "16",
        "--decoder-layers", "3", "--decoder-out-embed-dim", "12", "--no-share-decoder-input-output-embed",
        "--dropout", "0.1", "--decoder-dropout-in", "0.3", "--positional-attention-hidden", "7",
        "--tokens-per-sample", "35"], task=TinyTask(), tiny=[])
    dec = model.decoder
    assert (dec.embed_tokens.embedding_dim, dec.hidden_size, dec.num_layers) == (24, 16, 3)
    assert dec.concat_proj.out_features == 12 and dec.fc_out.in_features == 12
    assert dec.dropout_in_module.p == 0.3 and dec.lstm.dropout == 0.1 and dec.dropout_out_module.p == 0.1
    assert dec.attention.position_generator.hidden_size == 7 and dec.block_length == 35
    with pytest.raises(ValueError, match="--decoder-out-embed-dim"):
        build_model("attentive_lstm_lm", ["--task", "language_modeling", "--decoder-out-embed-dim", "12"],
                    task=TinyTask(), tiny=[])
    with pytest.raises(ValueError, match="no concatenation layer: --decoder-out-embed-dim must equal"):
        build_model("baseline_lstm_lm", ["--task", "language_modeling", "--decoder-out-embed-dim", "12",
                                         "--no-share-decoder-input-output-embed"], task=TinyTask(), tiny=[])


# ---------------------------------------------------------------------------- (b) causality
@pytest.mark.parametrize("arch", EVERY_ARCH)
@torch.no_grad()
def test_causal(arch):
    model = build_lstm_lm(arch)
    full = log_probs(model, TOKENS)
    T = TOKENS.size(1)
    for position in range(1, T):
        changed = TOKENS.clone()
        changed[:, position:] = torch.randint(4, 24, changed[:, position:].shape)
        out = log_probs(model, changed)
        torch.testing.assert_close(out[:, :position], full[:, :position], rtol=1e-6, atol=1e-6)
        assert not torch.allclose(out[:, position:], full[:, position:])
        # a shorter (right-padded) or longer continuation changes nothing before it either
        shorter = TOKENS.clone()
        shorter[1, position:] = PAD
        torch.testing.assert_close(log_probs(model, shorter)[1, :position], full[1, :position], rtol=1e-6, atol=1e-6)
    longer = torch.cat([TOKENS, TOKENS[:, 1:]], dim=1)
    torch.testing.assert_close(log_probs(model, longer)[:, :T], full, rtol=1e-6, atol=1e-6)


@torch.no_grad()
def test_sentence_normalizer_leaks_the_future():
    """The paper's N (true sentence length) is not causal: the outputs at the first positions
    depend on how many tokens follow. Documented, opt-in only; this test records it."""
    model = build_lstm_lm("positional_attentive_lstm_lm", ["--positional-attention-normalizer", "sentence"])
    full = log_probs(model, TOKENS)
    shorter = TOKENS.clone()
    shorter[:, 6:] = PAD
    assert not torch.allclose(log_probs(model, shorter)[:, :6], full[:, :6], atol=1e-4)
    longer = torch.cat([TOKENS, TOKENS[:, 1:]], dim=1)
    assert not torch.allclose(log_probs(model, longer)[:, :TOKENS.size(1)], full, atol=1e-4)
    with pytest.raises(ValueError, match="leaks the future"):
        model.decoder(TOKENS[:, :1], incremental_state={})


# ---------------------------------------------------------------------------- (c) incremental
@pytest.mark.parametrize("arch", EVERY_ARCH)
@pytest.mark.parametrize("first_chunk", [1, 3])
@torch.no_grad()
def test_incremental_decoding_equals_the_full_pass(arch, first_chunk):
    model = build_lstm_lm(arch)
    full = log_probs(model, TOKENS)
    swap = torch.tensor([1, 0])
    swapped_full = log_probs(model, TOKENS[swap])
    state: Dict = {}
    order = torch.tensor([0, 1])
    out = model.decoder(TOKENS[:, :first_chunk], incremental_state=state)[0]  # a prefix at once
    torch.testing.assert_close(torch.log_softmax(out, -1), full[:, :first_chunk], rtol=1e-5, atol=1e-5)
    for step in range(first_chunk, TOKENS.size(1)):
        if step == 5:
            order = swap
            model.decoder.reorder_incremental_state_scripting(state, order)
        out = model.decoder(TOKENS[order, : step + 1], incremental_state=state)[0]
        assert out.size(1) == 1
        expected = (full if step < 5 else swapped_full)[:, step]
        torch.testing.assert_close(torch.log_softmax(out[:, -1], -1), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", EVERY_ARCH)
@torch.no_grad()
def test_sequence_generator_scores_equal_the_full_pass(arch):
    """fairseq's own SequenceGenerator (beam search, reordering, incremental state) gives each
    hypothesis the scores that a full forward pass gives its tokens."""
    from fairseq.sequence_generator import SequenceGenerator

    model = build_lstm_lm(arch)
    dictionary = model.decoder.dictionary
    generator = SequenceGenerator([model], dictionary, beam_size=3, max_len_b=6, min_len=6)
    sample = {"net_input": {"src_tokens": TOKENS[:, 1:3], "src_lengths": torch.tensor([2, 2])}}
    hypos = generator.generate([model], sample, prefix_tokens=TOKENS[:, 1:3])
    for hypos_of_sentence in hypos:
        for hypo in hypos_of_sentence:
            tokens = torch.cat([torch.tensor([dictionary.eos()]), hypo["tokens"]])
            lp = log_probs(model, tokens[:-1].unsqueeze(0))[0]
            expected = lp.gather(1, tokens[1:].unsqueeze(1)).squeeze(1)
            torch.testing.assert_close(hypo["positional_scores"], expected, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- (d) first step
@pytest.mark.parametrize("arch", ARCHS)
def test_no_nan_at_the_first_step(arch):
    # eps 1e-6 (the old default): with sigma -> 0 even the nearest state's Gaussian underflows
    extra = ["--positional-attention-eps", "1e-6"] if arch == "positional_attentive_lstm_lm" else []
    model = build_lstm_lm(arch, extra).train()
    if arch == "positional_attentive_lstm_lm":
        with torch.no_grad():  # sigma -> 0: every Gaussian weight underflows in a naive exp / sum
            model.decoder.attention.w_sigma.bias.fill_(-60.0)
    for tokens in (TOKENS[:, :1], TOKENS):
        out, extra = model(tokens)
        assert torch.isfinite(out).all()
        weights = extra["memory_attention"]
        assert torch.equal(weights[:, 0], torch.zeros_like(weights[:, 0]))  # c_1 = 0
        if tokens.size(1) > 1:
            torch.testing.assert_close(weights[:, 1:].sum(-1), torch.ones_like(weights[:, 1:, 0]))
        model.zero_grad()
        torch.log_softmax(out, -1).sum().backward()
        for name, p in model.named_parameters():
            assert p.grad is None or torch.isfinite(p.grad).all(), name


# ---------------------------------------------------------------------------- subnormal gradients
@pytest.mark.parametrize("arch", EVERY_ARCH)
@pytest.mark.parametrize("training", [True, False])
def test_near_subnormal_logit_gradients_reach_the_output_layer_as_zero(arch, training):
    """On the CPU the gradient of the logits reaches the output layer with its entries below 2^-100
    (subnormal, or subnormal once multiplied by a weight: ~60x slower matrix products) set to 0 and
    every other entry unchanged, bit for bit; the parameters' gradients are those of that gradient."""
    model = build_lstm_lm(arch).train(training)
    features, _ = model.decoder.extract_features(TOKENS)
    features = features.detach().requires_grad_()
    logits = model.decoder.output_layer(features)
    arriving = []
    logits.register_hook(arriving.append)  # runs after the model's own hook, sees what it passes on
    generator = torch.Generator().manual_seed(0)
    upstream = torch.randn(logits.shape, generator=generator)
    small = torch.rand(logits.shape, generator=generator) < 0.3
    tiny = torch.tensor([1e-39, -3e-38, 2e-35, -5e-32, 7e-31])  # subnormal, then normal below 2^-100
    upstream[small] = tiny[torch.randint(len(tiny), (int(small.sum()),), generator=generator)]
    upstream[0, 0, :len(tiny)] = tiny
    upstream[0, 0, len(tiny)] = 2.0 ** -99  # above the guard: kept
    model.zero_grad()
    logits.backward(upstream)
    expected = upstream.masked_fill(upstream.abs() < SUBNORMAL_GUARD, 0.0)
    assert torch.equal(arriving[0], expected)
    assert arriving[0][0, 0, len(tiny)] == 2.0 ** -99 and not arriving[0][0, 0, :len(tiny)].any()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == {"decoder.embed_tokens.weight", "decoder.output_bias"}
    model.zero_grad()
    plain = features.detach().requires_grad_()
    model.decoder.output_layer(plain).backward(expected)
    assert torch.equal(features.grad, plain.grad)
    for name, p in model.named_parameters():
        assert p.grad is None if name not in grads else torch.equal(p.grad, grads[name]), name


def test_no_gradient_hook_without_gradients():
    model = build_lstm_lm("attentive_lstm_lm")
    with torch.no_grad():
        logits = model(TOKENS)[0]
    assert not logits.requires_grad and not logits._backward_hooks


# ---------------------------------------------------------------------------- benchmark script
BENCHMARK = os.path.join(REPO, "scripts", "benchmark_lstm_lm.py")


def load_benchmark_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_lstm_lm", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("width", [None, 35])
def test_benchmark_gives_the_authors_model_the_same_sentences(width):
    """--authors-code: the authors' model gets our batch with their pad index 0 (swapped with ours),
    rows sorted by decreasing length, float lengths (their loader's); --authors-pad-to 35 pads the
    rows to 35 columns as their loader does, with the same tokens."""
    bench = load_benchmark_script()
    sentences = bench.read_lines(os.path.join(REPO, "data", "ptb_sample", "train.txt"))
    dictionary = bench.build_dictionary(sentences)
    pad, eos = dictionary.pad(), dictionary.eos()
    assert dictionary.index("<s>") == bench.AUTHORS_PAD != pad  # fairseq's <s>: never in a batch
    batches = bench.sentence_batches(bench.encode(sentences, dictionary), 20, 35, pad, eos, seed=1)
    # batches hold sentences of similar length: take one with rows of several lengths, right-padded
    source, target = next(batch for batch in batches if batch[0].ne(pad).sum(1).unique().numel() > 1)
    data, targets, lengths = bench.to_authors_batch((source, target), pad, width)
    assert data.shape == targets.shape == (20, width or source.size(1)) and lengths.dtype == torch.float32
    assert torch.equal(lengths, data.ne(bench.AUTHORS_PAD).sum(1).float())
    assert torch.equal(lengths, targets.ne(bench.AUTHORS_PAD).sum(1).float())
    assert (lengths[:-1] >= lengths[1:]).all()
    theirs = {tuple(row[row.ne(bench.AUTHORS_PAD)].tolist()) for row in torch.cat([data, targets], 1)}
    ours = {tuple(row[row.ne(pad)].tolist()) for row in torch.cat([source, target], 1)}
    assert theirs == ours and not data.eq(pad).any()


@pytest.mark.slow
def test_benchmark_script_without_the_authors_code(tmp_path):
    """The default path: our models at the paper's sizes, and the authors' column asks for their code."""
    command = [sys.executable, BENCHMARK, "--data", os.path.join(REPO, "data", "ptb_sample", "train.txt"),
               "--steps", "1", "--warmup", "0", "--threads", "1", "--batch-size", "4",
               "--archs", "attentive_lstm_lm", "positional_attentive_lstm_lm"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "attentive" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| attentive_lstm_lm", "| positional_attentive_lstm_lm"]
    assert all(row.count("needs --authors-code") == 2 for row in rows)
    assert "The authors' columns need --authors-code DIR" in result.stdout
    missing = subprocess.run([*command, "--authors-code", str(tmp_path)], capture_output=True, text=True,
                             cwd=REPO, timeout=600)
    assert missing.returncode == 1 and f"{tmp_path}/model.py not found" in missing.stderr


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("PYTORCH_ATTENTIVE_LM_DIR"),
                    reason="needs a checkout of gautierdag/pytorch-attentive-lm in $PYTORCH_ATTENTIVE_LM_DIR")
def test_benchmark_script_with_the_authors_code():
    """--authors-code: their model of each of our archs trains on the same batches, and the ratio is given."""
    command = [sys.executable, BENCHMARK, "--data", os.path.join(REPO, "data", "ptb_sample", "train.txt"),
               "--steps", "1", "--warmup", "0", "--threads", "1", "--batch-size", "4",
               "--authors-code", os.environ["PYTORCH_ATTENTIVE_LM_DIR"]]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split(" | ")[0][2:]: line.rstrip(" |").split(" | ") for line in result.stdout.splitlines()
            if line.startswith("| ") and "lstm_lm" in line}
    assert set(rows) == {*ARCHS, "lstm_lm", *(f"authors: {arch}" for arch in ARCHS)}
    for arch in ARCHS:
        assert re.fullmatch(r"\d+\.\d\dx", rows[arch][5]) and re.fullmatch(r"\d+\.\d\dx", rows[arch][7])
        assert rows[arch][1:3] == rows[f"authors: {arch}"][1:3]  # parameters, target tokens per step


# ---------------------------------------------------------------------------- (e) real tools
SAMPLE = os.path.join(REPO, "data", "ptb_sample")
E2E_MODEL = ["--decoder-embed-dim", "32", "--decoder-hidden-size", "32"]
E2E_TRAIN = [
    "--task", "language_modeling", "--user-dir", USER_DIR, "--optimizer", "adam", "--lr", "0.005",
    "--batch-size", "20", "--max-update", "4", "--cpu", "--seed", "1", "--num-workers", "0",
    "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "1",
    "--required-batch-size-multiple", "1", "--clip-norm", "0.25",
]
# the paper's sentence-level set-up: one sentence per sample, clipped at 35 tokens
SENTENCES = ["--sample-break-mode", "eos", "--tokens-per-sample", "35",
             "--shorten-method", "truncate", "--shorten-data-split-list", "train,valid,test"]
BLOCKS = ["--tokens-per-sample", "35"]


@pytest.fixture(scope="module")
def ptb_bin(tmp_path_factory) -> str:
    data_bin = str(tmp_path_factory.mktemp("ptb") / "data-bin")
    run("fairseq-preprocess", [
        "--only-source", "--task", "language_modeling", "--workers", "1", "--destdir", data_bin,
        "--trainpref", f"{SAMPLE}/train.txt", "--validpref", f"{SAMPLE}/valid.txt",
        "--testpref", f"{SAMPLE}/test.txt",
    ])
    return data_bin


@pytest.mark.slow
def test_help_lists_the_model_options():
    out = run("fairseq-train", ["--user-dir", USER_DIR, "--task", "language_modeling",
                                "--arch", "positional_attentive_lstm_lm", "-h"]).stdout
    for option in ("--positional-attention-hidden", "--positional-attention-normalizer",
                   "--positional-attention-eps", "--attentive-lm-init", "--decoder-hidden-size",
                   "--share-decoder-input-output-embed", "LEAKS THE FUTURE"):
        assert option in out, option


@pytest.mark.slow
@pytest.mark.parametrize("arch,mode", [
    ("attentive_lstm_lm", BLOCKS),
    ("positional_attentive_lstm_lm", BLOCKS),
    ("positional_attentive_lstm_lm", SENTENCES),
    ("baseline_lstm_lm", SENTENCES),
], ids=["attentive-block", "positional-block", "positional-eos35", "baseline-eos35"])
def test_preprocess_train_eval_lm(ptb_bin, tmp_path, arch, mode):
    save_dir = str(tmp_path / "checkpoints")
    model = [*E2E_MODEL, "--positional-attention-hidden", "8"] if arch.startswith("positional") else E2E_MODEL
    log = run("fairseq-train", [ptb_bin, "--arch", arch, *model, *E2E_TRAIN, *mode,
                                "--save-dir", save_dir]).stdout
    assert "done training" in log and os.path.exists(f"{save_dir}/checkpoint_last.pt")
    # a fresh process loads the checkpoint and scores every target token of the test split
    result = run("fairseq-eval-lm", [ptb_bin, "--path", f"{save_dir}/checkpoint_last.pt", "--user-dir", USER_DIR,
                                     "--gen-subset", "test", "--batch-size", "20", "--cpu", "--num-workers", "0",
                                     *mode])
    text = result.stdout + result.stderr
    found = re.search(r"Evaluated ([\d,]+) tokens.*?Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", text, re.S)
    assert found, text[-3000:]
    tokens, loss, perplexity = int(found[1].replace(",", "")), float(found[2]), float(found[3])
    print(f"\n{arch} {' '.join(mode)}: {tokens} test tokens, loss (base 2) {loss:.4f}, perplexity {perplexity:.2f}")
    expected_tokens = sum(len(line.split()) + 1 for line in open(f"{SAMPLE}/test.txt"))  # words + </s>
    if mode is BLOCKS:
        assert tokens == expected_tokens
    else:  # sentences clipped at 35 tokens
        assert tokens == sum(min(len(line.split()) + 1, 35) for line in open(f"{SAMPLE}/test.txt"))
    assert math.isclose(perplexity, 2 ** loss, rel_tol=1e-3)
    if arch.startswith("positional"):  # N is the training block length, whatever the task says now
        from fairseq import checkpoint_utils, tasks

        state = checkpoint_utils.load_checkpoint_to_cpu(f"{save_dir}/checkpoint_last.pt")
        task_cfg = state["cfg"].task
        task_cfg.tokens_per_sample, task_cfg.data = 70, ptb_bin
        models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
            [f"{save_dir}/checkpoint_last.pt"], task=tasks.setup_task(task_cfg))
        assert models[0].decoder.block_length == 35
    vocabulary = sum(1 for _ in open(f"{ptb_bin}/dict.txt")) + 4
    assert 10 < perplexity < 2 * vocabulary  # after 4 updates: near uniform over the vocabulary
