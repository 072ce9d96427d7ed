"""Does pretraining here help? Pretrain a small BERT on ../shared/data/corpus with
``action=pretrain``, then fine-tune it and its random-init twin (same config, tokenizer, seeds,
steps; each with its best learning rate from a small grid, picked on the first seed) on
hate-speech, KLUE NLI and KLUE NER (seeded 80/20 splits of the shared dev files), plus frozen
NLI probes (last layer, a middle layer, scalar mix) of both, and the downstream curves: the
pretraining's own initial weights and every checkpoint fine-tuned on NER and hate speech like the
final model (so that a gain can be told apart from what the init alone gives).

    python bench/pretrain_gain.py                      # the default budget (see --help)
    python bench/pretrain_gain.py --pretrain-steps 400 --ft-steps 60 --seeds 1,2,3

Prints ``RESULT pretrain_minutes=… mlm_accuracy=… hate_gain=… nli_gain=… ner_gain=…`` (gains:
pretrained − random in points, mean over seeds), a table, a PNG (MLM curves, scores, downstream
curve) and the leaderboard of ``report.py`` over the selected runs (``OUT/report``). The
pretrained checkpoint is cached under ``cache_dir/pretrain_gain/<recipe hash>`` (never in the
project): the same recipe again reuses it, an interrupted one resumes. Every job is an in-process
``kotune.job.execute``: exactly what the CLI runs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
sys.path.insert(0, ROOT)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

CORPUS = [f"{SHARED}/corpus/news-comments.txt", f"{SHARED}/corpus/news-titles.txt",
          f"{SHARED}/corpus/korsts-train-sentences.txt"]
TASKS = {  # name → (overrides, main metric)
    "hate": ([f"task=text_cls", f"data.train_file={SHARED}/hate-speech/train.tsv",
              f"data.validation_file={SHARED}/hate-speech/dev.tsv", "data.text_column=comments",
              "data.label_column=hate", "data.format=tsv"], "accuracy"),
    "nli": (["task=nli", f"data.train_file={SHARED}/klue/klue-nli-v1.1_dev.json", "data.validation_split=0.2"],
            "accuracy"),
    "ner": (["task=ner", f"data.train_file={SHARED}/klue/klue-ner-v1.1_dev.tsv", "data.validation_split=0.2"],
            "entity_f1"),
}
PROBES = {"last": "last", "middle": "[1]", "scalar_mix": "scalar_mix"}


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from kotune.cli import open_dict_overrides

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=open_dict_overrides(overrides))


def job(overrides: list[str], run_dir: str) -> dict:
    """One ``kotune.job.execute`` (skipped when run_dir already holds an ok result of the same config)."""
    from kotune.job import execute, finished_results
    from kotune.runtime import quiet_libraries

    cfg = compose(overrides)
    done = finished_results(os.path.join(run_dir, "results.json"), cfg)
    if done is not None:
        return done
    quiet_libraries()
    res = execute(cfg, run_dir)
    if res["status"] != "ok":
        raise SystemExit(f"job failed ({' '.join(overrides)}): {res.get('error')}")
    return res


def pretrain_overrides(a, cache_dir: str) -> list[str]:
    return ["action=pretrain", "model=tiny", f"data.train_file=[{','.join(CORPUS)}]",
            f"model.tokenizer.vocab_size={a.vocab}", f"model.config_overrides.hidden_size={a.hidden}",
            f"model.config_overrides.num_hidden_layers={a.layers}",
            f"model.config_overrides.num_attention_heads={max(1, a.hidden // 64)}",
            f"model.config_overrides.intermediate_size={4 * a.hidden}",
            f"model.config_overrides.max_position_embeddings={a.ft_max_length}",
            f"model.config_overrides.hidden_dropout_prob={a.dropout}",
            f"model.config_overrides.attention_probs_dropout_prob={a.dropout}",
            f"pretrain.position_init={a.position_init}", f"pretrain.attention_init={a.attention_init}",
            f"train.max_length={a.block}",
            f"train.batch_size={a.batch}", f"train.max_steps={a.pretrain_steps}",
            f"train.learning_rate={a.lr}", "train.warmup_ratio=0.06", "train.logging_steps=25",
            "train.eval_batch_size=128", "pretrain.max_eval_blocks=300",
            f"pretrain.eval_every={max(1, a.pretrain_steps // 8)}", f"cache_dir={cache_dir}"]


def pretrain(a, cache_dir: str) -> tuple[dict, str]:
    from tasks.base import fingerprint

    overrides = pretrain_overrides(a, cache_dir)
    run_dir = os.path.join(cache_dir, "pretrain_gain", fingerprint(overrides)[:12])
    # checkpoints for the downstream curve (the run dir's name ignores them: resume keeps working)
    overrides += ["train.save_strategy=steps", f"train.save_steps={max(1, a.pretrain_steps // a.curve_points)}",
                  "train.save_total_limit=null"]
    started = time.time()
    res = job(overrides, run_dir)
    if time.time() - started > 60:
        print(f"pretrained in {(time.time() - started) / 60:.1f} min → {run_dir}", flush=True)
    return res, os.path.join(run_dir, "model")


def finetune(a, model_dir: str, cache_dir: str, out: str, task: str, init: str, lr: float, seed: int,
             extra: list[str] = (), tag: str = "") -> float:
    return float(finetune_run(a, model_dir, cache_dir, out, task, init, lr, seed, extra, tag)["metrics"][TASKS[task][1]])


def run_dir_of(out: str, task: str, init: str, lr: float, seed: int, tag: str = "") -> str:
    return os.path.join(out, f"{task}_{init}_lr{lr:g}_s{seed}{tag}")


def finetune_run(a, model_dir: str, cache_dir: str, out: str, task: str, init: str, lr: float, seed: int,
                 extra: list[str] = (), tag: str = "") -> dict:
    overrides = TASKS[task][0]
    return job([*overrides, "model=klue", f"model.name=mini-{init}", f"model.name_or_path={model_dir}",
               f"model.init={init}", f"train.learning_rate={lr}", f"train.seed={seed}", f"train.max_steps={a.ft_steps}",
               f"train.batch_size={a.ft_batch}", f"train.max_length={a.ft_max_length}", "train.warmup_ratio=0.1",
               "save_model=false", "save_predictions=false", f"cache_dir={cache_dir}", *extra],
              run_dir_of(out, task, init, lr, seed, tag))


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
    """The pretraining's own step-0 weights (its seeded init, sinusoidal positions, mimetic
    attention), rebuilt the way action=pretrain builds them: the curve's first point, so that a gain
    is the pretraining's and not its init's."""
    from transformers import AutoTokenizer

    from heads.mlm import load_mlm_model

    path = os.path.join(pretrain_dir, "initial")
    if not os.path.exists(os.path.join(path, "config.json")):
        cfg = compose(pretrain_overrides(a, a.cache_dir))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = load_mlm_model(cfg.model, len(tokenizer), int(cfg.train.seed), cfg.pretrain.position_init,
                               cfg.pretrain.attention_init)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def downstream_curve(a, task: str, pretrain_dir: str, model_dir: str, table: dict, seeds: list[int]) -> list[dict]:
    """``task``'s score against pretraining steps: the step-0 weights and every checkpoint
    fine-tuned like the final model (its best lr, every seed)."""
    final = table[(task, "pretrained")]
    curve = [{"step": 0, "scores": [finetune(a, initial_model(a, pretrain_dir, model_dir), a.cache_dir, a.out,
                                             task, "pretrained", final["lr"], seed, tag="_step0")
                                    for seed in seeds]}]
    for step, path in checkpoint_models(pretrain_dir, model_dir).items():
        if step < a.pretrain_steps:
            curve.append({"step": step, "scores": [
                finetune(a, path, a.cache_dir, a.out, task, "pretrained", final["lr"], seed, tag=f"_step{step}")
                for seed in seeds]})
    return curve + [{"step": a.pretrain_steps, "scores": final["scores"]}]


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {sd:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--block", type=int, default=64, help="pretraining block (packed tokens)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dropout", type=float, default=0.0,
                   help="encoder dropout (pretraining and both fine-tuned twins: the saved config)")
    p.add_argument("--position-init", default="sinusoidal", choices=("random", "sinusoidal"))
    p.add_argument("--attention-init", default="mimetic", choices=("random", "mimetic"))
    p.add_argument("--pretrain-steps", type=int, default=3000)
    p.add_argument("--curve-points", type=int, default=4,
                   help="pretraining checkpoints fine-tuned for the downstream curve")
    p.add_argument("--curve-tasks", default="ner,hate", help="the tasks of the downstream curve")
    p.add_argument("--ft-steps", type=int, default=400)
    p.add_argument("--ft-batch", type=int, default=32)
    p.add_argument("--ft-max-length", type=int, default=128)
    p.add_argument("--ft-lrs", default="3e-4,1e-3", help="fine-tuning grid, picked per model and task on the first seed")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--tasks", default="hate,nli,ner")
    p.add_argument("--only-pretrain", action="store_true")
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_pretrain_gain"))
    a = p.parse_args()
    for path in CORPUS:
        if not os.path.exists(path):
            raise SystemExit(f"skipped: {path} not found (../shared absent)")
    started = time.time()
    pre, model_dir = pretrain(a, a.cache_dir)
    minutes = pre["train_runtime_s"] / 60
    acc0, acc = pre["initial_metrics"]["mlm_accuracy"], pre["metrics"]["mlm_accuracy"]
    print(f"pretraining: {pre['train_steps']} steps, {minutes:.1f} min, held-out masked accuracy "
          f"{acc0:.1f} → {acc:.1f} %, perplexity {pre['initial_metrics']['perplexity']:.0f} → "
          f"{pre['metrics']['perplexity']:.0f}, {pre['tokens_per_second']:.0f} tokens/s", flush=True)
    for point in pre["held_out_curve"]:
        print(f"  step {point['step']:5d}: held-out masked acc {point['mlm_accuracy']:5.1f} %  "
              f"loss {point['mlm_loss']:.2f}", flush=True)
    if a.only_pretrain:
        return
    os.makedirs(a.out, exist_ok=True)
    seeds = [int(s) for s in a.seeds.split(",")]
    lrs = [float(x) for x in a.ft_lrs.split(",")]
    table: dict = {}
    for task in a.tasks.split(","):
        for init in ("pretrained", "random"):
            grid = {lr: finetune(a, model_dir, a.cache_dir, a.out, task, init, lr, seeds[0]) for lr in lrs}
            best = max(grid, key=grid.get)
            scores = [grid[best]] + [finetune(a, model_dir, a.cache_dir, a.out, task, init, best, s) for s in seeds[1:]]
            table[(task, init)] = {"lr": best, "grid": grid, "scores": scores}
            print(f"{task:5s} {init:10s} lr {best:g} (grid {grid}): {spread(scores)}", flush=True)
    curves = {t: downstream_curve(a, t, os.path.dirname(model_dir), model_dir, table, seeds)
              for t in a.curve_tasks.split(",") if (t, "pretrained") in table}
    probes = {}
    for name, layers in PROBES.items():
        for init in ("pretrained", "random"):
            probes[(name, init)] = finetune(a, model_dir, a.cache_dir, a.out, "nli", init, 1e-3, seeds[0],
                                            ["mode=frozen", f"mode.layers={layers}"], tag=f"_frozen_{name}")
    gains = {t: statistics.mean(x - y for x, y in zip(table[(t, "pretrained")]["scores"], table[(t, "random")]["scores"]))
             for t in a.tasks.split(",")}
    lines = ["| task (metric) | pretrained | random twin | gain (points, mean of paired seeds) |", "| --- | --- | --- | --- |"]
    for t in a.tasks.split(","):
        diffs = [x - y for x, y in zip(table[(t, "pretrained")]["scores"], table[(t, "random")]["scores"])]
        lines.append(f"| {t} ({TASKS[t][1]}) | {spread(table[(t, 'pretrained')]['scores'])} (lr {table[(t, 'pretrained')]['lr']:g}) "
                     f"| {spread(table[(t, 'random')]['scores'])} (lr {table[(t, 'random')]['lr']:g}) | {spread(diffs)} |")
    for name in PROBES:
        lines.append(f"| nli frozen probe, {name} | {probes[(name, 'pretrained')]:.2f} | {probes[(name, 'random')]:.2f} "
                     f"| {probes[(name, 'pretrained')] - probes[(name, 'random')]:.2f} (seed {seeds[0]}) |")
    print("\n".join(lines))
    for t, curve in curves.items():
        print(f"{t} {TASKS[t][1]} against pretraining steps (0 = its initial weights; "
              f"random twin {spread(table[(t, 'random')]['scores'])}): "
              + ", ".join(f"{c['step']}: {spread(c['scores'])}" for c in curve))
    summary = {"pretrain": {k: pre[k] for k in ("train_steps", "train_runtime_s", "initial_metrics", "metrics",
                                                 "held_out_curve", "loss_curve", "tokens_per_second")},
               "args": vars(a), "finetune": {f"{t}/{i}": v for (t, i), v in table.items()},
               "probes": {f"{n}/{i}": v for (n, i), v in probes.items()}, "gains": gains,
               "downstream_curves": curves,
               "bench_minutes": (time.time() - started) / 60}
    with open(os.path.join(a.out, "pretrain_gain.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(pre, table, curves, a, os.path.join(a.out, "pretrain_gain.png"))
    import report  # the same leaderboard a user gets, over the selected (best-lr) fine-tuning runs

    report.main([run_dir_of(a.out, t, i, v["lr"], seed) for (t, i), v in table.items() for seed in seeds]
                + ["--out", os.path.join(a.out, "report")])
    print(f"RESULT pretrain_minutes={minutes:.1f} mlm_accuracy={acc:.2f} "
          + " ".join(f"{t}_gain={g:.2f}" for t, g in gains.items()))


def plot(pre: dict, table: dict, curves: dict[str, list[dict]], a, path: str) -> None:
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
        scores = [table[(t, init)]["scores"] for t in tasks]
        right.bar([i + 0.4 * k for i in range(len(tasks))], [statistics.mean(s) for s in scores], 0.4,
                  yerr=[statistics.stdev(s) if len(s) > 1 else 0 for s in scores], label=init)
    right.set_xticks([i + 0.2 for i in range(len(tasks))], [f"{t} ({TASKS[t][1]})" for t in tasks])
    right.legend()
    right.set_title(f"fine-tuned {a.ft_steps} steps, {len(a.seeds.split(','))} seeds")
    for k, (t, curve) in enumerate(curves.items()):
        color = f"C{k}"
        down.errorbar([c["step"] for c in curve], [statistics.mean(c["scores"]) for c in curve],
                      yerr=[statistics.stdev(c["scores"]) if len(c["scores"]) > 1 else 0 for c in curve], fmt="o-",
                      color=color, label=f"{t} {TASKS[t][1]}: pretraining checkpoints")
        down.axhline(statistics.mean(table[(t, "random")]["scores"]), color=color, ls="--",
                     label=f"{t}: random twin (standard init)")
    if curves:
        down.legend(fontsize=7)
    down.set_xlabel("pretraining step (0 = its initial weights)")
    down.set_ylabel("dev score")
    down.set_title("downstream score against pretraining")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
