"""Structural positions inside the model: the per-token side data rebuilds Wang et al.'s relative
structural positions, the encoder is padding invariant with them, the absolute embedding uses the
sequential sinusoid, and every row of Wang et al.'s Table 1 is expressible by flags."""

import gzip
import os

import numpy as np
import pytest
import torch
from fairseq.modules import SinusoidalPositionalEmbedding

from posattn.position_options import PositionOptionError
from posattn.position_terms.structural import (
    PARSE,
    StructuralPositionalEmbedding,
    StructuralRelativeEmbeddings,
    structural_relative,
)
from fairseq_posattn.structure import structural_relative_positions, tree_depths
from fairseq_posattn.structure.alignment import piece_structural_positions
from fairseq_posattn.structure.side_data import token_side_data
from model_helpers import REPO, TinyTask, build_model, randomized

EWT_DEV = os.path.join(REPO, "..", "shared", "data", "ud_english_ewt", "en_ewt-ud-dev.conllu")
EWT_SAMPLE = os.path.join(REPO, "data", "ud_ewt_sample", "en_ewt-ud-dev.sample.conllu")


def ewt_heads(limit: int = 400):
    """Heads of real UD English-EWT trees (all of ``EWT_DEV`` if present, else the sample)."""
    import conllu

    path = EWT_DEV if os.path.exists(EWT_DEV) else EWT_SAMPLE
    if not os.path.exists(path):
        pytest.skip("no UD English-EWT file: neither ../shared/data nor the shipped sample")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for i, sentence in enumerate(conllu.parse_incr(f)):
            if i >= limit:
                return
            words = [t for t in sentence if isinstance(t["id"], int)]
            yield [t["head"] for t in words]


def random_pieces(n_words: int, rng: np.random.Generator) -> np.ndarray:
    """A BPE-like split: each word becomes 1-3 pieces."""
    return np.repeat(np.arange(n_words), rng.integers(1, 4, size=n_words))


def test_side_data_rebuilds_the_spec_relative_positions_on_real_trees():
    rng = np.random.default_rng(0)
    count = 0
    for heads in ewt_heads():
        pieces = random_pieces(len(heads), rng)
        side = torch.from_numpy(token_side_data(heads, pieces)).long()[None]
        rel = structural_relative(side[:, 0], side[:, 1], side[:, 2], clip=16)[0].numpy()
        expected_abs, expected_rel = piece_structural_positions(heads, pieces, clip=16)
        np.testing.assert_array_equal(side[0, 0].numpy(), expected_abs)
        np.testing.assert_array_equal(rel, expected_rel)
        # the word-level public API agrees on the pieces that start words
        starts = np.r_[0, np.nonzero(np.diff(pieces))[0] + 1]
        np.testing.assert_array_equal(rel[np.ix_(starts, starts)], structural_relative_positions(heads, clip=16))
        np.testing.assert_array_equal(side[0, 0, starts].numpy(), tree_depths(heads))
        count += 1
    assert count >= 40


def side_batch(heads_list, left_pad: bool):
    """Collate side data like the dataset does: (B, 3, T) with pads (0, -1, -1)."""
    sides = [torch.from_numpy(token_side_data(h, np.arange(len(h)))).long() for h in heads_list]
    T = max(s.size(1) for s in sides)
    out = torch.tensor([0, -1, -1]).view(1, 3, 1).repeat(len(sides), 1, T)
    for b, s in enumerate(sides):
        if left_pad:
            out[b, :, T - s.size(1):] = s
        else:
            out[b, :, : s.size(1)] = s
    return out


class StructuralTask(TinyTask):
    collated_side_data = (PARSE.key,)


STRUCTURAL_FLAGS = ["--encoder-structural-positions", "both", "--encoder-structural-fusion", "nonlinear",
                    "--encoder-structural-clip", "3", "--encoder-relative-positions", "2"]


@pytest.mark.parametrize("left_pad", [True, False])
@torch.no_grad()
def test_structural_encoder_is_padding_invariant(left_pad):
    torch.manual_seed(0)
    model = randomized(build_model("transformer_posattn", STRUCTURAL_FLAGS, task=StructuralTask()))
    short_heads, long_heads = [2, 0, 2, 5, 3], [3, 3, 0, 5, 3, 7, 5, 3]
    short = [5, 9, 11, 7, 6, 2]
    long = [6, 8, 12, 13, 14, 4, 10, 15, 2]
    src = torch.full((2, 9), 1)
    if left_pad:
        src[0, 3:], src[1] = torch.tensor(short), torch.tensor(long)
    else:
        src[0, :6], src[1] = torch.tensor(short), torch.tensor(long)
    structure = side_batch([short_heads, long_heads], left_pad)
    alone = model.encoder(torch.tensor([short]), src_structure=side_batch([short_heads], left_pad))
    together = model.encoder(src, src_structure=structure)
    real = src[0].ne(1)
    torch.testing.assert_close(together["encoder_out"][0][real, 0], alone["encoder_out"][0][:, 0],
                               rtol=1e-5, atol=1e-5)


def test_structural_terms_use_side_data():
    model = build_model("transformer_posattn", STRUCTURAL_FLAGS, task=StructuralTask())
    attention = model.encoder.layers[1].self_attn
    kinds = [type(t) for t in attention.key_value_terms]
    assert StructuralRelativeEmbeddings in kinds and len(kinds) == 2  # own table, added to Shaw's
    assert model.encoder.position_input is not None
    src = torch.tensor([[5, 9, 11, 2]])
    with pytest.raises(ValueError, match="--task translation_structural"):
        model.encoder(src)
    with pytest.raises(ValueError, match="does not match the source batch"):
        model.encoder(src, src_structure=side_batch([[2, 0]], True))


def test_structural_model_refuses_a_task_without_parses():
    with pytest.raises(PositionOptionError, match="--task translation_structural"):
        build_model("transformer_posattn", ["--encoder-structural-positions", "absolute"],
                    task=TinyTask(collated_side_data=()))


def test_absolute_structural_embedding_is_the_sequential_sinusoid_of_depth():
    dim, pad = 16, 1
    embedding = StructuralPositionalEmbedding(dim, pad, max_depth=20, fusion="add")
    sequential = SinusoidalPositionalEmbedding(dim, pad, init_size=30)
    tokens = torch.full((1, 10), 7)  # positions 0..9 as fairseq numbers them
    expected = sequential(tokens)[0]
    depth = torch.arange(10).unsqueeze(0)
    got = embedding.embed(depth, torch.zeros(1, 10, dtype=torch.bool), None)[0]
    torch.testing.assert_close(got, expected)


TABLE_1 = {  # Wang et al. 2019, Table 1: (sequential abs, sequential rel, structural abs, structural rel)
    1: ["--encoder-no-token-positional-embeddings"],
    2: ["--encoder-no-token-positional-embeddings", "--encoder-structural-positions", "absolute"],
    3: ["--encoder-no-token-positional-embeddings", "--encoder-structural-positions", "relative"],
    4: [],
    5: ["--encoder-structural-positions", "absolute"],
    6: ["--encoder-structural-positions", "both"],
    7: ["--encoder-relative-positions", "16"],
    8: ["--encoder-relative-positions", "16", "--encoder-structural-positions", "absolute"],
    9: ["--encoder-relative-positions", "16", "--encoder-structural-positions", "both"],
}
EXPECTED = {1: (0, 0, 0, 0), 2: (0, 0, 1, 0), 3: (0, 0, 0, 1), 4: (1, 0, 0, 0), 5: (1, 0, 1, 0),
            6: (1, 0, 1, 1), 7: (1, 1, 0, 0), 8: (1, 1, 1, 0), 9: (1, 1, 1, 1)}


@pytest.mark.parametrize("row", sorted(TABLE_1))
def test_every_row_of_table_1_is_expressible(row):
    model = build_model("transformer_posattn", TABLE_1[row], task=StructuralTask())
    encoder = model.encoder
    terms = [type(t).__name__ for t in getattr(encoder.layers[0].self_attn, "key_value_terms", [])]
    got = (int(encoder.embed_positions is not None), int("RelativePositionEmbeddings" in terms),
           int(encoder.position_input is not None), int("StructuralRelativeEmbeddings" in terms))
    assert got == EXPECTED[row]
    assert model.decoder.embed_positions is not None, "the paper keeps the decoder's sequential positions"
    assert all(type(layer.self_attn).__name__ == "MultiheadAttention" for layer in model.decoder.layers)


def test_fairseq_flag_drops_both_sides_positions_and_ours_only_the_encoders():
    both = build_model("transformer_posattn", ["--no-token-positional-embeddings"])
    assert both.encoder.embed_positions is None and both.decoder.embed_positions is None
    encoder_only = build_model("transformer_posattn", ["--encoder-no-token-positional-embeddings"])
    assert encoder_only.encoder.embed_positions is None and encoder_only.decoder.embed_positions is not None


def test_nonlinear_fusion_without_sequential_positions_is_refused():
    with pytest.raises(PositionOptionError, match="--encoder-no-token-positional-embeddings"):
        build_model("transformer_posattn", ["--encoder-no-token-positional-embeddings",
                                            "--encoder-structural-positions", "absolute",
                                            "--encoder-structural-fusion", "nonlinear"],
                    task=StructuralTask())


def test_weights_saved_before_the_input_embedding_was_the_sides_load():
    """Checkpoints of 0.2 kept the absolute structural embedding's fusion under ``encoder.structural_embedding``:
    fairseq's loading upgrades them to the side's ``encoder.position_input`` and the model computes the same."""
    torch.manual_seed(0)
    saved = randomized(build_model("transformer_posattn", STRUCTURAL_FLAGS, task=StructuralTask())).eval()
    old = {key.replace("encoder.position_input.", "encoder.structural_embedding."): value
           for key, value in saved.state_dict().items()}
    assert "encoder.structural_embedding.fusion.weight" in old
    loaded = build_model("transformer_posattn", STRUCTURAL_FLAGS, task=StructuralTask()).eval()
    loaded.load_state_dict(old, strict=True)
    src = torch.tensor([[5, 9, 11, 7, 6, 2]])
    structure = side_batch([[2, 0, 2, 5, 3]], left_pad=True)
    torch.testing.assert_close(loaded.encoder(src, src_structure=structure)["encoder_out"][0],
                               saved.encoder(src, src_structure=structure)["encoder_out"][0], rtol=0, atol=0)
