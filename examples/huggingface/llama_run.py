"""One run of the recipe (a method and a seed) with the Llama model: train with ``Trainer`` on blocks of the
training length, then score the evaluation split in every mode at every length with examples/pytorch's
evaluation; its records, ``train.log`` and ``run.json`` are written as examples/pytorch's are
(``OUT/<method>/seed<N>/``, the records last, each file under a temporary name and renamed). A run whose
``results.json`` exists is finished and is not redone."""

from dataclasses import asdict
from pathlib import Path

from data import Corpus, training_blocks
from experiment import Protocol, begin_run
from llama_model import LlamaSize, NextTokenLogits, build_model, parameter_count
from trainer_training import WARMUP_INIT_LR, train
from training import Budget


def budget_text(size: LlamaSize, budget: Budget, protocol: Protocol) -> str:
    """The run's budget in words, as the evidence runs' ``run.json`` states theirs."""
    lengths = ", ".join(str(length) for length in protocol.lengths)
    return (f"one token stream cut into blocks of {protocol.train_length} tokens; {budget.updates} updates of "
            f"{budget.batch_size} blocks with transformers.Trainer (LlamaForCausalLM: {size.layers} pre-norm layers "
            f"x {size.dim}, SwiGLU {size.intermediate_size}, {size.heads} heads; tied embeddings; attention dropout "
            f"{size.attention_dropout}); AdamW betas (0.9, 0.98) without weight decay, lr {budget.lr}, inverse sqrt, "
            f"{budget.warmup_updates} warm-up updates from {budget.warmup_init_lr}, clip-norm {budget.clip_norm}; "
            f"the evaluation split at L = {lengths} tokens, {' and '.join(protocol.modes)}")


def run(corpus: Corpus, method: str, seed: int, size: LlamaSize, budget: Budget, protocol: Protocol,
        out: Path, command: str) -> Path:
    """Trains and scores one model unless its results exist; returns its ``results.json``. ``command``: the
    command line that runs it, for its ``run.json``."""
    started = begin_run(out, method, seed)
    if isinstance(started, Path):
        return started
    budget = Budget(**dict(asdict(budget), warmup_init_lr=WARMUP_INIT_LR))
    model = build_model(len(corpus.dictionary), method, size, protocol, seed)
    started.introduce(parameter_count(model), corpus)
    inputs, targets = training_blocks(corpus.train, protocol.train_length)
    train_seconds = train(model, inputs, targets, budget, seed, started.log, started.folder)
    return started.finish(NextTokenLogits(model), parameter_count(model), train_seconds, corpus, protocol, command,
                          budget_text(size, budget, protocol), {"size": asdict(size), "budget": asdict(budget)})
