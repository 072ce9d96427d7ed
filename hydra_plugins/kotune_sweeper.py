"""kotune's Optuna sweeper (``python run.py -m hparams_search=nli ...``): a Hydra Sweeper of its
own on optuna's ask/tell API (optuna 4/5, SQLAlchemy 2; hydra-optuna-sweeper pins optuna<3).

The study lives in a database (SQLite in the sweep directory by default, or
``hparams_search.storage=postgresql+psycopg://…``), and every sweep command on it is a worker that
pulls trials until the study has ``n_trials`` finished ones in total: re-running a command resumes,
several commands (one per GPU, several machines, SLURM array tasks) share the work, and no lock is
needed because the database numbers the trials: after ``ask()``, a trial that finds ``n_trials``
finished trials numbered below its own is surplus, is told failed and ends the worker; while trials
below it are running that would make ``n_trials``, it waits (one may fail or go stale). A running
trial beats a heartbeat; one whose worker was killed is marked failed by the next worker
(``fail_stale_trials``) and replaced. A failed job (kotune.cli.main's worst score, ±1e9) stays in
the study, so the sampler learns to avoid it, but does not count as done.

Also: the search space is Hydra's override grammar (kotune/sweeps/search_space.py), checked against the
composed config before the first trial, minus keys another setting makes no-ops (kotune/sweeps/naming.py);
a study is one search (its space, data files' content and fixed overrides, not n_trials): a command
with another search on its name is refused; the study and its heartbeats are kotune/sweeps/study.py, ``n_jobs``'s
workers kotune/sweeps/workers.py; the direction follows the task; job numbers (and so trial directories) follow the trial numbers;
at the end the best trial's score and config go to ``best_trial.yaml`` in the sweep directory.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from typing import Any

from hydra.core.plugins import Plugins
from hydra.errors import ConfigCompositionException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from kotune.sweeps.search_space import check_search_keys, search_keys, search_space
from kotune.sweeps.study import (Heartbeat, check_same_search, counts_as_done, data_fingerprints, open_study,
                          search_overrides)
from kotune.sweeps.workers import WORKER_ENV, n_workers, run_workers
from kotune.sweeps.naming import drop_shadowed
from kotune.core.redact import mask_override, mask_url

log = logging.getLogger(__name__)
BEST_FILE = "best_trial.yaml"
SURPLUS_ATTR = "kotune_surplus"  # a trial asked after the study already had n_trials live ones


class KotuneOptunaSweeper(Sweeper):
    """See the module docstring; the keys are conf/hydra/sweeper/kotune_optuna.yaml's."""

    def __init__(self, sampler: Any = None, direction: str = "auto", storage: str | None = None,
                 study_name: str | None = None, n_trials: int = 20, n_jobs: int | str = 1,
                 heartbeat_interval: int = 10, grace_period: int = 60, pruner: str = "none",
                 pruner_startup_trials: int = 5, pruner_warmup_evaluations: int = 0, params: Any = None,
                 **_: Any) -> None:
        self.sampler, self.direction, self.storage, self.study_name = sampler, direction, storage, study_name
        self.pruner, self.pruner_startup_trials = str(pruner), pruner_startup_trials
        self.pruner_warmup_evaluations = pruner_warmup_evaluations
        self.n_trials, self.n_jobs = int(n_trials), n_jobs
        self.heartbeat_interval, self.grace_period = int(heartbeat_interval), int(grace_period)
        self.params = params
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function)
        short = OmegaConf.to_container(config.get("hparams_search") or {}, resolve=True)
        given = {o.partition("=")[0].lstrip("+~"): o.partition("=")[2] for o in config.hydra.overrides.hydra}
        for key in ("storage", "study_name", "n_trials", "n_jobs", "pruner"):
            if short.get(key) is not None:  # hparams_search.KEY=… is the short name of hydra.sweeper.KEY
                long = given.get(f"hydra.sweeper.{key}")
                if long is not None and long != str(short[key]):
                    raise ConfigCompositionException(
                        f"{mask_override(f'hparams_search.{key}={short[key]}')} and "
                        f"{mask_override(f'hydra.sweeper.{key}={long}')} are one setting "
                        f"given twice: keep hparams_search.{key}")
                setattr(self, key, short[key])
        self.n_trials, self.pruner = int(self.n_trials), str(self.pruner)

    def sweep(self, arguments: list[str]) -> None:
        from kotune.sweeps import pruning

        cfg = self.config
        check_search_keys(cfg, search_keys(self.params, arguments))
        refused = pruning.problem(self.pruner, cfg, type(self.launcher).__name__)
        if refused:
            raise ConfigCompositionException(refused)
        params, arguments = drop_shadowed(cfg, self.params, arguments)  # e.g. epochs under train.max_steps
        space, fixed = search_space(params, arguments)
        direction = self.direction
        if direction in (None, "auto"):
            direction = "maximize" if cfg.task.get("greater_is_better", True) else "minimize"
        sweep_dir = str(cfg.hydra.sweep.dir)
        os.makedirs(sweep_dir, exist_ok=True)  # SQLite creates the file, not its folder
        study = open_study(self.storage, self.study_name, direction, self.sampler,
                           self.heartbeat_interval, self.grace_period,
                           pruning.make_pruner(self.pruner, self.pruner_startup_trials, self.pruner_warmup_evaluations))
        # one study is one search: the same space, data and fixed overrides (n_trials may grow)
        check_same_search(study, self.storage, space, data_fingerprints(cfg, set(space)),
                          search_overrides(fixed, self.pruner))
        workers = n_workers(self.n_jobs)
        if workers > 1:
            if not self.storage:
                raise ConfigCompositionException("hparams_search.n_jobs>1 needs a storage the workers share")
            run_workers(workers)
        else:
            self.work(study, space, fixed, cfg)
        searched = sorted({k for t in study.get_trials(deepcopy=False) for k in t.params}) if self.storage else None
        best = write_best(sweep_dir, direction == "maximize", searched)
        if best:
            log.info(f"best {best['main_metric']} {best['best_value']:.4g}: {best['run_dir']} "
                     f"(config: {os.path.join(sweep_dir, BEST_FILE)})")
        else:
            log.warning(f"no trial finished ok: no {BEST_FILE} (see the errors in {sweep_dir}/**/results.json)")

    def work(self, study, space: dict[str, Any], fixed: dict[str, str], cfg: DictConfig) -> None:
        """Pull trials until the study has its n_trials (or this worker's budget is spent)."""
        done = sum(counts_as_done(t) for t in study.get_trials(deepcopy=False))
        log.info(f"study '{study.study_name}' ({mask_url(self.storage) if self.storage else 'in memory'}): "
                 f"{done} of {self.n_trials} trials finished")
        # this worker's budget: the trials missing when it starts. A failed job (which counts as not
        # done) is replaced by the next run, not retried here without end (a bad data file fails every trial)
        budget = max(0, self.n_trials - done)
        while budget and self.run_one(study, space, fixed, cfg.hydra.sweeper.sampler):
            budget -= 1

    def still_needed(self, study, trial) -> bool:
        """Does the study need ``trial``? Not when ``n_trials`` trials numbered below it are finished;
        while some of those are still running, wait for them: one may fail, or belong to a killed
        worker (marked failed once its heartbeat is stale), and then this trial replaces it. A
        killed worker's trial is stale within the grace period: running trials still alive after
        it (and a heartbeat or two more) are live ones, and this trial is surplus then too."""
        import optuna
        from optuna.trial import TrialState

        waited = False
        deadline = time.monotonic() + self.grace_period + 2 * self.heartbeat_interval
        while True:
            below = [t for t in study.get_trials(deepcopy=False) if t.number < trial.number]
            running = sum(t.state == TrialState.RUNNING for t in below)
            done = sum(counts_as_done(t) for t in below)
            if done >= self.n_trials:
                return False
            if done + running < self.n_trials:
                return True
            if time.monotonic() > deadline:
                return False
            if not waited:
                log.info(f"trial {trial.number} waits: {running} running trial(s) may complete the study")
                waited = True
            time.sleep(min(self.heartbeat_interval, 5))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)

    def run_one(self, study, space: dict[str, Any], fixed: dict[str, str], sampler_cfg: DictConfig) -> bool:
        """Ask, run and tell one trial; False when the study has its ``n_trials``."""
        import optuna

        with warnings.catch_warnings():  # "experimental" since optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)  # a killed worker's trial: failed, so it is replaced
        trials = study.get_trials(deepcopy=False)
        if sum(counts_as_done(t) for t in trials) >= self.n_trials:
            return False
        with warnings.catch_warnings():  # optuna: "Heartbeat … supposed to be used with Study.optimize"; Heartbeat beats
            warnings.simplefilter("ignore")
            trial = study.ask()
        # beating from the ask on: a worker killed at any point after it leaves a trial that goes stale
        with Heartbeat(study, trial, self.heartbeat_interval):
            return self.run_asked(study, trial, space, fixed, sampler_cfg)

    def run_asked(self, study, trial, space: dict[str, Any], fixed: dict[str, str], sampler_cfg: DictConfig) -> bool:
        """Sample, run and tell an asked trial (or tell it surplus: False)."""
        from optuna.trial import TrialState

        from kotune.sweeps import pruning

        if sampler_cfg.get("seed") is not None and not sampler_cfg.get("_partial_"):
            # a seeded sampler starts its random draws over in every process: seeded by the trial's
            # number too, a resume or a second worker does not repeat earlier trials' parameters. Mixed,
            # not added: with seed + number, seed 2's trial k drew seed 1's trial k + 1
            study.sampler = instantiate(sampler_cfg, seed=trial_seed(int(sampler_cfg.seed), trial.number))
        for key, dist in space.items():
            trial._suggest(key, dist)  # optuna's own path for a distribution object (what suggest_* call)
        if not self.still_needed(study, trial):
            # the trials numbered below this one completed the study: it is surplus (lower numbers win)
            trial.set_user_attr(SURPLUS_ATTR, True)
            study.tell(trial, state=TrialState.FAIL)
            log.info(f"trial {trial.number}: the other trials finish the study's {self.n_trials}; this worker stops")
            return False
        trial.set_user_attr("worker", os.environ.get(WORKER_ENV, "0/1"))  # which process, on which device
        trial.set_user_attr("device", os.environ.get("CUDA_VISIBLE_DEVICES") or "default")
        # hparams_search.* is the sweeper's (a database URL need not survive re-parsing as a job override)
        job_fixed = {k: v for k, v in fixed.items() if not k.startswith("hparams_search.")}
        overrides = tuple(f"{k}={v}" for k, v in {**trial.params, **job_fixed}.items())
        prune = pruning.reporting_to(trial) if self.pruner != "none" else contextlib.nullcontext()
        try:
            with prune as link:
                ret = self.launcher.launch([overrides], initial_job_idx=trial.number)[0]
        except BaseException:
            # Ctrl-C or a crash of the sweep itself: the trial is over, so the study must not wait for it
            study.tell(trial, state=TrialState.FAIL)
            raise
        try:
            value = float(ret.return_value)
        except (TypeError, ValueError):
            log.warning(f"trial {trial.number}: the job returned {ret.return_value!r}, not a score: marked failed")
            study.tell(trial, state=TrialState.FAIL)
            return True
        pruned = link is not None and link.pruned_at is not None
        try:
            if pruned:  # optuna keeps its last reported value as the trial's value
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, value)
        except ValueError:  # another worker found its heartbeat stale and failed it: it was replaced
            log.warning(f"trial {trial.number} was marked failed while it ran (a heartbeat too late: raise "
                        "hydra.sweeper.grace_period); its result stays in its directory")
        return True


def trial_seed(seed: int, number: int) -> int:
    """The sampler's seed for trial ``number`` of a study seeded ``seed`` (independent streams)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def write_best(sweep_dir: str, greater_is_better: bool = True, searched: list[str] | None = None) -> dict | None:
    """Write ``best_trial.yaml`` (score, searched values, overrides, full config) for the best ok
    run under ``sweep_dir``; read from the runs' results.json, so it covers resumed studies.
    ``searched``: the search space's keys (default: the settings that differ between runs)."""
    from kotune.reporting import collect_runs, varying_keys

    runs = [r for r in collect_runs([sweep_dir], quiet=True) if r["status"] == "ok" and r["main_score"] is not None]
    if not runs:
        return None
    pick = max if greater_is_better else min
    best = pick(runs, key=lambda r: r["main_score"])
    searched = varying_keys(runs) if searched is None else searched
    overrides_file = os.path.join(best["run_dir"], ".hydra", "overrides.yaml")
    out = {
        "main_metric": best["main_metric"], "best_value": float(best["main_score"]),
        "direction": "maximize" if greater_is_better else "minimize",
        "run_dir": best["run_dir"], "n_ok_runs": len(runs),
        "params": {k: best["flat_config"].get(k) for k in searched},
        "overrides": list(OmegaConf.load(overrides_file)) if os.path.exists(overrides_file) else None,
        "config": best.get("config") or {},
    }
    OmegaConf.save(OmegaConf.create(out), os.path.join(sweep_dir, BEST_FILE))
    return out
