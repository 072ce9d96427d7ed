"""train.class_weights: balanced weights as scikit-learn computes them, the weighted losses of the
sequence and token heads, weights saved with the checkpoint, and one-line refusals (a head
without classes to weight, a list of the wrong length)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from conftest import compose

TINY = ["model=tiny", "data=sample", "train.batch_size=16", "train.max_steps=4"]


def test_balanced_weights_are_scikit_learns_and_an_absent_class_gets_0():
    import numpy as np
    from sklearn.utils.class_weight import compute_class_weight

    from tasks.class_weights import class_weights, label_counts

    targets = [0] * 5148 + [1] * 1516 + [2] * 1232
    counts = label_counts(targets, 3)
    assert counts == [5148, 1516, 1232]
    expected = compute_class_weight("balanced", classes=np.arange(3), y=np.asarray(targets))
    assert class_weights("balanced", ["none", "others", "gender"], counts) == pytest.approx(list(expected), rel=1e-12)
    # tagging targets: lists with -100 slots; tag 3 never occurs (a preset's tag absent from training)
    counts = label_counts([[0, -100, 1, 1], [2, 0, -100]], 4)
    assert counts == [2, 2, 1, 0]
    weights = class_weights("balanced", list("abcd"), counts)
    assert weights == pytest.approx([5 / 6, 5 / 6, 5 / 3, 0.0])
    assert sum(w * c for w, c in zip(weights, counts)) == pytest.approx(sum(counts))  # the loss keeps its scale


@pytest.mark.parametrize("value,error", [
    ("sometimes", "expected none, balanced or a list"),
    ([1, -2], "every weight must be a finite number ≥ 0"),
    ([0, 0], "every weight is 0"),
])
def test_bad_settings_are_config_errors(value, error):
    from tasks.class_weights import class_weight_setting
    from kotune.core.errors import ConfigError

    with pytest.raises(ConfigError, match=error):
        class_weight_setting(value)
    assert class_weight_setting("none") is None and class_weight_setting(None) is None


def test_the_heads_weigh_each_target_by_its_class():
    from heads.sequence import SequenceHead
    from heads.token import TokenHead

    torch.manual_seed(0)
    weights = [0.5, 1.0, 4.0]
    logits, labels = torch.randn(6, 3), torch.tensor([0, 0, 1, 2, 2, 0])
    head = SequenceHead(8, 3, class_weights=weights)
    per_example = F.cross_entropy(logits, labels, reduction="none")
    w = torch.tensor(weights)[labels]
    assert float(head.loss(logits, labels)) == pytest.approx(float((w * per_example).sum() / w.sum()), abs=1e-6)
    assert float(SequenceHead(8, 3).loss(logits, labels)) == pytest.approx(float(per_example.mean()), abs=1e-6)
    tags, tag_labels = torch.randn(2, 4, 3), torch.tensor([[0, 2, -100, 1], [2, -100, -100, 0]])
    kept = tag_labels != -100
    per_tag = F.cross_entropy(tags[kept], tag_labels[kept], reduction="none")
    w = torch.tensor(weights)[tag_labels[kept]]
    assert float(TokenHead(8, 3, class_weights=weights).loss(tags, tag_labels)) == \
        pytest.approx(float((w * per_tag).sum() / w.sum()), abs=1e-6)
    assert "class_weights" not in head.state_dict()  # a head argument, not a weight: exports stay native


def test_balanced_weights_are_counted_logged_saved_and_kept_by_the_checkpoint(run_job, tmp_path, capsys):
    from tasks import build_task
    from tasks.splits import sample_file

    res = run_job(["task=text_cls", *TINY, "train.class_weights=balanced"], "balanced")
    assert res["status"] == "ok", res.get("error")
    task = build_task(compose(["task=text_cls"]).task)
    counts = Counter(ex["label"] for ex in task.read_file(sample_file(task.cfg, "train")))
    n, k = sum(counts.values()), len(counts)
    assert {name: c["count"] for name, c in res["class_weights"].items()} == dict(counts)
    assert {name: c["weight"] for name, c in res["class_weights"].items()} == \
        pytest.approx({name: n / (k * c) for name, c in counts.items()})
    assert "class weights (balanced" in capsys.readouterr().out
    saved = json.loads((tmp_path / "balanced" / "model" / "kotune.json").read_text())
    assert saved["head_kwargs"]["class_weights"] == pytest.approx([n / (k * counts[x]) for x in sorted(counts)])
    evaluated = run_job(["task=text_cls", *TINY, "action=eval", f"checkpoint={tmp_path / 'balanced'}"], "eval")
    assert evaluated["metrics"] == res["metrics"]
    assert {name: c["weight"] for name, c in evaluated["class_weights"].items()} == \
        {name: c["weight"] for name, c in res["class_weights"].items()}


def test_given_weights_change_training_and_reach_token_heads(run_job):
    plain = run_job(["task=token_cls", *TINY], "plain")
    labels = json.loads((Path(plain["run_dir"]) / "model" / "kotune.json").read_text())["meta"]["labels"]
    weights = [5.0 if tag != "O" else 0.2 for tag in labels]
    weighted = run_job(["task=token_cls", *TINY, f"train.class_weights=[{','.join(map(str, weights))}]"], "weighted")
    assert plain["status"] == weighted["status"] == "ok", weighted.get("error")
    assert plain["class_weights"] is None
    assert [c["weight"] for c in weighted["class_weights"].values()] == weights
    assert abs(weighted["train_loss"] - plain["train_loss"]) > 0.05


@pytest.mark.parametrize("task,extra,error", [
    ("text_cls", ["train.class_weights=[1,2]"],
     "train.class_weights has 2 weight(s), but the task has 3 labels (긍정, 부정, 중립)"),
    ("sts", ["train.class_weights=balanced"], "it is a regression"),
    ("multi_label", ["train.class_weights=balanced"], "a sigmoid per label"),
    ("re", ["train.class_weights=balanced"], "the relation head's loss has no class weights"),
    ("ner", ["task.crf=true", "train.class_weights=balanced"], "the CRF's likelihood of whole tag sequences"),
])
def test_weights_that_do_not_fit_are_refused_in_one_line(task, extra, error, run_job):
    res = run_job([f"task={task}", *TINY, *extra])
    assert res["status"] == "failed" and res["error_type"] == "ConfigError", res.get("error")
    assert error in res["error"] and "\n" not in res["error"]
