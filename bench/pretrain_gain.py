"""Does pretraining here help, beyond the noise? Pretrain a small BERT on ../shared/data/corpus with
``action=pretrain``, then fine-tune it and its random-init twin (same config, tokenizer, seeds,
steps) on tasks a 1-M-parameter encoder can learn in a few hundred steps (``--tasks``, default
hate,ner,sts):

- ``hate``: hate-speech train.tsv → dev.tsv (accuracy);
- ``ner``: KLUE NER dev, one fixed seeded 80/20 split of its sentences (written once to
  ``cache_dir/pretrain_gain/ner-split-<fraction>-<seed>/``) → the 20 % (entity F1);
- ``sts``: KorSTS train (its sentences are in the pretraining corpus, as task-adaptive pretraining
  would use them) → KLUE STS dev (Pearson), scored by ``action=eval`` of the saved run, because one
  ``data.label_column`` cannot name KorSTS's ``score`` and KLUE's ``labels.real-label`` at once;
- ``korsts``: KorSTS train, one fixed seeded 80/20 split by first sentence → the 20 % (Pearson).

The recipe is an argument: ``--objective mlm+nsp``, ``--attention-init``, ``--pretrain-seed``, … each
gets its own cached pretraining; ``bench/pretrain_compare.py`` sets two ``--out`` folders side by side.

Protocol (nothing is chosen on an evaluation split): each twin's learning rate is the best of
``--ft-lrs`` on a seeded ``--select-split`` of its own training data (seed 1, grouped where the task
groups); then every seed trains on the full training data at that rate and is scored on the
evaluation split. Per task: the paired gains g_s = pretrained_s − random_s, their mean and paired
standard error sd(g)/√n, the random twin's seed spread, and "shown" only where the mean exceeds two
standard errors. The downstream curve fine-tunes the pretraining's own step-0 weights and its
checkpoints on NER like the final model (is a gain the pretraining's or its init's?).

    python -m bench.pretrain_gain                      # the default budget (see --help)
    python -m bench.pretrain_gain --smoke               # tiny settings, every phase, in seconds (also --only-pretrain)

Prints the minutes of each phase, a table, ``RESULT pretrain_minutes=… mlm_accuracy=… hate_gain=…
hate_gain_se=… ner_gain=… ner_gain_se=… sts_gain=… sts_gain_se=…``, a PNG and the leaderboard of
``report.py`` over the scored runs (``OUT/report``). The pretrained checkpoint is cached under
``cache_dir/pretrain_gain/<recipe hash>`` (never in the project): the same recipe again reuses it,
an interrupted one resumes; finished fine-tuning runs in ``--out`` are reused too. Every job is an
in-process ``kotune.cli.job.execute``: exactly what the CLI runs.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.pretraining import (CORPUS, KLUE_STS_DEV, METRIC, NER_FILE, SMOKE, Bench, arguments,  # noqa: E402
                               fixed_splits, pretrain, pretrain_overrides)
from bench.stats import paired_gain, spread  # noqa: E402
from kotune.cli.overrides import compose  # noqa: E402


def checkpoint_models(pretrain_dir: str, model_dir: str) -> dict[int, str]:
    """Pretraining step → a directory fine-tuning can read: the Trainer checkpoint (config and
    weights) plus the final tokenizer files (the tokenizer is fixed before step 0)."""
    root, found = os.path.join(pretrain_dir, "checkpoints"), {}
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if name.startswith("checkpoint-"):
            path = os.path.join(root, name)
            for f in os.listdir(model_dir):
                if f.startswith(("tokenizer", "special_tokens", "vocab")) and not os.path.exists(os.path.join(path, f)):
                    shutil.copy(os.path.join(model_dir, f), path)
            found[int(name.split("-")[1])] = path
    return dict(sorted(found.items()))


def initial_model(a, pretrain_dir: str, model_dir: str) -> str:
    """The pretraining's own step-0 weights (its seeded init, sinusoidal positions, tied query/key
    attention), rebuilt the way action=pretrain builds them: the curve's first point, so that a gain
    is the pretraining's and not its init's."""
    from transformers import AutoTokenizer

    from heads.model.mlm import load_mlm_model

    path = os.path.join(pretrain_dir, "initial")
    if not os.path.exists(os.path.join(path, "config.json")):
        cfg = compose(pretrain_overrides(a, a.cache_dir))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = load_mlm_model(cfg.model, len(tokenizer), int(cfg.train.seed), cfg.pretrain.position_init,
                               cfg.pretrain.attention_init, cfg.pretrain.objective, cfg.pretrain.get("mimetic_alpha"),
                               cfg.pretrain.get("mimetic_beta"), pad_token_id=tokenizer.pad_token_id)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def downstream_curve(bench: Bench, task: str, lr: float, final: list[float], seeds: list[int]) -> list[dict]:
    """``task``'s score against pretraining steps: the step-0 weights and every checkpoint
    fine-tuned like the final model (its chosen lr, ``seeds``)."""
    a, pretrain_dir = bench.a, os.path.dirname(bench.model_dir)
    points = {0: initial_model(a, pretrain_dir, bench.model_dir)}
    points.update({step: path for step, path in checkpoint_models(pretrain_dir, bench.model_dir).items()
                   if step < a.pretrain_steps})
    curve = [{"step": step, "scores": [bench.score(task, "pretrained", lr, s, model_dir=path, tag=f"_step{step}")
                                       for s in seeds]} for step, path in points.items()]
    return curve + [{"step": a.pretrain_steps, "scores": final[: len(seeds)]}]


def main() -> None:
    from bench.common import parse_with_smoke

    a = parse_with_smoke(arguments(__doc__), SMOKE)
    for path in [*CORPUS, NER_FILE, KLUE_STS_DEV]:
        if not os.path.exists(path):
            raise SystemExit(f"skipped: {path} not found (../shared absent)")
    import torch

    tasks, seeds = a.tasks.split(","), [int(s) for s in a.seeds.split(",")]
    lrs = [float(x) for x in a.ft_lrs.split(",")]
    unknown = [t for t in tasks if t not in METRIC]
    if unknown:  # stop before the pretraining
        raise SystemExit(f"unknown task {unknown[0]!r} (known: {', '.join(METRIC)})")
    if a.objective == "rtd" and any(t in tasks for t in a.curve_tasks.split(",")):
        raise SystemExit("--objective rtd: the downstream curve fine-tunes masked-LM checkpoints; give --curve-tasks ''")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    started = phase_started = time.time()
    phases: dict[str, float] = {}

    def phase_done(name: str) -> None:
        nonlocal phase_started
        phases[name] = (time.time() - phase_started) / 60
        print(f"[{name}: {phases[name]:.1f} min]", flush=True)
        phase_started = time.time()

    pre, model_dir = pretrain(a, a.cache_dir)
    minutes = pre["train_runtime_s"] / 60
    acc0, acc = pre["initial_metrics"]["mlm_accuracy"], pre["metrics"]["mlm_accuracy"]
    print(f"pretraining: {pre['train_steps']} steps, {minutes:.1f} min, held-out masked accuracy "
          f"{acc0:.2f} → {acc:.2f} %, perplexity {pre['initial_metrics']['perplexity']:.1f} → "
          f"{pre['metrics']['perplexity']:.1f}, {pre['tokens_per_second']:.0f} tokens/s", flush=True)
    if "nsp_accuracy" in pre["metrics"]:
        print(f"held-out next-sentence accuracy {pre['initial_metrics']['nsp_accuracy']:.2f} → "
              f"{pre['metrics']['nsp_accuracy']:.2f} % (always 'random next': "
              f"{pre['metrics']['nsp_majority_accuracy']:.2f} %)", flush=True)
    if "rtd_accuracy" in pre["metrics"]:
        print(f"held-out replaced-token detection accuracy {pre['initial_metrics']['rtd_accuracy']:.2f} → "
              f"{pre['metrics']['rtd_accuracy']:.2f} % (always 'original': "
              f"{pre['metrics']['rtd_all_original_accuracy']:.2f} %; the masked accuracy above is the generator's), "
              f"AUC {pre['initial_metrics'].get('rtd_auc', float('nan')):.3f} → {pre['metrics'].get('rtd_auc', float('nan')):.3f}",
              flush=True)
    for point in pre["held_out_curve"]:
        detection = (f"  detection AUC {point['rtd_auc']:.3f}, loss {point['rtd_loss']:.3f} (base rate's "
                     f"{point['rtd_base_loss']:.3f})" if "rtd_auc" in point else "")
        print(f"  step {point['step']:5d}: held-out masked acc {point['mlm_accuracy']:5.2f} %  "
              f"loss {point['mlm_loss']:.3f}{detection}", flush=True)
    phase_done("pretraining")
    if a.only_pretrain:
        return
    os.makedirs(a.out, exist_ok=True)
    bench = Bench(a, model_dir, fixed_splits(a.cache_dir, a.ner_eval_split, seed=0))
    chosen: dict = {}
    for task in tasks:
        for init in ("pretrained", "random"):
            grid = {lr: bench.score(task, init, lr, seeds[0], select=True) for lr in lrs}
            chosen[(task, init)] = {"lr": max(grid, key=grid.get), "select_scores": grid}
            print(f"{task:5s} {init:10s} lr {chosen[(task, init)]['lr']:g} (held-out {METRIC[task]}: "
                  + ", ".join(f"lr {lr:g} {x:.2f}" for lr, x in grid.items()) + ")", flush=True)
    phase_done("learning-rate selection")
    for (task, init), c in chosen.items():
        c["scores"] = [bench.score(task, init, c["lr"], s) for s in seeds]
        print(f"{task:5s} {init:10s} lr {c['lr']:g}: {spread(c['scores'])}  "
              f"({', '.join(f'{x:.2f}' for x in c['scores'])})", flush=True)
    phase_done("fine-tuning, every seed")
    curves = {t: downstream_curve(bench, t, chosen[(t, "pretrained")]["lr"], chosen[(t, "pretrained")]["scores"],
                                  seeds[: a.curve_seeds])
              for t in a.curve_tasks.split(",") if t in tasks}
    phase_done("downstream curve")
    gains = {t: paired_gain(chosen[(t, "pretrained")]["scores"], chosen[(t, "random")]["scores"]) for t in tasks}
    lines = [f"| task (metric; {len(seeds)} seeds) | pretrained (mean ± sd) | random twin (mean ± sd) "
             "| gain ± paired SE | gain per seed | gain > 2 SE |",
             "| --- | --- | --- | --- | --- | --- |"]
    for t, g in gains.items():
        pre_t, rnd_t = chosen[(t, "pretrained")], chosen[(t, "random")]
        lines.append(f"| {t} ({METRIC[t]}) | {spread(pre_t['scores'])} (lr {pre_t['lr']:g}) "
                     f"| {spread(rnd_t['scores'])} (lr {rnd_t['lr']:g}) | {g['mean']:+.2f} ± {g['se']:.2f} | "
                     f"{' / '.join(f'{x:+.1f}' for x in g['gains'])} | {'shown' if g['shown'] else 'not shown'} |")
    print("\n".join(lines))
    for t, curve in curves.items():
        print(f"{t} {METRIC[t]} against pretraining steps (0 = its initial weights; seeds {seeds[:a.curve_seeds]}; "
              f"random twin {spread(chosen[(t, 'random')]['scores'][:a.curve_seeds])}): "
              + ", ".join(f"{c['step']}: {spread(c['scores'])}" for c in curve))
    summary = {"pretrain": {k: pre[k] for k in ("train_steps", "train_runtime_s", "initial_metrics", "metrics",
                                                 "held_out_curve", "loss_curve", "tokens_per_second")},
               "args": vars(a), "torch": torch.__version__, "threads": torch.get_num_threads(),
               "finetune": {f"{t}/{i}": v for (t, i), v in chosen.items()}, "gains": gains,
               "downstream_curves": curves, "phase_minutes": phases, "bench_minutes": (time.time() - started) / 60}
    with open(os.path.join(a.out, "pretrain_gain.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(pre, chosen, curves, a, os.path.join(a.out, "pretrain_gain.png"))
    from kotune.reporting import main as report  # the same leaderboard a user gets, over the scored runs

    report([bench.scored_dir(t, i, v["lr"], s) for (t, i), v in chosen.items() for s in seeds]
           + ["--out", os.path.join(a.out, "report")])
    print(f"bench: {summary['bench_minutes']:.1f} min in this invocation")
    print(f"RESULT pretrain_minutes={minutes:.1f} mlm_accuracy={acc:.2f} "
          + " ".join(f"{t}_gain={g['mean']:.2f} {t}_gain_se={g['se']:.2f}" for t, g in gains.items()))


def plot(pre: dict, chosen: dict, curves: dict[str, list[dict]], a, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: PNG skipped")
        return
    fig, (left, right, down) = plt.subplots(1, 3, figsize=(16, 4))
    steps = [h["step"] for h in pre["loss_curve"]]
    left.plot(steps, [h["loss"] for h in pre["loss_curve"]], label="training MLM loss")
    curve = pre["held_out_curve"]
    left.plot([c["step"] for c in curve], [c["mlm_loss"] for c in curve], "o-", label="held-out MLM loss")
    twin = left.twinx()
    twin.plot([c["step"] for c in curve], [c["mlm_accuracy"] for c in curve], "s--", color="tab:green",
              label="held-out masked acc (%)")
    left.set_xlabel("pretraining step")
    left.legend(loc="upper center")
    twin.legend(loc="center right")
    tasks = a.tasks.split(",")
    for k, init in enumerate(("pretrained", "random")):
        scores = [chosen[(t, init)]["scores"] for t in tasks]
        right.bar([i + 0.4 * k for i in range(len(tasks))], [statistics.mean(s) for s in scores], 0.4,
                  yerr=[statistics.stdev(s) if len(s) > 1 else 0 for s in scores], label=init)
    right.set_xticks([i + 0.2 for i in range(len(tasks))], [f"{t} ({METRIC[t]})" for t in tasks])
    right.legend()
    right.set_title(f"fine-tuned {a.ft_steps} steps, {len(a.seeds.split(','))} seeds")
    for k, (t, curve) in enumerate(curves.items()):
        color = f"C{k}"
        down.errorbar([c["step"] for c in curve], [statistics.mean(c["scores"]) for c in curve],
                      yerr=[statistics.stdev(c["scores"]) if len(c["scores"]) > 1 else 0 for c in curve], fmt="o-",
                      color=color, label=f"{t} {METRIC[t]}: pretraining checkpoints")
        down.axhline(statistics.mean(chosen[(t, "random")]["scores"]), color=color, ls="--",
                     label=f"{t}: random twin (standard init)")
    if curves:
        down.legend(fontsize=7)
    down.set_xlabel("pretraining step (0 = its initial weights)")
    down.set_ylabel("evaluation score")
    down.set_title("downstream score against pretraining")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
