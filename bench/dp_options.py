"""KLUE DP parser options side by side (issue 23 item 3): word states from the first subword vs
the first and last, + the POS tag embedding, + KLUE-baseline's word-level LSTM (``task=dp_klue``:
also its Xavier init and 256-wide label MLP), against the next-word rule.

Data: the shared KLUE DP dev split 80/20 (``data.validation_split=0.2``, seeded, whole sentences).
Encoder: a random 2-layer × 128 BERT on KcBERT's real vocabulary (``model.init=random``), so words
split into subwords as KcBERT splits them. Each setting trains ``--steps`` steps per seed; the
table shows UAS/LAS macro and micro F1, mean ± sd over ``--seeds`` seeds. The next-word rule
attaches every word to the next one (the last to the root) with the training split's most
frequent relation: what a parser must beat.

Prints a Markdown table, the dev words' shares with several subwords and with a particle or
ending last, and ``RESULT dp_las_macro_next_word=… dp_las_macro_first=… dp_las_macro_first_last=…
dp_las_macro_pos=… dp_las_macro_lstm=…``. 2 CPU cores: ``nice -n 5 python -m bench.dp_options``
(33 minutes with the defaults, most of it the two LSTM runs). ``--smoke``: every setting and the
rule, one seed, 2 steps of a 1-layer × 32 encoder on the first rows (tests/test_bench_smoke.py).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

from kotune.cli.overrides import compose  # noqa: E402

DEV = SHARED / "data" / "klue" / "klue-dp-v1.1_dev.tsv"
ENCODER = ["model=kcbert", "model.init=random", f"model.name_or_path={SHARED / 'vocab' / 'kcbert-base'}",
           "model.config_overrides.num_hidden_layers=2", "model.config_overrides.hidden_size=128",
           "model.config_overrides.num_attention_heads=2", "model.config_overrides.intermediate_size=256"]
SETTINGS = {  # name → task overrides
    "first": ["task=dp", "task.word_pooling=first"],
    "first_last": ["task=dp", "task.word_pooling=first_last"],
    "first_last+POS": ["task=dp", "task.word_pooling=first_last", "task.pos=true"],
    "+LSTM (task=dp_klue)": ["task=dp_klue"],
}
METRICS = ("uas_macro_f1", "uas_micro_f1", "las_macro_f1", "las_micro_f1")
# --smoke: appended to every job (a smaller encoder, the first rows of each split)
SMOKE_OVERRIDES = ["model.config_overrides.num_hidden_layers=1", "model.config_overrides.hidden_size=32",
                   "model.config_overrides.num_attention_heads=1", "model.config_overrides.intermediate_size=64",
                   "data.max_train_samples=64", "data.max_eval_samples=32", "train.max_length=64"]
EXTRA: list[str] = []  # SMOKE_OVERRIDES under --smoke
RESULT_KEYS = {"first": "first", "first_last": "first_last", "first_last+POS": "pos",
               "+LSTM (task=dp_klue)": "lstm", "next-word rule": "next_word"}


def overrides(setting: str, steps: int, seed: int, lr: float, cache: Path) -> list[str]:
    return [*SETTINGS[setting], *ENCODER, f"data.train_file={DEV}", "data.validation_split=0.2",
            f"train.max_steps={steps}", f"train.learning_rate={lr}", "train.batch_size=32",
            "train.max_length=128", f"train.seed={seed}", "save_model=false", "save_predictions=false",
            f"cache_dir={cache}", *EXTRA]


def train_scores(setting: str, steps: int, seed: int, lr: float, cache: Path, work: Path) -> dict[str, float]:
    from kotune.cli.job import execute

    cfg = compose(overrides(setting, steps, seed, lr, cache))
    res = execute(cfg, str(work / f"{setting.replace(' ', '_')}-{seed}"))
    if res["status"] != "ok":
        raise SystemExit(f"{setting} seed {seed}: {res.get('error')}")
    return {m: float(res["metrics"][m]) for m in METRICS}


def next_word_scores(seed: int, cache: Path) -> dict[str, float]:
    """The next word as every word's head (the last word's: the root), the training split's most
    frequent relation as its label, on the same split."""
    from tasks import build_task
    from tasks.splits import load_splits
    from tasks.dp import fallback_heads

    cfg = compose(overrides("first", 1, seed, 1e-3, cache))
    task = build_task(cfg.task)
    splits = load_splits(task, cfg.data, ("train", "validation"), seed)
    label = Counter(d for ex in splits["train"].examples for d in ex["deprels"]).most_common(1)[0][0]
    examples = splits["validation"].examples
    outputs = [{"heads": fallback_heads(len(ex["words"])), "deprels": [label] * len(ex["words"])} for ex in examples]
    return task.score(outputs, examples)


def word_ends() -> tuple[int, int, int]:
    """Of the dev file's words: how many KcBERT's tokenizer splits into more than one subword, how
    many end in a particle (J*) or ending (E*) morpheme by their POS column, and how many in all."""
    from transformers import AutoTokenizer

    from tasks import build_task

    tokenizer = AutoTokenizer.from_pretrained(str(SHARED / "vocab" / "kcbert-base"), do_lower_case=False)
    examples = build_task(compose(["task=dp"]).task).read_file(str(DEV))
    words = [w for ex in examples for w in ex["words"]]
    split = sum(len(p) > 1 for p in tokenizer(words, add_special_tokens=False)["input_ids"])
    marked = sum(p.split("+")[-1][:1] in ("J", "E") for ex in examples for p in ex["pos"])
    return split, marked, len(words)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names of SETTINGS")
    from bench.common import parse_with_smoke

    args = parse_with_smoke(parser, {"seeds": 1, "steps": 2}, argv)
    EXTRA[:] = SMOKE_OVERRIDES if args.smoke else []
    if not DEV.exists():
        raise SystemExit(f"{DEV} not found: this benchmark reads the shared data")
    from kotune.devices import quiet_libraries

    quiet_libraries()
    work = Path(tempfile.mkdtemp(prefix="kotune-dp-"))
    cache = work / "cache"
    seeds = range(1, args.seeds + 1)
    scores: dict[str, list[dict[str, float]]] = {"next-word rule": [next_word_scores(s, cache) for s in seeds]}
    started = time.time()
    for setting in args.settings.split(","):
        scores[setting] = []
        for seed in seeds:
            scores[setting].append(train_scores(setting, args.steps, seed, args.lr, cache, work))
            print(f"[dp] {setting} seed {seed}: {scores[setting][-1]}", flush=True)
    sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0  # noqa: E731
    print("\n| setting | " + " | ".join(METRICS) + " |")
    print("|---|" + "---|" * len(METRICS))
    for setting, runs in scores.items():
        cells = [f"{statistics.mean(r[m] for r in runs):.2f} ± {sd([r[m] for r in runs]):.2f}" for m in METRICS]
        print(f"| {setting} | " + " | ".join(cells) + " |")
    split, marked, words = word_ends()
    print(f"\nof {words:,} dev words, {100 * split / words:.1f} % have more than one KcBERT subword and "
          f"{100 * marked / words:.1f} % end in a particle or ending morpheme")
    print(f"{len(scores) - 1} settings × {args.seeds} seeds, {args.steps} steps each, lr {args.lr}, "
          f"{time.time() - started:.0f} s")
    result = {f"dp_las_macro_{RESULT_KEYS[s]}": statistics.mean(r["las_macro_f1"] for r in runs)
              for s, runs in scores.items()}
    print("RESULT " + " ".join(f"{k}={v:.2f}" for k, v in result.items()), flush=True)
    return result


if __name__ == "__main__":
    main()
