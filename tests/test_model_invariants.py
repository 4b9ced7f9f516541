"""Invariants of ``transformer_posattn``: defaults equal fairseq's transformer, padding invariance
of every encoder variant, causality and incremental decoding of every decoder variant."""

from typing import Dict, List

import pytest
import torch
from fairseq.modules import MultiheadAttention

from posattn.position_terms.base import SequenceTooLongError
from model_helpers import SIDE_VARIANTS, build_lm, build_model, randomized, side_flags, side_inputs

def tokens(rows: List[List[int]], left_pad: bool, pad: int = 1) -> torch.Tensor:
    T = max(len(r) for r in rows)
    out = torch.full((len(rows), T), pad, dtype=torch.long)
    for b, r in enumerate(rows):
        if left_pad:
            out[b, T - len(r):] = torch.tensor(r)
        else:
            out[b, : len(r)] = torch.tensor(r)
    return out


SHORT = [5, 9, 11, 7, 2]
LONG = [6, 8, 12, 13, 14, 4, 10, 2]


# ----------------------------------------------------------------------------- defaults
def test_defaults_compute_exactly_fairseqs_transformer():
    torch.manual_seed(0)
    vanilla = build_model("transformer_iwslt_de_en", ["--dropout", "0.1", "--attention-dropout", "0.1"])
    ours = build_model("transformer_posattn_iwslt_de_en", ["--dropout", "0.1", "--attention-dropout", "0.1"])
    ours.load_state_dict(vanilla.state_dict(), strict=True)
    attentions = [m for m in ours.modules() if isinstance(m, MultiheadAttention)]
    assert attentions and all(type(m) is MultiheadAttention for m in attentions), \
        "with every option at its default the layers must keep fairseq's own (fused) attention"
    src = tokens([SHORT, LONG], left_pad=True)
    prev = tokens([[2, 5, 6], [2, 7, 8, 9, 10]], left_pad=False)
    lengths = src.ne(1).sum(1)
    for train in (False, True):
        vanilla.train(train)
        ours.train(train)
        torch.manual_seed(1)
        expected = vanilla(src, lengths, prev)[0]
        torch.manual_seed(1)
        got = ours(src, lengths, prev)[0]
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


# ----------------------------------------------------------------------------- encoder
@pytest.mark.parametrize("variant", sorted(SIDE_VARIANTS["encoder"]))
@pytest.mark.parametrize("left_pad", [True, False])
@torch.no_grad()
def test_encoder_padding_invariance(variant, left_pad):
    torch.manual_seed(0)
    model = randomized(build_model("transformer_posattn", side_flags("encoder", variant)))
    alone_src = tokens([SHORT], left_pad)
    alone = model.encoder(alone_src, return_all_hiddens=False, **side_inputs(alone_src))["encoder_out"][0][:, 0]
    batch_src = tokens([SHORT, LONG], left_pad)
    in_batch = model.encoder(batch_src, **side_inputs(batch_src))["encoder_out"][0][:, 0]
    real = batch_src[0].ne(1)
    torch.testing.assert_close(in_batch[real], alone, rtol=1e-5, atol=1e-5)


def test_encoder_rejects_a_source_longer_than_its_positions():
    model = build_model("transformer_posattn", ["--encoder-direct-position", "absolute"]).eval()
    too_long = torch.randint(4, 20, (1, 25))
    with pytest.raises(SequenceTooLongError, match="--max-source-positions"):
        model.encoder(too_long)


# ----------------------------------------------------------------------------- decoder
def decoder_logits(model, src, prev):
    encoder_out = model.encoder(src)
    return model.decoder(prev, encoder_out=encoder_out)[0]


@pytest.mark.parametrize("variant", sorted(SIDE_VARIANTS["decoder"]))
@torch.no_grad()
def test_decoder_is_causal(variant):
    torch.manual_seed(0)
    model = randomized(build_model("transformer_posattn", side_flags("decoder", variant)))
    src = tokens([SHORT, LONG], left_pad=True)
    prev = torch.tensor([[2, 5, 6, 7, 8, 9, 10], [2, 11, 12, 13, 14, 15, 16]])
    base = decoder_logits(model, src, prev)
    for position in range(1, prev.size(1)):
        changed = prev.clone()
        changed[:, position] = 4
        out = decoder_logits(model, src, changed)
        torch.testing.assert_close(out[:, :position], base[:, :position], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(out[:, position:], base[:, position:])


@pytest.mark.parametrize("variant", sorted(SIDE_VARIANTS["decoder"]))
@torch.no_grad()
def test_incremental_decoding_equals_full_forward(variant):
    """Step-by-step decoding with the cache, including a beam-search reordering of the cached
    states mid-sentence (two hypotheses of one source swap places), equals the full forward."""
    torch.manual_seed(0)
    model = randomized(build_model("transformer_posattn", side_flags("decoder", variant)))
    src = tokens([LONG, LONG], left_pad=True)
    prev = torch.tensor([[2, 5, 6, 7, 8, 9, 10], [2, 11, 12, 13, 14, 15, 16]])
    swap = torch.tensor([1, 0])
    full = torch.log_softmax(decoder_logits(model, src, prev), dim=-1)
    swapped_full = torch.log_softmax(decoder_logits(model, src, prev[swap]), dim=-1)

    encoder_out = model.encoder(src)
    state: Dict = {}
    order = torch.tensor([0, 1])
    for step in range(prev.size(1)):
        if step == 3:
            order = swap
            model.decoder.reorder_incremental_state_scripting(state, order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
        out = model.decoder(prev[order, : step + 1], encoder_out=encoder_out, incremental_state=state)[0]
        expected = (full if step < 3 else swapped_full)[:, step]
        torch.testing.assert_close(torch.log_softmax(out[:, -1], dim=-1), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", sorted(SIDE_VARIANTS["decoder"]))
@torch.no_grad()
def test_incremental_decoding_past_a_table_bucket_equals_full_forward(variant):
    """70 steps of a language model with 80 positions: the sequence tables (of the terms that keep
    any; the all-at-once model has them all) are built for 64 tokens, then rebuilt for 80 (the
    capacity) at step 65; every step equals the full forward."""
    torch.manual_seed(0)
    size = ["--tokens-per-sample", "80", "--max-target-positions", "80"]
    model = randomized(build_lm("transformer_lm_posattn", side_flags("decoder", variant) + size))
    prev = torch.randint(4, 20, (2, 70), generator=torch.Generator().manual_seed(1))
    full = torch.log_softmax(model.decoder(prev)[0], dim=-1)
    state: Dict = {}
    for step in range(prev.size(1)):
        out = model.decoder(prev[:, : step + 1], incremental_state=state)[0]
        torch.testing.assert_close(torch.log_softmax(out[:, -1], dim=-1), full[:, step], rtol=1e-5, atol=1e-5)
    tables = next(value for key, value in state.items() if key.endswith("position_tables"))
    assert tables or variant != "combined", "the all-at-once model kept no sequence tables"
    assert all(80 in table.shape[-2:] for table in tables.values()), "a table was not rebuilt for 80 tokens"
