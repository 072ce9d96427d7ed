"""The teacher's logits on the training rows, computed once and kept on disk (``action=distill``),
in the frozen feature cache's format and with its checks (heads/model/feature_cache.py): a
directory ``<cache_dir>/distill/<task>-<key>/`` with ``states.npy`` [n_slots, 1, C] (float32),
``offsets.npy`` and ``meta.json`` written last. The key covers the teacher's weights, the rows'
model inputs and the head's kind, so another teacher, other data or another head is a miss; a
truncated or stale directory is rebuilt with a warning. Each row keeps its slots only (one per
example; a token row's labelled slots; a span row's positions), and every epoch, run and sweep
trial after the first reads them from there."""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from heads.distill.loss import teacher_rows
from heads.model.inference import Inference, resolve
from heads.model.feature_cache import (CacheSettings, CachedInputs, FeatureStore, _build, _locked, data_digest,
                                       row_lengths, validate, weights_digest)
from kotune.core.errors import ConfigError
from kotune.core.log import log

TEACHER_CACHE_VERSION = 1
COLUMN = "teacher_logits"  # the batch key the distillation loss reads (kotune/distill/trainer.py)


class TeacherCacheSettings(CacheSettings):
    @property
    def root(self) -> str:
        return os.path.join(self.cache_dir, "distill")


@dataclass
class TeacherSource:
    """What the cache asks of a teacher, whatever runs it (a KotuneModel here; an ONNX or a native
    export in kotune/distill/teacher.py): its head's logits of one padded batch, and what names it."""
    logits: Callable[..., Any]  # (input_ids, attention_mask, token_type_ids, **extra columns) → logits, as the head gives them
    digest: str                 # its weights: another teacher is another key
    description: str            # its head, as kotune describes it
    pad_id: int
    inference: Inference  # where its batches run (predict.device, predict.precision): heads/model/inference.py


def kotune_teacher(model, inference: Inference | None = None) -> TeacherSource:
    """A KotuneModel as a teacher: run on ``inference``'s device (None: the GPU where there is one),
    moved there at its first batch (a cache hit never moves it)."""
    inference = inference or resolve()
    moved = []

    def logits(input_ids, attention_mask, token_type_ids=None, **extra_inputs):
        if not moved:
            moved.append(inference.place(model))
        return model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                     **extra_inputs)["logits"]

    return TeacherSource(logits, weights_digest(model), model.head_description(),
                         getattr(model.encoder.config, "pad_token_id", None) or 0, inference)


def _column_lengths(features, column: str) -> np.ndarray:
    table = features.select_columns([column]).with_format("arrow")[:]
    return np.concatenate([np.asarray(c.value_lengths()) for c in table.column(column).chunks]
                          or [np.zeros(0, dtype=np.int64)]).astype(np.int64)


def slot_lengths(kind: str, head, features) -> np.ndarray:
    """Each row's logit slots: 1 per example, a token row's label slots, a span row's positions
    (its characters with ``units=char``, else its tokens)."""
    if kind == "positions":
        return _column_lengths(features, "labels")
    if kind == "span":
        char = getattr(head, "units", "token") == "char"
        return _column_lengths(features, "char_token_index") if char else row_lengths(features)
    return np.ones(len(features), dtype=np.int64)


def logit_width(kind: str, head) -> int:
    return {"span": 2, "regression": 1}.get(kind) or int(head.out.out_features)


def cached_teacher_logits(teacher: TeacherSource, head, kind: str, inputs: dict, settings: TeacherCacheSettings,
                          name: str) -> tuple[dict[str, CachedInputs], dict]:
    """``inputs`` (split → ``datasets.Dataset`` of model columns) with the teacher's logits as the
    ``teacher_logits`` column of every row; and a report (per split: hit, miss or rebuilt, seconds).
    ``head``: the student's (the teacher's kind, options and labels: checked before), which gives
    the slots and width of the logits and the extra columns the heads read."""
    try:
        os.makedirs(settings.root, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cache_dir={settings.cache_dir}: cannot write the teacher's logits there "
                          f"({e.strerror or e}); set cache_dir=A_WRITABLE_DIR") from None
    extra = tuple(head.extra_inputs)
    shape = (1, logit_width(kind, head))
    base = {"v": TEACHER_CACHE_VERSION, "weights": teacher.digest, "kind": kind, "width": shape[1],
            "head": teacher.description, "dtype": settings.dtype}
    if teacher.inference.precision != "fp32":  # bf16/fp16 logits are other logits (fp32 keeps the keys it had)
        base["precision"] = teacher.inference.precision

    def logits(input_ids, attention_mask, token_type_ids=None, **extra_inputs):
        return teacher_rows(kind, teacher.logits(input_ids, attention_mask, token_type_ids, **extra_inputs))

    out, report = {}, {"dir": settings.root, "splits": {}}
    for split, features in inputs.items():
        lengths = slot_lengths(kind, head, features)
        columns = [c for c in ("input_ids", "attention_mask", "token_type_ids", "labels", *extra)
                   if c in features.column_names and pa.types.is_list(features.data.schema.field(c).type)]
        parts = dict(base, data=data_digest(features, columns))
        key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        path = os.path.join(settings.root, f"{name}-{key[:24]}")
        started, status = time.time(), "hit"
        with _locked(path):
            why = validate(path, key, lengths, shape, settings.dtype) if os.path.exists(path) else "absent"
            if why:
                status = "miss" if why == "absent" else "rebuilt"
                if status == "rebuilt":
                    log(f"warning: teacher logits {path} are unusable: {why}; computing them again")
                _build(logits, features, path, key, parts, lengths, shape, settings, teacher.pad_id, teacher.inference,
                       what=f"teacher logits {split}", extra=extra)
        out[split] = CachedInputs(features, FeatureStore(path), key=COLUMN)
        report["splits"][split] = {"status": status, "path": path, "rows": len(lengths),
                                   "seconds": round(time.time() - started, 3)}
        log(f"teacher logits {split}: {status}, {len(lengths):,} rows, {int(lengths.sum()):,} slots × {shape[1]}")
    report["seconds"] = round(sum(s["seconds"] for s in report["splits"].values()), 3)
    return out, report
