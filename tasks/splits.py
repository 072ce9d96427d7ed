"""Splits: the examples of train, validation, predict (and the slices held out of training to select
a checkpoint or tune a decision) read from local files, the preset's samples or the hub; a
validation split held out of the training file (``data.validation_split``) or a cross-validation
fold of it (``data.folds``, tasks/folds.py)."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, open_dict

from kotune.core.errors import ConfigError, DataError
from kotune.core.files import sha256_of
from kotune.core.log import log
from tasks.base import DATA_COLUMNS, Task, column_settings
from tasks.few_shot import check_examples_per_class, sample_note, sample_per_class
from tasks.folds import assign_folds, fold_selection, fold_settings, fold_stratum
from tasks.io import ReadOptions, load_hub_split

SAMPLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples")


@dataclass
class Split:
    """Examples of one split and where they came from (for results.json)."""

    examples: list[dict]
    source: dict[str, Any]

    @property
    def where(self) -> str:
        """The file (or hub dataset and split) the examples came from, for messages."""
        src = self.source
        if src.get("file"):
            return str(src["file"])
        return f"{src.get('hub', '?')}/{src.get('name')}:{src.get('split')}"



@dataclass
class _SplitSettings:
    """What ``data`` asks of the splits, read and checked once: the local files, the held-out share
    (``data.validation_split``), the fold (``data.folds``/``data.fold``: (K, i) or None), where a
    fold's checkpoint is selected, and which of train and validation the action reads."""

    files: dict[str, Any]
    holdout: float
    folds: tuple[int, int] | None
    selection: str
    wants: list[str]


def sample_file(task_cfg: DictConfig, split: str) -> str:
    folder = os.path.join(SAMPLES_DIR, task_cfg.get("sample") or task_cfg.get("kind") or task_cfg.name)
    stem = "train" if split == "train" else "dev"
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.split(".")[0] == stem:
            return os.path.join(folder, name)
    raise ConfigError(f"task {task_cfg.name} ships no sample {stem} file in {folder}")


def require_data_files(data: DictConfig, need: tuple[str, ...]) -> None:
    """The local files ``need`` reads exist, in the order load_splits reads them: checked before a
    checkpoint's model loads, so a mistyped path is answered in a second, not after torch loads."""
    keys = (["predict_file"] if "predict" in need else []) + \
        (["train_file", "validation_file"] if {"train", "validation"} & set(need) else [])
    for key in keys:
        path = data.get(key)
        if path and not os.path.exists(str(path)):
            raise DataError(str(path), None, "file not found")



def load_splits(task: Task, data: DictConfig, need: tuple[str, ...], seed: int,
                calibrate_fraction: float = 0.0) -> dict[str, Split]:
    """Read the splits in ``need`` ('train', 'validation', 'predict'; 'select': where action=train
    selects its checkpoint when not on the validation split) from files, samples or hub;
    ``calibrate_fraction`` (``train.calibrate``) holds a 'calibrate' slice out of training."""
    settings = _split_settings(data, need)
    files = settings.files
    if data.get("source") == "sample":  # the preset's files stand in for those not given
        _use_samples(task, settings)
    use_files = any(files[s] for s in ("train", "validation"))
    task.reading = ReadOptions(data.get("format"), data.get("quoting"))
    task.use_columns(data)
    pin_labels(task, data)
    out: dict[str, Split] = {}
    if "predict" in need:
        if not files["predict"]:
            raise ConfigError("action=predict needs data.predict_file=FILE")
        out["predict"] = _from_file(task, files["predict"], labelled=False)
    if settings.wants and use_files:
        out.update(_file_splits(task, data, settings, need, seed))
    elif settings.wants:
        for split in settings.wants:
            out[split] = _from_hub(task, data, settings, "train" if split == "train" else
                                   data.get("hub_validation_split", "validation"))
    if "train" in out and data.get("exclude_ids"):
        _exclude_ids(out, str(data.exclude_ids))
    if "train" in out and check_examples_per_class(data.get("examples_per_class")):
        _few_shot(out, int(data.examples_per_class), seed, task.name)
    _cut_to_limits(out, data)
    if "train" in out and task.tune_fraction:  # out of training, never the validation split's
        out["train"], out["tune"] = _holdout(out["train"], task.tune_fraction, seed, task.split_group,
                                             name="tune")
    if "train" in out and calibrate_fraction:  # train.calibrate: fitted after training, on rows never trained on
        out["train"], out["calibrate"] = _holdout(out["train"], calibrate_fraction, seed, task.split_group,
                                                  name="calibrate")
    for split, s in out.items():
        if not s.examples:
            raise DataError(s.where, None, f"no examples in the {split} split")
    return out


def pin_labels(task: Task, data: DictConfig) -> None:
    """``data.labels=[a,b]``: the label set, in the model's class order, instead of the one learned from
    the training file; a row with any other label is then refused where it is read (its file and row)."""
    wanted = data.get("labels")
    if wanted is None:
        return
    names = [str(name) for name in wanted] if not isinstance(wanted, (str, int, float)) else []
    if not names:
        raise ConfigError(f"data.labels={wanted}: a list of label names is needed, e.g. data.labels=[긍정,부정]")
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"data.labels=[{','.join(names)}] names '{twice}' twice")
    if not task.labels_pinnable:
        raise ConfigError(f"data.labels=[{','.join(names)}]: task {task.name} has no label set to pin (it applies to "
                          "text_cls, text_pair, multi_label and the other single- and multi-label classifiers)")
    if task.labels is not None and list(task.labels) != names:
        raise ConfigError(f"data.labels=[{','.join(names)}] differs from task {task.name}'s labels "
                          f"[{','.join(task.labels)}] (its task.labels, or the checkpoint's, in the model's order)")
    task.labels = names
    with open_dict(task.cfg):  # saved with the model as any task.labels is
        task.cfg.labels = names


def _split_settings(data: DictConfig, need: tuple[str, ...]) -> _SplitSettings:
    """The split settings of ``data``; settings that contradict each other are refused in one line."""
    files = {"train": data.get("train_file"), "validation": data.get("validation_file"),
             "predict": data.get("predict_file")}
    holdout = float(data.get("validation_split") or 0.0)
    folds = fold_settings(data)  # (K, i) for data.folds=K data.fold=i, else None
    selection = fold_selection(data)
    wants = [s for s in ("train", "validation") if s in need]
    if selection == "inner" and "train" in wants and "select" not in need:
        raise ConfigError("data.fold_selection=inner holds out a slice of the training folds to select action=train's "
                          "checkpoint on (train.select_best=true): drop it here")
    if holdout and files["validation"] and wants:
        raise ConfigError(f"data.validation_split={holdout} and data.validation_file={files['validation']} "
                          "are both set: keep one (data.validation_file=null holds out part of the train file)")
    if folds and wants and (holdout or files["validation"]):
        other = f"data.validation_split={holdout}" if holdout else f"data.validation_file={files['validation']}"
        raise ConfigError(f"data.folds={folds[0]} holds out fold {folds[1]} of data.train_file as the validation "
                          f"split; {other} is set too: drop it")
    return _SplitSettings(files, holdout, folds, selection, wants)


def _use_samples(task: Task, settings: _SplitSettings) -> None:
    """``data=sample``: the preset's sample files stand in for the files not given."""
    files = settings.files
    files["train"] = files["train"] or sample_file(task.cfg, "train")
    if not settings.holdout and not settings.folds:
        files["validation"] = files["validation"] or sample_file(task.cfg, "validation")


def _from_file(task: Task, path: str, labelled: bool = True) -> Split:
    examples = task.read_file(path, labelled=labelled)
    if not examples:  # a header alone, or blank lines: say so before any split or count
        raise DataError(path, None, "no rows (the file holds no examples)")
    return Split(examples, {"file": path, "sha256": sha256_of(path)})


def _from_hub(task: Task, data: DictConfig, settings: _SplitSettings, split: str) -> Split:
    hub = task.cfg.get("hub")
    if not hub:
        raise ConfigError(f"task {task.name} has no hub dataset: set data.train_file=... "
                          "(and data.validation_file=...) or use data=sample")
    holdout, folds = settings.holdout, settings.folds
    ignored = [f"data.{DATA_COLUMNS[role]}={value}" for role, value in column_settings(data).items()]
    ignored += [f"data.validation_split={holdout}"] if holdout else []
    ignored += [f"data.folds={folds[0]}"] if folds else []
    if ignored:
        raise ConfigError(f"{ignored[0]} applies to local files, but {hub.path} ({hub.get('name')}) is read "
                          "from the hub with its own columns and splits: add data.train_file=FILE or drop it")
    rows, revision = load_hub_split(hub.path, hub.get("name"), split, data.get("revision"))
    label = f"{hub.path}/{hub.get('name')}:{split}"
    return Split(task.read_hub(rows, label), {"hub": hub.path, "name": hub.get("name"),
                                              "split": split, "revision": revision})


def _file_splits(task: Task, data: DictConfig, settings: _SplitSettings, need: tuple[str, ...],
                 seed: int) -> dict[str, Split]:
    """Train and validation from local files: the validation file, else a fold or a held-out share
    of the training file."""
    files, wants, out = settings.files, settings.wants, {}
    if "train" in wants and not files["train"]:
        raise ConfigError("data.validation_file is set but data.train_file is not")
    if files["train"] and ("train" in wants or not files["validation"]):
        train = _from_file(task, files["train"])
        if files["validation"]:
            out["train"] = train
            if "validation" in wants:
                out["validation"] = _from_file(task, files["validation"])
        elif settings.folds:
            out.update(_fold_splits(task, data, settings, train, need))
        elif settings.holdout > 0:
            out["train"], out["validation"] = _holdout(train, settings.holdout, seed, task.split_group)
        else:
            raise ConfigError("only data.train_file is given: add data.validation_file=FILE, "
                              "data.validation_split=0.2 to hold out a seeded fraction, or "
                              "data.folds=5 data.fold=0 for a cross-validation fold")
    elif "validation" in wants:
        out["validation"] = _from_file(task, files["validation"])
    return out


def _fold_splits(task: Task, data: DictConfig, settings: _SplitSettings, train: Split,
                 need: tuple[str, ...]) -> dict[str, Split]:
    """``data.folds=K data.fold=i``: fold i is the validation split; with ``data.fold_selection=inner``
    a slice of the other folds is held out to select the checkpoint on."""
    out: dict[str, Split] = {}
    fold_seed = int(data.get("fold_seed") or 0)
    stratify = data.get("fold_stratify", True)
    out["train"], out["validation"] = _fold(train, *settings.folds, fold_seed, task.split_group,
                                            (lambda ex: fold_stratum(task, ex)) if stratify else
                                            (lambda ex: None))
    if settings.selection == "inner" and "select" in need:  # checkpoints selected here, never on the fold scored
        out["train"], out["select"] = _holdout(out["train"], float(data.get("inner_split") or 0.1),
                                               fold_seed, task.split_group, name="select")
    return out


def read_ids_file(path: str) -> list[str]:
    """``data.exclude_ids``: one id per line (blank lines and ``#`` comments skipped); a missing or
    empty file, or an id twice, is refused in one line."""
    if not os.path.isfile(path):
        raise DataError(path, None, "data.exclude_ids: file not found")
    ids: list[str] = []
    with open(path, encoding="utf-8-sig") as f:
        for n, line in enumerate(f, 1):
            value = line.strip()
            if not value or value.startswith("#"):
                continue
            if value in ids:
                raise DataError(path, n, f"data.exclude_ids: id '{value}' is listed twice")
            ids.append(value)
    if not ids:
        raise DataError(path, None, "data.exclude_ids: the file lists no ids (one id per line)")
    return ids


def _exclude_ids(out: dict[str, Split], path: str) -> None:
    """``data.exclude_ids=FILE``: the listed rows leave the training split only (a fold, a held-out
    share and the validation file keep theirs, so scores stay comparable); every id must be a row of
    the training file (in any of its parts), else it is refused in one line."""
    ids = read_ids_file(path)
    train = out["train"]
    known = {str(ex["id"]) for s in out.values() if s.source.get("file") == train.source.get("file")
             and s.source.get("hub") == train.source.get("hub") for ex in s.examples}
    unknown = [i for i in ids if i not in known]
    if unknown:
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise DataError(path, None, f"data.exclude_ids: {len(unknown)} id(s) are not rows of the training file "
                                    f"{train.where}: {shown}")
    drop = set(ids)
    kept = [ex for ex in train.examples if str(ex["id"]) not in drop]
    removed = len(train.examples) - len(kept)
    out["train"] = Split(kept, dict(train.source, exclude_ids={"file": path, "sha256": sha256_of(path),
                                                               "listed": len(ids), "removed": removed}))
    log(f"data.exclude_ids: {removed} of {len(train.examples)} training rows left out ({path}; "
        f"{len(ids) - removed} listed ids are outside the training split)" if removed < len(ids) else
        f"data.exclude_ids: {removed} of {len(train.examples)} training rows left out ({path})")


def _few_shot(out: dict[str, Split], n: int, seed: int, task_name: str) -> None:
    """``data.examples_per_class=N``: the training split becomes a seeded sample of N rows per class."""
    train = out["train"]
    kept, counts = sample_per_class(train.examples, n, seed, task_name)
    log(sample_note(n, counts, len(train.examples)))
    out["train"] = Split(kept, dict(train.source, examples_per_class={"n": n, "seed": seed, "rows": counts}))


def _cut_to_limits(out: dict[str, Split], data: DictConfig) -> None:
    """``data.max_train_samples`` / ``data.max_eval_samples``: the first rows of a split, in place."""
    for split, limit in (("train", data.get("max_train_samples")),
                         ("validation", data.get("max_eval_samples"))):
        if split in out and limit:
            out[split].examples = out[split].examples[: int(limit)]
            out[split].source["max_samples"] = int(limit)


def _holdout(train: Split, fraction: float, seed: int, group=lambda ex: None,
             name: str = "validation") -> tuple[Split, Split]:
    """A seeded ``fraction`` of whole groups (``Task.split_group``; rows without one are groups of
    one, split exactly as a shuffle of the rows); ``name``: validation (``data.validation_split``)
    or tune (a task's ``tune_fraction``) or select (``data.inner_split``, ``data.fold_selection=inner``)."""
    option = {"validation": "data.validation_split", "tune": "task.tune_fraction", "select": "data.inner_split",
              "calibrate": "train.calibrate_fraction"}[name]
    if not 0 < fraction < 1:
        raise ConfigError(f"{option} must be between 0 and 1, got {fraction}")
    groups: dict[Any, list[int]] = {}
    for i, ex in enumerate(train.examples):
        key = group(ex)
        groups.setdefault(("row", i) if key is None else ("group", key), []).append(i)
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    target, val_idx = max(1, int(round(len(train.examples) * fraction))), []
    for members in order:
        if len(val_idx) >= target:
            break
        val_idx += members
    if len(val_idx) == len(train.examples):
        raise DataError(train.where, None, f"{option}={fraction}: the rows form {len(order)} "
                                           "group(s), too few to hold some out and keep some for training")
    held = set(val_idx)
    keys = ({"validation_split": fraction, "split_seed": seed} if name == "validation"
            else {f"{name}_split": fraction, f"{name}_split_seed": seed})
    src = dict(train.source, **keys)
    return (Split([ex for i, ex in enumerate(train.examples) if i not in held], dict(src, part="train")),
            Split([ex for i, ex in enumerate(train.examples) if i in held],
                  dict(src, part="held-out" if name == "validation" else name)))


def _fold(train: Split, folds: int, fold: int, seed: int, group=lambda ex: None,
          stratum=lambda ex: None) -> tuple[Split, Split]:
    """Cross-validation: fold ``fold`` of ``folds`` (tasks/folds.py: whole groups, stratified by
    ``stratum`` (the label), seeded by ``data.fold_seed``, the same partition for every fold and
    training seed) is the validation split."""
    assignment = assign_folds([group(ex) for ex in train.examples], folds, seed,
                              [stratum(ex) for ex in train.examples])
    if len(set(assignment)) < folds:
        raise DataError(train.where, None, f"data.folds={folds}: the rows form {len(set(assignment))} group(s), "
                                           f"fewer than the {folds} folds")
    src = dict(train.source, folds=folds, fold=fold, fold_seed=seed)
    return (Split([ex for ex, f in zip(train.examples, assignment) if f != fold], dict(src, part="train")),
            Split([ex for ex, f in zip(train.examples, assignment) if f == fold], dict(src, part=f"fold {fold}")))
