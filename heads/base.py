"""What a head is, and the contract each head class carries: one row per head, read by every part of
kotune that needs to know a head (the task's encoded columns, the Trainer's label names, the native
export, the ONNX outputs, the model card), so that a head registered from outside the repository
(``kotune.register_head``) works with every action without a table to edit.

A head takes ``(hidden_states, attention_mask, **extra_inputs)`` and returns logits (a tensor or a
tuple); ``head.loss(logits, **labels)`` gives the batch's mean loss, ``loss_sums`` and ``loss_counts``
the same as sums and item counts (heads/loss.py): ``loss_sums(logits, **labels)`` a list of 0-d float
tensors, one sum per loss term, and ``loss_counts(**labels)`` a 1-d tensor with the item count of each
term (checked at every batch: heads/loss.py's ``checked_sums``, ``checked_counts``). Options that
change a head's computation are arguments of its class (flair's ``SequenceTagger(use_crf=…)``):
``TokenHead(crf=True, units="char")``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import nn

from kotune.core.registry import describe_head


@dataclass(frozen=True)
class NativeHead:
    """A head's native transformers twin: the class name after the architecture's prefix
    (``Bert`` + ``ForTokenClassification``), the head's modules renamed to the twin's per head style
    (``bert``, ``roberta``, ``electra``; ``*`` for every style), and the ``transformers.pipeline`` task
    that serves it (None where transformers has none)."""

    suffix: str
    modules: dict[str, dict[str, str]]
    pipeline: str | None = None
    config: dict[str, Any] = field(default_factory=dict)  # native config fields the head sets

    def key_map(self, style: str) -> dict[str, str]:
        """kotune head parameter name → native parameter name."""
        names = self.modules.get(style) or self.modules["*"]
        return {f"{k}.{p}": f"{v}.{p}" for k, v in names.items() for p in ("weight", "bias")}


class Head(nn.Module):
    """The base class of every head: its class attributes are its contract."""

    registered_name: ClassVar[str]  # set by kotune.register_head
    # the batch keys that carry labels, in the order loss() takes them (the Trainer's label_names)
    label_fields: ClassVar[tuple[str, ...]] = ("labels",)
    # the Hub's pipeline tag for a model card (None: "other")
    pipeline_tag: ClassVar[str | None] = None
    # the dropout of the native twin when train.head_dropout is unset: None reads the encoder config's
    # classifier_dropout / hidden_dropout_prob; 0.0 for heads whose twin has none (QA's qa_outputs)
    native_dropout: ClassVar[float | None] = None
    # BERT-style sequence heads are the pretrained pooler (heads/model/kotune_model.py hands it over)
    takes_pooler: ClassVar[bool] = False
    # kinds written by older kotune that are this head with options: old kind → the options
    aliases: ClassVar[dict[str, dict[str, Any]]] = {}
    # the native twin of the head without options (None: it has none); native_export() says per instance
    native: ClassVar[NativeHead | None] = None

    @property
    def extra_inputs(self) -> tuple[str, ...]:
        """Batch keys ``forward`` reads besides the hidden states and attention mask."""
        return ()

    @property
    def onnx_outputs(self) -> tuple[str, ...]:
        """The names of ``forward``'s outputs in an ONNX graph (of the native twin, or of the kotune
        model itself for a head without one: kotune/export/onnx.py), in the order ``forward`` returns them."""
        return ("logits",)

    @property
    def probabilities(self) -> str | None:
        """What its logits are to ``train.calibrate`` (heads/calibration.py): ``"softmax"`` (a distribution
        over the classes per item), ``"sigmoid"`` (a probability per label), or None (no class
        probabilities: a regression's value, scores decoded otherwise), which refuses calibration before
        training. None unless a head says otherwise."""
        return None

    def options(self) -> dict[str, Any]:
        """The head options that set it apart from its plain kind, for messages and results."""
        return {}

    def describe(self) -> str:
        """``token`` or ``token (crf=true, units=char)``: the head as messages name it."""
        return describe_head(self.registered_name, self.options())

    def native_export(self) -> NativeHead | str:
        """Its native twin, or why it has none in a few words ("" when there is nothing more to say)."""
        return self.native or ""

    def native_config(self, config: Any, kwargs: dict) -> None:
        """Set the twin's config fields (num_labels, dropout, problem type) from the head's arguments."""
        config.num_labels = int(kwargs.get("num_labels", 1))
