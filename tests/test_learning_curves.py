"""posattn-learning-curves (issue 5): validation points read from real fairseq-train logs in both log
formats, grouping of seeds, the best/final table, the PNG and JSON it writes, and errors naming the log.

The two logs under ``tests/data/`` were captured from one fairseq-train run on the shipped SST-2 sample
(DA-Transformer classifier, seed 1, 40 updates, validation every 10 updates and at each epoch's end),
once with ``--log-format simple`` and once with ``--log-format json`` (see ``tests/data/README.md``):
the same deterministic CPU run, so both must give the same points."""

import json
import os

import pytest
from matplotlib import image

from fairseq_posattn.cli import learning_curves as cli
from fairseq_posattn.inspect.learning_curves import (
    LogError,
    lower_is_better,
    read_curve,
    read_groups,
    read_validations,
    summary_table,
    training_seconds,
)

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SIMPLE = os.path.join(DATA, "sst2_sample_da_train_simple.log")
JSON = os.path.join(DATA, "sst2_sample_da_train_json.log")
# the dev accuracy of every validation in those logs, by update (19 and 38: the end of epochs 1 and 2)
ACCURACY = [(10.0, 60.0), (19.0, 51.0), (20.0, 53.5), (30.0, 71.0), (38.0, 69.0), (40.0, 70.5)]
LOSS = [(10.0, 0.947), (19.0, 1.052), (20.0, 1.006), (30.0, 0.846), (38.0, 0.893), (40.0, 0.873)]


@pytest.mark.parametrize("path", [SIMPLE, JSON], ids=["simple", "json"])
def test_both_log_formats_give_the_runs_points(path):
    assert read_curve(path).points == ACCURACY
    assert read_curve(path, metric="loss").points == LOSS
    by_epoch = read_curve(path, x="epoch").points  # several validations per epoch: the epoch's last one
    assert by_epoch == [(1.0, 51.0), (2.0, 69.0), (3.0, 70.5)]
    first = next(read_validations(path))
    assert {"loss", "nll_loss", "accuracy", "num_updates", "epoch"} <= set(first)


def test_best_final_and_table():
    curve = read_curve(SIMPLE)
    assert curve.best(lower_is_better=False) == (30.0, 71.0)
    assert curve.final == 70.5
    assert lower_is_better("loss") and lower_is_better("ppl") and not lower_is_better("accuracy")
    groups = read_groups([("DA", SIMPLE), ("DA", JSON), ("DA again", SIMPLE)])
    assert [(g.label, len(g.curves)) for g in groups] == [("DA", 2), ("DA again", 1)]
    mean = groups[0].aggregate()
    assert [(r["x"], r["n"], r["mean"], r["sd"]) for r in mean] == [(x, 2, y, 0.0) for x, y in ACCURACY]
    table = summary_table(groups, "accuracy", lower=False)
    assert "| DA | 2 | 71.00 ± 0.00 | 70.50 ± 0.00 | 30 ± 0 |" in table
    assert (training_seconds(SIMPLE), training_seconds(JSON)) == (7.2, 5.2)  # "done training in N seconds"


def test_errors_name_the_log(tmp_path):
    with pytest.raises(LogError, match=r"sst2_sample_da_train_simple\.log: no 'valid' validation line has both "
                                       r"'bleu' and 'num_updates'; its validation metrics are: accuracy, "):
        read_curve(SIMPLE, metric="bleu")
    empty = tmp_path / "preprocess.log"
    empty.write_text("INFO | fairseq_cli.preprocess | Wrote preprocessed data\n", encoding="utf-8")
    with pytest.raises(LogError, match=r"preprocess\.log: no validation line for subset 'valid'"):
        read_curve(str(empty))
    with pytest.raises(LogError, match=r"missing\.log: cannot read the log"):
        read_curve(str(tmp_path / "missing.log"))


def test_command_writes_png_json_and_table(tmp_path, capsys):
    output = tmp_path / "curves" / "sst2.png"
    table = tmp_path / "results.md"
    cli.main(["--run", f"DA={SIMPLE}", "--run", f"DA={JSON}", "--run", f"one run={SIMPLE}",
              "--output", str(output), "--table", str(table), "--band", "sd"])
    printed = capsys.readouterr().out
    assert printed == table.read_text(encoding="utf-8")
    with open(output, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert output.stat().st_size > 10_000
    pixels = image.imread(str(output))  # decodes the whole file
    assert pixels.shape[:2] == (420, 640) and pixels.std() > 0.05
    points = json.loads((tmp_path / "curves" / "sst2.json").read_text(encoding="utf-8"))
    assert [g["label"] for g in points["groups"]] == ["DA", "one run"]
    assert [tuple(p) for p in points["groups"][0]["runs"][1]["points"]] == ACCURACY


def test_command_errors(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"posattn-learning-curves: error: .*simple\.log: no 'valid' validation "
                                         r"line has both 'oov_accuracy'"):
        cli.main(["--run", f"DA={SIMPLE}", "--metric", "oov_accuracy", "--output", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(SystemExit):
        cli.main(["--run", SIMPLE])  # no LABEL=
    assert "expected LABEL=PATH" in capsys.readouterr().err
