"""One job: run ``cfg.action`` and always leave ``results.json`` behind (atomic; ok or failed, with
the resolved config, versions and the config hash; an earlier run's is removed when the job starts,
so a rerun in the same directory never shows it beside new outputs), and recognise a job that
already finished."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import time
import traceback
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kotune import embeddings
from kotune.actions import ACTIONS
from kotune.devices import is_rank_zero, world_size
from kotune.training.ranges import check_train
from kotune.core.atomic_dir import clear_leftovers
from tasks.encode_cache import fingerprint
from kotune.core.errors import ConfigError, KotuneError
from kotune.core.files import write_json_atomic
from kotune.core.log import log
from kotune.core.redact import job_secrets, mask_credentials, remember_environment, remember_tree


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "datasets", "tokenizers", "hydra-core", "kotune"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def config_hash(cfg: DictConfig) -> str:
    """Identity of a job: the resolved config minus what does not change its result."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    return fingerprint(plain)[:16]


def execute(cfg: DictConfig, run_dir: str) -> dict:
    """Run ``cfg.action`` and write ``run_dir/results.json``; returns the results dict. The secrets
    met on the way are the job's (kotune/core/redact.py): a later job in this process does not mask them."""
    with job_secrets():  # the API's job, or the same job as the command line's main()
        return _execute(cfg, run_dir)


def _execute(cfg: DictConfig, run_dir: str) -> dict:
    started = time.time()
    # the config's secrets (serve.api_key, a storage URL's password), by key: masked in every line and
    # file from here on, also where a library's error text quotes them (the API has no command line)
    remember_tree(OmegaConf.to_container(cfg, resolve=False))
    remember_environment()
    os.makedirs(run_dir, exist_ok=True)
    results: dict[str, Any] = {
        "task": cfg.task.name, "model": cfg.model.name, "mode": cfg.mode.name, "action": cfg.action,
        "seed": int(cfg.train.seed), "status": "running", "main_metric": cfg.task.main_metric,
        "config_hash": config_hash(cfg), "run_dir": os.path.abspath(run_dir), "world_size": world_size(),
    }
    if is_rank_zero():
        start_outputs(run_dir)
    try:
        if cfg.action not in ACTIONS:
            raise ConfigError(f"unknown action '{cfg.action}' (choices: {', '.join(ACTIONS)})")
        check_train(cfg)  # the numeric train.* settings' ranges, before anything is read or built
        action = ACTIONS[cfg.action]
        if embeddings.runs_here(cfg):  # a bi-encoder trains and predicts through sentence-transformers
            action = embeddings.action_for(cfg) or action
        results.update(action(cfg, run_dir))
        results["status"] = "pruned" if results.get("pruned") else "ok"  # a sweep's trial stopped early (kotune/sweeps/pruning.py)
    except KotuneError as e:
        results.update(status="failed", error=mask_credentials(str(e)), error_type=type(e).__name__)  # as results.json says it
    except Exception as e:  # noqa: BLE001 - a failed job still leaves a results file behind
        if not cfg.get("keep_going_on_bugs", True):
            raise
        trace = os.path.join(run_dir, "traceback.txt")
        with open(trace, "w", encoding="utf-8") as f:
            f.write(mask_credentials(traceback.format_exc()))
        first = mask_credentials(str(e).splitlines()[0]) if str(e) else ""
        results.update(status="failed", traceback=trace, error_type=type(e).__name__,
                       error=f"{type(e).__name__}: {first} (a bug, not your input? traceback in {trace}; "
                             "keep_going_on_bugs=false raises it)")
    results["runtime_s"] = round(time.time() - started, 3)
    metrics = results.get("metrics") or {}
    results["main_score"] = metrics.get(results["main_metric"])
    results["config"] = OmegaConf.to_container(cfg, resolve=True)
    results["versions"] = versions()
    if is_rank_zero():
        write_json_atomic(os.path.join(run_dir, "results.json"), results)
    return results


def start_outputs(run_dir: str) -> None:
    """Before a job writes anything: what dead processes left half-written in ``run_dir`` goes
    (``predictions.jsonl.tmp123``, ``model.tmp-123``: kotune/core/atomic_dir.py), and so does an earlier
    run's ``results.json``, which would otherwise sit beside this run's predictions and model until
    this one ends (or for good, if it is killed): results.json is this job's or none."""
    removed = clear_leftovers(run_dir)
    if removed:
        log(f"{run_dir}: removed what an interrupted run left: {', '.join(removed)}")
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(run_dir, "results.json"))


def finished_results(path: str, cfg: DictConfig) -> dict | None:
    """An earlier ok results.json of this very config (resume of a multirun), else None: failed,
    partial or corrupt files and other configs mean the job runs (again)."""
    try:
        with open(path, encoding="utf-8") as f:
            done = json.load(f)
    except (OSError, ValueError):
        return None
    if isinstance(done, dict) and done.get("status") == "ok" and done.get("config_hash") == config_hash(cfg):
        return done
    return None
