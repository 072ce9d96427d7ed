"""Dynamic padding: each batch is padded to its own longest row (rounded up to a multiple of 8
for tensor cores), not to ``max_length``. Label sequences are padded with -100."""
from __future__ import annotations

from typing import Any

import torch

IGNORE = -100


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
        batch = {}
        for key in rows[0]:
            values = [r[key] for r in rows]
            if isinstance(values[0], (list, tuple)):
                longest = max(len(v) for v in values)
                length = -(-longest // self.multiple) * self.multiple
                pad = self.pad_value(key)
                dtype = torch.float if values and values[0] and isinstance(values[0][0], float) else torch.long
                batch[key] = torch.tensor([list(v) + [pad] * (length - len(v)) for v in values], dtype=dtype)
            else:
                dtype = torch.float if isinstance(values[0], float) else torch.long
                batch[key] = torch.tensor(values, dtype=dtype)
        return batch
