"""How long QA post-processing takes: windows, n-best decoding and the official metric over a
whole SQuAD-format file, with random logits in Trainer's shape (no model).

    python bench/qa_decode.py --file ../shared/data/korquad/KorQuAD_v1.0_dev.json \
        --vocab ../shared/vocab/kcbert-base --max-length 300

Prints one line per decoding: questions, windows, seconds to build windows, to decode, to score.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from omegaconf import OmegaConf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from heads.encoder import load_tokenizer  # noqa: E402
from tasks import build_task  # noqa: E402
from tasks.base import EncodeSettings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", required=True)
    parser.add_argument("--vocab", required=True, help="a vocab directory or tokenizer id")
    parser.add_argument("--task", default="korquad")
    parser.add_argument("--max-length", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "task")
    tokenizer = load_tokenizer(OmegaConf.create({"name": "bench", "name_or_path": args.vocab,
                                                 "tokenizer_kwargs": {"do_lower_case": False}}))
    for decode in ("token", "char"):
        cfg = OmegaConf.merge(OmegaConf.load(os.path.join(conf, f"{args.task}.yaml")),
                              {"decode": decode, "doc_stride": args.doc_stride})
        task = build_task(cfg)
        t0 = time.perf_counter()
        examples = task.read_file(args.file)
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


if __name__ == "__main__":
    main()
