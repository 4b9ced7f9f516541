"""Where the benchmark finds the repository's data and scripts."""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent.parent
#: the full UD English-EWT dev set beside the repository, when present, else the shipped sample
EWT_DEV = REPO_ROOT.parent / "shared" / "data" / "ud_english_ewt" / "en_ewt-ud-dev.conllu"
EWT_SAMPLE = REPO_ROOT / "data" / "ud_ewt_sample" / "en_ewt-ud-dev.sample.conllu"
STRUCTURE_BENCHMARK = REPO_ROOT / "scripts" / "benchmark_structure.py"


def display_path(path: str) -> str:
    """``path`` relative to the repository when it lies inside it (or beside it, in ``../``)."""
    resolved = Path(path).resolve()
    for base, prefix in ((REPO_ROOT, ""), (REPO_ROOT.parent, "../")):
        if resolved.is_relative_to(base):
            return prefix + str(resolved.relative_to(base))
    return str(path)
