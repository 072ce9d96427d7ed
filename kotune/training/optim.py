"""The optimizer's parameter groups (``KotuneTrainer.create_optimizer``): Trainer's weight-decay
split, the scalar mix's own learning rate (``train.mix_learning_rate``) and layer-wise learning-rate
decay (``train.layer_lr_decay``).

Layer-wise decay (Clark et al. 2020, ELECTRA, §A: 0.8 for base models, 0.9 for large) gives each
encoder layer the rate of the layer above times the decay: the head (and a BERT pooler, which is
the sequence head here) trains at the full rate, the top layer at rate·d, layer i of L at
rate·d^(L−i), the embeddings lowest at rate·d^(L+1). ELECTRA's own code
(``model/optimization.py:_get_layer_lrs``) leaves one depth between its head and the top layer
unused, so its layers sit one factor d lower than here; kotune follows the rule as stated."""
from __future__ import annotations

import re

from torch import nn

from kotune.core.errors import ConfigError

LAYER = re.compile(r"\.layer\.(\d+)\.")  # encoder.layer.<i>. in BERT, RoBERTa and ELECTRA (also under peft)


def layer_depth(name: str, num_layers: int) -> int | None:
    """Depth of a ``KotuneModel`` parameter: 0 for the embeddings (and ELECTRA's embedding
    projection), i + 1 for encoder layer i, ``num_layers`` (the top layer's) for any other encoder
    parameter, None outside the encoder (the head and the mix: the full rate)."""
    if not name.startswith("encoder."):
        return None
    found = LAYER.search(name)
    if found:
        return int(found.group(1)) + 1
    return 0 if ".embeddings" in name else num_layers


def rate_factor(depth: int | None, num_layers: int, decay: float) -> float:
    """The learning-rate multiplier at ``depth`` (``layer_depth``): d^(L+1−depth), 1 outside the encoder."""
    return 1.0 if depth is None else float(decay) ** (num_layers + 1 - depth)


def check_layer_decay(decay: float, frozen: bool) -> float:
    decay = float(decay)
    if not 0.0 < decay <= 1.0:
        raise ConfigError(f"train.layer_lr_decay={decay:g}: must be in (0, 1] (1.0 = off; ELECTRA: 0.8 for base models)")
    if decay < 1.0 and frozen:
        raise ConfigError("train.layer_lr_decay: mode=frozen trains only the head, which always trains at the full "
                          "rate; layer-wise decay needs a training encoder (mode=finetune or mode=lora)")
    return decay


def parameter_groups(model: nn.Module, decay_names: set[str], weight_decay: float, learning_rate: float,
                     mix_learning_rate: float | None, layer_decay: float) -> list[dict]:
    """Trainable parameters grouped by (learning rate, weight decay): ``decay_names`` (Trainer's
    ``get_decay_parameter_names``) get ``weight_decay``; ``mixer.*`` gets ``mix_learning_rate``
    (no decay) when given; the rest ``learning_rate`` times its layer's factor. Groups in order of
    first appearance, the mix's last."""
    num_layers = int(model.config.num_hidden_layers)
    groups: dict[tuple[float, float], dict] = {}
    mix: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.startswith("mixer.") and mix_learning_rate is not None:
            mix.append(param)
            continue
        lr = learning_rate * rate_factor(layer_depth(name, num_layers), num_layers, layer_decay)
        wd = weight_decay if name in decay_names else 0.0
        groups.setdefault((lr, wd), {"params": [], "weight_decay": wd, "lr": lr})["params"].append(param)
    out = list(groups.values())
    if mix:
        out.append({"params": mix, "weight_decay": 0.0, "lr": float(mix_learning_rate)})
    return out
