"""Step 1 of the trainings: the shipped samples prepared (Multi30k with structural side data, PTB), as
examples/quickstart does."""

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from posattn_tools.gpu_check.context import Context, Row
from posattn_tools.gpu_check.settings import LANGUAGE_MODELING, MULTI30K, PTB, SRC, TGT
from posattn_tools.runs import run, tool


@dataclass(frozen=True)
class Corpora:
    """The binarized samples: translation (with structural side data) and language modelling."""

    translation: Path
    reference: Path
    lm: Path


def copy_head(source: Path, target: Path, lines: Optional[int]) -> None:
    """The first ``lines`` lines of ``source`` (all if None) into ``target``."""
    with open(source, encoding="utf-8") as handle:
        kept = [line for index, line in enumerate(handle) if lines is None or index < lines]
    target.write_text("".join(kept), encoding="utf-8")


def prepare_translation(ctx: Context) -> Tuple[Path, Path]:
    """Multi30k sample -> Moses + joint BPE -> fairseq-preprocess -> spaCy parse -> structural side
    data, as examples/quickstart does. Returns the data-bin and the raw test reference."""
    from fairseq_posattn.data.text_pipeline import prepare_translation_corpus

    prepared, data_bin = ctx.data / "multi30k" / "prepared", ctx.data / "multi30k" / "data-bin"
    prepare_translation_corpus(str(MULTI30K), str(prepared), SRC, TGT, bpe_merges=ctx.scale.bpe_merges,
                               max_lines=ctx.scale.lines)
    reference = ctx.data / "multi30k" / f"test.{TGT}"
    copy_head(MULTI30K / f"test.{TGT}", reference, ctx.scale.lines)
    timeout, env = ctx.cli.timeout, ctx.env()
    workers = str(max(1, min(4, (os.cpu_count() or 1) // 3)))  # per split: the three run side by side
    run([tool("fairseq-preprocess"), "--source-lang", SRC, "--target-lang", TGT, "--joined-dictionary",
         "--workers", workers, "--trainpref", f"{prepared}/train.bpe",
         "--validpref", f"{prepared}/valid.bpe", "--testpref", f"{prepared}/test.bpe", "--destdir", str(data_bin)],
        ctx.logs / "prepare" / "preprocess-multi30k.log", env, timeout)

    def structure(split: str) -> None:
        run([tool("posattn-parse"), "--backend", "spacy", "--input", f"{prepared}/{split}.tok.{SRC}",
             "--output", f"{prepared}/{split}.conllu", "--workers", workers],
            ctx.logs / "prepare" / f"parse-{split}.log", env, timeout)
        run([tool("posattn-prepare-structure"), "--conllu", f"{prepared}/{split}.conllu", "--bpe",
             f"{prepared}/{split}.bpe.{SRC}", "--destdir", str(data_bin), "--split", split,
             "--source-lang", SRC, "--target-lang", TGT],
            ctx.logs / "prepare" / f"structure-{split}.log", env, timeout)

    with ThreadPoolExecutor(max_workers=3) as pool:  # the splits side by side: mostly start-up time
        list(pool.map(structure, ("train", "valid", "test")))
    return data_bin, reference


def prepare_lm(ctx: Context) -> Path:
    """The PTB sample (its first ``lines`` lines per split) binarized for ``--task language_modeling``."""
    raw, data_bin = ctx.data / "ptb" / "raw", ctx.data / "ptb" / "data-bin"
    raw.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        copy_head(PTB / f"{split}.txt", raw / f"{split}.txt", ctx.scale.lines)
    run([tool("fairseq-preprocess"), "--only-source", "--task", LANGUAGE_MODELING, "--workers", "1",
         "--trainpref", f"{raw}/train.txt", "--validpref", f"{raw}/valid.txt", "--testpref", f"{raw}/test.txt",
         "--destdir", str(data_bin)], ctx.logs / "prepare" / "preprocess-ptb.log", ctx.env(), ctx.cli.timeout)
    return data_bin


def prepare_corpora(ctx: Context, pool: ThreadPoolExecutor) -> Corpora:
    translation = pool.submit(prepare_translation, ctx)
    lm = pool.submit(prepare_lm, ctx)
    return Corpora(*translation.result(), lm.result())


def failed_preparation(ctx: Context, error: Exception) -> List[Row]:
    return [Row("prepare the samples", ctx.machine.kind, "Multi30k + PTB samples", "FAILED", str(error))]

