"""Calibration's nn side (``train.calibrate``, kotune/calibration/fit.py): fit a temperature (one for a
softmax head) or a Platt scaling per label (a sigmoid per label) by minimising the negative
log-likelihood of held-out logits, and fold it into the head's last linear layer(s) so that the
saved weights, and every export of them, give the calibrated probabilities with no extra code.

Folding: softmax(z / T) with z = W·x + b is softmax((W/T)·x + b/T); sigmoid(a·z + c) is
sigmoid((a·W)·x + (a·b + c)). T > 0 and a > 0 (both fitted on a log scale) keep each row's
ranking of the classes, hence the argmax, and each label's order of the rows."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def why_not_calibrated(head: nn.Module) -> str | None:
    """Why ``head`` has no probabilities a temperature or Platt scaling can calibrate here, in a few
    words; None where it has (a softmax or per-label sigmoid over its ``out`` layer)."""
    kind = getattr(head, "registered_name", type(head).__name__)
    if kind == "span":
        return ("the span head (QA) scores answer start and end positions of each window, and the answer is "
                "decoded from their sum over spans, not read from class probabilities")
    if kind == "dependency":
        return ("the dependency head scores a head word for every word and decodes a tree from those "
                "scores, not class probabilities per item")
    if getattr(head, "num_labels", None) == 1 and not getattr(head, "multi_label", False):
        return "the task is a regression (one output, as STS): its score is a number, not class probabilities"
    if getattr(head, "use_crf", False):
        return ("a CRF (task.crf=true) decodes tags with transition scores over the whole sentence: scaling the "
                "emissions would change its paths")
    if getattr(head, "probabilities", None) not in ("softmax", "sigmoid"):  # the head's contract (heads/base.py)
        return (f"the {kind} head yields no class probabilities (its probabilities is "
                f"{getattr(head, 'probabilities', None)!r}; a head whose logits are a softmax or a sigmoid per label "
                "says 'softmax' or 'sigmoid')")
    if not isinstance(getattr(head, "out", None), nn.Linear):
        return f"the {kind} head has no last linear layer ('out') to fold a calibration into"
    return None


def final_layers(head: nn.Module) -> list[nn.Linear]:
    """The linear layers whose outputs add up to the logits: ``out`` (and the character correction
    of ``units=char``)."""
    return [head.out] + ([head.correction] if isinstance(getattr(head, "correction", None), nn.Linear) else [])


T_RANGE = (0.01, 100.0)  # a temperature past these flattens or sharpens beyond any use (and float32's precision)


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, steps: int = 100) -> float:
    """The temperature T that minimises the NLL of ``softmax(logits / T)`` on ``labels`` (LBFGS on
    log T), within ``T_RANGE`` (a model right at chance on a tiny slice would drive T to infinity)."""
    z, y = logits.detach().double(), labels.detach().long()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")
    low, high = math.log(T_RANGE[0]), math.log(T_RANGE[1])

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(z / log_t.clamp(low, high).exp(), y)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().clamp(low, high).exp())


def fit_platt(logits: torch.Tensor, targets: torch.Tensor, steps: int = 100) -> tuple[list[float], list[float]]:
    """Per label (column): a > 0 and c minimising the binary NLL of ``sigmoid(a · logit + c)`` on
    the 0/1 ``targets`` (LBFGS on log a and c, all labels at once: their losses are independent)."""
    z, t = logits.detach().double(), targets.detach().double()
    log_a = torch.zeros(z.shape[-1], dtype=torch.float64, requires_grad=True)
    c = torch.zeros(z.shape[-1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_a, c], lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(z * log_a.exp() + c, t, reduction="sum") / max(len(z), 1)
        loss.backward()
        return loss

    opt.step(closure)
    return log_a.detach().exp().tolist(), c.detach().tolist()


@torch.no_grad()
def fold_temperature(head: nn.Module, temperature: float) -> None:
    """The head's logits divided by ``temperature``, in its weights."""
    for layer in final_layers(head):
        layer.weight.div_(temperature)
        if layer.bias is not None:
            layer.bias.div_(temperature)


@torch.no_grad()
def fold_platt(head: nn.Module, scale: list[float], shift: list[float]) -> None:
    """Label j's logit z_j becomes ``scale[j] · z_j + shift[j]``, in the head's weights."""
    layers = final_layers(head)
    for layer in layers:
        a = torch.tensor(scale, dtype=layer.weight.dtype, device=layer.weight.device)
        layer.weight.mul_(a.unsqueeze(-1))
        if layer.bias is not None:
            layer.bias.mul_(a)
    out = layers[0]
    if out.bias is None:  # a shift needs a bias: every kotune head's out layer has one
        raise ValueError("Platt scaling folds its shift into the out layer's bias, and this head's has none")
    out.bias.add_(torch.tensor(shift, dtype=out.bias.dtype, device=out.bias.device))
