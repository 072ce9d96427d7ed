"""action=score: another system's predictions, in the official and the common formats, scored with
the task's own metrics; missing/extra ids and unknown labels are one-line errors."""
from __future__ import annotations

import csv
import json
import math
import random

import pytest

from conftest import compose, run_cli, shared_path

NLI_DEV = "data/klue/klue-nli-v1.1_dev.json"


def gold(task: str, path) -> list[dict]:
    from tasks import build_task
    from tasks.splits import load_splits

    cfg = compose([f"task={task}", "data=sample", f"data.validation_file={path}"])
    return load_splits(build_task(cfg.task), cfg.data, ("validation",), 42)["validation"].examples


def expected(task: str, outputs: list, examples: list[dict]) -> dict:
    from tasks import build_task

    return build_task(compose([f"task={task}"]).task).score(outputs, examples)


def nli_predictions(examples, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [ex["label"] if rng.random() < 0.7 else rng.choice(["entailment", "neutral", "contradiction"])
            for ex in examples]


def assert_metrics(res: dict, want: dict) -> None:
    assert res["status"] == "ok", res.get("error")
    assert res["metrics"].keys() == want.keys()
    assert all(math.isclose(res["metrics"][k], v, abs_tol=1e-9) for k, v in want.items())


def test_csv_with_id_and_label_columns_on_klue_nli(run_job, tmp_path):
    data = shared_path(NLI_DEV)
    examples = gold("nli", data)
    preds = nli_predictions(examples)
    path = tmp_path / "system.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["guid", "label"])
        w.writerows([ex["id"], p] for ex, p in reversed(list(zip(examples, preds))))  # order does not matter
    res = run_job(["action=score", "task=nli", "data=sample", f"data.validation_file={data}",
                   f"score.predictions={path}", "score.id_column=guid"])
    assert_metrics(res, expected("nli", preds, examples))
    assert res["n_eval"] == 3000 and 60 < res["metrics"]["accuracy"] < 90


def test_official_id_to_answer_json_on_korquad(run_job, tmp_path):
    data = shared_path("data/korquad/KorQuAD_v1.0_dev.json")
    examples = gold("korquad", data)
    rng = random.Random(1)
    answers = {ex["id"]: ex["answers"][0]["text"][rng.random() < 0.2:] for ex in examples}
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps(answers, ensure_ascii=False), encoding="utf-8")
    res = run_job(["action=score", "task=korquad", "data=sample", f"data.validation_file={data}",
                   f"score.predictions={path}"])
    want = expected("korquad", [{"answer": answers[ex["id"]]} for ex in examples], examples)
    assert_metrics(res, want)
    assert 70 < res["metrics"]["exact_match"] < 95


@pytest.mark.slow
def test_kotune_predictions_jsonl_on_klue_ner(run_job, tmp_path):
    """predictions.jsonl as kotune writes it (task.prediction_records): a tag list per sentence."""
    from tasks import build_task
    from kotune.core.files import write_jsonl_atomic

    data = shared_path("data/klue/klue-ner-v1.1_dev.tsv")
    examples = gold("ner", data)
    rng = random.Random(2)
    outputs = [[t if t == "O" or rng.random() < 0.7 else "O" for t in ex["tags"]] for ex in examples]
    path = tmp_path / "predictions.jsonl"
    write_jsonl_atomic(str(path), build_task(compose(["task=ner"]).task).prediction_records(outputs, examples))
    res = run_job(["action=score", "task=ner", "data=sample", f"data.validation_file={data}",
                   f"score.predictions={path}"])
    assert_metrics(res, expected("ner", outputs, examples))


def test_missing_and_extra_ids_are_one_line_with_counts(tmp_path, cache_dir):
    data = shared_path(NLI_DEV)
    examples = gold("nli", data)
    rows = [{"id": ex["id"], "prediction": ex["label"]} for ex in examples[3:]]
    rows += [{"id": "nope-1", "prediction": "neutral"}, {"id": "nope-2", "prediction": "neutral"}]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    proc = run_cli(["action=score", "task=nli", "data=sample", f"data.validation_file={data}",
                    f"score.predictions={path}", f"hydra.run.dir={tmp_path / 'out'}", f"cache_dir={cache_dir}"])
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "Traceback" not in proc.stderr
    assert "3 of 3000 gold ids have no prediction" in line and repr(examples[0]["id"]) in line
    assert "2 of 2999 predicted ids are not in" in line and "'nope-1'" in line


def test_unknown_labels_are_named(run_job, tmp_path):
    data = shared_path(NLI_DEV)
    examples = gold("nli", data)
    answers = {ex["id"]: ex["label"] for ex in examples}
    answers[examples[5]["id"]] = "entails"
    answers[examples[9]["id"]] = "NEUTRAL"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(answers), encoding="utf-8")
    res = run_job(["action=score", "task=nli", "data=sample", f"data.validation_file={data}",
                   f"score.predictions={path}"])
    assert res["status"] == "failed"
    assert "2 unknown label(s): 'NEUTRAL', 'entails'" in res["error"] and "\n" not in res["error"]


def test_ner_tag_count_must_match_the_characters(tmp_path):
    from tasks import build_task
    from kotune.core.errors import DataError
    
    task = build_task(compose(["task=ner"]).task)
    examples = [{"id": "s1", "units": list("한국 은행"), "tags": ["B-OG", "I-OG", "O", "I-OG", "I-OG"]}]
    with pytest.raises(DataError, match="'s1': 3 predicted tags for 5 units"):
        task.outputs_from_predictions(["B-OG I-OG O"], examples, "p.csv")
    with pytest.raises(DataError, match="unknown tag\\(s\\): 'B-XX'"):
        task.outputs_from_predictions([["B-XX", "I-OG", "O", "O", "O"]], examples, "p.csv")
