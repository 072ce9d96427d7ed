"""task=multi_label: the metrics against scikit-learn, the threshold search, reading label sets
(lists, separated cells, several columns, empty sets, unknown labels), the head's BCE equal to the
native class's at step 0, threshold=tune fitted on training data only and saved with the model, and
the exported model served by transformers.pipeline exactly as kotune predicts."""
from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest
import torch

from conftest import compose

TINY = ["model=tiny", "data=sample", "train.batch_size=16", "train.logging_steps=1"]


# ---- metrics and the threshold search (pure) --------------------------------------------------
def random_sets(rng: random.Random, labels: list[str], n: int) -> list[list[str]]:
    return [[name for name in labels if rng.random() < 0.3] for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_metrics_equal_scikit_learn(seed):
    from sklearn.metrics import accuracy_score, f1_score
    from sklearn.preprocessing import MultiLabelBinarizer

    from tasks.metrics import multi_label_scores

    rng = random.Random(seed)
    labels = ["gender", "others", "hate", "offensive", "rare"]
    golds, preds = random_sets(rng, labels[:4], 40), random_sets(rng, labels, 40)  # "rare": never gold
    if seed == 0:
        golds[0], preds[0] = [], []  # an empty set predicted for an empty gold: samples F1 counts it as right
    ours = multi_label_scores(preds, golds, labels)
    binarize = MultiLabelBinarizer(classes=labels).fit([labels])
    y, p = binarize.transform(golds), binarize.transform(preds)
    assert ours["micro_f1"] == pytest.approx(100 * f1_score(y, p, average="micro"), abs=1e-9)
    assert ours["macro_f1"] == pytest.approx(100 * f1_score(y, p, average="macro", zero_division=0), abs=1e-9)
    assert ours["samples_f1"] == pytest.approx(100 * f1_score(y, p, average="samples", zero_division=1), abs=1e-9)
    assert ours["subset_accuracy"] == pytest.approx(100 * accuracy_score(y, p), abs=1e-9)
    per_label = f1_score(y, p, average=None, zero_division=0)
    assert [ours[f"f1_{name}"] for name in labels] == pytest.approx(list(100 * per_label), abs=1e-9)


def test_threshold_search_finds_each_labels_best_cut():
    """Against brute force over every cut: the chosen threshold reaches each label's best F1, and a
    label without a positive example keeps 0.5."""
    from tasks.multi_label import best_thresholds

    rng = random.Random(3)
    probs = [[round(rng.random(), 2), rng.random() ** 3, rng.random()] for _ in range(60)]
    golds = [[p[0] > 0.6 or rng.random() < 0.1, rng.random() < p[1] + 0.05, False] for p in probs]

    def f1_at(j: int, t: float) -> float:
        tp = sum(1 for p, g in zip(probs, golds) if p[j] >= t and g[j])
        predicted, positives = sum(p[j] >= t for p in probs), sum(g[j] for g in golds)
        return 2 * tp / (predicted + positives)

    chosen = best_thresholds(probs, golds)
    for j in (0, 1):
        best = max(f1_at(j, p[j]) for p in probs)
        assert f1_at(j, chosen[j]) == pytest.approx(best, abs=1e-12) and best > 0.5
    assert chosen[2] == 0.5



def cut_f1s(probs: list[float], golds: list[bool]) -> list[tuple[float, Fraction]]:
    """The documented rule's candidates, highest first, each with its F1 as an exact fraction: the
    midpoints between consecutive distinct probabilities and half of the lowest, each predicting
    the examples at or above it."""
    distinct = sorted(set(probs), reverse=True)
    candidates = [(a + b) / 2 for a, b in zip(distinct, distinct[1:])] + [(distinct[-1] + 0.0) / 2]
    return [(t, Fraction(2 * sum(1 for p, g in zip(probs, golds) if p >= t and g),
                         sum(p >= t for p in probs) + sum(golds))) for t in candidates]


def brute_force_threshold(probs: list[float], golds: list[bool]) -> float:
    """The rule written out plainly: the best F1 wins, ties to the highest candidate; 0.5 without
    a positive example."""
    if not any(golds):
        return 0.5
    best, chosen = Fraction(-1), None
    for t, f1 in cut_f1s(probs, golds):  # highest first: only a strictly better F1 replaces the one kept
        if f1 > best:
            best, chosen = f1, t
    return chosen


@pytest.mark.parametrize(("probs", "golds", "expected"), [
    # cuts 0.85, 0.55, 0.25, 0.1: F1 2/3, 1/2, 4/5, 2/3 -> 0.25
    ([0.9, 0.8, 0.3, 0.2], [True, False, True, False], 0.25),
    # cuts 0.7, 0.5, 0.3, 0.1: F1 2/3, 1/2, 2/5, 2/3 -> a tie, the highest (0.7) wins
    ([0.8, 0.6, 0.4, 0.2], [True, False, False, True], 0.7),
    # a repeated probability is one cut: 0.55 (F1 1/2) or 0.2 (F1 4/5), never between the two 0.7s
    ([0.7, 0.4, 0.7], [True, True, False], 0.2),
    # every example positive: the best cut is below the lowest probability, at half of it
    ([0.4, 0.2], [True, True], 0.1),
], ids=["issue-example", "tie-to-highest", "repeated-probability", "below-the-lowest"])
def test_threshold_search_by_hand(probs, golds, expected):
    """Cases worked out by hand from the docstring's rule (F1 of each cut in the comments), the
    exact threshold returned, not only its F1."""
    from tasks.multi_label import best_thresholds

    assert brute_force_threshold(probs, golds) == pytest.approx(expected, abs=1e-12)
    assert best_thresholds([[p] for p in probs], [[g] for g in golds]) == pytest.approx([expected], abs=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_threshold_search_returns_the_rules_threshold_ties_included(seed):
    """Probabilities on a coarse grid (repeats), each case with an F1 tie: the very threshold of the
    rule written out plainly, which the F1 alone does not pin down."""
    from tasks.multi_label import best_thresholds

    def tied(column: int) -> bool:
        pairs = cut_f1s([p[column] for p in probs], [g[column] for g in golds])
        return any(g[column] for g in golds) and [f1 for _, f1 in pairs].count(max(f1 for _, f1 in pairs)) > 1

    rng = random.Random(seed)
    while True:  # drawn until some label's best F1 is reached by two cuts or more (rare by chance)
        n = rng.randint(3, 12)
        probs = [[round(rng.random(), 1) for _ in range(4)] for _ in range(n)]
        golds = [[rng.random() < 0.2 + 0.15 * j for j in range(4)] for _ in range(n)]
        if any(tied(j) for j in range(4)):
            break
    expected = [brute_force_threshold([p[j] for p in probs], [g[j] for g in golds]) for j in range(4)]
    assert best_thresholds(probs, golds) == pytest.approx(expected, abs=1e-12)


# ---- reading -----------------------------------------------------------------------------------
def task_of(overrides: list[str]):
    from tasks import build_task

    return build_task(compose(overrides).task)


def test_label_sets_from_lists_separated_cells_and_two_columns(tmp_path):
    from omegaconf import OmegaConf

    from tasks.splits import load_splits

    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text('{"text": "맛있어요", "labels": ["맛"]}\n{"text": "그냥 그래요", "labels": []}\n'
                     '{"text": "비싸고 불친절", "labels": ["가격", "서비스", "가격"]}\n', encoding="utf-8")
    task = task_of(["task=multi_label"])
    assert [ex["label"] for ex in task.read_file(str(jsonl))] == [["맛"], [], ["가격", "서비스"]]

    tsv = tmp_path / "a.tsv"
    tsv.write_text("text\tlabels\n맛있어요\t맛\n그냥 그래요\t\n비싸고 불친절\t가격 | 서비스\n", encoding="utf-8")
    task = task_of(["task=multi_label", "task.label_separator='|'"])
    assert [ex["label"] for ex in task.read_file(str(tsv))] == [["맛"], [], ["가격", "서비스"]]

    hate = tmp_path / "hate.tsv"
    hate.write_text("comments\tcontain_gender_bias\tbias\thate\n가\tFalse\tnone\tnone\n나\tTrue\tgender\toffensive\n"
                    "다\tFalse\tothers\tnone\n", encoding="utf-8")
    task = task_of(["task=hate_multi_label"])
    data = OmegaConf.create({"train_file": str(hate), "validation_file": str(hate)})
    examples = load_splits(task, data, ("validation",), seed=1)["validation"].examples
    assert [ex["label"] for ex in examples] == [[], ["gender", "offensive"], ["others"]]
    assert task.label_values(examples) == [[0, 0, 0, 0], [1, 0, 0, 1], [0, 1, 0, 0]]
    # the same from the generic task, the columns named on the command line
    cfg = compose(["task=multi_label", "data.text_column=comments", "data.label_column=[bias,hate]",
                   "task.no_label=[none]", f"data.train_file={hate}", f"data.validation_file={hate}"])
    generic = task_of(["task=multi_label", "task.no_label=[none]"])
    examples = load_splits(generic, cfg.data, ("validation",), seed=1)["validation"].examples
    assert [ex["label"] for ex in examples] == [[], ["gender", "offensive"], ["others"]]


def test_an_unknown_label_in_dev_names_file_row_and_label(tmp_path, run_job):
    """Labels learned from the training file: a dev label outside them is one line naming the file,
    the row and the label (an empty set is a legal example on either side)."""
    dev = tmp_path / "dev.jsonl"
    dev.write_text('{"text": "좋아요", "labels": []}\n{"text": "빨리 왔어요", "labels": ["배달"]}\n', encoding="utf-8")
    res = run_job(["task=multi_label", *TINY, f"data.validation_file={dev}", "train.max_steps=1"])
    assert res["status"] == "failed" and "\n" not in res["error"]
    assert res["error"] == f"{dev}:2: unknown label '배달' (labels: 가격, 맛, 분위기, 서비스)"


def test_a_single_label_task_refuses_several_label_columns(run_job):
    res = run_job(["task=text_cls", *TINY, "data.label_column=[a,b]", "train.max_steps=1"])
    assert res["status"] == "failed" and "names several columns" in res["error"] and "task=multi_label" in res["error"]


# ---- the head ----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["bert", "electra"])
def test_the_loss_is_the_native_multi_label_loss_even_when_the_collator_pads_labels(arch):
    from test_native_heads import batch, small_encoder

    from kotune.export.native import to_native
    from heads.model.kotune_model import KotuneModel
    from tasks.collate import DynamicPaddingCollator

    model = KotuneModel(small_encoder(arch, "sequence"), "sequence", {"num_labels": 3, "multi_label": True}).eval()
    native = to_native(model)
    assert native.config.problem_type == "multi_label_classification"
    inputs = batch(arch)
    targets = [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    rows = [{"input_ids": ids[m.bool()].tolist(), "attention_mask": [1] * int(m.sum()), "labels": t}
            for ids, m, t in zip(inputs["input_ids"], inputs["attention_mask"], targets)]
    padded = DynamicPaddingCollator(0 if arch != "roberta" else 1, pad_to_multiple_of=8)(rows)
    assert padded["labels"].shape[1] == 8  # the label vectors were padded too (-100)
    with torch.no_grad():
        theirs = native(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                        labels=torch.tensor(targets)).loss
        ours = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                     labels=padded["labels"])["loss"]
    assert float(ours) == pytest.approx(float(theirs), abs=1e-6) and float(ours) > 0.1


# ---- threshold=tune, the checkpoint, score -----------------------------------------------------
def test_tuned_thresholds_come_from_training_data_only_and_the_checkpoint_keeps_them(run_job, tmp_path):
    """threshold=tune holds a seeded slice of the training file out of training; the validation
    file's labels never change the thresholds; eval of the checkpoint decides with them; a number at
    eval decides as action=score re-deciding the saved probabilities at that number."""
    from tasks.splits import sample_file

    train_args = ["task=multi_label", *TINY, "train.max_steps=12", "train.learning_rate=3e-3", "task.threshold=tune"]
    first = run_job(train_args, "tuned")
    assert first["status"] == "ok", first.get("error")
    tune = first["data"]["tune"]
    assert tune["file"] == first["data"]["train"]["file"] and tune["part"] == "tune" and first["n_tune"] == 6
    assert first["n_train"] == 58 and len(set(first["decision"]["thresholds"].values())) > 1

    dev = sample_file(compose(["task=multi_label"]).task, "validation")
    rows = [json.loads(line) for line in open(dev, encoding="utf-8")]
    shuffled = tmp_path / "dev_other_labels.jsonl"
    golds = [r["labels"] for r in rows]
    shuffled.write_text("".join(json.dumps(dict(r, labels=g), ensure_ascii=False) + "\n"
                                for r, g in zip(rows, golds[7:] + golds[:7])), encoding="utf-8")
    other = run_job([*train_args, f"data.validation_file={shuffled}"], "other_dev")
    assert other["decision"]["thresholds"] == first["decision"]["thresholds"]
    assert other["metrics"] != first["metrics"]  # the golds did change

    checkpoint = f"checkpoint={tmp_path / 'tuned'}"
    again = run_job(["task=multi_label", *TINY, "action=eval", checkpoint], "eval")
    assert again["metrics"] == pytest.approx(first["metrics"], abs=1e-9)
    assert again["decision"]["thresholds"] == first["decision"]["thresholds"]
    # tune (the presets' default) at a checkpoint: the thresholds its training tuned
    tuned = run_job(["task=multi_label", *TINY, "action=eval", checkpoint, "task.threshold=tune"], "eval_tune")
    assert tuned["decision"]["thresholds"] == first["decision"]["thresholds"]
    assert tuned["metrics"] == pytest.approx(first["metrics"], abs=1e-9)

    at = run_job(["task=multi_label", *TINY, "action=eval", checkpoint, "task.threshold=0.45"], "eval_045")
    scored = run_job(["task=multi_label", *TINY, "action=score", f"data.validation_file={dev}", "task.threshold=0.45",
                      f"score.predictions={tmp_path / 'tuned' / 'predictions.jsonl'}"], "score_045")
    assert scored["metrics"] == pytest.approx(at["metrics"], abs=1e-9) != first["metrics"]
    assert set(at["decision"]["thresholds"].values()) == {0.45}


def test_tune_is_the_default_decision():
    assert compose(["task=multi_label"]).task.threshold == "tune"
    assert compose(["task=hate_multi_label"]).task.threshold == "tune"


def test_select_best_evaluates_with_thresholds_tuned_at_each_evaluation(run_job, tmp_path):
    """train.select_best (and early stopping) compare checkpoints by the decision training keeps:
    each evaluation tunes the thresholds on the held-out training slice's predictions by the weights
    evaluated, so a small model whose probabilities stay under 0.5 is not scored 0 at every
    evaluation (which kept the first checkpoint whatever came after). The kept evaluation's micro F1
    is the one results.json reports: the thresholds tuned after training are the selected weights'."""
    from conftest import assert_best_evaluation_kept

    res = run_job(["task=multi_label", *TINY, "train.max_steps=12", "train.learning_rate=3e-3",
                   "train.select_best=true", "train.warmup_ratio=0"], "select")
    assert res["status"] == "ok", res.get("error")
    assert res["decision"]["threshold"] == "tune" and res["n_tune"] == 6
    history = json.loads(max((tmp_path / "select" / "checkpoints").glob("checkpoint-*/trainer_state.json"),
                             key=lambda p: int(p.parent.name.split("-")[1])).read_text())["log_history"]
    evals = [h["eval_micro_f1"] for h in history if "eval_micro_f1" in h]
    assert len(evals) == 12 and min(evals) > 0 and len(set(evals)) > 1  # at 0.5 this model scored 0 throughout
    assert_best_evaluation_kept(tmp_path / "select", res)
    assert res["metrics"]["micro_f1"] == max(evals) > 0


def test_a_single_label_file_read_as_multi_label_is_warned_about(run_job, tmp_path, capsys):
    """Every row holding exactly one label (a text_cls file, 'none' among its labels) trains without
    an error: the warning says so and names task=text_cls."""
    train = tmp_path / "single.tsv"
    rows = [(f"문장 {i}", ("hate", "offensive", "none")[i % 3]) for i in range(30)]
    train.write_text("text\tlabels\n" + "".join(f"{t}\t{y}\n" for t, y in rows), encoding="utf-8")
    args = ["task=multi_label", "model=tiny", f"data.train_file={train}", f"data.validation_file={train}",
            "train.max_steps=1", "save_model=false"]
    capsys.readouterr()
    assert run_job(args, "single")["status"] == "ok"
    out = capsys.readouterr().out
    assert "every one of the 30 training examples holds exactly one label (hate, none, offensive)" in out
    assert "task=text_cls" in out and "task.no_label=[none]" in out
    run_job([*args, "task.no_label=[none]"], "with_none")  # an empty set among them: a multi-label file
    assert "exactly one label" not in capsys.readouterr().out


def test_a_threshold_list_of_the_wrong_length_names_the_label_count(run_job):
    res = run_job(["task=multi_label", *TINY, "train.max_steps=1", "task.threshold=[0.5,0.4]"])
    assert res["status"] == "failed" and "\n" not in res["error"]
    assert "task.threshold has 2 values, but the task has 4 labels (가격, 맛, 분위기, 서비스)" in res["error"]


# ---- export: the native class and the pipeline agree with kotune --------------------------------
def test_export_serves_the_pipeline_with_kotunes_probabilities_and_label_sets(run_job, tmp_path):
    from test_export import in_fresh_python
    from transformers import AutoConfig

    res = run_job(["task=multi_label", *TINY, "train.max_steps=12", "train.learning_rate=3e-3",
                   "task.threshold=tune"], "train")
    assert res["status"] == "ok", res.get("error")
    out = run_job(["task=multi_label", *TINY, "action=export", f"checkpoint={tmp_path / 'train'}",
                   f"export.dir={tmp_path / 'hf'}"], "export")
    assert out["status"] == "ok", out.get("error")
    config = AutoConfig.from_pretrained(tmp_path / "hf")
    assert config.problem_type == "multi_label_classification" and config.architectures == ["BertForSequenceClassification"]
    thresholds = config.kotune_thresholds
    assert thresholds == res["decision"]["thresholds"]

    records = [json.loads(line) for line in (tmp_path / "train" / "predictions.jsonl").read_text().splitlines()]
    from tasks.splits import sample_file

    dev = sample_file(compose(["task=multi_label"]).task, "validation")
    texts = [json.loads(line)["text"] for line in open(dev, encoding="utf-8")]
    served = in_fresh_python(
        "import json, transformers\n"
        f"pipe = transformers.pipeline('text-classification', model={str(tmp_path / 'hf')!r}, device='cpu')\n"
        "out = pipe(inputs, truncation=True, top_k=None, function_to_apply='sigmoid')\n"
        "print(json.dumps([{o['label']: o['score'] for o in scores} for scores in out]))", tmp_path, texts)
    assert len(served) == len(records) == 20
    sets = []
    for scores, record in zip(served, records):
        assert scores == pytest.approx(record["probabilities"], abs=1e-5)
        sets.append(sorted(name for name, p in scores.items() if p >= thresholds[name]))
        assert sets[-1] == sorted(record["prediction"])
    assert len({tuple(s) for s in sets}) >= 3  # not a trivial agreement on one set (empty, say) for all
