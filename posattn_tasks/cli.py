"""``posattn-tasks``: the comparison suite's command.

    posattn-tasks run --tier cpu --jobs 2                 # every method x task x 3 seeds, resumable
    posattn-tasks run --quick                             # a few methods on every task, in about a minute
    posattn-tasks report --records RECORDS --out PAGE.md  # the tables, plots and verdicts from the records
    posattn-tasks list                                    # the tasks, the methods, the tiers

Bad input (an unknown task or method, damaged or mismatched records, a missing corpus) ends in one line on
standard error, status 2, with nothing written.
"""

import argparse
import signal
import sys
from pathlib import Path
from typing import List, Optional

from posattn.errors import UserError
from posattn_tasks.methods import method_label, method_names
from posattn_tasks.run import MODELS, Grid, run_grid
from posattn_tasks.tasks import TASKS
from posattn_tasks.tiers import TIERS

#: the methods ``--quick`` trains unless told otherwise: no positions, a bias, a rotation, a data-dependent one
QUICK_METHODS = ("nope", "alibi", "rotary")
DEFAULT_RECORDS = Path("posattn-tasks-records")


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="posattn-tasks", description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = main.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train and test the grid's runs not yet recorded")
    run.add_argument("--tier", choices=list(TIERS), default="cpu", help="sizes: " + "; ".join(
        f"{name}: {tier.about}" for name, tier in TIERS.items()))
    run.add_argument("--quick", action="store_true", help="the quick tier, with its few methods and one seed")
    run.add_argument("--tasks", nargs="+", default=None, metavar="TASK", help=f"default: all ({', '.join(TASKS)})")
    run.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                     help="default: every method (posattn-tasks list)")
    run.add_argument("--seeds", nargs="+", type=int, default=None, help="default: 1 2 3 (--quick: 1)")
    run.add_argument("--model", choices=MODELS, default="posattn",
                     help="posattn: the suite's decoder on posattn.SelfAttention; llama: a Hugging Face Llama "
                          "switched by posattn_huggingface (the extra hf)")
    run.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    run.add_argument("--threads", type=int, default=1, help="torch threads per run")
    run.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    run.add_argument("--records", type=Path, default=DEFAULT_RECORDS, help="the records' folder")
    run.add_argument("--corpus", type=Path, default=None,
                     help="PTB's folder for the language-model task (default: ../shared/data/ptb_lm beside the "
                          "clone, else the clone's data/ptb_sample)")
    report = commands.add_parser("report", help="the tables, plots and verdicts of the records")
    report.add_argument("--records", type=Path, default=DEFAULT_RECORDS)
    report.add_argument("--out", type=Path, required=True, help="the page to write (markdown)")
    report.add_argument("--images", type=Path, default=None, help="the plots' folder (default: beside --out)")
    commands.add_parser("list", help="the tasks, methods and tiers")
    return main


def grid_of(args: argparse.Namespace) -> Grid:
    quick = args.quick or args.tier == "quick"
    return Grid(tier="quick" if quick else args.tier, tasks=args.tasks or TASKS,
                methods=args.methods or (QUICK_METHODS if quick else method_names()),
                seeds=args.seeds or ((1,) if quick else (1, 2, 3)), model=args.model, device=args.device,
                threads=args.threads, corpus=args.corpus)


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: the runs under way finish and are recorded, nothing further starts."""
    raise KeyboardInterrupt


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        if args.command == "list":
            print("tasks:", ", ".join(TASKS))
            print("methods:", ", ".join(f"{m} ({method_label(m)})" for m in method_names()))
            print("tiers:", "; ".join(f"{name}: {tier.about}" for name, tier in TIERS.items()))
            return 0
        if args.command == "report":
            from posattn_tasks.report import write_report

            print(write_report(args.records, args.out, args.images or args.out.parent / "images" / "comparison"))
            return 0
        failures = run_grid(grid_of(args), args.records, args.jobs)
    except UserError as error:
        print(f"posattn-tasks: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("posattn-tasks: interrupted: the finished runs are recorded; the same command runs the rest",
              file=sys.stderr)
        return 130
    for failure in failures:
        print(f"posattn-tasks: run failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
