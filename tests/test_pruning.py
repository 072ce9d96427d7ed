"""Pruning (``hparams_search.pruner=median``): a training job reports its main metric at every
evaluation to the trial it runs for and stops when the study's pruner says so; the sweeper tells
optuna the trial was pruned, counts it as done, and never picks it as the best."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from test_sweep import multirun, results_under, stub_train, study_trials

TRAIN = ["task=sts", "model=tiny", "data=sample", "train.select_best=true", "train.evals_per_epoch=4",
         "train.epochs=2", "train.batch_size=8", "train.learning_rate=1e-3"]


def job_reporting_to(run_job, pruner, overrides=()):
    """One real training job with a trial of a fresh in-memory study (``pruner``) handed over."""
    import optuna

    from kotune.sweeps import pruning

    study = optuna.create_study(direction="maximize", pruner=pruner)
    trial = study.ask()
    with pruning.reporting_to(trial) as link:
        results = run_job(TRAIN + list(overrides))
    return results, study._storage.get_trial(trial._trial_id), link


def test_a_pruned_job_stops_at_that_evaluation_and_says_so(run_job, tmp_path):
    import optuna

    results, trial, link = job_reporting_to(run_job, optuna.pruners.ThresholdPruner(lower=1000.0))  # accuracy (×100) < 1000: prune
    assert results["status"] == "pruned"
    pruned = results["pruned"]
    assert pruned["evaluation"] == 1 and link.pruned_at["evaluation"] == 1
    assert 0 < pruned["step"] < pruned["max_steps"]  # training stopped at the first evaluation's step
    assert list(trial.intermediate_values) == [1] and pruned["reported"] == [trial.intermediate_values[1]]
    assert not (tmp_path / "job" / "model").exists()  # a pruned trial saves no model
    # its best checkpoint so far still scores the validation split (a finite number, not None or NaN)
    assert isinstance(results["main_score"], float) and math.isfinite(results["main_score"])
    assert json.loads((tmp_path / "job" / "results.json").read_text())["status"] == "pruned"


def test_an_unpruned_job_reports_every_evaluation_and_trains_to_the_end(run_job, tmp_path):
    import optuna

    results, trial, link = job_reporting_to(run_job, optuna.pruners.ThresholdPruner(lower=-1e9))  # never prunes
    assert results["status"] == "ok" and results["pruned"] is None and link.pruned_at is None
    evaluations = [h for h in json.loads((tmp_path / "job" / "checkpoints").joinpath(
        sorted(p.name for p in (tmp_path / "job" / "checkpoints").iterdir())[-1], "trainer_state.json").read_text()
    )["log_history"] if "eval_pearson" in h]
    assert len(evaluations) >= 8  # two epochs, four evaluations each
    assert list(trial.intermediate_values) == list(range(1, len(evaluations) + 1))
    assert [trial.intermediate_values[k + 1] for k in range(len(evaluations))] == \
        [h["eval_pearson"] for h in evaluations]
    assert (tmp_path / "job" / "model").exists()


def test_without_a_trial_no_job_reports(run_job):
    results = run_job(TRAIN)
    assert results["status"] == "ok" and results["pruned"] is None


def test_a_pruning_sweep_tells_optuna_and_picks_its_best_from_finished_trials(monkeypatch, tmp_path):
    from optuna.trial import TrialState

    sweep = tmp_path / "study"
    monkeypatch.setenv("KOTUNE_PROGRESS", "0")
    # two learning rates whose first evaluations differ (on the sample data: 14.2 for 1e-9, -3.4 for
    # 3e-3): once a trial has finished, one at the rate that starts worse is pruned there
    multirun(monkeypatch, TRAIN[1:] + ["hparams_search=sts", "hparams_search.pruner=median",
                                       "hydra.sweeper.pruner_startup_trials=1", "hydra.sweeper.n_trials=5",
                                       "train.learning_rate=choice(3e-3, 1e-9)", "train.batch_size=8",
                                       "train.warmup_ratio=0", "train.head_dropout=0", "train.epochs=2",
                                       f"hydra.sweep.dir={sweep}", f"cache_dir={tmp_path / 'cache'}"])
    trials = study_trials(sweep, "sts-tiny-finetune")
    states = [t.state for t in trials]
    assert states.count(TrialState.PRUNED) >= 1 and states.count(TrialState.COMPLETE) >= 1, states
    assert len(trials) == 5  # pruned trials count towards n_trials
    runs = results_under(sweep)
    by_number = {int(Path(k).name.split("_")[0]): r for k, r in runs.items()}
    for t in trials:
        r = by_number[t.number]
        assert r["status"] == ("pruned" if t.state == TrialState.PRUNED else "ok")
        if t.state == TrialState.PRUNED:
            # optuna keeps the last reported value; the job stopped at that evaluation
            assert t.value == r["pruned"]["reported"][-1] == t.intermediate_values[max(t.intermediate_values)]
            assert r["pruned"]["step"] < r["pruned"]["max_steps"]
    best = OmegaConf.load(sweep / "best_trial.yaml")
    finished = [r for r in runs.values() if r["status"] == "ok"]
    assert best.best_value == max(r["main_score"] for r in finished)
    assert best.n_ok_runs == len({r["config_hash"] for r in finished})  # a repeated config counts once

    from report import main as report_main

    assert report_main([str(sweep)]) == 0
    md = (sweep / "leaderboard.md").read_text()
    distinct = {r["config_hash"]: r["status"] for r in runs.values()}
    n_ok, n_pruned = sum(s == "ok" for s in distinct.values()), sum(s == "pruned" for s in distinct.values())
    assert n_pruned and f"{n_ok} ok, {n_pruned} pruned (sweep trials stopped early, not in the cells), 0 failed" in md
    assert list(sweep.glob("sweep_sts_tiny_finetune.png"))


@pytest.mark.parametrize("extra, message", [
    (["hparams_search.pruner=median"],
     "hparams_search.pruner=median needs evaluations during training: train.select_best=true"),
    (["hparams_search.pruner=median", "train.select_best=true", "action=eval"],
     "hparams_search.pruner=median: action=eval has no evaluations during training"),
    (["hparams_search.pruner=mean"], "hparams_search.pruner must be one of none, median, got 'mean'"),
])
def test_pruning_that_cannot_work_is_refused_in_one_line_before_any_trial(monkeypatch, tmp_path, capsys,
                                                                          extra, message):
    calls = stub_train(monkeypatch, lambda cfg: 1.0)
    with pytest.raises(SystemExit):
        multirun(monkeypatch, ["hparams_search=nli", "model=tiny", *extra, f"hydra.sweep.dir={tmp_path / 's'}"])
    assert message in capsys.readouterr().err
    assert calls == [] and not list(tmp_path.rglob("results.json"))


def test_pruning_under_a_launcher_that_runs_jobs_elsewhere_is_refused():
    """The trial is handed to the job in the sweeper's process: a job on a SLURM node could not report."""
    from conftest import compose
    from kotune.sweeps import pruning

    cfg = compose(["train.select_best=true"])
    assert pruning.problem("median", cfg, "BasicLauncher") is None
    assert pruning.problem("none", cfg, "SlurmLauncher") is None
    assert pruning.problem("median", cfg, "SlurmLauncher").startswith(
        "hparams_search.pruner=median needs the trials' jobs in the sweeper's process (Hydra's basic launcher), "
        "not SlurmLauncher")
