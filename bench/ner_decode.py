"""KLUE NER: subword vs character decode on real data (../shared), ceiling and trained scores.

For each vocabulary (../shared/vocab) and decode: the pipeline ceiling on the whole KLUE NER dev
file, then the same randomly initialised encoder (real vocabulary, same seed, same budget) trained
on a seeded 80 % of that file and scored on the held-out 20 %.

    python -m bench.ner_decode                      # kcbert + koelectra, 1 seed, ~1 h on 2 cores
    python -m bench.ner_decode --vocabs kcbert --steps 100 --seeds 1   # a quick look
    python -m bench.ner_decode --smoke   # every cell, 2 steps of a 1-layer × 32 encoder on the first rows

Prints a markdown table, ``RESULT <vocab>_<decode>_ceiling_entity_f1=… <vocab>_<decode>_entity_f1=… …``
(the ceiling and the trained entity F1, mean over seeds, of every cell) and writes every results.json
under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

from kotune.cli.overrides import compose  # noqa: E402

VOCABS = {"kcbert": ["model=kcbert", f"model.name_or_path={SHARED}/vocab/kcbert-base"],
          "koelectra": ["model=koelectra", f"model.name_or_path={SHARED}/vocab/koelectra",
                        "model.architecture=electra"]}
DATA = SHARED / "data" / "klue" / "klue-ner-v1.1_dev.tsv"
KEYS = ("entity_f1", "entity_f1_micro", "char_f1", "char_f1_with_o")
SMOKE = dict(seeds=1, steps=2, batch_size=8, layers=1, hidden=32,
             out=os.path.join(tempfile.gettempdir(), "kotune_bench", "ner_decode_smoke"))
SMOKE_DATA = ["data.max_train_samples=64", "data.max_eval_samples=32"]  # --smoke: appended to every job


def job(overrides: list[str], run_dir: Path) -> dict:
    from kotune.cli.job import execute

    res = execute(compose(overrides), str(run_dir))
    if res["status"] != "ok":
        raise SystemExit(f"{run_dir}: {res.get('error')}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocabs", nargs="+", default=sorted(VOCABS), choices=sorted(VOCABS))
    ap.add_argument("--seeds", type=int, default=1, help="training seeds (encoder init and split) per cell")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_bench", "ner_decode"))
    from bench.common import parse_with_smoke

    args = parse_with_smoke(ap, SMOKE)
    if not DATA.exists():
        raise SystemExit(f"../shared absent ({DATA} not found)")
    out = Path(args.out)
    cache = [f"cache_dir={out / 'cache'}", "save_model=false", "save_predictions=false",
             *(SMOKE_DATA if args.smoke else [])]
    encoder = (f"+model.config_overrides={{num_hidden_layers:{args.layers},hidden_size:{args.hidden},"
               f"num_attention_heads:{max(1, args.hidden // 64)},intermediate_size:{4 * args.hidden}}}")
    rows = []
    for vocab in args.vocabs:
        for decode in ("subword", "char"):
            base = ["task=ner", f"task.decode={decode}", *VOCABS[vocab], *cache]
            ceiling = job(base + ["action=ceiling", f"data.validation_file={DATA}", "train.max_length=510"],
                          out / f"{vocab}-{decode}-ceiling")
            trained = [job(base + ["model.init=random", encoder, f"data.train_file={DATA}", "data.validation_split=0.2",
                                   f"train.seed={seed}", f"train.max_steps={args.steps}",
                                   f"train.batch_size={args.batch_size}", f"train.learning_rate={args.lr}",
                                   "train.max_length=256"], out / f"{vocab}-{decode}-seed{seed}")
                       for seed in range(42, 42 + args.seeds)]
            row = {"vocab": vocab, "decode": decode, "max_length": ceiling["max_length"],
                   "ceiling": {k: ceiling["metrics"][k] for k in KEYS},
                   "inexpressible": ceiling["ceiling"]["inexpressible"],
                   "gold_entities": ceiling["ceiling"]["gold_entities"],
                   "trained": {k: [r["metrics"][k] for r in trained] for k in KEYS},
                   "trainable_params": trained[0]["trainable_params"],
                   "train_s": [r["runtime_s"] for r in trained]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "summary.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))

    def cell(values: list[float]) -> str:
        return f"{statistics.mean(values):.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")

    print(f"\nrandom-init encoder: {args.layers} layers × {args.hidden}, {args.steps} steps × batch "
          f"{args.batch_size}, lr {args.lr}, {args.seeds} seed(s); 80/20 seeded split of {DATA.name}\n")
    print("| vocab | decode | ceiling entity F1 (macro / micro) | ceiling char F1 | inexpressible "
          "| trained entity F1 | trained entity F1 micro | trained char F1 | trained char F1 with O |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, t = r["ceiling"], r["trained"]
        print(f"| {r['vocab']} (max_length {r['max_length']}) | {r['decode']} | {c['entity_f1']:.2f} / "
              f"{c['entity_f1_micro']:.2f} | {c['char_f1']:.2f} | {r['inexpressible']} of {r['gold_entities']} "
              f"| {cell(t['entity_f1'])} | {cell(t['entity_f1_micro'])} | {cell(t['char_f1'])} "
              f"| {cell(t['char_f1_with_o'])} |")
    print("RESULT " + " ".join(f"{r['vocab']}_{r['decode']}_ceiling_entity_f1={r['ceiling']['entity_f1']:.2f} "
                               f"{r['vocab']}_{r['decode']}_entity_f1={statistics.mean(r['trained']['entity_f1']):.2f}"
                               for r in rows), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
