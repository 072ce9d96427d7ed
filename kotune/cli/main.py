"""The command line (``python run.py …``): argv checks and rewrites before Hydra starts, the Hydra
entry point, and the one place that prints for the user (the summary, or the error line)."""
from __future__ import annotations

import math
import os
import sys

import hydra
from omegaconf import DictConfig

from kotune.cli.config import CONF_DIR, GROUPS
from kotune.cli.job import execute, finished_results
from kotune.plugins import broken_preset, load_plugins, named_in, preset_names
from kotune.cli.overrides import bad_override, job_overrides, open_dict_overrides  # noqa: F401 (bench/ imports it here)
from kotune.devices import quiet_libraries, release_memory
from kotune.sweeps.naming import NOT_IN_SWEEP_ID, SWEPT_ENV, swept_keys
from tasks.encode_cache import fingerprint
from kotune.core.errors import KotuneError
from kotune.core.files import mask_credentials_in_file, write_text_atomic
from kotune.core.log import log, mask_console, run_log, say
from kotune.core.redact import (job_secrets, mask_credentials, mask_tree, remember_environment, remember_override,
                                 remember_tree)


def summary(results: dict) -> str:
    rows = [("task", results["task"]), ("model", results["model"]), ("mode", results["mode"]),
            ("action", results["action"]), ("status", results["status"])]
    if results.get("head"):
        rows.insert(3, ("head", results["head"]))
    stopped = results.get("early_stopping") or {}
    if stopped.get("stopped_early"):
        rows.append(("early stopping", f"step {stopped['stopped_step']:,} of {stopped['max_steps']:,} "
                                       f"(patience {stopped['patience']})"))
    if results.get("best_step") is not None:
        rows.append(("best_step", f"{results['best_step']:,}"))
    for k, v in (results.get("metrics") or {}).items():
        mark = " *" if k == results.get("main_metric") else ""
        rows.append((k + mark, f"{v:.2f}" if isinstance(v, float) else str(v)))
    if results.get("export_dir"):  # action=export: where the next command finds it
        rows.append(("export_dir", str(results["export_dir"])))
    for k in ("n_train", "n_eval", "trainable_params", "train_samples_per_second", "runtime_s"):
        if results.get(k) is not None:
            v = results[k]
            rows.append((k, f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def worst_score(cfg: DictConfig) -> float:
    return -1e9 if cfg.task.get("greater_is_better", True) else 1e9


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    # one job (a multirun's one of many in this process): the secrets it meets, from its saved config
    # files to its last line, are masked while it runs and not in the next job's lines
    with job_secrets():
        mask_hydra_files(hc)
        quiet_libraries()
        with run_log(os.path.join(hc.runtime.output_dir, "run.log")):  # the job's log, as the console shows it
            results = job_results(cfg, hc)
            path = os.path.join(hc.runtime.output_dir, "results.json")
            if results["status"] in ("ok", "pruned"):
                say(f"\n{summary(results)}\n  results: {path}")
                score = results.get("main_score")
                return float(score) if score is not None and math.isfinite(score) else worst_score(cfg)
            say(f"error: {mask_credentials(results['error'])}", error=True)
    if hc.mode == RunMode.MULTIRUN:  # let the sweep go on; a sweeper gets a finite worst score
        return worst_score(cfg)
    sys.exit(1)


def job_results(cfg: DictConfig, hc) -> dict:
    """The job run, or its earlier results where a multirun's job finished ok with this config."""
    from hydra.types import RunMode

    path = os.path.join(hc.runtime.output_dir, "results.json")
    results = finished_results(path, cfg) if hc.mode == RunMode.MULTIRUN else None
    if results is not None:
        log(f"resume: {path} is complete for this config (hash {results['config_hash']}): skipped")
        return results
    results = execute(cfg, hc.runtime.output_dir)
    if hc.mode == RunMode.MULTIRUN:
        release_memory()
    return results


def mask_hydra_files(hc) -> None:
    """Hydra saved the job's config and overrides (and a multirun's multirun.yaml) before the job
    started, the secrets with them: each file is read as YAML and written again with every secret
    setting's value masked by its key (kotune/core/redact.py), whatever characters the value holds."""
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    folders = [os.path.join(hc.runtime.output_dir, hc.output_subdir)] if hc.output_subdir else []
    paths = [os.path.join(folder, name) for folder in folders for name in ("config.yaml", "hydra.yaml", "overrides.yaml")]
    if hc.mode == RunMode.MULTIRUN:
        paths.append(os.path.join(hc.sweep.dir, "multirun.yaml"))
    trees = {}
    for path in paths:
        try:
            trees[path] = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        except FileNotFoundError:
            continue
        except Exception:  # noqa: BLE001 - not YAML OmegaConf reads: its text masked by pattern instead
            mask_credentials_in_file(path)
            continue
        remember_tree(trees[path])  # every file's secrets first: hydra.yaml's override_dirname holds them too
    for path, tree in trees.items():
        masked = mask_tree(tree)
        if masked != tree:
            write_text_atomic(path, OmegaConf.to_yaml(OmegaConf.create(masked)))


# ---- argv, before Hydra ----------------------------------------------------------------------
def check_choices(argv: list[str]) -> None:
    """Unknown task/model/mode on the command line: one line listing the choices (plug-ins loaded first:
    the installed entry points and ``plugins=``; a plug-in that cannot be imported is one line too)."""
    try:
        load_plugins(named_in(argv))
    except KotuneError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUPS:
            continue
        choices = preset_names(key)  # kotune's and the loaded plug-ins' (kotune/plugins.py)
        for v in value.split(","):
            failed = broken_preset(key, v)  # a preset of an installed plug-in whose import raised
            if failed:
                print(f"error: {key}={v}: {failed}", file=sys.stderr)
                sys.exit(2)
            if v and v not in choices and not v.startswith(("choice(", "range(", "glob(")):
                print(f"error: unknown {key} '{v}' (choices: {', '.join(choices)})", file=sys.stderr)
                sys.exit(2)


def sweep_id(argv: list[str]) -> str:
    """Default multirun directory name: a hash of the command's overrides (not hydra.* options or
    flags, nor a search's n_trials and n_jobs), so the same command run again finds its earlier jobs
    and resumes, also with a larger n_trials (conf/config.yaml)."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-")
                 and not a.lstrip("+~").startswith(("hydra.", "hydra/"))
                 and a.lstrip("+~").partition("=")[0] not in NOT_IN_SWEEP_ID]
    return "sweep-" + fingerprint(overrides)[:10]


def shared_run_dir(argv: list[str]) -> list[str]:
    """Under torchrun every process composes its own config: the default run directory's
    timestamp could differ between them (rank 0's results and model in one directory, another
    rank's checkpoint files in another). Without an explicit ``hydra.run.dir`` the processes of
    one launch share ``<date>_torchrun-<launcher pid>`` instead."""
    explicit = any(a.lstrip("+").startswith("hydra.run.dir=") for a in argv)
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1 or explicit:
        return argv
    return argv + ["hydra.run.dir=outputs/${task.name}/${model.name}/${mode.name}/"
                   f"${{now:%Y-%m-%d}}_torchrun-{os.getppid()}"]


def run() -> None:
    """``python run.py ARGS``: check and rewrite argv, then Hydra's main."""
    for arg in sys.argv[1:]:  # a secret setting on the command line: masked in every line printed from now on
        remember_override(arg)
    remember_environment()
    mask_console()
    check_choices(sys.argv[1:])
    os.environ.setdefault("KOTUNE_SWEEP_ID", sweep_id(sys.argv[1:]))
    os.environ[SWEPT_ENV] = ",".join(swept_keys(sys.argv[1:]))  # the job directories' names (kotune/sweeps/naming.py)
    try:
        argv = job_overrides(sys.argv[1:])  # checkpoint=: its kotune.json checked before Hydra reads any of it
    except KotuneError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    problem = bad_override(argv)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.argv[1:] = shared_run_dir(argv)
    main()
