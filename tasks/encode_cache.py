"""The encode cache: a task's features stored on disk, keyed by a fingerprint of the examples, the
tokenizer and the encode settings, so that a second run with the same inputs tokenizes nothing."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from kotune.core.log import log
from tasks.base import EncodeSettings, Task


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
                  cache_dir: str | None, tokenizer_key: str | None = None):
    """Tokenize once: features are stored on disk keyed by examples, tokenizer and settings.
    ``tokenizer_key``: the tokenizer's :func:`tokenizer_fingerprint`, where the caller has it (one per
    build, not one per split: it serialises the whole vocabulary)."""
    import datasets

    key = fingerprint({"v": ENCODE_VERSION, "task": type(task).__name__, "encode": task.encode_key(), "labels": task.labels,
                       "examples": fingerprint(examples), "tok": tokenizer_key or tokenizer_fingerprint(tokenizer),
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
