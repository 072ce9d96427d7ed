"""A checkpoint remembers the columns it was trained on; eval and predict on a file of another shape.

Trained from a TSV with its own column names (as KorSTS's ``score``), a checkpoint of a task whose
preset reads a KLUE format (ynat, nli, sts) must still read KLUE's JSON with the preset's own
columns (the transfer bench/pretrain_gain.py measures: KorSTS train → KLUE STS dev), a file shaped
like its training file with the saved columns, and an explicit ``data.<role>_column`` always wins.
A file with neither is one line saying the missing column came from the checkpoint."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from conftest import ROOT, compose, run_cli_here

SAMPLES = ROOT / "tasks" / "samples"
TRAIN = ["model=tiny", "train.max_steps=3", "train.batch_size=16", "train.learning_rate=1e-3",
         "save_predictions=false"]
# the TSV's own names: none is a preset's default, nor a conventional name kotune would find itself
RENAMED = {"text": "sent_a", "text_pair": "sent_b", "label": "gold"}
KLUE_TASKS = ("ynat", "nli", "sts")


def klue_examples(task: str, split: str) -> list[dict]:
    """The preset's sample file, read by the task's own reader."""
    from tasks import build_task

    return build_task(compose([f"task={task}"]).task).read_file(str(SAMPLES / task / f"{split}.json"))


def write_tsv(path: Path, examples: list[dict], label_name: str = RENAMED["label"]) -> Path:
    pair = "text_pair" in examples[0]
    header = [RENAMED["text"], *([RENAMED["text_pair"]] if pair else []), label_name]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(header)
        for ex in examples:
            writer.writerow([ex["text"], *([ex["text_pair"]] if pair else []), ex["label"]])
    return path


def column_overrides(task: str) -> list[str]:
    return ["data.text_column=sent_a", *(["data.text_pair_column=sent_b"] if task != "ynat" else []),
            "data.label_column=gold", "data.format=tsv"]


def execute(overrides: list[str], run_dir: Path, cache_dir: str) -> dict:
    from kotune.cli.job import execute as run
    from kotune.devices import quiet_libraries

    quiet_libraries()
    return run(compose(overrides + [f"cache_dir={cache_dir}"]), str(run_dir))


@pytest.fixture(scope="module", params=KLUE_TASKS)
def tsv_trained(request, tmp_path_factory, cache_dir) -> dict:
    task = request.param
    root = tmp_path_factory.mktemp(f"columns-{task}")
    train = write_tsv(root / "train.tsv", klue_examples(task, "train"))
    dev_tsv = write_tsv(root / "dev.tsv", klue_examples(task, "dev"))
    res = execute([f"task={task}", *TRAIN, *column_overrides(task), f"data.train_file={train}",
                   f"data.validation_file={dev_tsv}"], root / "run", cache_dir)
    assert res["status"] == "ok", res.get("error")
    return {"task": task, "root": root, "run": root / "run", "dev_tsv": dev_tsv, "res": res, "cache": cache_dir}


def test_klue_json_is_read_with_the_presets_columns_and_scores_as_the_tsv_does(tsv_trained):
    t = tsv_trained
    klue_dev = SAMPLES / t["task"] / "dev.json"
    on_json = execute(["action=eval", f"checkpoint={t['run']}", f"data.validation_file={klue_dev}"],
                      t["root"] / "eval-json", t["cache"])
    assert on_json["status"] == "ok", on_json.get("error")
    # the TSV holds the same examples under the checkpoint's own columns: read with those, same scores
    on_tsv = execute(["action=eval", f"checkpoint={t['run']}", f"data.validation_file={t['dev_tsv']}",
                      "data.format=tsv"], t["root"] / "eval-tsv", t["cache"])
    assert on_tsv["status"] == "ok", on_tsv.get("error")
    main = on_json["main_metric"]
    assert on_json["metrics"][main] == pytest.approx(on_tsv["metrics"][main], abs=1e-9)
    assert on_json["metrics"] == pytest.approx(on_tsv["metrics"], abs=1e-9)


def test_an_explicit_column_setting_wins_over_the_checkpoints(tsv_trained):
    t = tsv_trained
    relabelled = write_tsv(t["root"] / "relabelled.tsv", klue_examples(t["task"], "dev"), label_name="verdict")
    res = execute(["action=eval", f"checkpoint={t['run']}", f"data.validation_file={relabelled}", "data.format=tsv",
                   "data.label_column=verdict"], t["root"] / "eval-explicit", t["cache"])
    assert res["status"] == "ok", res.get("error")
    assert res["metrics"] == pytest.approx(t["res"]["metrics"], abs=1e-9)  # the same dev rows as training's


def test_a_missing_remembered_column_names_the_checkpoint_and_the_setting(tsv_trained):
    t = tsv_trained
    relabelled = write_tsv(t["root"] / "other.tsv", klue_examples(t["task"], "dev"), label_name="verdict")
    out = run_cli_here(["action=eval", f"checkpoint={t['run']}", f"data.validation_file={relabelled}",
                        "data.format=tsv", f"cache_dir={t['cache']}", f"hydra.run.dir={t['root'] / 'eval-bad'}"])
    assert out.returncode != 0
    message = [line for line in out.stderr.splitlines() if "has no column" in line]
    assert len(message) == 1, out.stderr[-2000:]
    assert f"{relabelled}: has no column 'gold'" in message[0]
    assert f"the label column checkpoint {t['run']} was trained with" in message[0]
    assert "set data.label_column=" in message[0]
