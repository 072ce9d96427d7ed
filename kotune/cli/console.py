"""The ``kotune`` console command (pyproject's [project.scripts]): ``kotune ARGS`` is ``python run.py
ARGS``, and ``kotune report DIR...`` is ``python report.py DIR...``. Imports nothing at module level
but the standard library, so that OMP_WAIT_POLICY is set before anything loads torch."""
import os
import sys


def main() -> None:
    # Idle OpenMP threads sleep rather than spin (read when torch loads, so set before: nothing above
    # loads torch). On a CPU shared with other jobs, or by torchrun processes, spinning threads that
    # lose their core stall every op: measured 2.6x slower BERT-base steps on a busy 2-core machine,
    # a few % the other way on an idle one. An explicit OMP_WAIT_POLICY wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if sys.argv[1:2] == ["report"]:  # before Hydra, which would read "report" as an override
        from kotune.reporting import main as report

        sys.exit(report(sys.argv[2:]))
    from kotune.cli.main import run

    run()
