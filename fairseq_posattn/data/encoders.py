"""``--tokenizer posattn_moses`` and ``--bpe posattn_subword_nmt``: ``posattn-prepare-translation``'s
own steps as fairseq encoders, for fairseq-interactive and the hub (docs/hub.md).

Raw input lines then go through exactly what the training data went through
(:mod:`fairseq_posattn.data.text_pipeline`): :func:`~fairseq_posattn.data.text_pipeline.moses_tokenizer`
(no escaping, no aggressive dash splits) and the subword-nmt segmenter of
:func:`~fairseq_posattn.data.text_pipeline.load_bpe`, the same calls on the same options.
Outputs are undone with :func:`~fairseq_posattn.data.text_pipeline.remove_bpe` and
:func:`~fairseq_posattn.data.text_pipeline.moses_detokenizer`.
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.data.encoders import register_bpe, register_tokenizer
from fairseq.dataclass import FairseqDataclass

from fairseq_posattn.data.text_pipeline import load_bpe, moses_detokenizer, moses_tokenizer, remove_bpe


@dataclass
class PosattnMosesConfig(FairseqDataclass):
    # fairseq-interactive fills these from --source-lang / --target-lang (the translation task's
    # options of the same name); the hub (fairseq_posattn.hub) from the checkpoint's task
    source_lang: Optional[str] = None
    target_lang: Optional[str] = None


@register_tokenizer("posattn_moses", dataclass=PosattnMosesConfig)
class PosattnMosesTokenizer:
    """Moses tokenization of the source language as ``posattn-prepare-translation`` applies it;
    Moses detokenization of the target language."""

    def __init__(self, cfg: PosattnMosesConfig):
        self.tokenize = moses_tokenizer(_language(cfg, "source_lang"))
        self.detokenize = moses_detokenizer(_language(cfg, "target_lang"))

    def encode(self, x: str) -> str:
        return self.tokenize(x)

    def decode(self, x: str) -> str:
        return self.detokenize(x)


def _language(cfg: PosattnMosesConfig, name: str) -> str:
    lang = getattr(cfg, name, None)
    if not lang:
        raise ValueError(f"--tokenizer posattn_moses needs the {name.replace('_', ' ')}uage: pass "
                         f"--{name.replace('_', '-')} to fairseq-interactive (the languages given to "
                         f"posattn-prepare-translation), or {name}=... to from_pretrained")
    return lang


@dataclass
class PosattnSubwordNMTConfig(FairseqDataclass):
    bpe_codes: Optional[str] = field(default=None, metadata={
        "help": "the bpe.codes that posattn-prepare-translation wrote"})


@register_bpe("posattn_subword_nmt", dataclass=PosattnSubwordNMTConfig)
class PosattnSubwordNMT:
    """subword-nmt segmentation with ``posattn-prepare-translation``'s codes and ``@@`` separator."""

    def __init__(self, cfg: PosattnSubwordNMTConfig):
        if not cfg.bpe_codes:
            raise ValueError("--bpe posattn_subword_nmt needs --bpe-codes (bpe_codes=... in from_pretrained): "
                             "the bpe.codes in posattn-prepare-translation's --out-dir")
        self.bpe = load_bpe(cfg.bpe_codes)

    def encode(self, x: str) -> str:
        return self.bpe.segment(x)

    def decode(self, x: str) -> str:
        return remove_bpe(x)
