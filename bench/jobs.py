"""One bench job: a config composed as the command line composes it (``kotune.cli.overrides.compose``)
and run in this process by ``kotune.cli.job.execute``, exactly what the CLI runs; a run directory that
already holds an ok result of the same config is reused, not run again."""
from __future__ import annotations

import os

from kotune.cli.overrides import compose


def job(overrides: list[str], run_dir: str) -> dict:
    """One ``kotune.cli.job.execute`` (skipped when run_dir already holds an ok result of the same config)."""
    from kotune.cli.job import execute, finished_results
    from kotune.devices import quiet_libraries

    cfg = compose(overrides)
    done = finished_results(os.path.join(run_dir, "results.json"), cfg)
    if done is not None:
        return done
    quiet_libraries()
    res = execute(cfg, run_dir)
    if res["status"] != "ok":
        raise SystemExit(f"job failed ({' '.join(overrides)}): {res.get('error')}")
    return res
