"""transformers' own model tests (a selection, tests/transformers_selection/README.md) on models that
posattn_huggingface switched to a position method: no method, ALiBi and KERPLE-log on Llama and GPT-2, no
method and distance-aware on BERT; ``CausalLMModelTest`` with ALiBi on Qwen2, Qwen3, Mistral, Gemma 2,
Phi-3, OLMo-2 and GPT-NeoX.

The copied tests are transformers' code, unchanged; the one hook is here: every model class they use (the test
class's ``all_model_classes``, the model tester's classes, the classes the test files call by name) is replaced by a
:class:`SwitchedModelClass`, whose call builds transformers' model and switches it with
``apply_position_method(model, **options)``, and whose ``from_pretrained`` is ``posattn_huggingface.from_pretrained``
(the model class's own loses the method by design, docs/huggingface.md).
"""

import unittest
from typing import Any, Dict, List
from unittest import mock

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install '.[hf]')")

import posattn_huggingface as hf  # noqa: E402
from transformers_selection import modeling_bert as bert_tests  # noqa: E402
from transformers_selection.causal_lm_tester import CausalLMModelTest, CausalLMModelTester  # noqa: E402
from transformers_selection import modeling_common  # noqa: E402
from transformers_selection import modeling_gpt2 as gpt2_tests  # noqa: E402
from transformers_selection import modeling_llama as llama_tests  # noqa: E402

#: the methods each family runs the selection with (position_options' names); "none" switches the model to the
#: "posattn" attention with no method (it computes what transformers' model computes)
DECODER_METHODS: Dict[str, Dict[str, Any]] = {
    "none": {},
    "alibi": {"alibi": True},
    "kerple_log": {"kerple": "log"},
}
ENCODER_METHODS: Dict[str, Dict[str, Any]] = {
    "none": {},
    "distance_aware": {"distance_aware": True},
}
#: the attributes of a model tester that hold model classes (CausalLMModelTester's)
TESTER_CLASS_ATTRIBUTES = ("base_model_class", "causal_lm_class", "question_answering_class",
                           "sequence_classification_class", "token_classification_class")


class SwitchedModelClass:
    """A transformers model class whose models come switched to a position method: ``cls(config)`` is
    ``apply_position_method(model_class(config), **options)``, ``cls.from_pretrained(path)`` is
    ``posattn_huggingface.from_pretrained(model_class, path)``; everything else (``__name__``, ``can_generate``,
    ``forward``, ...) is the model class's, and it compares equal to it (``model_class in get_values(...)``)."""

    def __init__(self, model_class: type, options: Dict[str, Any]):
        self.model_class = model_class
        self.options = options

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return hf.apply_position_method(self.model_class(*args, **kwargs), **self.options)

    def from_pretrained(self, path: str, **kwargs: Any) -> Any:
        return hf.from_pretrained(self.model_class, path, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model_class, name)

    def __eq__(self, other: object) -> bool:
        return other is self.model_class or (isinstance(other, SwitchedModelClass)
                                             and other.model_class is self.model_class)

    def __hash__(self) -> int:
        return hash(self.model_class)

    def __repr__(self) -> str:
        return f"SwitchedModelClass({self.model_class.__name__}, {self.options})"


class SwitchedModels:
    """The hook, first among a test class's bases: after the copied ``setUp`` built the model tester, every model
    class the test can reach builds switched models (for this test only)."""

    position_options: Dict[str, Any] = {}
    #: the vendored modules whose tests and testers call model classes by name
    modules_calling_classes: List[Any] = []

    def setUp(self) -> None:
        modeling_common.global_rng.seed(0)  # transformers' inputs, the same on every run
        transformers.set_seed(0)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # models of 32 wide: one thread is several times faster on a shared machine
        self.addCleanup(torch.set_num_threads, threads)
        super().setUp()

        def switched(model_class: Any) -> Any:
            if model_class is None or isinstance(model_class, SwitchedModelClass):
                return model_class
            return SwitchedModelClass(model_class, self.position_options)

        self.all_model_classes = tuple(switched(model_class) for model_class in self.all_model_classes)
        for attribute in TESTER_CLASS_ATTRIBUTES:
            if hasattr(self.model_tester, attribute):
                setattr(self.model_tester, attribute, switched(getattr(self.model_tester, attribute)))
        for module in self.modules_calling_classes:
            for name, value in vars(module).copy().items():
                if isinstance(value, type) and issubclass(value, transformers.PreTrainedModel):
                    patcher = mock.patch.object(module, name, switched(value))
                    patcher.start()
                    self.addCleanup(patcher.stop)


def _switched_test_classes(family: str, test_class: type, methods: Dict[str, Dict[str, Any]],
                           modules: List[Any]) -> Dict[str, type]:
    classes = {}
    for method, options in methods.items():
        name = f"Test{family}_{method}"
        members = {"position_options": options, "modules_calling_classes": modules,
                   "__module__": __name__, "__qualname__": name}
        classes[name] = type(name, (SwitchedModels, test_class), members)
    return classes


globals().update(_switched_test_classes("Llama", llama_tests.LlamaModelTest, DECODER_METHODS, [llama_tests]))
globals().update(_switched_test_classes("GPT2", gpt2_tests.GPT2ModelTest, DECODER_METHODS, [gpt2_tests]))
globals().update(_switched_test_classes("Bert", bert_tests.BertModelTest, ENCODER_METHODS, [bert_tests]))


def _causal_lm_test(base_model_class: type) -> type:
    """transformers' ``CausalLMModelTest`` (the copied selection) of a family: its tester names only the family's
    base model class, from which ``CausalLMModelTester`` infers its configuration and head classes."""
    name = base_model_class.__name__.replace("Model", "")
    tester = type(f"{name}ModelTester", (CausalLMModelTester,), {"base_model_class": base_model_class})
    return type(f"{name}ModelTest", (CausalLMModelTest, unittest.TestCase), {"model_tester_class": tester})


#: the other families whose layers bring most of their own (docs/huggingface.md, "Model families"): a sliding window
#: and grouped heads, Gemma's soft-capping, Phi-3's fused projection, GPT-NeoX's partial rotation and cache keyword;
#: with ALiBi
for _family in ("Qwen2", "Qwen3", "Mistral", "Gemma2", "Phi3", "Olmo2", "GPTNeoX"):
    globals().update(_switched_test_classes(_family, _causal_lm_test(getattr(transformers, f"{_family}Model")),
                                            {"alibi": {"alibi": True}}, []))


def test_the_hook_switches_every_model_the_copied_tests_build():
    """A model built the way the copied tests build one carries its method and the "posattn" attention."""
    test = globals()["TestGPT2_alibi"]("test_model")
    test.setUp()
    try:
        new_config = test.model_tester.get_config
        for model in (test.all_model_classes[0](new_config()), gpt2_tests.GPT2DoubleHeadsModel(new_config()),
                      test.model_tester.base_model_class(config=new_config())):
            assert model.config._attn_implementation == hf.IMPLEMENTATION
            assert model.config.posattn_position_method["options"] == {"alibi": True}
    finally:
        test.doCleanups()
    assert gpt2_tests.GPT2DoubleHeadsModel is transformers.GPT2DoubleHeadsModel  # restored after the test
