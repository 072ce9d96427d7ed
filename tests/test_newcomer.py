"""A newcomer's journeys (issues 52, 53): a label typo in a training file is warned of (and
``data.labels`` pins the label set), error lines name the file once and the column of an empty
text, ``action=eval checkpoint=RUN`` re-scores a run on its own recorded (and unchanged) validation
data from the command line as from the API, and an export lands beside its checkpoint."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import compose, run_cli_here

POSITIVE = ["정말 좋아요", "최고의 제품", "만족합니다", "또 살게요", "강력 추천"]
NEGATIVE = ["별로예요", "최악입니다", "환불 원해요", "실망했어요", "다시는 안 사요"]


def reviews(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("review\tsentiment\n" + "".join(f"{t}\t{label}\n" for t, label in rows), encoding="utf-8")
    return path


def typo_rows(n: int = 40) -> list[tuple[str, str]]:
    """n 긍정 and n 부정 reviews, and one 긍졍 (a Jamo typo of 긍정) at file line 2 + n."""
    rows = [(f"{POSITIVE[i % 5]} {i}", "긍정") for i in range(n)]
    rows.append(("정말 만족해요", "긍졍"))
    rows += [(f"{NEGATIVE[i % 5]} {i}", "부정") for i in range(n)]
    return rows


COLUMNS = ["data.text_column=review", "data.label_column=sentiment"]


# ---- 1. a label typo -------------------------------------------------------------------------
def test_a_far_rarer_label_is_warned_of_with_its_row_and_closest_label(tmp_path, capsys, cache_dir):
    from kotune.loading.build import build

    typo = reviews(tmp_path / "typo.tsv", typo_rows())
    build(compose(["task=text_cls", "model=tiny", f"data.train_file={typo}", "data.validation_split=0.2",
                   *COLUMNS, f"cache_dir={cache_dir}"]), ("train", "validation"))
    warned = [line for line in capsys.readouterr().out.splitlines() if "warning:" in line]
    assert len(warned) == 1, warned
    line = warned[0]
    assert "label '긍졍' has 1 row(s)" in line and "typo.tsv:42" in line  # the header is line 1
    assert "closest label '긍정' (1 Jamo/character edit)" in line and "data.labels=[긍정,부정]" in line


def test_labels_of_like_counts_are_not_warned_of(tmp_path, capsys, cache_dir):
    from kotune.loading.build import build

    clean = reviews(tmp_path / "clean.tsv", [r for r in typo_rows() if r[1] != "긍졍"])
    build(compose(["task=text_cls", "model=tiny", f"data.train_file={clean}", "data.validation_split=0.2",
                   *COLUMNS, f"cache_dir={cache_dir}"]), ("train", "validation"))
    assert "warning:" not in capsys.readouterr().out


def test_rare_label_rule():
    from collections import Counter

    from tasks.label_typos import closest_label, rare_labels

    assert rare_labels(Counter(a=400, b=500, c=4)) == ["c"]  # ≤ 1 % of the median (4.0)
    assert rare_labels(Counter(a=400, b=500, c=5)) == []
    assert rare_labels(Counter(a=10, b=10, c=1)) == []  # a small file: the median under 20 rows
    assert rare_labels(Counter(a=30, b=30, c=1)) == ["c"]  # max(1, 0.3): a single row
    assert closest_label("긍졍", ["부정", "긍정"]) == ("긍정", 1)
    assert closest_label("negativ", ["positive", "negative"]) == ("negative", 1)


def test_multi_label_rare_label_is_warned_of(tmp_path, capsys, cache_dir):
    from kotune.loading.build import build

    rows = [("text", "labels")] + [(f"좋아요 {i}", "a,b" if i % 2 else "a") for i in range(100)] + [("이상해", "a,bb")]
    path = tmp_path / "ml.tsv"
    path.write_text("".join(f"{t}\t{l}\n" for t, l in rows), encoding="utf-8")
    build(compose(["task=multi_label", "model=tiny", f"data.train_file={path}", "data.validation_split=0.1",
                   "data.label_column=labels", f"cache_dir={cache_dir}"]), ("train", "validation"))
    out = capsys.readouterr().out
    assert "label 'bb' has 1 row(s)" in out and "ml.tsv:102" in out and "closest label 'b'" in out


def test_data_labels_refuses_any_other_label_naming_file_and_row(tmp_path):
    typo = reviews(tmp_path / "typo.tsv", typo_rows())
    proc = run_cli_here(["task=text_cls", "model=tiny", f"data.train_file={typo}", "data.validation_split=0.2",
                         *COLUMNS, "data.labels=[긍정,부정]", f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {typo}:42: unknown label '긍졍' (expected one of: 긍정, 부정)"], proc.stderr[-800:]


def test_data_labels_orders_the_models_classes(tmp_path, cache_dir):
    from kotune.loading.build import build

    clean = reviews(tmp_path / "clean.tsv", [r for r in typo_rows(10) if r[1] != "긍졍"])
    b = build(compose(["task=text_cls", "model=tiny", f"data.train_file={clean}", "data.validation_split=0.2",
                       *COLUMNS, "data.labels=[부정,긍정]", f"cache_dir={cache_dir}"]), ("train", "validation"))
    assert b.task.labels == ["부정", "긍정"] and b.model.meta["labels"] == ["부정", "긍정"]
    assert b.model.head_description()  # two classes, in that order
    labels = b.features["train"]["labels"]
    texts = [ex["label"] for ex in b.splits["train"].examples]
    assert [("부정", "긍정")[y] for y in labels] == texts


@pytest.mark.parametrize("value,expected", [
    ("[긍정,긍정]", "names '긍정' twice"),
    ("긍정", "a list of label names is needed"),
])
def test_data_labels_bad_values_are_one_line(value, expected, tmp_path):
    clean = reviews(tmp_path / "clean.tsv", [r for r in typo_rows(10) if r[1] != "긍졍"])
    proc = run_cli_here(["task=text_cls", "model=tiny", f"data.train_file={clean}", "data.validation_split=0.2",
                         *COLUMNS, f"data.labels={value}", f"hydra.run.dir={tmp_path / 'run'}"])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and expected in errors[0], proc.stderr[-800:]


def test_data_labels_on_a_task_without_a_label_set_is_refused(tmp_path):
    proc = run_cli_here(["task=sts", "model=tiny", "data=sample", "data.labels=[a,b]",
                         f"hydra.run.dir={tmp_path / 'run'}"])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and "task sts has no label set to pin" in errors[0], \
        proc.stderr[-800:]


# ---- 2. error lines --------------------------------------------------------------------------
def test_an_unknown_validation_label_names_the_file_once(tmp_path):
    train = reviews(tmp_path / "train.tsv", [("좋아요", "긍정"), ("별로", "부정")])
    dev = reviews(tmp_path / "devtypo.tsv", [("그냥 그래요", "중립")])
    proc = run_cli_here(["task=text_cls", "model=tiny", f"data.train_file={train}", f"data.validation_file={dev}",
                         *COLUMNS, f"hydra.run.dir={tmp_path / 'run'}"])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {dev}:2: unknown label '중립' (training labels: 긍정, 부정)"], proc.stderr[-800:]


def test_an_empty_text_names_its_column(tmp_path):
    train = reviews(tmp_path / "train.tsv", [("좋아요", "긍정"), (" ", "부정")])
    proc = run_cli_here(["task=text_cls", "model=tiny", f"data.train_file={train}", "data.validation_split=0.5",
                         *COLUMNS, f"hydra.run.dir={tmp_path / 'run'}"])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {train}:3: empty or non-text value ' ' in column 'review' (data.text_column)"], \
        proc.stderr[-800:]


# ---- 3. action=eval checkpoint=RUN on the run's own validation data ---------------------------
SAMPLE = Path(__file__).resolve().parents[1] / "tasks" / "samples" / "text_cls"
TINY = ["task=text_cls", "model=tiny", "train.max_steps=2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir) -> dict:
    """Two tiny runs on copies of the text_cls sample: one scored on a dev file, one on a held-out
    share of its training file (a seed of its own)."""
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    quiet_libraries()
    root = tmp_path_factory.mktemp("newcomer")
    train, dev = root / "train.tsv", root / "dev.tsv"
    shutil.copy(SAMPLE / "train.tsv", train)
    shutil.copy(SAMPLE / "dev.tsv", dev)
    out = {"root": root, "train": train, "dev": dev, "cache": cache_dir}
    for name, data in (("file", [f"data.train_file={train}", f"data.validation_file={dev}"]),
                       ("split", [f"data.train_file={train}", "data.validation_split=0.25", "train.seed=7"])):
        res = execute(compose([*TINY, *data, f"cache_dir={cache_dir}"]), str(root / name))
        assert res["status"] == "ok", res.get("error")
        out[name] = res
    return out


def cli_eval(runs: dict, checkpoint: Path, name: str, *extra: str):
    return run_cli_here(["action=eval", f"checkpoint={checkpoint}", f"cache_dir={runs['cache']}", *extra,
                         f"hydra.run.dir={runs['root'] / name}"])


def test_the_cli_rescoring_a_run_reads_its_own_validation_file(runs):
    proc = cli_eval(runs, runs["root"] / "file", "eval-file")
    assert proc.returncode == 0, proc.stderr[-800:]
    res = json.loads((runs["root"] / "eval-file" / "results.json").read_text(encoding="utf-8"))
    assert res["metrics"] == pytest.approx(runs["file"]["metrics"]) and res["n_eval"] == runs["file"]["n_eval"]
    assert res["data"]["validation"]["file"] == str(runs["dev"])


def test_a_split_run_is_rescored_on_the_same_held_out_rows_from_the_cli_and_the_api(runs):
    import kotune

    proc = cli_eval(runs, runs["root"] / "split" / "model", "eval-split")
    assert proc.returncode == 0, proc.stderr[-800:]
    res = json.loads((runs["root"] / "eval-split" / "results.json").read_text(encoding="utf-8"))
    assert res["n_eval"] == runs["split"]["n_eval"] == 20  # a quarter of the 80 rows, not all of them
    assert res["metrics"] == pytest.approx(runs["split"]["metrics"])
    ids = lambda d: [json.loads(line)["id"] for line in (d / "predictions.jsonl").open(encoding="utf-8")]  # noqa: E731
    assert ids(runs["root"] / "eval-split") == ids(runs["root"] / "split")
    metrics = kotune.evaluate(runs["root"] / "split", run_dir=runs["root"] / "api-split")
    assert dict(metrics) == pytest.approx(runs["split"]["metrics"]) and metrics.results["n_eval"] == 20


@pytest.mark.parametrize("how", ["changed", "removed"])
def test_a_changed_or_missing_validation_file_is_refused_in_one_line_by_cli_and_api(how, runs, tmp_path):
    import kotune
    from kotune.api import RunFailed

    run = tmp_path / "run"
    shutil.copytree(runs["root"] / "file", run)
    dev = tmp_path / "dev.tsv"
    shutil.copy(runs["dev"], dev)
    results = json.loads((run / "results.json").read_text(encoding="utf-8"))
    results["data"]["validation"]["file"] = str(dev)
    (run / "results.json").write_text(json.dumps(results), encoding="utf-8")
    if how == "changed":  # one label flipped: the same name, other contents
        dev.write_text(dev.read_text(encoding="utf-8").replace("긍정", "부정", 1), encoding="utf-8")
    else:
        dev.unlink()
    proc = run_cli_here(["action=eval", f"checkpoint={run}", f"hydra.run.dir={tmp_path / 'eval'}"])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-800:]
    assert f"was scored on {dev}" in errors[0] and "data.validation_file=FILE" in errors[0]
    assert ("has changed since" if how == "changed" else "not there") in errors[0]
    with pytest.raises(RunFailed, match="data.validation_file=FILE"):
        kotune.evaluate(run, run_dir=tmp_path / "api")


def test_a_recorded_value_of_the_wrong_kind_is_one_line(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["root"] / "split", run)
    results = json.loads((run / "results.json").read_text(encoding="utf-8"))
    results["data"]["validation"]["validation_split"] = "0.25; rm -rf /"
    (run / "results.json").write_text(json.dumps(results), encoding="utf-8")
    proc = run_cli_here(["action=eval", f"checkpoint={run}", f"hydra.run.dir={tmp_path / 'eval'}"])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and errors and "data.validation.validation_split" in errors[0], proc.stderr[-800:]


# ---- 4. the export's default folder ----------------------------------------------------------
def test_an_export_without_export_dir_lands_beside_its_checkpoint_and_is_printed(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["root"] / "file", run)
    proc = run_cli_here(["action=export", f"checkpoint={run}", "export.format=onnx",
                         f"hydra.run.dir={tmp_path / 'export-job'}"])
    assert proc.returncode == 0, proc.stderr[-800:]
    assert (run / "onnx" / "model.onnx").is_file() and not (tmp_path / "export-job" / "onnx").exists()
    printed = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("export_dir")]
    assert printed == [["export_dir", str(run / "onnx")]]
    # the next command of docs/distillation.md: the export is a checkpoint
    served = run_cli_here(["action=eval", f"checkpoint={run / 'onnx'}", f"data.validation_file={runs['dev']}",
                           f"hydra.run.dir={tmp_path / 'eval-onnx'}"])
    assert served.returncode == 0, served.stderr[-800:]
    native = run_cli_here(["action=export", f"checkpoint={run / 'model'}", f"hydra.run.dir={tmp_path / 'native-job'}"])
    assert native.returncode == 0 and (run / "hf" / "config.json").is_file(), native.stderr[-800:]
