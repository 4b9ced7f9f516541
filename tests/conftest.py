import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # tests' own helpers (reference_attention, ...)

import fairseq_posattn  # noqa: E402,F401  (registers the architectures, applies the shims)
