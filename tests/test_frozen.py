"""Frozen feature extraction: layer choice and scalar mix, pooling, the on-disk feature cache for
every head, and action=embed."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT, compose
from kotune.core.errors import ConfigError

TINY = ["model=tiny", "data=sample", "save_predictions=false"]


def job(overrides: list[str], run_dir: Path, cache_dir: Path) -> dict:
    """One in-process run with its own cache directory (the cache's hits and misses are the point)."""
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    cfg = compose(overrides + [f"cache_dir={cache_dir}"])
    quiet_libraries()
    return execute(cfg, str(run_dir))


def tiny_encoder(layers: int = 2):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    return BertModel(config, add_pooling_layer=False)


def token_rows(n: int = 7, seed: int = 0):
    """Rows of different lengths with per-token and per-row labels (a datasets.Dataset)."""
    import datasets

    rng = np.random.default_rng(seed)
    rows = {"input_ids": [], "attention_mask": [], "token_type_ids": [], "labels": [], "tags": [],
            "start_positions": [], "end_positions": []}
    for i in range(n):
        length = int(rng.integers(4, 20))
        rows["input_ids"].append([2] + rng.integers(5, 60, length - 2).tolist() + [3])
        rows["attention_mask"].append([1] * length)
        rows["token_type_ids"].append([0] * (length // 2) + [1] * (length - length // 2))
        rows["labels"].append(i % 3)
        rows["tags"].append([-100] + rng.integers(0, 3, length - 2).tolist() + [-100])
        rows["start_positions"].append(1)
        rows["end_positions"].append(length - 2)
    return datasets.Dataset.from_dict(rows)


# ---- layer choice, pooling, scalar mix ---------------------------------------------------------
def test_layer_choices_resolve_to_hidden_state_indices():
    from heads.model.layers import parse_layers

    assert parse_layers("last", 12).indices == (12,)
    assert parse_layers("last4_mean", 12).indices == (9, 10, 11, 12)
    mix = parse_layers("scalar_mix", 12)
    assert mix.indices == tuple(range(13)) and mix.stored == 13 and mix.learned
    assert parse_layers([0, -1], 12).indices == (0, 12) and parse_layers([0, -1], 12).stored == 1
    assert parse_layers("[0,-1]", 12).indices == (0, 12)  # as a string from the command line


@pytest.mark.parametrize("value,words", [("lastt", "unknown layer choice"), ([0, 3], "out of range"),
                                        ([-4], "out of range"), ("last4_mean", "needs 4 layers"),
                                        ([1, 1], "repeated"), ([1.5], "not an integer")])
def test_bad_layer_choice_is_one_config_error(value, words):
    from heads.model.layers import parse_layers

    with pytest.raises(ConfigError) as e:
        parse_layers(value, 2)
    assert "mode.layers" in str(e.value) and words in str(e.value) and "\n" not in str(e.value)


def test_pooling_must_fit_the_head():
    from heads.model.kotune_model import KotuneModel

    with pytest.raises(ConfigError, match="mode.pooling=mean does not fit the token head"):
        KotuneModel(tiny_encoder(), "token", {"num_labels": 3}, pooling="mean")
    with pytest.raises(ConfigError, match="mode.pooling=max: unknown pooling"):
        KotuneModel(tiny_encoder(), "sequence", {"num_labels": 3}, pooling="max")


def test_mean_pooling_ignores_padding():
    from heads.model.layers import pool

    states = torch.randn(1, 5, 4)
    padded = torch.cat([states, torch.full((1, 3, 4), 99.0)], dim=1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    assert torch.allclose(pool(padded, mask, "mean"), states.mean(1), atol=1e-6)
    assert torch.equal(pool(padded, mask, "cls"), states[:, 0])


def test_scalar_mix_weights_get_gradients_and_the_encoder_none():
    from heads.model.kotune_model import KotuneModel

    model = KotuneModel(tiny_encoder(), "sequence", {"num_labels": 3}, frozen=True, layers="scalar_mix")
    batch = token_rows(4).select_columns(["input_ids", "attention_mask", "token_type_ids", "labels"])
    from tasks.collate import DynamicPaddingCollator

    model.train()
    out = model(**DynamicPaddingCollator(0, 8)([batch[i] for i in range(4)]))
    out["loss"].backward()
    mix = model.mixer.scalar_mix
    assert mix.scalar_weights.grad is not None and mix.scalar_weights.grad.abs().sum() > 0
    assert mix.gamma.grad is not None and mix.gamma.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.encoder.parameters())
    counts = model.param_counts()
    assert counts["mix_params"] == 3 + 1  # one weight per hidden state (2 layers + embeddings) and γ
    assert counts["trainable_params"] == counts["head_params"] + counts["mix_params"]


def test_collator_pads_arrays_like_lists():
    from tasks.collate import DynamicPaddingCollator

    rows = [{"attention_mask": [1] * n, "layer_states": np.ones((n, 2, 3), dtype=np.float16)} for n in (3, 10)]
    batch = DynamicPaddingCollator(0, 8)(rows)
    assert batch["layer_states"].shape == (2, 16, 2, 3) and batch["layer_states"].dtype == torch.float16
    assert batch["attention_mask"].shape == (2, 16)
    assert batch["layer_states"][0, 3:].abs().sum() == 0 and batch["layer_states"][0, :3].min() == 1


# ---- cached and uncached paths -----------------------------------------------------------------
def _encoder_must_not_run(*args, **kwargs):
    raise AssertionError("the encoder ran although cached states were given")


@pytest.mark.parametrize("head,kwargs,layers,pooling", [
    ("sequence", {"num_labels": 3}, "scalar_mix", "mean"),
    ("pair", {"num_labels": 3}, "last", None),
    ("token", {"num_labels": 3}, [0, -1], None),
    ("span", {}, "last", None),
])
# with the head's weights at N(0, 0.2²) (at their near-zero init every logit is ~0.01 whatever the
# states), fp16 states move the logits by at most 6.4e-4, another row's states by more than 5 × atol
# (checked below: the pair head's [CLS] states differ least, 6.3e-3): the tolerance sees a mix-up
@pytest.mark.parametrize("dtype,atol", [("float32", 1e-5), ("float16", 1e-3)])
def test_cached_and_uncached_give_the_same_logits(head, kwargs, layers, pooling, dtype, atol, tmp_path):
    from heads.model.feature_cache import CacheSettings, cached_inputs
    from heads.model.kotune_model import KotuneModel
    from tasks.collate import DynamicPaddingCollator

    model = KotuneModel(tiny_encoder(), head, dict(kwargs, dropout=0.0), frozen=True, layers=layers,
                        pooling=pooling)
    model.eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.head.parameters():
            param.normal_(0, 0.2)
    data = token_rows()
    if head == "token":  # a tag per token
        data = data.remove_columns("labels").rename_column("tags", "labels")
    data = data.select_columns(["input_ids", "attention_mask", "token_type_ids", *model.head.label_fields])
    cached, report = cached_inputs(model, {"train": data}, {"t": 1}, CacheSettings(str(tmp_path), dtype),
                                   name="t")
    assert report["splits"]["train"]["status"] == "miss"
    collate = DynamicPaddingCollator(0, 8)
    rows = [4, 0, 6]  # one batch, different lengths, not in stored order
    plain = collate([data[i] for i in rows])
    with_states = collate([cached["train"][i] for i in rows])
    assert torch.equal(with_states["attention_mask"], plain["attention_mask"])
    assert with_states["layer_states"].dtype == getattr(torch, dtype)
    with torch.no_grad():
        a = model(**plain)
        model.encoder.forward = _encoder_must_not_run  # the cached path never touches the encoder
        b = model(**with_states)
        mixed_up = model(**dict(with_states, layer_states=with_states["layer_states"].roll(1, 0)))  # others' rows
    mask = plain["attention_mask"].bool()
    as_tuple = (lambda out: out["logits"] if isinstance(out["logits"], tuple) else (out["logits"],))
    for x, y, z in zip(as_tuple(a), as_tuple(b), as_tuple(mixed_up)):
        if x.shape[:2] == mask.shape:  # per-token logits: padding differs (pad states vs zeros), unread
            x, y, z = x[mask], y[mask], z[mask]
        assert torch.allclose(x, y, atol=atol), (x - y).abs().max()
        assert (x - z).abs().max() > 5 * atol  # the tolerance would see a mix-up
    assert torch.allclose(a["loss"], b["loss"], atol=atol)


# ---- through run.py ----------------------------------------------------------------------------
def assert_cache_holds(report: dict, states: int, hidden: int, itemsize: int) -> None:
    """The cache report's bytes are the stored arrays': every split's tokens × states × hidden."""
    for split in report["splits"].values():
        stored = np.load(Path(split["path"]) / "states.npy", mmap_mode="r")
        assert stored.shape == (split["tokens"], states, hidden) and stored.itemsize == itemsize
        assert split["bytes"] == stored.nbytes and split["tokens"] > split["rows"] > 0
    assert report["bytes"] == sum(split["bytes"] for split in report["splits"].values())


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory):
    """One tiny frozen NLI run with a scalar mix, trained with a learning rate that moves it."""
    base = tmp_path_factory.mktemp("frozen")
    res = job(["task=nli", *TINY, "mode=frozen", "mode.layers=scalar_mix", "train.max_steps=12",
               "train.batch_size=8", "train.learning_rate=0.02"], base / "run", base / "cache")
    assert res["status"] == "ok", res.get("traceback") or res.get("error")
    return res, base


def test_frozen_run_records_layers_cache_and_timing(frozen_run):
    res, _ = frozen_run
    weights = res["scalar_mix"]["weights"]
    assert res["layers"] == "scalar_mix" and res["indices"] == [0, 1, 2] and len(weights) == 3
    assert abs(sum(weights) - 1) < 1e-4 and max(abs(w - 1 / 3) for w in weights) > 1e-3  # learned
    assert res["pooling"] == "cls"
    assert res["cache"]["status"] == "miss" and set(res["cache"]["splits"]) == {"train", "validation"}
    assert_cache_holds(res["cache"], states=3, hidden=128, itemsize=2)  # fp16, the default
    assert res["encode_s"] > 0 and res["head_train_s"] > 0
    assert res["trainable_params"] == res["head_params"] + res["mix_params"] == res["head_params"] + 4


@pytest.mark.parametrize("cache", ["true", "false"])
def test_frozen_encoder_is_bit_identical_after_training(cache, frozen_run, tmp_path):
    """The saved encoder equals a fresh encoder built from the same config and seed, tensor for
    tensor, with and without the cache (the scalar mix and head did train)."""
    from heads.model.encoder import load_encoder, load_tokenizer
    from heads.model.kotune_model import KotuneModel

    _, base = frozen_run
    overrides = ["task=nli", *TINY, "mode=frozen", f"mode.cache={cache}", "mode.layers=[0,2]",
                 "train.max_steps=6", "train.batch_size=8", "train.learning_rate=0.02"]
    res = job(overrides, tmp_path / "run", base / "cache")
    assert res["status"] == "ok", res.get("error")
    saved = KotuneModel.load(str(tmp_path / "run" / "model"))
    cfg = compose(overrides + [f"cache_dir={base / 'cache'}"])
    from tasks import build_task
    from tasks.splits import load_splits

    task = build_task(cfg.task)
    train = load_splits(task, cfg.data, ("train",), 42)["train"].examples
    tokenizer = load_tokenizer(cfg.model, texts=task.training_texts(train), cache_dir=cfg.cache_dir)
    fresh = load_encoder(cfg.model, vocab_size=len(tokenizer), seed=int(cfg.train.seed)).state_dict()
    trained = saved.encoder.state_dict()
    assert fresh.keys() == trained.keys()
    assert all(torch.equal(fresh[k], trained[k]) for k in fresh)
    assert (res["cache"]["status"] == "off") == (cache == "false")
    assert saved.mixer.spec.indices == (0, 2)


def test_cache_reused_then_rebuilt_when_data_changes_or_breaks(tmp_path, capsys):
    cache = tmp_path / "cache"
    args = ["task=nli", *TINY, "mode=frozen", "train.max_steps=4", "train.batch_size=8", "save_model=false"]
    first = job(args, tmp_path / "r1", cache)
    second = job(args, tmp_path / "r2", cache)
    assert first["cache"]["status"] == "miss" and second["cache"]["status"] == "hit"
    assert second["cache"]["splits"]["train"]["path"] == first["cache"]["splits"]["train"]["path"]
    assert second["metrics"] == first["metrics"]

    rows = json.loads((ROOT / "tasks/samples/nli/dev.json").read_text(encoding="utf-8"))
    rows[0]["premise"] = "강변 은행에 벚꽃이 피었다."
    changed = tmp_path / "dev.json"
    changed.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    third = job(args + [f"data.validation_file={changed}"], tmp_path / "r3", cache)
    assert third["cache"]["splits"]["train"]["status"] == "hit"
    assert third["cache"]["splits"]["validation"]["status"] == "miss"

    states = Path(first["cache"]["splits"]["train"]["path"]) / "states.npy"
    with open(states, "r+b") as f:
        f.truncate(states.stat().st_size - 64)
    capsys.readouterr()
    fourth = job(args, tmp_path / "r4", cache)
    assert fourth["cache"]["splits"]["train"]["status"] == "rebuilt"
    assert "truncated" in capsys.readouterr().out
    assert job(args, tmp_path / "r5", cache)["cache"]["status"] == "hit"


@pytest.mark.parametrize("extra,option", [
    (["mode=frozen", "mode.cache_max_gb=0.000001"], "mode.cache_max_gb=1e-06"),
    (["mode=finetune", "mode.cache=true"], "mode.cache=true needs a frozen encoder"),
    (["mode=frozen", "mode.cache_dtype=int8"], "mode.cache_dtype=int8"),
    (["mode=frozen", "mode.layers=middle"], "mode.layers=middle"),
    (["mode=frozen", "mode.layers=[7]"], "mode.layers: index 7 is out of range"),
    (["task=ner", "mode=frozen", "mode.pooling=mean"], "mode.pooling=mean does not fit the token head"),
])
def test_bad_frozen_options_fail_with_one_line(extra, option, tmp_path, cache_dir):
    task = [] if any(e.startswith("task=") for e in extra) else ["task=nli"]
    res = job(task + TINY + extra + ["train.max_steps=2"], tmp_path / "run", Path(cache_dir))
    assert res["status"] == "failed" and res["error_type"] == "ConfigError", res.get("error")
    assert option in res["error"] and "\n" not in res["error"]


def test_unwritable_cache_dir_is_named(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "frozen").write_text("a file where the frozen cache directory should be")
    res = job(["task=nli", *TINY, "mode=frozen", "train.max_steps=2"], tmp_path / "run", cache)
    assert res["status"] == "failed" and res["error"].startswith(f"cache_dir={cache}: cannot write")


@pytest.mark.parametrize("task", ["ynat", "nli", "ner", "korquad"])
def test_scalar_mix_trains_for_every_head(task, tmp_path, cache_dir):
    from tasks import TASKS

    if task not in TASKS:
        pytest.skip(f"task {task} not registered yet")
    res = job([f"task={task}", *TINY, "mode=frozen", "mode.layers=scalar_mix", "train.max_steps=8",
               "train.batch_size=8", "train.learning_rate=0.02", "save_model=false"],
              tmp_path / "run", Path(cache_dir))
    assert res["status"] == "ok", res.get("traceback") or res.get("error")
    assert res["cache"]["states_per_token"] == 3
    assert_cache_holds(res["cache"], states=3, hidden=128, itemsize=2)
    assert max(abs(w - 1 / 3) for w in res["scalar_mix"]["weights"]) > 1e-3


# ---- action=embed ------------------------------------------------------------------------------
TEXTS = ["은행에서 대출을 받았다.", "강변 은행에 벚꽃이 피었다.", "", "은행에서 대출을 받았다.", "오늘은 날씨가 맑다."]


def test_embed_from_config_with_target_word(tmp_path, cache_dir):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    res = job(["action=embed", "model=tiny", f"embed.input={texts}", "embed.target='은행'",
               "mode.layers=last4_mean"], tmp_path / "bad", Path(cache_dir))
    assert res["status"] == "failed" and "mode.layers=last4_mean needs 4 layers" in res["error"]
    res = job(["action=embed", "model=tiny", f"embed.input={texts}", "embed.target='은행'",
               "mode.pooling=mean", "mode.layers=[0,-1]"], tmp_path / "run", Path(cache_dir))
    assert res["status"] == "ok", res.get("traceback") or res.get("error")
    vectors = np.load(tmp_path / "run" / "embeddings.npy")
    index = [json.loads(line) for line in (tmp_path / "run" / "index.jsonl").read_text().splitlines()]
    assert vectors.shape == (4, 128) and [r["source"].rsplit(":", 1)[1] for r in index] == ["1", "2", "4", "5"]
    assert np.allclose(vectors[0], vectors[2], atol=1e-5) and not np.allclose(vectors[0], vectors[3])
    assert res["layers"] == [0, 2] and res["pooling"] == "mean"
    target = res["target"]
    assert target["occurrences"] == 3 and np.load(target["vectors_file"]).shape == (3, 3, 128)
    cosines = target["cosine_by_layer"]
    assert set(cosines) == {"0-1", "0-2", "1-2"} and all(len(v) == 3 for v in cosines.values())
    assert all(c > 0.9999 for c in cosines["0-2"])  # same sentence, same vectors in every layer
    assert min(cosines["0-1"]) < 0.9999  # another context, another vector


def test_embed_from_a_checkpoint_uses_its_encoder_and_mix(frozen_run, tmp_path):
    from transformers import AutoTokenizer

    from heads.model.kotune_model import KotuneModel

    res, base = frozen_run
    texts = tmp_path / "texts.csv"
    texts.write_text("id,sentence\n" + "\n".join(f"{i},{t}" for i, t in enumerate(TEXTS) if t) + "\n",
                     encoding="utf-8")
    out = job(["action=embed", f"checkpoint={base / 'run'}", f"embed.input={texts}", "embed.column=sentence",
               "mode.layers=scalar_mix"], tmp_path / "mix", base / "cache")
    assert out["status"] == "ok", out.get("traceback") or out.get("error")
    assert out["scalar_mix"] == res["scalar_mix"]  # the trained weights, not a fresh uniform mix
    out = job(["action=embed", f"checkpoint={base / 'run'}", f"embed.input={texts}", "embed.column=sentence"],
              tmp_path / "cls", base / "cache")
    assert out["status"] == "ok" and out["layers"] == "last" and out["pooling"] == "cls"
    model = KotuneModel.load(str(base / "run" / "model")).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(base / "run" / "model"))
    with torch.no_grad():
        expected = model.encoder(**tokenizer([TEXTS[1]], return_tensors="pt")).last_hidden_state[0, 0]
    assert np.allclose(np.load(tmp_path / "cls" / "embeddings.npy")[1], expected.numpy(), atol=1e-5)
