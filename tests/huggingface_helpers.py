"""Small Hugging Face models for the tests of posattn_huggingface (tests/test_huggingface.py,
tests/test_huggingface_training.py, tests/huggingface_ddp_train.py): Llama, GPT-2 and BERT from configs (hidden 32,
2 layers, 4 heads, Llama with 2 key/value heads, vocabulary 100), the methods they are checked with, their outputs;
and what ``transformers.Trainer`` trains them on: the PTB sample (data/ptb_sample) by characters. Imports
transformers: a test module imports it after ``pytest.importorskip("transformers")``."""

import functools
import os
from typing import Any, Callable, Dict, Iterator, List

import pytest
import torch
import transformers

import posattn_huggingface as hf
from posattn.position_terms.registry import methods_of

VOCAB = 100
#: the methods checked on every model type that takes them (position_options' names)
METHODS: Dict[str, Dict[str, Any]] = {
    "alibi": {"alibi": True},
    "t5-bias": {"t5_relative_bias": 8, "t5_max_distance": 16},
    "kerple-log": {"kerple": "log"},
    "direct-relative": {"direct_position": "relative"},
    "distance-aware": {"distance_aware": True},
}
#: the methods of causal models only, and those whose decoding keeps state beside the keys (the convolutions' rows,
#: FoX's gates, which read the layer input) or reads every key anew (CoPE)
STATEFUL_METHODS: Dict[str, Dict[str, Any]] = {
    "conv-1d": {"conv_attention": "1d"},
    "conv-2d": {"conv_attention": "2d"},
    "cope": {"cope": 8},
    "forget-gate": {"forget_gate": True},
    "path-attention": {"path_attention": True},
    "multi-token-attention": {"multi_token_attention": True, "mta_query_kernel": 3, "mta_key_kernel": 3},
}
#: the methods generation is checked with: additive biases, query/key transforms (the cached keys transformed
#: again at their positions) and the stateful ones
DECODING_METHODS = {name: METHODS[name] for name in ("alibi", "t5-bias")} | {"rotary": {"rotary": True},
                                                                              "xpos": {"xpos": True}} | STATEFUL_METHODS
#: the methods the switch refuses (the learnable temperature rescales projection weights that transformers applies
#: before the attention function), by name: the options of their first variant
REFUSED_METHODS = {"learnable-temperature": {"learnable_temperature": True}}
#: every registered method a causal model takes (the registry's but the refused), by name: the options of its first
#: variant; and "none", the switch without a method
CAUSAL_METHODS: Dict[str, Dict[str, Any]] = {"none": {}} | {
    method.name: dict(next(iter(method.variants.values()))) for method in methods_of("decoder")
    if method.name not in REFUSED_METHODS}


def llama(**config: Any) -> Any:
    """``config``: the configuration's other values (dropout, ...)."""
    config = transformers.LlamaConfig(**{
        "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "bos_token_id": None, "eos_token_id": None, **config})  # generation runs its full length
    return transformers.LlamaForCausalLM(config)


def gpt2(**config: Any) -> Any:
    config = transformers.GPT2Config(**{"vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 4,
                                        "n_positions": 64, "bos_token_id": None, "eos_token_id": None, **config})
    return transformers.GPT2LMHeadModel(config)


def bert(**config: Any) -> Any:
    config = transformers.BertConfig(**{"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
                                        "num_hidden_layers": 2, "num_attention_heads": 4,
                                        "max_position_embeddings": 64, **config})
    return transformers.BertModel(config)


MODELS: Dict[str, Callable[..., Any]] = {"llama": llama, "gpt2": gpt2, "bert": bert}
DECODERS = ("llama", "gpt2")


def built(kind: str, seed: int = 0, attn_implementation: str = "sdpa") -> Any:
    """The model of ``kind`` in fp64, in evaluation mode, its weights drawn from ``seed``."""
    torch.manual_seed(seed)
    model = MODELS[kind]().double().eval()
    model.set_attn_implementation(attn_implementation)
    return model


def switched(kind: str, seed: int = 0, **options: Any) -> Any:
    return hf.apply_position_method(built(kind, seed), **options)


def padded_batch(side: str, length: int = 8) -> Dict[str, torch.Tensor]:
    """Three sequences of ``length``, ``length - 3`` and ``length - 1`` tokens, padded on ``side``."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, length), generator=generator)
    mask = torch.ones(3, length, dtype=torch.long)
    for row, pads in ((1, 3), (2, 1)):
        mask[row, :pads] = 0 if side == "left" else 1
        mask[row, length - pads:] = 0 if side == "right" else 1
    return {"ids": ids.masked_fill(mask == 0, 0), "mask": mask}


def assert_generation_with_the_cache_is_without_it(model: Any, batch: Dict[str, torch.Tensor], new: int = 5) -> None:
    """Greedy and beam search (3 beams) from the left-padded prompts ``batch`` with the cache equal them without it,
    and greedy decoding is the full forward's argmax at every new token."""
    prompt = {"input_ids": batch["ids"], "attention_mask": batch["mask"], "max_new_tokens": new, "do_sample": False,
              "pad_token_id": 0}
    for beams in (1, 3):
        cached = model.generate(**prompt, num_beams=beams)
        assert torch.equal(cached, model.generate(**prompt, num_beams=beams, use_cache=False)), beams
    greedy = model.generate(**prompt)
    length = batch["ids"].size(1)
    mask = torch.cat([batch["mask"], torch.ones(len(greedy), new, dtype=torch.long)], dim=1)
    assert torch.equal(output(model, greedy, mask)[:, length - 1:-1].argmax(dim=-1), greedy[:, length:])


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """torch on one thread in the tests of a module that imports it (models this small run several times faster so
    on shared cores), as it was after them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def output(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The logits of a model with a language-model head, the last hidden states of one without."""
    result = model(input_ids=ids, attention_mask=mask)
    return result.logits if hasattr(result, "logits") else result.last_hidden_state


# ----------------------------------------------------------------- the PTB sample by characters, and Trainer
PTB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "ptb_sample")
#: an example of a dataset: ``{"input_ids": [...]}``
Example = Dict[str, List[int]]


def ptb_text(split: str) -> str:
    with open(os.path.join(PTB, f"{split}.txt"), encoding="utf-8") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def ptb_characters() -> Dict[str, int]:
    """The characters of the sample's training and validation text, numbered from 1 (0 pads): 49 of them."""
    return {character: index + 1 for index, character in enumerate(sorted(set(ptb_text("train") + ptb_text("valid"))))}


def ptb_lines(split: str, count: int, length: int) -> List[Example]:
    """The split's first ``count`` sentences, each its first ``length`` characters (fewer for a short one)."""
    characters = ptb_characters()
    return [{"input_ids": [characters[c] for c in line[:length]]} for line in ptb_text(split).splitlines()[:count]]


def ptb_blocks(split: str, count: int, length: int) -> List[Example]:
    """The split's first ``count * length`` characters (newlines included) cut into ``count`` blocks of ``length``."""
    characters = ptb_characters()
    ids = [characters[c] for c in ptb_text(split)[:count * length]]
    return [{"input_ids": ids[start:start + length]} for start in range(0, count * length, length)]


def collate(examples: List[Example]) -> Dict[str, torch.Tensor]:
    """A batch padded on the right with 0: ``input_ids``, ``attention_mask`` and ``labels`` (-100 at padding)."""
    length = max(len(example["input_ids"]) for example in examples)
    ids = torch.zeros(len(examples), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, example in enumerate(examples):
        ids[row, :len(example["input_ids"])] = torch.tensor(example["input_ids"])
        mask[row, :len(example["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def cpu_trainer(model: Any, output_dir: str, train: List[Example], **arguments: Any) -> Any:
    """``transformers.Trainer`` on the CPU, AdamW at a constant learning rate of 1e-2, batches of 8, the loss logged
    at every step, nothing saved or reported; ``arguments``: other ``TrainingArguments`` (``max_steps``, ...)."""
    args = transformers.TrainingArguments(**{
        "output_dir": output_dir, "use_cpu": True, "per_device_train_batch_size": 8, "learning_rate": 1e-2,
        "lr_scheduler_type": "constant", "logging_steps": 1, "save_strategy": "no", "report_to": "none",
        "disable_tqdm": True, "seed": 0, **arguments})
    return transformers.Trainer(model=model, args=args, train_dataset=train, data_collator=collate)


def training_losses(trainer: Any) -> List[float]:
    """The loss that ``trainer`` logged at each step."""
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
