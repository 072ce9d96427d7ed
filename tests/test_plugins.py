"""A package outside the repository adds a task kind, a head and an export format without a line of
kotune changed (tests/plugins/kotune_example_plugin: the worked example of docs/development/plugins.md),
and goes through the contract's actions: train, eval, predict, export (its own format; the native one
refused in one line), serve (the HTTP server, and its predictor through kotune.load) and a sweep. Each command runs in
a process of its own with the plug-in on PYTHONPATH, loaded by ``plugins=`` or by an installed entry
point, so this test process's registries stay kotune's own."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli

PLUGINS = ROOT / "tests" / "plugins"
ENV = {"PYTHONPATH": str(PLUGINS)}
NAMED = "plugins=[kotune_example_plugin]"
TINY = ["model=tiny", "data=sample", "train.batch_size=16"]


def cli(args: list[str], run_dir: Path, env: dict | None = None, multirun: bool = False) -> subprocess.CompletedProcess:
    where = [f"hydra.sweep.dir={run_dir}"] if multirun else [f"hydra.run.dir={run_dir}"]
    return run_cli([*(["-m"] if multirun else []), *args, *where], env={**ENV, **(env or {})})


def ok(proc: subprocess.CompletedProcess, run_dir: Path) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((run_dir / "results.json").read_text(encoding="utf-8"))


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("plugin")
    res = ok(cli(["task=keyword", *TINY, "train.max_steps=6", NAMED, f"cache_dir={cache_dir}"], root / "train"),
             root / "train")
    return {"root": root, "run": root / "train", "res": res, "cache": cache_dir}


def test_a_plugin_task_trains_with_its_own_head_and_the_checkpoint_names_the_plugin(trained):
    res = trained["res"]
    assert res["status"] == "ok" and res["head"] == "mean_linear" and res["task"] == "keyword"
    assert res["config"]["plugins"] == ["kotune_example_plugin"]
    spec = json.loads((trained["run"] / "model" / "kotune.json").read_text(encoding="utf-8"))
    assert spec["head"] == "mean_linear" and spec["meta"]["plugin"] == "kotune_example_plugin.tasks"


def test_eval_and_predict_read_the_checkpoint_back_with_the_plugin_loaded(trained):
    root, run, cache = trained["root"], trained["run"], f"cache_dir={trained['cache']}"
    evaluated = ok(cli(["action=eval", f"checkpoint={run}", "data=sample", NAMED, cache], root / "eval"), root / "eval")
    assert evaluated["metrics"] == pytest.approx(trained["res"]["metrics"])
    predicted = ok(cli(["action=predict", f"checkpoint={run}", "data=sample", NAMED, cache,
                        f"data.predict_file={ROOT / 'tasks' / 'samples' / 'text_cls' / 'dev.tsv'}"], root / "predict"),
                   root / "predict")
    ours = [{k: r[k] for k in ("id", "prediction")} for r in rows(Path(predicted["predictions_file"]))]
    assert ours == [{k: r[k] for k in ("id", "prediction")} for r in rows(run / "predictions.jsonl")]


def test_without_the_plugin_the_checkpoint_is_refused_in_one_line_and_nothing_is_imported(trained, tmp_path):
    line = error_line(run_cli(["action=eval", f"checkpoint={trained['run']}", "data=sample",
                               f"hydra.run.dir={tmp_path / 'eval'}"]))  # the plug-in is not even on the path
    assert "comes from the plug-in 'kotune_example_plugin.tasks', which is not loaded here" in line
    assert "plugins=[kotune_example_plugin.tasks]" in line
    assert "cannot import 'no_such_plugin'" in error_line(cli(["task=keyword", *TINY, "plugins=[no_such_plugin]"],
                                                              tmp_path / "bad"))


def test_the_plugin_options_schema_refuses_its_option_on_another_task_in_one_line(tmp_path):
    line = error_line(cli(["task=text_cls", *TINY, NAMED, "++task.min_chars=3"], tmp_path / "run"))
    assert "task.min_chars=3: task text_cls has no such option" in line and "task=keyword" in line


def test_its_export_format_writes_the_weights_and_the_native_format_refuses_in_one_line(trained):
    root, run = trained["root"], trained["run"]
    assert "the mean_linear head has no native transformers class" in error_line(
        cli(["action=export", f"checkpoint={run}", NAMED], root / "native"))
    failed = json.loads((root / "native" / "results.json").read_text(encoding="utf-8"))
    assert failed["error"].endswith("the mean_linear head has no native transformers class")
    res = ok(cli(["action=export", f"checkpoint={run}", "export.format=npz", NAMED], root / "npz"), root / "npz")
    import numpy as np
    from safetensors.numpy import load_file

    saved = np.load(Path(res["export_dir"]) / "weights.npz")
    head = load_file(str(run / "model" / "head.safetensors"))
    assert set(head) <= {k.removeprefix("head.") for k in saved.files if k.startswith("head.")}
    for key, value in head.items():
        np.testing.assert_array_equal(saved[f"head.{key}"], value)


def test_serve_predictor_answers_as_predict_did(trained):
    """kotune.load wraps action=serve's predictor (kotune/serving/app.py): the records predict wrote."""
    code = ("import json, sys, kotune\n"
            f"p = kotune.load({str(trained['run'])!r}, {NAMED!r})\n"
            "texts = [json.loads(l)['text'] for l in open(sys.argv[1], encoding='utf-8')]\n"
            "print(json.dumps([r['prediction'] for r in p(texts)]))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(trained["run"] / "predictions.jsonl")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**__import__("os").environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]
    answered = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answered == [r["prediction"] for r in rows(trained["run"] / "predictions.jsonl")]


def test_the_http_server_answers_as_predict_did(trained):
    """action=serve with the plug-in: the real server on 127.0.0.1, a real client, the records' predictions."""
    import os

    import httpx

    from bench.serving import free_port, stop_server, wait_for_health

    port, run_dir = free_port(), trained["root"] / "serve"
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), "action=serve", f"checkpoint={trained['run']}", NAMED,
                             f"serve.port={port}", f"cache_dir={trained['cache']}", f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env={**os.environ, **ENV})
    try:
        health = wait_for_health(proc, f"http://127.0.0.1:{port}", timeout_s=180)
        assert health["status"] == "ok" and health["head"] == "mean_linear" and health["runtime"] == "torch"
        expected = rows(trained["run"] / "predictions.jsonl")
        answered = httpx.post(f"http://127.0.0.1:{port}/predict", json={"inputs": [r["text"] for r in expected]},
                              timeout=120).raise_for_status().json()["predictions"]
        assert [a["prediction"] for a in answered] == [r["prediction"] for r in expected]
    finally:
        stop_server(proc)


def test_a_sweep_over_the_plugin_task_runs_every_job(tmp_path, cache_dir):
    proc = cli(["task=keyword", *TINY, "train.max_steps=2", "train.learning_rate=1e-3,2e-3", NAMED,
                f"cache_dir={cache_dir}"], tmp_path / "sweep", multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((tmp_path / "sweep").rglob("results.json"))]
    assert len(results) == 2 and {r["status"] for r in results} == {"ok"} and {r["head"] for r in results} == {"mean_linear"}


def test_an_installed_entry_point_loads_the_plugin_without_plugins_setting(tmp_path, cache_dir):
    """An installed package's entry point in the group kotune.plugins (its dist-info on sys.path, as pip
    writes it) is imported at start: task=keyword then needs no plugins= at all."""
    info = tmp_path / "site" / "kotune_example_plugin-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kotune-example-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[kotune.plugins]\nkotune_example_plugin = kotune_example_plugin\n")
    env = {"PYTHONPATH": f"{PLUGINS}{__import__('os').pathsep}{tmp_path / 'site'}"}
    res = ok(cli(["task=keyword", *TINY, "train.max_steps=2", f"cache_dir={cache_dir}"], tmp_path / "run", env),
             tmp_path / "run")
    assert res["status"] == "ok" and res["head"] == "mean_linear"


def test_a_name_is_registered_once_and_the_refusal_names_both_classes():
    from kotune.core.errors import ConfigError
    from kotune.core.registry import Registry

    registry = Registry("task")

    class First:
        pass

    class Second:
        pass

    registry.register("mine")(First)
    registry.register("mine")(First)  # the same class again (a notebook re-running its cell): fine
    with pytest.raises(ConfigError, match=r"^task 'mine' is registered twice: by .*First and by .*Second \(choose"):
        registry.register("mine")(Second)
    with pytest.raises(ConfigError, match=r"^unknown task 'other' \(choices: mine\)$"):
        registry.get("other")
    assert registry.get("other", None) is None and First.registered_name == "mine"


def test_the_base_classes_a_plugin_subclasses_come_from_kotune():
    import kotune
    from heads.base import Head
    from tasks.base import Task
    from tasks.classification import ClassificationTask
    from tasks.ner import TokenTask

    assert (kotune.Task, kotune.ClassificationTask, kotune.TokenTask, kotune.Head) == \
        (Task, ClassificationTask, TokenTask, Head)
    assert {"register_task", "register_head", "register_exporter", "register_runtime"} <= set(kotune.__all__)
