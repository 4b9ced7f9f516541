#!/usr/bin/env python
"""Train short, test long: the methods of ``run.sh`` and its results (markdown tables and a PNG).

Four commands (``run.sh`` calls them)::

    python examples/length_extrapolation/extrapolation.py methods [NAME ...]
    python examples/length_extrapolation/extrapolation.py overrides NAME LENGTH TRAIN_LENGTH
    python examples/length_extrapolation/extrapolation.py outcome LOG
    python examples/length_extrapolation/extrapolation.py table --out OUT --methods "..." --seeds "1 2" \\
        --lengths "64 128 256" --modes "nonoverlapping sliding" --train-length 64 --stride L/2

``methods`` prints one line per method, ``NAME<TAB>FAMILY<TAB>EXTENSION<TAB>FLAGS``: FAMILY is ``tf``
(``transformer_lm_posattn``, the recipe adds its sizes) or ``lstm`` (``--arch`` included in FLAGS), FLAGS
the method's own flags, EXTENSION the context extension switched on at evaluation (``none`` but for the zero-shot
names below). ``all`` (the default) lists every causal variant the position registry declares
(``all_variants("decoder")``, each alone, without sequential position embeddings:
``--no-token-positional-embeddings``), then ``sinusoidal`` (fairseq's default embeddings), ``none`` (no
position information but the causal mask), ``learned`` (``--decoder-learned-pos``), the three names below and the
two attentive LSTM language models. A name ending in ``+sinusoidal`` (``alibi+sinusoidal``) keeps the sinusoidal
embeddings beside the method.

``rotary-yarn-zero-shot`` and ``rotary-dynamic-zero-shot`` train RoPE as ``rotary`` does and read it past the
training length L with one of RoPE's context extensions switched on at evaluation only, as a model is extended
without fine-tuning (Peng et al. 2023, YaRN, sections 3.3-3.4): YaRN with the factor s = the evaluation length / L,
and dynamic NTK scaling (the factor of each token's own length n, n / L). ``overrides NAME LENGTH TRAIN_LENGTH``
prints the ``--model-overrides`` of one evaluation: the window's ``max_target_positions``, and past L the
extension's options (with ``decoder_reset_position_options``: the checkpoint was trained without them).
``rotary-none-interleaved`` takes RoPE in the first of every two layers and no position method in the second
(``--decoder-layer-methods rotary,none``).

``outcome`` prints how one fairseq-eval-lm log ended: ``ok`` (it scored the split), ``refused`` (the model
refused the length at start-up) or ``failed`` (anything else: killed, a traceback); the recipe keeps the first
two as finished and redoes a failed one.

``table`` reads ``OUT/logs``: ``train.NAME.seedS.log`` (fairseq-train, with the recipe's ``wall_seconds``)
and ``eval.NAME.seedS.MODE.LL.log`` (fairseq-eval-lm, with the recipe's ``wall_seconds`` and
``exit_status``; a failed evaluation's ``eval.NAME.seedS.MODE.LL.failed.log``), and writes ``OUT/results.md``
(perplexity per method and evaluation length, mean ± sd over seeds, "refuses (limit t)" where the model refused
to read the length; the wall time of every evaluation), ``OUT/results.json`` (every evaluation's record) and
``OUT/perplexity.png`` (perplexity against evaluation length, one line per method, the seeds' range as a band; one
panel per mode).
"""

import argparse
import json
import os
import re
import statistics
import sys
from typing import Dict, List, Optional, Sequence, Tuple

#: RoPE trained as is, read past its training length with a context extension switched on at evaluation (zero-shot):
#: name -> the extension (``--decoder-rotary-scaling``)
ZERO_SHOT_EXTENSIONS = {"rotary-yarn-zero-shot": "yarn", "rotary-dynamic-zero-shot": "dynamic"}
#: RoPE in the first of every two layers and no position method in the second (``--decoder-layer-methods``), the
#: interleaving of Llama 4 and of Yang et al. 2025 (RNoPE) with full attention in every layer
INTERLEAVED = "rotary-none-interleaved"
#: names the recipe knows besides the registry's variants, in table order
EXTRA_METHODS = ("sinusoidal", "none", "learned", *ZERO_SHOT_EXTENSIONS, INTERLEAVED, "attentive_lstm_lm",
                 "positional_attentive_lstm_lm")
KEEP_SINUSOID = "+sinusoidal"
MODES = {"nonoverlapping": "non-overlapping windows (--context-window 0)",
         "sliding": "sliding window (--context-window L - {stride})"}

LOSS_RE = re.compile(r"Loss \(base 2\): ([-+0-9.naif]+), Perplexity: ([-+0-9.naif]+)")
TOKENS_RE = re.compile(r"Evaluated ([0-9,]+) tokens in ([0-9.]+)s")
ERROR_RE = re.compile(r"^fairseq-eval-lm: error: (.*)$", re.M)
#: the limit t in the plugin's refusals of a model tied to its positions (a weight learned for t positions,
#: a model tied to its t positions, a block longer than the t positions a term learns)
LIMIT_RE = re.compile(r"(?:learned for|tied to its|longer than the) (\d+) positions")
WALL_RE = re.compile(r"^wall_seconds ([0-9.]+)", re.M)
STATUS_RE = re.compile(r"^exit_status (\d+)", re.M)
PARAMS_RE = re.compile(r"num\. (?:shared )?model params: ([0-9,]+)")


# ------------------------------------------------------------------------------------------- methods
def registry_variants() -> Dict[str, List[str]]:
    """Every causal variant the registry declares, name -> its ``--decoder-*`` flags (the library's registry:
    importing its terms registers every method; fairseq is not imported)."""
    from posattn.position_terms.catalogue import all_variants, variant_flags  # the package registers every method

    return {name: variant_flags("decoder", values) for name, values in all_variants("decoder").items()}


def method_line(name: str, variants: Dict[str, List[str]]) -> Tuple[str, str, List[str]]:
    """``(name, family, flags)`` of one method name (see the module docstring)."""
    keep = name.endswith(KEEP_SINUSOID)
    base = name[: -len(KEEP_SINUSOID)] if keep else name
    if base in variants:
        return name, "tf", variants[base] + ([] if keep else ["--no-token-positional-embeddings"])
    if keep:
        raise ValueError(f"{name}: {KEEP_SINUSOID} goes with a registered variant ({', '.join(variants)})")
    if base in ZERO_SHOT_EXTENSIONS:
        return name, "tf", variants["rotary"] + ["--no-token-positional-embeddings"]
    if base == INTERLEAVED:
        return name, "tf", variants["rotary"] + ["--decoder-layer-methods", "rotary,none",
                                                 "--no-token-positional-embeddings"]
    if base == "sinusoidal":
        return name, "tf", []
    if base == "none":
        return name, "tf", ["--no-token-positional-embeddings"]
    if base == "learned":
        return name, "tf", ["--decoder-learned-pos"]
    if base in ("attentive_lstm_lm", "positional_attentive_lstm_lm"):
        return name, "lstm", ["--arch", base]
    raise ValueError(f"unknown method {name!r}: one of {', '.join([*variants, *EXTRA_METHODS])}, "
                     f"a variant with {KEEP_SINUSOID}, or all")


def list_methods(names: Sequence[str]) -> List[Tuple[str, str, List[str]]]:
    variants = registry_variants()
    expanded: List[str] = []
    for name in names or ["all"]:
        expanded += [*variants, *EXTRA_METHODS] if name == "all" else [name]
    return [method_line(name, variants) for name in dict.fromkeys(expanded)]


def evaluation_overrides(name: str, length: int, train_length: int) -> Dict[str, object]:
    """fairseq-eval-lm's ``--model-overrides`` for a window of ``length`` tokens: its ``max_target_positions``; for a
    zero-shot extension past ``train_length`` L, its options: YaRN's factor ``length / L`` (Peng et al. 2023,
    sections 3.2 and 3.4, s = L' / L), dynamic NTK's factor 1 (the frequencies of ``ntk`` with the factor n / L of
    each token's length n, section 3.3), each with L, and the reset that lets the checkpoint load into them."""
    overrides: Dict[str, object] = {"max_target_positions": length}
    extension = ZERO_SHOT_EXTENSIONS.get(name)
    if extension is None or length <= train_length:
        return overrides
    factor = length / train_length if extension == "yarn" else 1.0
    return {**overrides, "decoder_rotary_scaling": extension, "decoder_rotary_scaling_factor": factor,
            "decoder_rotary_original_positions": train_length, "decoder_reset_position_options": True}


# --------------------------------------------------------------------------------------------- results
def read(path: str) -> Optional[str]:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def parse_eval(text: Optional[str]) -> Dict:
    """One evaluation's record: ``status`` (``ok``, ``refused``, ``failed`` or ``missing``), and ``ppl``,
    ``loss`` (base 2), ``tokens``, ``scoring_seconds`` (fairseq's own timer), ``wall_seconds`` (the whole
    command), ``limit`` (refused) or ``error`` as found."""
    if text is None:
        return {"status": "missing"}
    record: Dict = {}
    wall = WALL_RE.findall(text)
    if wall:
        record["wall_seconds"] = float(wall[-1])
    loss = LOSS_RE.findall(text)
    tokens = TOKENS_RE.findall(text)
    error = ERROR_RE.findall(text)
    status = STATUS_RE.findall(text)
    if loss and tokens and (not status or status[-1] == "0"):
        record.update(status="ok", loss=float(loss[-1][0]), ppl=2 ** float(loss[-1][0]),
                      tokens=int(tokens[-1][0].replace(",", "")), scoring_seconds=float(tokens[-1][1]))
        return record
    if error:
        limit = LIMIT_RE.search(error[-1])
        record.update(status="refused" if limit else "failed", error=error[-1])
        if limit:
            record["limit"] = int(limit.group(1))
        return record
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(("wall_seconds", "exit_"))]
    record.update(status="failed", error=lines[-1] if lines else "empty log")
    return record


def evaluation_log(logs: str, method: str, seed: str, mode: str, length: int) -> Optional[str]:
    """The text of an evaluation's log: the finished one (scored or refused), else the failed one, else None."""
    finished = os.path.join(logs, f"eval.{method}.seed{seed}.{mode}.L{length}.log")
    text = read(finished)
    return text if text is not None else read(finished[:-len(".log")] + ".failed.log")


def collect(logs: str, methods: Sequence[str], seeds: Sequence[str], modes: Sequence[str],
            lengths: Sequence[int]) -> List[Dict]:
    records = []
    for method in methods:
        for seed in seeds:
            train = read(os.path.join(logs, f"train.{method}.seed{seed}.log")) or ""
            params = PARAMS_RE.findall(train)
            for mode in modes:
                for length in lengths:
                    record = parse_eval(evaluation_log(logs, method, seed, mode, length))
                    record.update(method=method, seed=seed, mode=mode, length=length)
                    if params:
                        record["params"] = int(params[0].replace(",", ""))
                    records.append(record)
    return records


def mean_sd(values: List[float]) -> Tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def cell(records: List[Dict]) -> str:
    """Mean ± sd of the seeds' perplexities; "refuses (limit t)"; "failed"; "" where nothing ran yet."""
    ok = [r["ppl"] for r in records if r["status"] == "ok"]
    refused = [r for r in records if r["status"] == "refused"]
    if ok:
        mean, sd = mean_sd(ok)
        text = f"{mean:.1f}" + (f" ± {sd:.1f}" if len(ok) > 1 else "")
        missing = len(records) - len(ok)
        return text + (f" ({len(ok)} of {len(records)} seeds)" if missing else "")
    if refused:
        return f"refuses (limit {refused[0]['limit']})"
    if any(r["status"] == "failed" for r in records):
        return "failed"
    return ""


#: what a table's refusal cell means (the recipe's results.md and the results page say it alike)
REFUSAL_NOTE = ("\"refuses (limit t)\": the model's parameters are tied to its t positions and it refused the length "
                "at start-up (nothing scored).")


def markdown(records: List[Dict], methods: Sequence[str], modes: Sequence[str], lengths: Sequence[int],
             train_length: int, stride: str, seeds: Sequence[str]) -> str:
    out = [f"# Length extrapolation: trained on blocks of {train_length} tokens",
           "",
           f"Perplexity of fairseq-eval-lm (every token of the split, base 2 loss -> 2^loss), mean ± sd over "
           f"seeds {' '.join(seeds)}; {REFUSAL_NOTE} Sliding window: blocks of {stride} scored tokens (the stride), "
           f"each read after up to L - {stride} earlier tokens.", ""]
    return "\n".join(out + tables(records, methods, modes, lengths, train_length, stride)) + "\n"


def tables(records: List[Dict], methods: Sequence[str], modes: Sequence[str], lengths: Sequence[int],
           train_length: int, stride: str, heading: str = "##") -> List[str]:
    """Markdown lines: per mode the perplexity table (methods x evaluation lengths), then the wall time of every
    evaluation and the failed ones, each under a ``heading`` (the results page nests them deeper)."""
    def select(**key) -> List[Dict]:
        return [r for r in records if all(r[k] == v for k, v in key.items())]

    def header(first: str) -> List[str]:
        columns = [f"{length} (x{length // train_length})" if length % train_length == 0 else str(length)
                   for length in lengths]
        return [f"| {first} | " + " | ".join(columns) + " |", "|---|" + "---|" * len(lengths)]

    out: List[str] = []
    for mode in modes:
        out += [f"{heading} {MODES[mode].format(stride=stride)}", ""] + header("method")
        for method in methods:
            out.append(f"| {method} | " + " | ".join(cell(select(method=method, mode=mode, length=length))
                                                     for length in lengths) + " |")
        out.append("")
    out += [f"{heading} Wall time of each evaluation (seconds: the whole fairseq-eval-lm command / its scoring alone)",
            "", "Mean over seeds; refusals take the start-up only.", ""]
    columns = [f"{'non-overlapping' if mode == 'nonoverlapping' else 'sliding'} {length}"
               for mode in modes for length in lengths]
    out += ["| method | params | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for method in methods:
        params = next((r["params"] for r in select(method=method) if "params" in r), None)
        cells = []
        for mode in modes:
            for length in lengths:
                found = select(method=method, mode=mode, length=length)
                wall = [r["wall_seconds"] for r in found if "wall_seconds" in r]
                scoring = [r["scoring_seconds"] for r in found if "scoring_seconds" in r]
                text = f"{statistics.fmean(wall):.1f}" if wall else ""
                if scoring:
                    text += f" / {statistics.fmean(scoring):.1f}"
                cells.append(text)
        out.append(f"| {method} | {params if params is not None else ''} | " + " | ".join(cells) + " |")
    failures = [r for r in records if r["status"] == "failed"]
    if failures:
        out += ["", f"{heading} Failed evaluations", ""]
        out += [f"- {r['method']} seed {r['seed']} {r['mode']} L={r['length']}: {r['error']}" for r in failures]
    return out


def plot(records: List[Dict], methods: Sequence[str], modes: Sequence[str], lengths: Sequence[int],
         train_length: int, stride: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab20")
    figure, axes = plt.subplots(1, len(modes), figsize=(6.5 * len(modes), 5.5), squeeze=False, sharey=True)
    for ax, mode in zip(axes[0], modes):
        for index, method in enumerate(methods):
            xs, means, lows, highs = [], [], [], []
            for length in lengths:
                ok = [r["ppl"] for r in records
                      if r["method"] == method and r["mode"] == mode and r["length"] == length and r["status"] == "ok"]
                if ok:
                    xs.append(length)
                    means.append(statistics.fmean(ok))
                    lows.append(min(ok))
                    highs.append(max(ok))
            if not xs:
                continue
            colour = colours((2 * index) % 20 + (index // 10) % 2)  # ten dark hues, then their light ones
            style = "-" if (index // 10) % 2 == 0 else "--"
            refused = [r["limit"] for r in records if r["method"] == method and r["status"] == "refused"]
            label = method + (f" (refuses beyond {refused[0]})" if refused else "")
            ax.plot(xs, means, style, marker="o", markersize=3, color=colour, label=label)
            if any(high > low for low, high in zip(lows, highs)):
                ax.fill_between(xs, lows, highs, color=colour, alpha=0.2, linewidth=0)
        ax.axvline(train_length, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(list(lengths))
        ax.set_xticklabels([str(length) for length in lengths])
        ax.set_xlabel(f"evaluation length L (tokens; trained on {train_length})")
        ax.set_title(MODES[mode].format(stride=stride))
    axes[0][0].set_ylabel("perplexity (band: range over seeds)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        more = ax.get_legend_handles_labels()
        for handle, label in zip(*more):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    figure.tight_layout()
    tmp = path + ".part.png"
    figure.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(figure)
    os.replace(tmp, path)


def write_atomically(path: str, text: str) -> None:
    tmp = path + ".part"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ main
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    methods = commands.add_parser("methods", help="NAME<TAB>FAMILY<TAB>EXTENSION<TAB>FLAGS per method")
    methods.add_argument("names", nargs="*", help="method names, or all (the default)")
    outcome = commands.add_parser("outcome", help="how one fairseq-eval-lm log ended: ok, refused or failed")
    outcome.add_argument("log", help="the evaluation's log, with the recipe's exit_status line")
    overrides = commands.add_parser("overrides", help="the --model-overrides of one evaluation")
    overrides.add_argument("name")
    overrides.add_argument("length", type=int, help="the evaluation's window, in tokens")
    overrides.add_argument("train_length", type=int, help="the training length L")
    table = commands.add_parser("table", help="results.md, results.json and perplexity.png from the logs")
    table.add_argument("--out", required=True, help="the recipe's output folder (reads OUT/logs)")
    table.add_argument("--methods", required=True)
    table.add_argument("--seeds", required=True)
    table.add_argument("--lengths", required=True, help="evaluation lengths, e.g. '64 128 256'")
    table.add_argument("--modes", default="nonoverlapping sliding")
    table.add_argument("--train-length", type=int, required=True)
    table.add_argument("--stride", required=True,
                       help="the sliding window's scored tokens per window: a number, or L/k (L the evaluation length)")
    args = parser.parse_args(argv)

    if args.command == "methods":
        try:
            lines = list_methods([name for arg in args.names for name in arg.split()])
        except ValueError as error:
            print(f"extrapolation.py: error: {error}", file=sys.stderr)
            return 2
        for name, family, flags in lines:
            print("\t".join([name, family, ZERO_SHOT_EXTENSIONS.get(name, "none"), " ".join(flags)]))
        return 0
    if args.command == "overrides":
        print(evaluation_overrides(args.name, args.length, args.train_length))
        return 0
    if args.command == "outcome":
        print(parse_eval(read(args.log))["status"])
        return 0

    names, seeds, modes = args.methods.split(), args.seeds.split(), args.modes.split()
    lengths = [int(length) for length in args.lengths.split()]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        print(f"extrapolation.py: error: modes are {' and '.join(MODES)}, got {' '.join(unknown)}", file=sys.stderr)
        return 2
    records = collect(os.path.join(args.out, "logs"), names, seeds, modes, lengths)
    text = markdown(records, names, modes, lengths, args.train_length, args.stride, seeds)
    write_atomically(os.path.join(args.out, "results.md"), text)
    write_atomically(os.path.join(args.out, "results.json"), json.dumps(records, indent=1) + "\n")
    plot(records, names, modes, lengths, args.train_length, args.stride, os.path.join(args.out, "perplexity.png"))
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
