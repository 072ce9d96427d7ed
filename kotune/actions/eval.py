"""``action=eval checkpoint=RUN``: reload a trained model and score the validation split: the data
options' (``data.validation_file``, a preset), else the run's own, as its results.json recorded it
(a file, or the same held-out share or fold of its training file), read only while that file's
sha256 is still the recorded one. ``kotune.evaluate(run)`` runs this action, so the command line and
the API fall back alike."""
from __future__ import annotations

import json
import os
import re
from typing import Any

from omegaconf import DictConfig, open_dict

from kotune.core.errors import ConfigError
from kotune.core.files import sha256_of
from kotune.core.log import log
from kotune.inference.predict import predict_from_checkpoint

SHA256 = re.compile(r"[0-9a-f]{64}")


def run(cfg: DictConfig, run_dir: str) -> dict:
    if cfg.get("checkpoint"):
        use_recorded_validation(cfg)
    return predict_from_checkpoint(
        cfg, run_dir, "validation", "action=eval needs checkpoint=RUN_DIR (a directory written by action=train)")


def run_results(checkpoint: str) -> dict | None:
    """The results.json of ``checkpoint=`` (a run directory, or its model/), if it has one that reads."""
    folder = os.path.normpath(checkpoint)
    if not os.path.isfile(os.path.join(folder, "results.json")) and os.path.basename(folder) == "model":
        folder = os.path.dirname(folder)
    try:
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def use_recorded_validation(cfg: DictConfig) -> None:
    """With no local data given (no ``data.train_file``, ``data.validation_file`` nor a preset's
    samples), score on what the checkpoint's run was scored on, when its results.json records a
    local file: that file, or its held-out share (``data.validation_split``, the same seed) or fold.
    The file must still hash to the recorded sha256, else one line asks for the data."""
    data = cfg.data
    if data.get("train_file") or data.get("validation_file") or data.get("source") == "sample":
        return
    checkpoint = str(cfg.checkpoint)
    results = run_results(checkpoint) or {}
    recorded = results.get("data") if isinstance(results.get("data"), dict) else {}
    source = recorded.get("validation")
    if not isinstance(source, dict) or "file" not in source:
        return  # hub data, or no record: the data options' split, as before
    config = results.get("config") if isinstance(results.get("config"), dict) else {}
    settings = recorded_settings(checkpoint, source, config.get("data"))
    path = settings["file"]
    ask = "give the data to score on: data.validation_file=FILE (or data=PRESET)"
    if not os.path.isfile(path):
        raise ConfigError(f"checkpoint={checkpoint} was scored on {path} (its results.json), which is not there "
                          f"now: {ask}")
    if sha256_of(path) != settings["sha256"]:
        raise ConfigError(f"checkpoint={checkpoint} was scored on {path}, which has changed since (its sha256 is not "
                          f"the one results.json recorded): {ask}")
    with open_dict(cfg):
        for key, value in settings["data"].items():
            cfg.data[key] = value
        if "seed" in settings:
            cfg.train.seed = settings["seed"]
    log(f"scoring {checkpoint} on its own validation data: {settings['what']} (sha256 as recorded)")


def recorded_settings(checkpoint: str, source: dict, recorded_data: Any) -> dict:
    """The data settings that give the recorded validation split again, each recorded value checked
    (results.json is read as untrusted: a value of the wrong kind is one line naming its key)."""
    def bad(key: str) -> ConfigError:
        return ConfigError(f"checkpoint={checkpoint}: results.json's data.validation.{key} is not what kotune writes: "
                           "give the data to score on: data.validation_file=FILE (or data=PRESET)")

    path, digest = source.get("file"), source.get("sha256")
    if not isinstance(path, str) or not path or "\0" in path:
        raise bad("file")
    if not isinstance(digest, str) or not SHA256.fullmatch(digest):
        raise bad("sha256")
    recorded_data = recorded_data if isinstance(recorded_data, dict) else {}
    # how the file was read: the format and quoting it was read with, where they were set
    reading = {k: recorded_data[k] for k in ("format", "quoting") if isinstance(recorded_data.get(k), str)}
    out: dict[str, Any] = {"file": path, "sha256": digest}
    limit = source.get("max_samples")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise bad("max_samples")
        reading["max_eval_samples"] = limit
    if "validation_split" in source:
        share, seed = source.get("validation_split"), source.get("split_seed")
        if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share < 1:
            raise bad("validation_split")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise bad("split_seed")
        out.update(data={"train_file": path, "validation_split": float(share), **reading}, seed=seed,
                   what=f"data.validation_split={share} of {path} (seed {seed})")
    elif "folds" in source:
        values = {k: source.get(k) for k in ("folds", "fold", "fold_seed")}
        for key, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise bad(key)
        stratify = recorded_data.get("fold_stratify", True)
        out.update(data={"train_file": path, **values, "fold_stratify": bool(stratify) if isinstance(stratify, bool)
                         else True, **reading}, what=f"fold {values['fold']} of {values['folds']} of {path}")
    else:
        out.update(data={"validation_file": path, **reading}, what=path)
    return out
