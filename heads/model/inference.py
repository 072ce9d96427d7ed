"""Where and how a model answers at inference (``predict.device``, ``predict.precision``,
``predict.batch_tokens``), and the one forward every inference path runs a torch model through:
action=serve and ``kotune.load`` (kotune/inference/model_runtimes.py's torch forward, a native export's), action=rerank,
predict and eval run outside Trainer (:class:`BatchPredictor`, below), action=embed and a
bi-encoder's vectors (heads/model/embed.py) and the distillation teacher's logits
(heads/distill/teacher_cache.py): all of them call :meth:`Inference.forward`, so none can forget the
device. The model is moved once (:meth:`Inference.place`), each batch's inputs are moved in the
forward, and the outputs come back to the CPU (numpy, float32) at the end of the batch only."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from kotune.core.errors import ConfigError
from tasks.base import IGNORE

DEVICES = "auto, cpu, cuda or cuda:N"
# torch is imported where a batch runs, not with this module: the command line answers a config or data
# mistake before torch loads (tests/test_bad_input.py), and token_batches is plain arithmetic
PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Inference:
    """A resolved device (``cpu``, ``cuda:0``, …) and precision (fp32, bf16, fp16: autocast)."""

    device: str = "cpu"
    precision: str = "fp32"
    explicit: bool = False  # the device was named (not auto): one that cannot run there is refused, not replaced

    def place(self, module: Any) -> Any:
        """``module`` on the device in eval mode: done once, before its first batch."""
        return module.to(self.device).eval()

    def autocast(self):
        """bf16/fp16 autocast on the device (fp16: CUDA only, :func:`resolve` refuses it on the CPU)."""
        import torch

        dtype = PRECISIONS[self.precision] and getattr(torch, PRECISIONS[self.precision])
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(self.device).type, dtype=dtype)

    def forward(self, fn: Callable[..., Any], *args: Any, **inputs: Any) -> Any:
        """THE forward: ``fn(*args, **inputs)`` with every tensor (or array) input on the device, no
        gradients, under the precision's autocast; its outputs (a tensor, a tuple of them, a dict's
        ``logits``) back on the CPU as float32 numpy."""
        import torch

        with torch.inference_mode(), self.autocast():
            out = fn(*(self.move(a) for a in args), **{k: self.move(v) for k, v in inputs.items()})
        return host(out)

    def move(self, value: Any) -> Any:
        import torch

        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        return value.to(self.device, non_blocking=True) if isinstance(value, torch.Tensor) else value

    def describe(self) -> dict:
        return {"device": self.device, "precision": self.precision}


def host(out: Any) -> Any:
    """A batch's outputs as float32 numpy on the CPU (a tuple stays a tuple; a model output's logits)."""
    import torch

    if hasattr(out, "keys") and "logits" in out.keys():  # a dict or a transformers ModelOutput
        out = out["logits"]
    if isinstance(out, (tuple, list)):
        return tuple(host(x) for x in out)
    if isinstance(out, torch.Tensor):
        return out.detach().float().cpu().numpy()
    return np.asarray(out, dtype=np.float32) if np.asarray(out).dtype.kind == "f" else np.asarray(out)


def resolve(device: Any = "auto", precision: Any = "fp32") -> Inference:
    """``predict.device`` and ``predict.precision`` checked against this machine: auto is the GPU
    when one is visible; a device that is not there, a precision it cannot run, one line each."""
    import torch

    name = "auto" if device in (None, "") else str(device).strip().lower()
    cuda = torch.cuda.is_available()
    if name == "auto":
        name = "cuda" if cuda else "cpu"  # the current CUDA device: under torchrun, each rank's own
    elif name == "cuda" or name.startswith("cuda:"):
        index = name.partition(":")[2] or "0"
        if not index.isdigit() or name.endswith(":"):
            raise ConfigError(f"predict.device={device}: expected {DEVICES}")
        if not cuda:
            raise ConfigError(f"predict.device={device}: no CUDA device is visible (torch.cuda.is_available() is "
                              "False); use predict.device=cpu or auto")
        count = torch.cuda.device_count()
        if int(index) >= count:
            raise ConfigError(f"predict.device={device}: {count} CUDA device{'s are' if count != 1 else ' is'} "
                              f"visible (cuda:0{f'..cuda:{count - 1}' if count > 1 else ''}); use one of them or auto")
        name = f"cuda:{int(index)}" if ":" in name else "cuda"
    elif name != "cpu":
        raise ConfigError(f"predict.device={device}: expected {DEVICES}")
    kind = "auto" if precision in (None, "") else str(precision).strip().lower()
    kind = "fp32" if kind == "auto" else kind
    if kind not in PRECISIONS:
        raise ConfigError(f"predict.precision={precision}: expected fp32, bf16 or fp16")
    if kind == "fp16" and name == "cpu":
        raise ConfigError("predict.precision=fp16: float16 autocast runs on CUDA only; on the CPU use "
                          "predict.precision=bf16 or fp32")
    if kind == "bf16" and name.startswith("cuda") and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"predict.precision=bf16: {torch.cuda.get_device_name(name)} has no bfloat16; "
                          "use predict.precision=fp16 or fp32")
    return Inference(name, kind, explicit=str(device or "auto").strip().lower() != "auto")


def of(cfg: Any) -> Inference:
    """The job's :class:`Inference` from its ``predict`` options (a mapping; missing keys: auto, fp32)."""
    options = (cfg.get("predict") if cfg is not None else None) or {}
    return resolve(options.get("device", "auto"), options.get("precision", "fp32"))


# ---- batches filled to a token budget ----------------------------------------------------------
def row_size(row: dict) -> tuple[int, int]:
    """(sequences, longest) of one features row: 1 and its length, or a windowed document's
    windows and its longest window."""
    ids = row.get("input_ids", row.get("attention_mask"))
    if ids is None:
        return 1, 1
    if len(ids) and isinstance(ids[0], (list, tuple, np.ndarray)):
        return len(ids), max(len(w) for w in ids)
    return 1, len(ids)


def row_sizes(rows) -> list[tuple[int, int]]:
    """Each row's (sequences, longest) for a token budget (:func:`row_size`): from the token column
    alone where the rows are a ``datasets.Dataset`` (pyarrow's list lengths; a document of windows per
    row read row by row), else row by row. Training's budgeted batches and prediction's read it."""
    if getattr(rows, "column_names", None) is None:
        return [row_size(rows[i]) for i in range(len(rows))]
    import pyarrow.compute as pc

    column = next((c for c in ("input_ids", "attention_mask") if c in rows.column_names), None)
    if column is None:
        return [(1, 1)] * len(rows)
    table = rows.with_format("arrow")[column]
    if str(table.type).startswith("list<item: list"):  # windows: a document per row
        return [row_size({column: row}) for row in rows.with_format(None)[column]]
    return [(1, int(n)) for n in pc.list_value_length(table).to_numpy(zero_copy_only=False)]


def token_batches(sizes: Iterable[tuple[int, int]], batch_tokens: int | None, batch_size: int,
                  multiple: int = 1) -> list[range]:
    """Consecutive rows (already sorted by length) cut into batches: at most ``batch_size`` rows,
    or, with ``batch_tokens``, as many as keep the padded batch (sequences × the longest, rounded up
    to ``multiple`` as the collator pads) within it; a row alone over the budget runs alone."""
    sizes = list(sizes)
    if not batch_tokens:
        size = max(1, int(batch_size))
        return [range(i, min(i + size, len(sizes))) for i in range(0, len(sizes), size)]
    budget, multiple = int(batch_tokens), max(1, int(multiple))
    out, first, count, longest = [], 0, 0, 0
    for i, (n, length) in enumerate(sizes):
        wider = max(longest, -(-length // multiple) * multiple)
        if i > first and (count + n) * wider > budget:
            out.append(range(first, i))
            first, count, wider = i, 0, -(-length // multiple) * multiple
        count, longest = count + n, wider
    if first < len(sizes):
        out.append(range(first, len(sizes)))
    return out


def check_batch_tokens(value: Any) -> int | None:
    """``predict.batch_tokens``: null (batches of train.eval_batch_size rows) or a positive integer."""
    if value in (None, "", "null"):
        return None
    try:
        tokens = int(value)
    except (TypeError, ValueError):
        tokens = 0
    if tokens < 1 or str(tokens) != str(value).strip():
        raise ConfigError(f"predict.batch_tokens={value}: expected a positive number of tokens (rows × padded "
                          "length per batch), or null")
    return tokens


# ---- batches run outside Trainer -------------------------------------------------------------
def concat_padded(parts: list) -> Any:
    """Batch outputs as one array per output, as ``Trainer.predict`` joins them: rows stacked, a
    token axis (axis 1) that differs between batches padded with -100 (decoders read real slots only)."""
    if isinstance(parts[0], tuple):
        return tuple(concat_padded([p[k] for p in parts]) for k in range(len(parts[0])))
    parts = [np.asarray(p) for p in parts]
    if all(p.shape[1:] == parts[0].shape[1:] for p in parts):
        return np.concatenate(parts)
    out = np.full((sum(len(p) for p in parts), max(p.shape[1] for p in parts), *parts[0].shape[2:]), IGNORE,
                  dtype=parts[0].dtype)
    row = 0
    for p in parts:
        out[row:row + len(p), : p.shape[1]] = p
        row += len(p)
    return out


class BatchPredictor:
    """``Trainer.predict`` for a model Trainer does not run: rows in the order given, ``batch_size``
    at a time (or, with ``batch_tokens``, as many as keep rows × padded length within it: a long
    request is split, never one batch past the budget: :func:`check_batch_tokens`), padded by the
    training collator, through ``forward`` (a padded batch → logits). ``inference`` and ``provider``
    (an ONNX export's execution provider) say where ``forward`` runs: reported, not read."""

    def __init__(self, forward: Callable[[dict], Any], batch_size: int, collator, batch_tokens: Any = None,
                 inference: Inference | None = None, provider: str | None = None):
        self.forward, self.batch_size, self.collator = forward, max(1, int(batch_size)), collator
        self.batch_tokens = check_batch_tokens(batch_tokens)
        self.inference, self.provider = inference, provider

    def predict(self, rows):
        from transformers.trainer_utils import PredictionOutput

        started, parts = time.perf_counter(), []
        sizes = row_sizes(rows) if self.batch_tokens else [(1, 1)] * len(rows)  # no budget: batch_size rows
        for batch in token_batches(sizes, self.batch_tokens, self.batch_size, getattr(self.collator, "multiple", 1)):
            parts.append(self.forward(self.collator([rows[i] for i in batch])))  # rows read a batch at a time
        speed = len(rows) / max(time.perf_counter() - started, 1e-9)
        return PredictionOutput(predictions=concat_padded(parts), label_ids=None,
                                metrics={"test_samples_per_second": speed})

    def inference_report(self) -> dict:
        """Where the batches ran (results.json ``inference``, serve's /health): the device, precision
        and token budget, an ONNX export's execution provider (Trainer's own: kotune/training/trainer.py's ``KotuneTrainer.inference_report``)."""
        chosen = self.inference or Inference()
        return {**chosen.describe(), "batch_tokens": self.batch_tokens, "provider": self.provider, "runner": "kotune"}
