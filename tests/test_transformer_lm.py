"""``transformer_lm_posattn``: defaults equal fairseq's ``transformer_lm``; every decoder variant is
causal and decodes incrementally as in the full pass; option checks at start-up."""

from typing import Dict

import pytest
import torch
from fairseq.modules import MultiheadAttention

from model_helpers import SIDE_VARIANTS, build_lm, randomized, side_flags
from posattn.position_options import PositionOptionError
from fairseq_posattn.models.transformer_lm_posattn import check_block_fits

TOKENS = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 11], [2, 12, 13, 14, 15, 16, 17, 18]])


def test_defaults_compute_exactly_fairseqs_transformer_lm():
    vanilla = build_lm("transformer_lm", ["--dropout", "0.1"])
    ours = build_lm("transformer_lm_posattn", ["--dropout", "0.1"])
    ours.load_state_dict(vanilla.state_dict(), strict=True)
    assert all(type(m) is MultiheadAttention for m in ours.modules() if isinstance(m, MultiheadAttention))
    for train in (False, True):
        vanilla.train(train)
        ours.train(train)
        torch.manual_seed(3)
        expected = vanilla(TOKENS)[0]
        torch.manual_seed(3)
        torch.testing.assert_close(ours(TOKENS)[0], expected, rtol=0, atol=0)


@pytest.mark.parametrize("variant", sorted(SIDE_VARIANTS["decoder"]))
@torch.no_grad()
def test_language_model_is_causal_and_incremental(variant):
    torch.manual_seed(0)
    model = randomized(build_lm("transformer_lm_posattn", side_flags("decoder", variant)))
    full = torch.log_softmax(model(TOKENS)[0], dim=-1)
    for position in range(1, TOKENS.size(1)):
        changed = TOKENS.clone()
        changed[:, position] = 4
        out = torch.log_softmax(model(changed)[0], dim=-1)
        torch.testing.assert_close(out[:, :position], full[:, :position], rtol=1e-5, atol=1e-5)

    state: Dict = {}
    swap = torch.tensor([1, 0])
    swapped_full = torch.log_softmax(model(TOKENS[swap])[0], dim=-1)
    order = torch.tensor([0, 1])
    for step in range(TOKENS.size(1)):
        if step == 4:
            order = swap
            model.decoder.reorder_incremental_state_scripting(state, order)
        out = model.decoder(TOKENS[order, : step + 1], incremental_state=state)[0]
        expected = (full if step < 4 else swapped_full)[:, step]
        torch.testing.assert_close(torch.log_softmax(out[:, -1], dim=-1), expected, rtol=1e-5, atol=1e-5)


class _Task:
    def __init__(self, tokens_per_sample):
        self.args = type("Cfg", (), {"tokens_per_sample": tokens_per_sample})()


def test_block_longer_than_direct_positions_fails_at_start_up():
    model = build_lm("transformer_lm_posattn", ["--decoder-direct-position", "absolute"])
    options = model.decoder.position_options
    check_block_fits(options, _Task(options.max_positions))
    with pytest.raises(PositionOptionError, match="--tokens-per-sample 25 .* raise --max-target-positions"):
        check_block_fits(options, _Task(25))
