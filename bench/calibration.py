"""Does ``train.calibrate=temperature`` make the probabilities trustworthy, beyond the noise, and leave
the predictions alone, and does the int8 ONNX export keep the calibration? Two tasks, with kotune's
random tiny encoder (``--model tiny``) or the mini pretrained encoder of bench/pretrain_gain.py
(``--model mini --model-dir DIR``): hate speech (``--column``,
train.tsv → dev.tsv's 471 comments) and KLUE NLI dev (its 3,000 pairs split: a seeded
``--nli-split`` is the validation split, the rest trains). Each seed trains once with the
calibration; results.json ``calibration`` holds the validation split's ECE (15 equal-width bins),
MCE, Brier score, NLL and accuracy before (the trained head's own probabilities) and after the
temperature, which was fitted on a seeded ``train.calibrate_fraction`` held out of training.
Each calibrated model is then exported (``action=export export.format=onnx export.quantize=int8``)
and its int8 copy evaluated on the same validation split (``action=eval checkpoint=<export>
onnx.file=model_int8.onnx``): the ECE and accuracy of its predictions.jsonl probabilities
(tasks/calibration_metrics.py) beside the same measure of the fp32 model's own predictions.jsonl
(which equals results.json's after-calibration figures up to the file's 4-digit rounding), paired per seed.

Per task and seed the paired difference d_s = after_s − before_s; its mean and paired standard error
sd(d)/√n; "shown" only where |mean| > 2 SE. Accuracy must be unchanged (the fold keeps the argmax).

    python -m bench.calibration                 # 3 seeds, 400 steps each, the tiny encoder
    python -m bench.calibration --model mini --model-dir DIR --seeds 1,2,3,4,5
    python -m bench.calibration --smoke         # tiny settings, every step (tests/test_bench_smoke.py)

Prints the closing table and ``RESULT calibration model=… hate_ece_before=… hate_ece_after=… hate_ece_int8=…
(per task) accuracy_unchanged=…``;
every job is an in-process ``kotune.cli.job.execute`` (what the CLI runs), reused when its run directory
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
from tasks.calibration_metrics import calibration_scores  # noqa: E402

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


def prediction_scores(path: str) -> dict:
    """ECE, MCE, Brier, NLL and accuracy of a predictions.jsonl's probabilities against its gold labels.
    The file's probabilities are rounded (4 digits): each row is renormalised and its predicted label
    put first, so that a tie the rounding made (a near-uniform row) still scores the model's own argmax."""
    probs, labels, ids = [], [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            names = [str(r["prediction"]), *(n for n in r["probabilities"] if n != str(r["prediction"]))]
            row = [float(r["probabilities"][n]) for n in names]
            total = sum(row) or 1.0
            probs.append([x / total for x in row])
            labels.append(names.index(str(r["gold"])))
            ids.append(str(r["id"]))
    return {**calibration_scores(probs, labels), "n_items": len(labels), "ids": ids}


def int8_scores(run_dir: str, data: list[str], seed: int, a) -> dict:
    """The calibrated run exported as int8 ONNX and evaluated on its validation split (``train.seed``
    seeds KLUE NLI's ``data.validation_split``, as in training): its scores."""
    export = os.path.join(run_dir, "onnx")
    job(["action=export", f"checkpoint={run_dir}", "export.format=onnx", "export.quantize=int8",
         f"export.dir={export}", "export.overwrite=true", f"cache_dir={a.cache_dir}"], run_dir + "_export")
    evaluated = run_dir + "_int8"
    job(["action=eval", f"checkpoint={export}", "onnx.file=model_int8.onnx", *data, f"cache_dir={a.cache_dir}",
         f"train.max_length={a.max_length}", f"train.seed={seed}", *(SMOKE_DATA if a.smoke else [])], evaluated)
    return prediction_scores(os.path.join(evaluated, "predictions.jsonl"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    "..", "shared"), help="the ../shared folder")
    p.add_argument("--model", default="tiny", choices=("tiny", "mini"))
    p.add_argument("--model-dir", help="the pretrained mini encoder's directory (bench/pretrain_gain.py's model/)")
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
            run_dir = os.path.join(a.out, a.model, f"{name.replace(' ', '_')}_s{seed}")
            res = job([*data, *model_overrides(a.model, a.model_dir, a.cache_dir), f"train.learning_rate={a.lr}",
                       f"train.seed={seed}", f"train.max_steps={a.steps}", f"train.batch_size={a.batch}",
                       f"train.max_length={a.max_length}", "train.warmup_ratio=0.1", "save_model=true",
                       "train.calibrate=temperature", f"train.calibrate_fraction={a.fraction}",
                       *(SMOKE_DATA if a.smoke else [])],
                      run_dir)
            e = dict(res["calibration"], fp32=prediction_scores(os.path.join(run_dir, "predictions.jsonl")),
                     int8=int8_scores(run_dir, data, seed, a))
            if e["int8"].pop("ids") != e["fp32"].pop("ids"):
                raise SystemExit(f"{name} seed {seed}: the int8 evaluation scored other items than the training run")
            entries.append(e)
            print(f"{name} seed {seed}: T {e['temperature']:.3f} on {e['held_out']} held out; ECE "
                  f"{e['before']['ece']:.4f} → {e['after']['ece']:.4f}, accuracy {100 * e['before']['accuracy']:.2f} "
                  f"→ {100 * e['after']['accuracy']:.2f} ({e['n_items']} validation items); int8 ONNX: ECE "
                  f"{e['int8']['ece']:.4f}, accuracy {100 * e['int8']['accuracy']:.2f} ({e['int8']['n_items']} items; "
                  f"fp32 predictions.jsonl ECE {e['fp32']['ece']:.4f})", flush=True)
        found[name] = {"entries": entries, **{m: difference([e["after"][m] for e in entries],
                                                            [e["before"][m] for e in entries]) for m in METRICS},
                       "accuracy_unchanged": all(e["before"]["accuracy"] == e["after"]["accuracy"] for e in entries),
                       "int8_ece": difference([e["int8"]["ece"] for e in entries], [e["fp32"]["ece"] for e in entries]),
                       "int8_accuracy": difference([e["int8"]["accuracy"] for e in entries],
                                                   [e["fp32"]["accuracy"] for e in entries])}

    def verdict(d: dict) -> str:
        return "shown" if d["shown"] else "not shown"

    encoder = "tiny random encoder" if a.model == "tiny" else "mini pretrained encoder"
    lines = [f"{encoder}, {a.steps} steps, lr {a.lr:g}, {len(seeds)} seeds, calibrate_fraction {a.fraction}",
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
    lines += ["", "| task | after calibration (predictions.jsonl) | fp32 (mean ± sd) | int8 ONNX (mean ± sd) | int8 − fp32 ± paired SE "
                  "| > 2 SE |", "| --- | --- | --- | --- | --- | --- |"]
    for name, f in found.items():
        for m, key, scale in (("ECE ×100", "ece", 100.0), ("accuracy", "accuracy", 100.0)):
            fp32 = [scale * e["fp32"][key] for e in f["entries"]]
            int8 = [scale * e["int8"][key] for e in f["entries"]]
            d = f[f"int8_{key}"]
            lines.append(f"| {name} | {m} | {spread(fp32)} | {spread(int8)} | {d['mean'] * scale:+.2f} ± "
                         f"{d['se'] * scale:.2f} | {verdict(d)} |")
    print("\n".join(lines))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "calibration.json"), "w", encoding="utf-8") as fh:
        json.dump({"args": vars(a), "tasks": found}, fh, indent=1, default=str)
    keys = {"hate speech": "hate", "KLUE NLI": "nli"}
    parts = [f"{keys[n]}_ece_before={100 * sum(e['before']['ece'] for e in f['entries']) / len(seeds):.2f} "
             f"{keys[n]}_ece_after={100 * sum(e['after']['ece'] for e in f['entries']) / len(seeds):.2f} "
             f"{keys[n]}_ece_change_se={100 * f['ece']['se']:.2f} "
             f"{keys[n]}_ece_int8={100 * sum(e['int8']['ece'] for e in f['entries']) / len(seeds):.2f} "
             f"{keys[n]}_ece_int8_change={100 * f['int8_ece']['mean']:+.2f}±{100 * f['int8_ece']['se']:.2f} "
             f"{keys[n]}_acc_int8_change={100 * f['int8_accuracy']['mean']:+.2f}" for n, f in found.items()]
    unchanged = all(f["accuracy_unchanged"] for f in found.values())
    print(f"RESULT calibration model={a.model} {' '.join(parts)} accuracy_unchanged={unchanged} seeds={len(seeds)} "
          f"wall_s={time.time() - started:.0f}")
    if not unchanged:
        raise SystemExit("accuracy changed with the calibration: the fold must keep the argmax")


if __name__ == "__main__":
    main()
