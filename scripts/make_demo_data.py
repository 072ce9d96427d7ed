"""Draw the demo set (kotune_data/demo/train.tsv, dev.tsv) from the Korean hate-speech corpus.

    python scripts/make_demo_data.py [--source ../shared/data/hate-speech] [--train-rows 5000]

train.tsv: a stratified sample of the source's train.tsv (each label keeps its share), seeded;
dev.tsv: the source's whole dev.tsv. Each row keeps the comment and its ``hate`` label (none /
offensive / hate) under the source's column names, plus an ``id`` naming its source file and row
(``train-01234`` is data row 1234 of train.tsv, counted from 0). A train comment whose text is also
in dev is never drawn. Reads the source in place (TSV, quotes are text) and writes UTF-8 TSV; the
few comments the source wrote CSV-style (``"a ""b"" c"``) are written as their text (``a "b" c``).
"""
from __future__ import annotations

import argparse
import csv
import os
import random
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kotune_data import data_path  # noqa: E402
from tasks.io import CSV_QUOTED  # noqa: E402

COLUMNS = ("comments", "hate")


def read_rows(path: str) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def unquote(text: str) -> str:
    """A field the source wrote CSV-style as its text; any other field as it is."""
    return next(csv.reader([text]))[0] if CSV_QUOTED.match(text) else text


def stratified_sample(rows: list[tuple[int, dict]], n: int, seed: int) -> list[tuple[int, dict]]:
    """``n`` rows (±1 per label from rounding) drawn per label in proportion, in source order."""
    by_label: dict[str, list[tuple[int, dict]]] = defaultdict(list)
    for item in rows:
        by_label[item[1]["hate"]].append(item)
    rng = random.Random(seed)
    drawn = []
    for label in sorted(by_label):
        group = by_label[label]
        drawn += rng.sample(group, round(n * len(group) / len(rows)))
    return sorted(drawn, key=lambda item: item[0])


def write_tsv(path: str, split: str, rows: list[tuple[int, dict]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("\t".join(("id",) + COLUMNS) + "\n")
        for index, row in rows:
            fields = [unquote(row[c]) for c in COLUMNS]
            assert not any(ch in v for v in fields for ch in "\t\n\r"), (split, index)
            f.write("\t".join([f"{split}-{index:05d}"] + fields) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=os.path.join(os.path.dirname(ROOT), "shared", "data", "hate-speech"))
    parser.add_argument("--train-rows", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=data_path("demo"))
    args = parser.parse_args()
    train = read_rows(os.path.join(args.source, "train.tsv"))
    dev = list(enumerate(read_rows(os.path.join(args.source, "dev.tsv"))))
    dev_texts = {unquote(row["comments"]).strip() for _, row in dev}
    pool = [(i, row) for i, row in enumerate(train) if unquote(row["comments"]).strip() not in dev_texts]
    sample = stratified_sample(pool, args.train_rows, args.seed)
    write_tsv(os.path.join(args.out, "train.tsv"), "train", sample)
    write_tsv(os.path.join(args.out, "dev.tsv"), "dev", dev)
    print(f"train.tsv: {len(sample)} of {len(train)} rows; dev.tsv: {len(dev)} rows -> {args.out}")


if __name__ == "__main__":
    main()
