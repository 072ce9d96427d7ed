"""``action=label_issues``: training rows whose label looks wrong, found by cleanlab (confident
learning) from out-of-fold probabilities: each row's probabilities come from the fold model that
never trained on it.

``label_issues.runs=DIR`` reads the jobs of a k-fold multirun (``python run.py -m task=…
data.folds=K data.fold=0,…,K-1``): one ok training run per fold, the same settings but
``data.fold``, each with its validation fold's predictions.jsonl and their per-class
probabilities; together the folds must cover the training file. ``label_issues.predictions=FILE``
reads out-of-fold predictions made elsewhere (kotune's predictions.jsonl records: ``id`` and
``probabilities``) for ``data.train_file`` of this command's task. Anything else is refused in one
line.

Writes ``label_issues.csv`` and ``label_issues.jsonl`` (the flagged rows, lowest label quality
first: id, text, given label, suggested label, scores) and the summary in results.json
(``label_issues``: counts and cleanlab's estimated noise per class). ``data.exclude_ids=FILE``
(``label_issues.ids``, written beside them) retrains without the rows.

Classification, multi-label and token tasks (NER, token_cls: the folds must have run with
``task.unit_probabilities=true``, without ``task.crf``; one flagged row per sentence, its units in
question with their given and suggested tags); regression tasks (no classes) are refused."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kotune.core.errors import ConfigError, DataError
from kotune.core.files import csv_text, write_jsonl_atomic, write_text_atomic
from kotune.core.log import log
from kotune.reporting.label_issues import FIELDS, find_issues
from tasks import build_task
from tasks.classification import EXACT_PROBABILITIES, exact_probabilities
from tasks.splits import load_splits

# keys of a fold run's config that may differ between the folds of one cross-validation
FOLD_KEYS = ("data.fold",)
# keys that never change a run's result (where it ran, its output paths)
IGNORED_KEYS = ("hydra", "cache_dir", "keep_going_on_bugs", "label_issues")



def run(cfg: DictConfig, run_dir: str) -> dict:
    opts = cfg.get("label_issues") or {}
    runs, preds = opts.get("runs"), opts.get("predictions")
    if cfg.get("checkpoint") and not (runs or preds):
        raise ConfigError("action=label_issues reads the out-of-fold predictions of a k-fold multirun, not a checkpoint: "
                          "label_issues.runs=DIR (python run.py -m data.folds=K data.fold=0,...,K-1)")
    if bool(runs) == bool(preds):
        raise ConfigError("action=label_issues needs one of label_issues.runs=DIR (a k-fold multirun: -m "
                          "data.folds=K data.fold=0,...,K-1) or label_issues.predictions=FILE (out-of-fold predictions)")
    if runs:
        run_cfg, records, source = fold_runs(str(runs))
    else:
        records = read_records(str(preds))
        if os.path.basename(str(preds)) == "predictions.jsonl":  # a kotune run's: its exact probabilities beside it
            records = with_exact_probabilities(records, os.path.dirname(os.path.abspath(str(preds))))
        run_cfg, source = cfg, {"predictions": os.path.abspath(str(preds))}
    task = build_task(run_cfg.task)
    if runs:
        token_refusal(task, str(runs))
    if getattr(task, "regression", False):
        raise ConfigError(f"action=label_issues: task {task.name} is a regression (no classes to mislabel)")
    examples, data_source = training_rows(task, run_cfg)
    found = find_issues(task, examples, records, source.get("runs") or source["predictions"])
    written = write_outputs(run_dir, found["rows"], found.pop("fields", FIELDS))
    summary = {**source, **{k: v for k, v in found.items() if k != "rows"}, "files": written}
    log(f"label_issues: {summary['n_issues']} of {summary['n_rows']} rows flagged ({written['csv']})")
    return {"task": run_cfg.task.name, "model": run_cfg.model.name, "mode": run_cfg.mode.name,
            "main_metric": run_cfg.task.main_metric, "metrics": {}, "label_issues": summary,
            "data": {"train": data_source}}


# ---- reading ---------------------------------------------------------------------------------
def fold_runs(folder: str) -> tuple[DictConfig, dict[str, dict], dict]:
    """The runs of one k-fold cross-validation under ``folder``: their shared config, every
    validation fold's prediction records by id, and what results.json says of them."""
    if not os.path.isdir(folder):
        raise ConfigError(f"label_issues.runs={folder}: no such directory")
    found = sorted(Path(folder).rglob("results.json"))
    if not found:
        raise ConfigError(f"label_issues.runs={folder}: no runs there (no results.json): give the directory of "
                          "python run.py -m data.folds=K data.fold=0,...,K-1")
    runs = []
    for path in found:
        try:
            res = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise ConfigError(f"label_issues.runs={folder}: {path} is not a results file (rerun that job)") from None
        if res.get("action") == "label_issues":
            continue  # an earlier label_issues job written inside the folder
        runs.append((path.parent, res))
    if not runs:
        raise ConfigError(f"label_issues.runs={folder}: no training runs there")
    for where, res in runs:
        data = (res.get("config") or {}).get("data") or {}
        if res.get("action") != "train" or not data.get("folds"):
            raise ConfigError(f"label_issues.runs={folder}: {where} is not a cross-validation fold's training run "
                              f"(action={res.get('action')}, data.folds={data.get('folds')}): give the directory of "
                              "python run.py -m data.folds=K data.fold=0,...,K-1")
        if res.get("status") != "ok":
            raise ConfigError(f"label_issues.runs={folder}: fold {data.get('fold')}'s run ({where}) is "
                              f"{res.get('status')}: rerun it")
    base = settings(runs[0][1]["config"])
    for where, res in runs[1:]:
        differ = sorted(k for k in set(base) | set(settings(res["config"]))
                        if base.get(k) != settings(res["config"]).get(k))
        if differ:
            raise ConfigError(f"label_issues.runs={folder}: the runs differ in more than data.fold ({', '.join(differ[:4])}"
                              f" of {runs[0][0].name} and {where.name}): one cross-validation's runs only")
    k = int(runs[0][1]["config"]["data"]["folds"])
    folds = [int(res["config"]["data"]["fold"]) for _, res in runs]
    twice = sorted({f for f in folds if folds.count(f) > 1})
    if twice:
        raise ConfigError(f"label_issues.runs={folder}: fold(s) {', '.join(map(str, twice))} ran more than once "
                          "(several seeds?): one run per fold")
    missing = sorted(set(range(k)) - set(folds))
    if missing:
        raise ConfigError(f"label_issues.runs={folder}: the {k}-fold cross-validation lacks fold(s) "
                          f"{', '.join(map(str, missing))}: run data.fold={','.join(map(str, missing))} too")
    cfg = OmegaConf.create(runs[0][1]["config"])
    token_refusal(build_task(cfg.task), folder)
    records: dict[str, dict] = {}
    for where, res in sorted(runs, key=lambda r: r[1]["config"]["data"]["fold"]):
        fold = int(res["config"]["data"]["fold"])
        path = where / "predictions.jsonl"
        if not path.is_file():
            raise ConfigError(f"label_issues.runs={folder}: fold {fold}'s run wrote no predictions.jsonl "
                              "(save_predictions=false): rerun it with save_predictions=true")
        for rec in with_exact_probabilities(read_records(str(path)), where).values():
            rec["fold"] = fold
            if rec["id"] in records:
                raise DataError(str(path), rec["id"], "predicted in two folds: the folds overlap")
            records[rec["id"]] = rec
    return cfg, records, {"runs": os.path.abspath(folder), "folds": k}


def token_refusal(task, folder: str) -> None:
    """A token task's folds must have written per-unit probabilities (``task.unit_probabilities``)."""
    if getattr(task, "head", None) != "token":
        return
    if getattr(task, "crf", False):
        raise ConfigError(f"label_issues.runs={folder}: the folds ran with task.crf=true (Viterbi paths, no per-unit "
                          "probabilities): rerun the k-fold multirun with task.crf=false task.unit_probabilities=true")
    if not getattr(task, "unit_probabilities", False):
        raise ConfigError(f"label_issues.runs={folder}: the folds' predictions have no per-unit tag probabilities: "
                          "rerun the k-fold multirun with task.unit_probabilities=true")


def settings(config: dict) -> dict[str, Any]:
    """A run's config flattened to dotted keys, less the keys folds may differ in."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node

    walk({k: v for k, v in config.items() if k not in IGNORED_KEYS}, "")
    for key in FOLD_KEYS:
        flat.pop(key, None)
    return flat


def read_records(path: str) -> dict[str, dict]:
    """predictions.jsonl's records by id; each must carry its per-class probabilities."""
    if not os.path.isfile(path):
        raise DataError(path, None, "file not found")
    out: dict[str, dict] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise DataError(path, n, "not a JSON line") from None
            if not isinstance(rec, dict) or "id" not in rec:
                raise DataError(path, n, "a record without an 'id'")
            if not isinstance(rec.get("probabilities"), dict) and not isinstance(rec.get("unit_probabilities"), dict):
                raise DataError(path, n, "no per-class 'probabilities' ({label: probability}) or 'unit_probabilities': "
                                         "label_issues reads classification and multi-label predictions, and token "
                                         "tasks' run with task.unit_probabilities=true")
            rec["id"] = str(rec["id"])
            out[rec["id"]] = rec
    if not out:
        raise DataError(path, None, "no predictions in the file")
    return out


def with_exact_probabilities(records: dict[str, dict], folder: str | Path) -> dict[str, dict]:
    """``records`` with the full-precision probabilities its run wrote beside them (classification's
    probabilities.json) in place of predictions.jsonl's rounded ones, where there is that file: rounded
    probabilities tie rows that are not tied, and cleanlab's flags among tied rows follow the rows' order."""
    path = os.path.join(str(folder), EXACT_PROBABILITIES)
    if not os.path.isfile(path):
        return records  # predictions from elsewhere, or of a kotune before the file
    for row_id, probabilities in exact_probabilities(path, records).items():
        records[row_id]["probabilities"] = probabilities
    return records


def training_rows(task, cfg: DictConfig) -> tuple[list[dict], dict]:
    """Every row of the runs' training file (all its folds, no limits or exclusions)."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    data.update(validation_file=None, validation_split=0.0, max_train_samples=None, max_eval_samples=None,
                exclude_ids=None, fold_selection="fold")
    if not data.get("folds"):
        if not data.get("train_file") and data.get("source") != "sample":
            raise ConfigError("label_issues.predictions needs the training file the predictions are of: data.train_file=FILE")
        data.update(folds=2, fold=0)
    splits = load_splits(task, OmegaConf.create(data), ("train", "validation"), int(cfg.train.seed))
    rows = [ex for s in splits.values() for ex in s.examples]
    source = {k: v for k, v in splits["train"].source.items() if k not in ("fold", "part")}
    return rows, source


# ---- writing ---------------------------------------------------------------------------------
def write_outputs(run_dir: str, rows: list[dict], fields=FIELDS) -> dict[str, str]:
    """label_issues.jsonl, label_issues.csv (lists joined with |) and label_issues.ids (one id a
    line: data.exclude_ids reads it), each written atomically."""
    out = {k: os.path.abspath(os.path.join(run_dir, f"label_issues.{k}")) for k in ("csv", "jsonl", "ids")}
    write_jsonl_atomic(out["jsonl"], rows)
    write_text_atomic(out["csv"], _csv_text(rows, fields))
    write_text_atomic(out["ids"], "".join(f"{r['id']}\n" for r in rows))
    return out


def _csv_text(rows: list[dict], fields=FIELDS) -> str:
    """The flagged rows as CSV: a list joined with |; a text a spreadsheet would run as a formula
    (``=HYPERLINK(…)``) neutralised with a leading quote (the JSONL keeps it as it is)."""
    return csv_text(list(fields), [["|".join(map(str, row[k])) if isinstance(row.get(k), list) else row.get(k)
                                    for k in fields] for row in rows])


