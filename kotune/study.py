"""The Optuna study a sweep's workers share: opened on its database (one line, without the
password, when it cannot be), one search space per study, which trials count as done, and the
heartbeat that lets another worker fail and replace a killed worker's trial."""
from __future__ import annotations

import json
import re
import threading
import warnings
from typing import Any

from hydra.errors import ConfigCompositionException

FAILED_SCORE = 1e9  # kotune.cli.worst_score's magnitude: a failed job
SPACE_ATTR = "kotune_search_space"  # the study's search space, so a worker with another one refuses


def without_password(url: str) -> str:
    """``postgresql://user:secret@host/db`` → ``postgresql://user:***@host/db``."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", str(url))


def open_study(storage_url: str | None, study_name: str | None, direction: str, sampler: Any,
               heartbeat_interval: int, grace_period: int, pruner: Any = None):
    """The study at ``storage_url`` (created on first use); a database that cannot be reached is
    one line naming the URL without its password. ``pruner``: optuna's (None: none)."""
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
                               pruner=pruner or optuna.pruners.NopPruner(), load_if_exists=True)


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
