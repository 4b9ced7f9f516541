"""The project's tools beside the library: what ``make gpu-check``, ``make gpu-verify``, ``make benchmark``
and the evidence runner (``examples/evidence/``) share.

- :mod:`posattn_tools.runs`: the one module for running commands (logs, timeouts, process groups, the
  virtualenv's console tools first on ``PATH``), building fairseq command lines and reading fairseq's logs;
- :mod:`posattn_tools.json_files`: reading back the JSON files the tools and recipes wrote (manifest, records,
  results), a damaged one in one line naming it and what to do;
- :mod:`posattn_tools.gpu_check`: the GPU check, one module per step (``scripts/gpu_check.py`` runs it).

The tools live in ``scripts/`` (on the path of every script there; the tests get it from
``[tool.pytest.ini_options] pythonpath`` in pyproject.toml) and are not in the wheel: the library,
``fairseq_posattn``, never imports them (tests/test_layering.py).
"""
