"""The evidence plan: every run of the five comparisons, each the existing recipe with its settings.

One run = one task, one system, one seed (and for tagging one tag set), in its own output folder
``EVIDENCE_OUT/<task>/[<tag set>/]<system>/seed<N>``, made by the task's recipe under ``examples/``
with environment variables; a run is finished only when its final artifact is there (translations
with fairseq-generate's closing BLEU line, fairseq-eval-lm's perplexity, fairseq-validate's
accuracy) and its training log shows fairseq's "done training" under the plan's budget
(:func:`trained_under`), and then recorded in
git with the files its :class:`Kept` entries name (:mod:`records`). Multi30k is prepared once
(``translation/data``: Moses, BPE, spaCy parse, binarization, structural side data) and shared by its
runs; so is PTB for length extrapolation (``extrapolation/data``: one token stream per split, binarized).

Everything is read from the environment (see :class:`Settings`), so that the same command, run again,
plans the same runs.
"""

import functools
import importlib.util
import os
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Mapping, Optional, Tuple

from posattn_tools.runs import DONE_TRAINING

REPO = Path(__file__).resolve().parents[2]
TASKS = ("translation", "lm", "tagging", "classification", "extrapolation")
SHARED_DATA = REPO.parent / "shared" / "data"  # the recipes' own default: ../shared/data beside the clone

#: system key (the recipe's name for it) -> label, per task, baseline first; the length-extrapolation
#: task's systems come from its recipe (:func:`systems_of`)
SYSTEMS: Dict[str, Dict[str, str]] = {
    "translation": {
        "4": "row 4: sequential abs (baseline)", "1": "row 1: no positions", "2": "row 2: structural abs",
        "3": "row 3: structural rel", "5": "row 5: seq abs + struct abs", "6": "row 6: seq abs + struct abs + rel",
        "7": "row 7: seq abs + seq rel", "9": "row 9: seq abs + rel + struct abs + rel",
        "da": "DA-Transformer", "rpr": "Transformer-RPR", "pr": "SAN+P+R (encoder)",
        "conv2d": "+Conv2d (encoder)", "temp": "+Temp (encoder)",
    },
    "lm": {
        "lstm_lm": "LSTM (fairseq lstm_lm)", "attentive_lstm_lm": "attentive LSTM (Salton et al.)",
        "positional_attentive_lstm_lm": "positional attentive LSTM (Dagan)", "tf_vanilla": "Transformer LM",
        "tf_da": "Transformer LM + DA", "tf_shaw16": "Transformer LM + RPR (k = 16)",
        "tf_direct_both": "Transformer LM + P+R", "tf_conv2d": "Transformer LM + Conv2d",
        "lstm_lm_authors": "LSTM baseline (the authors' code, 3 layers), authors' budget",
        "attentive_lstm_lm_authors": "attentive LSTM (Salton et al.), authors' budget",
        "positional_attentive_lstm_lm_authors": "positional attentive LSTM (Dagan), authors' budget",
    },
    "tagging": {
        "pe_add": "SAN+PE[add]", "san": "SAN", "pe_con": "SAN+PE[con]", "p_r": "SAN+P+R",
        "temp": "SAN+PE[add]+Temp", "conv": "SAN+PE[add]+Conv", "conv2d": "SAN+PE[add]+Conv2d",
        "p_r_zero": "SAN+P+R (zero init)", "conv_pt": "SAN+PE[add]+Conv (PyTorch init)",
        "conv2d_pt": "SAN+PE[add]+Conv2d (PyTorch init)",
    },
    "classification": {
        "vanilla": "Transformer", "shaw": "Transformer-RPR", "da": "DA-Transformer", "nopos": "no positions",
    },
}
DEFAULT_SEEDS = {"translation": "1 2 3", "lm": "1 2", "tagging": "1 2 3", "classification": "1 2 3 4 5",
                 "extrapolation": "1 2 3"}
TAG_SETS = ("upos", "xpos")
#: the PTB LSTMs at the short budget (LM_EPOCHS epochs at LM_LSTM_LR: lm_budget), as they were recorded
LSTM_SYSTEMS = ("lstm_lm", "attentive_lstm_lm", "positional_attentive_lstm_lm")
#: the three at the authors' budget (lm_budget), system -> run_ptb.sh's model (its MODELS): their own output
#: folders and records, the same recipe, log names after the model (logs/train.<model>.log); the attentive
#: models are the short budget's, the LSTM is the authors' own baseline (their model without attention, as
#: Dagan's Table 1 ran it) where the short budget has fairseq's lstm_lm
LSTM_AUTHORS_SYSTEMS = {"lstm_lm_authors": "baseline_lstm_lm", "attentive_lstm_lm_authors": "attentive_lstm_lm",
                        "positional_attentive_lstm_lm_authors": "positional_attentive_lstm_lm"}
AUTHORS_EPOCHS = 40  # the default --epochs of the authors' main.py (gautierdag/pytorch-attentive-lm)
AUTHORS_LR = 30.0
AUTHORS_WEIGHT_DECAY = "1.2e-6"
AUTHORS_BATCH_SIZE = 32
AUTHORS_BASELINE_BATCH_SIZE = 20  # their LSTM baseline's batch (test.py, "as suggested by Merity et al.")
AUTHORS_BASELINE_LAYERS = 3
SALTON_LR_PATIENCE = 6  # the authors' run of Salton's model (test.py: --patience 6); the others wait 5
RECIPES = {"translation": "examples/multi30k_en_de/run.sh", "lm": "examples/language_model/run_ptb.sh",
           "tagging": "examples/pos_tagging/run.sh", "classification": "examples/sentence_classification/run.sh",
           "extrapolation": "examples/length_extrapolation/run.sh"}
#: length extrapolation: the training length on PTB, the evaluation lengths (its multiples) and the two ways of
#: reading the split (examples/length_extrapolation/README.md); the recipe's defaults
EXTRAPOLATION_TRAIN_LENGTH = 64
EXTRAPOLATION_MULTIPLIERS = (1, 2, 4, 8, 16)  # the default; EXTRAPOLATION_MULTIPLIERS (smoke runs: fewer)
EXTRAPOLATION_MODES = ("nonoverlapping", "sliding")
EXTRAPOLATION_STRIDE = "L/2"  # the sliding window's scored tokens per window (the recipe's SLIDE_STRIDE)
EXTRAPOLATION_REFERENCE = "sinusoidal"


def recipe_module(name: str, path: str) -> ModuleType:
    """A recipe's Python module by its path under the repository, loaded under ``name`` (two recipes' modules
    share a file name)."""
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@functools.lru_cache(maxsize=None)
def extrapolation_recipe() -> ModuleType:
    """The length-extrapolation recipe's Python half, examples/length_extrapolation/extrapolation.py."""
    return recipe_module("extrapolation", "examples/length_extrapolation/extrapolation.py")


@functools.lru_cache(maxsize=None)
def _extrapolation_systems() -> Dict[str, str]:
    names = [name for name, _, _ in extrapolation_recipe().list_methods(["all"])]
    return {name: name for name in [EXTRAPOLATION_REFERENCE] + [n for n in names if n != EXTRAPOLATION_REFERENCE]}


def systems_of(task: str) -> Dict[str, str]:
    """System key -> label of a task, baseline first: :data:`SYSTEMS`; for ``extrapolation`` the length-extrapolation
    recipe's methods (``extrapolation.py methods all``: every causal variant of the position registry, a method
    added to it included, then sinusoidal, none, learned and the attentive LSTMs), sinusoidal, the reference,
    first. Listing them imports the plugin, so it happens only when asked."""
    return _extrapolation_systems() if task == "extrapolation" else SYSTEMS[task]


class PlanError(ValueError):
    """A setting the plan cannot use; the message names the variable and what it takes."""


def _words(env: Mapping[str, str], name: str, default: str) -> List[str]:
    return (env.get(name) or default).split()


def _number(env: Mapping[str, str], name: str, default: float, kind: type = int) -> float:
    value = env.get(name) or str(default)
    try:
        number = kind(value)
    except ValueError:
        raise PlanError(f"{name} must be a {'whole ' if kind is int else ''}number, got {value!r}") from None
    if number < 0:
        raise PlanError(f"{name} must not be negative, got {value!r}")
    return number


@dataclass
class Settings:
    """What to run and with which budget; :meth:`from_env` documents the variables."""

    out: Path
    tasks: List[str]
    seeds: Dict[str, List[int]]
    #: per task its chosen systems; a task neither run nor given ``<TASK>_SYSTEMS`` is absent and has every one
    #: of its systems (:meth:`chosen_systems`), listed only when asked for
    systems: Dict[str, List[str]]
    tag_sets: List[str]
    translation_max_update: int = 1500
    lm_epochs: int = 6
    lm_tf_epochs: int = 20  # about the LSTMs' wall time of lm_epochs on this machine (lm_budget)
    # SGD. Not the paper's 30: with clipping at 0.25 every update is a step of lr/4, in the authors' code as in
    # fairseq (so its loss per target token changes nothing); at lr 30 both codes' training loss stays above a
    # uniform guess's for the first few hundred updates, which 6 epochs cannot absorb (see lm_budget)
    lm_lstm_lr: float = 10.0
    tagging_patience: int = 3
    tagging_max_epoch: int = 100
    classification_max_update: int = 434
    extrapolation_max_update: int = 500
    # the LSTM LMs' own: after 500 updates a recurrent LM is still at the unigram level (docs/results.md, section 5)
    extrapolation_lstm_max_update: int = 2000
    extrapolation_multipliers: List[int] = field(default_factory=lambda: list(EXTRAPOLATION_MULTIPLIERS))
    max_update: int = 0  # > 0: every run stops after at most this many updates (smoke runs)
    jobs: int = 2
    threads: int = 1
    data: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Settings":
        """``EVIDENCE_OUT`` (default ``evidence-output/`` in the repository), ``TASKS``, ``SEEDS`` (all
        tasks) or ``<TASK>_SEEDS`` (``TRANSLATION_SEEDS``, ``LM_SEEDS``, ``TAGGING_SEEDS``,
        ``CLASSIFICATION_SEEDS``, ``EXTRAPOLATION_SEEDS``), ``<TASK>_SYSTEMS`` alike, ``TAG_SETS``; budgets
        ``TRANSLATION_MAX_UPDATE``, ``LM_EPOCHS`` (epochs per LSTM language model of the short budget),
        ``LM_TF_EPOCHS`` (per transformer language model), ``LM_LSTM_LR`` (the short-budget LSTMs' SGD learning
        rate; the LSTMs at the authors' budget have theirs, fixed: :func:`lm_budget`),
        ``TAGGING_PATIENCE``, ``TAGGING_MAX_EPOCH``, ``CLASSIFICATION_MAX_UPDATE``,
        ``EXTRAPOLATION_MAX_UPDATE`` (updates per length-extrapolation transformer),
        ``EXTRAPOLATION_LSTM_MAX_UPDATE`` (per length-extrapolation LSTM LM), ``EXTRAPOLATION_MULTIPLIERS``
        (its evaluation lengths, multiples of the training length), and ``MAX_UPDATE`` (a cap
        on every run, for smoke runs); ``JOBS`` runs at once, ``THREADS`` CPU threads each; data
        ``MULTI30K_DIR``, ``PTB_DIR``, ``EWT_TRAIN`` + ``EWT_DEV`` (or ``EWT``, the folder), ``SST2``."""
        tasks = _words(env, "TASKS", " ".join(TASKS))
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise PlanError(f"TASKS takes {' '.join(TASKS)}, got {' '.join(unknown)}")
        seeds, systems = {}, {}
        for task in TASKS:
            words = _words(env, f"{task.upper()}_SEEDS", env.get("SEEDS") or DEFAULT_SEEDS[task])
            if not all(w.isdigit() for w in words) or not words:
                raise PlanError(f"{task.upper()}_SEEDS / SEEDS must be whole numbers, got {' '.join(words)!r}")
            seeds[task] = [int(w) for w in words]
            if task not in tasks and not env.get(f"{task.upper()}_SYSTEMS"):
                continue  # every system, listed when asked for: the length-extrapolation methods import fairseq
            chosen = _words(env, f"{task.upper()}_SYSTEMS", " ".join(systems_of(task)))
            bad = [s for s in chosen if s not in systems_of(task)]
            if bad:
                raise PlanError(f"{task.upper()}_SYSTEMS takes {' '.join(systems_of(task))}, got {' '.join(bad)}")
            systems[task] = chosen
        tag_sets = _words(env, "TAG_SETS", " ".join(TAG_SETS))
        if any(t not in TAG_SETS for t in tag_sets):
            raise PlanError(f"TAG_SETS takes {' '.join(TAG_SETS)}, got {' '.join(tag_sets)}")
        out = Path(env.get("EVIDENCE_OUT") or REPO / "evidence-output").resolve()
        return cls(
            out=out, tasks=tasks, seeds=seeds, systems=systems, tag_sets=tag_sets,
            translation_max_update=int(_number(env, "TRANSLATION_MAX_UPDATE", 1500)),
            lm_epochs=max(1, int(_number(env, "LM_EPOCHS", 6))),
            lm_tf_epochs=max(1, int(_number(env, "LM_TF_EPOCHS", 20))),
            lm_lstm_lr=float(_number(env, "LM_LSTM_LR", 10.0, float)),
            tagging_patience=int(_number(env, "TAGGING_PATIENCE", 3)),
            tagging_max_epoch=int(_number(env, "TAGGING_MAX_EPOCH", 100)),
            classification_max_update=int(_number(env, "CLASSIFICATION_MAX_UPDATE", 434)),
            extrapolation_max_update=max(1, int(_number(env, "EXTRAPOLATION_MAX_UPDATE", 500))),
            extrapolation_lstm_max_update=max(1, int(_number(env, "EXTRAPOLATION_LSTM_MAX_UPDATE", 2000))),
            extrapolation_multipliers=_multipliers(env),
            max_update=int(_number(env, "MAX_UPDATE", 0)),
            jobs=max(1, int(_number(env, "JOBS", 2))), threads=max(1, int(_number(env, "THREADS", 1))),
            data=_data(env),
        )

    def chosen_systems(self, task: str) -> List[str]:
        """The systems of ``task`` in this plan: those chosen, else every one of the task's."""
        return self.systems[task] if task in self.systems else list(systems_of(task))

    def to_json(self) -> Dict[str, object]:
        """The settings as JSON values, with the systems of every task."""
        values = asdict(self)
        values["out"] = str(self.out)
        values["systems"] = {**{task: self.chosen_systems(task) for task in TASKS}, **values["systems"]}
        return values

    @classmethod
    def from_json(cls, values: Mapping[str, object]) -> "Settings":
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        known["out"] = Path(str(known["out"]))
        known["seeds"] = {task: [int(s) for s in seeds] for task, seeds in known["seeds"].items()}  # type: ignore
        return cls(**known)  # type: ignore[arg-type]

    def capped(self, updates: int) -> int:
        """``updates`` under the ``MAX_UPDATE`` cap (0 = no limit on either side)."""
        if not self.max_update:
            return updates
        return min(updates, self.max_update) if updates else self.max_update


def _multipliers(env: Mapping[str, str]) -> List[int]:
    words = _words(env, "EXTRAPOLATION_MULTIPLIERS", " ".join(map(str, EXTRAPOLATION_MULTIPLIERS)))
    if not all(w.isdigit() and int(w) > 0 for w in words):
        raise PlanError(f"EXTRAPOLATION_MULTIPLIERS must be positive whole numbers, got {' '.join(words)!r}")
    return [int(w) for w in words]


def _data(env: Mapping[str, str]) -> Dict[str, str]:
    ewt = Path(env.get("EWT") or SHARED_DATA / "ud_english_ewt")
    return {
        "multi30k": env.get("MULTI30K_DIR") or str(SHARED_DATA / "multi30k"),
        "ptb": env.get("PTB_DIR") or str(SHARED_DATA / "ptb_lm"),
        "ewt_train": env.get("EWT_TRAIN") or str(ewt / "en_ewt-ud-train.conllu.gz"),
        "ewt_dev": env.get("EWT_DEV") or str(ewt / "en_ewt-ud-dev.conllu"),
        "sst2": env.get("SST2") or str(SHARED_DATA / "sst2"),
    }


def display(path: object) -> str:
    """A path as the page shows it: relative to the repository root (no machine's absolute paths)."""
    return os.path.relpath(str(path), REPO)


@dataclass(frozen=True)
class Kept:
    """One file of a run's record: ``name`` in the record, made from ``source`` in the run's folder.

    ``translations_of``: ``source`` is a fairseq-generate output of the references in this file; the
    record keeps its hypotheses, detokenized, in reference order. ``tags``: ``source`` is a CoNLL-U
    file; the record keeps its ``tags`` column (``upos`` / ``xpos``), one sentence per line.
    Otherwise the file is copied."""

    name: str
    source: Path
    translations_of: Optional[Path] = None
    tags: str = ""

    def lines(self) -> List[str]:
        if self.translations_of is not None:
            from fairseq_posattn.atomic_io import count_lines
            from fairseq_posattn.data.generate_output import read_generate_output
            from fairseq_posattn.data.text_pipeline import detokenize_lines

            reference = str(self.translations_of)
            return detokenize_lines(read_generate_output(str(self.source), reference, count_lines(reference)), "de")
        if self.tags:
            from fairseq_posattn.data.tagged_corpus import read_tagged_conllu

            return [" ".join(s.tags) for s in read_tagged_conllu(str(self.source), self.tags)]
        with open(self.source, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()


@dataclass
class Run:
    """One recipe invocation and how to tell that it finished."""

    id: str
    task: str
    system: str
    seed: Optional[int]
    group: str
    out_dir: Path
    recipe: str
    args: Tuple[str, ...]
    env: Dict[str, str]
    budget: str
    train_log: Optional[Path] = None
    done_when: Tuple[Tuple[Path, str], ...] = ()  # (file, text it must hold; "" = it must exist)
    depends_on: Optional[str] = None
    kept: Tuple[Kept, ...] = ()  # what its record keeps besides the training log (records.py)

    def finished(self) -> bool:
        for path, text in self.done_when:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    if text and text not in f.read():
                        return False
            except OSError:
                return False
        return bool(self.done_when)

    def command(self) -> List[str]:
        return ["bash", str(REPO / self.recipe), *self.args]

    def shell(self) -> str:
        """The exact command, from the repository root, paths relative to it."""
        def shown(value: str) -> str:
            return display(value) if os.path.isabs(value) else value
        assignments = [f"{name}={shlex.quote(shown(value))}" for name, value in self.env.items()]
        return " ".join(assignments + ["bash", self.recipe] + [shlex.quote(shown(a)) for a in self.args])


def build_plan(settings: Settings) -> List[Run]:
    """Every run of the selected tasks, in the order they are started: per task its preparation,
    then seed by seed every system (so that finished seeds give complete paired comparisons); the LSTMs at
    the authors' budget, the longest trainings by far (hours each on a CPU), after all the others, so that a
    runner of the whole plan is not held up by them."""
    builders = {"translation": _translation, "lm": _language_model, "tagging": _tagging,
                "classification": _classification, "extrapolation": _extrapolation}
    runs: List[Run] = []
    for task in settings.tasks:
        runs += builders[task](settings)
    return sorted(runs, key=lambda run: run.task == "lm" and run.system in LSTM_AUTHORS_SYSTEMS)  # stable


def system_labels(settings: Settings, task: str) -> Dict[str, str]:
    """The systems' names on the results page: :data:`SYSTEMS`, the LSTMs of the short budget named with it
    (beside the same models at the authors' budget)."""
    labels = dict(systems_of(task))
    if task == "lm":
        for system in LSTM_SYSTEMS:
            labels[system] += f", {settings.lm_epochs} epochs at lr {settings.lm_lstm_lr:g}"
    return labels


def _common(settings: Settings, out: Path) -> Dict[str, str]:
    return {"OUT": str(out), "THREADS": str(settings.threads)}


def trained_under(train_log: Path, **config: int) -> Tuple[Tuple[Path, str], ...]:
    """``done_when`` entries: the training finished (fairseq's own "done training", its last line) under these
    values of fairseq's configuration (fairseq-train prints it at its start: ``'max_epoch': 20,``). With them a
    training killed or failed after its start is not finished, whatever its recipe left on disk, and neither is
    a run whose budget changed although its old evaluations are there: the runner resumes its training."""
    return ((train_log, DONE_TRAINING),) + tuple((train_log, f"'{name}': {value},") for name, value in config.items())


def translation_budget(settings: Settings) -> str:
    return (f"{settings.capped(settings.translation_max_update):,} updates of at most 2,048 tokens per model "
            "(PRESET=small: transformer_posattn 3+3 layers x 128, 4 heads, FFN 512, dropout 0.1; Adam, lr 1e-3, "
            "inverse sqrt, 500 warm-up updates); checkpoint_best.pt; beam 5")


def _translation(settings: Settings) -> List[Run]:
    data = settings.out / "translation" / "data"
    prep = Run(
        id="translation/data", task="translation", system="", seed=None, group="", out_dir=data,
        recipe=RECIPES["translation"], args=(settings.data["multi30k"],),
        env={**_common(settings, data), "PRESET": "small", "STEPS": "prepare parse binarize structure"},
        budget="preparation: Moses, joint BPE (5,000 merges), spaCy parse, fairseq-preprocess, structure",
        done_when=tuple((data / "data-bin" / f"{split}.en-de.en.structure.idx", "")
                        for split in ("train", "valid", "test"))
        + ((data / "raw" / "test.de", ""), (data / "raw" / "valid.de", "")),
        kept=tuple(Kept(f"reference.{subset}.de", data / "raw" / f"{subset}.de") for subset in ("valid", "test")))
    runs = [prep]
    updates = settings.capped(settings.translation_max_update)
    for seed in settings.seeds["translation"]:
        for system in settings.systems["translation"]:
            out = settings.out / "translation" / system / f"seed{seed}"
            generated, train_log = out / "generate" / f"row{system}", out / "logs" / f"train-row{system}.log"
            runs.append(Run(
                id=f"translation/{system}/seed{seed}", task="translation", system=system, seed=seed, group="",
                out_dir=out, recipe=RECIPES["translation"], args=(settings.data["multi30k"],),
                env={**_common(settings, out), "PREP_OUT": str(data), "PRESET": "small", "VARIANTS": system,
                     "SEED": str(seed), "MAX_UPDATE": str(updates), "STEPS": "train generate",
                     "GEN_SUBSETS": "valid test", "JOBS": "1"},
                budget=translation_budget(settings), train_log=train_log,
                done_when=tuple((generated / f"generate-{subset}.txt", f"Generate {subset} with beam=")
                                for subset in ("valid", "test")) + trained_under(train_log, max_update=updates),
                depends_on=prep.id,
                kept=tuple(Kept(f"hypotheses.{subset}.de", generated / f"generate-{subset}.txt",
                                translations_of=data / "raw" / f"{subset}.de") for subset in ("valid", "test"))))
    return runs


def lm_model(system: str) -> str:
    """run_ptb.sh's name of the model a language-model system trains (its MODELS, and its logs' names)."""
    return LSTM_AUTHORS_SYSTEMS.get(system, system)


def lm_epochs(settings: Settings, system: str) -> int:
    if system in LSTM_AUTHORS_SYSTEMS:
        return AUTHORS_EPOCHS
    return settings.lm_epochs if system in LSTM_SYSTEMS else settings.lm_tf_epochs


def lm_budget(settings: Settings, system: str) -> str:
    cap = f", at most {settings.max_update:,} updates" if settings.max_update else ""
    if system in LSTM_AUTHORS_SYSTEMS:
        return ("the authors' settings (their code, gautierdag/pytorch-attentive-lm, as Dagan 2019 describes it): "
                "the attentive models at Dagan's sizes, embeddings and 2 LSTM layers of 400, tied, dropout 0.5 / "
                f"0.2 / 0.5, batches of {AUTHORS_BATCH_SIZE} sentences; the LSTM baseline as the authors' run of "
                f"it (baseline_lstm_lm: their model without attention, {AUTHORS_BASELINE_LAYERS} LSTM layers of "
                f"400, tied, dropout 0.4 / 0.25 / 0.5, batches of {AUTHORS_BASELINE_BATCH_SIZE} sentences); the "
                "architectures' defaults: the authors' initialisation and eps 1e-3 (--attentive-lm-init authors, "
                "--positional-attention-eps 1e-3); SGD, lr "
                f"{AUTHORS_LR:g}, no momentum, weight decay {AUTHORS_WEIGHT_DECAY}, clip-norm 0.25, lr x 0.5 after 5 "
                f"epochs without a lower valid loss, Salton's model after {SALTON_LR_PATIENCE} as the authors' run "
                "of it (OPTIMIZER=paper, LR_PATIENCE), the gradient averaged per sentence (--sentence-avg, "
                "LOSS_AVG: under clipping at 0.25 the step the authors take for their loss summed over the batch, "
                "where fairseq's per-token gradient is often shorter than 0.25); "
                f"{AUTHORS_EPOCHS} epochs of PTB{cap} (the default --epochs of the authors' main.py; their scripted "
                "runs allow up to 500, with early stopping), no early stopping; fp32; whole sentences (the authors' "
                "code cuts them at 35 tokens); valid every epoch; checkpoint_best.pt")
    time = (f"{lm_epochs(settings, system)} epochs of PTB{cap} (a number of epochs rather than a training time: the "
            "budget does not depend on the machine's load, and a run fits in one working session of this machine)")
    if system in LSTM_SYSTEMS:
        return ("Dagan's sizes: embeddings and 2 LSTM layers of 400, tied; dropout 0.5 / 0.2 / 0.5 (the attentive "
                "models' defaults; lstm_lm: 0.5); batches of 20 sentences (the authors' code: 32); every weight "
                "initialised U(-0.1, 0.1) and Dagan's eps 1e-6 (--attentive-lm-init uniform, "
                "--positional-attention-eps 1e-6: the defaults when these runs were made; the authors' code: its "
                "own initialisation, eps 1e-3); Dagan's optimiser and schedule: SGD, lr x 0.5 after 5 epochs "
                "without a better valid loss, clip-norm 0.25, but no weight decay (the authors': 1.2e-6) and lr "
                f"{settings.lm_lstm_lr:g} instead of 30 (clipping at 0.25 acts on every update, in the authors' code "
                "on the gradient of the summed loss as in fairseq on the gradient per target token, so both take "
                "steps of lr x 0.25 and fairseq's loss per target token changes nothing; at lr 30 the training loss "
                "stays above that of a uniform guess for the first few hundred updates, in the authors' code as in "
                "ours, which their runs of up to 500 epochs absorb and a budget of a few epochs cannot; in a "
                "200-update check on the PTB sample, lr 10 learned faster than 20 and 30); " + time
                + "; valid every epoch; checkpoint_best.pt")
    if settings.lm_tf_epochs != settings.lm_epochs:
        time += (f", chosen to take about the wall time of the LSTMs' {settings.lm_epochs} epochs on this machine (the "
                 "tables' last column compares them)")
    return ("small Transformer LM: 2 layers x 128, FFN 512, 4 heads, tied, dropout 0.1; batches of 32 sentences; "
            "Adam lr 1e-3, inverse sqrt, 100 warm-up updates; " + time + "; valid every epoch; checkpoint_best.pt")


def _language_model(settings: Settings) -> List[Run]:
    runs = []
    for seed in settings.seeds["lm"]:
        for system in settings.systems["lm"]:
            out, model = settings.out / "lm" / system / f"seed{seed}", lm_model(system)
            epochs = lm_epochs(settings, system)
            env = {**_common(settings, out), "PTB_DIR": settings.data["ptb"], "MODELS": model, "PARALLEL": "1",
                   "SEED": str(seed), "MAX_UPDATE": str(settings.capped(0)), "MAX_EPOCH": str(epochs),
                   "STOP_TIME_HOURS": "0", "VALIDATE": "1",
                   "EVAL_CHECKPOINT": "checkpoint_best.pt"}
            if system in LSTM_SYSTEMS:
                env.update(LSTM_DIM="400", LSTM_LAYERS="2", BATCH_SIZE="20", OPTIMIZER="paper",
                           LR=f"{settings.lm_lstm_lr:g}", DROPOUT="0.5" if system == "lstm_lm" else "",
                           WEIGHT_DECAY="0",  # as recorded: run_ptb.sh's OPTIMIZER=paper now adds 1.2e-6
                           LOSS_AVG="token")  # as recorded: OPTIMIZER=paper now averages the gradient per sentence
                # as recorded: the attentive models' initialisation and eps before the authors' became the defaults
                if system != "lstm_lm":
                    env["ATTENTIVE_LM_INIT"] = "uniform"
                if system == "positional_attentive_lstm_lm":
                    env["POSITIONAL_ATTENTION_EPS"] = "1e-6"
            elif system in LSTM_AUTHORS_SYSTEMS:
                # the authors' budget; their dropout, initialisation and eps are the architectures' defaults
                baseline = model == "baseline_lstm_lm"
                env.update(LSTM_DIM="400", LSTM_LAYERS=str(AUTHORS_BASELINE_LAYERS if baseline else 2),
                           BATCH_SIZE=str(AUTHORS_BASELINE_BATCH_SIZE if baseline else AUTHORS_BATCH_SIZE),
                           OPTIMIZER="paper", LR=f"{AUTHORS_LR:g}", DROPOUT="", WEIGHT_DECAY=AUTHORS_WEIGHT_DECAY,
                           PRECISION="fp32")
                if model == "attentive_lstm_lm":
                    env["LR_PATIENCE"] = str(SALTON_LR_PATIENCE)
            else:
                env.update(TF_DIM="128", TF_FFN="512", TF_LAYERS="2", TF_HEADS="4", BATCH_SIZE="32",
                           OPTIMIZER="adam", LR="0.001", WARMUP="100", DROPOUT="0.1")
            logs = out / "logs"
            train_log = logs / f"train.{model}.log"
            runs.append(Run(
                id=f"lm/{system}/seed{seed}", task="lm", system=system, seed=seed, group="", out_dir=out,
                recipe=RECIPES["lm"], args=(), env=env, budget=lm_budget(settings, system), train_log=train_log,
                done_when=tuple((logs / f"eval.{model}.{subset}.log", "Perplexity:") for subset in ("valid", "test"))
                + trained_under(train_log, max_epoch=epochs, max_update=settings.capped(0)),
                kept=tuple(Kept(f"eval.{subset}.log", logs / f"eval.{model}.{subset}.log")
                           for subset in ("valid", "test"))))
    return runs


def tagging_budget(settings: Settings) -> str:
    cap = f", at most {settings.max_update:,} updates" if settings.max_update else ""
    return (f"early stopping: dev accuracy every epoch, patience {settings.tagging_patience} epochs, at most "
            f"{settings.tagging_max_epoch} epochs{cap}; batches of 2,000 words; RMSprop lr 1e-3; san_tagger at the "
            "paper's UD sizes; scored from checkpoint_best.pt")


def _tagging(settings: Settings) -> List[Run]:
    runs = []
    for seed in settings.seeds["tagging"]:
        for group in settings.tag_sets:
            for system in settings.systems["tagging"]:
                out = settings.out / "tagging" / group / system / f"seed{seed}"
                run_dir = out / "runs" / system / f"seed{seed}"
                runs.append(Run(
                    id=f"tagging/{group}/{system}/seed{seed}", task="tagging", system=system, seed=seed, group=group,
                    out_dir=out, recipe=RECIPES["tagging"], args=(settings.data["ewt_train"], settings.data["ewt_dev"]),
                    env={**_common(settings, out), "VARIANTS": system, "SEEDS": str(seed), "PARALLEL": "1",
                         "TAG_COLUMN": group, "MAX_UPDATE": str(settings.capped(0)), "MAX_TOKENS": "2000",
                         "VALIDATE_EVERY": "0", "PATIENCE": str(settings.tagging_patience),
                         "MAX_EPOCH": str(settings.tagging_max_epoch), "LR": "0.001",
                         "CHECKPOINT": "checkpoint_best.pt"},
                    budget=tagging_budget(settings), train_log=run_dir / "train.log",
                    done_when=((run_dir / "validate.log", "valid on 'valid' subset"), (run_dir / "dev.pred.conllu", ""))
                    + trained_under(run_dir / "train.log", max_epoch=settings.tagging_max_epoch,
                                    max_update=settings.capped(0), patience=settings.tagging_patience or -1),
                    kept=(Kept("validate.log", run_dir / "validate.log"),
                          Kept(f"dev.pred.{group}", run_dir / "dev.pred.conllu", tags=group))))
    return runs


def classification_budget(settings: Settings) -> str:
    return (f"{settings.capped(settings.classification_max_update):,} updates of 32 sentences (434 = 2 epochs), "
            "Adam lr 1e-3, transformer_posattn_classifier_wu2021 (1 layer, 16 heads x 16); dev every 50 updates")


def _classification(settings: Settings) -> List[Run]:
    runs = []
    for seed in settings.seeds["classification"]:
        for system in settings.systems["classification"]:
            out = settings.out / "classification" / system / f"seed{seed}"
            run_dir = out / "runs" / system / f"seed{seed}"
            runs.append(Run(
                id=f"classification/{system}/seed{seed}", task="classification", system=system, seed=seed, group="",
                out_dir=out, recipe=RECIPES["classification"], args=(settings.data["sst2"],),
                env={**_common(settings, out), "VARIANTS": system, "SEEDS": str(seed), "PARALLEL": "1",
                     "MAX_UPDATE": str(settings.capped(settings.classification_max_update)), "BATCH_SIZE": "32",
                     "VALIDATE_EVERY": "50", "LR": "1e-3"},
                budget=classification_budget(settings), train_log=run_dir / "train.log",
                done_when=((run_dir / "validate.log", "valid on 'valid' subset"),)
                + trained_under(run_dir / "train.log", max_update=settings.capped(settings.classification_max_update)),
                kept=(Kept("validate.log", run_dir / "validate.log"),)))
    return runs


def extrapolation_lengths(settings: Settings) -> List[int]:
    return [EXTRAPOLATION_TRAIN_LENGTH * m for m in settings.extrapolation_multipliers]


def extrapolation_family(system: str) -> str:
    """The recipe's family of a length-extrapolation method: ``tf`` (transformer_lm_posattn) or ``lstm``."""
    (_, family, _), = extrapolation_recipe().list_methods([system])
    return family


def extrapolation_updates(settings: Settings, system: str) -> int:
    """Updates of one length-extrapolation model: the LSTM LMs' budget or the transformers'."""
    lstm = extrapolation_family(system) == "lstm"
    return settings.capped(settings.extrapolation_lstm_max_update if lstm else settings.extrapolation_max_update)


def extrapolation_budget(settings: Settings, system: str) -> str:
    """The budget of one length-extrapolation model, the same for every model of its family."""
    lengths = ", ".join(f"{length:,}" for length in extrapolation_lengths(settings))
    if extrapolation_family(system) == "lstm":
        models = ("per model, both the same (attentive_lstm_lm, positional_attentive_lstm_lm: 1 layer x 128; after "
                  "500 updates a recurrent LM is still at the unigram level)")
    else:
        models = "per model, every method the same (transformer_lm_posattn 2 layers x 128, FFN 512, 4 heads)"
    return (f"PTB as one token stream cut into blocks of {EXTRAPOLATION_TRAIN_LENGTH} tokens; "
            f"{extrapolation_updates(settings, system):,} updates of 32 blocks {models}; tied embeddings; dropout "
            "0.1; Adam lr 1e-3, inverse sqrt, 100 warm-up updates; checkpoint_last.pt; fairseq-eval-lm over the "
            f"whole valid split at L = {lengths} tokens, non-overlapping windows and a sliding window of stride "
            f"{EXTRAPOLATION_STRIDE}")


def _extrapolation(settings: Settings) -> List[Run]:
    """examples/length_extrapolation/run.sh: one preparation (PTB binarized once, ``STEPS=prepare``), then per
    seed and method one training and its ten evaluations (``DATA_OUT``: the preparation's folder)."""
    data = settings.out / "extrapolation" / "data"
    prep = Run(
        id="extrapolation/data", task="extrapolation", system="", seed=None, group="", out_dir=data,
        recipe=RECIPES["extrapolation"], args=(),
        env={**_common(settings, data), "PTB_DIR": settings.data["ptb"], "STEPS": "prepare"},
        budget="preparation: PTB's three splits as one token stream each, fairseq-preprocess --only-source",
        done_when=tuple((data / "data-bin" / f"{split}.bin", "") for split in ("train", "valid", "test"))
        + ((data / "data-bin" / "dict.txt", ""),),
        kept=(Kept("preprocess.log", data / "logs" / "preprocess.log"),))
    runs = [prep]
    for seed in settings.seeds["extrapolation"]:
        for system in settings.systems["extrapolation"]:
            updates = extrapolation_updates(settings, system)
            budget_variable = "LSTM_MAX_UPDATE" if extrapolation_family(system) == "lstm" else "MAX_UPDATE"
            out = settings.out / "extrapolation" / system / f"seed{seed}"
            logs = out / "logs"
            train_log = logs / f"train.{system}.seed{seed}.log"
            evaluations = tuple((logs / f"eval.{system}.seed{seed}.{mode}.L{length}.log", "exit_status")
                                for mode in EXTRAPOLATION_MODES for length in extrapolation_lengths(settings))
            runs.append(Run(
                id=f"extrapolation/{system}/seed{seed}", task="extrapolation", system=system, seed=seed, group="",
                out_dir=out, recipe=RECIPES["extrapolation"], args=(),
                env={**_common(settings, out), "DATA_OUT": str(data), "STEPS": "train table", "METHODS": system,
                     "SEEDS": str(seed), "PARALLEL": "1", "L_TRAIN": str(EXTRAPOLATION_TRAIN_LENGTH),
                     "SLIDE_STRIDE": EXTRAPOLATION_STRIDE, budget_variable: str(updates),
                     "MULTIPLIERS": " ".join(map(str, settings.extrapolation_multipliers))},
                budget=extrapolation_budget(settings, system), train_log=train_log,
                done_when=evaluations + ((out / "results.json", ""),) + trained_under(train_log, max_update=updates),
                depends_on=prep.id, kept=(Kept("results.json", out / "results.json"),)))
    return runs
