"""Reading local data files and the hub, with errors that name the file and the row.

Records come back as ``(where, row)`` pairs: ``where`` is a line number (JSONL, CSV, TSV) or
``row N`` for elements of a JSON list, so any later validation error can point at the row.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
from typing import Any, Iterator

from tasks.errors import DataError, KotuneError

Record = tuple[str, dict]


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def open_text(path: str):
    """Open a UTF-8 data file; a missing, unreadable or directory path is a DataError naming it."""
    if not os.path.exists(path):
        raise DataError(path, None, "file not found")
    if os.path.isdir(path):
        raise DataError(path, None, "is a directory, expected a data file")
    try:
        return open(path, encoding="utf-8-sig")
    except OSError as e:
        raise DataError(path, None, f"cannot read: {e.strerror}") from None


def file_format(path: str, fmt: str | None = None) -> str:
    if fmt:
        return fmt
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext in ("json", "jsonl", "csv", "tsv"):
        return ext
    raise DataError(path, None, f"unknown file type '.{ext}': use .json, .jsonl, .csv or .tsv "
                                "(or set data.format)")


def read_json(path: str) -> Any:
    with open_text(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(path, e.lineno, f"malformed JSON: {e.msg} (column {e.colno})") from None
        except UnicodeDecodeError:
            raise DataError(path, None, "not UTF-8 text") from None


def read_records(path: str, fmt: str | None = None) -> list[Record]:
    """Rows of a JSON list, JSONL, CSV or TSV file (with a header row) as dicts."""
    fmt = file_format(path, fmt)
    if fmt == "json":
        data = read_json(path)
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise DataError(path, None, "expected a JSON list of objects")
        out = []
        for i, row in enumerate(data):
            if not isinstance(row, dict):
                raise DataError(path, f"row {i}", f"expected an object, got {type(row).__name__}")
            out.append((f"row {i}", row))
        return out
    if fmt == "jsonl":
        out = []
        with open_text(path) as f:
            for n, line in enumerate(text_lines(path, f), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(path, n, f"malformed JSON line: {e.msg}") from None
                if not isinstance(row, dict):
                    raise DataError(path, n, "expected a JSON object")
                out.append((str(n), row))
        return out
    delimiter = "\t" if fmt == "tsv" else ","
    with open_text(path) as f:
        reader = csv.reader(text_lines(path, f), delimiter=delimiter, quoting=csv.QUOTE_MINIMAL)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(path, None, "empty file") from None
        out = []
        for row in reader:
            n = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise DataError(path, n, f"{len(row)} columns, the header has {len(header)} "
                                         f"({delimiter!r}-separated)")
            out.append((str(n), dict(zip(header, row))))
        return out


def text_lines(path: str, f) -> Iterator[str]:
    """The lines of ``f``; bytes that are not UTF-8 become a DataError naming ``path``."""
    try:
        yield from f
    except UnicodeDecodeError:
        raise DataError(path, None, "not UTF-8 text") from None


def field(path: str, where: str, row: dict, dotted: str, *, required: bool = True) -> Any:
    """Look up ``a.b`` in a row; a missing field is an error naming file, row and field."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            if not required:
                return None
            have = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
            raise DataError(path, where, f"missing field '{dotted}' (row has: {have})")
        value = value[part]
    return value


def hub_reachable(timeout: float = 3.0) -> bool:
    """A 3-second TCP probe of the hub, so offline machines fail in seconds, not after retries."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_hub_split(path: str, name: str | None, split: str, revision: str | None = None):
    """A split of a hub dataset (parquet). Returns (datasets.Dataset, revision-or-fingerprint)."""
    import datasets

    explicit_offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if not explicit_offline and not hub_reachable():
        raise KotuneError(
            f"cannot load hub dataset '{path}' ({name}, split {split}): the Hugging Face hub is "
            "unreachable. Point at local files with data.train_file=... data.validation_file=..., "
            "use data=sample, or set HF_HUB_OFFLINE=1 to read a dataset already in the HF cache")
    try:
        ds = datasets.load_dataset(path, name, split=split, revision=revision)
    except Exception as e:  # noqa: BLE001 - the hub raises many types; the user needs one line
        raise KotuneError(
            f"cannot load hub dataset '{path}' ({name}, split {split}): {str(e).splitlines()[0][:200]}. "
            "Offline? Point at local files with data.train_file=... data.validation_file=..., "
            "or use data=sample") from None
    return ds, revision or ds._fingerprint


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON through a temporary file and a rename: readers never see half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_jsonl_atomic(path: str, rows: list[dict]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)
