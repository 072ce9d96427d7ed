"""A randomly initialised encoder (``model.init=random``) takes its tokenizer's pad id: RoBERTa numbers
positions from it and keeps its embedding row at zero, so with RoBERTa's default (1, a trained WordPiece
vocabulary's [UNK]) every [UNK] read as padding. The task encoder, the pretraining models (masked LM,
replaced-token detection) and a LoRA adapter's rebuilt base encoder, for BERT, ELECTRA and RoBERTa; and a
RoBERTa row as long as kotune lets it be (``position_limit``) fits its position table."""
from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("rows, pad", [(514, 1), (130, 1), (512, 1), (512, 0), (258, 0)])
def test_a_roberta_row_as_long_as_kotune_allows_fits_its_position_table(rows, pad):
    """``position_limit``: the table's rows less the pad id and the pad's own row (RoBERTa's 514 with pad
    id 1: 512), whatever the size; one token more runs off the table."""
    from transformers import RobertaConfig, RobertaModel

    from heads.model.encoder import position_limit

    config = RobertaConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                           max_position_embeddings=rows, pad_token_id=pad)
    encoder = RobertaModel(config, add_pooling_layer=False).eval()
    limit = position_limit(config)
    with torch.no_grad():
        encoder(input_ids=torch.full((1, limit), 5))
        with pytest.raises((IndexError, RuntimeError)):
            encoder(input_ids=torch.full((1, limit + 1), 5))
