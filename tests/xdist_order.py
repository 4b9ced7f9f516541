"""The order in which ``make test``'s workers take the test files (pytest-xdist's ``--dist loadfile``, a file per
worker at a time).

xdist hands out the files with the most tests first, which put last the files of a few long tests (a fresh
virtualenv, the GPU check's smoke run, trainings in subprocesses): the suite ended with one worker on them while the
other had nothing left. Here the files of ``LONGEST`` go first, longest first (the longest-processing-time rule:
the idle end is then at most about the length of the shorter files that come last), then the others in xdist's
order. A file not named here only comes later; a name here without its file is passed over."""

from typing import Optional

import pytest

#: the test files that take longest on 2 CPU cores (``make test --durations``, the file's tests together),
#: longest first
LONGEST = (
    "test_evidence.py",
    "test_length_extrapolation.py",
    "test_gpu_check_script.py",
    "test_benchmark_script.py",
    "test_hydra_configs.py",
    "test_distributed.py",
    "test_gpu_verify_script.py",
    "test_pos_tagging.py",
    "test_lstm_lm.py",
)


def rank(scope: str) -> int:
    """Where the file ``scope`` (a node id's path, ``tests/test_x.py``) comes: its place in ``LONGEST``, or after
    all of them."""
    name = scope.rsplit("/", 1)[-1]
    return LONGEST.index(name) if name in LONGEST else len(LONGEST)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; ignored without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> Optional[object]:
    """``--dist loadfile``: xdist's file scheduling, longest files first; any other mode: xdist's own."""
    from xdist.scheduler import LoadFileScheduling

    if config.getvalue("dist") != "loadfile" or not hasattr(LoadFileScheduling, "_assign_work_unit"):
        return None  # another mode, or an xdist whose scheduler this does not know: xdist's own order

    class LongestFirst(LoadFileScheduling):
        def _assign_work_unit(self, node: object) -> None:
            """xdist's assignment of the next file of the work queue, the first of the longest left."""
            first = min(self.workqueue, key=rank)  # the first of equals: xdist's order among the rest
            self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)
