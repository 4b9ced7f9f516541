# Copyright 2022 The HuggingFace Inc. team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Source: huggingface/transformers tests/models/llama/test_modeling_llama.py at commit 357f414cae88d5f592105bd97ec4a24ef7735f9f
# (main, 2026-04-13, version 5.6.0.dev0): the newest commit of transformers' repository that could
# be had here. v5.24.0's sdist does not ship this file and its tag was out of reach (README.md).
# Vendored by fairseq-posattn: a selection only, listed with what was trimmed in README.md of this folder.
# Each member kept is transformers' code, unchanged; the imports name only what it uses, and a class's
# bases lose the mixins that are not vendored.
"""Testing suite for the PyTorch LLaMA model: its tester and test class (the integration tests need the Hub)."""

import unittest

from transformers import is_torch_available
from transformers.testing_utils import require_torch

from .causal_lm_tester import CausalLMModelTest, CausalLMModelTester


if is_torch_available():
    from transformers import (
        LlamaForCausalLM,
        LlamaModel,
    )


class LlamaModelTester(CausalLMModelTester):
    if is_torch_available():
        base_model_class = LlamaModel


@require_torch
class LlamaModelTest(CausalLMModelTest, unittest.TestCase):
    model_tester_class = LlamaModelTester

    # Need to use `0.8` instead of `0.9` for `test_cpu_offload`
    # This is because we are hitting edge cases with the causal_mask buffer
    model_split_percents = [0.5, 0.7, 0.8]

    # used in `test_torch_compile_for_training`
    _torch_compile_train_cls = LlamaForCausalLM if is_torch_available() else None
