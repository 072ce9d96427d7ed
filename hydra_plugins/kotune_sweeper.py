"""Optuna searches that survive interruptions (``python run.py -m hparams_search=nli ...``).

hydra-optuna-sweeper keeps the study in SQLite under the sweep directory (conf/hparams_search/);
this subclass makes re-running the same command a resume: ``n_trials`` counts the study's finished
trials too, trials left running by a killed sweep are marked failed, job numbers (and so trial
directories) continue after the earlier ones, the direction follows the task, and every searched
key is checked against the composed config before the first trial (and one that another setting
makes a no-op leaves the search, kotune/sweeps.py). At the end the best trial's
score and full config go to ``best_trial.yaml`` in the sweep directory.
"""
from __future__ import annotations

import difflib
import logging
import os
from typing import Any

from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
from omegaconf import DictConfig, OmegaConf

from kotune.overrides import flat_keys
from kotune.sweeps import drop_shadowed

log = logging.getLogger(__name__)
BEST_FILE = "best_trial.yaml"


def search_keys(params: DictConfig | None, arguments: list[str]) -> list[str]:
    """Config keys of ``hydra.sweeper.params`` and of the command line's overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = [str(k) for k in (params or {})]
    parsed = OverridesParser.create().parse_overrides(arguments)
    return keys + [o.key_or_group for o in parsed if not o.is_add() and not o.is_delete()]


def check_search_keys(config: DictConfig, keys: list[str]) -> None:
    """A searched key the config does not have would fail one trial at a time, after the study
    already recorded it: refuse it before the first trial, naming the closest existing key."""
    known = set(flat_keys(OmegaConf.to_container(config, resolve=False))) | set(config.hydra.runtime.choices)
    for key in keys:
        if key in known:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigCompositionException(
            f"search space: '{key}' is not a key of the composed config{hint}; fix "
            "hydra.sweeper.params in conf/hparams_search/ or the command line")


class ResumableOptunaSweeper(OptunaSweeper):
    """hydra-optuna-sweeper with resume semantics (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.total_trials = int(kwargs["n_trials"])

    def sweep(self, arguments: list[str]) -> None:
        import optuna
        from optuna.trial import TrialState

        impl = self.sweeper
        cfg = impl.config
        check_search_keys(cfg, search_keys(impl.params, arguments))
        impl.params, arguments = drop_shadowed(cfg, impl.params, arguments)  # e.g. epochs under train.max_steps
        if impl.direction in (None, "auto"):
            impl.direction = "maximize" if cfg.task.get("greater_is_better", True) else "minimize"
        maximize = getattr(impl.direction, "name", impl.direction) == "maximize"
        sweep_dir = str(cfg.hydra.sweep.dir)
        os.makedirs(sweep_dir, exist_ok=True)  # SQLite creates the file, not its folder
        study = optuna.create_study(study_name=impl.study_name, storage=impl.storage,
                                    directions=[impl.direction], load_if_exists=True)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            # one sweeper per study: a trial still running now was cut off by an interruption
            study.tell(trial.number, state=TrialState.FAIL)
            log.info(f"trial {trial.number} was interrupted: marked failed, it will be replaced")
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        # a failed job reports kotune.cli.worst_score (±1e9): it stays in the study (the sampler learns
        # to avoid it) but does not count as done, so a resume replaces it like a matrix reruns it
        done = sum(t.value is None or abs(t.value) < 1e9 for t in finished)
        sampler_cfg = cfg.hydra.sweeper.sampler
        if study.trials and sampler_cfg.get("seed") is not None and not sampler_cfg.get("_partial_"):
            # a seeded sampler starts its random draws over on every run: without a new seed the
            # resumed study would repeat the finished trials' parameters
            impl.sampler = instantiate(sampler_cfg, seed=int(sampler_cfg.seed) + len(study.trials))
        impl.n_trials = max(0, self.total_trials - done)
        impl.job_idx = len(study.trials)  # new trials get new directories (…_<num>)
        log.info(f"study '{study.study_name}': {done} of {self.total_trials} trials finished, "
                 f"{impl.n_trials} to run")
        if impl.n_trials:
            super().sweep(arguments)
        searched = None  # without storage (in memory) the study is gone: fall back to the runs
        if impl.storage:
            trials = optuna.load_study(study_name=study.study_name, storage=impl.storage).trials
            searched = sorted({k for t in trials for k in t.params})
        best = write_best(sweep_dir, maximize, searched)
        if best:
            log.info(f"best {best['main_metric']} {best['best_value']:.4g}: {best['run_dir']} "
                     f"(config: {os.path.join(sweep_dir, BEST_FILE)})")
        else:
            log.warning(f"no trial finished ok: no {BEST_FILE} (see the errors in {sweep_dir}/**/results.json)")


def write_best(sweep_dir: str, greater_is_better: bool = True, searched: list[str] | None = None) -> dict | None:
    """Write ``best_trial.yaml`` (score, searched values, overrides, full config) for the best ok
    run under ``sweep_dir``; read from the runs' results.json, so it covers resumed studies.
    ``searched``: the search space's keys (default: the settings that differ between runs)."""
    from report import collect_runs, varying_keys

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

