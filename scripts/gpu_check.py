#!/usr/bin/env python
"""``make gpu-check``: the project's training-at-scale paths on a CUDA machine, in one report
(docs/gpu_check.md). The check itself is the package ``scripts/posattn_tools/gpu_check/``, one module per
step; this file is its command line.

Usage::

    python scripts/gpu_check.py                      # the full check, about 6-8 minutes on one H100
    python scripts/gpu_check.py --quick              # fp16 only, fewer tests and variants
    python scripts/gpu_check.py --device cpu --tiny  # the smoke run on a CPU (a few minutes)
    python scripts/gpu_check.py --help               # every option
"""

import sys

from posattn_tools.gpu_check.cli import main

if __name__ == "__main__":
    sys.exit(main())
