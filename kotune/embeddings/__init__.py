"""The bi-encoder (``task=sentence_embedding``, tasks/sentence_embedding.py): its model trains as a
SentenceTransformer (sentence-transformers' losses, trainer and save format) on kotune's encoder, so
the actions that read or write its model run here; kotune/cli/job.py hands them over. The actions
that make no sense for sentence vectors refuse in one line (:data:`REFUSED`).

- train.py: ``action=train`` (SentenceTransformerTrainer, one stage per ``task.stages`` file);
- vectors.py: ``action=eval | predict | embed`` of a checkpoint, kotune's own batched embeddings;
- export.py: ``export.format=sentence_transformers``; onnx.py: ONNX (fp32, int8) of the bi-encoder;
- ``action=serve`` is kotune's own (kotune/serving/app.py): ``POST /embed`` (and /predict), a vector per text.
"""
from __future__ import annotations

import importlib
from typing import Callable

from omegaconf import DictConfig

from kotune.core.errors import ConfigError

REFUSED = {
    "ceiling": "a sentence vector has no token alignment to lose",
    "score": "its predictions are vectors and similarities, scored by action=eval on a labelled file",
    "probe": "it trains classifier heads per layer; for sentence vectors by layer see bench/embeddings.py",
    "label_issues": "it looks for wrong class labels, and pairs and triplets have no class",
}


def runs_here(cfg: DictConfig) -> bool:
    """Whether ``cfg.task`` is a task whose actions run in this package (its ``runner``)."""
    from tasks import TASKS

    kind = cfg.task.get("kind") or cfg.task.get("name")
    return getattr(TASKS.get(kind, None), "runner", None) == "sentence_transformers"


# action → "module:function" that runs it, imported when called (as kotune/actions/__init__.py's ACTIONS:
# the command line answers a config mistake before torch loads)
RUNS = {"train": "kotune.embeddings.train:run", "eval": "kotune.embeddings.vectors:evaluate",
        "predict": "kotune.embeddings.vectors:predict", "embed": "kotune.embeddings.vectors:embed"}
# kotune's own action serves the bi-encoder: pretrain reads text alone; export writes a registered format
# (export.format=sentence_transformers among them), except ONNX, whose graph is the bi-encoder's own; serve
# answers POST /predict and /embed with the task's decoding (an embedding per text)
OWN = ("pretrain", "export", "serve")


def action_for(cfg: DictConfig) -> Callable[[DictConfig, str], dict] | None:
    """The function that runs ``cfg.action`` for the bi-encoder; None where kotune's own action serves
    it (:data:`OWN`). A refused action is one line saying why."""
    if cfg.action in REFUSED:
        raise ConfigError(f"action={cfg.action} does not apply to task={cfg.task.name}: {REFUSED[cfg.action]}")
    target = RUNS.get(cfg.action)
    if cfg.action == "export" and str(cfg.export.get("format")) == "onnx":
        target = "kotune.embeddings.onnx:export_onnx"
    if target is None:
        if cfg.action in OWN:
            return None
        raise ConfigError(f"action={cfg.action} does not apply to task={cfg.task.name} (a bi-encoder: "
                          f"{', '.join([*RUNS, *OWN])})")
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)
