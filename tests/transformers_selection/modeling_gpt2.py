# Copyright 2020 The HuggingFace Team. All rights reserved.
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
# Source: huggingface/transformers tests/models/gpt2/test_modeling_gpt2.py at commit 357f414cae88d5f592105bd97ec4a24ef7735f9f
# (main, 2026-04-13, version 5.6.0.dev0): the newest commit of transformers' repository that could
# be had here. v5.24.0's sdist does not ship this file and its tag was out of reach (README.md).
# Vendored by fairseq-posattn: a selection only, listed with what was trimmed in README.md of this folder.
# Each member kept is transformers' code, unchanged; the imports name only what it uses, and a class's
# bases lose the mixins that are not vendored.
"""Testing suite for the PyTorch GPT-2 model: its tester and a selection of its test class."""

import unittest

from transformers import is_torch_available
from transformers.testing_utils import require_torch, torch_device

from .causal_lm_tester import CausalLMModelTest, CausalLMModelTester
from .modeling_common import floats_tensor, ids_tensor


if is_torch_available():
    import torch

    from transformers import (
        GPT2DoubleHeadsModel,
        GPT2ForQuestionAnswering,
        GPT2ForSequenceClassification,
        GPT2ForTokenClassification,
        GPT2LMHeadModel,
        GPT2Model,
    )


class GPT2ModelTester(CausalLMModelTester):
    if is_torch_available():
        base_model_class = GPT2Model
        causal_lm_class = GPT2LMHeadModel

    def __init__(
        self,
        parent,
        use_token_type_ids=True,
        num_choices=4,
        **kwargs,
    ):
        super().__init__(parent, use_token_type_ids=use_token_type_ids, **kwargs)
        self.num_choices = num_choices

    def prepare_config_and_inputs(
        self, extra_inputs=False, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False
    ):
        # Overwritten: `GPT2DoubleHeadsModel` uses extra inputs
        (config, input_ids, token_type_ids, input_mask, sequence_labels, token_labels, choice_labels) = (
            super().prepare_config_and_inputs()
        )

        if extra_inputs:
            mc_token_ids = ids_tensor([self.batch_size, self.num_choices], self.seq_length)
            config_and_inputs = (
                config,
                input_ids,
                input_mask,
                token_type_ids,
                mc_token_ids,
                sequence_labels,
                token_labels,
                choice_labels,
            )
        else:
            config_and_inputs = (
                config,
                input_ids,
                token_type_ids,
                input_mask,
                sequence_labels,
                token_labels,
                choice_labels,
            )

        config = self.get_config(
            scale_attn_by_inverse_layer_idx=scale_attn_by_inverse_layer_idx,
            reorder_and_upcast_attn=reorder_and_upcast_attn,
        )

        return config_and_inputs

    def get_config(self, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False):
        # Overwritten: `GPT2Config` has extra flags and we want to test them
        config = super().get_config()
        config.scale_attn_by_inverse_layer_idx = scale_attn_by_inverse_layer_idx
        config.reorder_and_upcast_attn = reorder_and_upcast_attn
        return config

    def prepare_config_and_inputs_for_common(self):
        # Overwritten: we want `token_type_ids` as part of the common inputs
        config_and_inputs = self.prepare_config_and_inputs(extra_inputs=True)
        config, input_ids, attention_mask, token_type_ids, _, _, _, _ = config_and_inputs
        inputs_dict = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return config, inputs_dict

    def prepare_config_and_inputs_for_decoder(self):
        # Extra function: used in `encoder_decoder` tests
        (
            config,
            input_ids,
            input_mask,
            token_type_ids,
            _,
            sequence_labels,
            token_labels,
            choice_labels,
        ) = self.prepare_config_and_inputs(extra_inputs=True)

        encoder_hidden_states = floats_tensor([self.batch_size, self.seq_length, self.hidden_size])
        encoder_attention_mask = ids_tensor([self.batch_size, self.seq_length], vocab_size=2)

        return (
            config,
            input_ids,
            input_mask,
            token_type_ids,
            sequence_labels,
            token_labels,
            choice_labels,
            encoder_hidden_states,
            encoder_attention_mask,
        )


@require_torch
class GPT2ModelTest(CausalLMModelTest, unittest.TestCase):
    # `all_model_classes` is overwritten because of `GPT2DoubleHeadsModel`
    all_model_classes = (
        (
            GPT2Model,
            GPT2LMHeadModel,
            GPT2DoubleHeadsModel,
            GPT2ForQuestionAnswering,
            GPT2ForSequenceClassification,
            GPT2ForTokenClassification,
        )
        if is_torch_available()
        else ()
    )
    # We need to set `pipeline_model_mapping` because we overwrite `all_model_classes`
    pipeline_model_mapping = (
        {
            "feature-extraction": GPT2Model,
            "text-classification": GPT2ForSequenceClassification,
            "text-generation": GPT2LMHeadModel,
            "token-classification": GPT2ForTokenClassification,
            "zero-shot": GPT2ForSequenceClassification,
        }
        if is_torch_available()
        else {}
    )
    test_missing_keys = False
    model_tester_class = GPT2ModelTester
    model_split_percents = [0.5, 0.6, 0.7]

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        # Overwritten: special case for DoubleHeads model
        inputs_dict = super()._prepare_for_class(inputs_dict, model_class, return_labels=return_labels)

        if return_labels:
            if model_class.__name__ == "GPT2DoubleHeadsModel":
                inputs_dict["labels"] = torch.zeros(
                    (self.model_tester.batch_size, self.model_tester.num_choices, self.model_tester.seq_length),
                    dtype=torch.long,
                    device=torch_device,
                )
                inputs_dict["input_ids"] = inputs_dict["labels"]
                inputs_dict["attention_mask"] = torch.tril(torch.ones_like(inputs_dict["input_ids"]).to(torch_device))
                inputs_dict["token_type_ids"] = inputs_dict["labels"]
                inputs_dict["mc_token_ids"] = torch.zeros(
                    (self.model_tester.batch_size, self.model_tester.num_choices),
                    dtype=torch.long,
                    device=torch_device,
                )
                inputs_dict["mc_labels"] = torch.zeros(
                    self.model_tester.batch_size, dtype=torch.long, device=torch_device
                )
        return inputs_dict

    def test_gpt2_double_lm_head_model(self):
        # extra test: model-specific class
        config_and_inputs = self.model_tester.prepare_config_and_inputs(extra_inputs=True)
        config, input_ids, input_mask, token_type_ids, mc_token_ids, _, _, _ = config_and_inputs
        model = GPT2DoubleHeadsModel(config)
        model.to(torch_device)
        model.eval()

        multiple_choice_inputs_ids = input_ids.unsqueeze(1).expand(-1, self.model_tester.num_choices, -1).contiguous()
        multiple_choice_input_mask = input_mask.unsqueeze(1).expand(-1, self.model_tester.num_choices, -1).contiguous()
        multiple_choice_token_type_ids = (
            token_type_ids.unsqueeze(1).expand(-1, self.model_tester.num_choices, -1).contiguous()
        )

        inputs = {
            "input_ids": multiple_choice_inputs_ids,
            "mc_token_ids": mc_token_ids,
            "attention_mask": multiple_choice_input_mask,
            "token_type_ids": multiple_choice_token_type_ids,
            "labels": multiple_choice_inputs_ids,
        }

        result = model(**inputs)
        self.assertEqual(result.loss.shape, ())
        self.assertEqual(
            result.logits.shape,
            (
                self.model_tester.batch_size,
                self.model_tester.num_choices,
                self.model_tester.seq_length,
                self.model_tester.vocab_size,
            ),
        )
        self.assertEqual(result.mc_logits.shape, (self.model_tester.batch_size, self.model_tester.num_choices))

    def test_gpt2_scale_attn_by_inverse_layer_idx(self):
        # extra test: model-specific flag
        config_and_inputs = self.model_tester.prepare_config_and_inputs(scale_attn_by_inverse_layer_idx=True)
        config, input_ids, token_type_ids, _, _, _, _ = config_and_inputs

        model = GPT2LMHeadModel(config)
        model.to(torch_device)
        result = model(input_ids, token_type_ids=token_type_ids, labels=input_ids)
        self.assertEqual(result.loss.shape, ())
        self.assertEqual(
            result.logits.shape,
            (self.model_tester.batch_size, self.model_tester.seq_length, self.model_tester.vocab_size),
        )
        result.loss.backward()
