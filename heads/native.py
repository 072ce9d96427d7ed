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

from torch import nn

# model_type → the head style of its architecture; other types get RoBERTa's (a fresh dense + tanh)
STYLES = {"bert": "bert", "roberta": "roberta", "xlm-roberta": "roberta", "camembert": "roberta",
          "electra": "electra"}
SPAN_HEADS = ("span", "span_char")  # QA output layers have no dropout in any of the three


def head_style(config) -> str:
    return STYLES.get(config.model_type, "roberta")


def takes_pooler(config, head_kind: str) -> bool:
    """BERT's sequence-classification head *is* its pretrained pooler (next-sentence prediction)."""
    return head_style(config) == "bert" and head_kind in ("sequence", "pair")


def default_dropout(config, head_kind: str, explicit: float | None = None) -> float:
    if explicit is not None:
        return float(explicit)
    if head_kind in SPAN_HEADS:
        return 0.0
    value = getattr(config, "classifier_dropout", None)
    return float(value if value is not None else getattr(config, "hidden_dropout_prob", 0.1))


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
