"""kotune's Optuna sweeper (``python run.py -m hparams_search=nli ...``): a Hydra Sweeper of its
own on optuna's ask/tell API (optuna 4/5, SQLAlchemy 2; hydra-optuna-sweeper pins optuna<3).

The study lives in a database (SQLite in the sweep directory by default, or
``hparams_search.storage=postgresql+psycopg://…``), and every sweep command on it is a worker that
pulls trials until the study has ``n_trials`` finished ones in total: re-running a command resumes,
several commands (one per GPU, several machines, SLURM array tasks) share the work, and no lock is
needed because the database numbers the trials: after ``ask()``, a trial that finds ``n_trials``
live trials (finished or running) numbered below its own is surplus, is told failed and ends the
worker. A running trial beats a heartbeat; one whose worker was killed is marked failed by the next
worker (``fail_stale_trials``) and replaced. A failed job (kotune.cli's worst score, ±1e9) stays in
the study, so the sampler learns to avoid it, but does not count as done.

Also: the search space is Hydra's override grammar (:func:`distribution`), checked against the
composed config before the first trial, minus keys another setting makes no-ops (kotune/sweeps.py);
the direction follows the task; job numbers (and so trial directories) follow the trial numbers;
at the end the best trial's score and config go to ``best_trial.yaml`` in the sweep directory.
"""
from __future__ import annotations

import difflib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import warnings
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from hydra.core.plugins import Plugins
from hydra.errors import ConfigCompositionException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from kotune.overrides import flat_keys
from kotune.sweeps import drop_shadowed

log = logging.getLogger(__name__)
BEST_FILE = "best_trial.yaml"
FAILED_SCORE = 1e9  # kotune.cli.worst_score's magnitude: a failed job
SPACE_ATTR = "kotune_search_space"  # the study's search space, so a worker with another one refuses
SURPLUS_ATTR = "kotune_surplus"  # a trial asked after the study already had n_trials live ones
WORKER_ENV = "KOTUNE_WORKER"  # "i/N": this process is worker i of the N that hparams_search.n_jobs started


def search_keys(params: DictConfig | dict | None, arguments: list[str]) -> list[str]:
    """Config keys of ``hydra.sweeper.params`` and of the command line's overrides."""
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


def distribution(override: Override) -> Any:
    """One parsed override as an optuna distribution, or its plain value (a fixed key):
    ``choice(a, b)`` → categorical; ``range(a, b, step)`` → int/float with a step (shuffled:
    categorical); ``interval(a, b)`` → uniform, int when both ends are; ``tag(log, …)`` → log scale."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if not override.is_sweep_override():
        return override.get_value_element_as_str()
    value = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    if override.is_range_sweep():
        if any(isinstance(x, float) for x in (value.start, value.stop, value.step)):
            # Hydra's range excludes its stop; optuna's high is inclusive
            return FloatDistribution(value.start, value.stop - value.step, step=value.step)
        return IntDistribution(int(value.start), int(value.stop) - int(value.step), step=int(value.step))
    if override.is_interval_sweep():
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log_scale)
        return FloatDistribution(float(value.start), float(value.end), log=log_scale)
    raise ConfigCompositionException(f"search space: {override.input_line} is not a sweep Optuna can sample")


def search_space(params: dict[str, str], arguments: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The preset's params then the command line (which wins): searched key → distribution, and
    the fixed keys' values."""
    from optuna.distributions import BaseDistribution

    space: dict[str, Any] = {}
    fixed: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + arguments):
        key = override.get_key_element()
        value = distribution(override)
        space.pop(key, None), fixed.pop(key, None)
        (space if isinstance(value, BaseDistribution) else fixed)[key] = value
    return space, fixed


def without_password(url: str) -> str:
    """``postgresql://user:secret@host/db`` → ``postgresql://user:***@host/db``."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", str(url))


def visible_gpus() -> int:
    """The GPUs this process may use (``hparams_search.n_jobs=auto``), without importing torch."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([d for d in env.split(",") if d.strip() and d.strip() != "-1"])
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch / no driver: no GPUs
        return 0


def n_workers(n_jobs: int | str) -> int:
    """``hparams_search.n_jobs``: a number, or ``auto`` (one per visible GPU, at least one)."""
    if str(n_jobs).strip().lower() == "auto":
        return max(1, visible_gpus())
    return max(1, int(n_jobs))


def command_line() -> list[str]:
    """This process's command, to start it again as a worker (``python run.py …`` or ``kotune …``)."""
    first = sys.argv[0]
    if first.endswith(".py") or not os.access(first, os.X_OK):
        script = first if os.path.exists(first) else os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), "run.py")
        return [sys.executable, script, *sys.argv[1:]]
    return [first, *sys.argv[1:]]


def run_workers(n: int) -> None:
    """``n`` copies of this sweep command with ``n_jobs=1``, at once, on the same study: each pulls
    trials until the study has its n_trials. With GPUs, worker i sees only GPU i."""
    gpus = visible_gpus()
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    procs = []
    for i in range(n):
        env = dict(os.environ, **{WORKER_ENV: f"{i}/{n}"})
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = visible[i % gpus] if visible else str(i % gpus)
        args = [a for a in command_line() if not a.startswith(("hparams_search.n_jobs=", "hydra.sweeper.n_jobs="))]
        procs.append(subprocess.Popen([*args, "hparams_search.n_jobs=1"], env=env))
    log.info(f"{n} workers on the study: pids {' '.join(str(p.pid) for p in procs)}")
    try:
        codes = [p.wait() for p in procs]
    except BaseException:
        for p in procs:  # Ctrl-C: the workers' trials are told failed on their way out
            p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        raise
    if any(codes):
        raise RuntimeError(f"sweep workers exited with {codes} (their output is above)")


def open_study(storage_url: str | None, study_name: str | None, direction: str, sampler: Any,
               heartbeat_interval: int, grace_period: int):
    """The study at ``storage_url`` (created on first use); a database that cannot be reached is
    one line naming the URL without its password."""
    import optuna

    storage = None
    if storage_url:
        try:
            with warnings.catch_warnings():  # heartbeat_interval is "experimental" since optuna 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(str(storage_url), heartbeat_interval=heartbeat_interval,
                                                     grace_period=grace_period)
        except Exception as e:  # noqa: BLE001 - any driver's connection error: one line, no password
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigCompositionException(
                f"hparams_search.storage: cannot open {without_password(storage_url)}: {reason[:200]}") from None
    return optuna.create_study(study_name=study_name, storage=storage, sampler=sampler, direction=direction,
                               load_if_exists=True)


def check_same_space(study, space: dict[str, Any]) -> None:
    """Workers on one study must search one space: the first stores it, the others compare."""
    from optuna.distributions import distribution_to_json

    mine = json.dumps({k: distribution_to_json(d) for k, d in sorted(space.items())}, sort_keys=True)
    stored = study.user_attrs.get(SPACE_ATTR)
    if stored is None:
        study.set_user_attr(SPACE_ATTR, mine)
    elif stored != mine:
        theirs, ours = json.loads(stored), json.loads(mine)
        differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        raise ConfigCompositionException(
            f"study '{study.study_name}' searches another space ({', '.join(differ)} differ): give this "
            "search its own hparams_search.study_name, or the same ranges as the study's other workers")


def counts_as_done(trial) -> bool:
    from optuna.trial import TrialState

    if trial.state == TrialState.PRUNED:
        return True
    return trial.state == TrialState.COMPLETE and (trial.value is None or abs(trial.value) < FAILED_SCORE)


class Heartbeat:
    """Records a running trial's heartbeat every ``interval`` seconds (a killed worker stops
    beating: the next worker's ``fail_stale_trials`` marks the trial failed)."""

    def __init__(self, study, trial, interval: int) -> None:
        self.storage, self.trial_id, self.interval = study._storage, trial._trial_id, interval
        self.stop = threading.Event()
        self.thread = None
        if getattr(self.storage, "get_heartbeat_interval", lambda: None)():  # an RDB storage beats
            self.storage.record_heartbeat(self.trial_id)
            self.thread = threading.Thread(target=self.beat, daemon=True)
            self.thread.start()

    def beat(self) -> None:
        while not self.stop.wait(self.interval):
            self.storage.record_heartbeat(self.trial_id)

    def __enter__(self) -> "Heartbeat":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        if self.thread:
            self.thread.join()


class KotuneOptunaSweeper(Sweeper):
    """See the module docstring; the keys are conf/hydra/sweeper/kotune_optuna.yaml's."""

    def __init__(self, sampler: Any = None, direction: str = "auto", storage: str | None = None,
                 study_name: str | None = None, n_trials: int = 20, n_jobs: int | str = 1,
                 heartbeat_interval: int = 10, grace_period: int = 60, params: Any = None, **_: Any) -> None:
        self.sampler, self.direction, self.storage, self.study_name = sampler, direction, storage, study_name
        self.n_trials, self.n_jobs = int(n_trials), n_jobs
        self.heartbeat_interval, self.grace_period = int(heartbeat_interval), int(grace_period)
        self.params = params
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function)
        short = OmegaConf.to_container(config.get("hparams_search") or {}, resolve=True)
        for key in ("storage", "study_name", "n_trials", "n_jobs"):
            if short.get(key) is not None:  # hparams_search.KEY=… is the short name of hydra.sweeper.KEY
                setattr(self, key, short[key])
        self.n_trials = int(self.n_trials)

    def sweep(self, arguments: list[str]) -> None:
        cfg = self.config
        check_search_keys(cfg, search_keys(self.params, arguments))
        params, arguments = drop_shadowed(cfg, self.params, arguments)  # e.g. epochs under train.max_steps
        space, fixed = search_space(params, arguments)
        direction = self.direction
        if direction in (None, "auto"):
            direction = "maximize" if cfg.task.get("greater_is_better", True) else "minimize"
        sweep_dir = str(cfg.hydra.sweep.dir)
        os.makedirs(sweep_dir, exist_ok=True)  # SQLite creates the file, not its folder
        study = open_study(self.storage, self.study_name, direction, self.sampler,
                           self.heartbeat_interval, self.grace_period)
        check_same_space(study, space)
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
        log.info(f"study '{study.study_name}' ({without_password(self.storage or 'in memory')}): "
                 f"{done} of {self.n_trials} trials finished")
        # this worker's budget: the trials missing when it starts. A failed job (which counts as not
        # done) is replaced by the next run, not retried here without end (a bad data file fails every trial)
        budget = max(0, self.n_trials - done)
        while budget and self.run_one(study, space, fixed, cfg.hydra.sweeper.sampler):
            budget -= 1

    def run_one(self, study, space: dict[str, Any], fixed: dict[str, str], sampler_cfg: DictConfig) -> bool:
        """Ask, run and tell one trial; False when the study has its ``n_trials``."""
        import optuna
        from optuna.trial import TrialState

        with warnings.catch_warnings():  # "experimental" since optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)  # a killed worker's trial: failed, so it is replaced
        trials = study.get_trials(deepcopy=False)
        if sum(counts_as_done(t) for t in trials) >= self.n_trials:
            return False
        with warnings.catch_warnings():  # optuna: "Heartbeat … supposed to be used with Study.optimize"; Heartbeat beats
            warnings.simplefilter("ignore")
            trial = study.ask()
        if sampler_cfg.get("seed") is not None and not sampler_cfg.get("_partial_"):
            # a seeded sampler starts its random draws over in every process: seeded by the trial's
            # number, a resume or a second worker does not repeat earlier trials' parameters
            study.sampler = instantiate(sampler_cfg, seed=int(sampler_cfg.seed) + trial.number)
        for key, dist in space.items():
            trial._suggest(key, dist)  # optuna's own path for a distribution object (what suggest_* call)
        live = [t for t in study.get_trials(deepcopy=False) if t.number < trial.number
                and (t.state == TrialState.RUNNING or counts_as_done(t))]
        if len(live) >= self.n_trials:
            # the others' running trials complete the study: this one is surplus (lower numbers win)
            trial.set_user_attr(SURPLUS_ATTR, True)
            study.tell(trial, state=TrialState.FAIL)
            log.info(f"trial {trial.number}: the study has {self.n_trials} trials running or finished; this worker stops")
            return False
        trial.set_user_attr("worker", os.environ.get(WORKER_ENV, "0/1"))  # which process, on which device
        trial.set_user_attr("device", os.environ.get("CUDA_VISIBLE_DEVICES") or "default")
        # hparams_search.* is the sweeper's (a database URL need not survive re-parsing as a job override)
        job_fixed = {k: v for k, v in fixed.items() if not k.startswith("hparams_search.")}
        overrides = tuple(f"{k}={v}" for k, v in {**trial.params, **job_fixed}.items())
        try:
            with Heartbeat(study, trial, self.heartbeat_interval):
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
        try:
            study.tell(trial, value)
        except ValueError:  # another worker found its heartbeat stale and failed it: it was replaced
            log.warning(f"trial {trial.number} was marked failed while it ran (a heartbeat too late: raise "
                        "hydra.sweeper.grace_period); its result stays in its directory")
        return True


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
