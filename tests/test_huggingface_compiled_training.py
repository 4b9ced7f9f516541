"""``torch.compile`` of a switched Hugging Face Llama's training step (the loss, and its backward through the
compiled graph) on the CPU: the loss and every gradient equal eager's, and the step is one graph, no graph break
(counted by dynamo's own counters, ``torch._dynamo.utils.counters``), with T5's side-wide bias.

On the CPU the graph goes to the ``aot_eager`` backend (dynamo's capture and AOT autograd, where graph breaks and host
synchronisations come from, without a C++ build on 2 cores), as tests/test_compile.py does. The other methods were
measured once (docs/distributed.md, "Compiled training"): compiling is slow on 2 cores, one method is tested here.
"""

from typing import Any, Dict, List, Tuple

import pytest
import torch
import torch._dynamo
from torch import Tensor
from torch._dynamo.utils import counters

pytest.importorskip("transformers")

import posattn_huggingface as hf  # noqa: E402
from huggingface_helpers import METHODS, VOCAB, llama  # noqa: E402


def batch() -> Dict[str, Tensor]:
    """Four rows of 24 tokens, the second padded on the right by 5."""
    ids = torch.randint(0, VOCAB, (4, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def step(model: Any, call: Any) -> Tuple[Tensor, Dict[str, Tensor]]:
    """The loss of ``call(batch)`` and the gradients of every parameter after its backward."""
    model.zero_grad()
    loss = call(**batch())
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.fixture
def graphs() -> List[Any]:
    """The graphs dynamo hands the backend, from a fresh dynamo with cleared counters."""
    torch._dynamo.reset()
    counters.clear()
    compiled: List[Any] = []
    yield compiled
    torch._dynamo.reset()


def test_a_compiled_training_step_equals_eager_in_one_graph(graphs):
    torch.manual_seed(0)
    model = hf.apply_position_method(llama(), **METHODS["t5-bias"]).train()

    def loss(**inputs: Tensor) -> Tensor:
        return model(**inputs).loss

    def backend(graph: torch.fx.GraphModule, example_inputs: List[Tensor]) -> Any:
        graphs.append(graph)
        return torch._dynamo.backends.registry.lookup_backend("aot_eager")(graph, example_inputs)

    compiled_loss, compiled_grads = step(model, torch.compile(loss, backend=backend))
    eager_loss, eager_grads = step(model, loss)
    assert dict(counters["graph_break"]) == {} and len(graphs) == 1, dict(counters["graph_break"])
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-6, atol=0)
    assert sorted(compiled_grads) == sorted(eager_grads)
    assert "model.layers.0.self_attn.position_method.position_shared.t5_table.weight" in eager_grads
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_counters_see_a_graph_break_where_there_is_one(graphs):
    """The negative control: a function that breaks its graph in two is counted so."""
    def broken(x: Tensor) -> Tensor:
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    torch.compile(broken, backend=lambda graph, inputs: graphs.append(graph) or graph)(torch.ones(3))
    assert sum(counters["graph_break"].values()) == 1 and len(graphs) == 2
