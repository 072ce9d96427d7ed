"""Files kotune writes and fingerprints: JSON and JSON-lines written atomically (a temporary file,
fsync, rename: a reader sees the old file or the new one), a URL's password masked on the way out,
and a file's SHA-256 (the data fingerprints results files carry)."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

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
