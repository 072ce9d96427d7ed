"""Every run directory kotune writes loads by its path, as the command line and the Python API
take it: a fold's (``…/fold=0``) and a sweep job's (``…/0_lr=0.000343,bs=16``) have ``=`` and ``,``
in their names, which Hydra's override grammar reads as syntax (kotune/cli/overrides.py quote_paths);
quoted or escaped as Hydra writes them, the checkpoint still lends its task (kotune/loading/checkpoint.py)."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import run_cli_here

NAMES = ["fold=0", "0_lr=0.000343,bs=16", "seed=1 a(b)[c]"]


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory, cache_dir):
    """One tiny text_cls run, copied under the names kotune's folds and sweeps give their jobs."""
    import os

    import kotune

    old = os.environ.get("KOTUNE_CACHE")
    os.environ["KOTUNE_CACHE"] = cache_dir
    try:
        root = tmp_path_factory.mktemp("named")
        run = kotune.train("task=text_cls", "model=tiny", "data=sample", "train.max_steps=2", run_dir=root / "run")
    finally:
        if old is None:
            os.environ.pop("KOTUNE_CACHE", None)
        else:
            os.environ["KOTUNE_CACHE"] = old
    out = {}
    for name in NAMES:
        shutil.copytree(run.dir, root / "cv" / name)
        out[name] = root / "cv" / name
    return out


@pytest.fixture(autouse=True)
def cache(cache_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("KOTUNE_CACHE", cache_dir)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_the_api_loads_and_evaluates_a_run_directory_named_like_a_fold_or_a_sweep_job(run_dirs, name, tmp_path):
    import kotune

    path = run_dirs[name]
    predict = kotune.load(path)
    assert predict.task == "text_cls"
    assert len(predict(["좋은 영화", "별로"])) == 2
    metrics = kotune.evaluate(path, run_dir=tmp_path / "eval")
    assert metrics.results["task"] == "text_cls" and metrics.results["checkpoint"] == str(path)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", ["plain", "quoted", "escaped"])
def test_the_command_line_evaluates_a_run_directory_named_like_a_fold_or_a_sweep_job(run_dirs, name, form, tmp_path):
    path = str(run_dirs[name])
    value = {"plain": path, "quoted": f"'{path}'",
             "escaped": "".join("\\" + c if c in "=,()[] " else c for c in path)}[form]
    out = tmp_path / "eval"
    done = run_cli_here(["action=eval", f"checkpoint={value}", "data=sample", f"hydra.run.dir={out}"])
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "text_cls" and results["checkpoint"] == path  # the task taken from the checkpoint


@pytest.mark.parametrize("action", ["predict", "export", "serve"])
def test_every_action_reading_a_checkpoint_composes_with_a_fold_directory(run_dirs, action):
    from kotune.api.compose import compose_job

    path = str(run_dirs["0_lr=0.000343,bs=16"])
    cfg = compose_job([f"action={action}", f"checkpoint={path}"])
    assert cfg.checkpoint == path and cfg.task.name == "text_cls" and cfg.model.name == "tiny"


def test_a_sweep_over_checkpoints_stays_a_sweep(run_dirs):
    from kotune.cli.overrides import quote_paths
    from kotune.sweeps.naming import swept_keys

    a, b = (str(run_dirs[n]) for n in ("fold=0", "0_lr=0.000343,bs=16"))
    assert quote_paths([f"checkpoint={a}"]) == [f"checkpoint='{a}'"]
    sweep = "checkpoint=/no/such/a,/no/such/b"
    assert quote_paths([sweep, "train.seed=1,2"]) == [sweep, "train.seed=1,2"]
    assert swept_keys([f"checkpoint={b}", "train.seed=1,2"]) == ["train.seed"]  # the job directories' names
    assert swept_keys([sweep]) == ["checkpoint"]
