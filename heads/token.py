"""The token tagging head: a tag per subword, or with ``units="char"`` a tag per character
(``task.decode=char``), and with ``crf=True`` the tags decoded by a linear-chain CRF (``task.crf``;
heads/crf.py). Options of one head, as flair's ``SequenceTagger(use_crf=…)``.

Per character, every character inside a subword carries its own tag, so an entity boundary inside a
token (``경찰은`` → 경찰 + 은) stays expressible: a character is represented by the state of the token
that covers it plus embeddings of its position counted from the token's start and from its end
(particles sit at the end), mixed by a small feed-forward layer. Which token and which position each
character has comes from the task's alignment (extra inputs ``char_token_index``, ``char_pos_start``,
``char_pos_end``; padded with -100 by the collator).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from heads.base import NativeHead
from heads.crf import ChainCRF
from heads.loss import WeightedCrossEntropy
from heads.native import init_new_layers
from kotune.core.errors import ConfigError
from kotune.core.registry import register_head

UNITS = ("token", "char")
CHAR_INPUTS = ("char_token_index", "char_pos_start", "char_pos_end")
WHY_NOT = {("char", False): "it tags characters, not tokens (task.decode=char); a token classifier cannot express "
                            "a boundary inside a token",
           ("token", True): "a CRF (task.crf=true) decodes its tags with learned transition scores over the whole "
                            "sentence; a token classifier tags each token on its own",
           ("char", True): "it tags characters (task.decode=char) with a CRF (task.crf=true); a token classifier "
                           "tags each token on its own"}


@register_head("token")
class TokenHead(WeightedCrossEntropy):
    """Per subword: each token state → dropout → linear → tag logits, shape (batch, tokens, labels),
    the ``classifier`` of ``*ForTokenClassification``.

    Per character (``units="char"``): a tag per character, as a correction of the covering token's
    tag: logits = linear(token state) + linear₀(GELU(dense(LN(token state + position embeddings)))),
    with linear₀ zero-initialised, so training starts from the subword head's answer (every character
    of a token gets its tag) and learns where characters differ (B- → I- after the first, a particle
    at the end back to O). Logits shape (batch, characters, labels).

    With ``crf=True`` the emissions above are decoded by a CRF: in evaluation the head returns
    ``(viterbi, emissions)`` (heads/crf.py), and its loss is the CRF's likelihood."""

    pipeline_tag = "token-classification"
    aliases = {"token_char": {"units": "char"}, "token_crf": {"crf": True},
               "token_char_crf": {"units": "char", "crf": True}}  # the kinds of kotune < 0.2
    native = NativeHead("ForTokenClassification", {"*": {"out": "classifier"}}, pipeline="token-classification")

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1, init_std: float = 0.02,
                 class_weights: list[float] | None = None, units: str = "token", crf: bool = False,
                 max_char_positions: int = 16, crf_constraints: dict | None = None):
        super().__init__()
        if units not in UNITS:
            raise ConfigError(f"token head units must be one of {', '.join(UNITS)}, got '{units}'")
        self.units, self.use_crf = units, bool(crf)
        self.init_class_weights(class_weights)  # train.class_weights (heads/loss.py)
        # layers are created in this order so that a seed gives the weights it gave before the options merged
        if units == "char":
            self.max_char_positions = max_char_positions
            # positions past the last embedding share it (only very long [UNK] tokens get there)
            self.from_start = nn.Embedding(max_char_positions, hidden_size)
            self.from_end = nn.Embedding(max_char_positions, hidden_size)
            self.norm = nn.LayerNorm(hidden_size)
            self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_labels)
        if units == "char":
            self.correction = nn.Linear(hidden_size, num_labels)
            # the token classifier as *ForTokenClassification inits it; the character machinery
            # (position embeddings at N(0, 1), so positions register through the LayerNorm) keeps
            # PyTorch's defaults: with 0.02-std embeddings a small budget never learned a boundary
            init_new_layers(self.out, init_std)
            nn.init.zeros_(self.correction.weight)
            nn.init.zeros_(self.correction.bias)
        else:
            init_new_layers(self, init_std)
        if self.use_crf:
            self.crf = ChainCRF(num_labels, crf_constraints)

    @property
    def probabilities(self) -> str | None:
        return None if self.use_crf else "softmax"  # a CRF's paths are not read from per-tag probabilities

    @property
    def extra_inputs(self) -> tuple[str, ...]:
        return (CHAR_INPUTS if self.units == "char" else ()) + (("label_slots",) if self.use_crf else ())

    def options(self) -> dict:
        return {**({"crf": True} if self.use_crf else {}), **({"units": "char"} if self.units == "char" else {})}

    def native_export(self) -> NativeHead | str:
        return WHY_NOT.get((self.units, self.use_crf)) or self.native

    def native_config(self, config, kwargs: dict) -> None:
        config.num_labels = int(kwargs.get("num_labels", 1))
        config.classifier_dropout = float(kwargs.get("dropout", config.hidden_dropout_prob))

    def emissions(self, hidden_states: torch.Tensor, char_token_index: torch.Tensor | None = None,
                  char_pos_start: torch.Tensor | None = None, char_pos_end: torch.Tensor | None = None) -> torch.Tensor:
        if self.units == "token":
            return self.out(self.dropout(hidden_states))
        index = char_token_index.long().clamp(min=0)  # padded slots (-100) read token 0; never scored
        states = torch.gather(hidden_states, 1, index.unsqueeze(-1).expand(-1, -1, hidden_states.size(-1)))
        last = self.max_char_positions - 1
        states = self.dropout(states)
        x = states + self.from_start(char_pos_start.long().clamp(0, last)) \
            + self.from_end(char_pos_end.long().clamp(0, last))
        return self.out(states) + self.correction(self.dropout(F.gelu(self.dense(self.norm(x)))))

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor, label_slots: torch.Tensor | None = None,
                **char_inputs: torch.Tensor):
        emissions = self.emissions(hidden_states, **char_inputs)
        if not self.use_crf or self.training or label_slots is None:
            return emissions
        return self.crf.viterbi(emissions, label_slots == 1), emissions

    def weighting(self) -> str | None:  # train.class_weights
        if self.use_crf:  # no cross-entropy here to weight
            return "its loss is the CRF's likelihood of whole tag sequences, not a cross-entropy per tag"
        return super().weighting()

    def loss_sums(self, logits, labels: torch.Tensor) -> list[torch.Tensor]:
        if self.use_crf:  # one term, counted as the plain head's is (its labelled slots: loss_counts)
            return [self.crf.nll(logits[1] if isinstance(logits, tuple) else logits, labels)]
        return super().loss_sums(logits, labels)
