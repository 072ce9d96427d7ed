"""Data files shipped inside the installed package: the README's demo set (``demo/``, see its
README.md) and the published KLUE baseline scores (``klue_paper.csv``)."""
from __future__ import annotations

import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def data_path(name: str) -> str:
    """The absolute path of a file shipped here (``demo/train.tsv``), whatever the working
    directory; the configs reach it as ``${kotune_data:demo/train.tsv}``. Not checked: a missing
    file is reported, in one line, by whatever reads it."""
    return os.path.join(PACKAGE_DIR, *name.split("/"))
