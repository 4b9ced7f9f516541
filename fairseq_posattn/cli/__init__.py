"""Command-line entry points (``posattn-*`` console scripts, see setup.py).

Each module is a thin argparse layer over library code (:mod:`fairseq_posattn.data` and friends).
"""

import logging
import os
import sys


def setup_logging() -> None:
    """fairseq's log format, on stderr (stdout carries the commands' results).

    ``force=True``: importing fairseq already configured the root logger (its
    ``wav2vec2_classification`` module even sets it to DEBUG), which would make a plain
    ``basicConfig`` a no-op.
    """
    logging.basicConfig(
        force=True,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stderr,
    )
