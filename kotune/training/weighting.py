"""``train.class_weights`` for a built run: checked against the head before anything is encoded,
computed from the encoded training split's targets (what the loss sees), logged with the counts,
and set on the head (saved with it). A checkpoint keeps the weights it was trained with."""
from __future__ import annotations

from omegaconf import DictConfig

from tasks.class_weights import (BALANCED, class_weight_setting, class_weights, describe, label_counts,
                                 saved_class_weights)
from kotune.core.errors import ConfigError
from kotune.core.log import log


def check_class_weights(cfg: DictConfig, model, task_name: str, fresh_head: bool) -> None:
    """Refuse ``train.class_weights`` in one line where the head has no class-weighted loss."""
    if fresh_head and class_weight_setting(cfg.train.get("class_weights")) is not None:
        why = model.weighting_refusal()
        if why:
            raise ConfigError(f"train.class_weights={cfg.train.class_weights}: task {task_name}: {why}")


def apply_class_weights(cfg: DictConfig, model, labels: list[str] | None, train_features,
                        fresh_head: bool) -> dict | None:
    """Set the weights on a fresh head (train, probe) from ``train_features``; report the weights a
    head carries as ``{label: {"count", "weight"}}`` (count: training targets; a checkpoint's weights
    come without counts), None when unweighted."""
    setting = class_weight_setting(cfg.train.get("class_weights"))
    if fresh_head and setting is not None and train_features is not None:
        names = [str(x) for x in labels or []]
        counts = label_counts(train_features["labels"], len(names))
        weights = class_weights(setting, names, counts)
        model.set_class_weights(weights)
        source = "balanced, n / (k · count)" if setting == BALANCED else "as given"
        log(f"class weights ({source}; {sum(counts):,} training targets): {describe(names, weights, counts)}")
        return {name: {"count": c, "weight": w} for name, c, w in zip(names, counts, weights)}
    return saved_class_weights(head_weights(model), labels, asked=not fresh_head and setting is not None)


def head_weights(model) -> list[float] | None:
    """The class weights a head carries (an ONNX export keeps none)."""
    return (getattr(model, "head_kwargs", None) or {}).get("class_weights")
