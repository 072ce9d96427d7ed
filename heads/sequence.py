"""[CLS] heads for single texts and sentence pairs (classification, or regression when
``num_labels == 1``, or a sigmoid per label when ``multi_label``), shaped as the encoder
architecture's own head (heads/native.py)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from heads.base import NativeHead
from heads.model.layers import check_pooling, pool
from heads.loss import WeightedCrossEntropy
from heads.native import init_new_layers
from kotune.core.registry import register_head

SEQUENCE_STYLES = ("bert", "roberta", "electra", "linear")


@register_head("sequence")
class SequenceHead(WeightedCrossEntropy):
    """Pooled state → the architecture's classifier:

    - ``bert``: dense → tanh (BERT's pooler; KotuneModel copies the checkpoint's) → dropout → out;
    - ``roberta``: dropout → dense → tanh → dropout → out;
    - ``electra``: dropout → dense → GELU → dropout → out;
    - ``linear``: out alone (``mode=setfit``: SetFit's differentiable head, one linear layer on the
      embedding, initialised as setfit's SetFitHead: Xavier-uniform weights, biases 0.01).

    ``pooling="mean"`` (``mode.pooling``) feeds the masked mean of the real tokens instead of [CLS]
    to the same layers.

    The loss is HF's for the config's ``problem_type``: MSE (one label), cross-entropy (weighted by
    ``class_weights`` when given: ``train.class_weights``), or with ``multi_label`` a binary
    cross-entropy per label on multi-hot float labels (``multi_label_classification``: the mean over
    rows × labels)."""

    pipeline_tag = "text-classification"
    takes_pooler = True
    aliases = {"pair": {}}  # a pair is encoded as one sequence: [CLS] a [SEP] b [SEP] (kotune < 0.2 named it)
    native = NativeHead("ForSequenceClassification", {"bert": {"dense": "bert.pooler.dense", "out": "classifier"},
                                                      "*": {"dense": "classifier.dense", "out": "classifier.out_proj"}},
                        pipeline="text-classification")

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1, pooling: str = "cls",
                 architecture: str = "bert", init_std: float = 0.02, multi_label: bool = False,
                 class_weights: list[float] | None = None):
        super().__init__()
        if architecture not in SEQUENCE_STYLES:
            raise ValueError(f"sequence head architecture must be one of {SEQUENCE_STYLES}, got {architecture!r}")
        self.num_labels = num_labels
        self.multi_label = bool(multi_label)
        self.init_class_weights(class_weights)
        self.architecture = architecture
        self.pooling = check_pooling(pooling) or "cls"
        # a linear head has no dense layer (nor BERT's pooler, which KotuneModel loads into the bert shape only)
        self.dense = nn.Linear(hidden_size, hidden_size) if architecture != "linear" else None
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_labels)
        init_new_layers(self, init_std)
        if architecture == "linear":
            nn.init.xavier_uniform_(self.out.weight)
            nn.init.constant_(self.out.bias, 1e-2)

    @property
    def probabilities(self) -> str | None:
        return "sigmoid" if self.multi_label else None if self.num_labels == 1 else "softmax"  # None: a regression

    def pool(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return pool(hidden_states, attention_mask, self.pooling)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.pool(hidden_states, attention_mask)
        if self.architecture == "linear":
            return self.out(x)
        if self.architecture == "bert":
            return self.out(self.dropout(torch.tanh(self.dense(x))))
        x = self.dense(self.dropout(x))
        x = F.gelu(x) if self.architecture == "electra" else torch.tanh(x)
        return self.out(self.dropout(x))

    def loss_sums(self, logits: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        if self.multi_label:  # the collator may pad the label vectors (-100) to a multiple of 8: cut
            return [F.binary_cross_entropy_with_logits(logits.float(), labels[..., : self.num_labels].float(),
                                                       reduction="sum")]
        if self.num_labels == 1:  # regression: the mean squared error over the rows
            return [F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction="sum")]
        return super().loss_sums(logits, labels)

    def loss_counts(self, labels: torch.Tensor) -> torch.Tensor:
        # a count from the shape, filled on the device (torch.tensor would copy it there and wait)
        if self.multi_label:  # every row's every label
            return torch.full((1,), labels[..., : self.num_labels].numel(), device=labels.device)
        if self.num_labels == 1:
            return torch.full((1,), labels.numel(), device=labels.device)
        return super().loss_counts(labels)

    def native_export(self) -> NativeHead | str:
        if self.architecture == "linear":
            return "SetFit's single linear layer (mode=setfit); a native classifier has a dense layer and tanh before its own"
        return super().native_export()

    def native_config(self, config, kwargs: dict) -> None:
        config.num_labels = int(kwargs.get("num_labels", 1))
        config.classifier_dropout = float(kwargs.get("dropout", config.hidden_dropout_prob))
        if kwargs.get("multi_label"):
            # a sigmoid per label: the pipeline's default function, and BCE as the native loss
            config.problem_type = "multi_label_classification"
        elif config.num_labels == 1:
            config.problem_type = "regression"  # the pipeline then returns the raw score, no sigmoid

    def weighting(self) -> str | None:
        if self.multi_label:
            return "its loss is a sigmoid per label (task=multi_label), not a choice among classes"
        if self.num_labels == 1:
            return "it is a regression (one output), with no classes to weight"
        return None
