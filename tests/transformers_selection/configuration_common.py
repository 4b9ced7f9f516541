# Copyright 2019 HuggingFace Inc.
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
# Source: huggingface/transformers tests/test_configuration_common.py, release v5.24.0 (the version this project pins), from
# its PyPI sdist transformers-5.24.0.tar.gz (sha256 906cb8c3cb2123575e263962586a4d21a979ce97feeb95fe6aaf66fe6ae88bf3),
# which names no commit.
# Vendored by fairseq-posattn: a selection only, listed with what was trimmed in README.md of this folder.
# Each member kept is transformers' code, unchanged; the imports name only what it uses, and a class's
# bases lose the mixins that are not vendored.
"""ConfigTester, its constructor only (the model tests build one in setUp; test_config is not selected)."""


class ConfigTester:
    def __init__(self, parent, config_class=None, has_text_modality=True, common_properties=None, **kwargs):
        self.parent = parent
        self.config_class = config_class
        self.has_text_modality = has_text_modality
        self.inputs_dict = kwargs
        self.common_properties = common_properties
