"""Multiruns and Optuna searches: one directory per job, failure isolation, resume, best trial.

Most tests run Hydra's multirun in-process with the train action replaced by a stub (a score from
the config, or an error for chosen jobs): they exercise the real sweep machinery — config, sweep
directory, results.json, skip-on-resume, the Optuna study — in seconds. One test trains for real
through the CLI on the sample data.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, run_cli

SEARCHES = sorted(p.stem for p in (ROOT / "conf" / "hparams_search").glob("*.yaml") if not p.stem.startswith("_"))


def multirun(monkeypatch, args: list[str]) -> None:
    """``python run.py -m ARGS`` in this process (run.main, as the CLI calls it)."""
    from hydra.core.global_hydra import GlobalHydra

    from kotune.cli.main import main

    from kotune.sweeps.naming import SWEPT_ENV

    monkeypatch.delenv(SWEPT_ENV, raising=False)  # the job directories' names then come from this argv
    # imported (not run as a script), Hydra would look for conf/ as a Python package
    monkeypatch.setattr(sys, "argv", ["run.py", "-m", f"--config-path={ROOT / 'conf'}", *args])
    GlobalHydra.instance().clear()
    try:
        main()
    finally:
        GlobalHydra.instance().clear()


def stub_train(monkeypatch, score, fail=lambda cfg: None) -> list[dict]:
    """Replace action=train: ``score(cfg)`` is the main metric; ``fail(cfg)`` may raise."""
    from kotune.actions import ACTIONS

    calls: list[dict] = []

    def train(cfg, run_dir):
        calls.append(OmegaConf.to_container(cfg, resolve=True))
        fail(cfg)
        return {"metrics": {cfg.task.main_metric: float(score(cfg))}}

    monkeypatch.setitem(ACTIONS, "train", train)
    return calls


def results_under(folder: Path) -> dict[str, dict]:
    return {str(p.relative_to(folder).parent): json.loads(p.read_text()) for p in folder.rglob("results.json")}


# ---- matrices ------------------------------------------------------------------------------
def test_sweep_dir_is_named_after_the_command():
    from kotune.cli.main import sweep_id

    args = ["task=nli,sts", "model=tiny", "train.seed=1,2"]
    assert sweep_id(args) == sweep_id(args + ["hydra.sweep.subdir=x", "hydra/launcher=slurm", "-m"])
    assert sweep_id(args) != sweep_id(args + ["train.max_steps=5"])
    assert sweep_id(args) != sweep_id(list(reversed(args)))  # job numbers follow the order
    assert sweep_id(args).startswith("sweep-")


def test_matrix_isolates_failures_and_resumes(monkeypatch, tmp_path):
    """2 tasks × 2 modes × 2 seeds: 8 directories; a job raising a plain exception (not a
    KotuneError) fails alone; the same command again reruns only that job."""
    from kotune.cli.main import sweep_id

    monkeypatch.chdir(tmp_path)
    args = ["task=nli,sts", "model=tiny", "mode=finetune,frozen", "train.seed=1,2", "data=sample",
            f"cache_dir={tmp_path / 'cache'}"]
    monkeypatch.setenv("KOTUNE_SWEEP_ID", sweep_id(args))  # what `python run.py` sets

    def boom(cfg):
        if (cfg.task.name, cfg.mode.name, cfg.train.seed) == ("sts", "frozen", 2):
            raise RuntimeError("simulated crash")

    calls = stub_train(monkeypatch, lambda cfg: 10 * cfg.train.seed, boom)
    multirun(monkeypatch, args)
    sweep = tmp_path / "multirun" / sweep_id(args)
    first = results_under(sweep)
    assert len(first) == 8 == len(calls)
    assert set(first) == {f"{t}/tiny/{m}/seed={s}" for t in ("nli", "sts") for m in ("finetune", "frozen") for s in (1, 2)}
    failed = {k: r for k, r in first.items() if r["status"] == "failed"}
    assert list(failed) == ["sts/tiny/frozen/seed=2"]
    assert failed["sts/tiny/frozen/seed=2"]["error_type"] == "RuntimeError"
    assert all(r["status"] == "ok" and r["main_score"] == 10 * r["seed"] for k, r in first.items() if k not in failed)

    calls.clear()
    stub_train(monkeypatch, lambda cfg: 10 * cfg.train.seed)  # the cause is fixed
    stamps = {p: p.stat().st_mtime_ns for p in sweep.rglob("results.json")}
    multirun(monkeypatch, args)
    rerun = [p for p in sweep.rglob("results.json") if p.stat().st_mtime_ns != stamps[p]]
    assert [str(p.relative_to(sweep).parent) for p in rerun] == ["sts/tiny/frozen/seed=2"]
    assert all(r["status"] == "ok" for r in results_under(sweep).values())


def test_job_directories_name_the_swept_values_and_a_rerun_resumes(monkeypatch, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["model=tiny", "train.learning_rate=1e-3,1e-4", "train.seed=1,2", "train.max_steps=5",
            f"hydra.sweep.dir={sweep}"]
    calls = stub_train(monkeypatch, lambda cfg: cfg.train.seed)
    multirun(monkeypatch, args)
    assert sorted(results_under(sweep)) == [f"nli/tiny/finetune/lr={lr},seed={s}" for lr in ("0.0001", "0.001")
                                            for s in (1, 2)]
    calls.clear()
    multirun(monkeypatch, args)
    assert calls == []  # every job found its finished results under the same name


def test_resume_trusts_only_complete_ok_results_of_the_same_config(tmp_path):
    from conftest import compose
    from kotune.cli.job import config_hash, finished_results

    cfg = compose(["task=nli", "model=tiny"])
    path = tmp_path / "results.json"
    assert finished_results(str(path), cfg) is None  # nothing yet
    for body, expect in [({"status": "ok", "config_hash": config_hash(cfg)}, True),
                         ({"status": "failed", "config_hash": config_hash(cfg)}, False),
                         ({"status": "ok", "config_hash": "another-config"}, False),
                         ({"status": "ok"}, False)]:
        path.write_text(json.dumps(body))
        assert (finished_results(str(path), cfg) is not None) is expect, body
    path.write_text('{"status": "ok", "config_ha')  # cut off mid-write
    assert finished_results(str(path), cfg) is None


def test_real_matrix_on_sample_data(tmp_path):
    """Real training through the CLI: a bad data file fails its job only, with the file named;
    the report counts it apart; the rerun skips the finished job."""
    samples = ROOT / "tasks" / "samples"
    (tmp_path / "nli.json").write_text((samples / "nli" / "train.json").read_text())
    bad = tmp_path / "sts.json"
    bad.write_text((samples / "sts" / "train.json").read_text()[:1500])  # cut off: malformed JSON
    args = ["-m", "task=nli,sts", "model=tiny", "data=sample", f"data.train_file={tmp_path}/${{task.name}}.json",
            "train.max_steps=2", "train.batch_size=8", "save_model=false", f"cache_dir={tmp_path / 'cache'}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = run_cli(args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = results_under(tmp_path / "sweep")
    assert sorted(res) == ["nli/tiny/finetune/seed=42", "sts/tiny/finetune/seed=42"]
    assert res["nli/tiny/finetune/seed=42"]["status"] == "ok"
    assert res["sts/tiny/finetune/seed=42"]["status"] == "failed"
    assert str(bad) in res["sts/tiny/finetune/seed=42"]["error"]

    again = run_cli(args)
    assert again.returncode == 0
    assert again.stdout.count("resume:") == 1 and "nli/tiny/finetune/seed=42/results.json is complete" in again.stdout

    import report

    assert report.main([str(tmp_path / "sweep")]) == 0
    md = (tmp_path / "sweep" / "leaderboard.md").read_text()
    assert "2 runs under" in md and "1 ok, 1 failed" in md and "| 1 sts |" in md


# ---- Optuna --------------------------------------------------------------------------------
def lr_score(cfg) -> float:
    """A smooth objective peaking at learning rate 3e-5."""
    return 80 - 10 * abs(math.log10(float(cfg.train.learning_rate)) - math.log10(3e-5))


def study_trials(sweep: Path, name: str = "nli-tiny-finetune"):
    import optuna

    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep}/optuna.db").trials


def test_optuna_study_resumes_after_an_interruption(monkeypatch, tmp_path):
    from optuna.trial import TrialState

    sweep = tmp_path / "study"
    args = ["hparams_search=nli", "model=tiny", "data=sample", "hydra.sweeper.n_trials=5",
            f"hydra.sweep.dir={sweep}"]

    def interrupt_third(cfg):
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the third trial

    calls = stub_train(monkeypatch, lr_score, interrupt_third)
    with pytest.raises(KeyboardInterrupt):
        multirun(monkeypatch, args)
    # the sweeper tells the interrupted trial failed on its way out (a SIGKILLed one: its heartbeat stops)
    assert [t.state for t in study_trials(sweep)] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL]
    finished = {p: p.stat().st_mtime_ns for p in sweep.rglob("results.json")}
    assert len(finished) == 2

    calls = stub_train(monkeypatch, lr_score)
    multirun(monkeypatch, args)
    trials = study_trials(sweep)
    states = [t.state for t in trials]
    assert states == [TrialState.COMPLETE] * 2 + [TrialState.FAIL] + [TrialState.COMPLETE] * 3
    assert len(calls) == 3  # only the missing trials ran
    assert all(p.stat().st_mtime_ns == m for p, m in finished.items())  # finished ones untouched
    params = [tuple(sorted(t.params.items())) for t in trials]
    assert len(set(params)) == len(params)  # no trial repeats an earlier one
    names = sorted(p.parent.name for p in sweep.rglob("results.json"))
    assert [int(n.split("_")[0]) for n in names] == [0, 1, 3, 4, 5]  # trial numbers continue after the resume
    assert all(n.split("_", 1)[1].startswith("lr=") for n in names)  # then the sampled values

    best = OmegaConf.to_container(OmegaConf.load(sweep / "best_trial.yaml"))
    scores = {r["run_dir"]: r["main_score"] for r in results_under(sweep).values()}
    assert best["best_value"] == max(scores.values()) == max(t.value for t in trials if t.value is not None)
    assert scores[best["run_dir"]] == best["best_value"]
    assert best["config"]["train"]["learning_rate"] == best["params"]["train.learning_rate"]
    assert set(best["params"]) == {"train.learning_rate", "train.batch_size", "train.warmup_ratio",
                                   "train.epochs", "train.head_dropout"}

    calls.clear()
    multirun(monkeypatch, args)  # complete: nothing runs, the best file is still there
    assert calls == [] and (sweep / "best_trial.yaml").exists()


def test_optuna_direction_follows_the_task(monkeypatch, tmp_path):
    sweep = tmp_path / "study"
    stub_train(monkeypatch, lr_score)
    multirun(monkeypatch, ["hparams_search=nli", "model=tiny", "+task.greater_is_better=false",
                           "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep}"])
    best = OmegaConf.load(sweep / "best_trial.yaml")
    assert best.direction == "minimize"
    assert best.best_value == min(t.value for t in study_trials(sweep))


def test_optuna_failed_trials_do_not_stop_the_study_and_are_replaced_on_resume(monkeypatch, tmp_path):
    sweep = tmp_path / "study"
    args = ["hparams_search=nli", "model=tiny", "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep}"]

    def oom_first(cfg):
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (simulated)")

    calls = stub_train(monkeypatch, lr_score, oom_first)
    multirun(monkeypatch, args)
    assert len(calls) == 3 and sum(r["status"] == "failed" for r in results_under(sweep).values()) == 1
    calls = stub_train(monkeypatch, lr_score)
    multirun(monkeypatch, args)
    assert len(calls) == 1  # the failed trial is replaced by a new one


def search_space(overrides: list[str]) -> dict:
    """hydra.sweeper.params of a composed search, resolved."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides, return_hydra_config=True)
    return {k: str(v) for k, v in cfg.hydra.sweeper.params.items()}


def test_the_learning_rate_range_follows_the_models_default():
    """0.2x-2x of train.learning_rate's default: a random/tiny encoder (5e-4) is searched around its own
    rate, not in a pretrained model's 1e-5…1e-4, which leaves it at the majority class."""
    assert search_space(["hparams_search=text_cls", "model=tiny"])["train.learning_rate"] == \
        "tag(log, interval(0.0001, 0.001))"
    assert search_space(["hparams_search=text_cls", "model=klue"])["train.learning_rate"] == \
        "tag(log, interval(1e-05, 0.0001))"
    assert search_space(["hparams_search=token_cls_frozen", "model=klue"])["train.learning_rate"] == \
        "tag(log, interval(0.0001, 0.01))"


def test_a_searched_key_another_setting_overrides_leaves_the_search_with_a_warning(monkeypatch, tmp_path, capsys):
    sweep = tmp_path / "study"
    stub_train(monkeypatch, lr_score)
    multirun(monkeypatch, ["hparams_search=text_cls", "model=tiny", "train.max_steps=5", "hydra.sweeper.n_trials=2",
                           f"hydra.sweep.dir={sweep}"])
    assert "warning: search space: train.epochs is not searched: train.max_steps=5 overrides it" in capsys.readouterr().out
    assert all("train.epochs" not in t.params and "train.learning_rate" in t.params
               for t in study_trials(sweep, "text_cls-tiny-finetune"))


def test_a_range_given_as_a_sweeper_param_is_read_as_the_keys_range(monkeypatch, tmp_path):
    """``hydra.sweeper.params.KEY=RANGE`` (Hydra: "Sweeping over Hydra's configuration is not
    supported") means ``KEY=RANGE``, which replaces the preset's range."""
    from kotune.cli.overrides import job_overrides

    given = ["hydra.sweeper.params.train.learning_rate='tag(log, interval(3e-4,3e-3))'"]
    assert job_overrides(given) == ["train.learning_rate=tag(log, interval(3e-4,3e-3))"]
    sweep = tmp_path / "study"
    stub_train(monkeypatch, lr_score)
    multirun(monkeypatch, ["hparams_search=text_cls", "model=tiny", "hydra.sweeper.n_trials=3",
                           f"hydra.sweep.dir={sweep}", *job_overrides(given)])
    rates = [t.params["train.learning_rate"] for t in study_trials(sweep, "text_cls-tiny-finetune")]
    assert len(rates) == 3 and all(3e-4 <= r <= 3e-3 for r in rates)


def test_unknown_search_key_fails_before_any_trial(tmp_path):
    proc = run_cli(["-m", "hparams_search=nli", "model=tiny", "train.learnig_rate=interval(1e-5,1e-4)",
                    f"hydra.sweep.dir={tmp_path / 's'}"])
    assert proc.returncode == 2  # kotune's own line, before Hydra (kotune/cli/overrides.py)
    assert proc.stderr == "error: train.learnig_rate is not a config key (did you mean train.learning_rate?)\n"
    assert not list(tmp_path.rglob("results.json"))


@pytest.mark.parametrize("name", SEARCHES)
def test_every_search_space_composes(name):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra_plugins.kotune_sweeper import check_search_keys

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", [f"hparams_search={name}", "model=tiny"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    check_search_keys(cfg, list(sweeper.params))  # raises on a key the config lacks
    if name == "distill":  # a search over distillations: its task comes from the teacher (distill.teacher=RUN)
        assert cfg.action == "distill" and "distill.student_layers" in sweeper.params
    else:
        assert cfg.task.name == name.removesuffix("_frozen")
    assert cfg.mode.name == ("frozen" if name.endswith("_frozen") else "finetune")
    assert {"train.learning_rate", "train.batch_size", "train.warmup_ratio", "train.epochs",
            "train.head_dropout"} <= set(sweeper.params)
    assert ("mode.layers" in sweeper.params) == name.endswith("_frozen")
    assert sweeper.direction == "auto" and sweeper.storage.startswith("sqlite:///")


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    proc = run_cli(["hydra/launcher=slurm", "hparams_search=ynat", "model=klue", "--cfg", "hydra"])
    assert proc.returncode == 0, proc.stderr
    launcher = OmegaConf.create(proc.stdout).hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.gpus_per_node == 1 and launcher.tasks_per_node == 1
    job = run_cli(["hydra/launcher=slurm", "task=nli", "model=klue", "--cfg", "job"])
    assert job.returncode == 0 and OmegaConf.create(job.stdout).task.name == "nli"


def test_two_sampler_seeds_draw_different_trials(monkeypatch, tmp_path):
    """The sampler is re-seeded per trial from (seed, trial number): seed + number made seed 2's
    trial k seed 1's trial k + 1 (two "independent" searches shared all but one configuration)."""
    drawn = {}
    for seed in (1, 2):
        stub_train(monkeypatch, lr_score)
        multirun(monkeypatch, ["hparams_search=nli", "model=tiny", "hydra.sweeper.n_trials=4",
                               f"hydra.sweeper.sampler.seed={seed}", f"hydra.sweep.dir={tmp_path / str(seed)}"])
        drawn[seed] = [tuple(sorted(t.params.items())) for t in study_trials(tmp_path / str(seed))]
    assert not set(drawn[1]) & set(drawn[2])


# ---- one study, one search -----------------------------------------------------------------
DEMO_SEARCH = ["hparams_search=text_cls", "model=tiny", "data=demo", "train.max_steps=2"]


def demo_train_file() -> Path:
    import kotune_data

    return Path(kotune_data.data_path("demo/train.tsv"))


def test_n_trials_and_n_jobs_are_not_part_of_the_sweep_directory():
    """Both spellings of n_trials, and any n_jobs, name the same directory: raising n_trials
    continues the search where it is (hparams_search.n_trials made a new directory, and so a new study)."""
    from kotune.cli.main import sweep_id

    ids = {sweep_id(DEMO_SEARCH + extra) for extra in
           ([], ["hparams_search.n_trials=4"], ["hparams_search.n_trials=6"], ["hydra.sweeper.n_trials=6"],
            ["hparams_search.n_trials=6", "hparams_search.n_jobs=auto"])}
    assert len(ids) == 1
    assert sweep_id(DEMO_SEARCH) != sweep_id(DEMO_SEARCH + ["train.max_steps=3"])  # another search


@pytest.mark.parametrize("spelling", ["hparams_search.n_trials", "hydra.sweeper.n_trials"])
def test_the_same_search_with_more_trials_extends_its_study_and_directory(monkeypatch, tmp_path, capsys, spelling):
    from optuna.trial import TrialState

    from kotune.cli.main import sweep_id

    monkeypatch.chdir(tmp_path)
    calls = stub_train(monkeypatch, lr_score)
    for n in (2, 3):
        args = [*DEMO_SEARCH, f"{spelling}={n}"]
        monkeypatch.setenv("KOTUNE_SWEEP_ID", sweep_id(args))  # what `python run.py` sets
        multirun(monkeypatch, args)
    assert "study 'text_cls-tiny-finetune' (sqlite:///multirun/sweep-" in capsys.readouterr().out
    sweeps = list((tmp_path / "multirun").iterdir())
    assert len(sweeps) == 1  # one directory, one study in it
    trials = study_trials(sweeps[0], "text_cls-tiny-finetune")
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3 and len(calls) == 3
    best = OmegaConf.load(sweeps[0] / "best_trial.yaml")
    assert best.n_ok_runs == 3 and best.best_value == max(t.value for t in trials)


def test_n_trials_given_twice_with_two_values_is_refused(monkeypatch, tmp_path, capsys):
    calls = stub_train(monkeypatch, lr_score)
    with pytest.raises(SystemExit):
        multirun(monkeypatch, [*DEMO_SEARCH, "hparams_search.n_trials=6", "hydra.sweeper.n_trials=4",
                               f"hydra.sweep.dir={tmp_path / 's'}"])
    assert ("hparams_search.n_trials=6 and hydra.sweeper.n_trials=4 are one setting given twice: "
            "keep hparams_search.n_trials") in capsys.readouterr().err
    assert calls == []


def shared_study(tmp_path) -> list[str]:
    """A study named on the command line, in a database outside the sweep directories."""
    return [f"hparams_search.storage=sqlite:///{tmp_path / 'shared.db'}", "hparams_search.study_name=demo"]


def test_a_search_on_other_data_does_not_join_the_study(monkeypatch, tmp_path, capsys):
    """Another train file under the same study name is refused in one line naming both files;
    the same file's content at another path (another machine's copy) is the same search."""
    import optuna

    demo = demo_train_file()
    other = tmp_path / "other.tsv"
    other.write_text("\n".join(demo.read_text(encoding="utf-8").splitlines()[:200]) + "\n", encoding="utf-8")
    copy = tmp_path / "copy.tsv"
    copy.write_bytes(demo.read_bytes())
    calls = stub_train(monkeypatch, lr_score)
    multirun(monkeypatch, [*DEMO_SEARCH, *shared_study(tmp_path), "hparams_search.n_trials=2",
                           f"hydra.sweep.dir={tmp_path / 'a'}"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        multirun(monkeypatch, [*DEMO_SEARCH, *shared_study(tmp_path), "hparams_search.n_trials=3",
                               f"data.train_file={other}", f"hydra.sweep.dir={tmp_path / 'b'}"])
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "study 'demo'" in x)
    assert f"study 'demo' in sqlite:///{tmp_path / 'shared.db'} was made for data.train_file={demo} (sha256 " in line
    assert f"this search reads {other} (sha256 " in line
    assert "hparams_search.study_name" in line
    assert len(calls) == 2
    multirun(monkeypatch, [*DEMO_SEARCH, *shared_study(tmp_path), "hparams_search.n_trials=3",
                           f"data.train_file={copy}", f"hydra.sweep.dir={tmp_path / 'c'}"])
    assert len(calls) == 3
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{tmp_path / 'shared.db'}")
    assert len(study.trials) == 3


def test_a_search_with_other_fixed_overrides_does_not_join_the_study(monkeypatch, tmp_path, capsys):
    calls = stub_train(monkeypatch, lr_score)
    multirun(monkeypatch, [*DEMO_SEARCH, *shared_study(tmp_path), "hparams_search.n_trials=1",
                           f"hydra.sweep.dir={tmp_path / 'a'}"])
    with pytest.raises(SystemExit):
        multirun(monkeypatch, [*DEMO_SEARCH, *shared_study(tmp_path), "hparams_search.n_trials=2",
                               "train.max_steps=3", "data.max_train_samples=100", f"hydra.sweep.dir={tmp_path / 'b'}"])
    line = next(x for x in capsys.readouterr().err.splitlines() if "study 'demo'" in x)
    assert "was made for data.max_train_samples=(not set), this search has 100; for train.max_steps=2, " \
           "this search has 3:" in line
    assert len(calls) == 1
