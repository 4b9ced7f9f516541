"""Sharded training (FSDP2) across two CPU processes (gloo) of a plain PyTorch model with
:class:`posattn.SelfAttention` layers and of a switched Hugging Face Llama (accelerate's FSDP does not run on CPU
processes: docs/distributed.md): :func:`posattn.fully_shard_layers` trains as one process on both ranks' batches,
for a side-wide module (T5's table, made by the first layer and read by the second) and per-layer ones (FIRE's MLP
and the direct positions); the sharded checkpoint (``torch.distributed.checkpoint``) loads back, into sharded and
unsharded models, with the method; FSDP2 sharding per layer without the helper is refused in one line naming it,
and the helper for a model sharded elsewhere (:func:`posattn.keep_side_wide_modules_gathered`) makes it train right.

One spawn of two processes runs every scenario (:func:`worker`); the tests read what it wrote.
"""

import importlib.util
import logging
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor, nn

import posattn

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without torch.distributed")

VOCAB, WIDTH, HEADS, LAYERS, LENGTH = 50, 32, 4, 2, 12
#: the per-process batch; one process takes both ranks' rows
ROWS, STEPS, LEARNING_RATE = 2, 3, 0.5
METHODS: Dict[str, Dict[str, Any]] = {
    "t5-bias (side-wide)": {"t5_relative_bias": 8, "t5_max_distance": 16},
    "fire + direct both (per layer)": {"fire": True, "direct_position": "both"},
}
#: the models: posattn.SelfAttention blocks, and a switched Hugging Face Llama where transformers is installed
KINDS = ("plain", "llama") if importlib.util.find_spec("transformers") else ("plain",)
RUNS = [(kind, method) for kind in KINDS for method in METHODS]


class Block(nn.Module):
    def __init__(self, options: posattn.SidePositionOptions, index: int):
        super().__init__()
        self.attn = posattn.SelfAttention(WIDTH, HEADS, causal=True, options=options, layer_index=index)
        self.ff = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: Tensor, context: Any) -> Tensor:
        x = x + self.attn(x, context=context)
        return x + torch.tanh(self.ff(x))


class LanguageModel(nn.Module):
    """Embedding, :data:`LAYERS` blocks sharing one options object, output projection; returns every token's loss
    of predicting the next token (not a view: FSDP2 warns of an output that is one)."""

    def __init__(self, method: Dict[str, Any], seed: int):
        super().__init__()
        torch.manual_seed(seed)
        options = posattn.position_options(True, 64, **method)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block(options, index) for index in range(LAYERS))
        self.out = nn.Linear(WIDTH, VOCAB)
        self.double()

    def forward(self, tokens: Tensor) -> Tensor:
        context = posattn.batch_context(None, True, tokens.size(1) - 1, tokens.device)
        x = self.embed(tokens[:, :-1])
        for block in self.blocks:
            x = block(x, context)
        return F.cross_entropy(self.out(x).flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")


class SwitchedLlama(nn.Module):
    """tests/huggingface_helpers.py's Llama (2 layers) switched to ``method``, in fp64; returns every token's loss
    as :class:`LanguageModel` does."""

    def __init__(self, method: Dict[str, Any], seed: int):
        super().__init__()
        import posattn_huggingface as hf
        from huggingface_helpers import llama
        torch.manual_seed(seed)
        self.llama = hf.apply_position_method(llama(vocab_size=VOCAB).double(), **method)
        self.blocks = self.llama.model.layers

    def forward(self, tokens: Tensor) -> Tensor:
        logits = self.llama(input_ids=tokens[:, :-1]).logits
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")


def build(kind: str, method: str, seed: int) -> nn.Module:
    return (LanguageModel if kind == "plain" else SwitchedLlama)(METHODS[method], seed)


def batches() -> List[Tensor]:
    """Each step's tokens of both ranks: rank r takes rows ``r * ROWS ...``."""
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (2 * ROWS, LENGTH), generator=generator) for _ in range(STEPS + 1)]


def train(model: nn.Module, rows: slice) -> nn.Module:
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    for tokens in batches()[:STEPS]:
        model(tokens[rows]).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def full(parameters: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """Sharded parameters gathered (``DTensor.full_tensor``), detached."""
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in parameters.items()}


def sharded_scenarios(rank: int, folder: Path) -> Dict[Any, Any]:
    """What rank ``rank`` measures: per run, :func:`trained_and_reloaded`; then :func:`misuse_and_its_fix`."""
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    return {**{run: trained_and_reloaded(run, rows, folder) for run in RUNS}, **misuse_and_its_fix(rows)}


def trained_and_reloaded(run: Tuple[str, str], rows: slice, folder: Path) -> Dict[str, Any]:
    """The model of ``run`` sharded by :func:`posattn.fully_shard_layers` and trained on ``rows``: its parameters,
    its held-out losses, and those of a fresh sharded model loaded from its sharded checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    held_out, checkpoint = batches()[-1], str(checkpoint_folder(folder, run))
    model = build(*run, seed=0)
    posattn.fully_shard_layers(model, model.blocks)
    train(model, rows)
    found = {"parameters": full(dict(model.named_parameters())), "losses": model(held_out).detach()}
    dcp.save(get_model_state_dict(model), checkpoint_id=checkpoint)
    fresh = build(*run, seed=1)
    posattn.fully_shard_layers(fresh, fresh.blocks)
    state = get_model_state_dict(fresh)
    dcp.load(state, checkpoint_id=checkpoint)
    set_model_state_dict(fresh, state)
    return {**found, "loaded losses": fresh(held_out).detach()}


def misuse_and_its_fix(rows: slice) -> Dict[str, Any]:
    """The T5 model's blocks sharded by ``fully_shard`` alone: the refusal of its forward; and with
    :func:`posattn.keep_side_wide_modules_gathered` after it, the blocks it names and the gradients of a step."""
    from torch.distributed.fsdp import fully_shard

    models = [LanguageModel(METHODS["t5-bias (side-wide)"], seed=0) for _ in range(2)]
    for model in models:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    refused, kept = models
    try:
        refused(batches()[-1][rows])
        refusal = "none"
    except posattn.MisuseError as error:
        refusal = str(error)
    names = posattn.keep_side_wide_modules_gathered(kept)
    kept(batches()[-1][rows]).mean().backward()
    return {"refusal": refusal, "kept": names, "kept gradients": full({n: p.grad for n, p in kept.named_parameters()})}


def checkpoint_folder(folder: Path, run: Tuple[str, str]) -> Path:
    return folder / f"{run[0]}-{run[1].split()[0]}"


def worker(rank: int, folder: str) -> None:
    """One of the two processes: every scenario, its findings and the self-check's warnings written to
    ``folder/rank<r>.pt``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    warnings: List[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("posattn").addHandler(handler)
    try:
        found = sharded_scenarios(rank, Path(folder))
        found["warnings"] = warnings
        torch.save(found, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Where the processes rendezvous and write their findings and checkpoints."""
    return tmp_path_factory.mktemp("fsdp")


@pytest.fixture(scope="module")
def ranks(folder) -> List[Dict[str, Any]]:
    mp.spawn(worker, args=(str(folder),), nprocs=2, join=True)
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]


@pytest.fixture(scope="module")
def one_process() -> Dict[Tuple[str, str], nn.Module]:
    """Each model trained in one process on both ranks' batches together."""
    return {run: train(build(*run, seed=0), slice(None)) for run in RUNS}


def largest_difference(got: Dict[str, Tensor], expected: Dict[str, Tensor]) -> float:
    assert sorted(got) == sorted(expected)
    return max(float((got[name] - expected[name]).abs().max()) for name in got)


@pytest.mark.parametrize("run", RUNS, ids=[f"{kind}-{method}" for kind, method in RUNS])
def test_both_ranks_train_as_one_process_on_their_batches_together(ranks, one_process, run):
    expected = {name: p.detach() for name, p in one_process[run].named_parameters()}
    initial = {name: p.detach() for name, p in build(*run, seed=0).named_parameters()}
    assert largest_difference(initial, expected) > 1e-3  # the training moved them
    for rank in ranks:
        assert largest_difference(rank[run]["parameters"], expected) < 1e-12
        torch.testing.assert_close(rank[run]["losses"], one_process[run](batches()[-1]).detach(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("run", RUNS, ids=[f"{kind}-{method}" for kind, method in RUNS])
def test_the_sharded_checkpoint_loads_back_with_the_method(ranks, run):
    for rank in ranks:
        torch.testing.assert_close(rank[run]["loaded losses"], rank[run]["losses"], rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # no_dist: one process, as meant
def test_the_sharded_checkpoint_loads_into_one_unsharded_process(ranks, one_process, folder):
    """``dcp.load(..., no_dist=True)``: the checkpoint of two processes read by one, into a model not sharded."""
    import torch.distributed.checkpoint as dcp
    for run in RUNS:
        model = build(*run, seed=1)
        state = model.state_dict()
        dcp.load(state, checkpoint_id=str(checkpoint_folder(folder, run)), no_dist=True)
        model.load_state_dict(state)
        expected = {name: p.detach() for name, p in one_process[run].named_parameters()}
        assert largest_difference({name: p.detach() for name, p in model.named_parameters()}, expected) < 1e-12


def test_the_fused_paths_self_check_passes_under_fsdp(ranks):
    """No self-check warning: FIRE's output bias, whose exact gradient is zero, was once a false alarm."""
    assert ranks[0]["warnings"] == [] and ranks[1]["warnings"] == []


def test_per_layer_sharding_of_a_side_wide_module_is_refused_naming_the_helper(ranks):
    for rank in ranks:
        assert rank["refusal"].startswith("T5's table (position_shared.t5_table): the side-wide parameter is still "
                                          "sharded across processes"), rank["refusal"]
        assert "posattn.fully_shard_layers(model, layers)" in rank["refusal"]
        assert "\n" not in rank["refusal"]


def test_keeping_the_owner_gathered_gives_one_process_gradients(ranks):
    """The T5 model sharded per layer by another tool, then :func:`posattn.keep_side_wide_modules_gathered`: the
    owner (block 0) named, and the gradients of the first batch those of one process on both ranks' rows."""
    reference = LanguageModel(METHODS["t5-bias (side-wide)"], seed=0)
    reference(batches()[-1]).mean().backward()
    expected = {name: p.grad for name, p in reference.named_parameters()}
    for rank in ranks:
        assert rank["kept"] == ["blocks.0"]
        assert largest_difference(rank["kept gradients"], expected) < 1e-15


def test_fully_shard_layers_without_a_process_group_is_refused():
    model = LanguageModel(METHODS["t5-bias (side-wide)"], seed=0)
    with pytest.raises(posattn.MisuseError, match="fully_shard_layers needs an initialised process group"):
        posattn.fully_shard_layers(model, model.blocks)


def test_side_wide_parameters_left_out_and_layers_of_another_model_are_refused(tmp_path):
    """``ignored_params`` with T5's table would train without an error but with each rank's table drifting; blocks
    of another model would leave this one's unsharded: both refused before anything is sharded (a process group of
    one process reaches the checks)."""
    model, other = (LanguageModel(METHODS["t5-bias (side-wide)"], seed=0) for _ in range(2))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        table = set(model.blocks[0].attn.position_shared.parameters())
        with pytest.raises(posattn.MisuseError, match="^ignored_params holds side-wide parameters"):
            posattn.fully_shard_layers(model, model.blocks, ignored_params=table)
        with pytest.raises(posattn.MisuseError, match=r"^layers \[0, 1\] are not modules of model"):
            posattn.fully_shard_layers(model, other.blocks)
    finally:
        dist.destroy_process_group()
    assert not any(hasattr(p, "full_tensor") for p in model.parameters())  # nothing sharded
