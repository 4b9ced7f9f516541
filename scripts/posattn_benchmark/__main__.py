"""``python scripts/posattn_benchmark``: the benchmark's command line (and its workers')."""

import sys
from pathlib import Path

if not __package__:  # run as a directory: make the package, and posattn_tools beside it, importable by name
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from posattn_benchmark.cli import main  # noqa: E402

sys.exit(main())
