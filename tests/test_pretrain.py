"""action=pretrain: masking (rates, whole words, specials, labels), packing, bad input, resume and
the round trip pretrain → fill-mask → fine-tune. Tiny sizes: a WordPiece vocabulary trained on
the NLI sample sentences, a 2-layer BERT, a few steps."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT
from tasks import pretrain
from tasks.collate import IGNORE

SAMPLE = ROOT / "tasks" / "samples" / "nli" / "train.json"


def sentences() -> list[str]:
    rows = json.loads(SAMPLE.read_text(encoding="utf-8"))
    return [r[k] for r in rows for k in ("premise", "hypothesis")]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from heads.model.encoder import train_wordpiece

    return train_wordpiece(sentences(), 300, str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def blocks(tokenizer):
    lines = sentences() * 4
    return pretrain.pack_blocks(tokenizer, *pretrain.tokenize_lines(tokenizer, lines), 32)


def settings(**kw):
    return OmegaConf.create({"objective": "mlm", "mlm_probability": 0.15, "whole_word": False, **kw})


def mask(tokenizer, rows, whole_word: bool, seed: int = 0):
    collator = pretrain.mlm_collator(tokenizer, settings(whole_word=whole_word), seed=seed)
    inputs = torch.tensor([r["input_ids"] for r in rows])
    batch = collator(pretrain.model_rows(rows, whole_word))
    return inputs, batch


def test_packing_fills_blocks_with_sep_between_lines(tokenizer, blocks):
    lines = sentences() * 4
    ids, _ = pretrain.tokenize_lines(tokenizer, lines)
    assert all(len(b["input_ids"]) == 32 for b in blocks)
    assert all(b["input_ids"][0] == tokenizer.cls_token_id for b in blocks)
    assert all(all(b["attention_mask"]) for b in blocks[:-1])  # only the last block is padded
    stream = [t for b in blocks for t, m in zip(b["input_ids"][1:], b["attention_mask"][1:]) if m]
    expected = [t for line in ids for t in line + [tokenizer.sep_token_id]]
    assert stream == expected  # every line, in order, one [SEP] after each
    assert pretrain.padding_efficiency(blocks) >= 0.99
    by_line = pretrain.line_blocks(tokenizer, ids, _, 32)
    assert pretrain.padding_efficiency(by_line) < 0.9  # the baseline pads short sentences


def test_token_masking_rates_and_labels(tokenizer, blocks):
    rows = blocks * 6
    inputs, batch = mask(tokenizer, rows, whole_word=False)
    special = torch.tensor([r["special_tokens_mask"] for r in rows]).bool()
    labels, out = batch["labels"], batch["input_ids"]
    chosen = labels != IGNORE
    assert not (chosen & special).any()  # [CLS], [SEP], [PAD] never chosen
    assert torch.equal(labels[chosen], inputs[chosen])  # the label is the original token
    rate = chosen.sum().item() / (~special).sum().item()
    assert 0.13 < rate < 0.17
    as_mask = (out[chosen] == tokenizer.mask_token_id).float().mean().item()
    kept = (out[chosen] == inputs[chosen]).float().mean().item()
    assert 0.75 < as_mask < 0.85 and 0.06 < kept < 0.15  # 80 % [MASK]; 10 % kept (+ random hits)
    assert torch.equal(out[~chosen], inputs[~chosen])  # nothing else changes


def words(row: dict) -> list[list[int]]:
    """Token positions of each whitespace-separated word of a packed block (from its offsets)."""
    groups, prev_end = [], None
    for i, ((s, e), sp) in enumerate(zip(row["offset_mapping"], row["special_tokens_mask"])):
        if sp:
            prev_end = None
            continue
        if prev_end is None or s != prev_end:
            groups.append([])
        groups[-1].append(i)
        prev_end = e
    return groups


def test_whole_word_masking_masks_eojeol_together(tokenizer, blocks):
    rows = blocks * 6
    inputs, batch = mask(tokenizer, rows, whole_word=True)
    chosen = batch["labels"] != IGNORE
    special = torch.tensor([r["special_tokens_mask"] for r in rows]).bool()
    assert not (chosen & special).any()
    multi = 0
    for r, row in enumerate(rows):
        for word in words(row):
            flags = {bool(chosen[r, i]) for i in word}
            assert len(flags) == 1, f"word {word} of row {r} partly masked"
            multi += len(word) > 1 and flags == {True}
    assert multi > 20  # eojeol of several WordPieces were masked whole
    assert (batch["input_ids"][chosen] == tokenizer.mask_token_id).all()
    rate = chosen.sum().item() / (~special).sum().item()
    assert 0.11 < rate < 0.19


def test_fixed_seed_masks_the_same(tokenizer, blocks):
    _, a = mask(tokenizer, blocks, whole_word=False, seed=3)
    _, b = mask(tokenizer, blocks, whole_word=False, seed=3)
    assert torch.equal(a["labels"], b["labels"]) and torch.equal(a["input_ids"], b["input_ids"])


BERT_SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
MLM_CONFIGS = {  # tiny *ForMaskedLM of each architecture with its own MLM head, and one without (its own forward)
    "bert": BERT_SIZES, "roberta": BERT_SIZES, "electra": {**BERT_SIZES, "embedding_size": 16},
    "distilbert": {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "dropout": 0.0, "attention_dropout": 0.0},
}


def assert_loss_and_gradients_equal_the_models_own(model, batch: dict) -> None:
    from heads.model.mlm import masked_lm_loss

    model.zero_grad()
    full = model(**batch).loss
    full.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    loss = masked_lm_loss(model, batch)
    loss.backward()
    assert loss.item() == pytest.approx(full.item(), abs=1e-5)
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, expected[name], atol=1e-4), name


@pytest.mark.parametrize("arch", sorted(MLM_CONFIGS))
def test_masked_only_loss_and_gradients_equal_the_full_computation(arch, tokenizer, blocks):
    from transformers import AutoConfig, AutoModelForMaskedLM

    from heads.model.mlm import masked_logits

    config = AutoConfig.for_model(arch, vocab_size=len(tokenizer), max_position_embeddings=64, **MLM_CONFIGS[arch])
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(config)
    for whole_word in (False, True):
        _, batch = mask(tokenizer, blocks, whole_word=whole_word)
        assert_loss_and_gradients_equal_the_models_own(model, batch)
    logits, gold = masked_logits(model, batch)  # what the held-out metrics score: the full logits' rows
    chosen = batch["labels"] != IGNORE
    with torch.no_grad():
        assert torch.allclose(logits, model(**{k: v for k, v in batch.items() if k != "labels"}).logits[chosen],
                              atol=1e-5)
    assert torch.equal(gold, batch["labels"][chosen])


def fixed_batch(vocab_size: int) -> dict:
    """Four rows of 12 masked at 4, 1, 0 and 2 positions (the last row padded after 9 tokens)."""
    ids = torch.randint(5, vocab_size, (4, 12), generator=torch.Generator().manual_seed(1))
    labels, mask = torch.full_like(ids, IGNORE), torch.ones_like(ids)
    for row, where in enumerate(([1, 4, 5, 9], [3], [], [2, 7])):
        labels[row, where] = ids[row, where]
        ids[row, where] = 4
    mask[3, 9:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def loss_and_gradients(model, loss) -> tuple[torch.Tensor, dict]:
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return loss.detach(), grads


@pytest.mark.parametrize("full_forward", [False, True])
@pytest.mark.parametrize("arch", [*sorted(MLM_CONFIGS), "bert+nsp"])
def test_masked_positions_index_gives_the_boolean_indexed_loss_gradients_and_metrics(arch, full_forward):
    """A training batch's ``masked_positions`` (a fixed-shape gather, no host wait) against the
    boolean indexing a batch without it takes: rows with different numbers of masked positions,
    one with none; equal to float rounding (the same numbers summed in another order)."""
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoModelForPreTraining

    from heads.model.mlm import masked_lm_loss, masked_logits, mlm_metrics

    nsp = arch == "bert+nsp"
    config = AutoConfig.for_model(arch.split("+")[0], vocab_size=60, max_position_embeddings=64,
                                  **MLM_CONFIGS[arch.split("+")[0]])
    torch.manual_seed(0)
    model = (AutoModelForPreTraining if nsp else AutoModelForMaskedLM).from_config(config)
    batch = {**fixed_batch(60), **({"next_sentence_label": torch.tensor([0, 1, 1, 0])} if nsp else {})}
    positions = pretrain.masked_positions(batch["labels"])
    assert positions.tolist() == [[1, 4, 5, 9], [3, IGNORE, IGNORE, IGNORE], [IGNORE] * 4, [2, 7, IGNORE, IGNORE]]
    indexed = {**batch, "masked_positions": positions}
    loss, grads = loss_and_gradients(model, masked_lm_loss(model, batch, full_forward=full_forward))
    fixed, fixed_grads = loss_and_gradients(model, masked_lm_loss(model, indexed, full_forward=full_forward))
    torch.testing.assert_close(fixed, loss)
    assert grads.keys() == fixed_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(fixed_grads[name], grad, msg=name)
    with torch.no_grad():
        logits, gold = masked_logits(model, batch)
        slots, slot_gold = masked_logits(model, indexed)
    assert slots.shape[0] == 16 and torch.equal(slot_gold[slot_gold != IGNORE], gold)
    torch.testing.assert_close(slots[slot_gold != IGNORE], logits)
    scores, slot_scores = mlm_metrics(model, [batch]), mlm_metrics(model, [indexed])
    assert slot_scores.keys() == scores.keys() and slot_scores["n_masked"] == scores["n_masked"] == 7
    for key, value in scores.items():
        assert slot_scores[key] == pytest.approx(value, rel=1e-6), key


def test_training_batches_carry_each_rows_masked_positions(tokenizer, blocks):
    """Where a host read waits (a GPU: index_positions), a training batch carries its masked positions
    as a fixed-shape index; on a CPU (the default) it does not, and the step picks them as before."""
    rows = pretrain.model_rows(blocks, False)
    assert "masked_positions" not in pretrain.training_collator(tokenizer, settings(), seed=1)(
        [{**rows[i], "mask_key": (0, i)} for i in range(6)])
    collator = pretrain.training_collator(tokenizer, settings(), seed=1, index_positions=True)
    batch = collator([{**rows[i], "mask_key": (0, i)} for i in range(6)])
    positions, chosen = batch["masked_positions"], batch["labels"] != IGNORE
    assert positions.shape == (6, int(chosen.sum(1).max()))  # K: the most of any row, known on the host
    for row in range(6):
        assert positions[row][positions[row] != IGNORE].tolist() == chosen[row].nonzero().flatten().tolist()


def test_training_masks_are_keyed_on_the_row_place_not_the_global_rng(tokenizer, blocks):
    rows = pretrain.model_rows(blocks, False)
    collator = pretrain.training_collator(tokenizer, settings(), seed=1)
    sampler, data = pretrain.EpochSampler(len(rows), seed=1), pretrain.KeyedRows(rows)

    def epoch_batches(epoch: int) -> list[dict]:
        sampler.set_epoch(epoch)
        keys = list(sampler)
        return [collator([data[k] for k in keys[i:i + 4]]) for i in range(0, len(keys), 4)]

    torch.manual_seed(0)
    first = epoch_batches(0)
    torch.manual_seed(123)  # another global RNG state: the same masks
    again = epoch_batches(0)
    for a, b in zip(first, again):
        assert torch.equal(a["labels"], b["labels"]) and torch.equal(a["input_ids"], b["input_ids"])
    # one batch collated alone (a resumed run's first batch) is masked as in the whole epoch
    sampler.set_epoch(0)
    keys = list(sampler)[4:8]
    assert torch.equal(collator([data[k] for k in keys])["labels"], first[1]["labels"])
    # a row is masked as it is whatever batch it is in: two half batches (grad_accum=2) as one
    halves = [collator([data[k] for k in part])["labels"] for part in (keys[:2], keys[2:])]
    assert torch.equal(torch.cat(halves), first[1]["labels"])
    # the next epoch masks every block anew
    by_row = {}
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        keys = list(sampler)
        for batch_keys, batch in zip((keys[i:i + 4] for i in range(0, len(keys), 4)), epoch_batches(epoch)):
            for (_, row), labels in zip(batch_keys, batch["labels"]):
                by_row.setdefault(row, []).append(labels)
    assert all(not torch.equal(*masks) for masks in by_row.values())


def assert_consistent_held_out_metrics(held_out: dict) -> None:
    """Held-out masked-LM metrics that hang together (NaN, an empty batch, a mixed-up loss fail):
    accuracy a share of the masked tokens, perplexity exp(mean loss)."""
    count = held_out["n_masked"]
    assert count > 0 and 0 <= held_out["mlm_accuracy"] <= 100
    assert held_out["mlm_accuracy"] * count / 100 == pytest.approx(round(held_out["mlm_accuracy"] * count / 100),
                                                                   abs=1e-6)
    assert held_out["perplexity"] == pytest.approx(math.exp(held_out["mlm_loss"]), rel=1e-9)


def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(sentences() * 3) + "\n", encoding="utf-8")
    return path


TINY = ["action=pretrain", "model=tiny", "model.tokenizer.vocab_size=300", "train.max_length=32",
        "train.batch_size=8", "train.learning_rate=1e-3", "pretrain.max_eval_blocks=8"]


def test_sinusoidal_positions_are_shiftable_waves_at_the_init_scale():
    from heads.model.mlm import load_mlm_model
    from kotune.core.errors import ConfigError

    cfg = OmegaConf.create({"init": "random", "architecture": "bert", "name_or_path": None, "tokenizer": {},
                            "config_overrides": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 1,
                                                 "intermediate_size": 64, "max_position_embeddings": 40}})
    plain = load_mlm_model(cfg, 100, seed=0)
    waves = load_mlm_model(cfg, 100, seed=0, position_init="sinusoidal")
    table = waves.bert.embeddings.position_embeddings.weight.detach()
    assert table.std().item() == pytest.approx(waves.config.initializer_range, rel=1e-4)
    # a shift by k positions is one linear map for every position (why neighbours are easy to find)
    shift, _ = torch.linalg.lstsq(table[:-1].double(), table[1:].double())[:2]
    assert torch.allclose(table[:-1].double() @ shift, table[1:].double(), atol=1e-6)
    random_table = plain.bert.embeddings.position_embeddings.weight.detach()
    fit, _ = torch.linalg.lstsq(random_table[:-1].double(), random_table[1:].double())[:2]
    assert not torch.allclose(random_table[:-1].double() @ fit, random_table[1:].double(), atol=1e-3)
    # everything else is the same seeded init
    assert torch.equal(plain.bert.embeddings.word_embeddings.weight, waves.bert.embeddings.word_embeddings.weight)
    with pytest.raises(ConfigError, match="position_init"):
        load_mlm_model(cfg, 100, seed=0, position_init="rotary")


def test_tied_qk_attention_starts_local_with_sinusoidal_positions():
    from heads.model.mlm import load_mlm_model
    from kotune.core.errors import ConfigError

    cfg = OmegaConf.create({"init": "random", "architecture": "bert", "name_or_path": None, "tokenizer": {},
                            "config_overrides": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                                                 "intermediate_size": 128, "max_position_embeddings": 64}})
    waves = load_mlm_model(cfg, 100, seed=0, position_init="sinusoidal")
    tied = load_mlm_model(cfg, 100, seed=0, position_init="sinusoidal", attention_init="tied_qk")
    for layer in tied.bert.encoder.layer:
        attention = layer.attention.self
        assert torch.equal(attention.query.weight, attention.key.weight)
        for rows in attention.query.weight.detach().split(32):  # each head: orthonormal rows
            assert torch.allclose(rows @ rows.T, torch.eye(32), atol=1e-5)
    # the rest of the seeded init is untouched
    assert torch.equal(waves.bert.embeddings.word_embeddings.weight, tied.bert.embeddings.word_embeddings.weight)

    def attention_shares(model):  # first layer, step 0: mass on the token itself, on tokens 1-2 away
        ids = torch.randint(5, 100, (4, 64), generator=torch.Generator().manual_seed(0))
        model.set_attn_implementation("eager")  # sdpa returns no attention weights
        with torch.no_grad():
            attn = model.bert(input_ids=ids, output_attentions=True).attentions[0]
        distance = (torch.arange(64)[:, None] - torch.arange(64)[None, :]).abs()
        return [attn[..., (distance >= low) & (distance <= high)].sum().item() / attn.sum().item()
                for low, high in ((0, 0), (1, 2))]

    standard_self, standard_near = attention_shares(waves)
    tied_self, tied_near = attention_shares(tied)
    blind_self, blind_near = attention_shares(load_mlm_model(cfg, 100, seed=0, attention_init="tied_qk"))
    assert standard_self < 2 / 64 < 0.2 < tied_self  # standard init: near uniform
    # sinusoidal positions are what turns "attend to what is like you" into "attend to neighbours"
    assert max(standard_near, blind_near) < 0.07 < tied_near  # uniform: 4 / 64 = 0.0625
    with pytest.raises(ConfigError, match="attention_init"):
        load_mlm_model(cfg, 100, seed=0, attention_init="identity")


@pytest.mark.parametrize("heads", [1, 4])
def test_mimetic_attention_is_the_papers_query_key_and_value_output_form(heads):
    from heads.model.mlm import load_mlm_model
    from kotune.core.errors import ConfigError

    d = 64
    cfg = OmegaConf.create({"init": "random", "architecture": "bert", "name_or_path": None, "tokenizer": {},
                            "config_overrides": {"hidden_size": d, "num_hidden_layers": 2, "num_attention_heads": heads,
                                                 "intermediate_size": 128, "max_position_embeddings": 64}})
    standard = load_mlm_model(cfg, 100, seed=0)
    model = load_mlm_model(cfg, 100, seed=0, attention_init="mimetic", mimetic_alpha=[0.7, 0.4],
                           mimetic_beta=[0.5, 0.3])
    size, off = d // heads, ~torch.eye(d, dtype=torch.bool)
    for layer in model.bert.encoder.layer:
        attention, output = layer.attention.self, layer.attention.output.dense
        for h in range(heads):  # W_qᵀ W_k: the score form x_i W_qᵀ W_k x_jᵀ of head h
            rows = slice(h * size, (h + 1) * size)
            form = (attention.query.weight[rows].T @ attention.key.weight[rows]).detach()
            assert torch.linalg.matrix_rank(form) == size
            if heads == 1:  # full rank: exactly αZ + βI, Z with N(0, 1/d) entries
                assert form.diagonal().mean().item() == pytest.approx(0.5, abs=0.05)
                assert form[off].std().item() == pytest.approx(0.7 / d ** 0.5, rel=0.1)
            else:  # its rank-d/heads truncation: the identity part keeps a positive diagonal
                assert form.diagonal().mean().item() > 3 * form[off].std().item()
        value_output = (attention.value.weight.T @ output.weight.T).detach()  # x → x W_vᵀ W_oᵀ, all heads
        assert value_output.diagonal().mean().item() == pytest.approx(-0.3, abs=0.05)
        assert value_output[off].std().item() == pytest.approx(0.4 / d ** 0.5, rel=0.1)
        assert not attention.query.bias.any() and not output.bias.any()
    # the rest of the seeded init is untouched
    for name, param in standard.named_parameters():
        if not any(k in name for k in ("query.weight", "key.weight", "value.weight", "attention.output.dense.weight")):
            assert torch.equal(param, model.get_parameter(name)), name
    for alpha, beta in (([0.7], [0.7, 0.4]), ([0.7, -1], [0.7, 0.4]), (["x", 1], [0.7, 0.4])):
        with pytest.raises(ConfigError, match="pretrain.mimetic_alpha=.*two numbers >= 0"):
            load_mlm_model(cfg, 100, seed=0, attention_init="mimetic", mimetic_alpha=alpha, mimetic_beta=beta)


def documents_corpus(tmp_path: Path) -> Path:
    """The sample sentences as blank-line-separated documents of four sentences each."""
    lines = sentences() * 3
    path = tmp_path / "documents.txt"
    path.write_text("\n\n".join("\n".join(lines[i:i + 4]) for i in range(0, len(lines), 4)) + "\n", encoding="utf-8")
    return path


def test_documents_are_blank_line_blocks_or_the_sentences_of_a_line(tmp_path):
    blocks = tmp_path / "blocks.txt"
    blocks.write_text("\n첫 문장.\n둘째 문장.\n\n\n셋째 문장!\n", encoding="utf-8")
    lines = tmp_path / "lines.txt"
    lines.write_text("첫 문장. 둘째 문장?  셋째\n다른 글… 끝!\n", encoding="utf-8")
    assert pretrain.read_documents([str(blocks)], "text", None) == [["첫 문장.", "둘째 문장."], ["셋째 문장!"]]
    assert pretrain.read_documents([str(lines)], "text", None) == [["첫 문장.", "둘째 문장?", "셋째"], ["다른 글…", "끝!"]]


def test_nsp_pairs_follow_bert_half_true_next_half_another_document(tokenizer):
    unique = list(dict.fromkeys(sentences()))  # each sentence in one document only
    documents = [unique[i:i + 4] for i in range(0, len(unique), 4)]
    text = pretrain.Text([s for d in documents for s in d], "docs", documents)
    rows = pretrain.nsp_pairs(tokenizer, text, 128, seed=0)
    ids, _ = pretrain.tokenize_lines(tokenizer, text.lines)
    sentence_doc = {tuple(i): n for n, d in enumerate(documents) for i in ids[sum(map(len, documents[:n])):][:len(d)]}
    sep = tokenizer.sep_token_id
    for row in rows:
        real = sum(row["attention_mask"])
        tokens, types = row["input_ids"][:real], row["token_type_ids"][:real]
        assert len(row["input_ids"]) == 128 and tokens[0] == tokenizer.cls_token_id and tokens[-1] == sep
        a_end = tokens.index(sep)
        assert types == [0] * (a_end + 1) + [1] * (real - a_end - 1)
        assert row["special_tokens_mask"][:real] == [1] + [0] * (a_end - 1) + [1] + [0] * (real - a_end - 2) + [1]
    labels = [r["next_sentence_label"] for r in rows]
    # a coin per chunk, and a one-sentence chunk (often a put-back remainder) always takes a random next
    assert 0.45 < sum(labels) / len(labels) < 0.7
    # a true next segment continues A's document; whole sentences that fit show where each came from
    checked = {0: 0, 1: 0}
    for row in rows:
        tokens = row["input_ids"][1:sum(row["attention_mask"]) - 1]
        a, b = tokens[:tokens.index(sep)], tokens[tokens.index(sep) + 1:]
        doc_a = {sentence_doc[k] for k in sentence_doc if len(k) <= len(a) and tuple(a[:len(k)]) == k}
        doc_b = {sentence_doc[k] for k in sentence_doc if len(k) <= len(b) and tuple(b[:len(k)]) == k}
        if len(doc_a) == 1 and len(doc_b) == 1:
            checked[row["next_sentence_label"]] += 1
            assert (doc_a == doc_b) == (row["next_sentence_label"] == 0)
    assert min(checked.values()) > 5
    assert rows == pretrain.nsp_pairs(tokenizer, text, 128, seed=0)  # seeded
    with pytest.raises(pretrain.DataError, match="docs: 1 document"):
        pretrain.nsp_pairs(tokenizer, pretrain.Text(documents[0], "docs", documents[:1]), 32, seed=0)


def test_nsp_leaves_out_sentences_that_tokenize_to_nothing_as_berts_reader(tokenizer, caplog):
    """A zero-width-space line is no sentence (BERT's create_pretraining_data.py keeps a line only
    if it has tokens): the pairs are those of the documents without it, and the log counts it."""
    unique = list(dict.fromkeys(sentences()))
    documents = [unique[i:i + 4] for i in range(0, 40, 4)]
    with_blanks = [[d[0], "\u200b", *d[1:]] for d in documents[:3]] + [["\u200b"]] + documents[3:]
    clean = pretrain.nsp_pairs(tokenizer, pretrain.Text([s for d in documents for s in d], "docs", documents), 64, 0)
    with caplog.at_level("INFO", logger="kotune"):
        rows = pretrain.nsp_pairs(tokenizer, pretrain.Text([s for d in with_blanks for s in d], "docs", with_blanks),
                                  64, seed=0)
    assert rows == clean
    assert "docs: 4 sentence(s) with no token (e.g. only a zero-width space) left out, " \
           "1 document(s) left without sentences" in caplog.text
    with pytest.raises(pretrain.DataError, match="docs: 1 document"):  # a blank document is none
        pretrain.nsp_pairs(tokenizer, pretrain.Text([*documents[0], "\u200b"], "docs", [documents[0], ["\u200b"]]),
                           32, seed=0)


def test_nsp_masked_only_loss_and_gradients_equal_bert_for_pretraining(tokenizer, tmp_path):
    from transformers import AutoConfig, AutoModelForPreTraining

    from heads.model.mlm import mlm_metrics

    documents = pretrain.read_documents([str(documents_corpus(tmp_path))], "text", None)
    text = pretrain.Text([s for d in documents for s in d], "docs", documents)
    rows = pretrain.nsp_pairs(tokenizer, text, 32, seed=0)[:24]
    config = AutoConfig.for_model("bert", vocab_size=len(tokenizer), max_position_embeddings=64, **BERT_SIZES)
    torch.manual_seed(0)
    model = AutoModelForPreTraining.from_config(config)
    _, batch = mask(tokenizer, rows, whole_word=False)
    assert set(batch) >= {"token_type_ids", "next_sentence_label"}
    assert_loss_and_gradients_equal_the_models_own(model, batch)
    scores = mlm_metrics(model, [batch])
    with torch.no_grad():
        nsp = model(**{k: v for k, v in batch.items() if k not in ("labels", "next_sentence_label")}).seq_relationship_logits
    assert scores["nsp_accuracy"] == pytest.approx(100 * (nsp.argmax(-1) == batch["next_sentence_label"]).float().mean().item())
    assert scores["n_pairs"] == 24
    share = batch["next_sentence_label"].float().mean().item()
    assert scores["nsp_majority_accuracy"] == pytest.approx(100 * max(share, 1 - share))


def test_nsp_round_trip_fill_mask_finetune_and_refusals(tmp_path, run_job):
    from transformers import AutoModelForMaskedLM, pipeline

    res = run_job(TINY + [f"data.train_file={documents_corpus(tmp_path)}", "pretrain.objective=mlm+nsp",
                          "train.max_steps=4"], "pre")
    assert res["status"] == "ok", res.get("error")
    for held_out in (res["initial_metrics"], res["metrics"]):
        assert_consistent_held_out_metrics(held_out)
        pairs = held_out["n_pairs"]
        assert pairs > 0 and held_out["nsp_accuracy"] * pairs / 100 == pytest.approx(
            round(held_out["nsp_accuracy"] * pairs / 100), abs=1e-6)  # a share of the pairs
        assert math.isfinite(held_out["nsp_loss"]) and 50 <= held_out["nsp_majority_accuracy"] <= 100
    assert res["objective"] == "mlm+nsp"
    model_dir = tmp_path / "pre" / "model"
    AutoModelForMaskedLM.from_pretrained(model_dir)
    assert len(pipeline("fill-mask", model=str(model_dir))("숙소가 [MASK] 편했어요.")) == 5
    out = run_job(["task=nli", "data=sample", "model=klue", f"model.name_or_path={model_dir}", "mode=frozen",
                   "train.max_steps=2"], "ft")
    assert out["status"] == "ok", out.get("error")
    from transformers import AutoModel

    from heads.model.kotune_model import KotuneModel

    tuned = KotuneModel.load(str(tmp_path / "ft" / "model")).encoder.state_dict()  # frozen: as loaded
    pretrained = AutoModel.from_pretrained(model_dir).state_dict()
    assert all(torch.equal(v, pretrained[k]) for k, v in tuned.items() if not k.startswith("pooler."))
    for extra, want in ((["pretrain.objective=mlm+nsp", "model.architecture=electra"],
                         "mlm+nsp needs a BERT model: electra has no next-sentence head"),
                        (["pretrain.objective=sop"], "pretrain.objective=sop: must be one of mlm, mlm+nsp")):
        bad = run_job(TINY + [f"data.train_file={documents_corpus(tmp_path)}", "train.max_steps=1", *extra], "bad")
        assert bad["status"] == "failed" and want in bad["error"] and "\n" not in bad["error"], bad.get("error")


def test_tokens_per_second_counts_only_the_steps_of_this_process():
    from kotune.actions.pretrain import tokens_per_second

    # 1,000 tokens an epoch, 2 epochs in 100 steps, 10 s: 200 tokens/s; resumed at step 75: 50 tokens/s
    assert tokens_per_second(1000, {"epoch": 2.0, "train_runtime": 10.0}, 100, None) == pytest.approx(200)
    assert tokens_per_second(1000, {"epoch": 2.0, "train_runtime": 2.5}, 100, 75) == pytest.approx(200)
    assert tokens_per_second(1000, {"epoch": 2.0, "train_runtime": 10.0}, 100, 75) == pytest.approx(50)


def test_round_trip_pretrain_fill_mask_finetune(tmp_path, run_job, cache_dir):
    from transformers import AutoModelForMaskedLM, pipeline

    res = run_job(TINY + [f"data.train_file={corpus(tmp_path)}", "train.max_steps=6"], "pre")
    assert res["status"] == "ok", res.get("error")
    for held_out in (res["initial_metrics"], res["metrics"]):
        assert_consistent_held_out_metrics(held_out)
    assert res["train_steps"] == 6 and res["padding_efficiency"] >= 0.99
    model_dir = tmp_path / "pre" / "model"
    mlm = AutoModelForMaskedLM.from_pretrained(model_dir)
    filled = pipeline("fill-mask", model=str(model_dir))("숙소가 [MASK] 편했어요.")
    assert len(filled) == 5 and len({f["token"] for f in filled}) == 5
    assert [f["score"] for f in filled] == sorted((f["score"] for f in filled), reverse=True)
    for mode in ("finetune", "frozen"):
        out = run_job(["task=nli", "data=sample", "model=klue", f"model.name_or_path={model_dir}",
                       f"mode={mode}", "train.max_steps=2"], f"ft_{mode}")
        assert out["status"] == "ok", out.get("error")
    from heads.model.kotune_model import KotuneModel

    tuned = KotuneModel.load(str(tmp_path / "ft_frozen" / "model"))
    # frozen: the encoder is exactly the pretrained one (weights really came from model/)
    assert torch.equal(tuned.encoder.embeddings.word_embeddings.weight,
                       mlm.bert.embeddings.word_embeddings.weight)


def test_resume_continues_from_the_last_checkpoint(tmp_path, run_job):
    text = corpus(tmp_path)
    args = TINY + [f"data.train_file={text}", "train.save_strategy=epoch", "save_model=false", "train.epochs=1"]
    first = run_job(args, "run")
    assert first["status"] == "ok" and first["resumed_from"] is None
    again = run_job(args, "run")  # the same command in the same run dir: continues from its checkpoint
    assert again["status"] == "ok", again.get("error")
    assert again["resumed_from"] == first["train_steps"] == again["train_steps"]
    assert again["metrics"] == pytest.approx(first["metrics"])
    assert again["train_loss"] == pytest.approx(first["train_loss"], abs=1e-6)
    changed = run_job(TINY + [f"data.train_file={text}", "train.save_strategy=epoch", "save_model=false",
                              "train.epochs=2"], "run")
    assert changed["status"] == "failed" and "train.epochs" in changed["error"]


def test_checkpoint_without_mlm_head_warns(tmp_path, run_job, tokenizer, caplog):
    from transformers import AutoModel, BertConfig

    plain = tmp_path / "encoder"
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                        intermediate_size=64)
    AutoModel.from_config(config).save_pretrained(plain)
    tokenizer.save_pretrained(plain)
    with caplog.at_level("WARNING", logger="kotune"):
        res = run_job(["action=pretrain", "model=klue", f"model.name_or_path={plain}", "train.max_length=32",
                       f"data.train_file={corpus(tmp_path)}", "train.max_steps=1", "save_model=false",
                       "pretrain.position_init=sinusoidal", "pretrain.attention_init=tied_qk"], "head")
    assert res["status"] == "ok", res.get("error")
    assert "no masked-LM head" in caplog.text and "starts fresh" in caplog.text
    assert "position_init=sinusoidal ignored" in caplog.text  # a checkpoint keeps its own weights
    assert "attention_init=tied_qk ignored" in caplog.text


@pytest.mark.parametrize("case", ["empty", "undecodable", "column", "vocab"])
def test_bad_input_is_one_line_naming_the_file(case, tmp_path, run_job):
    extra = []
    if case == "empty":
        path = tmp_path / "empty.txt"
        path.write_text("\n\n", encoding="utf-8")
        want = f"{path}: no text"
    elif case == "undecodable":
        path = tmp_path / "latin.txt"
        path.write_bytes("첫 줄\n둘째 줄\n".encode() + "caf\xe9\n".encode("latin-1"))
        want = f"{path}:3: not UTF-8"
    elif case == "column":
        path = tmp_path / "texts.csv"
        path.write_text("comment\n안녕하세요\n반갑습니다\n", encoding="utf-8")  # sentence would be read (a conventional name)
        want = f"{path}:2: missing field 'text'"
    else:
        path = corpus(tmp_path)
        extra = ["model.tokenizer.vocab_size=50000"]
        want = f"{path}: the text supports a WordPiece vocabulary of"
    res = run_job(TINY + [f"data.train_file={path}", "train.max_steps=1", *extra], case)
    assert res["status"] == "failed" and want in res["error"], res.get("error")
    assert "\n" not in res["error"] and "traceback" not in res


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp", "rtd"])
def test_resumed_pretraining_repeats_the_uninterrupted_steps(objective, tmp_path, run_job, monkeypatch):
    """Stopped after a checkpoint in the second epoch and run again: every step's loss and the
    train loss equal an uninterrupted run's (masks keyed on the batch, not the global RNG)."""
    import heads.model.mlm

    text = corpus(tmp_path) if objective == "mlm" else documents_corpus(tmp_path)
    electra = ["model.architecture=electra"] if objective == "rtd" else []  # rtd: ELECTRA's generator and discriminator
    args = TINY + electra + [f"data.train_file={text}", f"pretrain.objective={objective}", "save_model=false", "train.batch_size=64",
                   "train.max_steps=14", "train.save_strategy=steps", "train.save_steps=3", "train.logging_steps=1"]
    whole = run_job(args, "whole")
    assert whole["status"] == "ok", whole.get("error")
    original = heads.model.mlm.held_out_curve

    def stop_at_step_9(batches, every, curve, metrics=None):  # an interruption right after checkpoint-9
        callback = original(batches, every, curve, metrics)
        step_end = callback.on_step_end

        def on_step_end(args, state, control, **kwargs):
            step_end(args, state, control, **kwargs)
            control.should_training_stop = control.should_training_stop or state.global_step == 9

        callback.on_step_end = on_step_end
        return callback

    monkeypatch.setattr(heads.model.mlm, "held_out_curve", stop_at_step_9)
    assert run_job(args, "cut")["train_steps"] == 9
    monkeypatch.setattr(heads.model.mlm, "held_out_curve", original)
    resumed = run_job(args, "cut")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == 9
    assert resumed["train_steps"] == whole["train_steps"] == 14
    steps_per_epoch = -(-whole["n_train_blocks"] // 64)
    assert steps_per_epoch < 9 < 2 * steps_per_epoch  # resumed inside the second epoch
    assert [p["step"] for p in resumed["loss_curve"]] == list(range(1, 15))
    assert [p["loss"] for p in resumed["loss_curve"]] == pytest.approx([p["loss"] for p in whole["loss_curve"]], abs=1e-6)
    assert resumed["train_loss"] == pytest.approx(whole["train_loss"], abs=1e-6)
    assert resumed["metrics"] == pytest.approx(whole["metrics"], abs=1e-6)
