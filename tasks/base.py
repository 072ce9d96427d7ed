"""What every task provides: the Task protocol, its options and encode settings, and the names both
sides of the model share (MODEL_INPUTS, IGNORE, a file's column roles). The data plumbing the tasks
share lives beside it: tasks/splits.py (splits, holdout, folds), tasks/encode_cache.py (features on disk).

A task turns files or hub rows into *examples* (plain dicts with an ``id``), examples into
*features* (a ``datasets.Dataset`` holding the model inputs plus whatever decoding needs), model
outputs back into task outputs, and outputs into metrics. It never builds a module.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from omegaconf import DictConfig, ListConfig

from kotune.core.errors import ConfigError
from kotune.core.log import log
from tasks.io import ReadOptions, has_columns

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
    and comparisons, the probabilities for predictions.jsonl (and RE's AUPRC in action=score).
    ``exact``: the same at full precision where ``probabilities`` are rounded for reading (what
    abstention and its risk–coverage curve rank by: rounding ties rows that are not tied)."""

    def __new__(cls, label: str, probabilities: Any, exact: Any = None):
        obj = super().__new__(cls, label)
        obj.probabilities = probabilities
        obj.exact = exact
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
    # loader adds them to the tokenizer and resizes the encoder's embeddings (heads/model/encoder.py)
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
        # the columns a checkpoint's task read in training (kotune/loading/build.py use_saved_columns): they
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

    # data.labels=[…] pins the label set of a task that otherwise learns it from the training file
    # (tasks/splits.py pin_labels): a label outside it is refused where it is read
    labels_pinnable: bool = False

    def label_rows(self, examples: list[dict]) -> list[tuple[Any, list[str]]]:
        """(row, its labels) per training example, for the rare-label warning (tasks/label_typos.py);
        none for tasks whose labels are not learned as a set of names."""
        return []

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

    def abstention_refusal(self) -> str | None:
        """Why ``predict.min_confidence`` (abstention: tasks/abstention.py) does not apply to this
        task, one clause; None where it does (:meth:`top_predictions` then gives what it reads)."""
        return "has no single class with a probability per example (abstention is for single-label classification)"

    def top_predictions(self, outputs: list[Any]) -> list[tuple[str, float]]:
        """Per output, the predicted class and its probability (``predict.min_confidence``)."""
        raise NotImplementedError

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

    # action=serve's POST paths for this task's requests (kotune/serving/app.py; a bi-encoder adds /embed)
    serve_paths: tuple[str, ...] = ("/predict",)

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
