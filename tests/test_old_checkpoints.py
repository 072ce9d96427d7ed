"""Checkpoints written before heads took options still load and predict as they did: the kinds of kotune
< 0.2 (``pair``, ``token_char_crf``, ``span_char``) are today's heads with options (each head's
``aliases``). The fixtures (tests/fixtures/old_checkpoints/<kind>/) are tiny models (hidden size 16,
one layer) saved by the code before the change (commit 321444e) with the sample data, with that run's
metrics and predictions.jsonl; evaluating them now must give both exactly."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "old_checkpoints"
# old kind → (today's head, its options)
KINDS = {"pair": ("sequence", {}), "token_char_crf": ("token", {"crf": True, "units": "char"}),
         "span_char": ("span", {"units": "char"})}


def predictions(path: Path) -> list[dict]:
    return [{k: row[k] for k in ("id", "prediction")} for row in map(json.loads, path.read_text(encoding="utf-8").splitlines())]


@pytest.mark.parametrize("old", sorted(KINDS))
def test_an_old_checkpoint_loads_as_the_head_with_options(old):
    from heads.model.kotune_model import KotuneModel

    spec = json.loads((FIXTURES / old / "model" / "kotune.json").read_text(encoding="utf-8"))
    assert spec["head"] == old  # written by the old code
    model = KotuneModel.load(str(FIXTURES / old / "model"))
    head, options = KINDS[old]
    assert model.head_kind == head and model.head.options() == options


@pytest.mark.parametrize("old", sorted(KINDS))
def test_an_old_checkpoint_evaluates_to_its_recorded_metrics_and_predictions(old, run_job, tmp_path):
    expected = json.loads((FIXTURES / old / "expected.json").read_text(encoding="utf-8"))
    run = tmp_path / "checkpoint"
    shutil.copytree(FIXTURES / old, run)  # eval settles and verifies files in place: leave the fixture untouched
    res = run_job(["action=eval", f"checkpoint={run}", "data=sample"], "eval")
    assert res["status"] == "ok", res.get("error")
    assert res["task"] == expected["task"] and res["metrics"] == pytest.approx(expected["metrics"], abs=1e-9)
    assert predictions(Path(res["predictions_file"])) == predictions(FIXTURES / old / "predictions.jsonl")
