"""kotune's command line: ``python run.py task=nli model=klue``, or ``kotune task=nli model=klue``
(the console command; pyproject's [project.scripts] points at main). Hydra; see conf/ and kotune/."""
import os


def main() -> None:
    # Idle OpenMP threads sleep rather than spin (read when torch loads, so set before: nothing above
    # loads torch). On a CPU shared with other jobs, or by torchrun processes, spinning threads that
    # lose their core stall every op: measured 2.6x slower BERT-base steps on a busy 2-core machine,
    # a few % the other way on an idle one. An explicit OMP_WAIT_POLICY wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from kotune.cli import run

    run()


if __name__ == "__main__":
    main()
