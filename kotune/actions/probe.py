"""``action=probe mode=frozen``: which layer serves the task? Each split is encoded once with every
hidden state (the frozen cache of ``mode.layers=scalar_mix``); the task's head then trains on each
``probe.choices`` entry (every single layer 0..L, ``last4_mean``, ``last4_concat``, ``scalar_mix``)
with each of ``probe.seeds``, reading that choice out of the one cache. Writes ``probe.png`` (layer →
main metric, the mixes as marked points) and logs a table; results.json's ``probe`` has a row per
choice (the headline). Every head is scored on the validation split, so no choice is *picked* there
without saying so: ``probe.best_on_validation`` names the table's best (optimistic: picked and scored
on one split), ``probe.held_out`` picks on a seeded part of the validation examples and scores on the
rest; ``metrics`` stay empty (a probe has no single model score). Heads never select checkpoints
(``train.select_best`` is refused): they would be picked on the split they report."""
from __future__ import annotations

import copy
import math
import os
import random
import statistics
import time
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from kotune.loading.build import build

from kotune.loading.built import Built
from kotune.inference.predict import fit_decision, predict, run_report
from kotune.devices import is_rank_zero, local_rank_zero_first, seed_everything
from kotune.training.trainer import make_trainer
from kotune.core.errors import ConfigError
from kotune.core.log import log

MIXES = ("last4_mean", "last4_concat", "scalar_mix")


def choices(value: Any, num_layers: int) -> list:
    """``probe.choices`` → ``mode.layers`` values: ``all`` is every single layer, then the mixes
    this encoder has layers for (``last4_*`` need 4: a 2-layer encoder gets layers 0-2 and the
    scalar mix). A list names them: an index (one layer), a name, or an index list (their mean)."""
    if value == "all":
        return list(range(num_layers + 1)) + [m for m in MIXES if num_layers >= 4 or m == "scalar_mix"]
    if isinstance(value, ListConfig):
        value = OmegaConf.to_container(value)
    if not isinstance(value, list) or not value:
        raise ConfigError(f"probe.choices={value}: expected all or a list such as [0, 6, 12, last4_concat, scalar_mix]")
    return value


def choice_name(spec) -> str:
    return str(spec.indices[0]) if spec.name == "list" and len(spec.indices) == 1 else str(spec.describe())


def seeds_of(cfg: DictConfig) -> list[int]:
    seeds = cfg.probe.get("seeds")
    if seeds is None:
        return [int(cfg.train.seed)]
    seeds = [seeds] if isinstance(seeds, int) else list(seeds)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError(f"probe.seeds={seeds}: expected a list of integers such as [1,2,3]")
    return seeds


def held_out_split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Example indices (seeded, each side sorted): ``fraction`` of ``n`` to pick a choice on, the
    rest to score it on; ``([], [])`` when either side would be empty."""
    picked = round(n * fraction)
    if not 0 < picked < n:
        return [], []
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[:picked]), sorted(order[picked:])


def held_out_fraction(cfg: DictConfig) -> float:
    value = cfg.probe.get("held_out")
    if value is None or value is False:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"probe.held_out={value}: expected a fraction in [0, 1) of the validation examples "
                          "to pick the best choice on (0: no held-out pick)")
    return float(value)


def part_score(task, outputs: list, examples: list[dict], indices: list[int], main: str) -> float:
    return task.score([outputs[i] for i in indices], [examples[i] for i in indices])[main]


def held_out_pick(task, rows: list[dict], outputs: dict[str, list[list]], examples: list[dict], fraction: float,
                  seed: int) -> dict | None:
    """The choice with the best mean (over seeds) on a seeded ``fraction`` of the validation
    examples, and its mean on the others: what picking a layer by this probe is worth on examples
    the pick never saw. Each row gets its two part means (``select_mean``, ``report_mean``)."""
    select, report = held_out_split(len(examples), fraction, seed)
    if not select:
        return None
    main = task.main_metric
    for row in rows:
        for key, part in (("select_mean", select), ("report_mean", report)):
            row[key] = statistics.fmean(part_score(task, out, examples, part, main) for out in outputs[row["choice"]])
    chosen = best_row(rows, "select_mean", task.greater_is_better)
    return {"choice": chosen["choice"], "mean": chosen["report_mean"], "n_select": len(select),
            "n_report": len(report), "fraction": fraction, "seed": seed}


def best_row(rows: list[dict], key: str, greater_is_better: bool) -> dict:
    """The row with the best ``key`` (the first of equals; a NaN score never wins)."""
    def rank(row):
        value = row[key]
        return -math.inf if math.isnan(value) else (value if greater_is_better else -value)

    return max(rows, key=rank)


def train_head(cfg: DictConfig, b: Built, spec, seed: int, run_dir: str) -> tuple[Built, list, dict]:
    """One head on ``b``'s cache of every hidden state: the trained view, its outputs and metrics."""
    seed_everything(seed)  # the head's initialisation; Trainer seeds the data order from train.seed
    view = copy.copy(b)
    view.model = b.model.with_layers(spec.describe())
    view.inputs = {split: inputs.reading(spec) for split, inputs in b.inputs.items()}
    head_cfg = copy.deepcopy(cfg)
    head_cfg.train.seed = seed
    trainer = make_trainer(head_cfg, view, os.path.join(run_dir, "probe", f"{choice_name(spec)}-seed{seed}"))
    trainer.train()
    fit_decision(trainer, view)
    outputs, _ = predict(trainer, view, "validation")
    return view, outputs, b.task.score(outputs, b.splits["validation"].examples)


def summarize(name: str, spec, metrics: list[dict], main: str) -> dict:
    scores = [m[main] for m in metrics]
    return {"choice": name, "layers": spec.describe(), "indices": list(spec.indices), "scores": scores,
            "mean": statistics.fmean(scores), "sd": statistics.stdev(scores) if len(scores) > 1 else None}


def table(rows: list[dict], main: str, best: str) -> str:
    lines = [f"{'choice':<14}{'layers':<18}{main + ' mean ± sd':>22}   per seed"]
    for r in rows:
        sd = f" ± {r['sd']:.2f}" if r["sd"] is not None else ""
        mark = "  ← best on this split (picked here: optimistic)" if r["choice"] == best else ""
        lines.append(f"{r['choice']:<14}{str(r['indices']):<18}{r['mean']:>14.2f}{sd:<8}   "
                     + " ".join(f"{s:.2f}" for s in r["scores"]) + mark)
    return "\n".join(lines)


def plot(path: str, rows: list[dict], main: str, title: str) -> None:
    """Single layers as a curve (± sd); each mix a marked point (± sd) on a dashed line over the
    layers it reads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    single = [r for r in rows if r["choice"].isdigit()]
    if single:
        ax.errorbar([int(r["choice"]) for r in single], [r["mean"] for r in single],
                    yerr=[r["sd"] or 0.0 for r in single], fmt="o-", capsize=3, color="#4C72B0",
                    label="single layer")
    mixes = [r for r in rows if not r["choice"].isdigit()]
    for k, (marker, r) in enumerate(zip("s^D*vPXh" * len(mixes), mixes)):
        color = f"C{k + 1}"
        ax.hlines(r["mean"], min(r["indices"]), max(r["indices"]), colors=color, linestyles="--", alpha=0.6)
        ax.errorbar([statistics.fmean(r["indices"])], [r["mean"]], yerr=[r["sd"] or 0.0], fmt=marker,
                    color=color, markersize=9, capsize=3, label=r["choice"])
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("layer (0 = embeddings; a mix: dashed over the layers it reads)")
    ax.set_ylabel(f"{main} (validation)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(cfg: DictConfig, run_dir: str) -> dict:
    from heads.model.layers import parse_layers

    if not cfg.mode.frozen or not cfg.mode.get("cache"):
        raise ConfigError("action=probe trains heads on one encoding of a frozen encoder: use mode=frozen "
                          "(with mode.cache=true)")
    if cfg.train.get("select_best"):
        raise ConfigError("train.select_best=true (train=klue sets it): action=probe scores every head on the "
                          "validation split, so their checkpoints cannot be picked there too; add "
                          "train.select_best=false (each head trains its fixed budget)")
    fraction = held_out_fraction(cfg)
    every_state = copy.deepcopy(cfg)
    every_state.mode.layers = "scalar_mix"  # the cache of every hidden state that each choice reads from
    with local_rank_zero_first():
        b = build(every_state, ("train", "validation"), new_head=True)
    num_layers = int(b.model.encoder.config.num_hidden_layers)
    specs = [parse_layers(c, num_layers) for c in choices(cfg.probe.choices, num_layers)]
    seeds = seeds_of(cfg)
    task, main = b.task, b.task.main_metric
    log(f"probe: {len(specs)} layer choices × {len(seeds)} seed(s) on one encoding "
        f"({b.cache_report.get('status')}, {b.cache_report.get('encode_s')}s)")
    started = time.time()
    rows, first_runs, all_outputs = [], {}, {}
    for spec in specs:
        name = choice_name(spec)
        metrics, all_outputs[name] = [], []
        for seed in seeds:
            view, outputs, scored = train_head(cfg, b, spec, seed, run_dir)
            metrics.append(scored)
            all_outputs[name].append(outputs)
            first_runs.setdefault(name, view)
        rows.append(summarize(name, spec, metrics, main))
        if spec.learned:
            rows[-1]["scalar_mix"] = view.model.mixer.report()["scalar_mix"]  # the last seed's weights
        log(f"probe {name}: {main} {rows[-1]['mean']:.2f}")
    heads_s = round(time.time() - started, 3)
    best = best_row(rows, "mean", task.greater_is_better)
    examples = b.splits["validation"].examples
    held_out = held_out_pick(task, rows, all_outputs, examples, fraction, int(cfg.train.seed)) if fraction else None
    log("probe results (validation):\n" + table(rows, main, best["choice"]))
    if held_out:
        log(f"probe held out: {held_out['choice']} picked on {held_out['n_select']} validation examples, "
            f"{main} {held_out['mean']:.2f} on the other {held_out['n_report']}")
    if is_rank_zero():
        plot(os.path.join(run_dir, "probe.png"), rows, main,
             f"{task.name}, {cfg.checkpoint or cfg.model.name}: {main} by layer, "
             f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}")
    # predictions.jsonl: the best-on-validation choice's first seed
    report = run_report(cfg, run_dir, first_runs[best["choice"]], "validation", all_outputs[best["choice"]][0], {},
                        head_train_s=heads_s)
    report["metrics"] = {}  # the table is the result: a maximum over choices is no model's score
    report["probe"] = {"rows": rows, "best_on_validation": best["choice"], "held_out": held_out, "seeds": seeds,
                       "main_metric": main, "encode_s": b.cache_report.get("encode_s"), "heads_s": heads_s,
                       "png": os.path.join(run_dir, "probe.png")}
    return report
