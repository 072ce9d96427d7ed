"""kotune's one logger, ``logging.getLogger("kotune")``, printed to stdout as ``[kotune] message``.

Every module logs through :func:`log` (or the logger itself); nothing threads a ``log=`` callable
around. Silence it with ``logging.getLogger("kotune").setLevel(logging.WARNING)``."""
from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from kotune.core.redact import mask_credentials

logger = logging.getLogger("kotune")
FORMAT = "[kotune] %(message)s"


class _MaskingStream:
    """A console stream (sys.stdout, sys.stderr) that masks secrets in every write: what no log record
    carries too, such as Hydra's own error lines quoting an override it could not parse."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask_credentials(text) if isinstance(text, str) else text)
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def mask_console() -> None:
    """sys.stdout and sys.stderr through :class:`_MaskingStream` (once) for the rest of the process:
    the kotune command does this first, so no line it or a library prints shows a known secret."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _MaskingStream):
            setattr(sys, name, _MaskingStream(stream))


def _masking_record_factory(factory):
    """Every log record of the process (kotune's, Hydra's launcher listing a job's overrides,
    optuna's) with URL passwords masked before any handler formats it."""
    def make(*args, **kwargs):
        record = factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record: logging reports it itself, later
            return record
        masked = mask_credentials(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return record

    make.kotune_masking = True
    return make


if not getattr(logging.getLogRecordFactory(), "kotune_masking", False):
    logging.setLogRecordFactory(_masking_record_factory(logging.getLogRecordFactory()))


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
    _handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


class _RunLog(logging.FileHandler):
    """A job's run.log: the lines the console shows, masked (kotune/core/redact.py) as they are written."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_credentials(super().format(record))

    def write_lines(self, text: str) -> None:
        with self.lock:  # the handler's own lock: a log line from another thread does not interleave
            if self.stream is None:
                self.stream = self._open()
            self.stream.write(mask_credentials(text) + "\n")
            self.flush()


@contextlib.contextmanager
def run_log(path: str) -> Iterator[None]:
    """kotune's log also into ``path`` (a job's ``run.log``, appended) while the block runs, as the
    console shows it; :func:`say` adds the lines printed for the user."""
    handler = _RunLog(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


def say(text: str, error: bool = False) -> None:
    """A line for the user (the closing table, the error line): printed to stdout (stderr when
    ``error``) and into the open run.log."""
    print(text, file=sys.stderr if error else sys.stdout, flush=True)
    for handler in logger.handlers:
        if isinstance(handler, _RunLog):
            handler.write_lines(text)


def log(msg: str) -> None:
    logger.info(msg)


def warn(msg: str) -> None:
    logger.warning(f"warning: {msg}")


@contextlib.contextmanager
def quieted(*names: str, level: int = logging.WARNING) -> Iterator[None]:
    """The named loggers at ``level`` or above while the block runs: a library's notes that kotune's
    own log says better, or that contradict it (each logger's own level comes back after)."""
    loggers = [logging.getLogger(name) for name in names]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), level))
    try:
        yield
    finally:
        for lg, old in zip(loggers, before):
            lg.setLevel(old)


class _Without(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@contextlib.contextmanager
def without_lines_naming(text: str) -> Iterator[None]:
    """kotune's log lines that name ``text`` left out while the block runs: a temporary folder
    removed after it (a path the reader could not open)."""
    dropped = _Without(text)
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)
