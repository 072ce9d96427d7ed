"""Does action=label_issues find labels flipped on purpose, and does training without what it flags
help? The demo set (kotune_data/demo: hate-speech comments → none / offensive / hate) with
``--noise`` (10 %) of its training labels flipped to another class (seeded by ``--noise-seed``);
a ``--folds``-fold cross-validation of the noisy file, then ``action=label_issues`` on it.

- Finding: precision and recall of the flagged rows against the flipped ones, beside chance (a
  random set of as many rows: precision = the noise rate, recall = the flagged share).
- Retraining: per seed, on the noisy file, on it without the flagged rows (``data.exclude_ids``)
  and on the clean file, each scored on the demo dev set (471 comments): mean ± sd over seeds and
  the paired differences (cleaned − noisy, clean − noisy) ± paired SE, "shown" beyond 2 SE.

    python -m bench.label_issues                      # kotune's tiny random encoder (--model tiny)
    python -m bench.label_issues --model mini --model-dir DIR   # the mini encoder of bench/pretrain_gain.py
    python -m bench.label_issues --smoke              # tiny settings, every step (tests/test_bench_smoke.py)
    python -m bench.label_issues --task ner           # KLUE NER dev (../shared) split in two, see below

``--task ner``: the shared KLUE NER dev file's sentences split in two (the first half trains, the
second is the dev set), ``--noise`` (default 5 % with this task) of the training half's entities
given another of the six types (seeded), the folds run with ``task.unit_probabilities=true``.
Finding: the flagged sentences against those holding a flipped entity (precision, recall, chance)
and the flagged characters against the flipped entities' characters; retraining scores entity F1.

Prints the tables and ``RESULT label_issues_precision=… recall=… chance_precision=… cleaned_gain=… se=…``;
every job is an in-process ``kotune.cli.job.execute`` (what the CLI runs), reused when its run directory
already holds an ok result.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.hate_speech import model_overrides  # noqa: E402
from bench.jobs import job  # noqa: E402
from bench.stats import difference, spread  # noqa: E402

SMOKE = dict(steps=4, batch=8, max_length=32, folds=3, seeds="1,2", max_train=150, max_eval=64)


def noisy_copy(src: str, out_dir: str, noise: float, seed: int, max_train: int | None) -> tuple[str, str, set[str]]:
    """The demo training file (its first ``max_train`` rows) as clean.tsv, and as noisy.tsv with a
    seeded ``noise`` share of its labels changed to another class; returns both paths and the flipped ids."""
    with open(src, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    header, body = rows[0], rows[1:][:max_train] if max_train else rows[1:]
    label = header.index("hate")
    classes = sorted({r[label] for r in body})
    rng = random.Random(seed)
    flipped = rng.sample(range(len(body)), round(noise * len(body)))
    noisy = [list(r) for r in body]
    for i in flipped:
        noisy[i][label] = rng.choice([c for c in classes if c != body[i][label]])
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, data in (("clean", body), ("noisy", noisy)):
        path = os.path.join(out_dir, f"{name}.tsv")
        with open(path, "w", encoding="utf-8", newline="") as f:
            csv.writer(f, delimiter="\t", lineterminator="\n").writerows([header, *data])
        paths.append(path)
    return paths[0], paths[1], {body[i][header.index("id")] for i in flipped}


def noisy_ner_copy(src: str, out_dir: str, noise: float, seed: int, max_train: int | None
                   ) -> tuple[str, str, str, set[str], set[tuple[str, int]]]:
    """KLUE NER's TSV (``src``) split in two by order (train, dev), the train half as clean.tsv and as
    noisy.tsv with a seeded ``noise`` share of its entities turned into another type; returns the
    three paths, the ids of the sentences holding a flipped entity and their flipped (id, character)s."""
    with open(src, encoding="utf-8") as f:
        text = f.read()
    blocks = [b for b in text.split("\n\n") if b.strip()]
    sentences = []  # (header lines, [[char, tag], ...], guid)
    for block in blocks:
        lines = block.split("\n")
        head = [ln for ln in lines if ln.startswith("##")]
        rows = [ln.split("\t") for ln in lines if ln and not ln.startswith("##")]
        if rows:
            sentences.append((head, rows, head[-1][3:].split("\t")[0]))
    half = len(sentences) // 2
    train, dev = sentences[:half][:max_train] if max_train else sentences[:half], sentences[half:]
    entities = [(s, k) for s, (_, rows, _) in enumerate(train) for k, (_, tag) in enumerate(rows) if tag.startswith("B-")]
    types = sorted({tag[2:] for _, rows, _ in train for _, tag in rows if tag != "O"})
    rng = random.Random(seed)
    chosen = rng.sample(entities, round(noise * len(entities)))
    noisy = [(head, [list(r) for r in rows], guid) for head, rows, guid in train]
    ids, chars = set(), set()
    for s, k in chosen:
        rows, guid = noisy[s][1], noisy[s][2]
        old = rows[k][1][2:]
        new = rng.choice([t for t in types if t != old])
        end = k + 1
        while end < len(rows) and rows[end][1] == f"I-{old}":
            end += 1
        for j in range(k, end):
            rows[j][1] = rows[j][1][:2] + new
            chars.add((guid, j))
        ids.add(guid)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, data in (("clean", train), ("noisy", noisy), ("dev", dev)):
        path = os.path.join(out_dir, f"{name}.tsv")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join("\n".join(head + ["\t".join(r) for r in rows]) + "\n\n" for head, rows, _ in data))
        paths.append(path)
    return paths[0], paths[1], paths[2], ids, chars


def main() -> None:
    from bench.common import parse_with_smoke
    from kotune_data import data_path

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="text_cls", choices=("text_cls", "ner"))
    p.add_argument("--shared", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    "..", "shared"), help="the ../shared folder (--task ner)")
    p.add_argument("--model", default="tiny", choices=("tiny", "mini"))
    p.add_argument("--model-dir", help="the pretrained mini encoder's directory (bench/pretrain_gain.py's model/)")
    p.add_argument("--noise", type=float, default=None, help="default 0.1 (text_cls), 0.05 (ner)")
    p.add_argument("--noise-seed", type=int, default=0)
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--max-train", type=int, default=None, help="the first N rows of the demo training file")
    p.add_argument("--max-eval", type=int, default=None, help="the first N rows of the demo dev file")
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_label_issues"))
    a = parse_with_smoke(p, {**SMOKE, "out": os.path.join(tempfile.gettempdir(), "kotune_label_issues_smoke")})
    started = time.time()
    ner = a.task == "ner"
    if a.noise is None:
        a.noise = 0.05 if ner else 0.1
    flipped_chars: set = set()
    if ner:
        src = os.path.join(os.path.normpath(a.shared), "data", "klue", "klue-ner-v1.1_dev.tsv")
        if not os.path.isfile(src):
            raise SystemExit(f"skipped: {src} not found (../shared absent: --shared DIR)")
        a.out = a.out.rstrip(os.sep) + "_ner"
        clean, noisy, dev, flipped, flipped_chars = noisy_ner_copy(src, os.path.join(a.out, "data"), a.noise,
                                                                   a.noise_seed, a.max_train)
        task_args, metrics = ["task=ner", "data=hub", "task.unit_probabilities=true"], ("entity_f1", "char_f1")
    else:
        clean, noisy, flipped = noisy_copy(data_path("demo/train.tsv"), os.path.join(a.out, "data"), a.noise,
                                           a.noise_seed, a.max_train)
        dev = data_path("demo/dev.tsv")
        task_args, metrics = ["task=text_cls", "data=demo"], ("macro_f1", "accuracy")
    seeds = [int(s) for s in a.seeds.split(",")]

    def training(seed: int) -> list[str]:
        return [*task_args, *model_overrides(a.model, a.model_dir, a.cache_dir),
                f"train.learning_rate={a.lr}", f"train.seed={seed}", f"train.max_steps={a.steps}",
                f"train.batch_size={a.batch}", f"train.max_length={a.max_length}", "train.warmup_ratio=0.1",
                "save_model=false", *([f"data.max_eval_samples={a.max_eval}"] if a.max_eval else [])]

    cv = os.path.join(a.out, "cv")
    for fold in range(a.folds):
        job([*training(seeds[0]), f"data.train_file={noisy}", f"data.folds={a.folds}", f"data.fold={fold}",
             "data.validation_file=null", "data.max_eval_samples=null"], os.path.join(cv, f"fold={fold}"))
    res = job(["action=label_issues", f"label_issues.runs={cv}", f"cache_dir={a.cache_dir}"],
              os.path.join(a.out, "issues"))
    summary = res["label_issues"]
    flagged = {line.strip() for line in open(summary["files"]["ids"], encoding="utf-8") if line.strip()}
    n = summary["n_rows"]
    hits = len(flagged & flipped)
    precision = hits / len(flagged) if flagged else 0.0
    recall = hits / len(flipped) if flipped else 0.0
    chance_recall = len(flagged) / n
    unit_line = []
    if ner:  # the flagged characters against the flipped entities' characters
        with open(summary["files"]["jsonl"], encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        units = {(r["id"], k) for r in rows for k in r["positions"]}
        unit_hits = len(units & flipped_chars)
        top = [r["id"] for r in rows[:len(flipped)]]  # the lowest-quality sentences, as many as hold a flip
        top_hits = len(set(top) & flipped)
        unit_line = [(f"| label_issues: the {len(top):,} lowest-quality sentences | {len(top):,} | "
                      f"{100 * top_hits / max(len(top), 1):.1f} % | {100 * top_hits / max(len(flipped), 1):.1f} % |"),
                     (f"| chance (as many random sentences) | {len(top):,} | {100 * len(flipped) / n:.1f} % | "
                      f"{100 * len(top) / n:.1f} % |")]
        unit_line += [(f"| label_issues: characters | {len(units):,} | {100 * unit_hits / max(len(units), 1):.1f} % | "
                      f"{100 * unit_hits / max(len(flipped_chars), 1):.1f} % |"),
                     (f"| chance: characters | {len(units):,} | {100 * len(flipped_chars) / summary['n_units']:.1f} % | "
                      f"{100 * len(units) / summary['n_units']:.1f} % |")]

    arms = {"noisy": [f"data.train_file={noisy}"],
            "cleaned": [f"data.train_file={noisy}", f"data.exclude_ids={summary['files']['ids']}"],
            "clean": [f"data.train_file={clean}"]}
    if not flagged:
        arms.pop("cleaned")  # nothing flagged: the cleaned file is the noisy one
    scores: dict[str, dict[str, list[float]]] = {}
    for arm, data in arms.items():
        runs = [job([*training(s), *data, f"data.validation_file={dev}"], os.path.join(a.out, f"{arm}_s{s}"))
                for s in seeds]
        scores[arm] = {m: [r["metrics"][m] for r in runs] for m in metrics}
    gains = {arm: {m: difference(scores[arm][m], scores["noisy"][m]) for m in metrics}
             for arm in arms if arm != "noisy"}

    def verdict(g: dict) -> str:
        return "shown" if g["shown"] else "not shown"

    what = (f"KLUE NER dev's first half {n:,} sentences, {len(flipped)} with an entity's type flipped "
            f"({a.noise:.0%} of entities" if ner else f"demo train {n:,} rows, {len(flipped)} labels flipped ({a.noise:.0%}")
    lines = [f"{what}, seed {a.noise_seed}); {a.model} encoder, {a.steps} steps, lr {a.lr:g}, {a.folds} folds; "
             f"dev {a.max_eval or ('its second half' if ner else 471)}, {len(seeds)} seeds",
             "", "| finding the flipped rows | flagged | precision | recall |", "| --- | --- | --- | --- |",
             f"| label_issues | {len(flagged):,} | {100 * precision:.1f} % | {100 * recall:.1f} % |",
             f"| chance (as many random rows) | {len(flagged):,} | {100 * len(flipped) / n:.1f} % | "
             f"{100 * chance_recall:.1f} % |", *unit_line,
             "", f"| trained on (dev) | rows | {metrics[0]} | {metrics[1]} | {metrics[0]} − noisy ± paired SE | > 2 SE |",
             "| --- | --- | --- | --- | --- | --- |"]
    sizes = {"noisy": n, "cleaned": n - len(flagged), "clean": n}
    for arm in arms:
        g = gains.get(arm, {}).get(metrics[0])
        lines.append(f"| {arm} | {sizes[arm]:,} | {spread(scores[arm][metrics[0]])} | {spread(scores[arm][metrics[1]])} | "
                     + (f"{g['mean']:+.2f} ± {g['se']:.2f} | {verdict(g)} |" if g else "— | — |"))
    print("\n".join(lines))
    out = {"args": vars(a), "n_rows": n, "flipped": len(flipped), "flagged": len(flagged), "hits": hits,
           "precision": precision, "recall": recall, "chance_precision": len(flipped) / n,
           "chance_recall": chance_recall, "per_class": summary["per_class"], "scores": scores,
           "gains": gains, "minutes": (time.time() - started) / 60}
    with open(os.path.join(a.out, "label_issues_bench.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    cleaned = gains.get("cleaned", {}).get(metrics[0]) or {"mean": 0.0, "se": float("nan")}
    print(f"bench: {out['minutes']:.1f} min")
    print(f"RESULT label_issues_precision={100 * precision:.1f} recall={100 * recall:.1f} "
          f"chance_precision={100 * len(flipped) / n:.1f} cleaned_gain={cleaned['mean']:.2f} se={cleaned['se']:.2f} "
          f"clean_gain={gains['clean'][metrics[0]]['mean']:.2f}")


if __name__ == "__main__":
    main()
