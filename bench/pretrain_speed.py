"""Pretraining throughput: packed blocks (``action=pretrain``) against line-by-line rows padded to
``max_length`` (HF run_mlm's ``--line_by_line --pad_to_max_length``), same model, tokenizer,
collator, optimizer and batch size, in the same run.

    python bench/pretrain_speed.py [--lines 4000 --max-length 128 --batch 32 --steps 15]

Prints the padding efficiency of both layouts, real (non-padding) tokens per second of training
steps (median of per-step rates after one warm-up step) and
``RESULT pretrain_speedup=<packed tokens/s ÷ line-by-line tokens/s> packed_padding_efficiency=…``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

CORPUS = os.path.join(os.path.dirname(ROOT), "shared", "data", "corpus", "news-comments.txt")


def tokens_per_second(model, rows: list[dict], collator, batch: int, steps: int) -> float:
    import torch

    from bench.common import median, timed

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rates = []
    for step in range(steps + 1):
        chunk = rows[(step * batch) % len(rows):][:batch]
        real = sum(sum(r["attention_mask"]) for r in chunk)
        inputs = collator(chunk)
        with timed() as t:
            loss = model(**inputs).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        if step:  # the first step warms up the allocator and thread pool
            rates.append(real / t["s"])
    return median(rates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=4000)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--vocab", type=int, default=2000)
    a = p.parse_args()
    if not os.path.exists(CORPUS):
        raise SystemExit(f"skipped: {CORPUS} not found (../shared absent)")
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForMaskedLM, BertConfig

    from heads.encoder import train_wordpiece
    from tasks import pretrain

    with open(CORPUS, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()][: a.lines]
    tokenizer = train_wordpiece(lines, a.vocab, os.path.join(tempfile.gettempdir(), "kotune_speed_tok"))
    ids, offsets = pretrain.tokenize_lines(tokenizer, lines)
    layouts = {"packed": pretrain.pack_blocks(tokenizer, ids, offsets, a.max_length),
               "line_by_line": pretrain.line_blocks(tokenizer, ids, offsets, a.max_length)}
    collator = pretrain.mlm_collator(tokenizer, OmegaConf.create({"mlm_probability": 0.15, "whole_word": False}), seed=0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=512, max_position_embeddings=a.max_length)
    speed = {}
    for name, rows in layouts.items():
        torch.manual_seed(0)
        model = AutoModelForMaskedLM.from_config(config)
        model.train()
        speed[name] = tokens_per_second(model, pretrain.model_rows(rows, False), collator, a.batch, a.steps)
        print(f"{name:13s} {len(rows):6d} rows of {a.max_length}, padding efficiency "
              f"{pretrain.padding_efficiency(rows):.3f}, {speed[name]:,.0f} real tokens/s", flush=True)
    print(f"RESULT pretrain_speedup={speed['packed'] / speed['line_by_line']:.2f} "
          f"packed_padding_efficiency={pretrain.padding_efficiency(layouts['packed']):.4f} "
          f"line_by_line_padding_efficiency={pretrain.padding_efficiency(layouts['line_by_line']):.4f} "
          f"packed_tokens_per_s={speed['packed']:.0f}")


if __name__ == "__main__":
    main()
