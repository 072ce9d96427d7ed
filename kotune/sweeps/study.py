"""The Optuna study a sweep's workers share: opened on its database (one line, without the
password, when it cannot be), one search per study (its space, data and fixed overrides), which
trials count as done, and the heartbeat that lets another worker fail and replace a killed worker's trial."""
from __future__ import annotations

import json
import os
import threading
import warnings
from typing import Any

from hydra.errors import ConfigCompositionException

from kotune.core.redact import MASK, mask_credentials, mask_url, remember_secrets, secret_name, url_secrets

FAILED_SCORE = 1e9  # kotune.cli.main.worst_score's magnitude: a failed job
# what makes a study one search (kotune/sweeps/study.py check_same_search): a worker with another one refuses
SPACE_ATTR = "kotune_search_space"  # the searched keys' distributions
DATA_ATTR = "kotune_data"  # the data files the trials read, with their sha256
FIXED_ATTR = "kotune_fixed_overrides"  # the overrides every trial gets
NOT_THE_SEARCH = ("data.train_file", "data.validation_file", "cache_dir", "save_model", "save_predictions",
                  "keep_going_on_bugs")


def open_study(storage_url: str | None, study_name: str | None, direction: str, sampler: Any,
               heartbeat_interval: int, grace_period: int, pruner: Any = None):
    """The study at ``storage_url`` (created on first use); a database that cannot be reached is
    one line naming the URL without its password. ``pruner``: optuna's (None: none)."""
    import optuna

    storage = None
    if storage_url:
        # the password, and its pieces past an '@' a driver may name as the host, masked in its error text
        remember_secrets(url_secrets(storage_url), url=True)
        try:
            storage = _rdb_storage(str(storage_url), heartbeat_interval, grace_period)
        except Exception as e:  # noqa: BLE001 - any driver's connection error: one line, no password
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigCompositionException(
                f"hparams_search.storage: cannot open {mask_url(storage_url)}: {mask_credentials(reason)[:200]}") from None
    return optuna.create_study(study_name=study_name, storage=storage, sampler=sampler, direction=direction,
                               pruner=pruner or optuna.pruners.NopPruner(), load_if_exists=True)


def _rdb_storage(url: str, heartbeat_interval: int, grace_period: int, attempts: int = 5):
    """optuna's RDBStorage at ``url``. Workers started at once on a new database each create its
    tables, and all but one hit a unique-key violation (PostgreSQL's catalogue, sqlite's
    alembic_version): they try again, when the tables are there, rather than fail."""
    import random
    import time

    import optuna
    from sqlalchemy.exc import IntegrityError

    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():  # heartbeat_interval is "experimental" since optuna 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, heartbeat_interval=heartbeat_interval, grace_period=grace_period)
        except IntegrityError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 + random.random() * 0.5 * (attempt + 1))


def space_json(space: dict[str, Any]) -> str:
    from optuna.distributions import distribution_to_json

    return json.dumps({k: distribution_to_json(d) for k, d in sorted(space.items())}, sort_keys=True)


def data_fingerprints(cfg, searched: set[str] | frozenset = frozenset()) -> dict[str, dict]:
    """The data a training trial of ``cfg`` reads, by setting: ``data.train_file`` → its path and
    sha256 (as results.json records them), or the hub dataset; data.validation_file too unless the
    validation split is cut from the train file. A setting the search varies is left out."""
    from kotune.core.files import sha256_of

    data = cfg.data
    cut = bool(float(data.get("validation_split") or 0.0) or data.get("folds"))
    out: dict[str, dict] = {}
    for split in ("train",) if cut else ("train", "validation"):
        key = f"data.{split}_file"
        if key in searched:
            continue
        path = data.get(f"{split}_file")
        if not path and data.get("source") == "sample":
            from tasks.splits import sample_file

            try:
                path = sample_file(cfg.task, split)
            except Exception:  # noqa: BLE001 - no sample file: the trial says so itself
                continue
        if path:
            path = os.path.abspath(str(path))
            out[key] = {"file": path, "sha256": sha256_of(path) if os.path.isfile(path) else None}
        elif cfg.task.get("hub"):
            hub = cfg.task.hub
            out[key] = {"hub": f"{hub.path}/{hub.get('name')}:{split}", "revision": data.get("revision")}
    return out


def check_same_search(study, storage_url: str | None, space: dict[str, Any], data: dict[str, dict],
                      fixed: dict[str, str]) -> None:
    """A study is one search: its space, the data its trials read (by content) and the overrides
    every trial gets (``fixed``, without n_trials, workers, storage and output settings). The first
    worker stores them in the study; another worker on the same study name must have the same, or
    stops in one line naming what differs (two searches mixed in one study compare apples with pears)."""
    mine = {SPACE_ATTR: space_json(space), DATA_ATTR: json.dumps(data, sort_keys=True),
            FIXED_ATTR: json.dumps(fixed, sort_keys=True)}
    stored = study.user_attrs
    for attr, value in mine.items():
        if stored.get(attr) is None:  # a new study (or one from before kotune stored this)
            study.set_user_attr(attr, value)
    # read back: of two workers creating the study at once, the later one's values stand
    stored = study.user_attrs
    differ = []
    if stored[SPACE_ATTR] != mine[SPACE_ATTR]:
        theirs, ours = json.loads(stored[SPACE_ATTR]), json.loads(mine[SPACE_ATTR])
        keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        differ.append(f"another search space ({', '.join(keys)} differ)")
    theirs, ours = json.loads(stored[DATA_ATTR]), data
    for key in sorted(set(theirs) | set(ours)):
        if not same_data(theirs.get(key), ours.get(key)):
            differ.append(f"{key}={shown_data(theirs.get(key))}, this search reads {shown_data(ours.get(key))}")
    theirs, ours = json.loads(stored[FIXED_ATTR]), fixed
    for key in sorted(set(theirs) | set(ours)):
        if theirs.get(key) != ours.get(key):
            differ.append(f"{key}={theirs.get(key, '(not set)')}, this search has {ours.get(key, '(not set)')}")
    if not differ and stored[DATA_ATTR] != mine[DATA_ATTR]:
        study.set_user_attr(DATA_ATTR, mine[DATA_ATTR])  # a file unreadable then (every trial failed), read now
    if differ:
        where = mask_url(storage_url) if storage_url else "memory"
        raise ConfigCompositionException(
            f"study '{study.study_name}' in {where} was made for {'; for '.join(differ)}: give this search its "
            "own hparams_search.study_name or hparams_search.storage (a larger n_trials or other n_jobs "
            "is the same search)")


def same_data(a: dict | None, b: dict | None) -> bool:
    """One file's content is the same data wherever it lies (workers on several machines); a file
    that was or is unreadable (its trials fail on it) is the same file by its path."""
    if a and b and "file" in a and "file" in b:
        if a.get("sha256") and b.get("sha256"):
            return a["sha256"] == b["sha256"]
        return a["file"] == b["file"]
    return a == b


def search_overrides(fixed: dict[str, str], pruner: str) -> dict[str, str]:
    """The fixed overrides that make a study's search (``fixed``: every trial's), with the pruner:
    not how many trials or workers, where the study or the outputs lie, nor the data files' paths
    (their content is compared instead). A secret setting (serve.api_key) is stored as ``***``: the
    study's database is a file in the sweep directory, or shared by every worker."""
    out = {k: MASK if secret_name(k) else v for k, v in fixed.items()
           if not k.startswith("hparams_search.") and k not in NOT_THE_SEARCH}
    return {**out, "hparams_search.pruner": str(pruner)}


def shown_data(entry: dict | None) -> str:
    if not entry:
        return "(none)"
    if "hub" in entry:
        return f"{entry['hub']} (revision {entry.get('revision') or 'latest'})"
    digest = entry.get("sha256")
    return f"{entry['file']} (sha256 {digest[:12] if digest else 'unreadable'})"


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
