"""Leaderboard of kotune runs: ``python report.py DIR... [--out DIR] [--paper]`` (or ``kotune report
DIR...``). The logic lives in kotune/reporting/ (see its docstring); this is the script."""
import sys

from kotune.reporting import main

if __name__ == "__main__":
    sys.exit(main())
