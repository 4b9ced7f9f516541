#!/usr/bin/env bash
# Builds fairseq-fixed 0.12.3.1's wheel without the three torch C++ extensions nothing here uses
# (libbase: BASE layers; libnat: the non-autoregressive models; alignment_train_cpu_binding: an
# example's operator). They are most of fairseq's compile (about 2.5 of 3 minutes on 2 cores, each
# parsing torch's headers); the rest, its Cython modules and libbleu, compiles in about 25 seconds
# and needs no torch to build.
#
#     bash scripts/fairseq_wheel.sh BUILD_PYTHON FOLDER [FETCH_PYTHON]
#
# BUILD_PYTHON: a Python with numpy, cython, setuptools and wheel; the Cython modules are compiled
# against its numpy. FETCH_PYTHON (BUILD_PYTHON by default) fetches the sdist with its pip, and
# needs torch: pip reads the sdist's metadata, and its setup.py imports torch.
# Used by `make install`, `make gpu-wheels` and `make check-install`.
set -euo pipefail

BUILD_PYTHON="$1"
OUT="$(mkdir -p "$2" && cd "$2" && pwd)"
FETCH_PYTHON="${3:-$1}"
"$FETCH_PYTHON" -c "import torch" 2> /dev/null || { echo "fairseq_wheel: $FETCH_PYTHON has no torch (fairseq's source metadata imports it)" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$FETCH_PYTHON" -m pip --disable-pip-version-check -q download --no-deps --no-binary=:all: \
    --no-build-isolation -d "$WORK" fairseq-fixed==0.12.3.1
tar -xzf "$WORK"/fairseq_fixed-0.12.3.1.tar.gz -C "$WORK"
"$BUILD_PYTHON" - "$WORK/fairseq_fixed-0.12.3.1/setup.py" <<'EOF'
import sys
from pathlib import Path

setup = Path(sys.argv[1])
text = setup.read_text()
start, end = text.index("\nextensions.extend(\n"), text.index("\ncmdclass = {")
text = text[:start] + text[end:]
text = text.replace("from torch.utils import cpp_extension\n", "")
text = text.replace('cmdclass = {"build_ext": cpp_extension.BuildExtension}', "cmdclass = {}")
assert "cpp_extension" not in text, "fairseq-fixed's setup.py changed: drop its torch extensions by hand"
setup.write_text(text)
EOF
# CFLAGS=-g0: no debug information (the interpreter's own build flags ask for it; a third of the compile)
CFLAGS=-g0 "$BUILD_PYTHON" -m pip --disable-pip-version-check -q wheel --no-build-isolation --no-deps \
    -w "$OUT" "$WORK/fairseq_fixed-0.12.3.1"
