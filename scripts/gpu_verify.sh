#!/usr/bin/env bash
# make gpu-verify: on a GPU machine, install what the run needs where it is missing, then
# scripts/gpu_verify.py (docs/gpu_check.md, "make gpu-verify"). The GPU machine's own python3 and
# its CUDA torch are used as they are (PYTHON=... for another); fairseq and the few packages a CUDA
# image lacks come from gpu-wheels/ (make gpu-wheels, built where PyPI is reachable) into
# .gpu-site/, in seconds, or from PyPI when there is no such folder. Arguments go to gpu_verify.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if ! command -v nvidia-smi > /dev/null 2>&1; then
    echo "make gpu-verify needs an NVIDIA GPU (no nvidia-smi here); on a CPU, \`.venv/bin/python scripts/gpu_verify.py --device cpu --tiny\` runs its smoke form" >&2
    exit 2
fi
if ! "$PYTHON" -c "import fairseq, hydra, bitarray, subword_nmt" 2> /dev/null; then
    if [ -d gpu-wheels ]; then
        echo "==> installing gpu-wheels/ into .gpu-site/"
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu-site \
            gpu-wheels/*.whl
        export PYTHONPATH="$PWD/.gpu-site${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "==> no gpu-wheels/ folder: installing from PyPI into $PYTHON's environment"
        "$PYTHON" -m pip install -q -r requirements/gpu.txt antlr4-python3-runtime==4.9.3
        env -u CUDA_HOME "$PYTHON" -m pip install -q --no-build-isolation --no-deps fairseq-fixed==0.12.3.1
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the plugin of this checkout
exec "$PYTHON" scripts/gpu_verify.py --output gpu-verify-output "$@"
