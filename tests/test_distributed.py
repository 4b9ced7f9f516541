"""Data-parallel training of every model family of the plugin on two CPU processes (gloo), through
fairseq's own ``fairseq-train`` launched as a user would: ``torchrun`` (environment rendezvous) or
one command per rank (``--distributed-rank r --distributed-init-method tcp://... --distributed-no-spawn``).

For the three data-parallel ``--ddp-backend`` (``pytorch_ddp``, fairseq's default, ``no_c10d`` and
``legacy_ddp``) on a translation transformer with terms on both sides and structural positions, and
for ``pytorch_ddp`` or one of the others on a transformer LM, both LSTM LMs, the tagger and the
classifier, after three updates:

* both ranks hold the same parameters;
* rank 0 logged the same per-update training losses, and holds the same parameters, as one process
  with ``--update-freq 2`` on the same batches (fairseq gives rank r the batches r, r + 2, ... of
  the epoch's fixed order, and one process with ``--update-freq 2`` groups batches 0-1, 2-3, ...).

``--ddp-backend fully_sharded`` is refused at start-up on CPU processes."""

import os
import re
import socket
import subprocess
import sys
from typing import Callable, Dict, List

import pytest
import torch
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from cli_helpers import (BIN, add_structure_in_process, binarize_classification_in_process, binarize_in_process,
                         prepare_sample, run, run_failing)
from fairseq_posattn.data.tagging_binarize import prepare_tagging_data
from fairseq_posattn.distributed_compat import adopt_torchrun_environment
from model_helpers import REPO, USER_DIR

UPDATES = 3
WORLD_SIZE = 2
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
ADAM = ["--optimizer", "adam", "--lr", "0.001"]
TRANSLATION = [
    "--task", "translation_structural", "--arch", "transformer_posattn", "--share-all-embeddings",
    "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
    "--decoder-attention-heads", "2", "--max-source-positions", "128", "--max-target-positions", "128",
    "--encoder-direct-position", "both", "--encoder-learnable-temperature", "--encoder-distance-aware",
    "--encoder-relative-positions", "4", "--encoder-conv-attention", "1d",
    "--encoder-structural-positions", "both", "--encoder-structural-fusion", "nonlinear",
    "--decoder-direct-position", "both", "--decoder-learnable-temperature", "--decoder-distance-aware",
    "--decoder-relative-positions", "4", "--decoder-conv-attention", "2d",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "1000",
    *NO_DROPOUT, *ADAM,
]
SENTENCES = ["--sample-break-mode", "eos", "--tokens-per-sample", "64", "--batch-size", "16"]
TRANSFORMER_LM = [
    "--task", "language_modeling", "--arch", "transformer_lm_posattn", "--decoder-layers", "2",
    "--decoder-embed-dim", "32", "--decoder-input-dim", "32", "--decoder-output-dim", "32",
    "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2", "--share-decoder-input-output-embed",
    "--decoder-direct-position", "both", "--decoder-distance-aware", "--decoder-relative-positions", "4",
    "--decoder-conv-attention", "2d", "--decoder-learnable-temperature", *SENTENCES, *NO_DROPOUT, *ADAM,
]
LSTM = ["--task", "language_modeling", "--decoder-embed-dim", "32", "--decoder-hidden-size", "32",
        "--decoder-layers", "2", "--dropout", "0", *SENTENCES, *ADAM]
TAGGER = [
    "--task", "pos_tagging", "--criterion", "pos_tagging", "--arch", "san_tagger", "--position-embedding", "none",
    "--encoder-direct-position", "both", "--encoder-learnable-temperature", "--encoder-conv-attention", "2d",
    "--word-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--char-cnn-filters", "32", "--max-tokens", "500",
    "--optimizer", "rmsprop", "--lr", "0.003", *NO_DROPOUT,
]
CLASSIFIER = [
    "--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2",
    "--max-positions", "128", "--arch", "transformer_posattn_classifier", "--encoder-layers", "2",
    "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
    "--no-token-positional-embeddings", "--encoder-distance-aware", "--encoder-relative-positions", "4",
    "--encoder-direct-position", "both", "--encoder-conv-attention", "1d", "--batch-size", "16",
    "--pooler-dropout", "0", *NO_DROPOUT, *ADAM,
]
MODELS = {  # name: (data, flags)
    "translation": ("translation", TRANSLATION),
    "transformer_lm": ("lm", TRANSFORMER_LM),
    "positional_attentive_lstm_lm": ("lm", [*LSTM, "--arch", "positional_attentive_lstm_lm"]),
    "attentive_lstm_lm": ("lm", [*LSTM, "--arch", "attentive_lstm_lm"]),
    "tagger": ("tagging", TAGGER),
    "classifier": ("classification", CLASSIFIER),
}
TRAINING = [
    "--user-dir", USER_DIR, "--cpu", "--seed", "1", "--max-update", str(UPDATES),
    "--required-batch-size-multiple", "1", "--num-workers", "0", "--disable-validation",
    "--no-epoch-checkpoints", "--no-save-optimizer-state", "--log-format", "simple", "--log-interval", "1",
]
# One thread per process; torchrun sets the same for the processes it starts.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# fairseq saves checkpoints on rank 0 only. To compare the ranks' weights, every rank saves its own
# ``checkpoint_last-rank<r>.pt``; training itself is fairseq-train's, unchanged.
EVERY_RANK_SAVES = (
    "import fairseq.trainer as trainer\n"
    "from fairseq_cli.train import cli_main\n"
    "trainer.Trainer.should_save_checkpoint_on_current_rank = property(lambda self: True)\n"
    "trainer.Trainer.checkpoint_suffix = property(lambda self: f'-rank{self.data_parallel_rank}')\n"
    "cli_main()\n"
    "import sys, torch.distributed\n"  # one write: the ranks share torchrun's stdout
    "sys.stdout.write(f'process group released: {not torch.distributed.is_initialized()}\\n'); sys.stdout.flush()\n"
)
UPDATE_LOSS = re.compile(r"epoch \d+:\s+\d+ / \d+ loss=([0-9.]+),.*num_updates=(\d+)")  # train_inner


@pytest.fixture(scope="module")
def translation_data(tmp_path_factory) -> str:
    """The shipped Multi30k sample (BPE, joint dictionary) with the spaCy parse of its training
    sources as structural side data; prepared in this process (the preparation is not what this module
    checks)."""
    root = tmp_path_factory.mktemp("distributed_translation")
    prepared = prepare_sample(str(root), lines=300)
    data_bin = str(root / "data-bin")
    binarize_in_process(prepared, data_bin)
    add_structure_in_process(prepared, data_bin, ["train"])
    return data_bin


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory) -> str:
    """The shipped PTB sample."""
    data_bin = str(tmp_path_factory.mktemp("distributed_lm") / "data-bin")
    run("fairseq-preprocess", ["--only-source", "--task", "language_modeling", "--workers", "1",
                               "--trainpref", os.path.join(REPO, "data", "ptb_sample", "train.txt"),
                               "--destdir", data_bin])
    return data_bin


@pytest.fixture(scope="module")
def tagging_data(tmp_path_factory) -> str:
    """The shipped UD English-EWT sample, prepared in this process (what posattn-prepare-tagging runs)."""
    data_bin = str(tmp_path_factory.mktemp("distributed_tagging") / "data-bin")
    ewt = os.path.join(REPO, "data", "ud_ewt_sample")
    prepare_tagging_data({"train": [os.path.join(ewt, "en_ewt-ud-train.sample.conllu")],
                          "valid": [os.path.join(ewt, "en_ewt-ud-dev.sample.conllu")]}, data_bin)
    return data_bin


@pytest.fixture(scope="module")
def classification_data(tmp_path_factory) -> str:
    """The shipped SST-2 sample, as fairseq's sentence_prediction task reads it (binarized in this process)."""
    return binarize_classification_in_process({"train": os.path.join(REPO, "data", "sst2_sample", "stsa.binary.train")},
                                              str(tmp_path_factory.mktemp("distributed_classification")))


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Callable[[str, str], dict]:
    """Per model, run once: one ``fairseq-train`` process with ``--update-freq 2``."""
    runs = {}

    def train(model: str, data: str) -> dict:
        if model not in runs:
            save_dir = str(tmp_path_factory.mktemp(f"{model}_one_process"))
            log = run("fairseq-train", [data, *MODELS[model][1], *TRAINING, "--update-freq", str(WORLD_SIZE),
                                        "--save-dir", save_dir], env=ENV)
            runs[model] = {"log": log.stdout + log.stderr,
                           "checkpoint": _load(os.path.join(save_dir, "checkpoint_last.pt"))}
        return runs[model]

    return train


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load(path: str) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _gloo(ddp_backend: str, save_dir: str) -> List[str]:
    return ["--distributed-backend", "gloo", "--ddp-backend", ddp_backend, "--save-dir", save_dir]


def launch_with_torchrun(args: List[str]) -> str:
    """``torchrun --nproc_per_node 2 ... fairseq-train ...``: rendezvous from the environment."""
    command = [os.path.join(BIN, "torchrun"), "--nproc_per_node", str(WORLD_SIZE), "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), "--no-python", sys.executable, "-c", EVERY_RANK_SAVES, *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=ENV, timeout=600)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result.stdout + result.stderr


def launch_per_rank(args: List[str]) -> str:
    """One command per rank, as on several nodes without a launcher (a TCP rendezvous on rank 0)."""
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen(
        [sys.executable, "-c", EVERY_RANK_SAVES, *args, "--distributed-world-size", str(WORLD_SIZE),
         "--distributed-rank", str(rank), "--distributed-init-method", init, "--distributed-no-spawn"],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(WORLD_SIZE)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(out[-4000:] for out in outputs)
    return "\n".join(outputs)


LAUNCHERS = {"torchrun": launch_with_torchrun, "per_rank": launch_per_rank}


def update_losses(log: str) -> Dict[int, float]:
    """The training loss fairseq logs (on rank 0) for each update."""
    losses = {int(update): float(loss) for loss, update in UPDATE_LOSS.findall(log)}
    assert sorted(losses) == list(range(1, UPDATES + 1)), log[-3000:]
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("model,ddp_backend,launcher", [
    ("translation", "pytorch_ddp", "torchrun"),
    ("translation", "no_c10d", "per_rank"),
    ("translation", "legacy_ddp", "per_rank"),
    ("transformer_lm", "pytorch_ddp", "torchrun"),
    ("positional_attentive_lstm_lm", "pytorch_ddp", "per_rank"),
    ("attentive_lstm_lm", "legacy_ddp", "torchrun"),
    ("tagger", "pytorch_ddp", "torchrun"),
    ("classifier", "pytorch_ddp", "per_rank"),
])
def test_two_processes_train_as_one_with_update_freq_2(model, ddp_backend, launcher, request, one_process, tmp_path):
    data = request.getfixturevalue(f"{MODELS[model][0]}_data")
    save_dir = str(tmp_path)
    log = LAUNCHERS[launcher]([data, *MODELS[model][1], *TRAINING, *_gloo(ddp_backend, save_dir)])
    assert log.count("process group released: True") == WORLD_SIZE  # gloo's threads do not outlive main
    ranks = [_load(os.path.join(save_dir, f"checkpoint_last-rank{rank}.pt")) for rank in range(WORLD_SIZE)]
    for checkpoint in ranks:
        assert checkpoint["optimizer_history"][-1]["num_updates"] == UPDATES
        assert checkpoint["cfg"]["distributed_training"]["distributed_world_size"] == WORLD_SIZE
    assert ranks[0]["model"].keys() == ranks[1]["model"].keys()
    for name, weight in ranks[0]["model"].items():
        assert torch.equal(weight, ranks[1]["model"][name]), f"{name} differs between the ranks"

    reference = one_process(model, data)
    assert update_losses(log) == pytest.approx(update_losses(reference["log"]), abs=1.5e-3)
    trained = reference["checkpoint"]["model"]
    assert trained.keys() == ranks[0]["model"].keys()
    for name, weight in trained.items():
        torch.testing.assert_close(ranks[0]["model"][name], weight, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_fully_sharded_is_refused_at_start_up_on_cpu(lm_data, tmp_path):
    result = run_failing("fairseq-train", [lm_data, *MODELS["attentive_lstm_lm"][1], *TRAINING,
                                           "--ddp-backend", "fully_sharded", "--save-dir", str(tmp_path)])
    assert "--ddp-backend fully_sharded (fairscale's FullyShardedDataParallel) runs on CUDA GPUs only" in result.stderr
    assert "pytorch_ddp" in result.stderr
    assert not os.listdir(tmp_path), "refused before anything was written"


def _distributed_config(args: List[str]):
    """``cfg.distributed_training`` as fairseq-train builds it from its command line."""
    parser = options.get_training_parser()
    parsed = options.parse_args_and_arch(parser, ["data", "--arch", "transformer_lm", "--task", "language_modeling",
                                                  "--cpu", *args])
    return convert_namespace_to_omegaconf(parsed).distributed_training


def test_torchrun_world_size_and_rank_are_adopted_without_gpus(monkeypatch):
    """What torchrun exports reaches fairseq's config, also where --distributed-world-size
    defaults to 1 (no GPU); a rendezvous given on the command line is left alone."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # as on this CPU machine, also on a GPU one
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "4", "RANK": "3"}.items():
        monkeypatch.setenv(name, value)
    cfg = _distributed_config(["--distributed-world-size", "1"])
    adopt_torchrun_environment(cfg)
    assert (cfg.distributed_world_size, cfg.distributed_rank) == (4, 3)
    assert (cfg.distributed_init_method, cfg.distributed_no_spawn, cfg.device_id) == ("env://", True, 0)
    given = _distributed_config(["--distributed-world-size", "2", "--distributed-init-method", "tcp://127.0.0.1:1"])
    adopt_torchrun_environment(given)
    assert (given.distributed_world_size, given.distributed_rank) == (2, 0)
