"""Does ``train.calibrate=temperature`` make the probabilities trustworthy, beyond the noise, and leave
the predictions alone? Two tasks with kotune's random tiny encoder: hate speech (``--column``,
train.tsv → dev.tsv's 471 comments) and KLUE NLI dev (its 3,000 pairs split: a seeded
``--nli-split`` is the validation split, the rest trains). Each seed trains once with the
calibration; results.json ``calibration`` holds the validation split's ECE (15 equal-width bins),
MCE, Brier score, NLL and accuracy before (the trained head's own probabilities) and after the
temperature, which was fitted on a seeded ``train.calibrate_fraction`` held out of training.

Per task and seed the paired difference d_s = after_s − before_s; its mean and paired standard error
sd(d)/√n; "shown" only where |mean| > 2 SE. Accuracy must be unchanged (the fold keeps the argmax).

    python -m bench.calibration                 # 3 seeds, 400 steps each
    python -m bench.calibration --smoke         # tiny settings, every step (tests/test_bench_smoke.py)

Prints the closing table and ``RESULT calibration_ece_before=… after=… (per task) accuracy_unchanged=…``;
every job is an in-process ``kotune.job.execute`` (what the CLI runs), reused when its run directory
already holds an ok result.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.hate_speech import SMOKE, SMOKE_DATA, hate_speech, model_overrides  # noqa: E402
from bench.jobs import job  # noqa: E402
from bench.stats import difference, spread  # noqa: E402

METRICS = ("ece", "mce", "brier", "nll")


def tasks(a) -> dict[str, list[str]]:
    """Each task's data overrides."""
    data = hate_speech(a)
    nli = os.path.join(a.shared, "data", "klue", "klue-nli-v1.1_dev.json")
    if not os.path.exists(nli):
        raise SystemExit(f"skipped: {nli} not found (../shared absent: --shared DIR)")
    return {"hate speech": ["task=text_cls", f"data.train_file={data}/train.tsv", f"data.validation_file={data}/dev.tsv",
                            "data.text_column=comments", f"data.label_column={a.column}"],
            "KLUE NLI": ["task=nli", f"data.train_file={nli}", f"data.validation_split={a.nli_split}"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    "..", "shared"), help="the ../shared folder")
    p.add_argument("--column", default="hate", help="hate-speech label column")
    p.add_argument("--nli-split", type=float, default=0.3, help="KLUE NLI dev: the seeded share scored")
    p.add_argument("--fraction", type=float, default=0.1, help="train.calibrate_fraction")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_calibration"))
    from bench.common import parse_with_smoke

    a = parse_with_smoke(p, {"steps": SMOKE["steps"], "batch": SMOKE["batch"], "max_length": SMOKE["max_length"],
                             "seeds": SMOKE["seeds"], "fraction": 0.2,
                             "out": os.path.join(tempfile.gettempdir(), "kotune_calibration_smoke")})
    a.shared = os.path.normpath(a.shared)
    import torch

    seeds = [int(s) for s in a.seeds.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    started = time.time()
    found: dict[str, dict] = {}
    for name, data in tasks(a).items():
        entries = []
        for seed in seeds:
            res = job([*data, *model_overrides("tiny", None, a.cache_dir), f"train.learning_rate={a.lr}",
                       f"train.seed={seed}", f"train.max_steps={a.steps}", f"train.batch_size={a.batch}",
                       f"train.max_length={a.max_length}", "train.warmup_ratio=0.1", "save_model=false",
                       "train.calibrate=temperature", f"train.calibrate_fraction={a.fraction}",
                       *(SMOKE_DATA if a.smoke else [])],
                      os.path.join(a.out, f"{name.replace(' ', '_')}_s{seed}"))
            entries.append(res["calibration"])
            e = res["calibration"]
            print(f"{name} seed {seed}: T {e['temperature']:.3f} on {e['held_out']} held out; ECE "
                  f"{e['before']['ece']:.4f} → {e['after']['ece']:.4f}, accuracy {100 * e['before']['accuracy']:.2f} "
                  f"→ {100 * e['after']['accuracy']:.2f} ({e['n_items']} validation items)", flush=True)
        found[name] = {"entries": entries, **{m: difference([e["after"][m] for e in entries],
                                                            [e["before"][m] for e in entries]) for m in METRICS},
                       "accuracy_unchanged": all(e["before"]["accuracy"] == e["after"]["accuracy"] for e in entries)}

    def verdict(d: dict) -> str:
        return "shown" if d["shown"] else "not shown"

    lines = [f"tiny random encoder, {a.steps} steps, lr {a.lr:g}, {len(seeds)} seeds, calibrate_fraction {a.fraction}",
             "", "| task | metric (validation) | before (mean ± sd) | after (mean ± sd) | after − before ± paired SE "
                 "| > 2 SE |", "| --- | --- | --- | --- | --- | --- |"]
    for name, f in found.items():
        for m in METRICS:
            before, after = [e["before"][m] for e in f["entries"]], [e["after"][m] for e in f["entries"]]
            scale = 100.0 if m in ("ece", "mce") else 1.0  # ECE and MCE in points
            lines.append(f"| {name} | {m.upper() if m != 'brier' else 'Brier'}{' ×100' if scale != 1 else ''} | "
                         f"{spread([x * scale for x in before])} | {spread([x * scale for x in after])} | "
                         f"{f[m]['mean'] * scale:+.2f} ± {f[m]['se'] * scale:.2f} | {verdict(f[m])} |")
        temps = [e["temperature"] for e in f["entries"]]
        acc = [100 * e["before"]["accuracy"] for e in f["entries"]]
        lines.append(f"| {name} | accuracy (unchanged: {f['accuracy_unchanged']}) | {spread(acc)} | {spread(acc)} | "
                     f"T {spread(temps)} | |")
    print("\n".join(lines))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "calibration.json"), "w", encoding="utf-8") as fh:
        json.dump({"args": vars(a), "tasks": found}, fh, indent=1, default=str)
    keys = {"hate speech": "hate", "KLUE NLI": "nli"}
    parts = [f"{keys[n]}_ece_before={100 * sum(e['before']['ece'] for e in f['entries']) / len(seeds):.2f} "
             f"{keys[n]}_ece_after={100 * sum(e['after']['ece'] for e in f['entries']) / len(seeds):.2f} "
             f"{keys[n]}_ece_change_se={100 * f['ece']['se']:.2f}" for n, f in found.items()]
    unchanged = all(f["accuracy_unchanged"] for f in found.values())
    print(f"RESULT calibration {' '.join(parts)} accuracy_unchanged={unchanged} seeds={len(seeds)} "
          f"wall_s={time.time() - started:.0f}")
    if not unchanged:
        raise SystemExit("accuracy changed with the calibration: the fold must keep the argmax")


if __name__ == "__main__":
    main()
