"""Reading local data files and the hub, with errors that name the file and the row.

Records come back as ``(where, row)`` pairs: ``where`` is a line number (JSONL, CSV, TSV) or
``row N`` for elements of a JSON list, so any later validation error can point at the row.
"""
from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterator

from kotune.core.errors import ConfigError, DataError, KotuneError
from kotune.core.log import log, warn

Record = tuple[str, dict]
QUOTINGS = ("auto", "none", "csv")
MAX_LISTED_COLUMNS = 12
CSV_QUOTED = re.compile(r'^"(?:[^"]|"")*""(?:[^"]|"")*"$')  # "…""…"": a field written CSV-style
# Conventional names of a text column (run_glue's, KLUE's, Hugging Face datasets'), tried when the
# task's default column is absent and no data.<role>_column is set: a fixed list, not a guess —
# exactly one present is used (and logged), several present is an error asking for the setting.
KNOWN_TEXT_COLUMNS = ("sentence", "text", "document")
KNOWN_PAIR_COLUMNS = (("text", "text_pair"), ("sentence1", "sentence2"), ("premise", "hypothesis"))


@dataclass
class ReadOptions:
    """How to read CSV/TSV/JSON files (``data.format``, ``data.quoting``)."""

    format: str | None = None
    quoting: str = "auto"

    def __post_init__(self):
        self.quoting = str(self.quoting or "auto")
        if self.quoting not in QUOTINGS:
            raise ConfigError(f"data.quoting={self.quoting}: must be one of {', '.join(QUOTINGS)} "
                              "(auto: none for .tsv, RFC 4180 quoting for .csv)")


def resolve_quoting(fmt: str, quoting: str | None) -> str:
    """``none`` (quotes are ordinary characters) or ``csv`` (RFC 4180); auto: none for TSV, since
    tab-separated corpora write literal quotes inside fields."""
    quoting = ReadOptions(quoting=quoting).quoting
    if quoting == "auto":
        return "none" if fmt == "tsv" else "csv"
    return quoting


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
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(path, e.lineno, f"malformed JSON: {e.msg} (column {e.colno})") from None
        except UnicodeDecodeError:
            raise DataError(path, None, "not UTF-8 text") from None
    for where, value in ((f"row {i}", row) for i, row in enumerate(data)) if isinstance(data, list) else [(None, data)]:
        refuse_nul_in(path, where, value)  # a list's element is a row, as read_records names it
    return data


def read_records(path: str, fmt: str | None = None, quoting: str | None = "auto") -> list[Record]:
    """Rows of a JSON list, JSONL, CSV or TSV file (with a header row) as dicts; ``quoting``
    (auto | none | csv) applies to CSV and TSV."""
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
                refuse_nul_in(path, n, row)
                out.append((str(n), row))
        return out
    return _read_delimited(path, fmt, resolve_quoting(fmt, quoting))


def _read_delimited(path: str, fmt: str, quoting: str) -> list[Record]:
    delimiter, sep_name = ("\t", "tab") if fmt == "tsv" else (",", "comma")
    other = "csv" if quoting == "none" else "none"
    hint = ("if fields are CSV-quoted (\"…\"\"…\"), set data.quoting=csv" if quoting == "none"
            else "if fields hold literal quotes (not CSV-quoted), set data.quoting=none")
    with open_text(path) as f:
        reader = csv.reader(text_lines(path, f), delimiter=delimiter,
                            quoting=csv.QUOTE_NONE if quoting == "none" else csv.QUOTE_MINIMAL)
        out, looks_quoted = [], []
        read = 0  # lines read so far: a row starts on the next (a quoted field may span lines)
        try:
            header = next(reader, None)
            if header is None:
                raise DataError(path, None, "empty file")
            read = reader.line_num
            for row in reader:
                n, read = read + 1, reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise DataError(path, n, f"{len(row)} columns, the header has {len(header)} "
                                             f"({sep_name}-separated, data.quoting={quoting}); {hint}")
                if quoting == "none" and any(CSV_QUOTED.match(c) for c in row):
                    looks_quoted.append(n)
                out.append((str(n), dict(zip(header, row))))
        except csv.Error as e:
            raise DataError(path, read + 1, f"{e} (data.quoting={quoting}); try data.quoting={other}") from None
    if looks_quoted:
        warn(f"{path}: {len(looks_quoted)} row(s) have fields that look CSV-quoted (\"…\"\"…\"), first at "
             f"line {looks_quoted[0]}; read literally (data.quoting=none): set data.quoting=csv if the file "
             "was written CSV-style")
    return out


def require_columns(path: str, records: list[Record], columns: dict[str, str],
                    options: dict[str, str] | None = None, origins: dict[str, str] | None = None) -> None:
    """Every column the task's column map needs must be in the file: ``FILE has no column 'x'
    (columns: …; set OPTION=)``. ``columns`` maps a role (text, label) to its column name (a dotted
    name is checked by its first part); ``options`` names the setting that chooses each role's column;
    ``origins`` says where a role's column name came from (a checkpoint's training file)."""
    names = column_names(records)
    if not records:
        return
    for role, column in columns.items():
        if column is None or column.split(".")[0] in names:
            continue
        listed = ", ".join(names[:MAX_LISTED_COLUMNS]) + (", …" if len(names) > MAX_LISTED_COLUMNS else "")
        option = (options or {}).get(role, f"task.columns.{role}")
        quoted = (" — the header looks CSV-quoted: set data.quoting=csv"
                  if names and all(n.startswith('"') and n.endswith('"') for n in names) else "")
        origin = f"'{column}' is {origins[role]}: " if origins and role in origins else ""
        raise DataError(path, None, f"has no column '{column}' (columns: {listed}; {origin}set {option}=){quoted}")


def has_columns(present: list[str], columns: dict[str, Any]) -> bool:
    """Whether a file with columns ``present`` has every column of ``columns`` (role → a name, a
    list of names or None; a dotted name counts by its first part, as require_columns reads it)."""
    names = [n for c in columns.values() if c is not None for n in ([c] if isinstance(c, str) else c)]
    return all(str(n).split(".")[0] in present for n in names)


def column_names(records: list[Record]) -> list[str]:
    """The columns the rows of a file have, in the order they first appear."""
    present: dict[str, None] = {}
    for _, row in records:
        present.update(dict.fromkeys(row))
    return list(present)


def conventional_columns(path: str, present: list[str], wanted: tuple[str, ...],
                         known: tuple[tuple[str, ...], ...], options: tuple[str, ...]) -> tuple[str, ...]:
    """The columns to read for roles whose default names (``wanted``) the file lacks: the one entry
    of ``known`` whose names are all present (logged); ``wanted`` itself when none is (the caller's
    missing-column error follows); several is a DataError naming them and the settings
    (``options``) that choose."""
    if all(name in present for name in wanted):
        return wanted
    found = [names for names in known if all(name in present for name in names)]
    if len(found) > 1:
        listed = " or ".join("/".join(names) for names in found)
        raise DataError(path, None, f"has no column {'/'.join(repr(n) for n in wanted)} and could be read as "
                                    f"{listed}: set {' and '.join(f'{o}=' for o in options)}")
    if found:
        log(f"{path}: no {'/'.join(wanted)} column: reading {'/'.join(found[0])}, the conventional name "
            f"({' and '.join(f'{o}=' for o in options)} names another)")
        return found[0]
    return wanted


def text_lines(path: str, f) -> Iterator[str]:
    """The lines of ``f``; bytes that are not UTF-8, or a NUL, become a DataError naming ``path``
    (and the line)."""
    try:
        for n, line in enumerate(f, 1):
            refuse_nul(path, n, line)
            yield line
    except UnicodeDecodeError:
        raise DataError(path, None, "not UTF-8 text") from None


def refuse_nul(path: str, where: str | int, text: str, what: str = "") -> None:
    """A NUL character (``\\x00``) in a text is a DataError naming the file, the row and the column
    (``what``: the field it is in): a tokenizer would read it silently, a binary file would pass as text."""
    column = text.find("\x00")
    if column >= 0:
        raise DataError(path, where, f"{what}a NUL character (\\x00) at column {column + 1}: not text "
                                     "(a binary file, or a broken export?)")


def refuse_nul_in(path: str, where: str | int | None, value: Any, at: str = "") -> None:
    """:func:`refuse_nul` on every string of a parsed JSON value (``\\u0000`` escapes decode to NUL),
    naming the field (``a.b``, ``data[0].context``)."""
    if isinstance(value, str):
        refuse_nul(path, where, value, f"field '{at}': " if at else "")
    elif isinstance(value, dict):
        for key, item in value.items():
            refuse_nul_in(path, where, item, f"{at}.{key}" if at else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            refuse_nul_in(path, where, item, f"{at}[{i}]")


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
