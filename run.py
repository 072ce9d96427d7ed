"""kotune's command line: ``python run.py task=nli model=klue``, or ``kotune task=nli model=klue``
(the console command). Hydra; see conf/ and kotune/. kotune/cli/console.py sets OMP_WAIT_POLICY before
anything loads torch, then runs kotune.cli.main."""
from kotune.cli.console import main

if __name__ == "__main__":
    main()
