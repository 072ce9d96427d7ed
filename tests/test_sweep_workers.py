"""Sweep workers on one Optuna study (hydra_plugins/kotune_sweeper.py; kotune/sweeps/study.py,
kotune/sweeps/workers.py): several processes pull trials from one database until it has
``n_trials`` finished ones; a SIGKILLed worker's trial is marked failed (its heartbeat stops) and
replaced; bad input is one line.

PostgreSQL: the test starts its own server from the binaries on PATH or /usr/local/bin (initdb,
pg_ctl) as a non-root user, in a temporary directory that user owns, on a unix socket, and stops
it at teardown; without them it is skipped with the reason.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT, run_cli
from test_sweep import lr_score, multirun, stub_train

N_TRIALS = 4
GRACE_S = 15  # a running trial whose heartbeat is older is a killed worker's: failed and replaced
# a tiny real run per trial (the kill needs a trial that is running in a real process: long enough, a few
# seconds on an idle machine, that the kill a second after the trial is seen running lands inside it)
WORKER_ARGS = ["-m", "hparams_search=nli", "model=tiny", "data=sample", "train.max_steps=40", "train.batch_size=8",
               "save_model=false", f"hparams_search.n_trials={N_TRIALS}", "hydra.sweeper.heartbeat_interval=1",
               f"hydra.sweeper.grace_period={GRACE_S}"]


def pg_binary(name: str) -> str | None:
    return shutil.which(name) or (f"/usr/local/bin/{name}" if os.path.exists(f"/usr/local/bin/{name}") else None)


@pytest.fixture(scope="module")
def postgres_url():
    """A PostgreSQL server of this test's own: initdb + pg_ctl as a non-root user on a unix socket."""
    pytest.importorskip("psycopg", reason="pip install -e '.[dev]' (psycopg[binary])")
    initdb, pg_ctl = pg_binary("initdb"), pg_binary("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found")
    user = next((u for u in ("postgres", "nobody") if _has_user(u)), None)
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        if user is None or not shutil.which("runuser"):
            pytest.skip("running as root without a non-root user (postgres/nobody) and runuser")
        as_user = ["runuser", "-u", user, "--"]
    folder = tempfile.mkdtemp(prefix="kotune-pg-")  # under /tmp: the server's user must reach it
    if as_user:
        info = pwd.getpwnam(user)
        os.chown(folder, info.pw_uid, info.pw_gid)
    data = os.path.join(folder, "data")
    subprocess.run([*as_user, initdb, "-D", data, "-U", "kotune", "--auth=trust"], check=True, capture_output=True)
    port = "5433"
    subprocess.run([*as_user, pg_ctl, "-D", data, "-w", "-l", os.path.join(folder, "log"), "-o",
                    f"-k {folder} -p {port} -c listen_addresses=''", "start"], check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://kotune@/postgres?host={folder}&port={port}"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", data, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def worker(args: list[str]) -> subprocess.Popen:
    """``python run.py ARGS`` in the background, one thread."""
    env = dict(os.environ, KOTUNE_PROGRESS="0", OMP_NUM_THREADS="1")
    env.pop("KOTUNE_SWEEP_ID", None)
    return subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_to_end(args: list[str]) -> None:
    """A worker started now and waited for: it must end cleanly."""
    proc = worker(args)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]


def load(url: str, name: str = "nli-tiny-finetune"):
    import optuna

    return optuna.load_study(study_name=name, storage=url)


def running_trials(url: str) -> int:
    """How many trials of the study's storage run now, read with plain SQL: optuna.load_study would
    create the schema itself, racing the worker that is creating it (a sqlite file's alembic_version
    written twice: the worker then fails to open its storage)."""
    import sqlalchemy as sa

    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not os.path.exists(path):
            return 0
        url = f"sqlite:///file:{path}?mode=ro&uri=true"  # read-only: never creates or writes the file
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM trials WHERE state = 'RUNNING'")).scalar())
    finally:
        engine.dispose()


def wait_for_running(url: str, procs: list[subprocess.Popen], timeout: float = 300, n: int = 1) -> None:
    """Until ``n`` trials run at once (each worker has one); a worker that ended before is reported
    with its output (a slow, loaded machine gets minutes: the workers start Python, torch and Hydra)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if running_trials(url) >= n:
                return
        except Exception:  # noqa: BLE001 - no database or no study yet
            pass
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"a worker ended (exit {proc.returncode}) before {n} trial(s) ran at once: "
                                     f"{proc.stdout.read()[-3000:]}")
        time.sleep(0.3)
    raise AssertionError(f"no {n} trial(s) running after {timeout:.0f} s")


def check_completed_study(url: str) -> None:
    from optuna.trial import TrialState

    trials = load(url).trials
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == N_TRIALS and all(abs(t.value) < 1e9 for t in complete)
    params = [tuple(sorted(t.params.items())) for t in complete]
    assert len(set(params)) == len(params)  # no parameter set ran twice
    killed = [t for t in trials if t.state == TrialState.FAIL and not t.user_attrs.get("kotune_surplus")]
    assert len(killed) == 1  # the SIGKILLed worker's trial, marked failed through its stopped heartbeat


@pytest.mark.slow
def test_sqlite_one_worker_killed_mid_trial_is_replaced_on_the_next_run(tmp_path):
    sweep = tmp_path / "sweep"
    url = f"sqlite:///{sweep}/optuna.db"
    args = [*WORKER_ARGS, f"hydra.sweep.dir={sweep}"]
    first = worker(args)
    wait_for_running(url, [first])
    time.sleep(1)  # into the trial's job
    first.send_signal(signal.SIGKILL)
    first.wait()
    # the next run starts at once: the killed trial still counts as running until its heartbeat is
    # GRACE_S old, and the worker's trial that would be surplus beside it waits for that (a worker
    # that stopped there left the study a trial short)
    run_to_end(args)
    check_completed_study(url)
    assert (sweep / "best_trial.yaml").exists()


@pytest.mark.slow
def test_postgres_two_workers_one_killed_the_study_still_completes(tmp_path, postgres_url):
    sweep = tmp_path / "sweep"
    args = [*WORKER_ARGS, f"hydra.sweep.dir={sweep}", f"hparams_search.storage='{postgres_url}'"]  # quoted: '?', '=' and '&' in a URL
    a, b = worker(args), worker(args)
    wait_for_running(postgres_url, [a, b], n=2)  # a killed before its first trial would leave no trial to replace
    time.sleep(1)
    a.send_signal(signal.SIGKILL)
    a.wait()
    out, _ = b.communicate(timeout=600)
    assert b.returncode == 0, out[-3000:]
    # b alone completes the study: its trial beside a's killed one waits until that one is stale
    check_completed_study(postgres_url)
    assert (sweep / "best_trial.yaml").exists()


@pytest.mark.slow
def test_n_jobs_runs_two_workers_at_once_each_with_its_own_assignment(tmp_path):
    from optuna.trial import TrialState

    sweep = tmp_path / "sweep"
    args = [a for a in WORKER_ARGS if not a.startswith("hparams_search.n_trials")]
    # two GPUs named visible: n_jobs=auto starts a worker per GPU and pins each to its own (a CPU build
    # of torch sees no CUDA device whatever the variable says, so the jobs still run on the CPU)
    proc = run_cli([*args, "hparams_search.n_trials=2", "hparams_search.n_jobs=auto", f"hydra.sweep.dir={sweep}"],
                   env={"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = [t for t in load(f"sqlite:///{sweep}/optuna.db").trials if t.state == TrialState.COMPLETE]
    assert len(trials) == 2
    assert sorted(t.user_attrs["worker"] for t in trials) == ["0/2", "1/2"]  # one trial per worker
    assert sorted(t.user_attrs["device"] for t in trials) == ["0", "1"]  # each worker saw only its own GPU
    first, second = sorted(trials, key=lambda t: t.datetime_start)
    assert second.datetime_start < first.datetime_complete  # the two ran at the same time
    assert (sweep / "best_trial.yaml").exists()


def test_an_unreachable_database_is_one_line_without_its_password(tmp_path):
    url = "postgresql+psycopg://kotune:s3cret@127.0.0.1:9/nodb"
    proc = run_cli(["-m", "hparams_search=nli", "model=tiny", f"hparams_search.storage={url}",
                    f"hydra.sweep.dir={tmp_path / 's'}"])
    assert proc.returncode != 0
    assert "cannot open postgresql+psycopg://kotune:***@127.0.0.1:9/nodb" in proc.stderr
    assert "s3cret" not in proc.stderr + proc.stdout
    assert not list(tmp_path.rglob("results.json"))


def test_two_search_spaces_on_one_study_refuse(monkeypatch, tmp_path, capsys):
    sweep = tmp_path / "study"
    args = ["hparams_search=nli", "model=tiny", "hparams_search.n_trials=1", f"hydra.sweep.dir={sweep}"]
    calls = stub_train(monkeypatch, lr_score)
    multirun(monkeypatch, args)
    assert len(calls) == 1
    with pytest.raises(SystemExit):
        multirun(monkeypatch, [*args, "hparams_search.n_trials=2", "train.warmup_ratio=interval(0.3, 0.5)"])
    assert (f"study 'nli-tiny-finetune' in sqlite:///{sweep}/optuna.db was made for another search space "
            "(train.warmup_ratio differ): give this search its own hparams_search.study_name") in capsys.readouterr().err
    assert len(calls) == 1


def test_a_worker_that_loses_the_race_to_create_the_tables_tries_again(monkeypatch):
    """Workers started at once on a new database each create its tables; the losers' unique-key
    violation is retried (the real race: the PostgreSQL test above, two workers started together),
    and a violation that persists still ends in the one-line error."""
    import optuna
    from sqlalchemy.exc import IntegrityError

    from kotune.sweeps import study

    calls = []

    def storage_failing(times: int):
        def make(url, **kwargs):
            calls.append(url)
            if len(calls) <= times:
                raise IntegrityError("CREATE TABLE", {}, Exception("duplicate key value violates unique constraint"))
            return "storage"
        return make

    monkeypatch.setattr(time, "sleep", lambda s: None)
    monkeypatch.setattr(optuna.storages, "RDBStorage", storage_failing(2))
    assert study._rdb_storage("sqlite:///x.db", 1, 15) == "storage" and len(calls) == 3
    calls.clear()
    monkeypatch.setattr(optuna.storages, "RDBStorage", storage_failing(99))
    with pytest.raises(Exception, match=r"^hparams_search.storage: cannot open sqlite:///x.db: \(builtins.Exception\) duplicate key"):
        study.open_study("sqlite:///x.db", "s", "maximize", None, 1, 15)
    assert len(calls) == 5
