"""``train.class_weights``: a weight per class in a head's cross-entropy (imbalanced classes). The
weights are a head argument, saved in kotune.json with the others, so a reloaded checkpoint
(eval, predict, a resumed run) computes the loss its training did; they are a buffer outside the
state dict, so the exported native weights are unchanged."""
from __future__ import annotations

import torch


class ClassWeighted:
    """Mixed into the heads whose loss is a cross-entropy over classes (sequence, pair, token)."""

    def init_class_weights(self, weights: list[float] | None) -> None:
        tensor = None if weights is None else torch.tensor([float(w) for w in weights], dtype=torch.float)
        self.register_buffer("class_weights", tensor, persistent=False)

    def set_class_weights(self, weights: list[float]) -> None:
        self.class_weights = torch.tensor([float(w) for w in weights], dtype=torch.float,
                                          device=next(self.parameters()).device)

    def weighting(self) -> str | None:
        """Why this head cannot weight its classes, or None when it can."""
        return None
