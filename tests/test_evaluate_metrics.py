"""The evaluate modules (tasks/evaluate_metrics/) give the pure functions' numbers (1e-9) on real
dev data, combine where they share inputs, and load with the hub switched off.

The predictions are the real gold answers of ../shared's dev sets, corrupted by a seeded
generator (labels swapped, similarity scores noised, entity tags dropped, answers trimmed or
swapped), so every metric sits well inside (0, 100)."""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest

from conftest import ROOT, compose, shared_path

MODULES = ("klue_classification", "klue_sts", "klue_ner", "klue_mrc", "korquad", "klue_re", "klue_dp")


def dev_examples(task_name: str, path) -> list[dict]:
    from tasks import build_task
    from tasks.splits import load_splits

    cfg = compose([f"task={task_name}", "data=sample", f"data.validation_file={path}"])
    return load_splits(build_task(cfg.task), cfg.data, ("validation",), 42)["validation"].examples


def assert_same(module_scores: dict, function_scores: dict) -> None:
    assert module_scores.keys() == function_scores.keys()
    for k, v in function_scores.items():
        assert math.isclose(module_scores[k], v, rel_tol=0, abs_tol=1e-9), (k, module_scores[k], v)
        assert 0 < v < 100, (k, v)  # a real test: neither a perfect nor a null score


@pytest.fixture(scope="module")
def qa_data():
    examples = dev_examples("korquad", shared_path("data/korquad/KorQuAD_v1.0_dev.json"))[:1500]
    rng = random.Random(0)
    preds = []
    for ex in examples:
        answer = ex["answers"][0]["text"]
        roll = rng.random()
        if roll < 0.15:
            answer = answer[1:] or answer
        elif roll < 0.25:
            answer = rng.choice(examples)["answers"][0]["text"]
        preds.append({"id": ex["id"], "prediction_text": answer})
    refs = [{"id": ex["id"], "answers": [a["text"] for a in ex["answers"]]} for ex in examples]
    return preds, refs


@pytest.mark.slow
def test_classification_module_equals_the_functions_and_the_task_on_klue_nli():
    from tasks import build_task, metrics
    from tasks.evaluate_metrics import load_metric

    examples = dev_examples("nli", shared_path("data/klue/klue-nli-v1.1_dev.json"))
    labels = sorted({ex["label"] for ex in examples})
    rng = random.Random(1)
    preds = [rng.choice(labels) if rng.random() < 0.3 else ex["label"] for ex in examples]
    golds = [ex["label"] for ex in examples]
    scores = load_metric("klue_classification").compute(predictions=preds, references=golds, labels=labels)
    assert_same(scores, {"accuracy": metrics.accuracy(preds, golds), "macro_f1": metrics.macro_f1(preds, golds, labels)})
    task = build_task(compose(["task=nli"]).task)
    assert_same(scores, task.score(preds, examples))  # the training path: the same numbers


@pytest.mark.slow
def test_sts_module_equals_the_functions_on_klue_sts():
    from tasks import build_task, metrics
    from tasks.evaluate_metrics import load_metric

    examples = dev_examples("sts", shared_path("data/klue/klue-sts-v1.1_dev.json"))
    rng = random.Random(2)
    golds = [float(ex["label"]) for ex in examples]
    preds = [min(5.0, max(0.0, g + rng.gauss(0, 1.2))) for g in golds]
    scores = load_metric("klue_sts").compute(predictions=preds, references=golds)
    assert_same(scores, {"pearson": metrics.pearson(preds, golds), "f1": metrics.binary_f1_at(preds, golds, 3.0)})
    assert_same(scores, build_task(compose(["task=sts"]).task).score(preds, examples))


@pytest.mark.slow
def test_ner_module_equals_the_functions_on_klue_ner():
    from tasks import build_task, metrics_spans
    from tasks.evaluate_metrics import load_metric

    examples = dev_examples("ner", shared_path("data/klue/klue-ner-v1.1_dev.tsv"))[:1500]
    rng = random.Random(3)
    preds = []
    for ex in examples:  # drop or retype about a third of the tags
        tags = list(ex["tags"])
        for k, t in enumerate(tags):
            if t != "O" and rng.random() < 0.3:
                tags[k] = "O" if rng.random() < 0.5 else t[:2] + rng.choice(metrics_spans.NER_ENTITY_TYPES)
        preds.append(tags)
    golds = [ex["tags"] for ex in examples]
    chars = [ex["units"] for ex in examples]
    scores = load_metric("klue_ner").compute(predictions=preds, references=golds, chars=chars)
    keep = [[k for k, c in enumerate(u) if not c.isspace()] for u in chars]
    expected = metrics_spans.ner_entity_f1([[p[k] for k in ks] for p, ks in zip(preds, keep)],
                                     [[g[k] for k in ks] for g, ks in zip(golds, keep)])
    expected["char_f1"] = metrics_spans.ner_char_f1(preds, golds, chars=chars)
    expected["char_f1_with_o"] = metrics_spans.ner_char_f1(preds, golds, chars=chars, include_o=True)
    assert_same(scores, expected)
    assert_same(scores, build_task(compose(["task=ner"]).task).score(preds, examples))


@pytest.mark.slow
def test_qa_modules_equal_the_functions_on_korquad_and_combine(qa_data):
    import evaluate

    from tasks import metrics_spans
    from tasks.evaluate_metrics import load_metric, module_dir

    preds, refs = qa_data
    as_dicts = ({p["id"]: p["prediction_text"] for p in preds}, {r["id"]: r["answers"] for r in refs})
    korquad = load_metric("korquad").compute(predictions=preds, references=refs)
    assert_same(korquad, metrics_spans.korquad_scores(*as_dicts))
    types = [1 + i % 3 for i in range(len(refs))]
    mrc = load_metric("klue_mrc").compute(predictions=preds, references=refs, question_types=types)
    assert_same(mrc, metrics_spans.klue_mrc_scores(*as_dicts, {r["id"]: t for r, t in zip(refs, types)}))
    # both read SQuAD-shaped inputs: one combined evaluation scores a system with both definitions
    both = evaluate.combine([evaluate.load(module_dir("korquad")), evaluate.load(module_dir("klue_mrc"))],
                            force_prefix=True)
    combined = both.compute(predictions=preds, references=refs)
    assert_same({k.split("_", 1)[1]: v for k, v in combined.items() if k.startswith("korquad_")}, korquad)
    assert math.isclose(combined["klue_mrc_rouge_w"], mrc["rouge_w"], abs_tol=1e-9)


@pytest.mark.slow
def test_dp_module_equals_the_functions_and_the_task_on_klue_dp():
    from tasks import build_task, metrics
    from tasks.evaluate_metrics import load_metric
    from tasks.metric_sets import KLUE_DP_LABELS

    examples = dev_examples("dp", shared_path("data/klue/klue-dp-v1.1_dev.tsv"))[:600]
    task = build_task(compose(["task=dp"]).task)
    assert tuple(task.labels) == KLUE_DP_LABELS  # conf/task/dp.yaml and the metric's order agree
    rng = random.Random(4)
    preds = []
    for ex in examples:  # move about a fifth of the heads, relabel about a fifth of the words
        n = len(ex["heads"])
        heads = [rng.randint(0, n) if rng.random() < 0.2 else h for h in ex["heads"]]
        deprels = [rng.choice(KLUE_DP_LABELS) if rng.random() < 0.2 else d for d in ex["deprels"]]
        preds.append({"heads": heads, "deprels": deprels})
    refs = [{"heads": ex["heads"], "deprels": ex["deprels"]} for ex in examples]
    scores = load_metric("klue_dp").compute(predictions=preds, references=refs)
    label_id = {name: k for k, name in enumerate(KLUE_DP_LABELS)}
    expected = metrics.klue_dp_scores([p["heads"] for p in preds], [[label_id[d] for d in p["deprels"]] for p in preds],
                                      [r["heads"] for r in refs], [[label_id[d] for d in r["deprels"]] for r in refs])
    assert_same(scores, expected)
    assert_same(scores, task.score(preds, examples))


def test_re_module_equals_the_functions_and_the_task():
    """KLUE RE's data is not in ../shared: the sample file's examples, repeated with seeded
    predictions and probabilities."""
    import numpy as np

    from tasks import build_task, metrics
    from tasks.evaluate_metrics import load_metric

    cfg = compose(["task=re", "data=sample"])
    task = build_task(cfg.task)
    from tasks.splits import load_splits

    examples = load_splits(task, cfg.data, ("validation",), 0)["validation"].examples * 20
    labels = list(task.labels)
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(len(examples), len(labels)))
    for row, ex in zip(logits, examples):
        row[labels.index(ex["label"])] += rng.normal(1.5, 1.0)  # right more often than not
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    preds = [labels[int(r.argmax())] for r in probs]
    golds = [ex["label"] for ex in examples]
    scores = load_metric("klue_re").compute(predictions=preds, references=golds, probabilities=probs.tolist(),
                                            labels=labels)
    label_id = {name: k for k, name in enumerate(labels)}
    expected = {"micro_f1": metrics.klue_re_micro_f1(preds, golds, labels, "no_relation"),
                "auprc": metrics.klue_re_auprc(probs.tolist(), [label_id[g] for g in golds])}
    for k, v in expected.items():
        assert math.isclose(scores[k], v, abs_tol=1e-9) and 0 < v < 100, (k, scores[k], v)
    outputs = [{"label": p, "probs": r.tolist()} for p, r in zip(preds, probs)]
    for k, v in task.score(outputs, examples).items():
        assert math.isclose(scores[k], v, abs_tol=1e-9), (k, scores[k], v)


def test_every_module_loads_with_the_hub_off(tmp_path):
    """In a fresh process with HF_HUB_OFFLINE=1 and an empty modules cache, from another directory:
    the modules come from the package directory (tasks/evaluate_metrics), never from the hub."""
    code = ("import tasks.evaluate_metrics as m\n"
            f"for name in {MODULES!r}:\n"
            "    mod = m.load_metric(name)\n"
            "    assert mod.description and mod.citation and mod.inputs_description, name\n"
            "print(m.load_metric('klue_classification').compute(predictions=['a', 'b'], references=['a', 'a']))\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "'accuracy': 50.0" in proc.stdout


def test_unknown_metric_names_the_choices():
    from tasks.evaluate_metrics import load_metric

    with pytest.raises(ValueError, match="unknown metric 'klue_xx'.*klue_ner"):
        load_metric("klue_xx")


def test_every_family_has_a_module_file():
    from tasks.evaluate_metrics import FAMILIES, module_dir

    assert set(FAMILIES) == set(MODULES)
    for name in FAMILIES:
        assert os.path.exists(os.path.join(module_dir(name), f"{name}.py"))
