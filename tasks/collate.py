"""Dynamic padding: each batch is padded to its own longest row (rounded up to a multiple of 8
for tensor cores), not to ``max_length``. Label sequences are padded with -100. Arrays whose first
axis is the token axis (cached per-token encoder states) keep their dtype; float ones are padded
with zeros. Rows whose token inputs are lists of windows (``task.long_text=windows``: a document
per row) become one batch of windows plus ``window_doc``, each window's document in the batch."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tasks.base import IGNORE


class DynamicPaddingCollator:
    def __init__(self, pad_token_id: int, pad_to_multiple_of: int = 8):
        self.pad_token_id = pad_token_id
        self.multiple = max(1, pad_to_multiple_of)

    def pad_value(self, key: str) -> int:
        if key == "input_ids":
            return self.pad_token_id
        if key in ("attention_mask", "token_type_ids"):
            return 0
        return IGNORE

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if rows and is_windowed(rows[0]):
            return self.windows(rows)
        batch = {}
        for key in rows[0]:
            values = [r[key] for r in rows]
            if isinstance(values[0], (np.ndarray, torch.Tensor)) and values[0].ndim >= 1:
                batch[key] = self.pad_arrays(key, values)
            elif isinstance(values[0], (list, tuple)):
                longest = max(len(v) for v in values)
                length = -(-longest // self.multiple) * self.multiple
                pad = self.pad_value(key)
                dtype = torch.float if values and values[0] and isinstance(values[0][0], float) else torch.long
                batch[key] = torch.tensor([list(v) + [pad] * (length - len(v)) for v in values], dtype=dtype)
            else:
                dtype = torch.float if isinstance(values[0], float) else torch.long
                batch[key] = torch.tensor(values, dtype=dtype)
        return batch

    def windows(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Documents of windows → the windows padded as rows, ``window_doc`` and the documents' other fields."""
        keys = [k for k in WINDOWED if k in rows[0]]
        batch = self([{k: row[k][w] for k in keys} for row in rows for w in range(len(row["input_ids"]))])
        batch["window_doc"] = torch.tensor([d for d, row in enumerate(rows) for _ in row["input_ids"]])
        rest = [{k: v for k, v in row.items() if k not in keys} for row in rows]
        if rest[0]:
            batch.update(self(rest))
        return batch

    def pad_arrays(self, key: str, values: list) -> torch.Tensor:
        """[T_i, ...] arrays → one [B, T, ...] tensor, T the padded batch length. Copied in numpy:
        torch's threaded copies of many small rows are ~100× slower on a busy CPU."""
        arrays = [v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for v in values]
        length = -(-max(len(a) for a in arrays) // self.multiple) * self.multiple
        pad = 0 if np.issubdtype(arrays[0].dtype, np.floating) else self.pad_value(key)
        out = np.full((len(arrays), length, *arrays[0].shape[1:]), pad, dtype=arrays[0].dtype)
        for i, a in enumerate(arrays):
            out[i, : len(a)] = a
        return torch.from_numpy(out)


WINDOWED = ("input_ids", "attention_mask", "token_type_ids")  # the inputs a windowed document has per window


def is_windowed(row: dict[str, Any]) -> bool:
    """A document of windows: its ``input_ids`` are a list of token lists."""
    ids = row.get("input_ids")
    return isinstance(ids, (list, tuple)) and bool(ids) and isinstance(ids[0], (list, tuple))


# ---- sorted evaluation -------------------------------------------------------------------------
LENGTH_COLUMNS = ("input_ids", "attention_mask")


def length_order(features) -> np.ndarray:
    """Row indices of ``features`` (a ``datasets.Dataset``), longest first (stable): consecutive
    evaluation batches then hold rows of nearly equal length and dynamic padding pads almost
    nothing; longest first also meets an out-of-memory at the first batch, not the last. Rows
    without a token column keep their order."""
    import pyarrow.compute as pc

    column = next((c for c in LENGTH_COLUMNS if c in features.column_names), None)
    if column is None or len(features) == 0:
        return np.arange(len(features))
    lengths = pc.list_value_length(features.with_format("arrow")[column]).to_numpy(zero_copy_only=False)
    return np.argsort(-lengths.astype(np.int64), kind="stable")


def in_order(dataset, order: np.ndarray):
    """``dataset``'s rows in ``order``: ``datasets``' own ``select``, a ``Subset`` for other
    map-style datasets (e.g. cached frozen states)."""
    if hasattr(dataset, "select"):
        return dataset.select(order)
    return torch.utils.data.Subset(dataset, order.tolist())


def restore_order(predictions: Any, order: np.ndarray) -> Any:
    """Trainer predictions made on ``features.select(order)`` back in the rows' original order
    (an array, or a tuple/list/dict of arrays whose first axis is the row)."""
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))

    def undo(p: Any) -> Any:
        if isinstance(p, (tuple, list)):
            return type(p)(undo(x) for x in p)
        if isinstance(p, dict):
            return {k: undo(v) for k, v in p.items()}
        return np.asarray(p)[inverse]

    return undo(predictions)
