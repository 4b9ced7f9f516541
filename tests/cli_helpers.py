"""Running fairseq's and our console tools, and Python programs, in subprocesses, as a user would; and, for
data preparation that is not what a test checks, the same tools' work in the pytest process (each console run
spends seconds importing torch and fairseq)."""

import os
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence, Union

import pytest
from fairseq import options
from fairseq_cli import preprocess as preprocess_cli

from fairseq_posattn.cli import parse as parse_cli
from fairseq_posattn.cli import prepare_structure as prepare_structure_cli
from fairseq_posattn.data.sentence_classification import split_corpus
from fairseq_posattn.data.text_pipeline import prepare_translation_corpus
from fairseq_posattn.structure.parse_pipeline import parse_corpus
from model_helpers import REPO
from program_helpers import run_python  # noqa: F401 (the tests import it from here too)

SAMPLE = os.path.join(REPO, "data", "multi30k_sample")
BIN = os.path.dirname(sys.executable)
#: a console tool's command-line arguments, paths as they are
Arguments = Sequence[Union[str, os.PathLike]]


def run(tool: str, args: List[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a console tool of the virtualenv; fail with its output if it fails."""
    result = subprocess.run([os.path.join(BIN, tool), *args], capture_output=True, text=True,
                            cwd=kwargs.pop("cwd", REPO), **kwargs)
    assert result.returncode == 0, f"{tool} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def run_failing(tool: str, args: List[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a console tool that must fail; return its result for the message checks."""
    result = subprocess.run([os.path.join(BIN, tool), *args], capture_output=True, text=True,
                            cwd=kwargs.pop("cwd", REPO), **kwargs)
    assert result.returncode != 0, f"{tool} should have failed:\n{result.stdout[-2000:]}"
    return result


def prepare_sample(root: str, lines: int = 300, bpe_merges: int = 800) -> str:
    """Tokenize and BPE the first ``lines`` of each split of the shipped Multi30k sample."""
    prepared = os.path.join(root, "prepared")
    prepare_translation_corpus(SAMPLE, prepared, "en", "de", bpe_merges=bpe_merges, max_lines=lines)
    return prepared


def _binarize_args(prepared: str, data_bin: str) -> List[str]:
    """fairseq-preprocess's options for a prepared en-de sample: a joined dictionary, train/valid/test."""
    return ["--source-lang", "en", "--target-lang", "de", "--joined-dictionary", "--workers", "1",
            "--trainpref", f"{prepared}/train.bpe", "--validpref", f"{prepared}/valid.bpe",
            "--testpref", f"{prepared}/test.bpe", "--destdir", data_bin]


def binarize(prepared: str, data_bin: str) -> None:
    """fairseq-preprocess of a prepared sample, as a console run."""
    run("fairseq-preprocess", _binarize_args(prepared, data_bin))


def binarize_in_process(prepared: str, data_bin: str) -> None:
    """The same binarization as :func:`binarize`, in this process."""
    preprocess_in_process(_binarize_args(prepared, data_bin))


def preprocess_in_process(args: Arguments) -> None:
    """fairseq-preprocess with these options, in this process: the console script's parser and ``main``.

    Every call of ``main`` adds a FileHandler for ``DESTDIR/preprocess.log`` to fairseq's module logger and
    never removes it; it is removed here, or later calls would append to the logs of earlier destdirs."""
    logger = preprocess_cli.logger
    earlier = list(logger.handlers)
    try:
        preprocess_cli.main(options.get_preprocessing_parser().parse_args([str(arg) for arg in args]))
    finally:
        for handler in [handler for handler in logger.handlers if handler not in earlier]:
            logger.removeHandler(handler)
            handler.close()


def binarize_classification_in_process(sources: Dict[str, str], root: str,
                                       labels: Optional[Sequence[str]] = None) -> str:
    """Labelled sentence files (``split -> path``: train, optionally valid) as fairseq's sentence_prediction task
    reads them, in this process: split into ``input0`` and ``label`` text, then fairseq-preprocess of each field.
    Returns ``root/data-bin``."""
    text, data_bin = os.path.join(root, "text"), os.path.join(root, "data-bin")
    os.makedirs(text)
    split_corpus(sources, text, labels=labels)
    prefixes = {"train": "--trainpref", "valid": "--validpref"}
    for field in ("input0", "label"):
        splits = [arg for split in sources for arg in (prefixes[split], f"{text}/{split}.{field}")]
        preprocess_in_process(["--only-source", *splits, "--destdir", f"{data_bin}/{field}", "--workers", "1"])
    return data_bin


def parse_in_process(args: Arguments) -> None:
    """posattn-parse with these options, in this process: its parser and the pipeline its ``main`` runs
    (``main`` would also reconfigure this process's root logger)."""
    parsed = parse_cli.build_parser().parse_args([str(arg) for arg in args])
    parse_corpus(parse_cli.backend_spec(parsed), parsed.output, parsed.num_shards, parsed.shard_id, parsed.merge,
                 parsed.workers)


def prepare_structure_in_process(args: Arguments) -> None:
    """posattn-prepare-structure with these options, in this process (as :func:`parse_in_process`)."""
    prepare_structure_cli.prepare_structure(prepare_structure_cli.build_parser().parse_args(
        [str(arg) for arg in args]))


def add_structure_in_process(prepared: str, data_bin: str, splits: Sequence[str]) -> None:
    """The structural side data of a prepared en-de sample, in this process: per split, posattn-parse (spaCy)
    of its tokenized English, then posattn-prepare-structure of that parse and its BPE into ``data_bin``."""
    for split in splits:
        parse_in_process(["--backend", "spacy", "--input", f"{prepared}/{split}.tok.en",
                          "--output", f"{prepared}/{split}.conllu"])
        prepare_structure_in_process([
            "--conllu", f"{prepared}/{split}.conllu", "--bpe", f"{prepared}/{split}.bpe.en", "--destdir", data_bin,
            "--split", split, "--source-lang", "en", "--target-lang", "de"])


def hypotheses(generate_output: str) -> Dict[int, str]:
    """``H-<id>`` lines of fairseq-generate / fairseq-interactive output, by id."""
    found = {}
    for line in generate_output.splitlines():
        if line.startswith("H-"):
            ident, _score, text = line.split("\t")
            found[int(ident[2:])] = text
    return found


def error_line(result: subprocess.CompletedProcess, name: str) -> str:
    """The single ``NAME: error: ...`` line of a failed command, which printed no traceback."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"{name}: error: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def main_error(main: Callable, *args) -> str:
    """The message with which a console script's ``main``, called in this process, exits unsuccessfully."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(arg) for arg in args])
    assert exit_info.value.code not in (0, None)
    return str(exit_info.value.code)
