"""train.calibrate (issue 44): the calibration metrics by hand, the temperature and Platt fits, the
fold into the head (argmax unchanged), a tiny run's results, its export's pipeline probabilities,
the held-out slice never trained on, and the heads that refuse it."""
from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from heads.calibration import fit_platt, fit_temperature, fold_platt, fold_temperature
from tasks.calibration_metrics import brier, calibration_scores, ece, mce, nll, reliability_bins, softmax

# the sample files are small: half of each training file is held out, so that the slice reaches MIN_HELD_OUT
TINY = ["model=tiny", "data=sample", "train.max_steps=20", "train.learning_rate=3e-3", "train.calibrate_fraction=0.5"]


# ---- the metrics, by hand ---------------------------------------------------------------
PROBS = [[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.45, 0.55]]
LABELS = [0, 1, 1, 0]


def test_ece_mce_brier_nll_by_hand():
    # confidences 0.9 (right), 0.8 (wrong), 0.7 (right), 0.55 (wrong); 15 bins of width 1/15:
    # 0.9 → bin 13 (0.8667, 0.9333]; 0.8 → bin 11 (0.7333, 0.8]; 0.7 → bin 10 (0.6667, 0.7333]; 0.55 → bin 8
    # each bin holds one item: |acc − conf| = 0.1, 0.8, 0.3, 0.55
    assert ece(PROBS, LABELS) == pytest.approx((0.1 + 0.8 + 0.3 + 0.55) / 4)
    assert mce(PROBS, LABELS) == pytest.approx(0.8)
    # Brier: Σ_k (p_k − y_k)² per row, averaged: 0.02, 1.28, 0.18, 0.605
    assert brier(PROBS, LABELS) == pytest.approx((0.02 + 1.28 + 0.18 + 0.605) / 4)
    assert nll(PROBS, LABELS) == pytest.approx(-(math.log(0.9) + math.log(0.2) + math.log(0.7) + math.log(0.45)) / 4)
    scores = calibration_scores(PROBS, LABELS)
    assert scores["accuracy"] == 0.5


def test_items_sharing_a_bin_are_averaged_before_the_gap():
    rows = reliability_bins([[0.76, 0.24], [0.78, 0.22]], [0, 1])  # both in bin 11, (0.7333, 0.8]
    full = [r for r in rows if r["count"]]
    assert len(full) == 1 and full[0]["count"] == 2
    assert full[0]["confidence"] == pytest.approx(0.77) and full[0]["accuracy"] == 0.5
    assert ece([[0.76, 0.24], [0.78, 0.22]], [0, 1]) == pytest.approx(0.27)
    assert len(rows) == 15
    # the upper edge belongs to its bin: a confidence of exactly 0.8 (12/15) is in bin 11
    assert [r["count"] for r in reliability_bins([[0.8, 0.2]], [0])][11] == 1


def test_ece_weighs_each_bin_by_its_items():
    # bin 13 holds three items at 0.9 (two right): gap 0.9 − 2/3; bin 8 one at 0.6 (wrong): gap 0.6.
    # Weighted by count: (3 · 0.2333 + 1 · 0.6) / 4 = 0.325 (a plain mean of the two gaps would be 0.4167)
    probs, labels = [[0.9, 0.1]] * 3 + [[0.6, 0.4]], [0, 0, 1, 1]
    assert [r["count"] for r in reliability_bins(probs, labels) if r["count"]] == [1, 3]
    assert ece(probs, labels) == pytest.approx((3 * (0.9 - 2 / 3) + 0.6) / 4)
    assert calibration_scores(probs, labels)["ece"] == pytest.approx(0.325)


def test_a_perfectly_calibrated_set_has_no_error():
    probs = [[0.75, 0.25]] * 4
    assert ece(probs, [0, 0, 0, 1]) == pytest.approx(0.0)
    assert mce(probs, [0, 0, 0, 1]) == pytest.approx(0.0)


# ---- the fits ---------------------------------------------------------------------------
@pytest.mark.parametrize("true_t", [0.5, 2.0, 3.0])
def test_fitting_recovers_a_known_temperature(true_t):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(20000, 4, generator=g, dtype=torch.float64) * 3  # the calibrated logits
    labels = torch.distributions.Categorical(logits=base).sample()
    t = fit_temperature(base * true_t, labels)  # overconfident (T > 1) or under (T < 1) by true_t
    assert t == pytest.approx(true_t, rel=0.05)


def test_platt_recovers_a_known_scaling_per_label():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(20000, 2, generator=g, dtype=torch.float64) * 2
    a, c = torch.tensor([0.5, 2.0], dtype=torch.float64), torch.tensor([1.0, -0.5], dtype=torch.float64)
    targets = torch.bernoulli(torch.sigmoid(z * a + c), generator=g)
    scale, shift = fit_platt(z, targets)
    assert scale == pytest.approx([0.5, 2.0], rel=0.08) and shift == pytest.approx([1.0, -0.5], abs=0.08)


def test_the_temperature_is_fitted_on_the_calibrate_slice_and_measured_on_validation(tmp_path):
    """calibrate() reads the held-out ``calibrate`` slice's logits to fit T (its items counted in
    held_out_items) and the validation split's only to measure before and after: a trainer whose
    slice is 2× overconfident and whose validation split is calibrated gives T ≈ 2, not 1."""
    from types import SimpleNamespace

    import numpy as np

    from conftest import compose
    from heads.sequence import SequenceHead
    from kotune.calibration.fit import calibrate

    g = torch.Generator().manual_seed(0)

    def split(n: int, scale: float) -> SimpleNamespace:
        base = torch.randn(n, 3, generator=g, dtype=torch.float64) * 3
        labels = torch.distributions.Categorical(logits=base).sample()
        return SimpleNamespace(predictions=(base * scale).numpy(), label_ids=labels.numpy())

    outputs = {"CAL": split(4000, 2.0), "VAL": split(300, 1.0)}
    asked = []

    def predict(dataset):
        asked.append(dataset)
        return outputs[dataset]

    trainer = SimpleNamespace(compute_metrics=None, predict=predict)
    b = SimpleNamespace(splits={"calibrate": SimpleNamespace(examples=[{}] * 4000), "validation": SimpleNamespace(examples=[{}] * 300)},
                        inputs={"calibrate": "CAL", "validation": "VAL"}, task=SimpleNamespace(labels=["a", "b", "c"]),
                        model=SimpleNamespace(head=SequenceHead(8, 3), meta={}))
    entry = calibrate(compose(["task=text_cls", "train.calibrate=temperature"]), trainer, b, str(tmp_path))
    assert sorted(asked) == ["CAL", "VAL"]
    assert (entry["fit_on"], entry["held_out"], entry["held_out_items"], entry["n_items"]) == ("calibrate", 4000, 4000, 300)
    expected = fit_temperature(torch.from_numpy(outputs["CAL"].predictions), torch.from_numpy(outputs["CAL"].label_ids))
    assert entry["temperature"] == pytest.approx(expected) and entry["temperature"] == pytest.approx(2.0, rel=0.1)
    assert entry["after"]["ece"] == pytest.approx(calibration_scores(
        softmax(outputs["VAL"].predictions.tolist(), entry["temperature"]), outputs["VAL"].label_ids.tolist())["ece"])
    assert np.isfinite(entry["before"]["nll"])


def test_folding_divides_the_logits_and_keeps_the_argmax():
    from heads.sequence import SequenceHead

    torch.manual_seed(0)
    head = SequenceHead(16, 5).eval()
    states, mask = torch.randn(64, 7, 16), torch.ones(64, 7)
    before = head(states, mask)
    fold_temperature(head, 2.5)
    after = head(states, mask)
    assert torch.allclose(after, before / 2.5, atol=1e-6)
    assert torch.equal(after.argmax(-1), before.argmax(-1))
    fold_platt(head, [2.0] * 5, [0.5] * 5)
    assert torch.allclose(head(states, mask), after * 2.0 + 0.5, atol=1e-5)


def test_softmax_at_a_temperature():
    assert softmax([[2.0, 0.0]], 2.0)[0][0] == pytest.approx(1 / (1 + math.exp(-1)))


# ---- a tiny run ---------------------------------------------------------------------------
def _training_rows_without_the_slice(tmp_path) -> str:
    """The sample training file less the calibrate slice train.calibrate holds out (same seed)."""
    from tests.conftest import compose
    from tasks import build_task
    from tasks.splits import load_splits, sample_file

    cfg = compose(["task=text_cls", *TINY])
    task = build_task(cfg.task)
    splits = load_splits(task, cfg.data, ("train", "validation"), int(cfg.train.seed), float(cfg.train.calibrate_fraction))
    kept = {ex["text"] for ex in splits["train"].examples}
    with open(sample_file(cfg.task, "train"), encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["text"] in kept]
    assert len(rows) == len(splits["train"].examples)
    out = tmp_path / "train_less_slice.tsv"
    with open(out, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["text", "label"], delimiter="\t")
        w.writeheader()
        w.writerows(rows)
    return str(out)


def _records(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


@pytest.mark.slow
def test_a_calibrated_run_predicts_as_before_with_calibrated_probabilities(run_job, tmp_path):
    from tasks.splits import sample_file
    from tests.conftest import compose

    dev = sample_file(compose(["task=text_cls", *TINY]).task, "validation")
    cal = run_job(["task=text_cls", *TINY, "train.calibrate=temperature"], "cal")
    assert cal["status"] == "ok", cal.get("error")
    plain = run_job(["task=text_cls", *TINY, "data=sample", f"data.train_file={_training_rows_without_the_slice(tmp_path)}",
                     f"data.validation_file={dev}"], "plain")
    assert plain["status"] == "ok", plain.get("error")
    entry = cal["calibration"]
    assert entry["method"] == "temperature" and entry["measured_on"] == "validation"
    assert entry["held_out"] == cal["n_calibrate"] == 40 and cal["n_train"] == plain["n_train"] == 40
    assert plain["calibration"] is None and plain["n_calibrate"] is None
    assert entry["before"]["accuracy"] == entry["after"]["accuracy"]
    assert set(entry["before"]) == {"ece", "mce", "brier", "nll", "accuracy"}
    assert (tmp_path / "cal" / "reliability.png").stat().st_size > 1000
    assert [len(entry["reliability"][k]) for k in ("before", "after")] == [15, 15]  # for report.py's pooled diagram
    assert sum(b["count"] for b in entry["reliability"]["after"]) == entry["n_items"]
    ours, theirs = _records(tmp_path / "cal" / "predictions.jsonl"), _records(tmp_path / "plain" / "predictions.jsonl")
    assert [r["prediction"] for r in ours] == [r["prediction"] for r in theirs]
    assert cal["metrics"] == plain["metrics"]
    assert abs(entry["temperature"] - 1.0) > 1e-3
    assert any(r["probabilities"] != s["probabilities"] for r, s in zip(ours, theirs))
    # the temperature is in the weights: the native export's pipeline gives predictions.jsonl's probabilities
    out = run_job(["task=text_cls", *TINY, "action=export", f"checkpoint={tmp_path / 'cal'}",
                   f"export.dir={tmp_path / 'hf'}"], "export")
    assert out["status"] == "ok", out.get("error")
    import transformers

    pipe = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), device="cpu")
    served = pipe([r["text"] for r in ours], truncation=True, top_k=None)
    for record, scores in zip(ours, served):
        got = {s["label"]: s["score"] for s in scores}
        assert got == pytest.approx(record["probabilities"], abs=1e-4)
        assert max(got, key=got.get) == record["prediction"]


@pytest.mark.slow
def test_multi_label_platt_keeps_the_decisions(run_job, tmp_path):
    res = run_job(["task=multi_label", *TINY, "train.calibrate=temperature", "train.calibrate_fraction=0.6"], "ml")
    assert res["status"] == "ok", res.get("error")
    entry = res["calibration"]
    assert entry["method"] == "platt" and entry["temperature"] is None and set(entry["platt"]) == set(res["decision"]["thresholds"])
    # the decisions the checkpoint makes again are those the run reported
    again = run_job(["task=multi_label", "model=tiny", "data=sample", "action=eval", f"checkpoint={tmp_path / 'ml'}"], "eval")
    assert again["status"] == "ok", again.get("error")
    assert again["metrics"] == res["metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["ner", "re"])
def test_token_and_relation_heads_calibrate_their_items(run_job, task):
    """NER: the labelled tokens are the items; RE: the relation head is a softmax classifier too."""
    fraction = 0.2 if task == "ner" else 0.8  # RE's sample has 40 rows; NER's slice counts its tagged characters
    res = run_job([f"task={task}", "model=tiny", "data=sample", "train.max_steps=4", "train.calibrate=temperature",
                   f"train.calibrate_fraction={fraction}"])
    assert res["status"] == "ok", res.get("error")
    entry = res["calibration"]
    assert entry["method"] == "temperature" and entry["before"]["accuracy"] == entry["after"]["accuracy"]
    assert entry["n_items"] >= res["n_eval"] and res["n_calibrate"] == entry["held_out"] > 0


@pytest.mark.parametrize("task, extra, words", [
    ("sts", [], "regression"),
    ("qa", [], "span head"),
    ("dp", [], "dependency head"),
    ("ner", ["task.crf=true"], "CRF"),
])
def test_heads_without_class_probabilities_refuse_in_one_line(run_job, task, extra, words):
    res = run_job([f"task={task}", "model=tiny", "data=sample", "train.max_steps=1", "train.calibrate=temperature",
                   *extra])
    assert res["status"] == "failed"
    assert "train.calibrate=temperature does not apply" in res["error"] and words in res["error"]
    assert "\n" not in res["error"]


def test_an_unknown_method_is_refused(run_job):
    res = run_job(["task=text_cls", "model=tiny", "data=sample", "train.max_steps=1", "train.calibrate=isotonic"])
    assert res["status"] == "failed" and "train.calibrate=isotonic" in res["error"]


def test_a_held_out_slice_too_small_to_fit_on_is_refused_in_one_line_before_training(run_job):
    from kotune.calibration.fit import MIN_HELD_OUT

    res = run_job(["task=text_cls", *TINY, "train.calibrate=temperature", "train.calibrate_fraction=0.1"], "small")
    assert res["status"] == "failed" and "\n" not in res["error"] and res.get("train_loss") is None
    assert res["error"].startswith("train.calibrate: the held-out slice has 8 items") and f"at least {MIN_HELD_OUT}" in res["error"]
