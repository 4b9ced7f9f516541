"""A user's own Python program run in a fresh process, for the tests of the front-ends that need no fairseq
(``tests/test_huggingface.py`` runs where transformers is installed without fairseq: ``make test-matrix``)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Union

REPO = Path(__file__).resolve().parent.parent


def run_python(script: str, folder: Path, cwd: Union[str, Path] = REPO, threads: Optional[int] = None,
               **inputs: Any) -> Dict[str, Any]:
    """Run ``script`` in a fresh Python process (a user's own program): it reads ``INPUTS`` (``inputs``) and
    fills ``OUTPUTS``, both JSON, through files in ``folder``; ``threads``: its OMP_NUM_THREADS."""
    paths = folder / "inputs.json", folder / "outputs.json"
    paths[0].write_text(json.dumps(inputs), encoding="utf-8")
    program = (f"import json, os, sys\nINPUTS = json.load(open({str(paths[0])!r}))\nOUTPUTS = {{}}\n{script}\n"
               f"json.dump(OUTPUTS, open({str(paths[1])!r}, 'w'))\n")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=str(cwd), env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return json.loads(paths[1].read_text(encoding="utf-8"))
