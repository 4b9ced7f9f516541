import os

import pytest
import torch

import fairseq_posattn  # noqa: F401  (registers the architectures, applies the shims)
from xdist_order import pytest_xdist_make_scheduler  # noqa: F401  (make test: the longest test files first)

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # `make test`: the cores shared among the workers
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))  # the fairseq commands that tests start

if not torch.cuda.is_available():
    # what examples/lib/device.sh's probe finds here, so that the recipes that tests start skip it (a process
    # importing torch, seconds of CPU each); test_recipes.py runs the probe itself
    os.environ.setdefault("GPUS", "0")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device", default="cpu",
        help="device of the tests that take the `device` fixture (precision, checkpointing, compile): "
             "cpu (default) or cuda; scripts/gpu_check.py runs them with --device cuda")


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device that device-aware tests run on (``pytest --device cuda`` on a GPU machine)."""
    name = request.config.getoption("--device")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.exit(f"--device {name} asked for, but torch sees no CUDA device", returncode=2)
    return torch.device(name)
