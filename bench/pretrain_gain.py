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

    python bench/pretrain_gain.py                      # the default budget (see --help)
    python bench/pretrain_gain.py --smoke               # tiny settings, every phase, in seconds (also --only-pretrain)

Prints the minutes of each phase, a table, ``RESULT pretrain_minutes=… mlm_accuracy=… hate_gain=…
hate_gain_se=… ner_gain=… ner_gain_se=… sts_gain=… sts_gain_se=…``, a PNG and the leaderboard of
``report.py`` over the scored runs (``OUT/report``). The pretrained checkpoint is cached under
``cache_dir/pretrain_gain/<recipe hash>`` (never in the project): the same recipe again reuses it,
an interrupted one resumes; finished fine-tuning runs in ``--out`` are reused too. Every job is an
in-process ``kotune.job.execute``: exactly what the CLI runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
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
NER_FILE = f"{SHARED}/klue/klue-ner-v1.1_dev.tsv"
KLUE_STS_DEV = f"{SHARED}/klue/klue-sts-v1.1_dev.json"
KORSTS = f"{SHARED}/korsts/sts-train.tsv"
METRIC = {"hate": "accuracy", "ner": "entity_f1", "sts": "pearson", "korsts": "pearson"}
STS_SCORED = "_klue_sts_dev"  # the run dir suffix of an STS run's action=eval on KLUE STS dev
# --smoke: every phase (pretraining, selection, seeds, curve, table, PNG, report) at the smallest size that
# still runs it; SMOKE_DATA keeps the first rows of each fine-tuning job's splits
SMOKE = dict(vocab=500, hidden=32, layers=1, block=32, batch=8, pretrain_steps=4, curve_points=2, curve_seeds=2,
             ft_steps=2, ft_batch=8, ft_max_length=64, ft_lrs="1e-3", seeds="1,2",
             out=os.path.join(tempfile.gettempdir(), "kotune_pretrain_gain_smoke"))
SMOKE_DATA = ["data.max_train_samples=128", "data.max_eval_samples=64"]
SMOKE_CORPUS_LINES = 2000  # --smoke pretrains on the first lines of each corpus file (smoke_corpus)


def task_data(task: str, splits: dict[str, dict[str, str]]) -> tuple[list[str], list[str]]:
    """``task``'s (training data overrides, evaluation overrides of the same run; STS's own run
    evaluates on 64 training pairs, never reported: a separate ``action=eval`` scores KLUE STS dev).
    ``splits``: the fixed train / eval files of ``ner`` and ``korsts`` (``fixed_splits``)."""
    if task == "hate":
        return (["task=text_cls", f"data.train_file={SHARED}/hate-speech/train.tsv", "data.text_column=comments",
                 "data.label_column=hate", "data.format=tsv"], [f"data.validation_file={SHARED}/hate-speech/dev.tsv"])
    if task == "ner":
        return (["task=ner", f"data.train_file={splits['ner']['train']}"],
                [f"data.validation_file={splits['ner']['eval']}"])
    if task == "sts":
        return (["task=sts", f"data.train_file={KORSTS}", "data.label_column=score"],
                [f"data.validation_file={KORSTS}", "data.max_eval_samples=64"])
    if task == "korsts":  # in-domain pairs: a fixed held-out part of KorSTS train
        return (["task=sts", f"data.train_file={splits['korsts']['train']}", "data.label_column=score"],
                [f"data.validation_file={splits['korsts']['eval']}"])
    raise SystemExit(f"unknown task {task!r} (known: {', '.join(METRIC)})")


# ---- pure helpers (tests/test_bench_gain.py) -------------------------------------------------
def split_blocks(text: str, fraction: float, seed: int) -> tuple[str, str]:
    """A seeded ``fraction`` of the blank-line-separated blocks of ``text`` (KLUE NER's sentences)
    as (rest, held out), each block whole and in file order."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    order = list(range(len(blocks)))
    random.Random(seed).shuffle(order)
    held = set(order[: max(1, round(len(blocks) * fraction))])
    if len(held) >= len(blocks):
        raise ValueError(f"{len(blocks)} block(s): too few to hold out {fraction}")
    rest, out = ([b.strip("\n") for i, b in enumerate(blocks) if (i in held) == keep] for keep in (False, True))
    return "\n\n".join(rest) + "\n", "\n\n".join(out) + "\n"


def split_rows(text: str, fraction: float, seed: int, group_column: str) -> tuple[str, str]:
    """A seeded ``fraction`` of the groups of a TSV's rows (rows sharing ``group_column``'s value, e.g.
    KorSTS pairs with the same first sentence, stay together) as (rest, held out): the header on
    both, rows in file order."""
    header, *rows = [line for line in text.split("\n") if line.strip()]
    column = header.split("\t").index(group_column)
    groups = sorted({row.split("\t")[column] for row in rows})
    random.Random(seed).shuffle(groups)
    held = set(groups[: max(1, round(len(groups) * fraction))])
    if len(held) >= len(groups):
        raise ValueError(f"{len(groups)} group(s): too few to hold out {fraction}")
    rest, out = ([r for r in rows if (r.split("\t")[column] in held) == keep] for keep in (False, True))
    return "\n".join([header, *rest]) + "\n", "\n".join([header, *out]) + "\n"


def paired_gain(pretrained: list[float], random_twin: list[float]) -> dict:
    """Paired gains over seeds: mean, standard error sd(g)/√n, the random twin's seed spread, and
    ``shown`` (mean > 2 SE; never with fewer than two seeds)."""
    if len(pretrained) != len(random_twin) or not pretrained:
        raise ValueError(f"paired scores needed: {len(pretrained)} pretrained vs {len(random_twin)} random")
    gains = [p - r for p, r in zip(pretrained, random_twin)]
    n = len(gains)
    mean, se = statistics.mean(gains), statistics.stdev(gains) / math.sqrt(n) if n > 1 else math.nan
    return {"gains": gains, "mean": mean, "se": se, "shown": n > 1 and mean > 2 * se,
            "random_sd": statistics.stdev(random_twin) if n > 1 else math.nan}


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {sd:.2f}"


# ---- jobs -------------------------------------------------------------------------------------
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


def smoke_corpus(cache_dir: str) -> list[str]:
    """--smoke's corpus: the first ``SMOKE_CORPUS_LINES`` lines of each CORPUS file, written once."""
    folder, paths = os.path.join(cache_dir, "pretrain_gain", f"smoke-corpus-{SMOKE_CORPUS_LINES}"), []
    os.makedirs(folder, exist_ok=True)
    for source in CORPUS:
        paths.append(os.path.join(folder, os.path.basename(source)))
        if not os.path.exists(paths[-1]):
            with open(source, encoding="utf-8") as f:
                lines = [line for _, line in zip(range(SMOKE_CORPUS_LINES), f)]
            with open(paths[-1] + ".tmp", "w", encoding="utf-8") as f:
                f.writelines(lines)
            os.replace(paths[-1] + ".tmp", paths[-1])
    return paths


def pretrain_overrides(a, cache_dir: str) -> list[str]:
    corpus = smoke_corpus(cache_dir) if getattr(a, "smoke", False) else CORPUS
    return ["action=pretrain", "model=tiny", f"data.train_file=[{','.join(corpus)}]",
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
            f"pretrain.eval_every={max(1, a.pretrain_steps // 8)}", f"cache_dir={cache_dir}"] + (
            # appended only when not the default, so that earlier recipes keep their cache (hash)
            [f"pretrain.objective={a.objective}"] if getattr(a, "objective", "mlm") != "mlm" else []) + (
            [f"train.seed={a.pretrain_seed}"] if getattr(a, "pretrain_seed", None) is not None else [])


def pretrain_dir(a, cache_dir: str) -> str:
    """The recipe's pretraining run directory (its model in ``model/``)."""
    from tasks.base import fingerprint

    return os.path.join(cache_dir, "pretrain_gain", fingerprint(pretrain_overrides(a, cache_dir))[:12])


def pretrain(a, cache_dir: str) -> tuple[dict, str]:
    overrides, run_dir = pretrain_overrides(a, cache_dir), pretrain_dir(a, cache_dir)
    # checkpoints for the downstream curve (the run dir's name ignores them: resume keeps working)
    overrides += ["train.save_strategy=steps", f"train.save_steps={max(1, a.pretrain_steps // a.curve_points)}",
                  "train.save_total_limit=null"]
    return job(overrides, run_dir), os.path.join(run_dir, "model")


def fixed_splits(cache_dir: str, fraction: float, seed: int) -> dict[str, dict[str, str]]:
    """The fixed train / evaluation files, written once: KLUE NER dev by whole sentences, KorSTS
    train by first sentence (``korsts``)."""
    return {"ner": fixed_split(cache_dir, f"ner-split-{fraction:g}-{seed}", NER_FILE,
                               lambda text: split_blocks(text, fraction, seed)),
            "korsts": fixed_split(cache_dir, f"korsts-split-{fraction:g}-{seed}", KORSTS,
                                  lambda text: split_rows(text, fraction, seed, "sentence1"))}


def fixed_split(cache_dir: str, name: str, source: str, split) -> dict[str, str]:
    folder = os.path.join(cache_dir, "pretrain_gain", name)
    paths = {"train": os.path.join(folder, "train.tsv"), "eval": os.path.join(folder, "eval.tsv")}
    if not all(os.path.exists(p) for p in paths.values()):
        os.makedirs(folder, exist_ok=True)
        with open(source, encoding="utf-8") as f:
            parts = dict(zip(("train", "eval"), split(f.read())))
        for name, text in parts.items():
            with open(paths[name] + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(paths[name] + ".tmp", paths[name])
    return paths


def run_dir_of(out: str, task: str, init: str, lr: float, seed: int, tag: str = "") -> str:
    return os.path.join(out, f"{task}_{init}_lr{lr:g}_s{seed}{tag}")


class Bench:
    """The fine-tuning side: one pretrained model directory, the options, the tasks' data."""

    def __init__(self, a, model_dir: str, splits: dict[str, dict[str, str]]):
        self.a, self.model_dir, self.splits = a, model_dir, splits

    def model_overrides(self, init: str, model_dir: str) -> list[str]:
        return ["model=klue", f"model.name=mini-{init}", f"model.name_or_path={model_dir}", f"model.init={init}",
                f"cache_dir={self.a.cache_dir}"]

    def finetune(self, task: str, init: str, lr: float, seed: int, select: bool = False,
                 model_dir: str | None = None, tag: str = "", options: tuple[str, ...] = ()) -> dict:
        """A fine-tuning run's results: on ``--select-split`` of the training data (``select``), or on
        all of it, scored on the evaluation split (STS: the eval run on KLUE STS dev). ``options``:
        more overrides of the training run (bench/ner_crf.py: ``task.crf=true``; give it a ``tag``)."""
        a = self.a
        train_data, evaluation = task_data(task, self.splits)
        model = self.model_overrides(init, model_dir or self.model_dir)
        tag += "_select" if select else ""
        run_dir = run_dir_of(a.out, task, init, lr, seed, tag)
        scored_later = task == "sts" and not select  # the eval job reads the saved model
        pooling = [f"mode.pooling={a.pooling}"] if a.pooling and task != "ner" else []
        smoke = SMOKE_DATA if getattr(a, "smoke", False) else []
        res = job([*train_data, *([f"data.validation_split={a.select_split}"] if select else evaluation), *model,
                   *pooling,
                   f"train.learning_rate={lr}", f"train.seed={seed}", f"train.max_steps={a.ft_steps}",
                   f"train.batch_size={a.ft_batch}", f"train.max_length={a.ft_max_length}", "train.warmup_ratio=0.1",
                   "save_predictions=false", f"save_model={str(scored_later).lower()}", *smoke, *options], run_dir)
        if scored_later:
            res = job(["action=eval", f"checkpoint={run_dir}", "task=sts", f"data.validation_file={KLUE_STS_DEV}",
                       *model, *pooling, f"train.seed={seed}", f"train.max_length={a.ft_max_length}",
                       "save_predictions=false", *smoke],
                      run_dir + STS_SCORED)
        return res

    def score(self, task: str, init: str, lr: float, seed: int, **options) -> float:
        return float(self.finetune(task, init, lr, seed, **options)["metrics"][METRIC[task]])

    def scored_dir(self, task: str, init: str, lr: float, seed: int) -> str:
        return run_dir_of(self.a.out, task, init, lr, seed) + (STS_SCORED if task == "sts" else "")


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

    from heads.mlm import load_mlm_model

    path = os.path.join(pretrain_dir, "initial")
    if not os.path.exists(os.path.join(path, "config.json")):
        cfg = compose(pretrain_overrides(a, a.cache_dir))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = load_mlm_model(cfg.model, len(tokenizer), int(cfg.train.seed), cfg.pretrain.position_init,
                               cfg.pretrain.attention_init, cfg.pretrain.objective, cfg.pretrain.get("mimetic_alpha"),
                               cfg.pretrain.get("mimetic_beta"))
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


def arguments(description: str = __doc__, out: str = "kotune_pretrain_gain") -> argparse.ArgumentParser:
    """The pretraining recipe and fine-tuning protocol's options (bench/ner_crf.py reads the same,
    to find the same cached pretraining); ``out``: the default ``--out`` under the temp folder."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--block", type=int, default=64, help="pretraining block (packed tokens)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dropout", type=float, default=0.0,
                   help="encoder dropout (pretraining and both fine-tuned twins: the saved config)")
    p.add_argument("--position-init", default="sinusoidal", choices=("random", "sinusoidal"))
    p.add_argument("--attention-init", default="tied_qk", choices=("random", "tied_qk", "mimetic"))
    p.add_argument("--objective", default="mlm", choices=("mlm", "mlm+nsp"), help="pretrain.objective")
    p.add_argument("--pretrain-steps", type=int, default=3000)
    p.add_argument("--pretrain-seed", type=int, default=None,
                   help="the pretraining's train.seed: its init, data order, masks, held-out lines and so its "
                        "tokenizer (default: the config's)")
    p.add_argument("--curve-points", type=int, default=4,
                   help="pretraining checkpoints fine-tuned for the downstream curve")
    p.add_argument("--curve-tasks", default="ner", help="the tasks of the downstream curve ('' for none)")
    p.add_argument("--curve-seeds", type=int, default=3, help="the first N seeds fine-tune each curve point")
    p.add_argument("--ft-steps", type=int, default=400)
    p.add_argument("--ft-batch", type=int, default=32)
    p.add_argument("--ft-max-length", type=int, default=128)
    p.add_argument("--pooling", default=None, choices=("cls", "mean"),
                   help="mode.pooling of the sequence and pair tasks (default: the preset's, [CLS] through the pooler)")
    p.add_argument("--ft-lrs", default="3e-4,1e-3",
                   help="learning-rate grid, picked per twin and task on --select-split of the training data")
    p.add_argument("--select-split", type=float, default=0.15,
                   help="held-out fraction of the training data that picks the learning rate (seed 1's split)")
    p.add_argument("--ner-eval-split", type=float, default=0.2,
                   help="the fixed splits' evaluation fraction: KLUE NER dev (by sentence), KorSTS train (by first sentence)")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--tasks", default="hate,ner,sts")
    p.add_argument("--only-pretrain", action="store_true")
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), out))
    return p


def main() -> None:
    from bench.common import parse_with_smoke

    a = parse_with_smoke(arguments(), SMOKE)
    for path in [*CORPUS, NER_FILE, KLUE_STS_DEV]:
        if not os.path.exists(path):
            raise SystemExit(f"skipped: {path} not found (../shared absent)")
    import torch

    tasks, seeds = a.tasks.split(","), [int(s) for s in a.seeds.split(",")]
    lrs = [float(x) for x in a.ft_lrs.split(",")]
    unknown = [t for t in tasks if t not in METRIC]
    if unknown:  # stop before the pretraining
        raise SystemExit(f"unknown task {unknown[0]!r} (known: {', '.join(METRIC)})")
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
    for point in pre["held_out_curve"]:
        print(f"  step {point['step']:5d}: held-out masked acc {point['mlm_accuracy']:5.2f} %  "
              f"loss {point['mlm_loss']:.3f}", flush=True)
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
    import report  # the same leaderboard a user gets, over the scored runs

    report.main([bench.scored_dir(t, i, v["lr"], s) for (t, i), v in chosen.items() for s in seeds]
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
