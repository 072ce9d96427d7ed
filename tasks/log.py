"""kotune's one logger, ``logging.getLogger("kotune")``, printed to stdout as ``[kotune] message``.

Every module logs through :func:`log` (or the logger itself); nothing threads a ``log=`` callable
around. Silence it with ``logging.getLogger("kotune").setLevel(logging.WARNING)``."""
from __future__ import annotations

import logging
import sys

logger = logging.getLogger("kotune")


class _Stdout(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at the time (pytest's capture, a redirected run)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it
        pass


if not logger.handlers:
    _handler = _Stdout()
    _handler.setFormatter(logging.Formatter("[kotune] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log(msg: str) -> None:
    logger.info(msg)


def warn(msg: str) -> None:
    logger.warning(f"warning: {msg}")
