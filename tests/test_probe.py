"""action=probe (one encoding of every hidden state, a head per layer choice) and
mode.layers=last4_concat (the last four layers side by side)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kotune.actions.probe import held_out_split
from kotune.core.errors import ConfigError
from test_frozen import TINY, job, tiny_encoder, token_rows

FOUR_LAYERS = ["model.config_overrides.num_hidden_layers=4"]
FAST = ["train.max_steps=6", "train.batch_size=8", "train.learning_rate=0.02"]


# ---- last4_concat and reading a choice out of every hidden state -----------------------------------
def test_last4_concat_puts_the_last_four_layers_side_by_side():
    from heads.model.layers import LayerMixer, parse_layers

    spec = parse_layers("last4_concat", 5)
    assert spec.indices == (2, 3, 4, 5) and spec.stored == 4 and spec.width == 4 and not spec.learned
    encoder = tiny_encoder(layers=5).eval()
    ids = torch.tensor([[2, 7, 9, 11, 3]])
    mask = torch.ones_like(ids)
    mixer = LayerMixer(spec)
    with torch.no_grad():
        hidden = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        read = mixer(mixer.states(encoder, ids, mask))
    assert read.shape == (1, 5, 4 * 32)
    assert torch.equal(read, torch.cat(hidden[2:], dim=-1))
    with pytest.raises(ConfigError, match="mode.layers=last4_concat needs 4 layers; the encoder has 2"):
        parse_layers("last4_concat", 2)


@pytest.mark.parametrize("layers", ["last", "last4_mean", "last4_concat", "scalar_mix", [1], [0, 3]])
def test_a_choice_read_from_every_hidden_state_equals_its_own_states(layers):
    """What action=probe feeds a head (LayerSpec.select of the cache of every state) is what the
    encoder gives that choice directly (what a frozen run of that choice caches)."""
    from heads.model.layers import LayerMixer, parse_layers

    encoder = tiny_encoder(layers=4).eval()
    ids = torch.tensor([[2, 7, 9, 11, 3], [2, 8, 3, 0, 0]])
    mask = (ids != 0).long()
    every = LayerMixer(parse_layers("scalar_mix", 4))
    own = LayerMixer(parse_layers(layers, 4))
    with torch.no_grad():
        stack = every.states(encoder, ids, mask)  # [B, T, 5, H]
        direct = own.states(encoder, ids, mask)
    assert torch.allclose(own.spec.select(stack.unbind(-2)), direct, atol=1e-6)


def test_a_cache_of_every_state_serves_each_choice(tmp_path):
    from heads.model.feature_cache import CacheSettings, cached_inputs
    from heads.model.layers import LayerMixer, parse_layers
    from heads.model.kotune_model import KotuneModel

    encoder = tiny_encoder(layers=4)
    data = token_rows().select_columns(["input_ids", "attention_mask", "token_type_ids", "labels"])
    every = KotuneModel(encoder, "sequence", {"num_labels": 3}, frozen=True, layers="scalar_mix")
    cached, _ = cached_inputs(every, {"train": data}, {"t": 1}, CacheSettings(str(tmp_path), "float32"), name="t")
    for layers in ("last4_concat", "last4_mean", [1], [0, 4]):
        spec = parse_layers(layers, 4)
        view = cached["train"].reading(spec)
        row = data[5]
        with torch.no_grad():
            direct = LayerMixer(spec).states(encoder, *(torch.tensor([row[k]]) for k in
                                                        ("input_ids", "attention_mask", "token_type_ids")))
        assert view[5]["layer_states"].shape == (len(row["input_ids"]), spec.stored, 32)
        assert torch.allclose(torch.from_numpy(view[5]["layer_states"]), direct[0], atol=1e-5)
    one = KotuneModel(encoder, "sequence", {"num_labels": 3}, frozen=True, layers=[2])
    fixed, _ = cached_inputs(one, {"train": data}, {"t": 1}, CacheSettings(str(tmp_path), "float32"), name="t")
    with pytest.raises(ValueError, match="not every hidden state"):
        fixed["train"].reading(parse_layers([1], 4))


def test_a_concat_head_reads_four_hidden_sizes_and_export_refuses_it():
    from kotune.export.native import refusal
    from heads.model.kotune_model import KotuneModel

    encoder = tiny_encoder(layers=4)
    model = KotuneModel(encoder, "sequence", {"num_labels": 3}, frozen=True, layers="last4_concat")
    assert model.head.dense.in_features == 4 * 32
    ids = torch.tensor([[2, 7, 9, 3]])
    assert model(input_ids=ids, attention_mask=torch.ones_like(ids))["logits"].shape == (1, 3)
    assert "mode.layers=last4_concat" in refusal(model)


def test_with_layers_shares_the_encoder_and_starts_from_the_pooler():
    """Every probe head starts as a train run's would: BERT's sequence head from the pooler (which
    left the encoder when the first head was built), a concatenating head from its own init."""
    from transformers import BertConfig, BertModel

    from heads.model.kotune_model import KotuneModel

    torch.manual_seed(0)
    encoder = BertModel(BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                   intermediate_size=64))
    pooler = {k: v.clone() for k, v in encoder.pooler.dense.state_dict().items()}
    first = KotuneModel(encoder, "sequence", {"num_labels": 3}, frozen=True, layers="scalar_mix")
    assert encoder.pooler is None
    second = first.with_layers([2])
    assert second.encoder is first.encoder and second.mixer.spec.indices == (2,)
    assert torch.equal(second.head.dense.weight, pooler["weight"])
    assert first.with_layers("last4_concat").head.dense.in_features == 4 * 32


# ---- picking a choice on examples apart from those that score it ---------------------------------------
def test_the_held_out_split_is_seeded_disjoint_and_complete():
    select, report = held_out_split(21, 0.5, seed=42)
    assert (len(select), len(report)) == (10, 11) and sorted(select + report) == list(range(21))
    assert held_out_split(21, 0.5, seed=42) == (select, report) != held_out_split(21, 0.5, seed=1)
    assert select == sorted(select) and report == sorted(report)
    assert held_out_split(1, 0.5, seed=0) == held_out_split(21, 0.0, seed=0) == ([], [])


def test_the_best_row_never_is_a_nan_and_follows_the_direction():
    from kotune.actions.probe import best_row

    rows = [{"choice": "0", "mean": float("nan")}, {"choice": "1", "mean": 2.0}, {"choice": "2", "mean": 5.0},
            {"choice": "3", "mean": 5.0}]
    assert best_row(rows, "mean", greater_is_better=True)["choice"] == "2"  # the first of equals
    assert best_row(rows, "mean", greater_is_better=False)["choice"] == "1"


def score_of_predictions(run_dir: Path, task_name: str, indices: list[int] | None = None) -> float:
    """The main metric of the run's predictions.jsonl (on the sample's validation examples at
    ``indices``), read back as action=score reads a prediction file."""
    from conftest import compose
    from tasks import build_task
    from tasks.splits import load_splits
    from tasks.score import align, read_predictions

    cfg = compose([f"task={task_name}", "data=sample"])
    task = build_task(cfg.task)
    examples = load_splits(task, cfg.data, ("validation",), 42)["validation"].examples
    task.fit_labels(examples)
    path = str(run_dir / "predictions.jsonl")
    values = align(read_predictions(path), [str(ex["id"]) for ex in examples], path, "sample")
    outputs = task.outputs_from_predictions(values, examples, path)
    keep = range(len(examples)) if indices is None else indices
    return task.score([outputs[i] for i in keep], [examples[i] for i in keep])[task.main_metric]


# ---- action=probe through run.py's job ---------------------------------------------------------------
@pytest.fixture
def count_encoding(monkeypatch):
    """Counts cache builds (one per split encoded) and any encoder run outside them."""
    import heads.model.feature_cache as feature_cache
    from heads.model.kotune_model import KotuneModel

    seen = {"builds": 0, "encoder_runs_outside": 0, "inside": False}
    real_build, real_states = feature_cache._build, KotuneModel.layer_states

    def counting_build(*args, **kwargs):
        seen["builds"] += 1
        seen["inside"] = True
        try:
            return real_build(*args, **kwargs)
        finally:
            seen["inside"] = False

    def watched_states(self, *args, **kwargs):
        seen["encoder_runs_outside"] += not seen["inside"]
        return real_states(self, *args, **kwargs)

    monkeypatch.setattr(feature_cache, "_build", counting_build)
    monkeypatch.setattr(KotuneModel, "layer_states", watched_states)
    return seen


def test_probe_gives_a_row_per_choice_from_one_encoding(tmp_path, count_encoding):
    res = job(["action=probe", "task=nli", *TINY, *FOUR_LAYERS, "mode=frozen", *FAST, "probe.seeds=[1,2]",
               "save_predictions=true"],
              tmp_path / "run", tmp_path / "cache")
    assert res["status"] == "ok", res.get("traceback") or res.get("error")
    assert count_encoding == {"builds": 2, "encoder_runs_outside": 0, "inside": False}  # train + validation, once
    probe = res["probe"]
    rows = {r["choice"]: r for r in probe["rows"]}
    assert list(rows) == ["0", "1", "2", "3", "4", "last4_mean", "last4_concat", "scalar_mix"]
    assert rows["last4_concat"]["indices"] == [1, 2, 3, 4] and rows["3"]["layers"] == [3]
    for row in rows.values():
        assert len(row["scores"]) == 2 and row["mean"] == pytest.approx(sum(row["scores"]) / 2)
        assert row["sd"] == pytest.approx(abs(row["scores"][0] - row["scores"][1]) / 2 ** 0.5)  # sample sd of two
    assert len(rows["scalar_mix"]["scalar_mix"]["weights"]) == 5
    assert probe["seeds"] == [1, 2] and probe["encode_s"] > 0 and probe["heads_s"] > 0
    assert res["cache"]["states_per_token"] == 5
    # no number stands as the run's score: the best of 8 choices on the split it is scored on is optimistic
    assert res["metrics"] == {} and res["main_score"] is None
    best = rows[probe["best_on_validation"]]
    assert best["mean"] == max(r["mean"] for r in rows.values()) and "best" not in probe
    assert score_of_predictions(tmp_path / "run", "nli") == pytest.approx(best["scores"][0])  # its first seed
    held = probe["held_out"]  # picked on a seeded half of the validation examples, scored on the other
    assert (held["n_select"], held["n_report"], held["fraction"]) == (round(res["n_eval"] / 2),
                                                                      res["n_eval"] - round(res["n_eval"] / 2), 0.5)
    assert rows[held["choice"]]["select_mean"] == max(r["select_mean"] for r in rows.values())
    assert held["mean"] == rows[held["choice"]]["report_mean"]
    png = Path(probe["png"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "run" / "results.json").read_text(encoding="utf-8"))
    assert saved["probe"]["rows"] == probe["rows"] and saved["action"] == "probe"


def test_probe_of_a_checkpoint_on_another_task_with_two_layers(tmp_path, count_encoding):
    """A 2-layer encoder has no last four: its rows are layers 0-2 and the scalar mix. A checkpoint
    lends only its encoder and tokenizer: an NLI model's encoder probed for NER with a new head."""
    trained = job(["task=nli", *TINY, "train.max_steps=2"], tmp_path / "nli", tmp_path / "cache")
    assert trained["status"] == "ok", trained.get("error")
    count_encoding["builds"] = 0
    res = job(["action=probe", "task=ner", *TINY, "mode=frozen", *FAST, f"checkpoint={tmp_path / 'nli'}",
               "save_predictions=true"],
              tmp_path / "run", tmp_path / "cache")
    assert res["status"] == "ok", res.get("traceback") or res.get("error")
    rows = {r["choice"]: r for r in res["probe"]["rows"]}
    assert list(rows) == ["0", "1", "2", "scalar_mix"]
    assert all(len(r["scores"]) == 1 and r["sd"] is None for r in rows.values())
    assert res["main_metric"] == "entity_f1" and res["checkpoint"] == str(tmp_path / "nli")
    assert count_encoding["builds"] == 2
    assert (tmp_path / "run" / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one seed: predictions.jsonl is the best choice's only head, and its two halves give that row's part means
    best = rows[res["probe"]["best_on_validation"]]
    select, report = held_out_split(res["n_eval"], 0.5, seed=42)
    assert score_of_predictions(tmp_path / "run", "ner") == pytest.approx(best["mean"])
    assert score_of_predictions(tmp_path / "run", "ner", select) == pytest.approx(best["select_mean"])
    assert score_of_predictions(tmp_path / "run", "ner", report) == pytest.approx(best["report_mean"])


@pytest.mark.parametrize("extra,words", [
    ([], "action=probe trains heads on one encoding of a frozen encoder: use mode=frozen"),
    (["mode=frozen", "probe.choices=middle"], "probe.choices=middle: expected all or a list"),
    (["mode=frozen", "probe.choices=[1,middle]"], "mode.layers=middle: unknown layer choice"),
    (["mode=frozen", "probe.choices=[last4_concat]"], "mode.layers=last4_concat needs 4 layers"),
    (["mode=frozen", "probe.seeds=[1,x]"], "probe.seeds=[1, 'x']: expected a list of integers"),
    (["mode=frozen", "probe.held_out=1.5"], "probe.held_out=1.5: expected a fraction in [0, 1)"),
    # every head is scored on the validation split: its checkpoint cannot be picked there too
    (["mode=frozen", "train=klue"], "train.select_best=true (train=klue sets it): action=probe scores every head"),
])
def test_bad_probe_options_fail_with_one_line(extra, words, tmp_path, cache_dir):
    res = job(["action=probe", "task=nli", *TINY, *extra, "train.max_steps=2"], tmp_path / "run", Path(cache_dir))
    assert res["status"] == "failed" and res["error_type"] == "ConfigError", res.get("error")
    assert words in res["error"] and "\n" not in res["error"]


def test_frozen_run_with_last4_concat(tmp_path, cache_dir):
    res = job(["task=ner", *TINY, *FOUR_LAYERS, "mode=frozen", "mode.layers=last4_concat", *FAST,
               "save_model=false"], tmp_path / "run", Path(cache_dir))
    assert res["status"] == "ok", res.get("traceback") or res.get("error")
    assert res["layers"] == "last4_concat" and res["indices"] == [1, 2, 3, 4]
    assert res["cache"]["states_per_token"] == 4
    assert res["head_params"] == 4 * 128 * 13 + 13  # the token head: 4 × hidden → 13 BIO tags


def test_embed_with_last4_concat_gives_four_hidden_sizes(tmp_path, cache_dir):
    import numpy as np

    texts = tmp_path / "texts.txt"
    texts.write_text("은행에서 대출을 받았다.\n강변 은행에 벚꽃이 피었다.\n", encoding="utf-8")
    res = job(["action=embed", "model=tiny", *FOUR_LAYERS, f"embed.input={texts}", "mode.layers=last4_concat"],
              tmp_path / "run", Path(cache_dir))
    assert res["status"] == "ok", res.get("traceback") or res.get("error")
    assert res["dim"] == 4 * 128 and np.load(tmp_path / "run" / "embeddings.npy").shape == (2, 4 * 128)
