"""kotune's heads equal each architecture's own transformers head at step 0: same structure (logits
of the native class with the weights copied across), same init, BERT's pooler from the checkpoint."""
from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

ARCHS = ("bert", "roberta", "electra")
HEADS = {"sequence": {"num_labels": 3}, "token": {"num_labels": 5}, "span": {}}


def small_config(arch: str, **extra):
    from transformers import AutoConfig

    kwargs = dict(vocab_size=80, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=66, initializer_range=0.05, **extra)
    if arch == "electra":
        kwargs["embedding_size"] = 16  # ELECTRA projects its embeddings: the copy must carry that too
    if arch == "roberta":
        kwargs.update(pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    return AutoConfig.for_model(arch, **kwargs)


def small_encoder(arch: str, head: str, seed: int = 0):
    from transformers import AutoModel

    from heads.native import takes_pooler
    from heads.registry import HEADS

    config = small_config(arch)
    torch.manual_seed(seed)
    return AutoModel.from_config(config, **({} if takes_pooler(config, HEADS.get(head)) else
                                            {"add_pooling_layer": False} if arch != "electra" else {}))


def batch(arch: str):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 80, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    ids = ids.masked_fill(mask == 0, 1 if arch == "roberta" else 0)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if arch != "roberta":
        inputs["token_type_ids"] = (torch.arange(12) >= 6).long().expand(3, -1) * mask
    return inputs


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("head", list(HEADS))
def test_logits_equal_the_native_class_with_the_same_weights(arch, head):
    from kotune.export.native import native_class_name, to_native
    from heads.model.kotune_model import KotuneModel

    model = KotuneModel(small_encoder(arch, head), head, dict(HEADS[head])).eval()
    native = to_native(model)
    assert type(native).__name__ == native_class_name(model) == \
        {"bert": "Bert", "roberta": "Roberta", "electra": "Electra"}[arch] + \
        {"sequence": "ForSequenceClassification", "token": "ForTokenClassification",
         "span": "ForQuestionAnswering"}[head]
    inputs = batch(arch)
    with torch.no_grad():
        ours = model(**inputs)["logits"]
        theirs = native(**inputs)
    real = inputs["attention_mask"].bool()
    if head == "span":  # kotune masks padding for decoding; compare the real tokens
        for mine, hf in zip(ours, (theirs.start_logits, theirs.end_logits)):
            assert torch.allclose(mine[real], hf[real], atol=1e-5)
    elif head == "token":
        assert torch.allclose(ours[real], theirs.logits[real], atol=1e-5)
    else:
        assert torch.allclose(ours, theirs.logits, atol=1e-5)
    # and the native dropout sits where ours does: same rate, same count
    drops = [m.p for m in model.head.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    native_drops = [m.p for n, m in native.named_modules()
                    if isinstance(m, torch.nn.Dropout) and not n.startswith(native.base_model_prefix)]
    if head == "sequence" and arch == "bert":
        assert drops == native_drops == [0.1]
    elif head == "span":
        assert drops == native_drops == []
    else:
        assert drops == [0.1] and set(native_drops) == {0.1}


@pytest.mark.parametrize("arch", ARCHS)
def test_new_layers_are_initialised_as_init_weights(arch):
    from heads.model.kotune_model import KotuneModel

    torch.manual_seed(3)
    model = KotuneModel(small_encoder(arch, "token"), "token", {"num_labels": 400})
    weight, bias = model.head.out.weight, model.head.out.bias
    assert torch.count_nonzero(bias) == 0
    weight = weight.detach()
    assert abs(float(weight.std()) - 0.05) < 0.005 and abs(float(weight.mean())) < 0.005


def test_dropout_is_the_architectures_unless_set():
    from heads.model.kotune_model import KotuneModel

    encoder = small_encoder("electra", "sequence")
    encoder.config.classifier_dropout = 0.3
    assert KotuneModel(encoder, "sequence", {"num_labels": 2}).head.dropout.p == 0.3
    assert KotuneModel(small_encoder("bert", "token"), "token", {"num_labels": 2, "dropout": None}).head.dropout.p == 0.1
    assert KotuneModel(small_encoder("bert", "span"), "span", {}).head.dropout.p == 0.0
    assert KotuneModel(small_encoder("bert", "span"), "span", {"dropout": 0.2}).head.dropout.p == 0.2


def test_bert_sequence_head_starts_from_the_checkpoints_pooler(tmp_path):
    from transformers import BertModel

    from heads.model.encoder import load_encoder
    from heads.model.kotune_model import KotuneModel

    torch.manual_seed(5)
    saved = BertModel(small_config("bert"), add_pooling_layer=True)
    with torch.no_grad():
        saved.pooler.dense.weight.normal_(0, 1.0)  # unlike any fresh init
        saved.pooler.dense.bias.uniform_(-1, 1)
    saved.save_pretrained(tmp_path / "ckpt")
    cfg = OmegaConf.create({"name": "ckpt", "name_or_path": str(tmp_path / "ckpt"), "init": "pretrained"})
    for head in ("sequence", "pair"):
        model = KotuneModel(load_encoder(cfg, None, 0, head_kind=head), head, {"num_labels": 2})
        assert torch.equal(model.head.dense.weight, saved.pooler.dense.weight)
        assert torch.equal(model.head.dense.bias, saved.pooler.dense.bias)
        assert model.encoder.pooler is None  # the head pools; the encoder carries no unused layer
    token = KotuneModel(load_encoder(cfg, None, 0, head_kind="token"), "token", {"num_labels": 2})
    assert getattr(token.encoder, "pooler", None) is None
    assert load_encoder(cfg, None, 0).pooler is None  # no head named: as before, no pooler


@pytest.mark.parametrize("arch", ARCHS)
def test_save_and_load_round_trip(arch, tmp_path):
    from heads.model.kotune_model import KotuneModel

    model = KotuneModel(small_encoder(arch, "sequence"), "sequence", {"num_labels": 3}).eval()
    model.save(str(tmp_path / "m"))
    back = KotuneModel.load(str(tmp_path / "m")).eval()
    assert back.head.architecture == arch
    inputs = batch(arch)
    with torch.no_grad():
        assert torch.equal(model(**inputs)["logits"], back(**inputs)["logits"])


def test_format_1_checkpoint_keeps_its_old_head_shape(tmp_path):
    """Saved before heads followed the architecture: dropout → dense → tanh → dropout → out."""
    from heads.model.kotune_model import KotuneModel

    model = KotuneModel(small_encoder("electra", "sequence"), "sequence", {"num_labels": 3}).eval()
    model.save(str(tmp_path / "m"))
    spec_path = tmp_path / "m" / "kotune.json"
    spec = json.loads(spec_path.read_text())
    spec["format"] = 1
    del spec["head_kwargs"]["architecture"]
    del spec["manifest"]  # format 1 came before manifests (kotune/core/atomic_dir.py)
    (tmp_path / "m" / "kotune_manifest.json").unlink()
    spec_path.write_text(json.dumps(spec))
    old = KotuneModel.load(str(tmp_path / "m")).eval()
    assert old.head.architecture == "roberta"
    inputs = batch("electra")
    with torch.no_grad():
        x = model.encoder(**inputs).last_hidden_state[:, 0]
        expected = model.head.out(torch.tanh(model.head.dense(x)))
        assert torch.allclose(old(**inputs)["logits"], expected, atol=1e-6)
