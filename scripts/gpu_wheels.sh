#!/usr/bin/env bash
# Builds the wheel folder `make gpu-verify` installs from on a GPU machine without internet
# (docs/gpu_check.md, "A GPU machine without internet"). Run it where PyPI is reachable, after
# `make install`:
#
#     bash scripts/gpu_wheels.sh [FOLDER]        (make gpu-wheels; GPU_PYTHON=python3.12 by default)
#
# The folder holds, for the GPU machine's Python (GPU_PYTHON, a python of that version here) and
# x86-64 Linux: fairseq-fixed 0.12.3.1 built without the three torch C++ extensions nothing here uses
# (libbase, libnat, alignment_train_cpu_binding: its wheel then needs no torch to build, and installs
# in seconds), its Cython modules built against numpy 2.0's headers (they run with any numpy 2), and
# the pure-Python and binary wheels fairseq and the plugin import that a CUDA image with torch,
# numpy, scipy, scikit-learn, sacrebleu, regex and tqdm lacks.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$REPO/gpu-wheels}" && cd "${1:-$REPO/gpu-wheels}" && pwd)"
GPU_PYTHON="${GPU_PYTHON:-python3.12}"
if ! "$GPU_PYTHON" -c pass 2>/dev/null; then  # pyenv's shim without that version on: its own interpreter
    GPU_PYTHON="$(ls -d "$(pyenv root 2>/dev/null || echo ~/.pyenv)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -n 1)"
    test -n "$GPU_PYTHON" || { echo "gpu_wheels: no python3.12 here: set GPU_PYTHON to a python of the GPU machine's version" >&2; exit 2; }
fi
VERSION="$("$GPU_PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PIP=("$REPO/.venv/bin/python" -m pip --disable-pip-version-check -q)
test -x "$REPO/.venv/bin/python" || { echo "gpu_wheels: run \`make install\` first (fairseq's source metadata needs torch)" >&2; exit 2; }

echo "==> fairseq-fixed 0.12.3.1 without its torch extensions, for Python $VERSION"
"$GPU_PYTHON" -m venv "$WORK/build"
"$WORK/build/bin/python" -m pip --disable-pip-version-check -q install numpy==2.0.2 cython==3.1.4 setuptools==80.9.0 wheel==0.45.1
bash "$REPO/scripts/fairseq_wheel.sh" "$WORK/build/bin/python" "$OUT" "$REPO/.venv/bin/python"
"$WORK/build/bin/python" -m pip --disable-pip-version-check -q wheel --no-build-isolation --no-deps -w "$OUT" \
    "antlr4-python3-runtime==4.9.3"

echo "==> the other wheels, for Python $VERSION"
"${PIP[@]}" download --no-deps --only-binary=:all: --python-version "$VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$OUT" -r "$REPO/requirements/gpu.txt"
ls "$OUT"
echo "gpu wheels in $OUT ($(du -sh "$OUT" | cut -f1)); on the GPU machine: make gpu-verify"
