"""Few-shot classification: ``data.examples_per_class=N`` (tasks/few_shot.py: a seeded sample of N
rows per class) and ``mode=setfit`` (kotune/training/setfit.py: the encoder's contrastive stage on pairs of
the few rows with the setfit package, then the head on its fixed embedding), an ordinary kotune run."""
from __future__ import annotations

import json

import pytest
import torch

from kotune.core.errors import ConfigError
from tasks.few_shot import check_examples_per_class, sample_note, sample_per_class

ROWS = [{"id": str(i), "label": label} for i, label in enumerate(["a"] * 10 + ["b"] * 6 + ["c"] * 2)]
FEW = ["task=text_cls", "model=tiny", "data=sample", "train.batch_size=8", "train.max_steps=4"]


# ---- data.examples_per_class: pure ----------------------------------------------------------
def test_the_same_seed_draws_the_same_rows_and_each_class_n_or_all_it_has():
    kept, counts = sample_per_class(ROWS, 4, seed=7)
    assert counts == {"a": 4, "b": 4, "c": 2} and len(kept) == 10
    assert sample_per_class(ROWS, 4, seed=7) == (kept, counts)
    assert [int(r["id"]) for r in kept] == sorted(int(r["id"]) for r in kept)  # file order kept
    others = {tuple(r["id"] for r in sample_per_class(ROWS, 4, seed=s)[0]) for s in range(8)}
    assert len(others) > 1  # another seed, other rows
    assert sample_per_class(ROWS, 50, seed=1)[0] == ROWS  # every class has fewer: everything
    assert sample_note(4, counts, 18) == ("data.examples_per_class=4: 10 of 18 training rows, 4 of each of 3 classes "
                                          "(c has 2: all of them)")


def test_a_label_that_is_not_one_class_or_a_bad_n_is_one_line():
    with pytest.raises(ConfigError, match="task sts's rows carry float labels"):
        sample_per_class([{"label": 3.5}], 2, 1, "sts")
    with pytest.raises(ConfigError, match="carry list labels"):
        sample_per_class([{"label": ["x"]}], 2, 1, "multi_label")
    for bad in (0, -2, 1.5, True, "8"):
        with pytest.raises(ConfigError, match="data.examples_per_class="):
            check_examples_per_class(bad)
    assert check_examples_per_class(None) is None and check_examples_per_class(3) == 3


def test_examples_per_class_samples_the_training_split_of_a_run(run_job):
    res = run_job([*FEW, "data.examples_per_class=3"], "few")
    assert res["status"] == "ok", res.get("error")
    assert res["n_train"] == 9 and res["n_eval"] == 20  # the validation split is untouched
    assert res["data"]["train"]["examples_per_class"] == {"n": 3, "seed": 42, "rows": {"긍정": 3, "부정": 3, "중립": 3}}
    refused = run_job(["task=sts", "model=tiny", "data=sample", "train.max_steps=1", "data.examples_per_class=3"], "sts")
    assert refused["status"] == "failed" and "\n" not in refused["error"]
    assert "data.examples_per_class samples each class of a single-label classification" in refused["error"]


# ---- mode=setfit --------------------------------------------------------------------------------
def class_separation(encoder, tokenizer, examples: list[dict]) -> float:
    """Mean cosine of same-class pairs minus that of other-class pairs, on mean-pooled last states."""
    with torch.no_grad():
        enc = tokenizer([ex["text"] for ex in examples], padding=True, truncation=True, max_length=64,
                        return_tensors="pt")
        states = encoder.eval()(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        vectors = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)
    cos = vectors @ vectors.T
    labels = [ex["label"] for ex in examples]
    same = [cos[i, j] for i in range(len(labels)) for j in range(i + 1, len(labels)) if labels[i] == labels[j]]
    other = [cos[i, j] for i in range(len(labels)) for j in range(i + 1, len(labels)) if labels[i] != labels[j]]
    return float(torch.stack(same).mean() - torch.stack(other).mean())


def test_setfit_pulls_classes_apart_then_trains_the_head_on_the_fixed_encoder(run_job, tmp_path, caplog):
    import logging

    from heads.model.kotune_model import KotuneModel
    from transformers import AutoTokenizer

    common = [*FEW, "data.examples_per_class=4", "save_predictions=true"]
    frozen = run_job([*common, "mode=frozen", "mode.pooling=mean", "mode.cache=false"], "frozen")
    caplog.set_level(logging.INFO)
    setfit = run_job([*common, "mode=setfit", "mode.body_learning_rate=1e-3", "mode.pairs_per_example=4"], "setfit")
    # sentence-transformers' note of a CoSENT default it does not use (setfit hands it CosineSimilarityLoss)
    assert not [r for r in caplog.records if "No `loss` passed" in r.getMessage() or r.name.startswith("setfit")]
    caplog.set_level(logging.WARNING)
    assert frozen["status"] == "ok" and setfit["status"] == "ok", (frozen.get("error"), setfit.get("error"))
    entry = setfit["setfit"]
    assert entry["package"].startswith("setfit ") and entry["pairs"] == 2 * 4 * 12 and entry["steps"] > 0
    assert setfit["n_train"] == 12 and setfit["pooling"] == "mean" and frozen["setfit"] is None
    # then only the head, one linear layer (SetFit's): hidden × 3 classes + 3 biases
    assert setfit["trainable_params"] == 128 * 3 + 3 < frozen["trainable_params"] < setfit["total_params"]
    # the same seed, the same rows and the same initial encoder: the contrastive stage moved the
    # encoder so that same-class rows embed closer than other-class rows, beyond where it started
    before = KotuneModel.load(str(tmp_path / "frozen" / "model"))
    after = KotuneModel.load(str(tmp_path / "setfit" / "model"))
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "setfit" / "model"))
    from tasks import build_task
    from conftest import compose
    from tasks.splits import load_splits

    cfg = compose([*common, "mode=setfit"])
    train = load_splits(build_task(cfg.task), cfg.data, ("train",), 42)["train"].examples
    assert class_separation(after.encoder, tokenizer, train) > class_separation(before.encoder, tokenizer, train) + 0.01
    # an ordinary run: eval of the checkpoint gives its metrics, predict writes its predictions
    evaluated = run_job(["action=eval", f"checkpoint={tmp_path / 'setfit'}", "data=sample"], "eval")
    assert evaluated["status"] == "ok" and evaluated["metrics"] == pytest.approx(setfit["metrics"])
    records = [json.loads(line) for line in (tmp_path / "setfit" / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 20 and all("probabilities" in r for r in records)
    # serve's predictor (kotune.load) answers from the run directory as predict did
    from kotune.api import load

    served = load(tmp_path / "setfit")([records[0]["text"]])
    assert served[0]["probabilities"] == records[0]["probabilities"]
    # a single linear layer on the mean has no native class: export says so in one line (serve and predict read the run)
    exported = run_job(["action=export", f"checkpoint={tmp_path / 'setfit'}"], "export")
    assert exported["status"] == "failed" and "SetFit's single linear layer" in exported["error"]
    assert "\n" not in exported["error"]


def test_the_setfit_head_is_one_linear_layer_at_setfits_rate_and_l2(cache_dir, tmp_path):
    """setfit's differentiable head: one linear layer on the mean-pooled embedding (no dense layer,
    so none that starts from BERT's pooler; no tanh, no dropout), AdamW at head_learning_rate 1e-2
    and l2_weight 0.01, the body frozen."""
    from conftest import compose
    from kotune.loading.build import build
    from kotune.training.trainer import make_trainer

    cfg = compose([*FEW, "mode=setfit", f"cache_dir={cache_dir}"])
    assert cfg.train.learning_rate == pytest.approx(1e-2) and cfg.train.weight_decay == pytest.approx(0.01)
    b = build(cfg, ("train", "validation"))
    head = b.model.head
    assert [type(m) for m in head.modules() if any(True for _ in m.parameters(recurse=False))] == [torch.nn.Linear]
    assert [n for n, p in b.model.named_parameters() if p.requires_grad] == ["head.out.weight", "head.out.bias"]
    states, mask = torch.randn(2, 5, 128), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    mean = (states * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    torch.testing.assert_close(head.train()(states, mask), head.out(mean))  # no dropout either
    optimizer = make_trainer(cfg, b, str(tmp_path)).create_optimizer()
    where = {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    assert where[id(head.out.weight)] == pytest.approx((1e-2, 0.01))
    from kotune.export.native import refusal

    assert "SetFit's single linear layer" in refusal(b.model)  # exported as a dense + tanh head it would differ
    assert compose([*FEW, "mode=setfit", "train.learning_rate=3e-3"]).train.learning_rate == pytest.approx(3e-3)


@pytest.mark.parametrize("task, why", [("sts", "is not single-text classification"),
                                       ("text_pair", "is not single-text classification"),
                                       ("ner", "is not single-text classification")])
def test_setfit_refuses_a_task_it_cannot_train_in_one_line(run_job, task, why):
    res = run_job([f"task={task}", "model=tiny", "data=sample", "mode=setfit", "train.max_steps=1"], task)
    assert res["status"] == "failed" and "\n" not in res["error"]
    assert res["error"] == f"mode=setfit: task {task} {why}: SetFit trains an embedding of one text per row"
