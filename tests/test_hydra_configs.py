"""The fairseq-hydra-train configs shipped in fairseq_posattn/configs/ (docs/hydra_configs.md).

Every config checks (registered names, known keys, valid values) and is documented; a typo is caught
with the option it meant. Every config gives exactly the training of its recipe's fairseq-train command
line (from the recipe's --dry-run): every option of every section, and the same model from the same
seed. Real fairseq-hydra-train runs on the shipped samples train the quickstart's two models (to the
same weights as the quickstart's own command line), a transformer and an LSTM language model, and the
tagger."""

import argparse
import glob
import os
import shlex
import subprocess
import sys
from typing import Dict, List, Optional

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.initialize import add_defaults, hydra_init
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from cli_helpers import add_structure_in_process, binarize_in_process, prepare_sample, run
from fairseq_posattn.data.tagging_binarize import prepare_tagging_data
from fairseq_posattn.configs import (ConfigCheckError, check_config, config_dir, plugin_dir, registered_names,
                                     shipped_configs)
from model_helpers import REPO, USER_DIR

CONFIGS = shipped_configs()
COMPARED_SECTIONS = ("task", "criterion", "optimizer", "lr_scheduler", "optimization", "dataset", "checkpoint",
                     "common")
#: what the recipes set per run or per machine, and the configs leave to the command line
PER_RUN = {"data", "save_dir", "user_dir", "cpu"}


def config_name(path: str) -> str:
    """``family/name`` of a shipped config."""
    return os.path.relpath(path, config_dir())[:-len(".yaml")]


def shipped(name: str) -> str:
    return os.path.join(config_dir(), f"{name}.yaml")


# ---------------------------------------------------------------------------------------- checks --
@pytest.mark.parametrize("path", CONFIGS, ids=config_name)
def test_shipped_config_checks(path):
    check_config(path)
    cfg = OmegaConf.load(path)
    for section in ("task", "model", "criterion", "optimizer", "lr_scheduler"):
        assert cfg[section]["_name"] in registered_names(section), section
    # the data and the plugin's path come from the command line; hydra stays in the working directory
    assert OmegaConf.is_missing(cfg.task, "data") and OmegaConf.is_missing(cfg.common, "user_dir")
    assert cfg.hydra.run.dir == "."


def test_every_family_has_configs_and_every_config_is_documented():
    families = {name.split("/")[0] for name in map(config_name, CONFIGS)}
    assert families == {"quickstart", "multi30k_en_de", "wmt14_en_de", "nist_zh_en", "language_model",
                        "pos_tagging", "sentence_classification"}
    with open(os.path.join(REPO, "docs", "hydra_configs.md"), encoding="utf-8") as f:
        docs = f.read()
    for path in CONFIGS:
        assert f"`{config_name(path)}`" in docs, config_name(path)


@pytest.mark.parametrize("name, old, new, message", [
    ("quickstart/structural", "encoder_structural_fusion:", "encoder_structural_fusio:",
     "model.encoder_structural_fusio is not an option of this model (did you mean encoder_structural_fusion"),
    ("quickstart/structural", "encoder_structural_positions: both", "encoder_structural_positions: bothh",
     "model.encoder_structural_positions: 'bothh' is not one of ['absolute', 'both', 'none', 'relative']"),
    ("quickstart/baseline", "share_all_embeddings: true", "share_all_embeddings: 3",
     "model.share_all_embeddings: a flag takes true or false, got 3"),
    ("quickstart/baseline", "_name: transformer_posattn", "_name: transformer_posatn",
     "model._name 'transformer_posatn' is not registered (did you mean transformer_posattn"),
    ("language_model/ptb_tf_da", "decoder_distance_aware:", "decoder_distance_awar:",
     "model.decoder_distance_awar is not an option of this model (did you mean decoder_distance_aware"),
    ("pos_tagging/ud_p_r", "position_embedding: none", "position_embedding: nope",
     "model.position_embedding: 'nope' is not one of ['add', 'concat', 'none']"),
    ("quickstart/baseline", "weight_decay:", "weight_decy:", "optimizer.weight_decy is not an option"),
    ("quickstart/baseline", "max_update: 600", "max_update: lots", "optimization.max_update: Value 'lots'"),
    ("quickstart/baseline", "checkpoint:", "chekpoint:", "unknown section 'chekpoint' (did you mean checkpoint"),
])
def test_check_names_the_wrong_key_or_value(tmp_path, name, old, new, message):
    with open(shipped(name), encoding="utf-8") as f:
        text = f.read()
    assert old in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ConfigCheckError) as error:
        check_config(str(bad))
    assert message in str(error.value) and str(bad) in str(error.value)


# ------------------------------------------------------------ every config is its recipe --
def dry_run_trainings(script: str, env: Dict[str, str], tmp_path,
                      arguments: Optional[List[str]] = None) -> Dict[str, List[str]]:
    """The fairseq-train command lines a recipe's --dry-run prints (on a CPU), by their --save-dir;
    ``arguments`` after --dry-run (default: a raw-data folder)."""
    out = tmp_path / "out"
    full_env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
                    GPUS="0", OUT=str(out), **env)
    arguments = [str(tmp_path / "raw")] if arguments is None else arguments
    printed = subprocess.run(["bash", os.path.join(REPO, script), "--dry-run", *arguments],
                             capture_output=True, text=True, env=full_env, cwd=REPO, check=True).stdout
    assert not out.exists(), "--dry-run wrote to the output folder"
    commands = [shlex.split(line[2:])[1:] for line in printed.splitlines() if line.startswith("+ fairseq-train ")]
    return {argv[argv.index("--save-dir") + 1]: argv for argv in commands}


def without_run_options(argv: List[str]) -> List[str]:
    """A recipe's fairseq-train arguments without the data, --user-dir, --save-dir and --cpu."""
    out, rest = [], argv[1:]
    while rest:
        if rest[0] in ("--user-dir", "--save-dir"):
            rest = rest[2:]
        elif rest[0] == "--cpu":
            rest = rest[1:]
        else:
            out, rest = out + [rest[0]], rest[1:]
    return out


def compose_like_hydra_train(path: str, overrides: List[str]) -> DictConfig:
    """The config fairseq-hydra-train hands fairseq-train's main(): composed on fairseq's schema of the
    same name, with the registered components' defaults, resolved."""
    name = os.path.basename(path)[:-len(".yaml")]
    GlobalHydra.instance().clear()
    hydra_init(name)
    with initialize_config_dir(config_dir=os.path.dirname(path), version_base="1.1"):
        cfg = compose(config_name=name, overrides=overrides)
    add_defaults(cfg)
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))


def fairseq_train_config(argv: List[str]) -> DictConfig:
    """The config fairseq-train builds from a command line."""
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    return convert_namespace_to_omegaconf(args)


def initial_weights(cfg: DictConfig) -> Dict[str, torch.Tensor]:
    """The model fairseq-train would build from ``cfg``, from seed 1."""
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(1)
    return task.build_model(cfg.model).state_dict()


def dictionaries(root, *langs: Optional[str]) -> str:
    """A data directory with just the dictionaries (enough to build the task and the model);
    a language of None writes the one dict.txt of a monolingual task."""
    root.mkdir(parents=True, exist_ok=True)
    for lang in langs:
        name = f"dict.{lang}.txt" if lang else "dict.txt"
        (root / name).write_text("".join(f"w{i} {100 - i}\n" for i in range(40)), encoding="utf-8")
    return str(root)


def assert_same_training(argv: List[str], config: str, data: str) -> None:
    expected = fairseq_train_config([data, "--user-dir", USER_DIR, *without_run_options(argv)])
    actual = compose_like_hydra_train(config, [f"task.data={data}", f"common.user_dir={USER_DIR}"])
    for section in COMPARED_SECTIONS:
        if isinstance(expected[section], argparse.Namespace):  # an argparse-registered component
            assert actual[section]._name == expected[section]._name
            continue
        for key, value in expected[section].items():
            if key not in PER_RUN:
                assert actual[section][key] == value, f"{config_name(config)}: {section}.{key}"
    expected_weights, actual_weights = initial_weights(expected), initial_weights(actual)
    assert list(actual_weights) == list(expected_weights)
    for key, weight in expected_weights.items():
        assert torch.equal(actual_weights[key], weight), key


@pytest.fixture(scope="module")
def task_data(tmp_path_factory):
    """A directory for each task with what setup_task and build_model read (dictionaries, vocabularies)."""
    root = tmp_path_factory.mktemp("task_data")
    ewt = os.path.join(REPO, "data", "ud_ewt_sample")
    tagging = str(root / "pos_tagging")
    prepare_tagging_data({"train": [f"{ewt}/en_ewt-ud-train.sample.conllu"]}, tagging)
    label = root / "sentence_prediction" / "label"
    label.mkdir(parents=True)
    (label / "dict.txt").write_text("0 10\n1 10\n", encoding="utf-8")
    return {"translation_structural": dictionaries(root / "translation", "en", "de"),
            "language_modeling": dictionaries(root / "language_modeling", None),
            "sentence_prediction": os.path.dirname(dictionaries(root / "sentence_prediction" / "input0", None)),
            "pos_tagging": tagging}


def table1_config(pattern: str):
    """The config of a translation recipe's Table 1 row, from its save dir checkpoints/rowN."""
    def config_of(save_dir: str) -> str:
        found = glob.glob(os.path.join(config_dir(), pattern.format(row=os.path.basename(save_dir)) + ".yaml"))
        assert len(found) == 1, f"{save_dir}: {found}"
        return config_name(found[0])
    return config_of


def variant_config(family: str, prefix: str):
    """The config of a run saved in runs/VARIANT/seedN/checkpoints (tagging, classification)."""
    return lambda save_dir: f"{family}/{prefix}{save_dir.split(os.sep)[-3]}"


EWT_SAMPLE = os.path.join(REPO, "data", "ud_ewt_sample")
#: recipe: (script, environment, arguments after --dry-run, config of a save dir, the configs it covers)
RECIPES = {
    "quickstart": ("examples/quickstart/run.sh", {}, None,
                   lambda save_dir: f"quickstart/{os.path.basename(save_dir).removeprefix('checkpoints-')}",
                   "quickstart/*"),
    "multi30k_small": ("examples/multi30k_en_de/run.sh", {"PRESET": "small"}, None,
                       table1_config("multi30k_en_de/small_{row}_*"), "multi30k_en_de/small_*"),
    "multi30k_paper": ("examples/multi30k_en_de/run.sh", {"PRESET": "paper"}, None,
                       table1_config("multi30k_en_de/paper_{row}_*"), "multi30k_en_de/paper_*"),
    "wmt14_en_de": ("examples/wmt14_en_de/run.sh", {}, None, table1_config("wmt14_en_de/{row}_*"), "wmt14_en_de/*"),
    "nist_zh_en": ("examples/nist_zh_en/run.sh", {}, None, table1_config("nist_zh_en/{row}_*"), "nist_zh_en/*"),
    "language_model": ("examples/language_model/run_ptb.sh", {}, [],
                       lambda save_dir: f"language_model/ptb_{os.path.basename(save_dir)}", "language_model/*"),
    "pos_tagging": ("examples/pos_tagging/run.sh", {"SEEDS": "1"},
                    [f"{EWT_SAMPLE}/en_ewt-ud-train.sample.conllu", f"{EWT_SAMPLE}/en_ewt-ud-dev.sample.conllu"],
                    variant_config("pos_tagging", "ud_"), "pos_tagging/*"),
    "sentence_classification": ("examples/sentence_classification/run.sh", {"SEEDS": "1"},
                                [os.path.join(REPO, "data", "sst2_sample")],
                                variant_config("sentence_classification", "sst2_"), "sentence_classification/*"),
}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_configs_train_what_their_recipe_trains(recipe, tmp_path, task_data):
    """Each config is its recipe's default training (seed 1): the same options in every compared
    section, and the same initial model; every training of the recipe has its config, and the reverse."""
    script, env, arguments, config_of, covered = RECIPES[recipe]
    trainings = dry_run_trainings(script, env, tmp_path, arguments)
    names = {save_dir: config_of(save_dir) for save_dir in trainings}
    shipped_names = {config_name(path) for path in glob.glob(os.path.join(config_dir(), covered + ".yaml"))}
    assert sorted(names.values()) == sorted(shipped_names), "a training of the recipe without a config, or the reverse"
    for save_dir, name in names.items():
        task = OmegaConf.load(shipped(name)).task._name
        if task == "translation_structural":
            data = dictionaries(tmp_path / "data", *(("zh", "en") if recipe == "nist_zh_en" else ("en", "de")))
        else:
            data = task_data[task]
        assert_same_training(trainings[save_dir], shipped(name), data)


@pytest.mark.slow
def test_config_dir_cli(tmp_path):
    """``python -m fairseq_posattn.configs``: the paths the documented commands use, and --check."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(shipped("quickstart/baseline")).read().replace("dropout:", "dropuot:"), encoding="utf-8")
    listed = subprocess.run([sys.executable, "-m", "fairseq_posattn.configs", "--list"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    assert len(listed) == len(CONFIGS) and listed[0].split(":")[0] == config_name(CONFIGS[0])
    checked = subprocess.run([sys.executable, "-m", "fairseq_posattn.configs", "--check", str(bad),
                              shipped("quickstart/baseline")], capture_output=True, text=True)
    assert checked.returncode == 1
    assert "model.dropuot is not an option of this model (did you mean dropout" in checked.stderr
    assert "1 of 2 configs OK" in checked.stderr
    assert os.path.isdir(os.path.join(config_dir(), "quickstart")) and plugin_dir() == USER_DIR


# ------------------------------------------------------------- real fairseq-hydra-train runs --
SINGLE_THREAD = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
#: fairseq's transformer sets it in the namespace it builds from (argparse: the saved options) when
#: --share-all-embeddings is on; the weights comparison covers it
DERIVED_BY_FAIRSEQ = "share_decoder_input_output_embed"


def hydra_train(name: str, overrides: List[str], cwd: str) -> str:
    """Run fairseq-hydra-train with a shipped config; its log."""
    family, config = name.split("/")
    result = run("fairseq-hydra-train", ["--config-dir", os.path.join(config_dir(), family),
                                         "--config-name", config, f"common.user_dir={USER_DIR}",
                                         "common.cpu=true", *overrides], cwd=cwd, env=SINGLE_THREAD)
    log = result.stdout + result.stderr
    assert "done training" in log
    return log


def load(path: str) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def structural_bin(tmp_path_factory) -> str:
    """120 lines of the Multi30k sample: BPE, binarized, parsed by spaCy, structural side data."""
    root = str(tmp_path_factory.mktemp("quickstart"))
    prepared = prepare_sample(root, lines=120)
    data_bin = os.path.join(root, "data-bin")
    binarize_in_process(prepared, data_bin)
    add_structure_in_process(prepared, data_bin, ["train", "valid"])
    return data_bin


@pytest.mark.slow
@pytest.mark.parametrize("name", ["baseline", "structural"])
def test_hydra_quickstart_trains_the_weights_of_the_quickstart_command_line(structural_bin, tmp_path, name):
    """Two updates each way from seed 1 on one thread: the same options, the very same weights."""
    argv = next(argv for save_dir, argv in dry_run_trainings("examples/quickstart/run.sh", {}, tmp_path).items()
                if os.path.basename(save_dir) == f"checkpoints-{name}")
    argparse_dir, hydra_dir = str(tmp_path / "argparse"), str(tmp_path / "hydra")
    run("fairseq-train", [structural_bin, "--user-dir", USER_DIR, *without_run_options(argv), "--cpu",
                          "--max-update", "2", "--save-dir", argparse_dir], env=SINGLE_THREAD)
    hydra_train(f"quickstart/{name}", [f"task.data={structural_bin}", f"checkpoint.save_dir={hydra_dir}",
                                       "optimization.max_update=2"], cwd=str(tmp_path))
    expected, actual = (load(os.path.join(d, "checkpoint_last.pt")) for d in (argparse_dir, hydra_dir))
    for key, value in actual["cfg"]["model"].items():
        if key != DERIVED_BY_FAIRSEQ:
            assert value == getattr(expected["cfg"]["model"], key), f"model.{key}"
    assert actual["cfg"]["model"]["encoder_structural_positions"] == ("both" if name == "structural" else "none")
    assert actual["optimizer_history"][-1]["num_updates"] == expected["optimizer_history"][-1]["num_updates"] == 2
    assert list(actual["model"]) == list(expected["model"])
    for key, weight in expected["model"].items():
        assert torch.equal(actual["model"][key], weight), key


@pytest.fixture(scope="module")
def ptb_bin(tmp_path_factory) -> str:
    ptb, destdir = os.path.join(REPO, "data", "ptb_sample"), str(tmp_path_factory.mktemp("ptb") / "data-bin")
    run("fairseq-preprocess", ["--only-source", "--task", "language_modeling", "--workers", "1",
                               "--trainpref", f"{ptb}/train.txt", "--validpref", f"{ptb}/valid.txt",
                               "--destdir", destdir])
    return destdir


@pytest.mark.slow
@pytest.mark.parametrize("name, expected, parameter", [
    # a model with a dataclass (the block comes from the task) and an argparse-registered one (the block
    # length N of the positional attention is the model's own, so it stays in the checkpoint)
    ("language_model/ptb_tf_da", {"decoder_distance_aware": True, "tokens_per_sample": 35,
                                  "max_target_positions": 128}, ".self_attn.scaling_term."),
    ("language_model/ptb_positional_attentive_lstm_lm", {"tokens_per_sample": 35, "max_target_positions": 128,
                                                         "decoder_hidden_size": 128}, ".position_generator."),
])
def test_hydra_trains_a_language_model(ptb_bin, tmp_path, name, expected, parameter):
    hydra_train(name, [f"task.data={ptb_bin}", f"checkpoint.save_dir={tmp_path}", "optimization.max_update=3"],
                cwd=str(tmp_path))
    checkpoint = load(str(tmp_path / "checkpoint_last.pt"))
    model_cfg = checkpoint["cfg"]["model"]
    assert {key: model_cfg[key] for key in expected} == expected
    assert checkpoint["optimizer_history"][-1]["num_updates"] == 3
    assert any(parameter in key for key in checkpoint["model"]), sorted(checkpoint["model"])[:20]


@pytest.mark.slow
def test_hydra_trains_and_validates_the_tagger(tmp_path):
    ewt = os.path.join(REPO, "data", "ud_ewt_sample")
    data = str(tmp_path / "data-bin")
    run("posattn-prepare-tagging", ["--train", f"{ewt}/en_ewt-ud-train.sample.conllu",
                                    "--valid", f"{ewt}/en_ewt-ud-dev.sample.conllu", "--destdir", data])
    log = hydra_train("pos_tagging/ud_p_r", [
        f"task.data={data}", f"checkpoint.save_dir={tmp_path / 'checkpoints'}", "optimization.max_update=4",
        "dataset.validate_interval_updates=2", "checkpoint.save_interval_updates=2",
        "+model.encoder_layers=1", "+model.word_embed_dim=32"], cwd=str(tmp_path))
    validations = [line for line in log.splitlines() if "valid on 'valid' subset" in line]
    assert len(validations) >= 2 and all("| accuracy " in line and "| oov_accuracy " in line for line in validations)
    model_cfg = load(str(tmp_path / "checkpoints" / "checkpoint_last.pt"))["cfg"]["model"]
    assert (model_cfg["position_embedding"], model_cfg["encoder_direct_position"], model_cfg["encoder_layers"]) == (
        "none", "both", 1)
