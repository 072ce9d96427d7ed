"""kotune: fine-tune Korean BERT-family encoders. The command line is ``python run.py …`` (or
``kotune …``); the Python API and the plug-in surface are here:

    import kotune
    run = kotune.train("task=nli", "model=tiny", "data=sample")   # a Run: .dir, .results, .metrics
    kotune.evaluate(run, data="dev.tsv")
    predict = kotune.load(run.dir)                                 # a Predictor
    predict(["문장 하나", "문장 둘"])                                 # predictions.jsonl's records

    @kotune.register_task("my_task")        # plug-ins: docs/development/plugins.md
    class MyTask(kotune.ClassificationTask): ...

Importing the package is light (no torch, nothing of kotune's but its ground floor): the API and the
base classes load on first use, so that kotune.core (the ground floor tasks/ and heads/ import)
never pulls the layers above it in (tests/test_layout.py). conf/'s resolvers are registered by
kotune/cli/config.py, which everything that composes conf/ imports.
"""
from __future__ import annotations

from kotune.core.registry import register_exporter, register_head, register_runtime, register_task

__all__ = ["train", "evaluate", "load", "Run", "Predictor", "Task", "TaskOption", "ClassificationTask", "TokenTask", "Head",
           "Exporter", "Runtime", "register_task", "register_head", "register_exporter", "register_runtime"]


def __getattr__(name: str):
    """The API and the base classes a plug-in subclasses, imported when first asked for."""
    if name in ("train", "evaluate", "load", "Run", "Predictor"):
        from kotune import api
        return getattr(api, name)
    if name == "Task":
        from tasks.base import Task
        return Task
    if name == "TaskOption":
        from tasks.base import TaskOption
        return TaskOption
    if name == "ClassificationTask":
        from tasks.classification import ClassificationTask
        return ClassificationTask
    if name == "TokenTask":
        from tasks.ner import TokenTask
        return TokenTask
    if name == "Head":
        from heads.base import Head
        return Head
    if name in ("Exporter", "Runtime"):  # an export format, a runtime: kotune/core/backends.py (no torch)
        from kotune.core import backends
        return getattr(backends, name)
    raise AttributeError(f"module 'kotune' has no attribute '{name}'")
