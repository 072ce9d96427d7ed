"""Dependency head (KLUE DP): a biaffine arc scorer and a biaffine label classifier over word
states (Dozat & Manning 2017, "Deep Biaffine Attention for Neural Dependency Parsing").

A word's state is its first subword's, the mean of its subwords', or its first and last
subwords' concatenated (``word_pooling``: first | mean | first_last); which token belongs to which
word comes from the task (``token_word``: a 0-based word number per token, -100 for specials and
padding). The [CLS] state stands for the root, candidate head 0; word k is candidate k+1. Words
with no token (lost to truncation, or without a subword) are neither dependents nor candidate heads.

Options that reproduce KLUE-baseline's parser (klue_baseline/models/dependency_parsing.py,
``DPTransformer``; github.com/KLUE-benchmark/KLUE-baseline):

* ``pos_dim > 0``: a POS embedding per word (``pos_ids`` from the task; the root and padding have
  their own id) is concatenated to the word state; whole words' POS vectors drop out at 0.33
  (the reference's ``Dropout2d`` on [B, words, dim] drops per word).
* ``lstm_size > 0``: the reference's word-level encoder-decoder: a 1-layer BiLSTM over root + words
  gives the candidate-head states, a 1-layer LSTM over ``elu(dense(encoder states))`` of the words,
  started from the encoder's last cell state (``_transform_decoder_init_state``), gives the
  dependent states; both drop feature channels at 0.33 as the reference does, and the head's own
  dropout is then not used (the reference has none there).
* ``init="xavier"``: the reference's ``BiAttention``/``BiLinear.reset_parameters``: Xavier-uniform
  bilinear and linear terms, zero biases (``"zero"``: every biaffine weight starts at 0).

* training: arc scores for every (dependent, candidate) pair and label scores for every pair;
  the loss is the cross-entropy of the gold head plus that of the gold label *at the gold head*.
* inference (``eval()``): per word the best-scoring head and the label *at that predicted head*,
  as two [batch, words] tensors (Trainer can gather those across batches of different widths; the
  pairwise scores it could not). The evaluation loss is then the labelled-attachment error rate
  (a 0-1 loss): the cross-entropy needs the pairwise scores.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from heads.loss import CountedLoss, cross_entropy_sum, labelled
from kotune.core.registry import register_head
from tasks.base import IGNORE
from tasks.dp import BIAFFINE_INITS, WORD_POOLINGS

REFERENCE_DROPOUT = 0.33  # KLUE-baseline's dropout on POS embeddings and LSTM outputs


class WordLSTM(nn.Module):
    """KLUE-baseline's word-level encoder-decoder (``DPTransformer.forward``): candidate-head states
    from a BiLSTM over root + words, dependent states from an LSTM over the words started from the
    BiLSTM's last cell state."""

    def __init__(self, input_size: int, size: int):
        super().__init__()
        self.encoder = nn.LSTM(input_size, size, batch_first=True, bidirectional=True)
        self.decoder = nn.LSTM(size, size, batch_first=True)
        self.src_dense, self.hx_dense = nn.Linear(2 * size, size), nn.Linear(2 * size, size)
        self.dropout = nn.Dropout1d(REFERENCE_DROPOUT)  # on [B, dim, words]: whole feature channels

    def forward(self, nodes: torch.Tensor, exists: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, 1 + W, D] → dependents [B, W, size], candidate heads [B, 1 + W, 2 size]."""
        width = nodes.size(1)
        # a sentence's length: up to its last word with a state (words past it are padding)
        lengths = (exists.long() * torch.arange(1, width + 1, device=exists.device)).amax(1).cpu()
        packed = pack_padded_sequence(nodes, lengths, batch_first=True, enforce_sorted=False)
        out, (_, cell) = self.encoder(packed)
        candidates = self._drop(pad_packed_sequence(out, batch_first=True, total_length=width)[0])
        cell = self.hx_dense(torch.cat([cell[-2], cell[-1]], -1)).unsqueeze(0)  # both directions' last cell
        source = F.elu(self.src_dense(candidates[:, 1:]))
        packed = pack_padded_sequence(source, (lengths - 1).clamp(min=1), batch_first=True, enforce_sorted=False)
        out, _ = self.decoder(packed, (torch.tanh(cell), cell))
        dependents = self._drop(pad_packed_sequence(out, batch_first=True, total_length=width - 1)[0])
        return dependents, candidates

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x.transpose(1, 2)).transpose(1, 2)


@register_head("dependency")
class DependencyHead(CountedLoss):
    label_fields = ("heads", "deprels")

    @property
    def extra_inputs(self) -> tuple[str, ...]:
        return ("token_word",) + (("pos_ids",) if self.pos_embedding is not None else ())

    def __init__(self, hidden_size: int, num_labels: int, dropout: float = 0.1, word_pooling: str = "first",
                 arc_dim: int = 512, label_dim: int = 128, num_pos: int = 0, pos_dim: int = 0,
                 lstm_size: int = 0, init: str = "zero"):
        super().__init__()
        if word_pooling not in WORD_POOLINGS or init not in BIAFFINE_INITS:
            raise ValueError(f"word_pooling={word_pooling!r} (one of {WORD_POOLINGS}), "
                             f"init={init!r} (one of {BIAFFINE_INITS})")
        self.word_pooling = word_pooling
        width = hidden_size * (2 if word_pooling == "first_last" else 1)
        self.pos_embedding = nn.Embedding(num_pos, pos_dim) if pos_dim > 0 else None
        self.pos_dropout = nn.Dropout1d(REFERENCE_DROPOUT)  # on [B, words, dim]: whole words
        width += pos_dim if pos_dim > 0 else 0
        self.lstm = WordLSTM(width, lstm_size) if lstm_size > 0 else None
        self.dropout = nn.Dropout(0.0 if self.lstm is not None else dropout)
        dep_size, head_size = (lstm_size, 2 * lstm_size) if self.lstm is not None else (width, width)
        self.arc_dep, self.arc_head = nn.Linear(dep_size, arc_dim), nn.Linear(head_size, arc_dim)
        self.label_dep, self.label_head = nn.Linear(dep_size, label_dim), nn.Linear(head_size, label_dim)
        self.arc_weight = nn.Parameter(torch.zeros(arc_dim, arc_dim))
        self.arc_head_bias = nn.Parameter(torch.zeros(arc_dim))
        # [label, dependent + 1, head + 1]: the bilinear term, both linear terms and the bias in one
        self.label_weight = nn.Parameter(torch.zeros(num_labels, label_dim + 1, label_dim + 1))
        if init == "xavier":
            self._xavier(arc_dim, label_dim, num_labels)
        # "zero" (Dozat & Manning): every head equally likely at first

    @torch.no_grad()
    def _xavier(self, arc_dim: int, label_dim: int, num_labels: int) -> None:
        """KLUE-baseline's init, with its tensors' shapes (so the same fans): ``BiAttention`` U
        [1, a, a] and W_e [1, a] (its W_d term and bias are constant per dependent, so they cancel in
        the softmax over heads and kotune has none), ``BiLinear`` U [L, l, l], W_l and W_r [L, l]; bias 0."""
        nn.init.xavier_uniform_(self.arc_weight.view(1, arc_dim, arc_dim))
        nn.init.xavier_uniform_(self.arc_head_bias.view(1, arc_dim))
        nn.init.xavier_uniform_(self.label_weight[:, :label_dim, :label_dim])
        for linear_term in (self.label_weight[:, :label_dim, label_dim], self.label_weight[:, label_dim, :label_dim]):
            nn.init.xavier_uniform_(linear_term)

    def word_states(self, hidden_states: torch.Tensor, token_word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T, H] → root + word states [B, 1 + T, H] (2H for first_last: the root is [CLS] twice,
        as in KLUE-baseline's ``resize_outputs``) and which of those exist [B, 1 + T]. The word axis
        is as wide as the token axis (no word has a number past it: tasks/dp.py ``word_of_tokens``):
        a width read from the word numbers would make the host wait on the device every step and
        break a compiled graph; the slots past the batch's words do not exist, so they are neither
        dependents with a gold head nor candidate heads, and the loss and the predicted words are the same."""
        return self._word_states(hidden_states, token_word, token_word.size(1))

    def _word_states(self, hidden_states: torch.Tensor, token_word: torch.Tensor,
                     width: int) -> tuple[torch.Tensor, torch.Tensor]:
        token_word = token_word.long()
        words = torch.arange(width, device=token_word.device)
        member = (token_word.unsqueeze(1) == words.view(1, -1, 1)).to(hidden_states.dtype)  # [B, W, T]
        counts = member.sum(-1, keepdim=True)
        exists = torch.cat([torch.ones_like(counts[:, :1, 0], dtype=torch.bool), counts[..., 0] > 0], 1)
        first = member * (member.cumsum(-1) == 1).to(member.dtype)
        if self.word_pooling == "mean":
            states = member @ hidden_states / counts.clamp(min=1.0)
        elif self.word_pooling == "first":
            states = first @ hidden_states
        else:
            last = member * (member.flip(-1).cumsum(-1).flip(-1) == 1).to(member.dtype)
            states = torch.cat([first @ hidden_states, last @ hidden_states], -1)
        cls = hidden_states[:, :1]
        root = torch.cat([cls, cls], -1) if self.word_pooling == "first_last" else cls
        return torch.cat([root, states], 1), exists

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None,
                token_word: torch.Tensor, pos_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        nodes, exists = self.word_states(hidden_states, token_word)
        if self.pos_embedding is not None:
            pos = self.pos_embedding(self._root_and_words(pos_ids, nodes.size(1)))
            nodes = torch.cat([nodes, self.pos_dropout(pos)], -1)
        if self.lstm is not None:
            dependents, candidates = self.lstm(nodes, exists)
        else:
            nodes = self.dropout(nodes)
            dependents, candidates = nodes[:, 1:], nodes
        dep = self.dropout(F.elu(self.arc_dep(dependents)))
        head = self.dropout(F.elu(self.arc_head(candidates)))
        arc = dep @ self.arc_weight @ head.transpose(1, 2) + (head @ self.arc_head_bias).unsqueeze(1)  # [B, W, 1 + W]
        width = arc.size(1)
        # a candidate must exist and differ from the dependent (word k is candidate k + 1)
        slots = torch.arange(width + 1, device=arc.device)  # made on the device: no copy from the host
        self_arc = slots[:width, None] + 1 == slots[None, :]
        allowed = exists.unsqueeze(1) & ~self_arc
        arc = arc.float().masked_fill(~allowed, torch.finfo(torch.float32).min / 2)
        label_dep = self._with_bias(F.elu(self.label_dep(dependents)))
        label_head = self._with_bias(F.elu(self.label_head(candidates)))
        if self.training:  # every pair: the loss picks the gold head
            labels = torch.einsum("bix,lxy,bjy->bijl", label_dep, self.label_weight, label_head)
            return arc, labels
        heads = arc.argmax(-1)  # [B, W]
        at_head = torch.gather(label_head, 1, heads.unsqueeze(-1).expand(-1, -1, label_head.size(-1)))
        labels = torch.einsum("bix,lxy,biy->bil", label_dep, self.label_weight, at_head).argmax(-1)
        return heads, labels

    def _root_and_words(self, pos_ids: torch.Tensor | None, width: int) -> torch.Tensor:
        """Per-word POS ids [B, W'] (padded with -100) → [B, width] with the root's id first; the
        root's id (the last) also stands for padding, as KLUE-baseline's ``pos_padding_idx``."""
        if pos_ids is None:
            raise ValueError("this dependency head embeds POS tags: the batch has no pos_ids")
        root_id = self.pos_embedding.num_embeddings - 1
        words = pos_ids.long()[:, : width - 1]
        words = F.pad(words, (0, width - 1 - words.size(1)), value=IGNORE)
        ids = torch.cat([torch.full_like(words[:, :1], root_id), words], 1)
        return ids.masked_fill(ids < 0, root_id)

    def _with_bias(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.dropout(x), torch.ones_like(x[..., :1])], -1)

    def loss_sums(self, logits: tuple[torch.Tensor, torch.Tensor], heads: torch.Tensor,
                  deprels: torch.Tensor) -> list[torch.Tensor]:
        """The gold heads' and the gold labels' cross-entropy, summed over the words with a gold
        head (the loss is their mean, plus the labels' mean). From inference outputs: the words
        whose head or label is wrong (the loss is then the labelled-attachment error rate)."""
        first = logits[0]
        heads, deprels = (self._fit(t.long(), first.size(1)) for t in (heads, deprels))
        if first.dim() == 2:
            wrong = ((first != heads) | (logits[1] != deprels)) & (heads != IGNORE)
            return [wrong.sum().float(), first.new_zeros((), dtype=torch.float)]
        arc, labels = logits
        at_gold = torch.gather(labels, 2, heads.clamp(min=0)[..., None, None].expand(-1, -1, 1, labels.size(-1)))
        return [cross_entropy_sum(arc, heads), cross_entropy_sum(at_gold.squeeze(2), deprels)]

    def loss_counts(self, heads: torch.Tensor, deprels: torch.Tensor) -> torch.Tensor:
        """Words with a gold head, and with a gold label (the same words; padding past the
        batch's words, cut by ``_fit``, is -100 and counts for nothing)."""
        return torch.stack([labelled(heads), labelled(deprels)])

    @staticmethod
    def _fit(labels: torch.Tensor, width: int) -> torch.Tensor:
        """Label rows padded by the collator (maybe rounded up) to the batch's word count."""
        if labels.size(1) >= width:
            return labels[:, :width]
        return F.pad(labels, (0, width - labels.size(1)), value=IGNORE)
