"""Throughput of kotune's pipeline against the fixed-padding recipe, on one machine, in one run.

    python -m bench.throughput            # base-size encoder (< 10 min on 2 CPU cores)
    python -m bench.throughput --small    # 2-layer encoder, quick (< 2 min)
    python -m bench.throughput --smoke    # every phase on a 1-layer × 32 encoder and 128 rows per task

Both pipelines train and evaluate the *same* encoder (BERT-base shape from
../shared/vocab/kcbert-base/config.json with 512 positions, random init, same seed), on the same
KLUE dev files from ../shared (NLI at max_length 128, NER at 510), through ``transformers.Trainer``:

* kotune: kotune's own build (tokenize once, cached), collator (dynamic padding), length-grouped
  training batches, length-sorted prediction with the order restored (``kotune.inference.predict.predict``).
* recipe (KLUE-baseline / KoELECTRA fine-tuning code): every row padded to max_length, random
  batches, plain ``Trainer`` and ``default_data_collator``.

A full epoch of base-size training does not fit the time budget, so the timed training steps are
K batches of a real epoch: kotune's length-grouped sampler is run over the whole split and K of its
batches are taken at evenly spaced quantiles of their padded length (the epoch's length profile).
Evaluation likewise times K batches of the split's sorted order. The recipe's cost per row does not
depend on the row (every row is max_length long), so it times the first ``--recipe-batches`` of
those batches (the same examples, in random batches for training). The two pipelines alternate for
``--rounds`` rounds (which goes first alternates too); the report gives medians and their ratio.

Also reported: padding efficiency (real tokens / processed tokens) of the timed steps and of a
whole epoch, peak memory each phase adds (CPU: resident set above the phase's start), and MFU:
model FLOPs of the processed (padded) shapes per second over the plain-matmul rate measured in this
process on the model's FFN GEMM shape just before and just after the phase (on a CPU shared with
other jobs the rate available moves with their load); MFU* divides by the best rate seen in the run
(any of the model's GEMM shapes), the hardware's peak when the machine was idle at some point.

Same science: (1) on the same weights both pipelines predict the same, example by example;
(2) padding is inert: a small encoder (dropout off) trained on kotune's batches, padded by kotune
and padded to max_length, takes the same steps (losses, then held-out logits, agree to float
rounding); (3) a small encoder trained by each pipeline with its own sampler on the same examples
for the same steps, two seeds each: held-out metric and loss, pipeline gap vs seed noise (t-test).

The last line: ``RESULT nli_train_speedup=<x> ner_train_speedup=<y> padding_efficiency=<p> mfu=<m>``
(kotune's NLI training: padding efficiency over a whole epoch, MFU of the timed steps; the base-size
run's MFU is the one that counts, a 2-layer encoder is too small to keep the matmuls busy).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

# Idle OpenMP threads sleep instead of spinning. On a CPU shared with other jobs, spinning threads
# that lose their core stall every parallel region (measured here: 20x slower steps for a small
# encoder, and wildly varying); on an idle machine it costs a few percent. Set before torch loads
# its OpenMP runtime (the modules below import it); an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from bench.common import matmul_peak  # noqa: E402
from bench.throughput_data import (EXTRA, PEAK, QUALITY, SHARED, SMALL, SMOKE_DATA, SMOKE_PEAK,  # noqa: E402
                                   SMOKE_QUALITY, SMOKE_SMALL, Bench, at_quantiles, efficiency, epoch_batches, log,
                                   sorted_batches)
from bench.throughput_report import print_report, task_report  # noqa: E402
from bench.throughput_runs import agreement, max_logit_gap, quick_peak, run_eval, run_train  # noqa: E402
from bench.throughput_science import inert, quality  # noqa: E402
from kotune.devices import quiet_libraries  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="2-layer encoder: a quick run")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two pipelines")
    parser.add_argument("--train-batches", type=int, default=None, help="timed training steps per run")
    parser.add_argument("--eval-batches", type=int, default=None, help="timed evaluation batches per run")
    parser.add_argument("--recipe-batches", type=int, default=None,
                        help="of those, how many the fixed-padding recipe times (its cost per row is constant)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--tasks", default="nli,ner")
    parser.add_argument("--quality", default="nli", help="tasks for the seed-noise training check (nli, ner, "
                        "nli,ner; NER's is slow: the recipe trains at 510 tokens); none: skip the training "
                        "checks (also the padding-is-inert one)")
    parser.add_argument("--quality-seeds", default="1,2")
    parser.add_argument("--out", default=None, help="write throughput.json here (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=42)
    from bench.common import parse_with_smoke

    args = parse_with_smoke(parser, {"small": True, "rounds": 1, "train_batches": 1, "eval_batches": 1,
                                     "recipe_batches": 1}, argv)
    if args.smoke:
        SMALL[:], EXTRA[:] = SMOKE_SMALL, SMOKE_DATA
        QUALITY.update(SMOKE_QUALITY)
        PEAK.update(SMOKE_PEAK)
    args.quality_seeds = [int(s) for s in args.quality_seeds.split(",")]
    if not SHARED.exists():
        sys.exit(f"error: ../shared absent ({SHARED}): the benchmark reads KLUE dev files from it")
    quiet_libraries()
    os.environ.setdefault("KOTUNE_PROGRESS", "0")
    started = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="kotune-bench-")
    train_k = args.train_batches or (4 if args.small else 3)
    eval_k = args.eval_batches or (4 if args.small else 2)
    recipe_k = args.recipe_batches or (2 if args.small else 1)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16 if args.precision == "fp16" else torch.float32
    log(f"{'small' if args.small else 'base-size'} encoder, precision {args.precision}, "
        f"{torch.get_num_threads()} threads (OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}), "
        f"device {'cuda' if torch.cuda.is_available() else 'cpu'}")

    benches, plan = {}, {}
    for name in args.tasks.split(","):
        bench = benches[name] = Bench(name, args, workdir, small=args.small)
        tk, ek = train_k, eval_k
        epoch = epoch_batches(bench, args.seed)
        evals = sorted_batches(bench)
        plan[name] = {"train": at_quantiles(bench, epoch, tk), "eval": at_quantiles(bench, evals, ek),
                      "epoch_efficiency": efficiency(bench, epoch), "eval_epoch_efficiency": efficiency(bench, evals)}
        log(f"{name}: {len(bench.examples)} examples, mean {bench.lengths.mean():.1f} tokens, "
            f"{bench.layer_params / 1e6:.1f}M layer parameters; kotune epoch padding efficiency "
            f"{plan[name]['epoch_efficiency']:.1%} (train), {plan[name]['eval_epoch_efficiency']:.1%} (eval); "
            f"timing {tk} train / {ek} eval batches")
        # warm-up (untimed): thread pools, allocator, kernel choice
        run_train(bench, "kotune", plan[name]["train"][:1], workdir, args.seed)

    peaks = [matmul_peak(dtype, **PEAK)]
    rec: dict = {n: {p: {"train": [], "eval": []} for p in ("kotune", "recipe")} for n in benches}
    agree: dict = {n: [] for n in benches}
    gaps: dict = {n: [] for n in benches}
    for r in range(args.rounds):
        for name, bench in benches.items():
            preds = {}
            for pipeline in (("kotune", "recipe") if r % 2 == 0 else ("recipe", "kotune")):
                # the recipe's step cost does not depend on which rows it pads to max_length: it
                # times the first of kotune's batches only (its examples are kotune's)
                k = None if pipeline == "kotune" else recipe_k
                before = quick_peak(dtype)
                ev = run_eval(bench, pipeline, plan[name]["eval"][:k], workdir)  # initial weights
                between = quick_peak(dtype)
                tr = run_train(bench, pipeline, plan[name]["train"][:k], workdir, args.seed)
                after = quick_peak(dtype)
                ev["peak"], tr["peak"] = (before + between) / 2, (between + after) / 2
                peaks.extend([before, between, after])
                preds[pipeline] = {key: ev.pop(key) for key in ("outputs", "raw", "rows")}
                rec[name][pipeline]["eval"].append(ev)
                rec[name][pipeline]["train"].append(tr)
                log(f"round {r + 1} {name} {pipeline}: train {tr['samples'] / tr['s']:.2f} samples/s, "
                    f"eval {ev['samples'] / ev['s']:.2f} samples/s")
            agree[name].append(agreement(preds["kotune"]["outputs"], preds["recipe"]["outputs"]))
            gaps[name].append(max_logit_gap(bench, preds["kotune"], preds["recipe"]))
        peaks.append(matmul_peak(dtype, **PEAK))
    peak = max(peaks)

    report = {"encoder": "small" if args.small else "base", "precision": args.precision, "rounds": args.rounds,
              "threads": torch.get_num_threads(), "device": "cuda" if torch.cuda.is_available() else "cpu",
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
              "attention": next(iter(benches.values())).model.encoder.config._attn_implementation,
              "timed_batches": {"train": train_k, "eval": eval_k, "recipe": recipe_k},
              "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
              "matmul_peak_gflops": peak / 1e9, "tasks": {}}
    for name, bench in benches.items():
        report["tasks"][name] = task_report(bench, plan[name], rec[name], agree[name], gaps[name], peak)

    if args.quality != "none":
        benches.clear()  # free the base-size models first
        report["padding_inert"] = {name: inert(name, args, workdir) for name in report["tasks"]}
        report["same_science"] = {name: quality(name, args, workdir) for name in args.quality.split(",")}
    report["runtime_s"] = time.perf_counter() - started
    print_report(report)
    out_dir = args.out or workdir
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "throughput.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, ensure_ascii=False)
    log(f"wrote {os.path.join(out_dir, 'throughput.json')}")
    if out_dir != workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    nli, ner = report["tasks"].get("nli", {}), report["tasks"].get("ner", {})
    print(f"RESULT nli_train_speedup={nli.get('train_speedup', float('nan')):.2f} "
          f"ner_train_speedup={ner.get('train_speedup', float('nan')):.2f} "
          f"padding_efficiency={nli.get('kotune_train_epoch_padding_efficiency', float('nan')):.3f} "
          f"mfu={nli.get('kotune_train_mfu', float('nan')):.3f}", flush=True)
    return report


if __name__ == "__main__":
    main()
