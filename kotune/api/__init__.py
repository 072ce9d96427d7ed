"""The Python API beside the command line (docs/api.md): :func:`train` and :func:`evaluate` run a
job as ``python run.py …`` runs it (the same overrides, checks and rewrites, then
``kotune.cli.job.execute``), :func:`load` gives a :class:`Predictor` (kotune/api/predictor.py) that
answers raw inputs with predictions.jsonl's records.

Nothing here reads ``sys.argv`` or needs Hydra's entry point: the config is composed with Hydra's
compose API, whose global state is cleared before and after each composition, so the functions run
any number of times in one process (a notebook, a script, a test). A job that fails raises
:class:`RunFailed` (a :class:`~kotune.core.errors.KotuneError`) with the one-line error the command
line would print; its ``results.json`` stays in the run directory.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kotune.api.compose import RunFailed, as_overrides, default_run_dir, run_job
from kotune.api.predictor import Predictor
from kotune.core.errors import KotuneError

__all__ = ["train", "evaluate", "load", "Run", "Predictor", "RunFailed", "Metrics", "default_run_dir"]

class Run:
    """A finished job: ``dir`` (its run directory), ``results`` (its results.json), ``metrics``.
    A Run is also a path (``os.fspath(run)`` is its directory), so it goes wherever one does."""

    def __init__(self, run_dir: str | os.PathLike, results: dict | None = None):
        self.dir = Path(run_dir)
        if results is None:
            path = self.dir / "results.json"
            if not path.is_file():
                raise KotuneError(f"{self.dir}: no results.json (not a run directory)")
            results = json.loads(path.read_text(encoding="utf-8"))
        self.results: dict = results

    @property
    def metrics(self) -> dict:
        return dict(self.results.get("metrics") or {})

    @property
    def status(self) -> str:
        return str(self.results.get("status"))

    @property
    def predictions_file(self) -> Path | None:
        found = self.results.get("predictions_file")
        return Path(found) if found else None

    def predictions(self) -> list[dict]:
        """The records of the run's predictions.jsonl ([] when it wrote none)."""
        path = self.predictions_file or self.dir / "predictions.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def load(self, *overrides: str) -> Predictor:
        return load(self.dir, *overrides)

    def evaluate(self, data: str | os.PathLike | None = None, *overrides: str, run_dir: str | None = None) -> Metrics:
        return evaluate(self, data, *overrides, run_dir=run_dir)

    def __fspath__(self) -> str:
        return str(self.dir)

    def __repr__(self) -> str:
        return f"Run({str(self.dir)!r}, status={self.status!r}, metrics={self.metrics!r})"


class Metrics(dict):
    """What :func:`evaluate` returns: the metrics dict, with ``results`` (the eval job's
    results.json) and ``dir`` (its run directory) beside it."""

    results: dict
    dir: Path


# ---- the API ----------------------------------------------------------------------------------
def train(*overrides: str, run_dir: str | os.PathLike | None = None, **kw: Any) -> Run:
    """``python run.py OVERRIDES`` in this process: e.g. ``train("task=nli", "model=tiny",
    "data=sample", run_dir="runs/nli")``; keywords are overrides too (``train__max_steps=6``).
    ``run_dir``: default ``outputs/<task>/<model>/<mode>/<date_time>`` under the working directory.
    Any action runs (``action=export checkpoint=…``); returns the finished :class:`Run`."""
    results, folder = run_job(as_overrides(overrides, kw), run_dir)
    return Run(folder, results)


def checkpoint_path(run_or_path: Run | str | os.PathLike) -> str:
    path = os.fspath(run_or_path)
    if not os.path.exists(path):
        raise KotuneError(f"{path}: no such run directory or export")
    return path


def evaluate(run_or_path: Run | str | os.PathLike, data: str | os.PathLike | None = None, *overrides: str,
             run_dir: str | os.PathLike | None = None, **kw: Any) -> Metrics:
    """``action=eval checkpoint=RUN data.validation_file=DATA``: the model scored on ``data`` (a
    labelled file; default: what the run itself was scored on, when its results.json names a local file
    that is unchanged: kotune/actions/eval.py, as the command line). Returns the metrics (a dict) with ``.results`` and ``.dir`` (the eval run's
    directory: ``run_dir``, default as :func:`train`'s)."""
    path = checkpoint_path(run_or_path)
    data = os.fspath(data) if data is not None else None
    asked = as_overrides(overrides, kw)
    extra = [f"data.validation_file={data}"] if data is not None and not any(
        o.lstrip("+").startswith("data.validation_file=") for o in asked) else []
    results, folder = run_job(["action=eval", f"checkpoint={path}", *extra, *asked], run_dir)
    metrics = Metrics(results.get("metrics") or {})
    metrics.results, metrics.dir = results, folder
    return metrics


def load(path: Run | str | os.PathLike, *overrides: str) -> Predictor:
    """A :class:`Predictor` for a run directory, its ``model/``, an ONNX export or a native
    (transformers) export; ``overrides`` as for ``action=predict`` (``onnx.file=model.onnx``,
    ``train.eval_batch_size=8``)."""
    return Predictor(checkpoint_path(path), list(overrides))
