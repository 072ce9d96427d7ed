"""``train.compile`` on the machine at hand: graphs compiled, training speed and loss, with dynamo's own
shape rule and with kotune's symbolic batch shapes, against eager, in one run.

    python -m bench.compile_speed            # model=tiny, 40 steps, inductor (minutes on 2 busy CPU cores)
    python -m bench.compile_speed --smoke    # 12 steps, a 1-layer × 32 encoder, the aot_eager backend

One job (task=nli, model=tiny, data=sample: the sample rows shipped with kotune, batch 8, seed 42, dropout off;
the 81 rows make every epoch end on a batch of one row), trained five times, each in a fresh process
(dynamo's state and counters start empty), the first three with an empty inductor cache:

* eager: ``train.compile=false``;
* dynamo: ``train.compile=true`` with dynamo's own rule (``dynamic=None``: the first batch's shapes are
  constants, a size that changes recompiles the graph with that size symbolic): kotune before;
* kotune: ``train.compile=true``, the batch's rows and padded length symbolic from its first batch
  (kotune/training/compiled.py);
* dynamo and kotune, warm: each again on the inductor cache its first run left (the same job rerun;
  a sweep's next job with other batches hits a symbolic graph, not necessarily a first batch's
  constant shapes).

Per run: graphs compiled (torch._dynamo's ``frames ok`` counter), training seconds, samples/s over
all steps and over the steps that compiled nothing (steady state), the train loss and its difference
from eager's. ``--smoke``'s backend (aot_eager) traces and counts graphs as inductor does, without
generating and compiling kernels: its seconds say nothing about inductor (and it runs no warm
runs: it caches no kernels). The last line:

    RESULT graphs_dynamo=<n> graphs_kotune=<n> train_s_eager=<s> train_s_dynamo=<s> train_s_kotune=<s>
           train_s_dynamo_warm=<s> train_s_kotune_warm=<s> max_loss_delta=<d>   (one line)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

RUNS = ("eager", "dynamo", "kotune", "dynamo_warm", "kotune_warm")
# inductor draws its own dropout masks (another random stream), which moves the whole trajectory
# (train_loss 1.1104 vs eager's 1.1076 after 40 steps with dropout 0.1, measured): off, the losses
# compare the arithmetic
NO_DROPOUT = ["model.config_overrides.hidden_dropout_prob=0", "model.config_overrides.attention_probs_dropout_prob=0",
              "train.head_dropout=0"]
SMOKE_ENCODER = ["model.config_overrides.num_hidden_layers=1", "model.config_overrides.hidden_size=32",
                 "model.config_overrides.num_attention_heads=1", "model.config_overrides.intermediate_size=64"]


def overrides(args, run: str, cache_dir: str) -> list[str]:
    return ["task=nli", "model=tiny", "data=sample", f"cache_dir={cache_dir}", f"train.max_steps={args.steps}",
            f"train.batch_size={args.batch_size}", "train.logging_steps=100000", "save_model=false",
            "save_predictions=false", f"train.compile={str(run != 'eager').lower()}", *NO_DROPOUT,
            *(SMOKE_ENCODER if args.smoke else [])]


def train_once(args, run: str) -> dict:
    """One training in this process; its figures as a dict."""
    import torch
    from transformers import TrainerCallback

    import kotune.training.trainer as kt
    from kotune.training import compiled
    from kotune.loading.build import build
    from kotune.cli.overrides import compose
    from kotune.devices import quiet_libraries

    quiet_libraries()
    cfg = compose(overrides(args, run, args.cache_dir))
    steps: list[dict] = []

    class Measured(kt.KotuneTrainer):
        compile_dynamic = not run.startswith("dynamo")

        def training_step(self, model, inputs, num_items_in_batch=None):
            steps.append({"rows": int(inputs["input_ids"].shape[0]), "before": compiled.compilations()})
            return super().training_step(model, inputs, num_items_in_batch)

    class Timer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            steps[-1]["s"] = time.perf_counter() - self.started
            steps[-1]["compiled"] = compiled.compilations() > steps[-1]["before"]

    make_args = kt.training_arguments

    def training_arguments(*a, **k):
        targs = make_args(*a, **k)
        if targs.torch_compile:
            targs.torch_compile_backend = args.backend
        return targs

    kt.training_arguments = training_arguments
    b = build(cfg, ("train",))
    trainer = kt.make_trainer(cfg, b, tempfile.mkdtemp(prefix="kotune_compile_bench_"), trainer_class=Measured)
    trainer.add_callback(Timer())
    started = time.perf_counter()
    out = trainer.train()
    seconds = time.perf_counter() - started
    steady = [s for s in steps if not s["compiled"]]
    return {"run": run, "graphs": compiled.compilations(), "train_s": seconds,
            "samples_per_s": sum(s["rows"] for s in steps) / seconds,
            "steady_samples_per_s": sum(s["rows"] for s in steady) / max(1e-9, sum(s["s"] for s in steady)),
            "steps": len(steps), "steps_compiling": len(steps) - len(steady),
            "train_loss": float(out.metrics["train_loss"]), "torch_threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (--smoke: aot_eager)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every run")
    parser.add_argument("--cache-dir", default=None,
                        help="kotune's cache (tokenizer, features); default: a temporary one")
    parser.add_argument("--run", choices=RUNS, default=None, help=argparse.SUPPRESS)  # one run, in this process
    from bench.common import parse_with_smoke

    args = parse_with_smoke(parser, {"steps": 12, "backend": "aot_eager"})
    if args.run:
        print("RUN " + json.dumps(train_once(args, args.run)), flush=True)
        return
    args.cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="kotune_compile_cache_")
    inductor_caches = {run: tempfile.mkdtemp(prefix="kotune_inductor_") for run in RUNS[:3]}
    inductor_caches.update(dynamo_warm=inductor_caches["dynamo"], kotune_warm=inductor_caches["kotune"])
    print(f"# train.compile: task=nli model=tiny{' (1 layer x 32)' if args.smoke else ''} data=sample, "
          f"{args.steps} steps of batch {args.batch_size}, backend {args.backend}, {args.threads} thread(s), "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    results = {}
    runs = RUNS[:3] if args.smoke else RUNS  # aot_eager has no kernels to cache
    for run in runs:
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TORCHINDUCTOR_CACHE_DIR=inductor_caches[run],
                   KOTUNE_PROGRESS="0")
        command = [sys.executable, "-m", "bench.compile_speed", "--run", run, "--steps", str(args.steps),
                   "--batch-size", str(args.batch_size), "--backend", args.backend, "--cache-dir", args.cache_dir,
                   *(["--smoke"] if args.smoke else [])]
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RUN ")]
        if proc.returncode != 0 or not lines:
            sys.exit(f"run {run} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        results[run] = r = json.loads(lines[-1][4:])
        r["loss_delta"] = r["train_loss"] - results["eager"]["train_loss"]
        print(f"{run:12s} graphs {r['graphs']}  train {r['train_s']:7.1f} s  {r['samples_per_s']:7.1f} samples/s  "
              f"steady {r['steady_samples_per_s']:7.1f} samples/s ({r['steps'] - r['steps_compiling']} steps)  "
              f"train_loss {r['train_loss']:.6f} ({r['loss_delta']:+.2e})", flush=True)
    print(f"# load average {os.getloadavg()[0]:.1f} at the end")
    print("RESULT " + " ".join([f"graphs_dynamo={results['dynamo']['graphs']}",
                                f"graphs_kotune={results['kotune']['graphs']}",
                                *(f"train_s_{run}={results[run]['train_s']:.1f}" for run in runs),
                                f"max_loss_delta={max(abs(r['loss_delta']) for r in results.values()):.2e}"]))


if __name__ == "__main__":
    main()
