"""Converting a RoPE model to PaTH attention by continued training, tested small on the Hugging Face front-end: the
claim of Yang et al. 2025 ("PaTH Attention: Position Encoding via Accumulating Householder Transformations",
NeurIPS 2025, arXiv 2505.16381) that a model pretrained with RoPE becomes a PaTH model by continued training
(README.md beside this file, "Converting a RoPE model to PaTH").

Per seed, five arms of the recipe's Llama (llama_model.py; PTB blocks read as extrapolation.py reads them, trained
with transformers.Trainer as trainer_training.py trains):

- ``rope``: Llama with its own RoPE, ``--pretrain-updates`` (N1) updates; saved in ``OUT/rope/seed<N>/model``;
- ``converted-at-switch``: that model switched to PaTH (``apply_position_method(model, path_attention=True)``: its
  rotation turned off, PaTH's transforms newly drawn), scored before any fine-tuning: the cost of the switch;
- ``converted``: the switched model fine-tuned ``--finetune-updates`` (N2) updates;
- ``scratch``: a fresh Llama switched to PaTH, trained N2 updates (the fine-tune's budget);
- ``rope-continued``: the RoPE model fine-tuned N2 updates as ``converted`` is, without the switch (N1 + N2 updates).

Every training has the recipe's optimiser and schedule, started afresh (a fine-tune's warm-up too); the three
N2-update trainings read the blocks in one seeded order (seed + 1000), the pretraining in another (the seed). Each
arm is scored as the recipe scores: the validation loss in base 2 over non-overlapping windows of the training
length. ``OUT/<arm>/seed<N>/`` holds an arm's ``results.json``, ``train.log`` and ``run.json`` (its settings, and
the position method its configuration records); an arm whose ``results.json`` exists is not redone, and one run
with other settings is refused. Then ``OUT/results.json`` and ``OUT/results.md``: every arm's loss, mean ± sd over
the seeds, and per seed the paired differences converted - scratch, converted - rope-continued, and
converted-at-switch - rope (the switch's cost), with their sign counts and the paired t-test.

    python examples/huggingface/path_conversion.py                     # the shipped sample, seeds 1 2 3
    python examples/huggingface/path_conversion.py --data-dir ../shared/data/ptb_lm --threads 1 \
        --out path-conversion-output
"""

import argparse
import json
import shlex
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "pytorch"))  # examples/pytorch's modules, by name

import torch  # noqa: E402
import transformers  # noqa: E402

import posattn_huggingface  # noqa: E402
from data import Corpus, load_corpus, training_blocks  # noqa: E402
from experiment import RESULTS_FILE, RUN_FILE, SAMPLE, Protocol, begin_run, run_dir  # noqa: E402
from llama_model import LLAMA_ROPE, LlamaSize, NextTokenLogits, build_model, parameter_count  # noqa: E402
from llama_run import budget_text  # noqa: E402
from methods import method_options  # noqa: E402
from posattn.errors import UserError  # noqa: E402
from posattn_tasks.statistics import paired_t_test  # noqa: E402
from posattn_huggingface.names import CONFIG_RECORD  # noqa: E402
from reports import Record, read_records, write_atomically, write_json  # noqa: E402
from posattn_tools.json_files import read_json  # noqa: E402  (scripts/, put on the path by reports)
from trainer_training import WARMUP_INIT_LR, train  # noqa: E402
from training import Budget  # noqa: E402

PATH = "path-attention"
ROPE, SWITCHED, CONVERTED, SCRATCH, ROPE_CONTINUED = (
    "rope", "converted-at-switch", "converted", "scratch", "rope-continued")
#: the arms in the order they run (each reads the ones before it), and what each is
ARMS = {ROPE: "Llama's own RoPE, N1 updates", SWITCHED: "rope switched to PaTH, not fine-tuned",
        CONVERTED: "rope switched to PaTH, fine-tuned N2 updates", SCRATCH: "PaTH from scratch, N2 updates",
        ROPE_CONTINUED: "rope fine-tuned N2 updates, no switch"}
#: the paired comparisons: (first arm, second arm), the difference first - second per seed
PAIRS = ((CONVERTED, SCRATCH), (CONVERTED, ROPE_CONTINUED), (SWITCHED, ROPE))
#: the N2-update trainings read the blocks in the order of seed + this, the pretraining in the seed's
FINETUNE_SEED_OFFSET = 1000
MODEL_FOLDER = "model"


class OtherSettings(UserError):
    """An arm of the output folder finished with settings other than this command's."""


@dataclass
class Conversion:
    """The experiment's settings, recorded with every arm; a finished arm is taken only with the same ones."""

    size: LlamaSize
    pretrain: Budget
    finetune: Budget
    protocol: Protocol
    data: Dict[str, int]  # the corpus: vocabulary, training and scored tokens

    def record(self) -> Dict[str, object]:
        """The settings as JSON writes and reads them back (tuples as lists)."""
        return json.loads(json.dumps(asdict(self)))

    def budget(self, arm: str) -> Budget:
        """The arm's training: N1 updates (``rope``), none (``converted-at-switch``), N2 (the others)."""
        return {ROPE: self.pretrain, SWITCHED: replace(self.finetune, updates=0)}.get(arm, self.finetune)


def differences(stored: object, current: object, prefix: str = "") -> List[str]:
    """``key: A there, B here`` for each setting of two records that differs."""
    if isinstance(stored, dict) and isinstance(current, dict):
        return [line for key in sorted(set(stored) | set(current))
                for line in differences(stored.get(key), current.get(key), f"{prefix}{key}.")]
    return [] if stored == current else [f"{prefix.rstrip('.')}: {stored} there, {current} here"]


def check_finished_arms(out: Path, seeds: List[int], conversion: Conversion) -> None:
    """:class:`OtherSettings` (one line) where a finished arm of ``out`` was run with other settings."""
    for seed in seeds:
        for arm in ARMS:
            folder = run_dir(out, arm, seed)
            if not (folder / RESULTS_FILE).is_file():
                continue
            remedy = f"delete {folder} to run that arm again"
            stored = read_json(folder / RUN_FILE, remedy).get("settings", {}).get("conversion")  # type: ignore
            found = differences(stored, conversion.record())
            if found:
                raise OtherSettings(f"{folder} was run with other settings ({'; '.join(found[:3])}): give another "
                                    f"--out, or {remedy}")


def pretrained(out: Path, seed: int) -> transformers.LlamaForCausalLM:
    """The seed's trained ``rope`` model, from its folder."""
    folder = run_dir(out, ROPE, seed) / MODEL_FOLDER
    if not (folder / "config.json").is_file():
        raise UserError(f"the RoPE model of seed {seed} is missing ({folder}): delete {folder.parent} to train it "
                        "again")
    return transformers.LlamaForCausalLM.from_pretrained(folder)


def switch_to_path(model: transformers.PreTrainedModel, seed: int, protocol: Protocol) -> None:
    """PaTH in every layer, Llama's rotation turned off; PaTH's own weights drawn after seeding with ``seed``."""
    transformers.set_seed(seed)
    posattn_huggingface.apply_position_method(model, max_positions=max(protocol.lengths), **method_options(PATH))


def arm_model(arm: str, seed: int, corpus: Corpus, conversion: Conversion,
              out: Path) -> transformers.LlamaForCausalLM:
    """The arm's model before its training: built (``rope``, ``scratch``) or the trained ``rope`` model."""
    if arm in (ROPE, SCRATCH):
        method = LLAMA_ROPE if arm == ROPE else PATH
        return build_model(len(corpus.dictionary), method, conversion.size, conversion.protocol, seed)
    model = pretrained(out, seed)
    if arm != ROPE_CONTINUED:
        switch_to_path(model, seed, conversion.protocol)
    return model


def run_arm(arm: str, seed: int, corpus: Corpus, conversion: Conversion, out: Path, command: str) -> Path:
    """Trains (where the arm trains) and scores one arm unless its results exist; returns its ``results.json``."""
    started = begin_run(out, arm, seed)
    if isinstance(started, Path):
        return started
    model = arm_model(arm, seed, corpus, conversion, out)
    started.introduce(parameter_count(model), corpus)
    budget = conversion.budget(arm)
    seconds = 0.0
    if budget.updates:
        inputs, targets = training_blocks(corpus.train, conversion.protocol.train_length)
        order = seed if arm == ROPE else seed + FINETUNE_SEED_OFFSET
        seconds = train(model, inputs, targets, budget, order, started.log, started.folder)
    else:
        started.log("not trained: scored as switched")
    if arm == ROPE:
        model.save_pretrained(started.folder / MODEL_FOLDER)
    settings = {"conversion": conversion.record(), "arm": arm, "updates": budget.updates,
                "position_method": getattr(model.config, CONFIG_RECORD, None),
                "attn_implementation": model.config._attn_implementation}
    return started.finish(NextTokenLogits(model), parameter_count(model), seconds, corpus, conversion.protocol,
                          command, f"{ARMS[arm]}: " + budget_text(conversion.size, budget, conversion.protocol),
                          settings)


def mean_sd(values: List[float]) -> Tuple[float, Optional[float]]:
    """The mean and the sample standard deviation (None for one value)."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def summarise(records: List[Record]) -> Dict[str, object]:
    """Per arm its loss by seed with mean and sd; per pair of :data:`PAIRS` the differences by seed, their mean
    and sd, the seeds where the first is lower, and the paired t-test's two-sided p (the comparison suite's)."""
    loss = {arm: {int(r["seed"]): float(r["loss"]) for r in records if r["method"] == arm} for arm in ARMS}
    arms = {arm: dict(zip(("mean", "sd"), mean_sd(list(by_seed.values()))), what=ARMS[arm], loss_by_seed=by_seed)
            for arm, by_seed in loss.items()}
    pairs = {}
    for first, second in PAIRS:
        delta = {seed: loss[first][seed] - loss[second][seed] for seed in loss[first]}
        pairs[f"{first} - {second}"] = dict(zip(("mean", "sd"), mean_sd(list(delta.values()))), by_seed=delta,
                                            first_lower=sum(d < 0 for d in delta.values()), seeds=len(delta),
                                            paired_t_p=paired_t_test(list(delta.values())))
    return {"arms": arms, "pairs": pairs}


def p_cell(p: Optional[float]) -> str:
    """A p-value to 2 significant digits; ``-`` where there is none (one seed)."""
    return "-" if p is None else f"{p:.2g}"


def cell(mean: float, sd: Optional[float], sign: str = "") -> str:
    """``mean ± sd`` to 3 decimals, the mean alone of one seed; ``sign``: ``+`` to sign the mean."""
    return f"{mean:{sign}.3f}" if sd is None else f"{mean:{sign}.3f} ± {sd:.3f}"


def markdown(summary: Dict, conversion: Conversion, seeds: List[int]) -> str:
    """results.md: the arms' losses, then the paired differences."""
    c = conversion
    lines = [f"# Converting a RoPE Llama to PaTH attention (Hugging Face front-end)\n",
             f"Validation loss in bits per token (base 2) over every token of the scored split, non-overlapping "
             f"windows of {c.protocol.train_length} tokens; mean ± sd over seeds {', '.join(map(str, seeds))}. "
             f"N1 = {c.pretrain.updates} pretraining updates, N2 = {c.finetune.updates} updates per fine-tune, "
             f"{c.finetune.batch_size} blocks of {c.protocol.train_length} tokens each; Llama {c.size.layers} x "
             f"{c.size.dim}, {c.size.heads} heads; {c.data['train_tokens']} training tokens, "
             f"{c.data['scored_tokens']} scored.\n",
             "| arm | what | loss (bits) | ppl | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "|---|---|---:|---:|" + "---:|" * len(seeds)]
    for arm, row in summary["arms"].items():
        by_seed = " | ".join(f"{row['loss_by_seed'][s]:.3f}" for s in seeds)
        lines.append(f"| {arm} | {row['what']} | {cell(row['mean'], row['sd'])} | {2 ** row['mean']:.1f} | "
                     f"{by_seed} |")
    lines += ["", "## Paired by seed\n", "Loss difference in bits, first - second (negative: the first is lower).\n",
              "| first - second | " + " | ".join(f"seed {s}" for s in seeds)
              + " | mean ± sd | first lower | paired t-test p |", "|---|" + "---:|" * (len(seeds) + 3)]
    for name, pair in summary["pairs"].items():
        by_seed = " | ".join(f"{pair['by_seed'][s]:+.3f}" for s in seeds)
        lines.append(f"| {name} | {by_seed} | {cell(pair['mean'], pair['sd'], '+')} | {pair['first_lower']} of "
                     f"{pair['seeds']} | {p_cell(pair['paired_t_p'])} |")
    return "\n".join(lines) + "\n"


def write_reports(out: Path, results: List[Path], conversion: Conversion, seeds: List[int]) -> None:
    """``OUT/results.json`` (the settings, :func:`summarise`'s summary and every arm's record) and
    ``OUT/results.md`` (:func:`markdown`), each written under a temporary name and renamed."""
    records = [record for path in results for record in read_records(path)]
    summary = summarise(records)
    write_json(out / "results.json", dict(settings=conversion.record(), seeds=seeds, **summary, records=records))
    write_atomically(out / "results.md", markdown(summary, conversion, seeds))
    print(f"==> {out / 'results.md'}, {out / 'results.json'}", flush=True)


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Budget per seed: N1 + 3 x N2 updates of --batch-size blocks (one RoPE pretraining; two PaTH "
        "trainings and one RoPE fine-tune of N2 each) and five scorings of the split. The defaults on full PTB "
        "(--data-dir ../shared/data/ptb_lm, --threads 1): 750 updates and five scorings of 73,760 tokens per seed, "
        "about 10 minutes per seed on one CPU core shared with other work (30 minutes for the three seeds), a PaTH "
        "update 1.0-1.2 times a RoPE one. Every training's warm-up and optimiser start afresh.")
    parser.add_argument("--data-dir", type=Path, default=SAMPLE,
                        help="{train,valid,test}.txt(.gz) or ptb.{train,valid,test}.txt(.gz) (default: the shipped "
                        "sample data/ptb_sample; full PTB: ../shared/data/ptb_lm)")
    parser.add_argument("--out", type=Path, default=Path("path-conversion-output"),
                        help="the output folder (default: path-conversion-output)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="default: 1 2 3")
    parser.add_argument("--pretrain-updates", type=int, default=300, help="N1: the RoPE model's updates (default 300)")
    parser.add_argument("--finetune-updates", type=int, default=150,
                        help="N2: the converted model's fine-tune, PaTH from scratch's training, the RoPE model's "
                        "continuation (default 150)")
    parser.add_argument("--batch-size", type=int, default=32, help="blocks per update (default 32)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    parser.add_argument("--warmup", type=int, default=50, help="warm-up updates from 0, of every training (default 50)")
    parser.add_argument("--train-length", type=int, default=64,
                        help="tokens per block, and per scored window (default 64)")
    parser.add_argument("--subset", default="valid", help="the split scored")
    parser.add_argument("--eval-tokens", type=int, default=8192, help="tokens read per evaluation batch")
    parser.add_argument("--dim", type=int, default=128, help="hidden_size")
    parser.add_argument("--intermediate-size", type=int, default=344, help="the SwiGLU's width")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--attention-dropout", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    for name in ("pretrain_updates", "finetune_updates", "batch_size", "train_length", "eval_tokens", "dim",
                 "intermediate_size", "layers", "heads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds: each seed once")
    return args


def conversion_of(args: argparse.Namespace, corpus: Corpus) -> Conversion:
    """The command's settings, the fine-tunes' budget the pretraining's but for its updates."""
    budget = Budget(args.pretrain_updates, args.batch_size, args.lr, args.warmup, warmup_init_lr=WARMUP_INIT_LR)
    return Conversion(
        LlamaSize(args.dim, args.intermediate_size, args.layers, args.heads, args.attention_dropout), budget,
        replace(budget, updates=args.finetune_updates),
        Protocol(args.train_length, (args.train_length,), ("nonoverlapping",), args.eval_tokens),
        {"vocabulary": len(corpus.dictionary), "train_tokens": corpus.train.numel(),
         "scored_tokens": corpus.valid.numel()})


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        corpus = load_corpus(args.data_dir, args.subset)
        conversion = conversion_of(args, corpus)
        check_finished_arms(args.out, args.seeds, conversion)
        command = shlex.join(["python", sys.argv[0], *argv])
        results = [run_arm(arm, seed, corpus, conversion, args.out, command) for seed in args.seeds for arm in ARMS]
    except (UserError, FileNotFoundError) as error:
        print(f"path_conversion.py: error: {error}", file=sys.stderr)
        return 2
    write_reports(args.out, results, conversion, args.seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
