"""Files kotune writes and fingerprints: JSON, JSON-lines and CSV written atomically (a temporary file,
fsync, rename: a reader sees the old file or the new one), a URL's password masked on the way out,
a CSV's text cells kept from running as spreadsheet formulas, and a file's SHA-256 (the data
fingerprints results files carry)."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from typing import Any, Iterable

from kotune.core.redact import mask_credentials, mask_tree


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON through a temporary file and a rename: readers never see half a file. A URL's
    password anywhere in it (a storage URL in a results file's config) is masked (kotune/core/redact.py)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(mask_tree(obj), f, ensure_ascii=False, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def mask_credentials_in_file(path: str) -> None:
    """Rewrite a text file kotune did not write itself (Hydra's ``.hydra/*.yaml``) with every URL's
    password masked; atomically, and only when something was masked."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return
    masked = mask_credentials(text)
    if masked != text:
        write_text_atomic(path, masked)


def write_text_atomic(path: str, text: str) -> None:
    """A text file written through a ``.tmp<pid>`` file, fsynced, then renamed: the old file or the new."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_jsonl_atomic(path: str, rows: list[dict]) -> None:
    """One JSON object a line, written as :func:`write_json_atomic` writes (a ``.tmp<pid>`` file
    fsynced, then renamed; a dead process's leftover is removed when the next job starts in the
    folder: kotune/core/atomic_dir.py's ``clear_leftovers``)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# a spreadsheet reads a cell starting with one of these as a formula (OWASP's CSV injection list: = + - @,
# a tab, a carriage return; and the full-width forms some spreadsheets take as the same)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell a spreadsheet will not run: text starting with a formula character gets a
    leading single quote (OWASP: ``=1+3`` → ``'=1+3``); a number, or text that is one (``-0.5``), stays
    as it is, and so does a lone character (the leaderboard's ``-`` for no mode runs nothing). None
    is an empty cell."""
    if value is None:
        return ""
    if isinstance(value, (bool, int, float)):
        return value
    text = str(value)
    if len(text) > 1 and text.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def csv_text(header: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """A CSV (RFC 4180: quoted where needed, '\\r\\n' line ends) with every cell through :func:`csv_cell`.
    The line end holds both characters so that a text holding a bare '\\r' is quoted too (with '\\n'
    alone, the csv module writes it bare and a reader breaks the row there)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow([csv_cell(h) for h in header])
    writer.writerows([csv_cell(v) for v in row] for row in rows)
    return buf.getvalue()


def write_csv_atomic(path: str, header: list[str], rows: Iterable[Iterable[Any]]) -> None:
    """:func:`csv_text` written as :func:`write_text_atomic` writes."""
    write_text_atomic(path, csv_text(header, rows))
