"""Interactive and hub input go through exactly the steps posattn-prepare-translation applied to the
training data: ``--tokenizer posattn_moses --bpe posattn_subword_nmt`` built by fairseq's own option
parsing give, line for line, the ``{split}.bpe.{lang}`` files (apostrophes, hyphens, numbers with units,
literal ``@@``); a literal ``@@`` never reads as BPE's separator, in the structural pipeline either; and
the structural task's inference path copes with hand-typed BPE lines (fast: no training)."""

from pathlib import Path
from typing import List

import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary, encoders
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_posattn.data.text_pipeline import prepare_translation_corpus, remove_bpe
from fairseq_posattn.structure.alignment import align_pieces, words_of_pieces
from fairseq_posattn.structure.parsers import SpacyParser
from fairseq_posattn.structure.side_data import token_side_data
from fairseq_posattn.tasks.translation_structural import TranslationStructuralConfig, TranslationStructuralTask
from model_helpers import USER_DIR

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "multi30k_sample"
N = 40
#: (English, German) lines with what tokenization and BPE can get wrong
TRICKY = [
    ("A man's well-known dog isn't running 5 km with 3.5kg -- 20% more!",
     "Der bekannte Hund eines Mannes läuft 5 km mit 3,5kg -- 20% mehr!"),
    ("Two people @@ the beach, e-mail me at a@@b @@", "Zwei Leute @@ am Strand, schreib mir an a@@b @@"),
    ("  The children's mother-in-law doesn't like \"red\" cars & 2.5 m trailers.\t",
     "Die Schwiegermutter der Kinder mag keine \"roten\" Autos & 2,5 m Anhänger."),
    ("It costs $30, i.e. 25 € (that's 10 % off) - 'really'?",
     "Es kostet 30 $, d.h. 25 € (das sind 10 % weniger) - 'wirklich'?"),
]


def head(path: Path, n: int = N) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """posattn-prepare-translation's library call on the sample's first lines plus the tricky ones."""
    root = tmp_path_factory.mktemp("interactive_input")
    raw = root / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        for side, lang in enumerate(("en", "de")):
            lines = head(SAMPLE / f"{split}.{lang}") + [pair[side] for pair in TRICKY]
            (raw / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    out = root / "prepared"
    prepare_translation_corpus(str(raw), str(out), "en", "de", bpe_merges=200)
    return {"raw": raw, "out": out, "codes": str(out / "bpe.codes")}


@pytest.fixture(scope="module")
def spacy_parser() -> SpacyParser:
    return SpacyParser()


def interactive_encoders(*flags: str):
    """The tokenizer and BPE fairseq-interactive builds from these command-line flags."""
    parser = options.get_interactive_generation_parser()
    args = options.parse_args_and_arch(parser, ["unused-data-dir", "--user-dir", USER_DIR, "--task", "translation",
                                                *flags])
    cfg = convert_namespace_to_omegaconf(args)
    return encoders.build_tokenizer(cfg.tokenizer), encoders.build_bpe(cfg.bpe)


def read(path: Path) -> List[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("src,tgt", [("en", "de"), ("de", "en")])
def test_documented_flags_reproduce_prepare_translation(prepared, src, tgt):
    tokenizer, bpe = interactive_encoders("--source-lang", src, "--target-lang", tgt, "--tokenizer", "posattn_moses",
                                          "--bpe", "posattn_subword_nmt", "--bpe-codes", prepared["codes"])
    # fairseq's own encoders with these options are the same steps
    fairseq_tokenizer, fairseq_bpe = interactive_encoders(
        "--source-lang", src, "--target-lang", tgt, "--tokenizer", "moses", "--moses-no-escape",
        "--moses-no-dash-splits", "--bpe", "subword_nmt", "--bpe-codes", prepared["codes"])
    for split in ("train", "valid", "test"):
        raw = [line.strip() for line in read(prepared["raw"] / f"{split}.{src}")]  # as fairseq-interactive reads
        expected = read(prepared["out"] / f"{split}.bpe.{src}")
        assert [bpe.encode(tokenizer.encode(line)) for line in raw] == expected
        assert [fairseq_bpe.encode(fairseq_tokenizer.encode(line)) for line in raw] == expected
    assert any("@@ " in line for line in expected)  # BPE did split words
    # outputs are undone as fairseq-generate --remove-bpe and the Moses detokenizer undo them
    assert [bpe.decode(line) for line in expected] == read(prepared["out"] / f"test.tok.{src}")
    assert tokenizer.decode("Das ist ein Test , oder ?") == "Das ist ein Test, oder?"


def test_fairseq_defaults_would_differ(prepared):
    """fairseq's ``--tokenizer moses`` without the two options escapes ``'`` and splits hyphens: not the
    training input (what the user saw)."""
    tokenizer, _ = interactive_encoders("--source-lang", "en", "--target-lang", "de", "--tokenizer", "moses")
    expected = read(prepared["out"] / "test.tok.en")[N]
    assert tokenizer.encode(TRICKY[0][0]) != expected
    assert "&apos;" in tokenizer.encode(TRICKY[0][0]) and "@-@" in tokenizer.encode(TRICKY[0][0])


def test_languages_are_required():
    with pytest.raises(ValueError, match="--source-lang"):
        interactive_encoders("--tokenizer", "posattn_moses")
    with pytest.raises(ValueError, match="--bpe-codes"):
        interactive_encoders("--bpe", "posattn_subword_nmt")


def test_literal_at_signs_are_tokens_of_their_own(prepared, spacy_parser):
    """Moses puts every ``@`` in a token of its own, so after BPE a piece ends with ``@@`` only as the
    separator: removing BPE gives the tokens back, and parsed words align with the pieces."""
    tok = read(prepared["out"] / "test.tok.en")
    pieces = read(prepared["out"] / "test.bpe.en")
    assert tok[N + 1].startswith("Two people @ @ the beach") and tok[N + 1].endswith("a @ @ b @ @")
    assert not any("@@" in token for line in tok for token in line.split())
    assert [remove_bpe(line) for line in pieces] == tok
    parses = spacy_parser.parse([line.split() for line in tok[N:]])
    for line, (words, heads, _) in zip(pieces[N:], parses):
        index = align_pieces(line, words)
        assert token_side_data(heads, index).shape == (3, len(line.split()) + 1)


def test_a_final_separator_ends_the_last_word():
    pieces = "A man in a re@@".split()
    assert words_of_pieces(pieces) == ["A", "man", "in", "a", "re@@"]
    assert align_pieces(pieces, words_of_pieces(pieces), closed_end=True).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="still ends with the separator"):
        align_pieces(pieces, ["A", "man", "in", "a", "re"])
    pieces = "A @@ @@ b@@ @@".split()
    assert words_of_pieces(pieces) == ["A", "b@@"]
    assert align_pieces(pieces, ["A", "b@@"], closed_end=True).tolist() == [0, 1, 1, 1, 1]
    assert words_of_pieces(["@@"]) == ["@@"] and words_of_pieces([]) == []


def test_structural_inference_copes_with_typed_lines():
    """The task's inference dataset (what fairseq-interactive and the hub build) for typed BPE lines:
    a final ``@@``, a bare ``@@``, an empty line, a piece outside the dictionary; every sentence gets
    side data for each of its tokens and the EOS, and the batch's order is kept."""
    dictionary = Dictionary()
    for symbol in "A man in a re@@ d hat . Two dogs run @@".split():
        dictionary.add_symbol(symbol)
    task = TranslationStructuralTask(TranslationStructuralConfig(required_seq_len_multiple=1), dictionary, dictionary)
    lines = ["A man in a re@@", "", "@@", "Two dogs run .", "A man in a re@@ d zebra hat ."]
    tokens = [dictionary.encode_line(line, add_if_not_exist=False).long() for line in lines]
    dataset = task.build_dataset_for_inference(tokens, [len(t) for t in tokens])
    for k, source in enumerate(tokens):
        item = dataset[k]
        assert torch.equal(item["source"], source)
        assert item["structure"].shape == (3, len(source))
    assert dataset[1]["structure"].tolist() == [[0], [-1], [-1]]  # the EOS alone
    _words, heads, _ = task.parser.parse([["Two", "dogs", "run", "."]])[0]
    assert torch.equal(dataset[3]["structure"], torch.from_numpy(token_side_data(heads, [0, 1, 2, 3])).long())
    assert task.source_structure([tokens[0][:-1]])[0].shape == (3, 5)  # no EOS, no EOS slot
