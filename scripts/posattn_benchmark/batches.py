"""Synthetic batches, the same in every worker (same seed, checked by hash): Multi30k-like sentence
pairs collated as fairseq's ``LanguagePairDataset`` does, language-model samples as
``--task language_modeling`` does, and the structural side data of real UD trees for the sources.

torch, numpy and fairseq are imported inside the functions: only the workers build batches.
"""

import bisect
import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

#: BPE pieces per word of the synthetic structural sources (EWT with 2,000 merges: about 1.5)
PIECES_PER_WORD = 1.5


@dataclass(frozen=True)
class BatchShape:
    """Synthetic batches: lengths (EOS included) uniform in [min_len, max_len], as many sentence
    pairs per batch as fit in ``max_tokens`` padded tokens (fairseq's ``--max-tokens`` rule), and
    at most ``max_sentences`` of them when that is positive (``--batch-size``)."""

    min_len: int
    max_len: int
    max_tokens: int
    max_sentences: int = 0

    def describe(self) -> str:
        if self.min_len == self.max_len:
            rows = self.max_tokens // self.max_len
            if self.max_sentences:
                rows = min(rows, self.max_sentences)
            return f"{rows} x {self.max_len} tokens per batch"
        limit = f" and {self.max_sentences} sentences" if self.max_sentences else ""
        return (f"up to {self.max_tokens} padded tokens{limit} per batch, source and target lengths "
                f"uniform in [{self.min_len}, {self.max_len}]")

    def sentences(self, max_sentences: int) -> "BatchShape":
        """The same lengths, at most ``max_sentences`` sentences per batch."""
        return BatchShape(self.min_len, self.max_len, self.max_tokens, max_sentences)


def make_dictionary(size: int) -> Any:
    """A fairseq ``Dictionary`` of exactly ``size`` symbols (the 4 specials included)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for index in range(size - len(dictionary)):
        dictionary.add_symbol(f"w{index}")
    return dictionary


def fill_batch(shape: BatchShape, draw: Callable[[], Tuple[Any, ...]]) -> List[Tuple[Any, ...]]:
    """Examples (tuples of token tensors) from ``draw`` while one more fits in ``shape.max_tokens``
    padded tokens (fairseq's ``--max-tokens`` rule) and ``shape.max_sentences`` (when positive)."""
    examples: List[Tuple[Any, ...]] = []
    width = 0
    while not shape.max_sentences or len(examples) < shape.max_sentences:
        example = draw()
        new_width = max(width, *(tokens.numel() for tokens in example))
        if examples and (len(examples) + 1) * new_width > shape.max_tokens:
            break
        examples.append(example)
        width = new_width
    return examples


def make_batches(dictionary: Any, shape: BatchShape, count: int, seed: int) -> List[Dict[str, Any]]:
    """``count`` batches collated as ``LanguagePairDataset`` does: left-padded source, right-padded
    target, ``prev_output_tokens`` with EOS moved to the front, sorted by source length."""
    import numpy as np
    import torch
    from fairseq.data.data_utils import collate_tokens

    rng = np.random.default_rng(seed)
    pad, eos = dictionary.pad(), dictionary.eos()

    def sentence(length: int) -> torch.Tensor:
        words = rng.integers(dictionary.nspecial, len(dictionary), size=length - 1)
        return torch.tensor(np.append(words, eos), dtype=torch.long)

    def pair() -> Tuple[torch.Tensor, torch.Tensor]:
        src_len, tgt_len = (int(n) for n in rng.integers(shape.min_len, shape.max_len + 1, size=2))
        return sentence(src_len), sentence(tgt_len)

    batches = []
    for _ in range(count):
        pairs = sorted(fill_batch(shape, pair), key=lambda pair: -pair[0].numel())
        sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
        batches.append({
            "net_input": {
                "src_tokens": collate_tokens(sources, pad, eos, left_pad=True),
                "src_lengths": torch.tensor([s.numel() for s in sources]),
                "prev_output_tokens": collate_tokens(targets, pad, eos, left_pad=False,
                                                     move_eos_to_beginning=True),
            },
            "target": collate_tokens(targets, pad, eos, left_pad=False),
        })
    return batches


def make_lm_batches(dictionary: Any, shape: BatchShape, count: int, seed: int) -> List[Dict[str, Any]]:
    """``count`` language-model batches as fairseq's ``--task language_modeling`` collates them:
    samples of lengths uniform in ``[min_len, max_len]`` (``--sample-break-mode eos``; blocks of
    ``--sample-break-mode none`` when the two are equal), right-padded, the target being the
    sample shifted by one token."""
    import numpy as np
    import torch
    from fairseq.data.data_utils import collate_tokens

    rng = np.random.default_rng(seed)
    pad = dictionary.pad()

    def sample() -> Tuple[torch.Tensor, torch.Tensor]:
        length = int(rng.integers(shape.min_len, shape.max_len + 1))
        stream = torch.from_numpy(rng.integers(dictionary.nspecial, len(dictionary), size=length + 1))
        return stream[:-1], stream[1:]

    batches = []
    for _ in range(count):
        samples = fill_batch(shape, sample)
        batches.append({
            "net_input": {"src_tokens": collate_tokens([s for s, _ in samples], pad, left_pad=False),
                          "src_lengths": torch.tensor([s.numel() for s, _ in samples])},
            "target": collate_tokens([t for _, t in samples], pad, left_pad=False),
        })
    return batches


def load_trees(path: str) -> List[List[int]]:
    """The CoNLL-U heads of every sentence of ``path``, fewest words first."""
    from fairseq_posattn.structure.conllu_io import read_conllu

    return sorted((sentence.heads for sentence in read_conllu(path)), key=len)


def forest_side_data(tokens: int, trees: Sequence[List[int]], sizes: Sequence[int], rng: Any) -> Any:
    """``(3, tokens)`` side data (depth, tin, tout) of a source of ``tokens - 1`` pieces and EOS.

    The parse is a forest of random ``trees`` (sorted by ``sizes``, their word counts) of about
    ``pieces / PIECES_PER_WORD`` words in all, drawn one by one among those that still fit; every
    word gets one piece and random words one more each (their subwords) until the pieces are used.
    """
    import numpy as np
    from fairseq_posattn.structure.side_data import token_side_data

    pieces = tokens - 1
    room = max(1, round(pieces / PIECES_PER_WORD))
    heads: List[int] = []
    while (fitting := bisect.bisect_right(sizes, room)) > 0:
        tree = trees[int(rng.integers(fitting))]
        heads += [head + len(heads) if head else 0 for head in tree]
        room -= len(tree)
    if not heads:
        raise ValueError(f"no tree of at most {room} words for a source of {pieces} pieces: use a "
                         "--conllu with shorter sentences, or a larger --min-len")
    extra = rng.integers(len(heads), size=pieces - len(heads))
    return token_side_data(heads, np.sort(np.concatenate([np.arange(len(heads)), extra])))


def add_structure(batches: Sequence[Dict[str, Any]], trees: Sequence[List[int]], seed: int) -> None:
    """Put ``src_structure`` ``(batch, 3, src_len)`` into every batch's ``net_input``, collated as
    ``--task translation_structural`` does (left-padded like the source, batch order)."""
    import numpy as np
    import torch
    from fairseq_posattn.data.structural_dataset import collate_structure

    rng = np.random.default_rng(seed)
    sizes = [len(tree) for tree in trees]
    for batch in batches:
        net_input = batch["net_input"]
        sides = [torch.from_numpy(forest_side_data(int(n), trees, sizes, rng)).long()
                 for n in net_input["src_lengths"]]
        net_input["src_structure"] = collate_structure(sides, net_input["src_tokens"], left_pad=True)


def add_side_data(batches: Sequence[Dict[str, Any]], side_data: Mapping[str, Any], pad: int) -> None:
    """Put the side data of every registered method (``side_data``: ``BatchSideData`` by ``net_input`` key) that
    the batches do not carry yet into their ``net_input``: each method's example data for the source, padded as
    it is (the parses come from real trees: :func:`add_structure`)."""
    for batch in batches:
        net_input = batch["net_input"]
        for key, data in side_data.items():
            if key not in net_input:
                net_input[key] = data.collate(net_input["src_tokens"].eq(pad))


def batches_digest(batches: Sequence[Dict[str, Any]]) -> str:
    """A hash of the batches, so the parent can check that every worker saw the same data."""
    digest = hashlib.sha1()
    for batch in batches:
        for tensor in (*batch["net_input"].values(), batch["target"]):
            digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:12]

