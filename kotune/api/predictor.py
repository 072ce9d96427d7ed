"""``kotune.load(path)``'s :class:`Predictor`: raw inputs in, predictions.jsonl's records out.

It is ``action=serve``'s predictor (kotune/serving/app.py) without the server: the inputs checked as a
request's items are (kotune/serving/requests.py), turned into the task's examples, encoded, predicted
in length-sorted batches and decoded by the same code that writes predictions.jsonl
(kotune/inference/predict.py). A record is what predictions.jsonl holds for that input, without the ``id``
(and without ``gold``: an input has no answer). :meth:`Predictor.embed` runs ``action=embed``
(kotune/actions/embed.py) on the texts in a temporary run directory."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from kotune.api.compose import compose_job, run_job
from kotune.core.errors import KotuneError
from kotune.core.log import without_lines_naming


class Predictor:
    """The model of a run directory, its ``model/``, an ONNX export or a native (transformers)
    export, behind a call from inputs to records: ``predictor(["문장", …])``. An input is a string
    (single-text tasks) or a dict of the task's fields (:attr:`fields`: ``text`` and ``text_pair``
    for pairs, ``question`` and ``context`` for QA); one input alone gives one record."""

    def __init__(self, path: str, overrides: list[str] | None = None):
        from kotune.api.native import native_predictor
        from kotune.export.native_card import is_native_export
        from kotune.inference.model_runtimes import runtime_of

        self.path, self.overrides = str(path), list(overrides or [])
        self.kind = "native" if is_native_export(self.path) else "kotune"
        if self.kind == "native":
            self.served = native_predictor(self.path, self.overrides)
        else:
            from kotune.serving.app import Predictor as ServingPredictor

            self.served = ServingPredictor(compose_job(["action=predict", f"checkpoint={self.path}", *self.overrides]))
            self.kind = runtime_of(self.served.b.model).kind  # kotune (a checkpoint) or onnx (an export)

    @property
    def task(self) -> str:
        return self.served.b.task.name

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields of one input (``Task.request_fields``)."""
        return tuple(self.served.fields)

    @property
    def labels(self) -> list | None:
        return self.served.b.task.labels

    def describe(self) -> dict:
        return {**self.served.describe(), "path": self.path, "kind": self.kind}

    def __call__(self, inputs: str | dict | list) -> dict | list[dict]:
        """The records predictions.jsonl would hold for ``inputs`` (a list: one record each, in
        order; one string or dict: its record). A bad input is one :class:`KotuneError` line
        naming it."""
        from kotune.serving.requests import RequestError, request_items

        single = isinstance(inputs, (str, dict))
        raw = [inputs] if single else list(inputs)
        if not raw:
            return []
        try:
            items, _ = request_items({"inputs": raw}, self.fields, max_items=len(raw))
        except RequestError as e:
            raise KotuneError(f"predict: {e}") from None
        records = self.served(self.served.examples(items))
        return records[0] if single else records

    def embed(self, texts: str | list[str], *overrides: str) -> Any:
        """Sentence vectors of ``texts`` (a numpy array, one row each: ``action=embed`` with the
        checkpoint's layers and pooling; ``overrides`` such as ``mode.pooling=mean``). Only a
        kotune checkpoint has an encoder to read: an export is refused in one line."""
        import numpy as np

        if self.kind != "kotune":
            raise KotuneError(f"embed: {self.path} is {'an ONNX' if self.kind == 'onnx' else 'a native'} export, "
                              "which gives the head's outputs only; load the run directory it was exported from")
        single = isinstance(texts, str)
        rows = [texts] if single else list(texts)
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        bad = next((i for i, t in enumerate(rows) if not isinstance(t, str) or not t.strip()), None)
        if bad is not None:
            raise KotuneError(f"embed: item {bad}: empty or non-text value {rows[bad]!r}")
        with tempfile.TemporaryDirectory(prefix="kotune-embed-") as folder:
            source = os.path.join(folder, "texts.jsonl")
            with open(source, "w", encoding="utf-8") as f:
                f.writelines(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in rows)
            with without_lines_naming(folder):  # the job's files live here until the vectors are read, then go
                results, run_dir = run_job(["action=embed", f"checkpoint={self.path}", f"embed.input={source}",
                                            "embed.column=text", *self.device_overrides(), *overrides],
                                           os.path.join(folder, "run"))
            vectors = np.load(results["embeddings_file"])
        return vectors[0] if single else vectors

    def device_overrides(self) -> list[str]:
        """The ``predict.*`` overrides the predictor was loaded with (device, precision): ``embed`` runs there too."""
        return [o for o in self.overrides if o.lstrip("+").startswith("predict.")]

    def __repr__(self) -> str:
        return f"Predictor({self.path!r}, task={self.task!r}, kind={self.kind!r})"
