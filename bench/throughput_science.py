"""bench/throughput.py's same-science checks: padding is inert in training (kotune's batches, padded
by kotune and to max_length, take the same steps), and a small encoder trained by each pipeline with
its own sampler scores within seed noise of the other (a two-sample t-test over seeds)."""
from __future__ import annotations

import numpy as np

from bench.throughput_data import QUALITY, Bench, at_quantiles, epoch_batches, log, sorted_batches
from bench.throughput_runs import (CapturedPredictions, agreement, kotune_trainer, max_logit_gap, recipe_trainer,
                                   run_eval)
from kotune.inference.predict import predict


NO_DROPOUT = ["train.head_dropout=0", "model.config_overrides.hidden_dropout_prob=0",
              "model.config_overrides.attention_probs_dropout_prob=0", "train.logging_steps=1"]


def inert(name: str, args, workdir: str, steps: int = 4) -> dict:
    """Padding is inert in training: the small encoder (dropout off) trained on kotune's own
    length-grouped batches, once as kotune pads them and once padded to max_length, takes the same
    steps: per-step losses and the held-out predictions afterwards agree to float rounding."""
    bench = Bench(name, args, workdir, small=True, extra=NO_DROPOUT)
    batches = epoch_batches(bench, args.seed)[:steps]
    rows = [i for b in batches for i in b]
    held_out = at_quantiles(bench, sorted_batches(bench), 2)
    out = {}
    for pipeline in ("kotune", "recipe"):
        bench.reset()
        if pipeline == "kotune":
            trainer = kotune_trainer(bench, bench.subset(rows, "train"), steps, workdir, args.seed,
                                     bench.spec["batch"], replay=True)
        else:
            trainer = recipe_trainer(bench, rows, steps, workdir, args.seed, bench.spec["batch"],
                                     sampling="sequential")
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        out[pipeline] = {"losses": losses, **run_eval_weights(bench, pipeline, held_out, workdir)}
    k, r = out["kotune"], out["recipe"]
    return {"steps": steps, "batch": bench.spec["batch"],
            "max_loss_gap": max(abs(a - b) for a, b in zip(k["losses"], r["losses"])),
            "max_logit_gap": max_logit_gap(bench, k, r), "agreement": agreement(k["outputs"], r["outputs"])}


def run_eval_weights(bench: Bench, pipeline: str, batches, workdir: str) -> dict:
    """run_eval on the current (trained) weights instead of the initial ones."""
    state = {k: v.detach().clone() for k, v in bench.model.state_dict().items()}
    saved, bench.init_state = bench.init_state, state
    try:
        ev = run_eval(bench, pipeline, batches, workdir)
    finally:
        bench.init_state = saved
    return {k: ev[k] for k in ("outputs", "raw", "rows")}


def quality(name: str, args, workdir: str) -> dict:
    """A small encoder trained by both pipelines, each with its own sampler, on the same examples
    for the same steps, with two seeds each: the gap between pipelines against the gap between
    seeds, on held-out examples."""
    q = QUALITY[name]
    scores: dict[str, list[float]] = {"kotune": [], "recipe": []}
    losses: dict[str, list[float]] = {"kotune": [], "recipe": []}
    train_rows = list(range(q["train"]))
    eval_rows = list(range(q["train"], q["train"] + q["eval"]))
    main_metric = None
    for seed in args.quality_seeds:
        bench = Bench(name, args, workdir, small=True,
                      extra=[f"train.seed={seed}", f"train.batch_size={q['batch']}", "train.learning_rate=5e-4"])
        task, examples = bench.built.task, bench.examples
        main_metric = task.main_metric
        held_out = [examples[i] for i in eval_rows]
        for pipeline in ("kotune", "recipe"):
            bench.reset()
            if pipeline == "kotune":
                kotune_trainer(bench, bench.subset(train_rows, "train"), q["steps"], workdir, seed, q["batch"],
                               replay=False).train()
                b = bench.subset(eval_rows, "validation")
                with CapturedPredictions(task) as seen:
                    outputs, _ = predict(kotune_trainer(bench, b, 1, workdir, seed, q["batch"], replay=False),
                                             b, "validation")
                raw = seen.raw
            else:
                trainer = recipe_trainer(bench, train_rows, q["steps"], workdir, seed, q["batch"])
                trainer.train()
                raw = trainer.predict(bench.padded.select(eval_rows)).predictions
                outputs = task.decode(raw, bench.features.select(eval_rows), held_out)
            scores[pipeline].append(task.score(outputs, held_out)[main_metric])
            losses[pipeline].append(held_out_loss(raw, bench.features.select(eval_rows)["labels"]))
            log(f"same science {name} seed {seed} {pipeline}: {main_metric} {scores[pipeline][-1]:.2f}, "
                f"held-out loss {losses[pipeline][-1]:.4f}")
    out = {"metric": main_metric, "steps": q["steps"], "train_examples": q["train"], "eval_examples": q["eval"],
           "batch": q["batch"]}
    for key, values in (("score", scores), ("loss", losses)):
        out[key] = seed_noise_test(values["kotune"], values["recipe"])
    return out


T_95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def seed_noise_test(k: list[float], r: list[float]) -> dict:
    """Two-sample t-test (pooled seed variance): is the gap between the pipelines' means larger
    than seed-to-seed variation explains (two-sided, 95 %)?"""
    gap = float(np.mean(k) - np.mean(r))
    dof = len(k) + len(r) - 2
    pooled = float(np.sqrt((np.var(k, ddof=1) * (len(k) - 1) + np.var(r, ddof=1) * (len(r) - 1)) / dof))
    se = pooled * float(np.sqrt(1 / len(k) + 1 / len(r)))
    t = abs(gap) / se if se > 0 else (0.0 if gap == 0 else float("inf"))
    critical = T_95.get(dof, 1.96)
    return {"kotune": k, "recipe": r, "pipeline_gap": gap, "seed_std": pooled, "t": t, "t_critical": critical,
            "within_noise": t < critical}


def held_out_loss(logits, labels) -> float:
    """Mean cross-entropy over the labelled positions (rows or tokens; -100 = not scored)."""
    total, count = 0.0, 0
    for row, lab in zip(logits, labels):
        lab = np.asarray(lab).reshape(-1)
        row = np.asarray(row, dtype=np.float64).reshape(-1, np.asarray(row).shape[-1])[: len(lab)]
        keep = lab != -100
        row, lab = row[keep], lab[keep]
        shifted = row - row.max(-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        total -= float(logp[np.arange(len(lab)), lab].sum())
        count += len(lab)
    return total / max(1, count)

