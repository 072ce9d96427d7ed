"""Which layer holds what a task needs? Pretrain a deeper mini BERT with ``bench/pretrain_gain.py``'s
recipe (sinusoidal positions, tied query/key init, the shared corpus; 6 layers × 128 by default) and
run ``action=probe mode=frozen`` on it for each task: a head per layer 0…L (0 = embeddings), the mean
and the concatenation of the last four and the learned scalar mix, each with every seed, all on one
encoding per task.

- ``ner``: KLUE NER dev's fixed 80/20 sentence split (entity F1);
- ``sts``: KorSTS train → KLUE STS dev (Pearson; KLUE's file is rewritten once as a TSV with
  KorSTS's column names, because one ``data.label_column`` names the label of both files);
- ``korsts``: KorSTS train's fixed 80/20 split by first sentence (Pearson, in-domain pairs);
- ``hate``: hate-speech train → dev (macro F1, ``text_cls``'s main metric).

The same probes on the encoder's random-init twin (same config and tokenizer, the architecture's
standard init; ``--no-twin`` skips it) say which curve shapes the pretraining made and which a random
deep stack gives anyway. Sequence and pair heads read the masked mean of the tokens (``mode.pooling=mean``: without
next-sentence training the [CLS] vector has no sentence-level objective behind it).

    python -m bench.probe_layers                       # 6 × 128, 4,000 pretraining steps, seeds 1-3
    python -m bench.probe_layers --smoke    # every task and init: 4 layers × 32, 4 + 2 steps, the first rows

Prints each task's table, ``RESULT probe_best_ner=… probe_best_layer_ner=… …`` (the best choice and
the best single layer per task) and writes ``OUT/probe_layers.png`` (a panel per task) and
``OUT/probe_layers.json``. The pretraining is cached like bench/pretrain_gain.py's (same recipe, same
directory); finished probe runs in ``--out`` are reused.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from types import SimpleNamespace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.jobs import job  # noqa: E402
from bench.pretraining import CORPUS, KLUE_STS_DEV, KORSTS, NER_FILE, fixed_splits, pretrain, task_data  # noqa: E402

TASKS = ("ner", "sts", "korsts", "hate")
SMOKE = dict(layers=4, hidden=32, pretrain_steps=4, seeds="1", head_steps=2, head_batch=8,
             out=os.path.join(tempfile.gettempdir(), "kotune_probe_layers_smoke"))
SMOKE_RECIPE = dict(vocab=500, block=32, batch=8, smoke=True)  # the pretraining, as bench/pretrain_gain.py's --smoke
SMOKE_DATA = ["data.max_train_samples=128", "data.max_eval_samples=64"]  # appended to every probe job


def klue_sts_as_tsv(cache_dir: str) -> str:
    """KLUE STS dev (JSON, ``labels.real-label``) as a TSV with KorSTS's names (``score``,
    ``sentence1``, ``sentence2``; ``guid`` kept), written once."""
    path = os.path.join(cache_dir, "probe_layers", "klue-sts-dev-as-korsts.tsv")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(KLUE_STS_DEV, encoding="utf-8") as f:
            rows = json.load(f)
        clean = lambda text: " ".join(str(text).split())  # noqa: E731 (no tab or newline inside a field)
        lines = ["guid\tscore\tsentence1\tsentence2"] + [
            f"{r['guid']}\t{r['labels']['real-label']}\t{clean(r['sentence1'])}\t{clean(r['sentence2'])}" for r in rows]
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)
    return path


def probe_overrides(task: str, splits: dict, cache_dir: str) -> list[str]:
    """The task's data overrides for one probe job (training and evaluation files together)."""
    train_data, evaluation = task_data(task, splits)
    if task == "sts":  # the run itself evaluates on KLUE STS dev, relabelled
        evaluation = [f"data.validation_file={klue_sts_as_tsv(cache_dir)}"]
    pooling = [] if task == "ner" else ["mode.pooling=mean"]
    return [*train_data, *evaluation, *pooling]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--pretrain-steps", type=int, default=4000)
    p.add_argument("--attention-init", default="tied_qk", choices=("random", "tied_qk", "mimetic"))
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--head-steps", type=int, default=400)
    p.add_argument("--head-lr", type=float, default=5e-3)
    p.add_argument("--head-batch", type=int, default=32)
    p.add_argument("--no-twin", action="store_true", help="skip the random-init twin's probes")
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_probe_layers"))
    from bench.common import parse_with_smoke

    a = parse_with_smoke(p, SMOKE)
    for path in [*CORPUS, NER_FILE, KLUE_STS_DEV, KORSTS]:
        if not os.path.exists(path):
            raise SystemExit(f"skipped: {path} not found (../shared absent)")
    tasks = a.tasks.split(",")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise SystemExit(f"unknown task {unknown[0]!r} (known: {', '.join(TASKS)})")
    started = time.time()
    # bench/pretrain_gain.py's recipe at this depth: the same cache entry as its --layers/--pretrain-steps
    recipe = SimpleNamespace(vocab=2000, hidden=a.hidden, layers=a.layers, block=64, batch=64, lr=1e-3, dropout=0.0,
                             position_init="sinusoidal", attention_init=a.attention_init, objective="mlm",
                             pretrain_steps=a.pretrain_steps, curve_points=4, ft_max_length=128,
                             cache_dir=a.cache_dir)
    if a.smoke:
        vars(recipe).update(SMOKE_RECIPE)
    pre, model_dir = pretrain(recipe, a.cache_dir)
    print(f"encoder: {a.layers} layers × {a.hidden}, {pre['train_steps']} steps in {pre['train_runtime_s'] / 60:.1f} "
          f"min, held-out masked accuracy {pre['initial_metrics']['mlm_accuracy']:.2f} → "
          f"{pre['metrics']['mlm_accuracy']:.2f} % ({model_dir})", flush=True)
    splits = fixed_splits(a.cache_dir, 0.2, seed=0)
    seeds = [int(s) for s in a.seeds.split(",")]
    inits = ("pretrained",) if a.no_twin else ("pretrained", "random")
    summary: dict[str, dict] = {init: {} for init in inits}
    for task in tasks:
        for init in inits:
            model = ["model=klue", f"model.name=mini{a.layers}-{init}", f"model.name_or_path={model_dir}",
                     f"model.init={init}", f"cache_dir={a.cache_dir}"]
            res = job(["action=probe", "mode=frozen", *probe_overrides(task, splits, a.cache_dir), *model,
                       f"probe.seeds=[{','.join(map(str, seeds))}]", f"train.max_steps={a.head_steps}",
                       f"train.learning_rate={a.head_lr}", f"train.batch_size={a.head_batch}", "train.max_length=128",
                       "train.warmup_ratio=0.1", "save_predictions=false", "save_model=false",
                       *(SMOKE_DATA if a.smoke else [])],
                      os.path.join(a.out, f"probe_{task}_{init}"))
            r = res["probe"]
            summary[init][task] = {"best": r["best_on_validation"], "best_layer": best_single(r["rows"]),
                                   "metric": r["main_metric"],
                                   "rows": r["rows"], "encode_s": r["encode_s"], "heads_s": r["heads_s"]}
        cost = ", ".join(f"{init}: encode {summary[init][task]['encode_s']:.0f} s + heads "
                         f"{summary[init][task]['heads_s']:.0f} s" for init in inits)
        print(f"\n{task} ({r['main_metric']}; mean ± sd over seeds {a.seeds}; {cost})\n  {'choice':<13}"
              + "".join(f"{init:>18}" for init in inits))
        for k, row in enumerate(summary["pretrained"][task]["rows"]):
            cells = [summary[init][task]["rows"][k] for init in inits]
            print(f"  {row['choice']:<13}" + "".join(
                f"{c['mean']:>10.2f} ± {c['sd']:5.2f}" if c["sd"] is not None else f"{c['mean']:>18.2f}" for c in cells))
    record = {"encoder": {"layers": a.layers, "hidden": a.hidden, "steps": pre["train_steps"], "model_dir": model_dir,
                          "mlm_accuracy": pre["metrics"]["mlm_accuracy"], "pretrain_minutes": pre["train_runtime_s"] / 60},
              "args": vars(a), "probes": summary, "bench_minutes": (time.time() - started) / 60}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "probe_layers.json.tmp"), "w") as f:
        json.dump(record, f, indent=1)
    os.replace(os.path.join(a.out, "probe_layers.json.tmp"), os.path.join(a.out, "probe_layers.json"))
    plot(summary, a, os.path.join(a.out, "probe_layers.png"))
    print(f"bench: {record['bench_minutes']:.1f} min in this invocation")
    print("RESULT " + " ".join(f"probe_best_{t}={s['best']} probe_best_layer_{t}={s['best_layer']}"
                               for t, s in summary["pretrained"].items())
          + "".join(f" probe_best_layer_{t}_random={s['best_layer']}" for t, s in summary.get("random", {}).items()))


def best_single(rows: list[dict]) -> int:
    """The single layer (not a mix) with the highest mean score."""
    single = [r for r in rows if r["choice"].isdigit()]
    return int(max(single, key=lambda r: r["mean"])["choice"])


def plot(summary: dict, a, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: PNG skipped")
        return
    tasks = list(summary["pretrained"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        s = summary["pretrained"][task]
        if "random" in summary:
            twin = [r for r in summary["random"][task]["rows"] if r["choice"].isdigit()]
            ax.errorbar([int(r["choice"]) for r in twin], [r["mean"] for r in twin], yerr=[r["sd"] or 0.0 for r in twin],
                        fmt=".--", color="grey", capsize=2, label="random-init twin, single layer")
        single = [r for r in s["rows"] if r["choice"].isdigit()]
        ax.errorbar([int(r["choice"]) for r in single], [r["mean"] for r in single],
                    yerr=[r["sd"] or 0.0 for r in single], fmt="o-", capsize=3, label="pretrained, single layer")
        for k, r in enumerate(r for r in s["rows"] if not r["choice"].isdigit()):
            ax.errorbar([statistics.fmean(r["indices"])], [r["mean"]], yerr=[r["sd"] or 0.0], fmt="s^D"[k % 3],
                        color=f"C{k + 1}", markersize=8, capsize=3, label=r["choice"])
        ax.set_title(f"{task} ({s['metric']})", fontsize=10)
        ax.set_xlabel("layer (0 = embeddings)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"frozen probes of a {a.layers}-layer × {a.hidden} BERT pretrained {a.pretrain_steps} steps "
                 f"(seeds {a.seeds}; mixes at their layers' mean)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
