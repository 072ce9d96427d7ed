"""Directories that appear whole or not at all: a saved model (``<run>/model``), a native or ONNX
export. :func:`written_whole` hands out a temporary sibling (``model.tmp-<host>-<pid>``) to write into; when
everything is written it adds ``kotune_manifest.json`` (every file's size and sha256) last, fsyncs
the files and the directory, and swaps the new directory into place: one atomic exchange of the two
names where the system has it (Linux ``renameat2``), else the old one renamed to ``model.old-<host>-<pid>``,
the new one renamed in and the old one removed. A save killed at any point leaves the previous
directory as it was; :func:`settle` (on the next save, load or run) removes a dead process's
leftovers and, should a save have died between the two renames, puts a whole directory back. A
process is judged dead only on its own host: on a file system several machines share (torchrun
across nodes, SLURM workers), another host's pid says nothing here, so its staging directories
are left alone.

:func:`verify_manifest` is the check on load: a file the manifest lists that is missing, of another
size or (up to ``DIGEST_LIMIT`` bytes) of another sha256 is a one-line :class:`KotuneError` naming
the file. Directories saved before manifests existed (no manifest, and their spec file does not
say one was written) load as before.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import re
import shutil
import socket
import time
from typing import Iterator

from kotune.core.errors import KotuneError
from kotune.core.files import sha256_of
from kotune.core.log import log

MANIFEST = "kotune_manifest.json"
MANIFEST_FORMAT = 1
# On load, files up to this size are checked by sha256, larger ones (an encoder's weights) by size:
# hashing reads the whole file (~0.5 GB/s on one core), a size check costs nothing. Saves record
# every file's digest.
DIGEST_LIMIT = 64 * 1024 ** 2
# model.tmp-node1-123, model.old-node1-123 (model.tmp-123: a save from before the host was named)
STAGING = re.compile(r"^(?P<final>.+)\.(?P<kind>tmp|old)-(?:(?P<host>\w+)-)?(?P<pid>\d+)$")
HOST = re.sub(r"\W", "_", socket.gethostname())[:40] or "host"
TMP_FILE = re.compile(r"^.+\.tmp(?P<pid>\d+)$")  # tasks.io.write_json_atomic's predictions.jsonl.tmp123
RENAME_EXCHANGE = 2


def sha256_and_sync(path: str) -> tuple[int, str]:
    """A file's size and sha256, read once; the file is fsynced on the way (it was just written)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
        os.fsync(f.fileno())
        return f.tell(), h.hexdigest()


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a directory; the rename is still atomic
        pass
    finally:
        os.close(fd)


def listed_files(folder: str) -> list[str]:
    """Every file under ``folder`` (relative, ``/``-separated, sorted), the manifest aside."""
    out = []
    for root, _, files in os.walk(folder):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def write_manifest(folder: str, kind: str) -> dict:
    """``folder``'s manifest (format, kind, each file's size and sha256), written last; every file
    and directory under ``folder`` is fsynced first."""
    files = {}
    for rel in listed_files(folder):
        size, digest = sha256_and_sync(os.path.join(folder, rel))
        files[rel] = {"size": size, "sha256": digest}
    manifest = {"format": MANIFEST_FORMAT, "kind": kind, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "files": files}
    path = os.path.join(folder, MANIFEST)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, ensure_ascii=False, indent=2)
        f.flush()
        os.fsync(f.fileno())
    for root, _, _ in os.walk(folder, topdown=False):
        fsync_dir(root)
    return manifest


def has_manifest(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, MANIFEST))


def verify_manifest(folder: str, required: bool, remedy: str) -> dict | None:
    """Check ``folder`` against its manifest: every listed file present, of the recorded size and,
    up to ``DIGEST_LIMIT`` bytes, of the recorded sha256. ``required``: the folder's own spec says a
    manifest was written (a missing one means an altered directory). Returns the manifest, or None
    for a folder saved before manifests (not ``required``, none there). Any mismatch is one line:
    ``FOLDER/FILE: 12 bytes, the manifest says 34: an interrupted or altered save; REMEDY``."""
    path = os.path.join(folder, MANIFEST)
    why = f"an interrupted or altered save; {remedy}"
    if not os.path.isfile(path):
        if required:
            raise KotuneError(f"{folder}: no {MANIFEST}, though its spec says one was written: {why}")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
        entries = [(str(rel), int(e["size"]), e.get("sha256")) for rel, e in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise KotuneError(f"{path}: unreadable manifest ({type(e).__name__}): {why}") from None
    for rel, size, digest in entries:
        where = os.path.join(folder, rel)
        if os.path.isabs(rel) or ".." in rel.split("/"):
            raise KotuneError(f"{path}: lists '{rel}', outside the directory: {why}")
        if not os.path.isfile(where):
            raise KotuneError(f"{where}: missing, the manifest lists it ({size} bytes): {why}")
        actual = os.path.getsize(where)
        if actual != size:
            raise KotuneError(f"{where}: {actual} bytes, the manifest says {size}: {why}")
        if digest and size <= DIGEST_LIMIT and sha256_of(where) != digest:
            raise KotuneError(f"{where}: its sha256 differs from the manifest's ({size} bytes both): {why}")
    return manifest


def manifest_lists(folder: str, name: str) -> bool | None:
    """Whether ``folder``'s manifest lists the file ``name``; None when there is no manifest."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return name in json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


# ---- writing a directory whole --------------------------------------------------------------------
def dead_process(m: re.Match) -> bool:
    """A staging name's process has ended: its pid is not running on this host, which is its own
    (a name from another host is never judged dead here)."""
    return m["host"] in (None, HOST) and not pid_alive(int(m["pid"]))


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True


def _exchange(a: str, b: str) -> bool:
    """Swap two paths' names in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or file system has no such call."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE) == 0


def swap_into_place(new: str, final: str) -> None:
    """``new`` (a whole directory) under the name ``final``; whatever was there is removed. At no
    moment is ``final`` a mix of both; where an atomic exchange is not available, ``final`` is
    missing between two renames (:func:`settle` repairs a process killed there)."""
    parent = os.path.dirname(os.path.abspath(final))
    old = f"{final}.old-{HOST}-{os.getpid()}"
    if not os.path.lexists(final):
        os.rename(new, final)
    elif _exchange(new, final):
        os.rename(new, old)  # ``new`` now holds the previous directory
    else:
        os.rename(final, old)
        os.rename(new, final)
    fsync_dir(parent)
    if os.path.lexists(old):
        remove(old)


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


def leftovers(final: str) -> list[tuple[str, str]]:
    """``(kind, path)`` of dead processes' staging siblings of ``final`` (``tmp``: a save that never
    finished; ``old``: the directory a finished save replaced), newest first."""
    parent, name = os.path.split(os.path.abspath(final))
    try:
        entries = os.listdir(parent)
    except OSError:
        return []
    found = []
    for entry in entries:
        m = STAGING.match(entry)
        if m and m["final"] == name and dead_process(m):
            path = os.path.join(parent, entry)
            found.append((os.path.getmtime(path) if os.path.exists(path) else 0.0, m["kind"], path))
    return [(kind, path) for _, kind, path in sorted(found, reverse=True)]


def settle(final: str) -> None:
    """Tidy what a killed save left beside ``final``: if ``final`` is missing (killed between the two
    renames of :func:`swap_into_place`), the newest whole staging directory takes its name (a
    finished new one — its manifest written — before the old one); every other leftover of a dead
    process is removed. Quiet when there is nothing to do; a read-only parent is left as it is."""
    found = leftovers(final)
    if not found:
        return
    if not os.path.lexists(final):
        whole = [p for k, p in found if k == "tmp" and has_manifest(p)] + [p for k, p in found if k == "old"]
        if whole:
            try:
                os.rename(whole[0], final)
            except OSError as e:
                raise KotuneError(f"{final} is missing and {whole[0]} holds a whole save (a save was killed while "
                                  f"swapping it in), but renaming it back fails: {e.strerror}; rename it "
                                  f"to {os.path.basename(final)} by hand") from None
            log(f"{final}: restored from {os.path.basename(whole[0])} (a save was killed while swapping it in)")
            found = [(k, p) for k, p in found if p != whole[0]]
    for _, path in found:
        remove(path)


@contextlib.contextmanager
def written_whole(final: str, kind: str) -> Iterator[str]:
    """``with written_whole(d, "kotune-model") as tmp:`` write the directory's files into ``tmp``;
    on leaving the block the manifest is added and ``tmp`` replaces ``d`` whole. An exception (or a
    killed process) leaves ``d`` as it was; the staging directory is removed (on the next
    :func:`settle` for a killed one)."""
    final = os.path.normpath(final)
    os.makedirs(os.path.dirname(os.path.abspath(final)), exist_ok=True)
    settle(final)
    staging = f"{final}.tmp-{HOST}-{os.getpid()}"
    remove(staging)
    os.makedirs(staging)
    try:
        yield staging
        write_manifest(staging, kind)
        swap_into_place(staging, final)
    except BaseException:
        remove(staging)
        raise


def clear_leftovers(folder: str) -> list[str]:
    """At the start of a run in ``folder``: remove what dead processes left there — the temporary
    files of an atomic write (``predictions.jsonl.tmp123``) and the staging directories of a save
    (``model.tmp-123``; a missing directory is restored first, :func:`settle`). Returns the names removed."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return []
    removed = []
    for entry in entries:
        path = os.path.join(folder, entry)
        m = TMP_FILE.match(entry)
        if m and os.path.isfile(path) and not pid_alive(int(m["pid"])):
            remove(path)
            removed.append(entry)
            continue
        m = STAGING.match(entry)
        if m and dead_process(m):
            settle(os.path.join(folder, m["final"]))
            if not os.path.lexists(path):
                removed.append(entry)
    return removed
