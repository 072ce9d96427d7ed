"""A randomly initialised encoder (``model.init=random``) takes its tokenizer's pad id: RoBERTa numbers
positions from it and keeps its embedding row at zero, so with RoBERTa's default (1, a trained WordPiece
vocabulary's [UNK]) every [UNK] read as padding. The task encoder, the pretraining models (masked LM,
replaced-token detection) and a LoRA adapter's rebuilt base encoder, for BERT, ELECTRA and RoBERTa; and a
RoBERTa row as long as kotune lets it be (``position_limit``) fits its position table."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import compose
from test_pretrain import TINY, corpus, sentences

ARCHS = ("bert", "electra", "roberta")
UNSEEN = "☃"  # in no training text: [UNK]


def vocab_padding_at_three(tmp_path: Path) -> Path:
    """A bare WordPiece vocabulary directory whose [PAD] is id 3 (as some vocabularies number it), not
    any architecture's default pad id."""
    chars = sorted({c for s in sentences() for c in s if not c.isspace()})
    words = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", *chars, *("##" + c for c in chars)]
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return tmp_path / "vocab"


def encoder_side(arch: str, cache_dir: str, *extra: str):
    from kotune.loading.build import load_encoder_side

    cfg = compose(["model=tiny", f"model.architecture={arch}", f"cache_dir={cache_dir}", *extra])
    return load_encoder_side(cfg, None, sentences())


@pytest.mark.parametrize("arch", ARCHS)
def test_a_random_encoder_takes_the_tokenizers_pad_id(arch, cache_dir, tmp_path):
    vocab = vocab_padding_at_three(tmp_path)
    side = encoder_side(arch, cache_dir, "model.tokenizer.train=false", f"model.name_or_path={vocab}",
                        "model.tokenizer_kwargs.do_lower_case=false")
    assert side.tokenizer.pad_token_id == 3
    assert side.config.pad_token_id == side.encoder.config.pad_token_id == 3
    assert side.encoder.get_input_embeddings().padding_idx == 3


def test_an_unknown_token_is_a_real_token_to_a_random_roberta(cache_dir):
    """An [UNK] in a row gets the position of the token it stands for, and the encoder reads it as it
    reads any token: with [UNK]'s embedding row made that token's, the row gives the states the row
    with that token gives; the pads (the tokenizer's pad id) take the padding position."""
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    from heads.model.encoder import position_limit

    side = encoder_side("roberta", cache_dir)
    tokenizer, encoder = side.tokenizer, side.encoder.eval()
    assert encoder.config.pad_token_id == tokenizer.pad_token_id != tokenizer.unk_token_id
    ids = tokenizer([f"숙소가 {UNSEEN} 편했어요", "숙소가"], padding=True, return_tensors="pt")["input_ids"]
    at = int((ids[0] == tokenizer.unk_token_id).nonzero()[0, 0])
    known = ids.clone()
    known[0, at] = ids[0, at + 1]  # another real token in the [UNK]'s place
    positions = RobertaEmbeddings.create_position_ids_from_input_ids(ids, encoder.embeddings.padding_idx)
    assert torch.equal(positions, RobertaEmbeddings.create_position_ids_from_input_ids(known, encoder.embeddings.padding_idx))
    real = ids != tokenizer.pad_token_id
    assert positions[0].tolist() == list(range(1, ids.size(1) + 1))  # pad id 0: real tokens from 1
    assert (positions[~real] == encoder.embeddings.padding_idx).all() and (~real).any()
    with torch.no_grad():
        rows = encoder.get_input_embeddings().weight
        rows[tokenizer.unk_token_id] = rows[int(ids[0, at + 1])]
        mask = real.long()
        unknown = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        replaced = encoder(input_ids=known, attention_mask=mask).last_hidden_state
        # and a row as long as kotune lets one be fits the position table
        longest = position_limit(encoder.config)
        encoder(input_ids=torch.full((1, longest), int(ids[0, 1])), attention_mask=torch.ones(1, longest, dtype=torch.long))
    assert torch.allclose(unknown[0], replaced[0], atol=1e-6)


@pytest.mark.parametrize("objective, arch, vocab", [("mlm", "roberta", "trained"), ("rtd", "electra", "pad at 3")])
def test_pretraining_models_built_random_take_the_tokenizers_pad_id(objective, arch, vocab, tmp_path, run_job):
    """action=pretrain's masked-LM and replaced-token-detection models (discriminator and generator), as saved."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = [] if vocab == "trained" else ["model.tokenizer.train=false", "model.tokenizer_kwargs.do_lower_case=false",
                                                f"model.name_or_path={vocab_padding_at_three(tmp_path)}"]
    res = run_job(TINY + [f"data.train_file={corpus(tmp_path)}", "train.max_steps=1", f"model.architecture={arch}",
                          f"pretrain.objective={objective}", *tokenizer], "pre")
    assert res["status"] == "ok", res.get("error")
    pad = AutoTokenizer.from_pretrained(res["model_dir"]).pad_token_id
    assert pad == (0 if vocab == "trained" else 3)
    for folder in (res["model_dir"], res.get("generator_dir")):
        if folder:
            assert AutoConfig.from_pretrained(folder).pad_token_id == pad, folder


def test_a_lora_base_record_rebuilds_the_random_encoder_with_its_pad_id(cache_dir):
    """The record carries the pad id: the rebuilt base is the trained one, weights and pad id. A record
    written before it did (no pad id) rebuilds as its encoder was built then: the architecture's default."""
    from omegaconf import OmegaConf

    from heads.model.encoder import load_encoder
    from heads.model.feature_cache import weights_digest
    from heads.model.lora import base_record, rebuild_base

    side = encoder_side("roberta", cache_dir, "mode=lora")
    record = json.loads(json.dumps(side.base))  # as kotune.json holds it
    assert record["pad_token_id"] == side.tokenizer.pad_token_id == 0
    rebuilt = rebuild_base(record, "X")  # refuses weights other than the record's digest
    assert rebuilt.config.pad_token_id == 0 and rebuilt.embeddings.padding_idx == 0
    assert weights_digest(rebuilt) == weights_digest(side.encoder)
    # an older record: its encoder was built with the architecture's pad id (RoBERTa's 1)
    model_cfg = OmegaConf.create(record["model"])
    before = load_encoder(model_cfg, vocab_size=record["vocab_size"], seed=record["seed"])
    old = {k: v for k, v in base_record(record["model"], before, record["seed"]).items() if k != "pad_token_id"}
    again = rebuild_base(old, "X")
    assert again.config.pad_token_id == 1 and weights_digest(again) == weights_digest(before)


def test_a_lora_run_on_a_random_roberta_saves_and_reads_back_its_pad_id(run_job, tmp_path):
    from heads.model.kotune_model import KotuneModel

    args = ["task=nli", "model=tiny", "model.architecture=roberta", "data=sample", "mode=lora", "train.max_steps=1"]
    res = run_job(args, "train")
    assert res["status"] == "ok", res.get("error")
    spec = json.loads((tmp_path / "train" / "model" / "kotune.json").read_text(encoding="utf-8"))
    assert spec["lora"]["base"]["pad_token_id"] == 0
    assert KotuneModel.load(str(tmp_path / "train" / "model")).bare_encoder().config.pad_token_id == 0
    again = run_job([*args, "action=eval", f"checkpoint={tmp_path / 'train'}"], "eval")
    assert again["status"] == "ok", again.get("error")
    assert again["metrics"] == res["metrics"]


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


def test_a_pretrained_config_is_kept_as_saved_with_one_line_when_the_pad_ids_differ(tmp_path, caplog):
    from omegaconf import OmegaConf
    from transformers import RobertaConfig

    from heads.model.encoder import build_config

    RobertaConfig(vocab_size=10, pad_token_id=1).save_pretrained(tmp_path)
    model_cfg = OmegaConf.create({"name": "saved", "name_or_path": str(tmp_path), "init": "pretrained"})
    with caplog.at_level("WARNING", logger="kotune"):
        config = build_config(model_cfg, 10, 0)
    assert config.pad_token_id == 1
    lines = [r.getMessage() for r in caplog.records if "pad" in r.getMessage()]
    assert lines == ["warning: model saved: the config's pad_token_id=1 is not the tokenizer's pad id 0; "
                     "the pretrained config is kept as saved"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="kotune"):
        build_config(model_cfg, 10, 1)
    assert not caplog.records
