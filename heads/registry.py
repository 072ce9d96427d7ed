"""The head registry: kind → ``nn.Module`` class (heads/__init__.py says what a head is)."""
from __future__ import annotations

from torch import nn

from heads.crf import CrfCharTokenHead, CrfTokenHead
from heads.dependency import DependencyHead
from heads.relation import RelationHead
from heads.sequence import SequenceHead
from heads.span import CharSpanHead, SpanHead
from heads.token import CharTokenHead, TokenHead

HEADS: dict[str, type[nn.Module]] = {
    "sequence": SequenceHead,
    "pair": SequenceHead,  # a pair is encoded as one sequence: [CLS] a [SEP] b [SEP]
    "token": TokenHead, "token_char": CharTokenHead,  # a tag per subword / per character (NER)
    "token_crf": CrfTokenHead, "token_char_crf": CrfCharTokenHead,  # the same, decoded by a CRF (task.crf)
    "span": SpanHead, "span_char": CharSpanHead,  # answer start/end per token / per character (QA)
    "relation": RelationHead,  # the two entity-start states (KLUE RE)
    "dependency": DependencyHead,  # biaffine arcs and labels over word states (KLUE DP)
}
