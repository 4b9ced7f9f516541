"""Hub interfaces: ``Model.from_pretrained(...)`` for every model family of the plugin (docs/hub.md).

As fairseq's own models offer it (:func:`fairseq.hub_utils.from_pretrained`, checkpoint + data
directory + keyword overrides), the interface depends on the checkpoint's task:

- translation (``translation``, ``translation_structural``): fairseq's
  :class:`~fairseq.hub_utils.GeneratorHubInterface` (``translate``, ``sample``, ``generate``); a
  structural model parses its sources inside the task's inference path, as fairseq-interactive does.
- language models (``language_modeling``): :class:`LanguageModelHubInterface`, fairseq's interface
  whose ``score`` and ``perplexity`` score a sentence as ``fairseq-eval-lm --sample-break-mode eos`` does,
  or the sentences as one stream of blocks with a context window, as ``--sample-break-mode none
  --tokens-per-sample L --context-window C`` does (evaluation beyond the training length).
- the tagger (``pos_tagging``): :class:`TaggerHubInterface`, ``tag`` as ``posattn-tag`` tags.
- sentence classifiers (``sentence_prediction``): :class:`ClassifierHubInterface`, ``predict`` and
  ``probabilities`` of the labels, as fairseq-validate classifies.

:func:`from_pretrained` loads any of them without naming the architecture.
"""

import math
import os
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from fairseq import hub_utils, utils
from fairseq.data import LMContextWindowDataset, MonolingualDataset, TokenBlockDataset
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.data.data_utils import collate_tokens
from fairseq.sequence_scorer import SequenceScorer
from fairseq.tasks.language_modeling import LanguageModelingTask
from fairseq.tasks.sentence_prediction import SentencePredictionTask
from torch import nn

from fairseq_posattn.data.fingerprint import DataMismatchError
from fairseq_posattn.models.evaluation_coverage import check_hub_lengths, model_input_lengths
from fairseq_posattn.structure.alignment import BPE_SEPARATOR
from fairseq_posattn.tasks.pos_tagging import PosTaggingTask
from posattn.errors import UserError

#: ``max_tokens`` per batch when the checkpoint's config has neither --max-tokens nor --batch-size
#: (fairseq-eval-lm's own fallback)
DEFAULT_MAX_TOKENS = 36000
#: a source dictionary is one of BPE pieces when more than this share of its symbols end in ``@@``
BPE_SYMBOL_FRACTION = 0.01

Sentence = Union[str, Sequence[str]]


def from_pretrained(model_name_or_path: str, checkpoint_file: str = "model.pt", data_name_or_path: str = ".",
                    archive_map: Optional[Dict[str, Any]] = None, **kwargs) -> nn.Module:
    """Load checkpoint(s) and their task as fairseq's ``from_pretrained`` does (``kwargs`` override the
    checkpoint's config, e.g. ``tokenizer="posattn_moses"``) and wrap them in their family's interface.

    A data directory whose dictionaries are not those the checkpoint was trained with raises
    :class:`~fairseq_posattn.data.fingerprint.DataMismatchError` naming the checkpoint file; a tokenizer without
    the BPE of a model trained on BPE raises :class:`TokenizerWithoutBpeError`."""
    try:
        loaded = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                           archive_map=archive_map, **kwargs)
    except DataMismatchError as error:
        raise error.naming(os.path.join(model_name_or_path, checkpoint_file)) from None
    refuse_tokenizer_without_bpe(loaded["args"], loaded["task"])
    return hub_interface(loaded["args"], loaded["task"], loaded["models"])


class TokenizerWithoutBpeError(UserError, ValueError):
    """Raw text would be tokenized for a model trained on BPE pieces, but not segmented into them."""


def refuse_tokenizer_without_bpe(cfg: Any, task: Any) -> None:
    """Raise :class:`TokenizerWithoutBpeError` when ``cfg`` names a tokenizer but no BPE and the task's source
    dictionary is one of subword-nmt pieces: more than :data:`BPE_SYMBOL_FRACTION` of its symbols end in the
    continuation marker ``@@`` (Moses puts every ``@`` of real text in a token of its own). The words of raw text
    would then reach the model whole, and most of them as ``<unk>``."""
    tokenizer, dictionary = cfg.get("tokenizer"), getattr(task, "source_dictionary", None)
    if tokenizer is None or cfg.get("bpe") is not None or dictionary is None:
        return
    symbols = dictionary.symbols[dictionary.nspecial:]
    pieces = [symbol for symbol in symbols if symbol.endswith(BPE_SEPARATOR) and symbol != BPE_SEPARATOR]
    if len(pieces) <= BPE_SYMBOL_FRACTION * len(symbols):
        return
    raise TokenizerWithoutBpeError(
        f"the model was trained on BPE: {len(pieces)} of the {len(symbols)} symbols of its source dictionary (in "
        f"{task.cfg.data}) are subword-nmt pieces ending in '{BPE_SEPARATOR}' (e.g. {pieces[0]!r}). With "
        f"tokenizer={tokenizer.get('_name')!r} and no bpe, raw text would be tokenized but not segmented, and most "
        f"words would reach the model as <unk>: add bpe='posattn_subword_nmt', bpe_codes='PREPARED/bpe.codes' (the "
        f"bpe.codes that posattn-prepare-translation wrote in its --out-dir) to from_pretrained")


def hub_interface(cfg: Any, task: Any, models: List[nn.Module]) -> nn.Module:
    """The hub interface for ``task``'s family (see the module docstring)."""
    _languages_of_task(cfg, task)
    if isinstance(task, PosTaggingTask):
        return TaggerHubInterface(cfg, task, models)
    if isinstance(task, SentencePredictionTask):
        return ClassifierHubInterface(cfg, task, models)
    if isinstance(task, LanguageModelingTask):
        return LanguageModelHubInterface(cfg, task, models)
    return GeneratorHubInterface(cfg, task, models)


def _languages_of_task(cfg: Any, task: Any) -> None:
    """``--tokenizer posattn_moses`` tokenizes the task's source language and detokenizes its target
    language: fill in those the caller did not give (fairseq infers them from the data directory)."""
    tokenizer = cfg.get("tokenizer")
    if tokenizer is None or tokenizer.get("_name") != "posattn_moses":
        return
    for name in ("source_lang", "target_lang"):
        if tokenizer.get(name) is None:
            tokenizer[name] = getattr(task.cfg, name, None)


class LanguageModelHubInterface(GeneratorHubInterface):
    """fairseq's interface (``sample``, ``generate``) whose ``score`` scores what fairseq-eval-lm scores.

    fairseq's own ``score`` predicts a sentence's words but not its end; fairseq-eval-lm with
    ``--sample-break-mode eos`` scores every sentence separately (context: the sentence so far, from
    the end-of-sentence symbol, or ``<s>`` with ``--add-bos-token``) over its words **and** its end
    of sentence. :meth:`score` does the latter, so :meth:`perplexity` of some sentences equals the
    ``Perplexity`` fairseq-eval-lm prints for a file of those sentences, one per line, binarized with
    the model's dictionary.

    ``sample_break_mode="none"`` (or ``"complete"``) with ``tokens_per_sample=L`` and ``context_window=C``
    scores the sentences as fairseq-eval-lm scores such a file with ``--sample-break-mode none
    --tokens-per-sample L --context-window C``: one stream (each sentence followed by its end of sentence),
    cut into blocks of ``L - C`` tokens, each read with up to C earlier tokens (C = 0: non-overlapping
    blocks; C = L - 1: a sliding window). Sequences longer than the model's positions are refused before
    anything is scored, in one line that says how to load the model for them (``max_target_positions=``)
    or, for a model whose parameters are tied to its positions, what ties it.
    """

    def score(self, sentences: Union[str, List[str]], *, sample_break_mode: str = "eos",
              tokens_per_sample: Optional[int] = None, context_window: int = 0,
              **kwargs) -> Union[Dict[str, torch.Tensor], List[Dict[str, torch.Tensor]]]:
        """With ``sample_break_mode="eos"``: per sentence (a string: that one's) fairseq's hypothesis dict,
        ``tokens`` (the words and the end of sentence), ``positional_scores`` (natural log-probabilities
        of those tokens) and ``score`` (their mean). Otherwise: one such dict per block of the stream, in
        order, over the block's scored tokens (not its context). ``kwargs``: ``max_tokens`` / ``batch_size``."""
        if isinstance(sentences, str):
            scored = self.score([sentences], sample_break_mode=sample_break_mode, tokens_per_sample=tokens_per_sample,
                                context_window=context_window, **kwargs)
            return scored[0] if sample_break_mode == "eos" else scored
        return self.score_tokens([self.encode(sentence) for sentence in sentences], sample_break_mode=sample_break_mode,
                                 tokens_per_sample=tokens_per_sample, context_window=context_window, **kwargs)

    def score_tokens(self, tokenized_sentences: List[torch.LongTensor], max_tokens: Optional[int] = None,
                     batch_size: Optional[int] = None, *, sample_break_mode: str = "eos",
                     tokens_per_sample: Optional[int] = None, context_window: int = 0
                     ) -> List[Dict[str, torch.Tensor]]:
        """:meth:`score` of binarized sentences, each ending with the end-of-sentence symbol."""
        dataset = self._eval_lm_dataset(tokenized_sentences, sample_break_mode, tokens_per_sample, context_window)
        max_positions = utils.resolve_max_positions(*[m.max_positions() for m in self.models])
        limits = [getattr(m, "fixed_position_limit", None) for m in self.models]
        check_hub_lengths(model_input_lengths(dataset.sizes, context_window), max_positions,
                          next((limit for limit in limits if limit), None), context_window)
        if context_window > 0:
            dataset = LMContextWindowDataset(dataset, tokens_per_sample - context_window, context_window,
                                             self.task.source_dictionary.pad())
        batches = self.task.get_batch_iterator(
            dataset=dataset,
            max_tokens=max_tokens or self.cfg.dataset.max_tokens or DEFAULT_MAX_TOKENS,
            max_sentences=batch_size or self.cfg.dataset.batch_size,
            # the lengths are checked above, with the context window fairseq's check leaves out
            max_positions=None if context_window > 0 else max_positions,
            ignore_invalid_inputs=False, disable_iterator_cache=True,
        ).next_epoch_itr(shuffle=False)
        scorer = SequenceScorer(self.task.target_dictionary)
        results: List[Optional[Dict[str, torch.Tensor]]] = [None] * len(dataset)
        for batch in batches:
            if "net_input" not in batch:
                continue
            batch = utils.apply_to_sample(lambda t: t.to(self.device), batch)
            for index, hypos in zip(batch["id"].tolist(), scorer.generate(self.models, batch)):
                results[index] = self._without_bos(hypos[0])
        return results

    def perplexity(self, sentences: List[str], **kwargs) -> float:
        """2 ** (mean negative log2-probability over every scored token of ``sentences``), skipping
        infinite scores as fairseq-eval-lm does: its ``Perplexity`` on the same sentences, with the same
        ``sample_break_mode``, ``tokens_per_sample`` and ``context_window``."""
        scored = self.score(sentences, **kwargs)
        scored = [scored] if isinstance(scored, dict) else scored
        scores = torch.cat([hypo["positional_scores"].double().cpu() for hypo in scored])
        scores = scores[torch.isfinite(scores)]
        if not len(scores):
            raise ValueError("no token to score: give at least one sentence")
        return 2 ** (-scores.sum().item() / len(scores) / math.log(2))

    def _eval_lm_dataset(self, tokenized_sentences: List[torch.LongTensor], sample_break_mode: str = "eos",
                         tokens_per_sample: Optional[int] = None, context_window: int = 0) -> MonolingualDataset:
        """The dataset fairseq's ``language_modeling`` task builds for fairseq-eval-lm: with
        ``sample_break_mode="eos"`` one block per sentence; otherwise blocks of ``tokens_per_sample -
        context_window`` tokens of the sentences' stream (fairseq-eval-lm subtracts the window too);
        targets shifted by one."""
        if sample_break_mode not in ("eos", "none", "complete", "complete_doc"):
            raise ValueError(f"sample_break_mode must be eos, none, complete or complete_doc, not {sample_break_mode!r}")
        if context_window < 0:
            raise ValueError(f"context_window must be 0 or more, got {context_window}")
        block_size = None
        if sample_break_mode != "eos":
            if tokens_per_sample is None:
                raise ValueError(f"sample_break_mode={sample_break_mode!r} needs tokens_per_sample (the block length)")
            block_size = tokens_per_sample - context_window
            if block_size < 1:
                raise ValueError(f"context_window ({context_window}) must be below tokens_per_sample "
                                 f"({tokens_per_sample}): fairseq-eval-lm scores blocks of the difference")
        elif context_window:
            raise ValueError("the hub scores sentences (sample_break_mode='eos') without earlier sentences as "
                             "context: context_window needs a block mode, sample_break_mode='none' or 'complete'")
        dictionary = self.task.source_dictionary
        blocks = TokenBlockDataset(tokenized_sentences, [len(t) for t in tokenized_sentences], block_size=block_size,
                                   pad=dictionary.pad(), eos=dictionary.eos(), break_mode=sample_break_mode,
                                   include_targets=True)
        return MonolingualDataset(blocks, blocks.sizes, dictionary, self.task.target_dictionary,
                                  add_eos_for_other_targets=sample_break_mode != "none", shuffle=False,
                                  targets=self.task.targets, add_bos_token=self._add_bos_token)

    @property
    def _add_bos_token(self) -> bool:
        return bool(getattr(self.task.args, "add_bos_token", False))

    def _without_bos(self, hypo: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """With ``--add-bos-token`` fairseq-eval-lm drops the score of the leading ``<s>``."""
        if not self._add_bos_token:
            return hypo
        scores = hypo["positional_scores"][1:]
        return {**hypo, "tokens": hypo["tokens"][1:], "positional_scores": scores, "score": scores.mean()}


class SingleModelHubInterface(nn.Module):
    """The interface of one model in evaluation mode, its task and config; ``.cuda()`` moves it."""

    family = "model"

    def __init__(self, cfg: Any, task: Any, models: List[nn.Module]):
        super().__init__()
        if len(models) != 1:
            raise ValueError(f"the {self.family}'s hub interface takes one checkpoint, got {len(models)} "
                             "(checkpoint_file names several, separated by ':')")
        self.cfg = cfg
        self.task = task
        self.models = nn.ModuleList(models)
        self.models[0].eval()
        self.register_buffer("_float_tensor", torch.tensor([0], dtype=torch.float))

    @property
    def device(self) -> torch.device:
        return self._float_tensor.device


class TaggerHubInterface(SingleModelHubInterface):
    """Part-of-speech tags of tokenized sentences from a ``san_tagger`` checkpoint (``--task pos_tagging``).

    Words are given as the treebank tokenizes them (no tokenizer is applied); sentences longer than
    the prepared ``--max-length`` are tagged in consecutive pieces, as ``posattn-tag`` and training do
    (:meth:`fairseq_posattn.tasks.pos_tagging.PosTaggingTask.tag_sentences`).
    """

    family = "tagger"

    @property
    def tag_column(self) -> str:
        """``upos`` or ``xpos``: the CoNLL-U column the model was trained on."""
        return self.task.settings.tag_column

    def tag(self, sentences: Union[str, Sequence[Sentence]], batch_size: int = 64
            ) -> Union[List[str], List[List[str]]]:
        """The tag of every word: ``tag("The cat sat")`` -> one list of tags; ``tag(sentences)`` ->
        one list per sentence, each sentence a whitespace-separated string or a list of words."""
        if isinstance(sentences, str):
            return self.tag([sentences], batch_size)[0]
        words = [sentence.split() if isinstance(sentence, str) else list(sentence) for sentence in sentences]
        return self.task.tag_sentences(self.models[0], words, batch_size)


class ClassifierHubInterface(SingleModelHubInterface):
    """Labels of sentences from a classifier trained with ``--task sentence_prediction`` (e.g.
    ``transformer_posattn_classifier``): each sentence binarized as fairseq-preprocess binarized the
    training sentences (the words as written, end of sentence appended, ``--init-token`` prepended if the
    task has one), right-padded in batches as the task pads them, through the task's classification head.
    Sentences are given as they were prepared (SST-2: tokenized, lower-cased); pairs of sentences and
    regression targets are not supported.
    """

    family = "classifier"

    def __init__(self, cfg: Any, task: SentencePredictionTask, models: List[nn.Module]):
        if task.cfg.regression_target:
            raise ValueError("the checkpoint predicts a regression target, not labels: ClassifierHubInterface "
                             "returns labels only")
        super().__init__(cfg, task, models)

    @property
    def labels(self) -> List[str]:
        """The labels in the order of the head's outputs (fairseq's label index = dictionary index -
        ``nspecial``)."""
        dictionary = self.task.label_dictionary
        return [dictionary[dictionary.nspecial + i] for i in range(self.task.cfg.num_classes)]

    def encode(self, sentence: str) -> torch.LongTensor:
        """The token ids the model reads for ``sentence``; raises ValueError past the model's positions."""
        tokens = self.task.source_dictionary.encode_line(sentence, add_if_not_exist=False, append_eos=True).long()
        if self.task.cfg.init_token is not None:
            tokens = torch.cat([tokens.new_tensor([self.task.cfg.init_token]), tokens])
        limit = self.models[0].max_positions()
        if isinstance(limit, int) and len(tokens) > limit:
            raise ValueError(f"{sentence[:60]!r}... has {len(tokens)} tokens with its end of sentence; the model "
                             f"reads at most {limit} (--max-positions)")
        return tokens

    def probabilities(self, sentences: Union[str, Sequence[str]], batch_size: int = 64
                      ) -> Union[Dict[str, float], List[Dict[str, float]]]:
        """Per sentence (a string: that one's) the softmax of the head's logits, by label."""
        if isinstance(sentences, str):
            return self.probabilities([sentences], batch_size)[0]
        labels = self.labels
        return [dict(zip(labels, row.tolist())) for row in self._probabilities(list(sentences), batch_size)]

    def predict(self, sentences: Union[str, Sequence[str]], batch_size: int = 64) -> Union[str, List[str]]:
        """The most probable label of each sentence (a string: that one's)."""
        if isinstance(sentences, str):
            return self.predict([sentences], batch_size)[0]
        labels = self.labels
        return [labels[i] for i in self._probabilities(list(sentences), batch_size).argmax(-1).tolist()]

    @torch.no_grad()
    def _probabilities(self, sentences: List[str], batch_size: int) -> torch.Tensor:
        """``(sentences, labels)`` probabilities in fp32, batch by batch in the given order."""
        pad = self.task.source_dictionary.pad()
        head = self.task.cfg.classification_head_name
        rows = []
        for start in range(0, len(sentences), batch_size):
            tokens = [self.encode(sentence) for sentence in sentences[start:start + batch_size]]
            src_tokens = collate_tokens(tokens, pad_idx=pad).to(self.device)
            src_lengths = torch.tensor([len(t) for t in tokens], device=self.device)
            logits, _ = self.models[0](src_tokens, src_lengths=src_lengths, features_only=True,
                                       classification_head_name=head)
            rows.append(torch.softmax(logits.float(), dim=-1).cpu())
        return torch.cat(rows) if rows else torch.zeros(0, len(self.labels))
