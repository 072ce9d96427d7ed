"""What every task provides, and the data plumbing they share (splits, holdout, encode cache).

A task turns files or hub rows into *examples* (plain dicts with an ``id``), examples into
*features* (a ``datasets.Dataset`` holding the model inputs plus whatever decoding needs), model
outputs back into task outputs, and outputs into metrics. It never builds a module.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any, Iterable

from omegaconf import DictConfig, ListConfig

from kotune.core.errors import ConfigError, DataError
from tasks.folds import assign_folds, fold_selection, fold_settings, fold_stratum
from tasks.io import ReadOptions, has_columns, load_hub_split
from kotune.core.files import sha256_of
from kotune.core.log import log

SAMPLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples")
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# the label of a slot that is not scored (padding, specials, continuation subwords); the one definition.
# Here, not in tasks/collate.py (torch): importing the tasks package does not load torch, so the command
# line answers a config or data mistake without paying for it
IGNORE = -100
# The one way to name a local file's columns, for every task: ``data.<role>_column`` replaces the
# column ``task.columns.<role>`` names by default (KLUE's names for KLUE tasks, text/label for custom
# files). A task whose column map has no such role refuses the setting rather than ignore it.
DATA_COLUMNS: dict[str, str] = {"id": "id_column", "text": "text_column", "text_pair": "text_pair_column",
                                "label": "label_column", "group": "group_column"}


class LabelWithProbabilities(str):
    """A predicted label that also carries each class's probability: a plain string for metrics
    and comparisons, the probabilities for predictions.jsonl (and RE's AUPRC in action=score)."""

    def __new__(cls, label: str, probabilities: Any):
        obj = super().__new__(cls, label)
        obj.probabilities = probabilities
        return obj


def column_settings(data: DictConfig) -> dict[str, str | list[str]]:
    """The ``data.<role>_column`` settings given: role → column name (a list names several:
    ``task=multi_label`` reads a label set from more than one column)."""
    out: dict[str, str | list[str]] = {}
    for role, key in DATA_COLUMNS.items():
        value = data.get(key)
        if isinstance(value, ListConfig):
            out[role] = [str(v) for v in value]
        elif value is not None:
            out[role] = str(value)
    return out


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


@dataclass(frozen=True)
class TaskOption:
    """A ``task.<option>`` only some tasks read (``Task.own_options``): the values that leave it off,
    and what it does. Given to a task without it, it is refused in one line naming the tasks that
    take it, never ignored."""

    off: tuple = (None,)
    about: str = ""


@dataclass
class EncodeSettings:
    max_length: int
    token_type_ids: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


class Task:
    """Base class; subclasses fill in reading, encoding, decoding and scoring."""

    head: str = "sequence"  # the registered head kind (kotune.register_head); its options: head_kwargs()
    # the label columns the task encodes: its head's ``label_fields`` (tests/test_contract.py checks
    # the two agree, for every registered task and every head option it picks)
    label_fields: tuple[str, ...] = ("labels",)
    pair = False  # reads two texts (a ClassificationTask with a text_pair column)
    # task options a trained model depends on, saved with it and compared on reload (action=eval,
    # predict): "error" where another value gives a different model (refuse), "saved" where the
    # saved value is used with a warning (the model was trained to see that encoding), "auto" where
    # the task records in self.cfg what a requested ``auto`` resolved to in training, used for auto
    saved_options: dict[str, str] = {}
    # tokens the task's encoding needs as new vocabulary entries (KLUE RE's <subj> markers): the
    # loader adds them to the tokenizer and resizes the encoder's embeddings (heads/encoder.py)
    special_tokens: tuple[str, ...] = ()
    # task options only some tasks read, with what leaves them off: another task refuses them (tasks.build_task)
    own_options: dict[str, TaskOption] = {}
    windows: Any = None  # task.long_text=windows: tasks.windows.WindowOptions

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.name: str = cfg.name
        self.main_metric: str = cfg.main_metric
        self.greater_is_better: bool = bool(cfg.get("greater_is_better", True))
        self.labels: list[str] | None = list(cfg.labels) if cfg.get("labels") else None
        self.reading = ReadOptions()  # load_splits sets data.format / data.quoting here
        self.default_columns: dict = dict(cfg.get("columns") or {})
        self.explicit_columns: set[str] = set()  # roles a data.<role>_column names (never looked up by name)
        self.explicit_column_names: dict = {}  # those settings: role → column(s)
        # the columns a checkpoint's task read in training (kotune/build.py use_saved_columns): they
        # apply to a file that has them; a file in the preset's own format keeps the preset's
        self.checkpoint_columns: dict | None = None
        self.checkpoint_name: str = ""

    # ---- reading -------------------------------------------------------------------------
    def read_file(self, path: str, labelled: bool = True) -> list[dict]:
        """Examples of a local file; ``labelled=False`` (action=predict) lets labels be absent."""
        raise NotImplementedError

    def read_hub(self, rows, path: str) -> list[dict]:
        raise NotImplementedError

    @property
    def column_options(self) -> dict[str, str]:
        """Role → the setting that names its column, for messages."""
        return {role: f"data.{DATA_COLUMNS[role]}" if role in DATA_COLUMNS else f"task.columns.{role}"
                for role in self.default_columns}

    def use_columns(self, data: DictConfig) -> None:
        """Read local files with ``data.<role>_column`` where set, else the task's default column
        (``task.columns``); a setting for a role this task does not read is a ConfigError."""
        columns = dict(self.default_columns)
        for role, value in column_settings(data).items():
            if role not in columns:
                reads = (f"it reads {', '.join(self.column_options.values())}" if columns
                         else "its file format fixes its fields")
                raise ConfigError(f"data.{DATA_COLUMNS[role]}={value}: task {self.name} has no {role} "
                                  f"column ({reads})")
            columns[role] = value
        self.explicit_column_names = column_settings(data)
        self.explicit_columns = set(self.explicit_column_names)
        if columns:
            self.cfg.columns = columns

    def columns_for_file(self, path: str, present: list[str], roles: Iterable[str]) -> dict[str, str]:
        """The column map to read ``path`` (whose columns are ``present``) with, set in
        ``task.columns``; ``roles``: those the file must have. Without a checkpoint: the one
        ``use_columns`` chose. With one: its training columns where the file has them (a file like
        the training file needs no settings); else the preset's own where the file has those (KLUE's
        JSON for task=sts after training on KorSTS's TSV), said in the log; else the checkpoint's,
        whose missing column the returned origins name. A ``data.<role>_column`` wins in all three."""
        if not self.checkpoint_columns:
            return {}
        roles = set(roles)
        saved = {**self.default_columns, **self.checkpoint_columns, **self.explicit_column_names}
        preset = {**self.default_columns, **self.explicit_column_names}
        needed = lambda cols: {r: c for r, c in cols.items() if r in roles}  # noqa: E731
        if not has_columns(present, needed(saved)) and has_columns(present, needed(preset)):
            differ = [f"{r} {saved[r]!r}" for r in sorted(roles) if saved.get(r) != preset.get(r)]
            log(f"{path}: read with task {self.name}'s own columns; the checkpoint's ({', '.join(differ)}, "
                f"from its training file) are not in this file")
            self.cfg.columns = preset
            return {}
        self.cfg.columns = saved
        return {r: f"the {r} column {self.checkpoint_name or 'the checkpoint'} was trained with"
                for r in roles if r not in self.explicit_column_names and saved.get(r) != preset.get(r)}

    def fit_labels(self, train: list[dict]) -> None:
        """Tasks whose label set comes from the training data set it here."""

    def check_labels(self, examples: list[dict], path: str) -> None:
        """Tasks whose label set comes from the training data check other splits against it."""

    def training_texts(self, examples: list[dict]) -> Iterable[str]:
        raise NotImplementedError

    def holdout_group(self, example: dict) -> str | None:
        """Examples with the same group stay on one side of ``data.validation_split`` (None: a
        row of its own). Why: KLUE NLI writes three hypotheses per premise, one of each label; a
        row-level split shows a model two of them in training and scores it on the third, which a
        model that remembers premises gets wrong by construction (below chance)."""
        return None

    def split_group(self, example: dict) -> str | None:
        """The group that keeps examples on one side of any split (``data.validation_split``,
        ``data.folds``, a tuning slice): the ``data.group_column`` value where one is read, else
        :meth:`holdout_group`."""
        return example["group"] if "group" in example else self.holdout_group(example)

    @property
    def tune_fraction(self) -> float:
        """The share of the training examples a task holds out of training to fit its decision on
        (``task=multi_label task.threshold=tune``); 0: none."""
        return 0.0

    def fit_decision(self, outputs: list[Any], examples: list[dict]) -> None:
        """Fit the decision on the held-out training slice (``tune_fraction``): its outputs and examples."""

    def fitted_options(self) -> dict:
        """Task options training resolved (tuned thresholds), saved with the model's ``task_options``
        so that a checkpoint decides as its training run did."""
        return {}

    def decision(self) -> dict | None:
        """What turns this task's logits into outputs beyond an argmax (multi-label thresholds), for
        results.json; None when nothing does."""
        return None

    def outputs_from_predictions(self, values: list[Any], examples: list[dict], path: str) -> list[Any]:
        """Another system's predicted values (action=score: one per gold example, read from ``path``) in
        this task's decode() format, checked against the task: here a label of the task's label set."""
        from tasks.outputs import check_labels

        allowed = [str(x) for x in (self.labels or sorted({str(ex["label"]) for ex in examples}))]
        outputs = [str(v) for v in values]
        check_labels(outputs, allowed, path)
        return outputs

    # ---- model side ----------------------------------------------------------------------
    def head_kwargs(self) -> dict:
        return {"num_labels": len(self.labels) if self.labels else 1}

    def head_description(self) -> str:
        """The head kind with the options this task's settings pick: ``token (crf=true)``."""
        from kotune.core.registry import describe_head

        return describe_head(self.head, self.head_options())

    def head_options(self) -> dict:
        """The head options this task's settings pick (``task.crf``: ``crf``; ``task.decode=char``:
        ``units``), part of ``head_kwargs``; shown in results.json beside the head kind."""
        return {}

    def encode(self, examples: list[dict], tokenizer, settings: EncodeSettings):
        raise NotImplementedError

    def model_columns(self, features) -> list[str]:
        keep = set(MODEL_INPUTS) | set(self.label_fields)
        return [c for c in features.column_names if c in keep]

    def decode(self, predictions, features, examples: list[dict]) -> list[Any]:
        raise NotImplementedError

    def score(self, outputs: list[Any], examples: list[dict]) -> dict[str, float]:
        raise NotImplementedError

    def ceiling(self, features, examples: list[dict]) -> tuple[dict[str, float], dict]:
        """Gold labels through encoding and decoding: (metrics, report); tasks with an alignment
        that can lose information override it."""
        from kotune.core.errors import ConfigError

        raise ConfigError(f"task {self.name} has no pipeline ceiling (it has no alignment to lose)")

    def prediction_records(self, outputs: list[Any], examples: list[dict]) -> list[dict]:
        return [{"id": ex["id"], "prediction": out} for out, ex in zip(outputs, examples)]

    # ---- requests (action=serve) ---------------------------------------------------------
    @property
    def request_fields(self) -> tuple[str, ...] | None:
        """The string fields of one input of ``action=serve`` (``text``, ``text_pair``, ...); None
        where the task's input is more than plain text."""
        return None

    def request_examples(self, items: list[dict[str, str]], source: str = "request") -> list[dict]:
        """Examples of unlabelled inputs, each a dict of :attr:`request_fields`, checked as a file's
        rows are (a DataError names ``source`` and the item)."""
        raise ConfigError(f"task {self.name} takes no plain-text requests")

    def write_outputs(self, run_dir: str, outputs: list[Any], examples: list[dict]) -> list[str]:
        """Task-specific prediction files beside predictions.jsonl (QA: predictions.json for the
        official scripts); returns the paths written."""
        return []

    @classmethod
    def export_note(cls, options: dict) -> str | None:
        """What a user of the exported model (action=export) must know about its input beyond the
        tokenizer, given the saved ``task_options``; None when plain text is its input."""
        return None

    @classmethod
    def export_fields(cls, options: dict) -> dict:
        """Fields the exported config carries for that (``kotune_windows``: how to window a document)."""
        return {}

    def encode_key(self) -> dict:
        """The task options that change encoding (part of the feature cache key)."""
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(self.cfg, resolve=True)
        return {k: v for k, v in cfg.items() if k not in ("main_metric", "greater_is_better", "recipe", "reference")}

    def describe(self) -> dict:
        return {"name": self.name, "head": self.head, **({"head_options": self.head_options()} if self.head_options() else {}),
                "labels": self.labels,
                "main_metric": self.main_metric}


# ---- splits ------------------------------------------------------------------------------
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


def load_splits(task: Task, data: DictConfig, need: tuple[str, ...], seed: int) -> dict[str, Split]:
    """Read the splits in ``need`` ('train', 'validation', 'predict'; 'select': where action=train
    selects its checkpoint when not on the validation split) from files, samples or hub."""
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
    if data.get("source") == "sample":  # the preset's files stand in for those not given
        files["train"] = files["train"] or sample_file(task.cfg, "train")
        if not holdout and not folds:
            files["validation"] = files["validation"] or sample_file(task.cfg, "validation")
    use_files = any(files[s] for s in ("train", "validation"))
    task.reading = ReadOptions(data.get("format"), data.get("quoting"))
    task.use_columns(data)
    out: dict[str, Split] = {}

    def from_file(path: str, labelled: bool = True) -> Split:
        examples = task.read_file(path, labelled=labelled)
        if not examples:  # a header alone, or blank lines: say so before any split or count
            raise DataError(path, None, "no rows (the file holds no examples)")
        return Split(examples, {"file": path, "sha256": sha256_of(path)})

    def from_hub(split: str) -> Split:
        hub = task.cfg.get("hub")
        if not hub:
            raise ConfigError(f"task {task.name} has no hub dataset: set data.train_file=... "
                              "(and data.validation_file=...) or use data=sample")
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

    if "predict" in need:
        if not files["predict"]:
            raise ConfigError("action=predict needs data.predict_file=FILE")
        out["predict"] = from_file(files["predict"], labelled=False)
    if wants and use_files:
        if "train" in wants and not files["train"]:
            raise ConfigError("data.validation_file is set but data.train_file is not")
        if files["train"] and ("train" in wants or not files["validation"]):
            train = from_file(files["train"])
            if files["validation"]:
                out["train"] = train
                if "validation" in wants:
                    out["validation"] = from_file(files["validation"])
            elif folds:
                fold_seed = int(data.get("fold_seed") or 0)
                stratify = data.get("fold_stratify", True)
                out["train"], out["validation"] = _fold(train, *folds, fold_seed, task.split_group,
                                                        (lambda ex: fold_stratum(task, ex)) if stratify else
                                                        (lambda ex: None))
                if selection == "inner" and "select" in need:  # checkpoints selected here, never on the fold scored
                    out["train"], out["select"] = _holdout(out["train"], float(data.get("inner_split") or 0.1),
                                                           fold_seed, task.split_group, name="select")
            elif holdout > 0:
                out["train"], out["validation"] = _holdout(train, holdout, seed, task.split_group)
            else:
                raise ConfigError("only data.train_file is given: add data.validation_file=FILE, "
                                  "data.validation_split=0.2 to hold out a seeded fraction, or "
                                  "data.folds=5 data.fold=0 for a cross-validation fold")
        elif "validation" in wants:
            out["validation"] = from_file(files["validation"])
    elif wants:
        for split in wants:
            out[split] = from_hub("train" if split == "train" else data.get("hub_validation_split",
                                                                           "validation"))
    for split, limit in (("train", data.get("max_train_samples")),
                         ("validation", data.get("max_eval_samples"))):
        if split in out and limit:
            out[split].examples = out[split].examples[: int(limit)]
            out[split].source["max_samples"] = int(limit)
    if "train" in out and task.tune_fraction:  # out of training, never the validation split's
        out["train"], out["tune"] = _holdout(out["train"], task.tune_fraction, seed, task.split_group,
                                             name="tune")
    for split, s in out.items():
        if not s.examples:
            raise DataError(s.where, None, f"no examples in the {split} split")
    return out


def _holdout(train: Split, fraction: float, seed: int, group=lambda ex: None,
             name: str = "validation") -> tuple[Split, Split]:
    """A seeded ``fraction`` of whole groups (``Task.split_group``; rows without one are groups of
    one, split exactly as a shuffle of the rows); ``name``: validation (``data.validation_split``)
    or tune (a task's ``tune_fraction``) or select (``data.inner_split``, ``data.fold_selection=inner``)."""
    option = {"validation": "data.validation_split", "tune": "task.tune_fraction", "select": "data.inner_split"}[name]
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


def fingerprint(obj: Any) -> str:
    """A stable hash of plain data (examples, settings)."""
    blob = json.dumps(obj, ensure_ascii=False, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        # truncation/padding are what the last call left behind, not the tokenizer's identity
        state = json.dumps({k: v for k, v in state.items() if k not in ("truncation", "padding")}, sort_keys=True)
    else:
        state = json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256(f"{type(tokenizer).__name__}|{state}".encode()).hexdigest()


ENCODE_VERSION = 1  # bump when an encoder's output changes, to invalidate cached features


def encode_cached(task: Task, examples: list[dict], tokenizer, settings: EncodeSettings,
                  cache_dir: str | None):
    """Tokenize once: features are stored on disk keyed by examples, tokenizer and settings."""
    import datasets

    key = fingerprint({"v": ENCODE_VERSION, "task": type(task).__name__, "encode": task.encode_key(), "labels": task.labels,
                       "examples": fingerprint(examples), "tok": tokenizer_fingerprint(tokenizer),
                       "settings": settings.__dict__})[:24]
    path = os.path.join(cache_dir, "features", f"{task.name}-{key}") if cache_dir else None
    if path and os.path.exists(os.path.join(path, "dataset_info.json")):
        try:
            features = datasets.load_from_disk(path)
            log(f"features: reused {len(features)} cached rows ({path})")
            return features
        except Exception as e:  # noqa: BLE001 - a broken cache is rebuilt, never fatal
            log(f"warning: cached features at {path} unreadable ({e}); rebuilding")
    features = task.encode(examples, tokenizer, settings)
    if path:
        tmp = f"{path}.tmp{os.getpid()}"
        with _no_progress():
            features.save_to_disk(tmp)
        if os.path.exists(path):
            import shutil
            shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        features = datasets.load_from_disk(path)
    return features


class _no_progress:
    """Silence datasets' progress bars for bookkeeping steps (saving a cache is not news)."""

    def __enter__(self):
        import datasets

        self.was = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()

    def __exit__(self, *exc):
        import datasets

        if self.was:
            datasets.enable_progress_bars()
