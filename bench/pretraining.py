"""What the pretraining benches share (bench/pretrain_gain.py's recipe and protocol, which
bench/ner_crf.py, bench/modes.py, bench/probe_layers.py, bench/pretrain_compare.py, bench/pretrain_speed.py,
bench/pretrain_variants.py and bench/pretrain_rtd.py reuse): the ../shared/data files, the pretraining overrides and their
cached run directory, the fixed NER / KorSTS splits, the fine-tuning side (``Bench``), the options
of the recipe and protocol, and the common held-out measure of a pretrained model."""
from __future__ import annotations

import argparse
import os
import random
import tempfile

from bench.jobs import job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")

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



# ---- jobs -------------------------------------------------------------------------------------
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
            # ELECTRA-shaped (rtd always): its embeddings as wide as its hidden states, as the BERT shape's
            ["model.architecture=electra", f"model.config_overrides.embedding_size={a.hidden}"]
            if electra(a) else []) + (
            [f"train.seed={a.pretrain_seed}"] if getattr(a, "pretrain_seed", None) is not None else [])


def electra(a) -> bool:
    """Whether the recipe pretrains an ELECTRA-shaped model (``--architecture electra``, or ``--objective rtd``)."""
    return getattr(a, "architecture", "bert") == "electra" or getattr(a, "objective", "mlm") == "rtd"


def pretrain_dir(a, cache_dir: str) -> str:
    """The recipe's pretraining run directory (its model in ``model/``)."""
    from tasks.encode_cache import fingerprint

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


def arguments(description: str, out: str = "kotune_pretrain_gain") -> argparse.ArgumentParser:
    """The pretraining recipe and fine-tuning protocol's options of bench/pretrain_gain.py (bench/ner_crf.py
    reads the same, to find the same cached pretraining); ``description``: the script's help text;
    ``out``: the default ``--out`` under the temp folder."""
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
    p.add_argument("--objective", default="mlm", choices=("mlm", "mlm+nsp", "rtd"),
                   help="pretrain.objective (rtd: ELECTRA's replaced-token detection, an ELECTRA-shaped model)")
    p.add_argument("--architecture", default="bert", choices=("bert", "electra"),
                   help="the pretrained model's shape (electra: ElectraModel, embeddings as wide as the hidden states)")
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


def common_held_out(cfg, model_dir: str) -> dict:
    """The saved model (as ``AutoModelForMaskedLM``) on the packed blocks of the held-out lines."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from heads.model.mlm import mlm_metrics
    from tasks import pretrain

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lines = pretrain.load_text(cfg.data, int(cfg.train.seed))["validation"].lines
    blocks = pretrain.pack_blocks(tokenizer, *pretrain.tokenize_lines(tokenizer, lines), int(cfg.train.max_length))
    rows = pretrain.model_rows(blocks, bool(cfg.pretrain.whole_word))[: cfg.pretrain.max_eval_blocks]
    collator = pretrain.mlm_collator(tokenizer, cfg.pretrain, seed=int(cfg.pretrain.eval_seed))
    batches = pretrain.masked_batches(rows, collator, int(cfg.train.eval_batch_size))
    return mlm_metrics(AutoModelForMaskedLM.from_pretrained(model_dir), batches)
