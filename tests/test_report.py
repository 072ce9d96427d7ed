"""The leaderboard (kotune/reporting/, run as ``python report.py`` or ``kotune report``): values against
hand-computed ones, bad inputs, plots, paper columns."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from kotune import reporting as report


def write_run(folder: Path, task: str, model: str, mode: str, seed: int, metrics: dict | None = None,
              status: str = "ok", **extra) -> Path:
    """A results.json as run.py writes it (the fields report.py reads)."""
    main = {"nli": "accuracy", "sts": "pearson"}[task]
    lr = extra.pop("lr", 5e-5)
    body = {"task": task, "model": model, "mode": mode, "action": "train", "seed": seed, "status": status,
            "main_metric": main, "metrics": metrics or {}, "main_score": (metrics or {}).get(main),
            "config_hash": f"{task}-{model}-{mode}-{seed}-{lr}",
            "config": {"task": {"name": task}, "model": {"name": model}, "mode": {"name": mode},
                       "train": {"seed": seed, "learning_rate": lr}},
            **extra}
    path = folder / f"{task}_{model}_{mode}_{seed}_{lr}" / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    return path


@pytest.fixture
def matrix(tmp_path) -> Path:
    """klue/finetune: nli accuracy 80, 82, 84 (mean 82, sample std 2), sts pearson 90 and 86
    (mean 88, std 2.8284) plus one failed sts run; klue/frozen: nli 70 (n=1)."""
    d = tmp_path / "runs"
    for seed, acc in zip((1, 2, 3), (80.0, 82.0, 84.0)):
        write_run(d, "nli", "klue", "finetune", seed, {"accuracy": acc, "macro_f1": acc - 10})
    write_run(d, "sts", "klue", "finetune", 1, {"pearson": 90.0, "f1": 70.0})
    write_run(d, "sts", "klue", "finetune", 2, {"pearson": 86.0, "f1": 72.0})
    write_run(d, "sts", "klue", "finetune", 3, status="failed", error="CUDA out of memory")
    write_run(d, "nli", "klue", "frozen", 1, {"accuracy": 70.0, "macro_f1": 60.0})
    return d


def read_csv(path: Path) -> dict[tuple[str, str], dict]:
    with open(path, encoding="utf-8") as f:
        return {(row["model"], row["mode"]): row for row in csv.DictReader(f)}


def test_table_values_are_mean_std_n_over_seeds(matrix):
    assert report.main([str(matrix)]) == 0
    rows = read_csv(matrix / "leaderboard.csv")
    ft = rows[("klue", "finetune")]
    assert float(ft["nli.accuracy.mean"]) == pytest.approx(82.0)
    assert float(ft["nli.accuracy.std"]) == pytest.approx(2.0)
    assert ft["nli.accuracy.n"] == "3"
    assert float(ft["nli.macro_f1.mean"]) == pytest.approx(72.0)
    assert float(ft["sts.pearson.mean"]) == pytest.approx(88.0)
    assert float(ft["sts.pearson.std"]) == pytest.approx(2.8284, abs=1e-4)  # sqrt(8)
    assert ft["sts.pearson.n"] == "2" and ft["sts.failed"] == "1" and ft["nli.failed"] == "0"
    frozen = rows[("klue", "frozen")]
    assert float(frozen["nli.accuracy.mean"]) == 70.0 and frozen["nli.accuracy.std"] == ""
    assert frozen["sts.pearson.n"] == "0"

    md = (matrix / "leaderboard.md").read_text()
    assert "| klue | finetune | 82.00 ± 2.00 (3) | 72.00 ± 2.00 (3) | 88.00 ± 2.83 (2) |" in md
    assert "| klue | frozen | 70.00 (1) |" in md
    assert "7 runs under" in md and "6 ok, 1 failed" in md
    assert "CUDA out of memory" in md.split("## Failed runs")[1]


def test_plots_are_written(matrix, tmp_path):
    out = tmp_path / "out"
    assert report.main([str(matrix), "--out", str(out)]) == 0
    for name in ("plot_nli.png", "plot_sts.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / name).stat().st_size > 10_000
    assert not list(out.glob("sweep_*.png"))  # no setting varies: not a sweep
    assert (out / "leaderboard.md").exists() and not (matrix / "leaderboard.md").exists()


def test_a_sweep_gets_one_row_per_setting_and_a_hyperparameter_plot(tmp_path):
    d = tmp_path / "sweep"
    for lr, acc in ((1e-5, 60.0), (3e-5, 75.0), (1e-4, 70.0)):
        write_run(d, "nli", "klue", "finetune", 42, {"accuracy": acc}, lr=lr)
    write_run(d, "nli", "klue", "finetune", 42, status="failed", error="NaN loss", lr=1e-3)
    assert report.main([str(d)]) == 0
    md = (d / "leaderboard.md").read_text()
    lines = [line for line in md.splitlines() if line.startswith("| klue")]
    assert [line.split(" | ")[2] for line in lines] == ["learning_rate=3e-05", "learning_rate=0.0001",
                                                        "learning_rate=1e-05", "learning_rate=0.001"]
    png = d / "sweep_nli_klue_finetune.png"
    assert png.stat().st_size > 10_000


def test_corrupt_partial_and_foreign_files_are_skipped_with_a_warning(matrix, capsys):
    (matrix / "cut").mkdir()
    (matrix / "cut" / "results.json").write_text('{"task": "nli", "model": "klue", "metr')
    (matrix / "list").mkdir()
    (matrix / "list" / "results.json").write_text("[1, 2]")
    (matrix / "running").mkdir()
    (matrix / "running" / "results.json").write_text(json.dumps({"task": "nli", "model": "klue", "status": "running"}))
    (matrix / "other").mkdir()
    (matrix / "other" / "results.json").write_text(json.dumps({"accuracy": 0.9}))
    assert report.main([str(matrix)]) == 0
    err = capsys.readouterr().err
    for name in ("cut", "list", "running", "other"):
        assert f"skipping {matrix / name / 'results.json'}" in err
    assert "corrupt JSON" in err and "partial run" in err and "not a kotune results file" in err
    assert read_csv(matrix / "leaderboard.csv")[("klue", "finetune")]["nli.accuracy.n"] == "3"


def test_a_probe_is_no_model_score_and_stays_out_of_the_table(matrix):
    """action=probe's best choice is picked on the split it is scored on: even a probe written with
    its maximum as metrics (before issue 31) is not averaged with the frozen runs."""
    write_run(matrix, "nli", "klue", "frozen", 2, {"accuracy": 99.0, "macro_f1": 99.0}, action="probe",
              probe={"rows": [], "best_on_validation": "3"})
    assert report.main([str(matrix)]) == 0
    frozen = read_csv(matrix / "leaderboard.csv")[("klue", "frozen")]
    assert frozen["nli.accuracy.n"] == "1" and float(frozen["nli.accuracy.mean"]) == 70.0


def test_mixed_schemas_are_read(tmp_path):
    """An older results file (no status, mode, main_metric, config or hash) beside a current one;
    non-numeric metric values are ignored, not averaged."""
    d = tmp_path / "runs"
    write_run(d, "nli", "klue", "finetune", 1, {"accuracy": 80.0, "note": "x"})
    old = d / "old" / "results.json"
    old.parent.mkdir()
    old.write_text(json.dumps({"task": "nli", "model": "klue", "metrics": {"accuracy": 60.0, "macro_f1": 50.0}}))
    assert report.main([str(d)]) == 0
    rows = read_csv(d / "leaderboard.csv")
    assert float(rows[("klue", "finetune")]["nli.accuracy.mean"]) == 80.0
    assert "nli.note.mean" not in rows[("klue", "finetune")]
    assert float(rows[("klue", "-")]["nli.accuracy.mean"]) == 60.0
    md = (d / "leaderboard.md").read_text()
    assert "nli accuracy*" in md  # the main metric comes from conf/task/nli.yaml for the old file


def test_the_same_run_seen_twice_counts_once(matrix, tmp_path):
    copy = tmp_path / "copy"
    write_run(copy, "nli", "klue", "frozen", 1, {"accuracy": 70.0, "macro_f1": 60.0})  # same config hash
    assert report.main([str(matrix), str(copy), "--out", str(tmp_path / "out")]) == 0
    assert read_csv(tmp_path / "out" / "leaderboard.csv")[("klue", "frozen")]["nli.accuracy.n"] == "1"


def test_no_runs_is_an_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty")]) == 1
    assert "no runs found" in capsys.readouterr().err
    assert report.main([str(tmp_path / "missing")]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_paper_columns_and_deltas(matrix, tmp_path, capsys):
    paper = tmp_path / "paper.csv"
    paper.write_text("# source: a test table\nmodel,task,metric,value\nklue,nli,accuracy,81.5\n"
                     "klue,sts,pearson,90.0\nklue,sts,f1,oops\n")
    assert report.main([str(matrix), "--paper", "--paper-file", str(paper)]) == 0
    ft = read_csv(matrix / "leaderboard.csv")[("klue", "finetune")]
    assert float(ft["nli.accuracy.paper"]) == 81.5 and float(ft["nli.accuracy.delta"]) == pytest.approx(0.5)
    assert float(ft["sts.pearson.delta"]) == pytest.approx(-2.0)
    assert "sts.f1.paper" not in ft and "nli.macro_f1.paper" not in ft  # no (valid) published number
    frozen = read_csv(matrix / "leaderboard.csv")[("klue", "frozen")]
    assert frozen["nli.accuracy.paper"] == ""  # the paper fine-tunes: no frozen reference
    md = (matrix / "leaderboard.md").read_text()
    assert "| 82.00 ± 2.00 (3) | 81.50 | +0.50 |" in md
    assert "data row 3" in capsys.readouterr().err  # the malformed row is named


def test_shipped_paper_file_parses():
    rows = report.read_paper(report.PAPER_FILE)
    models = {m for m, _, _ in rows}
    assert models <= {"klue", "klue-roberta", "koelectra", "kcbert"}
    assert all(0 < v <= 100 for v in rows.values())


def test_a_value_that_only_follows_the_task_is_not_a_setting(tmp_path):
    d = tmp_path / "runs"
    for seed in (1, 2):
        write_run(d, "nli", "klue", "finetune", seed, {"accuracy": 80.0}, lr=5e-5)
        write_run(d, "sts", "klue", "finetune", seed, {"pearson": 90.0}, lr=3e-5)  # a per-task recipe
    assert report.main([str(d)]) == 0
    rows = read_csv(d / "leaderboard.csv")
    assert list(rows) == [("klue", "finetune")] and rows[("klue", "finetune")]["setting"] == ""


RE_REFERENCE = {"task": {"markers": "klue", "pooling": "cls", "main_metric": "micro_f1"},
                "train": {"learning_rate": 5e-5, "batch_size": 32, "epochs": 3, "select_best": True}}


def write_re_run(folder: Path, model: str, seed: int, name_or_path: str, markers: str = "klue",
                 select_best: bool = True, reference: dict | None = RE_REFERENCE, **data) -> None:
    """An RE results.json whose config is resolved as run.py stores it, reference block included."""
    task = {"name": "re", "markers": markers, "pooling": "cls", "main_metric": "micro_f1"}
    if reference is not None:
        task["reference"] = reference
    config = {"task": task, "model": {"name": model, "name_or_path": name_or_path, "init": "pretrained"},
              "mode": {"name": "finetune"},
              "train": {"seed": seed, "learning_rate": 5.0e-5, "batch_size": 32, "epochs": 3, "max_steps": -1,
                        "select_best": select_best},
              "data": {"source": "hub", "train_file": None, "validation_file": None, "validation_split": 0.0,
                       "max_train_samples": None, "max_eval_samples": None, **data}}
    body = {"task": "re", "model": model, "mode": "finetune", "action": "train", "seed": seed, "status": "ok",
            "main_metric": "micro_f1", "metrics": {"micro_f1": 60.0 + seed, "auprc": 50.0},
            "config_hash": f"re-{model}-{seed}-{markers}-{select_best}", "config": config}
    path = folder / f"re_{model}_{seed}_{markers}_{select_best}" / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))


def test_paper_setup_is_like_for_like_or_lists_the_differences(tmp_path):
    d = tmp_path / "runs"
    for seed in (1, 2):  # the paper's setup on the paper's checkpoint
        write_re_run(d, "klue", seed, "klue/bert-base")
    # kotune's default markers, no selection, a random local encoder under the preset's name, sample data
    write_re_run(d, "klue-roberta", 1, "../shared/vocab/kcbert-base", markers="typed_punct", select_best=False,
                 source="sample")
    write_re_run(d, "koelectra", 1, "monologg/koelectra-base-v3-discriminator", reference=None)  # an older run
    write_re_run(d, "tiny", 1, None)  # no published row: nothing compared
    assert report.main([str(d), "--paper"]) == 0
    rows = read_csv(d / "leaderboard.csv")
    assert rows[("klue", "finetune")]["re.paper_setup"] == "like for like"
    assert rows[("klue-roberta", "finetune")]["re.paper_setup"] == (
        "data.source sample≠hub; model ../shared/vocab/kcbert-base≠klue/roberta-base; "
        "task.markers typed_punct≠klue; train.select_best false≠true")
    assert rows[("koelectra", "finetune")]["re.paper_setup"].startswith("not comparable: no task.reference")
    assert rows[("tiny", "finetune")]["re.paper_setup"] == "" and rows[("tiny", "finetune")]["re.micro_f1.paper"] == ""
    md = (d / "leaderboard.md").read_text()
    assert "| klue | finetune | 61.50 ± 0.71 (2) | 66.44 | -4.94 | like for like |" in md
    assert "| klue-roberta | finetune | 61.00 (1) | 66.66 | -5.66 | differs (below) |" in md
    assert "| koelectra | finetune | 61.00 (1) | 62.85 | -1.85 | unknown (below) |" in md
    below = md.split("## Setup differences from the paper")[1]
    assert "- klue-roberta / finetune, re: data.source" in below and "task.markers typed_punct≠klue" in below
    assert "klue / finetune, re" not in below


def test_every_published_task_has_a_reference_its_recipe_and_train_klue_meet(tmp_path):
    """The shipped reference blocks: train=klue with the task's recipe meets reference.train; the
    task options that differ by default are the documented ones."""
    from omegaconf import OmegaConf

    from conftest import compose

    default_differs = {"ner": {"main_metric"}, "re": {"markers", "pooling"}}
    for task in sorted({t for _, t, _ in report.read_paper(report.PAPER_FILE)} - {"dp"}):  # dp: its own tests
        cfg = compose([f"task={task}", "train=klue"])
        assert "reference" in cfg.task, f"{task} has published scores but no reference block"
        ref = OmegaConf.to_container(cfg.task.reference)
        assert {k for k, v in ref["train"].items() if cfg.train[k] != v} == set(), task
        assert {k for k, v in ref["task"].items() if cfg.task[k] != v} == default_differs.get(task, set()), task


def test_a_task_preset_gets_its_own_rows_and_its_tasks_paper_numbers(tmp_path):
    """task=dp_klue (kind dp) and task=dp are reported apart, both against KLUE's published DP row."""
    d = tmp_path / "runs"
    paper = tmp_path / "paper.csv"
    paper.write_text("model,task,metric,value\nklue,dp,las_macro_f1,87.77\n")
    for task, kind, las in (("dp", None, 60.0), ("dp_klue", "dp", 70.0)):
        body = {"task": task, "model": "klue", "mode": "finetune", "action": "train", "seed": 1, "status": "ok",
                "main_metric": "las_macro_f1", "metrics": {"las_macro_f1": las}, "main_score": las,
                "config_hash": task, "config": {"task": {"name": task, **({"kind": kind} if kind else {})},
                                                "model": {"name": "klue"}, "train": {"seed": 1}}}
        (d / task).mkdir(parents=True)
        (d / task / "results.json").write_text(json.dumps(body))
    assert report.main([str(d), "--paper", "--paper-file", str(paper)]) == 0
    row = read_csv(d / "leaderboard.csv")[("klue", "finetune")]
    assert float(row["dp.las_macro_f1.mean"]) == 60.0 and float(row["dp_klue.las_macro_f1.mean"]) == 70.0
    assert float(row["dp.las_macro_f1.paper"]) == float(row["dp_klue.las_macro_f1.paper"]) == 87.77


def test_python_report_py_is_the_same_command(matrix, tmp_path):
    """report.py is a thin script over kotune.reporting.main: ``python report.py DIR`` from anywhere."""
    proc = subprocess.run([sys.executable, str(ROOT / "report.py"), str(matrix), "--out", str(tmp_path / "out")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "leaderboard.md").read_text(encoding="utf-8") in proc.stdout
    missing = subprocess.run([sys.executable, str(ROOT / "report.py"), str(tmp_path / "missing")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1 and "is not a directory" in missing.stderr


def test_calibrated_runs_get_one_reliability_diagram_per_row_from_their_pooled_bins(tmp_path, capsys, monkeypatch):
    from kotune.calibration import fit as calibration
    from tasks.calibration_metrics import ece, reliability_bins, softmax

    d = tmp_path / "cal"
    items = {1: ([[2.0, 0.1], [0.3, 1.5], [1.0, 0.9]], [0, 1, 1]), 2: ([[3.0, -1.0], [0.2, 0.1]], [1, 0])}
    for seed, (logits, gold) in items.items():
        bins = {"before": reliability_bins(softmax(logits), gold), "after": reliability_bins(softmax(logits, 2.0), gold)}
        write_run(d, "nli", "klue", "finetune", seed, {"accuracy": 50.0}, calibration={"reliability": bins})
    write_run(d, "nli", "klue", "frozen", 1, {"accuracy": 40.0},
              calibration={"reliability": {"before": [{"lo": 0, "hi": 1, "count": -3}], "after": []}})
    write_run(d, "sts", "klue", "finetune", 1, {"pearson": 80.0})  # not calibrated: no diagram
    drawn = []
    real = calibration.write_diagram
    monkeypatch.setattr(calibration, "write_diagram", lambda path, before, after, title:
                        drawn.append((path, before, after, title)) or real(path, before, after, title))
    assert report.main([str(d)]) == 0
    assert [Path(p).name for p, *_ in drawn] == ["reliability_nli_klue_finetune.png"]
    assert (d / "reliability_nli_klue_finetune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the two seeds' bins pooled are the bins of their items together
    all_logits = items[1][0] + items[2][0]
    all_gold = items[1][1] + items[2][1]
    _, before, after, title = drawn[0]
    for pooled, temperature in ((before, 1.0), (after, 2.0)):
        together = reliability_bins(softmax(all_logits, temperature), all_gold)
        assert [b["count"] for b in pooled] == [b["count"] for b in together]
        for key in ("confidence", "accuracy"):
            assert [b[key] for b in pooled] == pytest.approx([b[key] for b in together])
    assert "2 run(s) pooled" in title
    from tasks.calibration_metrics import ece_of_bins

    assert ece_of_bins(before) == pytest.approx(ece(softmax(all_logits), all_gold))
    err = capsys.readouterr().err
    assert "calibration.reliability is not a list of bins before and after" in err
