"""A selection of transformers' own model tests (Llama, GPT-2, BERT), vendored from transformers (Apache-2.0):
README.md says what was copied from where and what was changed. tests/test_transformers_selection.py runs them on
models that posattn_huggingface switched to a position method."""
