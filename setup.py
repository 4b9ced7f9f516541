from setuptools import find_packages, setup

setup(
    name="fairseq-posattn",
    version="0.1.0",
    description="Position-aware self-attention for fairseq: direct positions, temperature, "
    "convolved and distance-aware attention, relative and structural positions",
    packages=find_packages(include=["fairseq_posattn", "fairseq_posattn.*"]),
    python_requires=">=3.8",
    # fairseq itself is installed by the Makefile (fairseq-fixed on Python 3.11, or the official
    # fairseq==0.12.2 on older Pythons): both import as `fairseq`, so it is not pinned here.
    install_requires=["numpy", "torch", "sacrebleu", "sacremoses", "subword-nmt", "conllu", "tqdm",
                      "matplotlib"],
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
    ]},
)
