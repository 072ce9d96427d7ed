"""``action=embed``, the text side: read the texts, tokenize them with offsets, find a target
word's tokens, and write ``embeddings.npy`` + ``index.jsonl`` (and the target's per-layer
vectors with a cosine table). The vectors themselves come from heads/model/feature_cache.py.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from kotune.core.errors import DataError, KotuneError
from tasks.io import KNOWN_TEXT_COLUMNS, column_names, conventional_columns, field, read_records, refuse_nul
from kotune.core.files import write_json_atomic, write_jsonl_atomic
from kotune.core.log import log


@dataclass
class Occurrence:
    """One appearance of the target word: text row, character span, and the tokens covering it."""

    row: int
    start: int
    end: int
    tokens: list[int]


def read_txt_lines(path: str) -> list[str]:
    """Every line of a UTF-8 text file, blank ones included."""
    if not os.path.isfile(path):
        raise DataError(path, None, "file not found")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        lines = raw.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        raise DataError(path, raw[:e.start].count(b"\n") + 1, "not UTF-8 text") from None
    for n, line in enumerate(lines, 1):
        refuse_nul(path, n, line)
    return lines


def read_texts(path: str, column: str | None = "text", fmt: str | None = None,
               quoting: str | None = "auto", option: str = "embed.column",
               default: str = "text") -> list[tuple[str, str]]:
    """``(where, text)`` pairs: one text per line of a .txt file (blank lines skipped), or the
    ``column`` of a CSV/TSV/JSON/JSONL file (``quoting``: auto | none | csv, as data.quoting;
    ``option``: the config key named in errors). ``column=None``: ``default``, else the one
    conventional text column the file has (``KNOWN_TEXT_COLUMNS``)."""
    fmt = fmt or ("txt" if os.path.splitext(path)[1].lower() in (".txt", "") else None)
    if fmt == "txt":
        lines = read_txt_lines(path)
        rows = [(str(n), line) for n, line in enumerate(lines, 1) if line.strip()]
        if len(rows) < len(lines):
            log(f"{path}: skipped {len(lines) - len(rows)} blank line(s)")
    else:
        rows = []
        records = read_records(path, fmt, quoting)
        if column is None:
            known = tuple((name,) for name in KNOWN_TEXT_COLUMNS)
            column = conventional_columns(path, column_names(records), (default,), known, (option,))[0]
        for where, record in records:
            value = field(path, where, record, column)
            if not isinstance(value, str) or not value.strip():
                raise DataError(path, where, f"{option} '{column}': empty or non-text value {value!r}")
            rows.append((where, value))
    if not rows:
        raise DataError(path, None, "no text in the file (empty)")
    return rows


def encode_texts(texts: list[str], tokenizer, max_length: int, token_type_ids: bool):
    """Token ids (``datasets.Dataset``), character offsets per token, and which texts were cut."""
    import datasets

    enc = tokenizer(texts, truncation=True, max_length=max_length, return_offsets_mapping=True,
                    return_token_type_ids=token_type_ids)
    offsets = [[tuple(o) for o in row] for row in enc.pop("offset_mapping")]
    truncated = [max((e for _, e in row), default=0) < len(text.rstrip())
                 for row, text in zip(offsets, texts)]
    return datasets.Dataset.from_dict(dict(enc)), offsets, truncated


def find_target(target: str, texts: list[str], offsets: list[list[tuple[int, int]]]) -> list[Occurrence]:
    """Every appearance of ``target`` with the (sub)word tokens that overlap it; appearances cut
    off by max_length are skipped with a warning."""
    found, cut = [], 0
    for row, (text, spans) in enumerate(zip(texts, offsets)):
        start = text.find(target)
        while start >= 0:
            end = start + len(target)
            tokens = [i for i, (s, e) in enumerate(spans) if e > s and s < end and e > start]
            if tokens:
                found.append(Occurrence(row, start, end, tokens))
            else:
                cut += 1
            start = text.find(target, start + 1)
    if cut:
        log(f"embed.target={target}: {cut} appearance(s) beyond train.max_length skipped")
    if not found:
        raise KotuneError(f"embed.target={target}: the word appears in none of the texts")
    return found


def cosine_by_layer(vectors: np.ndarray) -> dict[str, list[float]]:
    """``vectors`` [M, layers, H] → {"a-b": cosine per layer} for every pair of occurrences."""
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    out = {}
    for a in range(len(unit)):
        for b in range(a + 1, len(unit)):
            out[f"{a}-{b}"] = [round(float(v), 4) for v in (unit[a] * unit[b]).sum(-1)]
    return out


def cosine_lines(target: str, table: dict[str, list[float]], limit: int = 20) -> list[str]:
    """The cosine table for the log: one row per pair of occurrences, one column per layer."""
    if not table:
        return [f"embed.target={target}: one appearance only, nothing to compare"]
    layers = len(next(iter(table.values())))
    lines = [f"cosine similarity of '{target}' between contexts, by layer (L0 = embeddings):",
             "pair    " + "".join(f"{f'L{i}':>7}" for i in range(layers))]
    for pair, values in list(table.items())[:limit]:
        lines.append(f"{pair:<8}" + "".join(f"{v:7.3f}" for v in values))
    if len(table) > limit:
        lines.append(f"... {len(table) - limit} more pairs in target_index.json")
    return lines


def write_embeddings(run_dir: str, vectors: np.ndarray, rows: list[tuple[str, str]], source: str,
                     lengths: list[int], truncated: list[bool]) -> dict[str, str]:
    """``embeddings.npy`` [N, H] (row i = text i) and ``index.jsonl`` (where each row came from)."""
    os.makedirs(run_dir, exist_ok=True)
    paths = {"embeddings_file": os.path.join(run_dir, "embeddings.npy"),
             "index_file": os.path.join(run_dir, "index.jsonl")}
    tmp = paths["embeddings_file"] + f".tmp{os.getpid()}.npy"
    np.save(tmp, vectors.astype(np.float32))
    os.replace(tmp, paths["embeddings_file"])
    write_jsonl_atomic(paths["index_file"], [
        {"row": i, "source": f"{source}:{where}", "text": text, "tokens": n, "truncated": cut}
        for i, ((where, text), n, cut) in enumerate(zip(rows, lengths, truncated))])
    return paths


def write_target(run_dir: str, target: str, vectors: np.ndarray, found: list[Occurrence],
                 texts: list[str], tokens: list[list[str]], table: dict[str, list[float]]) -> dict:
    """``target_vectors.npy`` [M, layers, H] and ``target_index.json`` (contexts, tokens, cosines)."""
    path = os.path.join(run_dir, "target_vectors.npy")
    tmp = path + f".tmp{os.getpid()}.npy"
    np.save(tmp, vectors.astype(np.float32))
    os.replace(tmp, path)
    occurrences = [{"occurrence": k, "row": o.row, "start": o.start, "end": o.end,
                    "context": texts[o.row], "tokens": [tokens[o.row][i] for i in o.tokens]}
                   for k, o in enumerate(found)]
    index = os.path.join(run_dir, "target_index.json")
    write_json_atomic(index, {"target": target, "occurrences": occurrences, "cosine_by_layer": table})
    return {"word": target, "occurrences": len(found), "vectors_file": path, "index_file": index,
            "cosine_by_layer": dict(list(table.items())[:50])}
