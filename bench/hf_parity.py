"""kotune against the stock Hugging Face recipe, side by side (issue 12 item 6).

One pretrained checkpoint — a saved 2-layer ``BertForMaskedLM`` on KcBERT's real vocabulary with
random weights (``--checkpoint DIR`` takes any saved BERT instead) — fine-tuned on the shared data
for the sequence (hate speech), pair (KLUE NLI), token (KLUE NER) and span (KorQuAD) heads by

- kotune: ``kotune.cli.job.execute`` (``model.init=pretrained`` from the checkpoint);
- HF: stock ``AutoModelFor{SequenceClassification,TokenClassification,QuestionAnswering}`` +
  ``transformers.Trainer`` with the same TrainingArguments (kotune.training.arguments.training_arguments), the same
  encoded features, the same decoding and metric (kotune's task), the same seeds.

(a) before training, with kotune's head weights copied into the HF model: max |logit difference|;
(b) after training: the main metric, mean and spread over ``--seeds`` seeds per side.

Prints a table and ``RESULT parity_max_logit_diff=<x> parity_metric_delta_min=<kotune − HF, worst task>``.
Small budgets by default (2 CPU cores): ``nice -n 5 python -m bench.hf_parity``. ``--smoke``: every
head both ways, one seed, 2 steps of a 2-layer × 32 checkpoint on the first rows (tests/test_bench_smoke.py).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

from kotune.cli.overrides import compose  # noqa: E402

DATA = SHARED / "data"
TRAIN = ["train.learning_rate=5e-4", "train.batch_size=16", "train.warmup_ratio=0.1", "train.weight_decay=0.01",
         "train.group_by_length=false", "train.head_dropout=null", "save_model=false", "save_predictions=false"]
TASKS = {  # head → kotune overrides (data, task options) and the stock HF class
    "sequence": (["task=text_cls", f"data.train_file={DATA}/hate-speech/train.tsv",
                  f"data.validation_file={DATA}/hate-speech/dev.tsv", "data.text_column=comments",
                  "data.label_column=hate", "data.max_train_samples=2000"], "AutoModelForSequenceClassification"),
    "pair": (["task=nli", f"data.train_file={DATA}/klue/klue-nli-v1.1_dev.json", "data.validation_split=0.2"],
             "AutoModelForSequenceClassification"),
    "token": (["task=ner", f"data.train_file={DATA}/klue/klue-ner-v1.1_dev.tsv", "data.validation_split=0.1",
               "data.max_train_samples=2000", "data.max_eval_samples=300"], "AutoModelForTokenClassification"),
    "span": (["task=korquad", f"data.train_file={DATA}/korquad/KorQuAD_v1.0_dev.json", "data.validation_split=0.05",
              "data.max_train_samples=1500", "data.max_eval_samples=150", "task.max_length=128",
              "task.doc_stride=64", "task.max_question_length=32"],  # fits 128-position checkpoints too
             "AutoModelForQuestionAnswering"),
}

SMOKE_DATA = ["data.max_train_samples=32", "data.max_eval_samples=16"]  # --smoke: appended to every job
EXTRA: list[str] = []  # SMOKE_DATA under --smoke


def make_checkpoint(path: Path, hidden: int) -> None:
    """A saved random-init BertForMaskedLM (no pooler, as MLM checkpoints are) with its tokenizer."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(str(SHARED / "vocab" / "kcbert-base"), do_lower_case=False)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=300)
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))


def overrides_for(head: str, checkpoint: Path, steps: int, seed: int, cache: Path) -> list[str]:
    return [*TASKS[head][0], "data=sample", "model=kcbert", f"model.name_or_path={checkpoint}",
            "model.init=pretrained", *TRAIN, f"train.max_steps={steps}", f"train.seed={seed}", f"cache_dir={cache}",
            *EXTRA]


def hf_model(head: str, checkpoint: Path, task, seed: int):
    import transformers

    transformers.set_seed(seed)  # as HF's examples: seed first, then build
    auto = getattr(transformers, TASKS[head][1])
    kwargs = {} if head == "span" else {"num_labels": task.head_kwargs()["num_labels"]}
    return auto.from_pretrained(str(checkpoint), **kwargs)


def logit_parity(head: str, checkpoint: Path, cache: Path) -> float:
    """(a): kotune's model as kotune builds it, its head copied into the stock HF model."""
    import torch

    from kotune.loading.build import build

    from kotune.export.native import head_key_map

    cfg = compose(overrides_for(head, checkpoint, 1, 0, cache))
    b = build(cfg, ("train", "validation"))
    model = b.model.eval()
    hf = hf_model(head, checkpoint, b.task, 0).eval()
    mapping = head_key_map(model)
    hf.load_state_dict({mapping[k]: v for k, v in model.head.state_dict().items()}, strict=False)
    rows = b.inputs["validation"].select(range(min(32, len(b.inputs["validation"]))))
    batch = b.collator([rows[i] for i in range(len(rows))])
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        ours, theirs = model(**inputs)["logits"], hf(**inputs)
    if head == "span":
        return max(float((o - t)[real].abs().max()) for o, t in zip(ours, (theirs.start_logits, theirs.end_logits)))
    if head == "token":
        return float((ours - theirs.logits)[real].abs().max())
    return float((ours - theirs.logits).abs().max())


def kotune_score(head: str, checkpoint: Path, steps: int, seed: int, cache: Path, work: Path) -> float:
    from kotune.cli.job import execute

    cfg = compose(overrides_for(head, checkpoint, steps, seed, cache))
    res = execute(cfg, str(work / f"kotune-{head}-{seed}"))
    if res["status"] != "ok":
        raise SystemExit(f"kotune {head} seed {seed}: {res.get('error')}")
    return float(res["metrics"][cfg.task.main_metric])


def hf_score(head: str, checkpoint: Path, steps: int, seed: int, cache: Path, work: Path) -> float:
    """The stock recipe on the same features; kotune's task decodes and scores its logits."""
    from transformers import AutoTokenizer, Trainer

    from kotune.devices import pad_multiple
    from kotune.loading.built import make_collator
    from kotune.loading.reconcile import requested_max_length
    from kotune.training.arguments import training_arguments
    from tasks import build_task
    from tasks.base import EncodeSettings
    from tasks.encode_cache import encode_cached
    from tasks.splits import load_splits

    cfg = compose(overrides_for(head, checkpoint, steps, seed, cache))
    task = build_task(cfg.task)
    splits = load_splits(task, cfg.data, ("train", "validation"), seed)
    task.fit_labels(splits["train"].examples)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    settings = EncodeSettings(max_length=requested_max_length(cfg), token_type_ids=True)
    features = {s: encode_cached(task, d.examples, tokenizer, settings, str(cache)) for s, d in splits.items()}
    inputs = {s: f.select_columns(task.model_columns(f)) for s, f in features.items()}
    model = hf_model(head, checkpoint, task, seed)
    args = training_arguments(cfg, str(work / f"hf-{head}-{seed}"), list(task.label_fields), do_eval=False)
    trainer = Trainer(model=model, args=args, train_dataset=inputs["train"],
                      data_collator=make_collator(tokenizer, pad_multiple(cfg.train)))
    trainer.train()
    predictions = trainer.predict(inputs["validation"]).predictions
    examples = splits["validation"].examples
    return float(task.score(task.decode(predictions, features["validation"], examples), examples)[cfg.task.main_metric])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="a saved BERT checkpoint (default: a random 2-layer MLM)")
    parser.add_argument("--heads", default="sequence,pair,token,span")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=128)
    from bench.common import parse_with_smoke

    args = parse_with_smoke(parser, {"seeds": 1, "steps": 2, "hidden": 32}, argv)
    EXTRA[:] = SMOKE_DATA if args.smoke else []
    if not SHARED.exists():
        raise SystemExit(f"{SHARED} not found: this benchmark reads the shared data")
    from kotune.devices import quiet_libraries

    quiet_libraries()
    work = Path(tempfile.mkdtemp(prefix="kotune-parity-"))
    checkpoint = args.checkpoint or work / "mlm"
    if args.checkpoint is None:
        make_checkpoint(checkpoint, args.hidden)
    cache = work / "cache"
    rows, started = [], time.time()
    for head in args.heads.split(","):
        diff = logit_parity(head, checkpoint, cache)
        seeds = range(1, args.seeds + 1)
        ours = [kotune_score(head, checkpoint, args.steps, s, cache, work) for s in seeds]
        theirs = [hf_score(head, checkpoint, args.steps, s, cache, work) for s in seeds]
        rows.append({"head": head, "max_logit_diff": diff, "kotune": ours, "hf": theirs,
                     "delta": statistics.mean(ours) - statistics.mean(theirs)})
        print(f"[parity] {head}: logit diff {diff:.2e}, kotune {ours}, HF {theirs}", flush=True)
    print("\n| head | main metric | kotune mean ± sd | HF mean ± sd | kotune − HF | max logit diff at step 0 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        metric = compose([*TASKS[r["head"]][0]]).task.main_metric
        sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0  # noqa: E731
        print(f"| {r['head']} | {metric} | {statistics.mean(r['kotune']):.2f} ± {sd(r['kotune']):.2f} | "
              f"{statistics.mean(r['hf']):.2f} ± {sd(r['hf']):.2f} | {r['delta']:+.2f} | {r['max_logit_diff']:.1e} |")
    print(f"\n{len(rows)} heads × {args.seeds} seeds × 2 systems, {args.steps} steps each, "
          f"{time.time() - started:.0f} s; checkpoint {checkpoint}")
    worst = min(rows, key=lambda r: r["delta"])
    result = {"parity_max_logit_diff": max(r["max_logit_diff"] for r in rows),
              "parity_metric_delta_min": worst["delta"], "worst": worst["head"]}
    print(f"RESULT parity_max_logit_diff={result['parity_max_logit_diff']:.2e} "
          f"parity_metric_delta_min={result['parity_metric_delta_min']:.2f}", flush=True)
    return result


if __name__ == "__main__":
    main()
