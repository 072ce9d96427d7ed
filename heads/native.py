"""What each encoder architecture's own Hugging Face head looks like, so kotune's heads start where
``BertForSequenceClassification``, ``RobertaForTokenClassification``, ``ElectraForQuestionAnswering``
… start (transformers 5.24, models/{bert,roberta,electra}/modeling_*.py):

- sequence: BERT = pooler (dense + tanh on [CLS], *from the checkpoint*) → dropout → classifier;
  RoBERTa = dropout → dense → tanh → dropout → out_proj; ELECTRA = the same with GELU;
- token: dropout → classifier; span (QA): qa_outputs, no dropout;
- new layers: normal(0, ``initializer_range``) weights, zero biases (``_init_weights``);
- dropout: ``classifier_dropout``, else ``hidden_dropout_prob``; ``train.head_dropout`` overrides
  it only when set.
"""
from __future__ import annotations

import inspect

from torch import nn

# model_type → the head style of its architecture; other types get RoBERTa's (a fresh dense + tanh)
STYLES = {"bert": "bert", "roberta": "roberta", "xlm-roberta": "roberta", "camembert": "roberta",
          "electra": "electra"}


def head_style(config) -> str:
    return STYLES.get(config.model_type, "roberta")


def takes_pooler(config, head_class) -> bool:
    """BERT's sequence-classification head *is* its pretrained pooler (next-sentence prediction)."""
    return head_style(config) == "bert" and bool(getattr(head_class, "takes_pooler", False))


def default_dropout(config, head_class, explicit: float | None = None) -> float:
    """``train.head_dropout`` when set, else the native twin's (``Head.native_dropout``: QA's none),
    else the encoder config's classifier / hidden dropout."""
    if explicit is not None:
        return float(explicit)
    if getattr(head_class, "native_dropout", None) is not None:
        return float(head_class.native_dropout)
    value = getattr(config, "classifier_dropout", None)
    return float(value if value is not None else getattr(config, "hidden_dropout_prob", 0.1))


def native_arguments(config, head_class, head_kwargs: dict) -> tuple[dict, dict]:
    """The head's arguments on ``config``'s encoder, as its native twin has them: ``head_kwargs``
    with the dropout and (for heads that take one) the architecture's shape filled in, and the
    ``init_std`` of heads with a transformers counterpart (RE and DP heads keep their own init)."""
    kwargs = dict(head_kwargs)
    accepted = inspect.signature(head_class).parameters
    kwargs["dropout"] = default_dropout(config, head_class, kwargs.get("dropout"))
    if "architecture" in accepted:
        kwargs.setdefault("architecture", head_style(config))
    native_init = {"init_std": float(getattr(config, "initializer_range", None) or 0.02)} if "init_std" in accepted else {}
    return kwargs, native_init


def init_new_layers(module: nn.Module, std: float) -> None:
    """As ``PreTrainedModel._init_weights``: normal(0, std) weights, zero biases, unit LayerNorm."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
