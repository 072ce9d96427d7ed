"""Abstention (``predict.min_confidence``, kotune/calibration/abstention.py, tasks/abstention.py): coverage,
risk and the risk–coverage curve against hand-computed values; a tiny text_cls run with p=0 (nothing
abstains, results as the plain run), p=1 (everything abstains) and p in between (the abstained rows
are exactly those under p in predictions.jsonl), the server's predictor answering ``abstained``,
action=score of a file with abstentions, and the one-line refusals."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import compose
from tasks.abstention import (abstains, area_under_curve, coverage, risk, risk_coverage_curve, thin)

RUN = ["task=text_cls", "model=tiny", "data=sample", "train.max_steps=30"]


def test_coverage_risk_and_the_curve_by_hand():
    conf = [0.9, 0.8, 0.8, 0.6, 0.4]
    correct = [True, False, True, True, False]
    assert abstains(conf, 0.8) == [False, False, False, True, True]  # at the threshold: answered
    assert abstains(conf, 0.0) == [False] * 5
    assert coverage(abstains(conf, 0.8)) == 0.6 and coverage([]) is None
    assert risk(correct, abstains(conf, 0.8)) == pytest.approx(1 / 3)
    assert risk(correct, [True] * 5) is None
    curve = risk_coverage_curve(conf, correct)
    # the two 0.8 rows go together: no threshold separates them
    assert curve == [{"min_confidence": 0.9, "coverage": 0.2, "risk": 0.0},
                     {"min_confidence": 0.8, "coverage": 0.6, "risk": pytest.approx(1 / 3)},
                     {"min_confidence": 0.6, "coverage": 0.8, "risk": 0.25},
                     {"min_confidence": 0.4, "coverage": 1.0, "risk": 0.4}]
    assert area_under_curve(curve) == pytest.approx(0.2 * 0 + 0.4 * (1 / 3) + 0.2 * 0.25 + 0.2 * 0.4)
    assert area_under_curve([]) is None
    long = risk_coverage_curve([i / 1000 for i in range(1000)], [i % 3 > 0 for i in range(1000)])
    small = thin(long, 50)
    assert len(small) <= 50 and small[0] == long[0] and small[-1] == long[-1] and all(p in long for p in small)
    assert thin(curve, 50) == curve


def test_aurc_ranks_by_full_precision_not_the_rounded_probabilities():
    """predictions.jsonl rounds each probability to 4 digits: 0.90004 (wrong) and 0.90001 (right)
    both show 0.9, a tie that would merge their points of the curve. The curve and AURC rank by the
    unrounded probabilities: the wrong row first, alone at coverage 1/3."""
    import math

    import numpy as np

    from tasks.abstention import assess
    from tasks import build_task

    cfg = compose(["task=text_cls", "predict.min_confidence=0.5"])
    task = build_task(cfg.task)
    task.labels = ["a", "b"]
    logit = [math.log(p / (1 - p)) for p in (0.90004, 0.90001, 0.7)]
    outputs = task.decode(np.array([[z, 0.0] for z in logit]), None, [{}] * 3)
    assert [max(o.probabilities.values()) for o in outputs] == [0.9, 0.9, 0.7]  # as predictions.jsonl shows them
    examples = [{"id": str(i), "text": "t", "label": label} for i, label in enumerate(["b", "a", "a"])]
    entry = assess(0.5, task, outputs, examples, scored=True).entry
    # exact: (1/3, risk 1), (2/3, 1/2), (1, 1/3) → 1/3 · (1 + 1/2 + 1/3); rounded, the first two tie: 2/3 · 1/2 + 1/3 · 1/3
    assert [p["coverage"] for p in entry["curve"]] == pytest.approx([1 / 3, 2 / 3, 1])
    assert entry["aurc"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)


def records(run_dir: str) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir):
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    quiet_libraries()
    root = tmp_path_factory.mktemp("abstention")

    def run(extra: list[str], name: str) -> dict:
        res = execute(compose(RUN + extra + [f"cache_dir={cache_dir}"]), str(root / name))
        assert res["status"] == "ok", res.get("error")
        return res

    plain = run([], "plain")
    tops = sorted(max(r["probabilities"].values()) for r in records(plain["run_dir"]))
    middle = tops[len(tops) // 2]
    return {"plain": plain, "zero": run(["predict.min_confidence=0"], "zero"),
            "all": run(["predict.min_confidence=1"], "all"),
            "mid": run([f"predict.min_confidence={middle}"], "mid"), "middle": middle, "run": run, "root": root}


def test_p_zero_abstains_nothing_and_equals_the_plain_run(runs):
    plain, zero = runs["plain"], runs["zero"]
    assert plain["abstention"] is None and zero["metrics"] == plain["metrics"]
    entry = zero["abstention"]
    assert entry["min_confidence"] == 0 and entry["coverage"] == 1.0 and entry["answered"] == entry["n"] == 20
    assert entry["metrics"] == plain["metrics"] and entry["accuracy"] == pytest.approx(plain["metrics"]["accuracy"])
    assert entry["curve"][-1]["coverage"] == 1.0 and Path(entry["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert [{k: v for k, v in r.items() if k != "abstained"} for r in records(zero["run_dir"])] == records(plain["run_dir"])
    assert all(r["abstained"] is False for r in records(zero["run_dir"]))


def test_p_one_abstains_everything(runs):
    entry = runs["all"]["abstention"]
    assert entry["coverage"] == 0.0 and entry["answered"] == 0
    assert entry["accuracy"] is entry["risk"] is entry["metrics"] is None
    assert runs["all"]["metrics"] == runs["plain"]["metrics"]  # the model's labels, all rows, as before
    assert all(r["abstained"] and r["prediction"] == "abstain" for r in records(runs["all"]["run_dir"]))


def test_the_abstained_rows_are_exactly_those_under_p(runs):
    p, rows = runs["middle"], records(runs["mid"]["run_dir"])
    plain = records(runs["plain"]["run_dir"])
    # by the unrounded probabilities (probabilities.json): the row whose rounded top is p may lie under it
    exact = json.loads((Path(runs["mid"]["run_dir"]) / "probabilities.json").read_text())["rows"]
    under = [max(exact[r["id"]]) < p for r in rows]
    assert 0 < sum(under) < len(rows)
    assert [r["abstained"] for r in rows] == under
    for r, before in zip(rows, plain):
        assert r["probabilities"] == before["probabilities"]
        if r["abstained"]:
            assert r["prediction"] == "abstain" and r["model_prediction"] == before["prediction"]
        else:
            assert r["prediction"] == before["prediction"] and "model_prediction" not in r
    entry = runs["mid"]["abstention"]
    answered = [r for r in rows if not r["abstained"]]
    assert entry["coverage"] == len(answered) / len(rows)
    assert entry["accuracy"] == pytest.approx(100 * sum(r["prediction"] == r["gold"] for r in answered) / len(answered))
    assert entry["metrics"]["accuracy"] == pytest.approx(entry["accuracy"])


def test_score_of_a_file_with_abstentions_scores_the_answered_rows(runs):
    mid = runs["mid"]
    res = runs["run"](["action=score", f"score.predictions={Path(mid['run_dir']) / 'predictions.jsonl'}"], "score")
    assert res["metrics"] == mid["abstention"]["metrics"]
    assert res["abstention"]["coverage"] == mid["abstention"]["coverage"]
    assert res["abstention"]["accuracy"] == pytest.approx(mid["abstention"]["accuracy"])
    plain = runs["run"](["action=score", f"score.predictions={Path(runs['plain']['run_dir']) / 'predictions.jsonl'}"],
                        "score-plain")
    assert plain["metrics"] == runs["plain"]["metrics"] and plain["abstention"] is None


def test_the_predictor_answers_abstained_as_predict_wrote(runs, cache_dir):
    from kotune.serving.app import Predictor

    mid, p = runs["mid"], runs["middle"]
    rows = records(mid["run_dir"])
    cfg = compose(RUN + ["action=serve", f"checkpoint={mid['run_dir']}", f"predict.min_confidence={p}",
                         f"cache_dir={cache_dir}"])
    predictor = Predictor(cfg)
    answers = predictor.answer(predictor.examples([{"text": r["text"]} for r in rows]))
    assert [a["abstained"] for a in answers] == [r["abstained"] for r in rows]
    assert [a["prediction"] for a in answers] == [r["prediction"] for r in rows]


@pytest.mark.parametrize("task, why", [
    ("sts", "is a regression"), ("multi_label", "is multi-label"), ("ner", "tags tokens"),
    ("mrc", "extracts an answer span"), ("dp", "parses")])
def test_tasks_that_cannot_abstain_refuse_in_one_line(task, why):
    from tasks.abstention import checked_threshold
    from kotune.core.errors import ConfigError
    from tasks import build_task

    cfg = compose([f"task={task}", "predict.min_confidence=0.5"])
    with pytest.raises(ConfigError) as e:
        checked_threshold(cfg.predict.min_confidence, build_task(cfg.task))
    assert str(e.value).startswith(f"predict.min_confidence=0.5: task {task} {why}") and "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["1.5", "-0.1", "high"])
def test_a_threshold_outside_0_1_is_refused(value):
    from tasks.abstention import checked_threshold
    from kotune.core.errors import ConfigError
    from tasks import build_task

    cfg = compose(["task=text_cls", f"predict.min_confidence={value}"])
    with pytest.raises(ConfigError, match=r"a probability in \[0, 1\]"):
        checked_threshold(cfg.predict.min_confidence, build_task(cfg.task))


def test_a_refused_run_fails_before_training(run_job):
    res = run_job(["task=sts", "model=tiny", "data=sample", "predict.min_confidence=0.5"])
    assert res["status"] == "failed" and "is a regression" in res["error"]


def test_re_abstains_on_its_top_relation_probability(run_job, tmp_path):
    res = run_job(["task=re", "model=tiny", "data=sample", "train.max_steps=4", "predict.min_confidence=0.5"])
    assert res["status"] == "ok", res.get("error")
    rows = records(res["run_dir"])
    assert [r["abstained"] for r in rows] == [max(r["probabilities"].values()) < 0.5 for r in rows]
    assert res["abstention"]["coverage"] == sum(not r["abstained"] for r in rows) / len(rows)
