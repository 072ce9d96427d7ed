"""Frozen feature cache: run the frozen encoder over a split once, keep its states on disk, and
train the head on them for every epoch, run and sweep job after that.

One split's cache is a directory ``<cache_dir>/frozen/<task>-<key>/``:

- ``states.npy``  [n_tokens, K, H] (fp16 by default) — real tokens only, rows laid end to end
  (ragged), K = 1 for a fixed layer choice (pre-averaged) or every layer for ``scalar_mix``;
- ``offsets.npy`` [n_rows + 1] — row i is ``states[offsets[i]:offsets[i+1]]``;
- ``meta.json``   — the full key, shapes, sizes and a checksum, written last (a directory without
  it is an interrupted build).

The key covers the encoder's weights and config, the tokenizer, the token ids themselves (data and
``max_length``), the layer choice and the dtype, so any change is a miss rather than a stale hit.
A directory whose meta, sizes or checksum do not match is rebuilt with a warning. What is cached is
the generic ``KotuneModel.layer_states`` output, so every head (sequence, pair, token, span) trains
on it unchanged: the dataset rows keep all their columns and gain ``layer_states``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from heads.model.inference import Inference, token_batches
from heads.model.layers import LayerSpec
from kotune.core.errors import ConfigError
from kotune.core.log import log

CACHE_VERSION = 1
DTYPES = {"float16": np.float16, "float32": np.float32}
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
GB = 1e9


@dataclass
class CacheSettings:
    cache_dir: str
    dtype: str = "float16"
    max_gb: float = 20.0
    batch_size: int = 64

    @property
    def root(self) -> str:
        return os.path.join(self.cache_dir, "frozen")


# ---- fingerprints ---------------------------------------------------------------------------
def weights_digest(module: torch.nn.Module, skip: tuple[str, ...] = ()) -> str:
    """Hash of every parameter and buffer (but those whose names start with ``skip``): a fine-tuned,
    re-seeded or different checkpoint is a different encoder even under the same name."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(module.state_dict().items()):
        if name.startswith(skip):
            continue
        t = tensor.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(memoryview(t.view(torch.uint8).numpy()) if t.numel() else b"")
    return h.hexdigest()


def data_digest(features, columns: list[str]) -> str:
    """Hash of the token-level encoder inputs (ids, masks) of a ``datasets.Dataset``."""
    h = hashlib.blake2b(digest_size=16)
    table = features.select_columns(columns).with_format("arrow")[:]  # applies any row selection
    for name in columns:
        h.update(name.encode())
        for chunk in table.column(name).chunks:
            h.update(np.asarray(chunk.value_lengths()).tobytes())
            h.update(np.asarray(chunk.flatten()).tobytes())
    return h.hexdigest()


def row_lengths(features) -> np.ndarray:
    table = features.select_columns(["input_ids"]).with_format("arrow")[:]
    return np.concatenate([np.asarray(c.value_lengths()) for c in table.column("input_ids").chunks]
                          or [np.zeros(0, dtype=np.int64)]).astype(np.int64)


def _file_checksum(path: str, block: int = 1 << 20) -> str:
    """blake2b of the first, middle and last MiB and the size: catches truncation and most
    overwrites without reading gigabytes."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(digest_size=16)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        for start in sorted({0, max(0, size // 2 - block // 2), max(0, size - block)}):
            f.seek(start)
            h.update(f.read(block))
    return h.hexdigest()


# ---- one split on disk ------------------------------------------------------------------------
class FeatureStore:
    """Read side of one split's cache. The memory map opens lazily (per DataLoader worker)."""

    def __init__(self, path: str):
        self.path = path
        with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
            self.meta = json.load(f)
        self.offsets = np.load(os.path.join(path, "offsets.npy"))
        self._states = None

    @property
    def states(self) -> np.ndarray:
        if self._states is None:
            # copy-on-write: rows come back writable (torch.from_numpy wants that), the file never changes
            self._states = np.load(os.path.join(self.path, "states.npy"), mmap_mode="c")
        return self._states

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, i: int) -> np.ndarray:
        """[T_i, K, H], a view into the map: nothing is read until it is used."""
        return self.states[self.offsets[i]: self.offsets[i + 1]]

    def __getstate__(self):
        return dict(self.__dict__, _states=None)


class CachedInputs(torch.utils.data.Dataset):
    """The split's model-input rows, each with its cached ``layer_states`` ([T, K, H]); with
    ``spec``, the cache holds every hidden state and each row is reduced to what ``spec`` stores."""

    def __init__(self, features, store: FeatureStore, spec: LayerSpec | None = None, key: str = "layer_states"):
        if len(features) != len(store):
            raise ValueError(f"{store.path}: {len(store)} cached rows for {len(features)} features")
        every_state = list(range(store.meta["shape"][1]))
        if spec is not None and store.meta["key_parts"]["layers"] != every_state:
            raise ValueError(f"{store.path}: holds layers {store.meta['key_parts']['layers']}, not every "
                             f"hidden state, so it cannot serve mode.layers={spec.describe()}")
        self.features, self.store, self.spec, self.key = features, store, spec, key

    def reading(self, spec: LayerSpec) -> "CachedInputs":
        """The same rows for another layer choice (a cache of every hidden state: ``action=probe``)."""
        return CachedInputs(self.features, self.store, spec, self.key)

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)  # ends iteration by the sequence protocol (Trainer's length sampler)
        return dict(self.features[int(i)], **{self.key: self.states(int(i))})

    def __getitems__(self, indices: list[int]) -> list[dict]:
        """A batch's rows (the DataLoader asks for them together): the features read in one call."""
        if any(not 0 <= i < len(self) for i in indices):
            raise IndexError(indices)
        columns = self.features[[int(i) for i in indices]]
        return [dict({name: values[j] for name, values in columns.items()}, **{self.key: self.states(int(i))})
                for j, i in enumerate(indices)]

    def states(self, i: int) -> np.ndarray:
        states = self.store.row(i)
        if self.spec is not None:  # only the chosen states leave the map
            chosen = torch.from_numpy(np.asarray(states[:, list(self.spec.indices)], dtype=np.float32))
            states = self.spec.select(dict(zip(self.spec.indices, chosen.unbind(-2)))).numpy()
        return states


def validate(path: str, key: str, lengths: np.ndarray, shape: tuple[int, int], dtype: str) -> str | None:
    """Why the cache at ``path`` cannot be used (None: it can)."""
    try:
        with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        return "meta.json missing (an interrupted build)"
    except (OSError, ValueError) as e:
        return f"meta.json unreadable ({e})"
    if meta.get("key") != key or meta.get("version") != CACHE_VERSION:
        return "its key or format differs (stale)"
    if meta.get("rows") != len(lengths) or meta.get("tokens") != int(lengths.sum()) \
            or tuple(meta.get("shape", ())) != (int(lengths.sum()), *shape) or meta.get("dtype") != dtype:
        return "rows, tokens or shape differ from the data (stale)"
    states = os.path.join(path, "states.npy")
    try:
        offsets = np.load(os.path.join(path, "offsets.npy"))
        size = os.path.getsize(states)
    except (OSError, ValueError) as e:
        return f"unreadable ({e})"
    if not np.array_equal(np.diff(offsets), lengths):
        return "row offsets differ from the data (stale)"
    if size != meta.get("file_bytes"):
        return f"states.npy has {size:,} bytes, expected {meta.get('file_bytes'):,} (truncated or replaced)"
    if _file_checksum(states) != meta.get("checksum"):
        return "states.npy checksum differs (corrupt)"
    return None


@contextlib.contextmanager
def _locked(path: str):
    """One builder per cache entry across parallel sweep jobs and DDP ranks."""
    import fcntl

    with open(f"{path}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_writable(settings: CacheSettings) -> None:
    try:
        os.makedirs(settings.root, exist_ok=True)
        probe = os.path.join(settings.root, f".probe{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"cache_dir={settings.cache_dir}: cannot write the frozen feature cache there "
                          f"({e.strerror or e}); set cache_dir=A_WRITABLE_DIR or mode.cache=false") from None


# ---- encoding ---------------------------------------------------------------------------------
StatesFn = Callable[..., torch.Tensor]


def iter_states(states_fn: StatesFn, features, *, pad_token_id: int, batch_size: int, inference: Inference,
                what: str, extra: tuple[str, ...] = (),
                batch_tokens: int | None = None) -> Iterator[tuple[list[int], np.ndarray]]:
    """Run ``states_fn`` (ids, mask, token types, and the ``extra`` columns by name → a batch-first
    tensor, e.g. [B, T, K, H]) over ``features`` in length-sorted batches (``batch_size`` rows, or as
    many as keep rows × padded length within ``batch_tokens``) through ``inference``'s one forward
    (heads/model/inference.py: its device and precision, no grad); yields each batch's row indices and
    output (float32 numpy). Logs progress."""
    from tasks.collate import DynamicPaddingCollator

    columns = [c for c in ENCODER_INPUTS + tuple(extra) if c in features.column_names]
    inputs = features.select_columns(columns)
    lengths = row_lengths(features)
    order = np.argsort(lengths, kind="stable").tolist()  # similar lengths together: little padding
    collate = DynamicPaddingCollator(pad_token_id, 8)
    started = last = time.time()
    done = 0
    for span in token_batches([(1, int(lengths[i])) for i in order], batch_tokens, batch_size, collate.multiple):
        rows = order[span.start: span.stop]
        batch = collate([inputs[i] for i in rows])
        yield rows, inference.forward(states_fn, batch["input_ids"], batch["attention_mask"],
                                      batch.get("token_type_ids"), **{k: batch[k] for k in extra if k in batch})
        done += len(rows)
        if time.time() - last > 10 or done == len(order):
            last = time.time()
            rate = done / max(last - started, 1e-9)
            log(f"{what}: {done:,}/{len(order):,} rows ({done / len(order):.0%}), {rate:,.1f} rows/s")


def _build(states_fn: StatesFn, features, path: str, key: str, parts: dict, lengths: np.ndarray,
           shape: tuple[int, int], settings: CacheSettings, pad_token_id: int, inference: Inference, what: str,
           extra: tuple[str, ...] = ()) -> None:
    from kotune.core.files import write_json_atomic

    tmp = f"{path}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    states_path = os.path.join(tmp, "states.npy")
    store = np.lib.format.open_memmap(states_path, mode="w+", dtype=DTYPES[settings.dtype],
                                      shape=(int(offsets[-1]), *shape))
    for rows, states in iter_states(states_fn, features, pad_token_id=pad_token_id,
                                    batch_size=settings.batch_size, inference=inference, what=what, extra=extra):
        for j, i in enumerate(rows):
            store[offsets[i]: offsets[i + 1]] = states[j, : lengths[i]]
    store.flush()
    del store
    np.save(os.path.join(tmp, "offsets.npy"), offsets)
    write_json_atomic(os.path.join(tmp, "meta.json"), {
        "key": key, "version": CACHE_VERSION, "rows": len(lengths), "tokens": int(offsets[-1]),
        "shape": [int(offsets[-1]), *shape], "dtype": settings.dtype,
        "file_bytes": os.path.getsize(states_path), "checksum": _file_checksum(states_path),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "key_parts": {k: v for k, v in parts.items() if k != "config"}})
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def cached_inputs(model, inputs: dict, identity: dict, settings: CacheSettings, *,
                  name: str) -> tuple[dict[str, CachedInputs], dict]:
    """Cache ``model.layer_states`` for every split in ``inputs`` (``datasets.Dataset`` of model
    columns) and return datasets that feed them to ``model.forward(layer_states=...)``.

    ``identity``: what the caller knows about the run that the weights do not say (tokenizer
    fingerprint, max_length, model name). Returns the datasets and a report for results.json."""
    if settings.dtype not in DTYPES:
        raise ConfigError(f"mode.cache_dtype={settings.dtype}: choose one of {', '.join(DTYPES)}")
    if not model.frozen:
        raise ConfigError("mode.cache=true needs a frozen encoder (mode=frozen): a fine-tuned encoder's "
                          "features change every step; set mode.cache=false")
    ensure_writable(settings)
    spec = model.mixer.spec
    shape = (spec.stored, int(model.config.hidden_size))
    itemsize = np.dtype(DTYPES[settings.dtype]).itemsize
    base = {"v": CACHE_VERSION, "weights": weights_digest(model.encoder),
            "config": model.encoder.config.to_json_string(use_diff=False), "identity": identity,
            "layers": list(spec.indices), "stored": spec.stored, "dtype": settings.dtype}
    plan = {}
    for split, features in inputs.items():
        columns = [c for c in ENCODER_INPUTS if c in features.column_names]
        lengths = row_lengths(features)
        parts = dict(base, data=data_digest(features, columns))
        key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        plan[split] = (key, lengths, int(lengths.sum()) * shape[0] * shape[1] * itemsize, parts)
    total = sum(p[2] for p in plan.values())
    if total > settings.max_gb * GB:
        parts = ", ".join(f"{s} {p[2] / GB:.2f} GB" for s, p in plan.items())
        raise ConfigError(f"mode.cache_max_gb={settings.max_gb:g}: the frozen features need {total / GB:.2f} GB "
                          f"({parts}; {shape[0]} state(s) × {shape[1]} per token, {settings.dtype}); raise "
                          "mode.cache_max_gb, choose fewer layers than scalar_mix, or set mode.cache=false")

    on = Inference("cuda" if torch.cuda.is_available() else "cpu")  # training's device; fp32 (settings.dtype is kept)
    pad_id = getattr(model.encoder.config, "pad_token_id", None) or 0
    out, report = {}, {"dir": settings.root, "dtype": settings.dtype, "states_per_token": shape[0],
                       "splits": {}}
    was_training = model.training
    model.eval()
    try:
        for split, features in inputs.items():
            key, lengths, nbytes, parts = plan[split]
            path = os.path.join(settings.root, f"{name}-{key[:24]}")
            started = time.time()
            with _locked(path):
                status = "hit"
                if os.path.exists(path):
                    why = validate(path, key, lengths, shape, settings.dtype)
                    if why:
                        log(f"warning: frozen cache {path} is unusable: {why}; rebuilding")
                        status = "rebuilt"
                else:
                    status = "miss"
                if status != "hit":
                    free = shutil.disk_usage(settings.root).free
                    if nbytes > free:
                        raise ConfigError(f"cache_dir={settings.cache_dir}: {nbytes / GB:.2f} GB of frozen "
                                          f"features do not fit in {free / GB:.2f} GB free; set "
                                          "cache_dir=ELSEWHERE or mode.cache=false")
                    model.to(on.device)
                    _build(model.layer_states, features, path, key, parts, lengths, shape, settings,
                           pad_id, on, what=f"frozen cache {split}")
            store = FeatureStore(path)
            out[split] = CachedInputs(features, store)
            seconds = time.time() - started
            report["splits"][split] = {"status": status, "path": path, "rows": len(lengths),
                                       "tokens": int(lengths.sum()), "bytes": nbytes,
                                       "seconds": round(seconds, 3)}
            log(f"frozen cache {split}: {status}, {len(lengths):,} rows, {int(lengths.sum()):,} tokens × "
                f"{shape[0]} state(s) × {shape[1]} = {nbytes / 1e6:,.1f} MB {settings.dtype}"
                f"{f', encoded in {seconds:.1f}s' if status != 'hit' else ''} ({path})")
    finally:
        model.train(was_training)
    report["bytes"] = sum(s["bytes"] for s in report["splits"].values())
    report["encode_s"] = round(sum(s["seconds"] for s in report["splits"].values()), 3)
    statuses = {s["status"] == "hit" for s in report["splits"].values()}
    report["status"] = "hit" if statuses == {True} else "miss" if statuses == {False} else "partial"
    return out, report
