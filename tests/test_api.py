"""The Python API (kotune/api/__init__.py, docs/api.md): the page's code runs as written; jobs run twice and
more in one process; ``kotune.load(run)(inputs)`` answers the dev inputs with the records the run's
predictions.jsonl holds, for a single-text, a pair and a token task, and for an ONNX and a native
export; failures are one-line KotuneErrors; a notebook can call it (where Jupyter is installed)."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from conftest import ROOT

SMALL = ["model=tiny", "data=sample", "train.max_steps=6"]


def strip(records: list[dict]) -> list[dict]:
    """predictions.jsonl's records as the predictor gives them: no id, no gold answer."""
    return [{k: v for k, v in r.items() if k not in ("id", "gold")} for r in records]


def dev_inputs(records: list[dict], fields: tuple[str, ...]) -> list:
    return [r["text"] if fields == ("text",) else {f: r[f] for f in fields} for r in records]


@pytest.fixture(autouse=True)
def cache(cache_dir, monkeypatch, tmp_path):
    """The session's tokenizer cache (conf: cache_dir=${oc.env:KOTUNE_CACHE,…}); runs without a
    run_dir land in this test's folder."""
    monkeypatch.setenv("KOTUNE_CACHE", cache_dir)
    monkeypatch.setenv("KOTUNE_PROGRESS", "0")
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir):
    """A text_cls run (and its ONNX and native exports), a text_pair run and an NER run, all in this
    one process (the compose API re-entered each time)."""
    import os

    import kotune

    old = os.environ.get("KOTUNE_CACHE")
    os.environ["KOTUNE_CACHE"] = cache_dir
    try:
        root = tmp_path_factory.mktemp("api")
        out = {task: kotune.train(f"task={task}", *SMALL, run_dir=root / task) for task in ("text_cls", "text_pair", "ner")}
        out["onnx"] = kotune.train("action=export", f"checkpoint={out['text_cls'].dir}", "export.format=onnx",
                                   run_dir=root / "onnx")
        out["native"] = kotune.train("action=export", f"checkpoint={out['text_cls'].dir}", run_dir=root / "native")
    finally:
        if old is None:
            os.environ.pop("KOTUNE_CACHE", None)
        else:
            os.environ["KOTUNE_CACHE"] = old
    return out


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_the_api_page_runs_as_written():
    blocks = python_blocks(ROOT / "docs" / "api.md")
    assert len(blocks) >= 5
    namespace: dict = {}
    for n, block in enumerate(blocks):
        exec(compile(block, f"docs/api.md block {n + 1}", "exec"), namespace)  # noqa: S102 - the page's own code
    assert namespace["run"].status == "ok" and namespace["vectors"].shape == (2, 128)


@pytest.mark.parametrize("task", ["text_cls", "text_pair", "ner"])
def test_a_loaded_run_answers_its_dev_inputs_as_its_predictions_file(runs, task):
    import kotune

    run = runs[task]
    expected = run.predictions()
    assert len(expected) >= 10
    predict = kotune.load(run.dir)
    assert predict.task == task and predict.kind == "kotune"
    assert predict(dev_inputs(expected, predict.fields)) == strip(expected)
    assert kotune.load(run.dir / "model")(dev_inputs(expected[:2], predict.fields)) == strip(expected[:2])
    assert predict(dev_inputs(expected, predict.fields)[0]) == strip(expected)[0]  # one input: one record


@pytest.mark.parametrize("export", ["onnx", "native"])
def test_an_export_answers_as_the_run_it_was_exported_from(runs, export):
    import kotune
    from kotune.core.errors import KotuneError

    expected = strip(runs["text_cls"].predictions())
    predict = kotune.load(runs[export].results["export_dir"])
    assert predict.kind == export and predict.task == "text_cls"
    got = predict([r["text"] for r in expected])
    assert [r["prediction"] for r in got] == [r["prediction"] for r in expected]
    assert [r["text"] for r in got] == [r["text"] for r in expected]
    for a, b in zip(got, expected):  # logits equal kotune's to 1e-4 (ONNX): probabilities to their 4 digits
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=2e-4)
    with pytest.raises(KotuneError) as e:
        predict.embed(["문장"])
    assert "export" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("export", ["onnx", "native"])
def test_an_export_refuses_padding_free_in_one_line(runs, export):
    """model.padding_free is how kotune's encoder wrapper runs; an export runs its graph as exported
    (padded): asking for it is one line, not silently ignored."""
    import kotune
    from kotune.core.errors import KotuneError

    with pytest.raises(KotuneError) as e:
        kotune.load(runs[export].results["export_dir"], "model.padding_free=true")
    assert "model.padding_free=false" in str(e.value) and "\n" not in str(e.value)


def test_jobs_run_again_in_one_process_and_evaluate_scores_as_training_did(runs, tmp_path):
    import kotune

    again = kotune.train("task=text_cls", *SMALL, run_dir=tmp_path / "again")
    assert again.metrics == runs["text_cls"].metrics  # seeded: the same model
    metrics = kotune.evaluate(runs["text_cls"], run_dir=tmp_path / "eval")
    assert metrics == runs["text_cls"].metrics and metrics.results["action"] == "eval"
    assert (tmp_path / "eval" / "results.json").is_file()
    kw = kotune.train(task="text_cls", model="tiny", data="sample", train__max_steps=2, save_model=False)
    assert kw.results["config"]["train"]["max_steps"] == 2
    assert kw.dir.parts[:4] == ("outputs", "text_cls", "tiny", "finetune") and (tmp_path / kw.dir).is_dir()
    assert kotune.Run(runs["ner"].dir).metrics == runs["ner"].metrics


def test_failures_are_one_line_kotune_errors(runs, tmp_path):
    import kotune
    from kotune.api import RunFailed
    from kotune.core.errors import ConfigError, KotuneError

    with pytest.raises(ConfigError, match=r"unknown task 'nope' \(choices: .*text_cls"):
        kotune.train("task=nope")
    with pytest.raises(ConfigError, match="did you mean train.max_steps"):
        kotune.train("task=text_cls", "model=tiny", "train.max_step=3")
    with pytest.raises(RunFailed) as failed:
        kotune.train("task=text_cls", "model=tiny", "data.train_file=missing.tsv", run_dir=tmp_path / "failed")
    assert isinstance(failed.value, KotuneError) and "missing.tsv" in str(failed.value) and "\n" not in str(failed.value)
    assert json.loads((tmp_path / "failed" / "results.json").read_text())["status"] == "failed"
    assert failed.value.results["status"] == "failed" and failed.value.dir == tmp_path / "failed"
    pair = kotune.load(runs["text_pair"].dir)
    with pytest.raises(KotuneError, match="item 1: text_pair: missing"):
        pair([{"text": "a", "text_pair": "b"}, {"text": "c"}])
    with pytest.raises(KotuneError, match="no such run directory"):
        kotune.load(tmp_path / "nowhere")


def test_embed_gives_a_row_per_text_as_action_embed_does(runs, capsys):
    import numpy as np

    import kotune

    predict = kotune.load(runs["text_cls"])
    capsys.readouterr()
    vectors = predict.embed(["첫 문장", "두 번째 문장", "세 번째"])
    assert vectors.shape == (3, 128) and np.isfinite(vectors).all()
    # its job's temporary folder is gone once the vectors are read: the log names no file there
    said = capsys.readouterr().out
    assert "embedding 3 texts" in said and "kotune-embed-" not in said
    assert np.allclose(predict.embed("두 번째 문장"), vectors[1], atol=1e-5)


NOTEBOOK_PACKAGES = ("nbclient", "nbformat", "ipykernel")


@pytest.mark.skipif(not all(importlib.util.find_spec(p) for p in NOTEBOOK_PACKAGES),
                    reason=f"Jupyter is not installed ({', '.join(NOTEBOOK_PACKAGES)}): the notebook run is skipped")
def test_a_notebook_trains_twice_and_predicts(tmp_path, cache_dir):
    import nbformat
    from nbclient import NotebookClient

    cells = [f"import os, sys\nsys.path.insert(0, {str(ROOT)!r})\nos.environ['KOTUNE_CACHE'] = {cache_dir!r}\nimport kotune",
             f"a = kotune.train('task=text_cls', *{SMALL!r}, run_dir='a')",
             f"b = kotune.train('task=text_cls', *{SMALL!r}, run_dir='b')",
             "assert a.metrics == b.metrics\nprint(kotune.load(a)(['좋아요'])[0]['prediction'])"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert (tmp_path / "a" / "results.json").is_file() and (tmp_path / "b" / "results.json").is_file()
    if importlib.util.find_spec("ipywidgets") is None:  # text progress bars: no HTML bar left empty, no tqdm warning
        outputs = [o for cell in nb.cells for o in cell.get("outputs", [])]
        assert not [o for o in outputs if o["output_type"] == "display_data"]
        assert not [o for o in outputs if "IProgress" in str(o.get("text", ""))]


@pytest.mark.parametrize("widgets", [False, True])
def test_a_notebook_without_ipywidgets_gets_the_text_progress_bar(monkeypatch, widgets):
    """transformers' Trainer shows its notebook (HTML) bar in a notebook; without ipywidgets tqdm
    falls back to text (after a warning), and the notebook bar's evaluation output is left empty:
    kotune's trainers use the text bar there too, and the warning is not shown."""
    import importlib.util
    import warnings
    from types import SimpleNamespace

    from tqdm import TqdmWarning
    from transformers.trainer_callback import ProgressCallback
    from transformers.utils.notebook import NotebookProgressCallback

    from kotune.devices import quiet_libraries
    from kotune.training.arguments import plain_progress

    class Trainer:
        def __init__(self, *callbacks):
            self.callback_handler = SimpleNamespace(callbacks=list(callbacks))

        def remove_callback(self, cb):
            self.callback_handler.callbacks.remove(cb)

        def add_callback(self, cb):
            self.callback_handler.callbacks.append(cb() if isinstance(cb, type) else cb)

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (SimpleNamespace() if widgets else None) if name == "ipywidgets" else find(name, *a))
    other = object()
    trainer = Trainer(other, NotebookProgressCallback())
    plain_progress(trainer)
    kinds = [type(cb) for cb in trainer.callback_handler.callbacks]
    assert kinds == ([object, NotebookProgressCallback] if widgets else [object, ProgressCallback])
    console = Trainer(other, ProgressCallback())
    plain_progress(console)  # outside a notebook: as it was
    assert [type(cb) for cb in console.callback_handler.callbacks] == [object, ProgressCallback]
    quiet_libraries()
    with warnings.catch_warnings(record=True) as shown:
        warnings.warn("IProgress not found. Please update jupyter and ipywidgets.", TqdmWarning)
    assert shown == []
