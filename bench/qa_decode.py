"""How long QA post-processing takes: windows, n-best decoding and the official metric over a
whole SQuAD-format file, with random logits in Trainer's shape (no model).

    python -m bench.qa_decode --file ../shared/data/korquad/KorQuAD_v1.0_dev.json \
        --vocab ../shared/vocab/kcbert-base --max-length 300

    python -m bench.qa_decode --smoke   # both decodings on the first 64 questions (the defaults: ../shared)

Prints one line per decoding: questions, windows, seconds to build windows, to decode, to score;
then ``RESULT token_windows=… token_decode_s=… token_score_s=… char_windows=… char_decode_s=… char_score_s=…``.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from omegaconf import OmegaConf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")

from heads.model.encoder import load_tokenizer  # noqa: E402
from tasks import build_task  # noqa: E402
from tasks.base import EncodeSettings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=os.path.join(SHARED, "data", "korquad", "KorQuAD_v1.0_dev.json"))
    parser.add_argument("--vocab", default=os.path.join(SHARED, "vocab", "kcbert-base"),
                        help="a vocab directory or tokenizer id")
    parser.add_argument("--task", default="korquad")
    parser.add_argument("--max-length", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-questions", type=int, default=None, help="only the file's first N questions")
    parser.add_argument("--smoke", action="store_true",
                        help="the first 64 questions: every step, both decodings and the RESULT line")
    args = parser.parse_args()
    if args.smoke and args.max_questions is None:
        args.max_questions = 64
    if not os.path.exists(args.file):
        raise SystemExit(f"skipped: {args.file} not found (../shared absent: --file FILE)")
    conf = os.path.join(ROOT, "conf", "task")
    tokenizer = load_tokenizer(OmegaConf.create({"name": "bench", "name_or_path": args.vocab,
                                                 "tokenizer_kwargs": {"do_lower_case": False}}))
    result = []
    for decode in ("token", "char"):
        cfg = OmegaConf.merge(OmegaConf.load(os.path.join(conf, f"{args.task}.yaml")),
                              {"decode": decode, "doc_stride": args.doc_stride})
        task = build_task(cfg)
        t0 = time.perf_counter()
        examples = task.read_file(args.file)[: args.max_questions]
        t1 = time.perf_counter()
        features = task.encode(examples, tokenizer, EncodeSettings(max_length=args.max_length))
        t2 = time.perf_counter()
        column = features["char_position"] if decode == "char" else features["token_start"]
        width = max(len(r) for r in column)
        rng = np.random.default_rng(args.seed)
        logits = tuple(rng.standard_normal((len(features), width)).astype(np.float32) for _ in range(2))
        t3 = time.perf_counter()
        outputs = task.decode(logits, features, examples)
        t4 = time.perf_counter()
        task.score(outputs, examples)
        t5 = time.perf_counter()
        print(f"{decode:5s} questions {len(examples)}  windows {len(features)}  read {t1 - t0:.1f}s  "
              f"windows {t2 - t1:.1f}s  decode {t4 - t3:.1f}s  score {t5 - t4:.1f}s", flush=True)
        result += [f"{decode}_windows={len(features)}", f"{decode}_decode_s={t4 - t3:.2f}", f"{decode}_score_s={t5 - t4:.2f}"]
    print("RESULT " + " ".join(result), flush=True)


if __name__ == "__main__":
    main()
