"""The numeric train.* settings against their ranges (kotune/training/ranges.py): a value out of range is
one line naming the key and what fits, before a job reads or builds anything (it was "a bug" from
deep inside Trainer, or 0 steps trained and ``status ok``); the values at the edges of each range
still compose and pass. Every key of the table has a bad value here, so the table and the test
cannot drift apart."""
from __future__ import annotations

import json

import pytest

from conftest import compose, run_cli_here

# key → values out of its range (each refused naming the key), values at the edges (accepted)
CASES: dict[str, tuple[list, list]] = {
    "learning_rate": (["-1", "0", "nan", "inf"], ["1e-9"]),
    "mix_learning_rate": (["0", "-0.001"], ["1e-3"]),
    "layer_lr_decay": (["0", "1.5", "nan"], ["1.0", "0.01"]),
    "max_steps": (["-5", "0", "-2", "2.5"], ["-1", "1", "null"]),
    "epochs": (["-1", "nan"], ["0.5", "1"]),
    "batch_size": (["0", "-3", "2.5"], ["1"]),
    "batch_tokens": (["0", "1", "-5", "2.5"], ["null", "4096"]),
    "eval_batch_size": (["0"], ["1"]),
    "grad_accum": (["0", "-1"], ["1"]),
    "warmup_ratio": (["-0.1", "1", "1.5"], ["0", "0.99"]),
    "weight_decay": (["-0.01", "nan"], ["0"]),
    "max_length": (["0", "1", "-128"], ["2"]),
    "calibrate_fraction": (["0", "1", "-0.5"], ["0.5", "null"]),
    "head_dropout": (["-0.1", "1"], ["null", "0", "0.5"]),
    "seed": (["-1", "4294967296"], ["0", "4294967295"]),
    "evals_per_epoch": (["0"], ["1"]),
    "early_stopping_patience": (["0"], ["null", "1"]),
    "early_stopping_threshold": (["-0.5", "nan"], ["0"]),
    "save_steps": (["0"], ["1"]),
    "save_total_limit": (["0"], ["null", "1"]),
    "logging_steps": (["0"], ["1"]),
    "pad_to_multiple_of": (["0"], ["auto", "1"]),
    "dataloader_num_workers": (["-1"], ["auto", "0"]),
}
BAD = [(key, value) for key, (bad, _) in CASES.items() for value in bad]
GOOD = [(key, value) for key, (_, good) in CASES.items() for value in good]
BASE = ["task=text_cls", "model=tiny", "data=sample"]


def test_every_key_of_the_table_is_tested():
    from kotune.training.ranges import TRAIN_RANGES

    assert set(CASES) == set(TRAIN_RANGES)
    assert set(TRAIN_RANGES) <= set(compose(BASE).train)  # no key of the table is misspelt


@pytest.mark.parametrize("key,value", BAD)
def test_a_value_out_of_range_is_one_line_naming_the_key_and_its_range(key, value):
    from kotune.core.errors import ConfigError
    from kotune.training.ranges import TRAIN_RANGES, check_train

    cfg = compose([*BASE, f"train.{key}={value}"])
    with pytest.raises(ConfigError) as e:
        check_train(cfg)
    message = str(e.value)
    assert message.startswith(f"train.{key}=") and TRAIN_RANGES[key][1] in message and "\n" not in message


@pytest.mark.parametrize("key,value", GOOD)
def test_a_value_at_the_edge_of_its_range_passes(key, value):
    from kotune.training.ranges import check_train

    extra = ["train.max_steps=2"] if key == "epochs" else []
    check_train(compose([*BASE, f"train.{key}={value}", *extra]))


def test_no_epochs_and_no_steps_is_refused_and_steps_alone_train():
    from kotune.core.errors import ConfigError
    from kotune.training.ranges import check_train

    with pytest.raises(ConfigError, match=r"train.epochs=0 with train.max_steps=-1: nothing would train"):
        check_train(compose([*BASE, "train.epochs=0"]))
    check_train(compose([*BASE, "train.epochs=0", "train.max_steps=3"]))


@pytest.mark.parametrize("overrides,line", [
    (["train.learning_rate=-1"], "error: train.learning_rate=-1: a finite number > 0 expected"),
    (["train.learning_rate=nan"], "error: train.learning_rate=nan: a finite number > 0 expected"),
    (["train.batch_size=0"], "error: train.batch_size=0: a whole number >= 1 expected"),
    (["train.epochs=0", "train.max_steps=-5"], "error: train.max_steps=-5: -1 (train.epochs counts) or a whole number > 0"),
])
def test_the_command_line_refuses_before_anything_is_built(overrides, line, tmp_path, cache_dir):
    run = tmp_path / "run"
    done = run_cli_here([*BASE, *overrides, f"cache_dir={cache_dir}", f"hydra.run.dir={run}"])
    errors = [x for x in done.stderr.splitlines() if x.strip()]
    assert done.returncode == 1 and errors == [errors[0]] and errors[0].startswith(line), done.stderr[-2000:]
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "failed" and results["error_type"] == "ConfigError"
    assert "encoding" not in done.stdout and not (run / "model").exists()  # nothing read, nothing built


def test_the_api_raises_the_same_line(tmp_path):
    import kotune
    from kotune.api.compose import RunFailed

    with pytest.raises(RunFailed, match=r"^train.batch_size=0: a whole number >= 1 expected$"):
        kotune.train(*BASE, "train.batch_size=0", run_dir=tmp_path / "run")
