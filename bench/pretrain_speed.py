"""Pretraining throughput: kotune's ``action=pretrain`` training step against the stock anchor a
user would pick, run_mlm's default recipe (``BertForMaskedLM`` + ``DataCollatorForLanguageModeling``
+ ``Trainer`` on packed ``group_texts`` blocks), in one process, alternating, from the same initial
weights on the same blocks of ``../shared/data/corpus``, on two shapes:

- ``mini``: the pretraining bench's model (BERT 2 × 128, 2 heads, FFN 512, dropout 0, WordPiece
  asked for 2,000 entries on the corpus), 64-token blocks, batch 64;
- ``base``: BERT-base's shape (12 × 768, 12 heads, FFN 3072, the KcBERT vocabulary of 30,000),
  128-token blocks, batch 8.

    python -m bench.pretrain_speed [--rounds 3 --steps 6 --base-steps 2 --profile]
    python -m bench.pretrain_speed --smoke   # both shapes shrunk, 1 round of 1 step, 2,000 corpus lines

Each round trains every variant ``steps`` optimizer steps after one warm-up step; a step's rate is
block positions / the wall time between two step ends (data loading, masking, forward, backward,
optimizer). Medians over all measured steps. Prints tokens/s and the peak memory each variant adds,
``--profile`` the top operators of one step of each, and
``RESULT pretrain_speedup_vs_packed_mini=… pretrain_speedup_vs_packed_base=… loss_equal_at_step0=yes|no``
(step 0: kotune's masked-position loss and the stock forward's loss on the same batch and weights).
``--paired-steps N`` adds the median ratio of stock and kotune steps taken back to back on the same
batch (forward, backward, AdamW; no Trainer), which a drifting load on a shared machine disturbs less.
"""
from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("KOTUNE_PROGRESS", "0")

from bench.pretraining import CORPUS  # noqa: E402
from kotune.cli.overrides import compose  # noqa: E402

KCBERT_VOCAB = os.path.join(os.path.dirname(ROOT), "shared", "vocab", "kcbert-base")
SHAPES = {  # name → (BertConfig sizes, block length, batch)
    "mini": ({"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512,
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}, 64, 64),
    "base": ({"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
             128, 8),
}

# --smoke: both shapes shrunk (the base one keeps the KcBERT vocabulary), the corpus cut to its first lines
SMOKE_SHAPES = {
    "mini": ({**SHAPES["mini"][0], "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 1,
              "intermediate_size": 64}, 32, 8),
    "base": ({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}, 32, 4),
}
SMOKE_LINES = 2000


def step_clock():
    """A Trainer callback that records the wall time of every step end."""
    from transformers import TrainerCallback

    from bench.common import sync

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            self.ends.append(time.perf_counter())

    return Clock()


def stock_trainer(model, tokenizer, rows: list[dict], batch: int, steps: int, out: str):
    """run_mlm's default: Trainer's default arguments, the library collator, packed blocks."""
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from bench.common import device

    args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, max_steps=steps, learning_rate=1e-3,
                             save_strategy="no", logging_strategy="no", report_to="none", seed=0, disable_tqdm=True,
                             use_cpu=device().type == "cpu")
    stock_rows = [{"input_ids": r["input_ids"], "attention_mask": r["attention_mask"],
                   "token_type_ids": [0] * len(r["input_ids"]), "special_tokens_mask": r["special_tokens_mask"]}
                  for r in rows]
    return Trainer(model=model, args=args, train_dataset=stock_rows,
                   data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15))


def pretrain_config(batch: int, steps: int, precision: str = "fp32"):
    """The composed config of ``action=pretrain`` with this batch, step count and precision."""
    return compose(["action=pretrain", "model=tiny", f"train.batch_size={batch}", "train.learning_rate=1e-3",
                    f"train.max_steps={steps}", "train.logging_steps=100000", f"train.precision={precision}",
                    "train.group_by_length=false"])


def kotune_trainer(model, tokenizer, rows: list[dict], batch: int, steps: int, out: str, precision: str = "fp32"):
    """What ``action=pretrain`` builds: its arguments, Trainer class, keyed rows and collator."""
    from kotune.training.pretraining import PretrainingTrainer
    from kotune.training.arguments import training_arguments
    from tasks import pretrain

    cfg = pretrain_config(batch, steps, precision)
    args = training_arguments(cfg, out, ["labels"], do_eval=False)
    return PretrainingTrainer(
        model=model, args=args, train_dataset=pretrain.KeyedRows(pretrain.model_rows(rows, False)),
        data_collator=pretrain.training_collator(tokenizer, cfg.pretrain, int(cfg.train.seed)))


def kotune_before_trainer(model, tokenizer, rows: list[dict], batch: int, steps: int, out: str):
    """``action=pretrain`` before masked-position prediction and keyed masks: kotune's arguments and
    Trainer class, the model's full forward, the library collator on the global RNG."""
    from kotune.training.trainer import KotuneTrainer
    from kotune.training.arguments import training_arguments
    from tasks import pretrain

    cfg = pretrain_config(batch, steps)
    return KotuneTrainer(model=model, args=training_arguments(cfg, out, ["labels"], do_eval=False),
                         train_dataset=pretrain.model_rows(rows, False),
                         data_collator=pretrain.mlm_collator(tokenizer, cfg.pretrain))


def measure(make, initial, tokens_per_step: int, steps: int, profile: bool) -> tuple[list[float], int]:
    """Per-step rates (positions/s) of ``steps`` steps after one warm-up, and the peak memory added."""
    from bench.common import PeakMemory

    model = copy.deepcopy(initial)
    with tempfile.TemporaryDirectory() as out, PeakMemory() as memory:
        trainer = make(model, steps + 1, out)
        clock = step_clock()
        trainer.add_callback(clock)
        if profile:
            from torch.profiler import ProfilerActivity, profile as torch_profile

            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                trainer.train()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8), flush=True)
        else:
            trainer.train()
    gaps = [b - a for a, b in zip(clock.ends, clock.ends[1:])]
    return [tokens_per_step / g for g in gaps], memory.peak_bytes


def paired_ratios(initial, tokenizer, rows: list[dict], batch: int, steps: int) -> list[float]:
    """Stock step time ÷ kotune step time, the two steps taken back to back on the same batch (order
    alternating), each on its own copy of the weights with its own AdamW: on a shared machine the
    load drifts within seconds less than between two Trainer runs. One warm-up pair is dropped."""
    import torch
    from omegaconf import OmegaConf

    from bench.common import timed
    from heads.model.mlm import masked_lm_loss
    from tasks import pretrain

    collator = pretrain.training_collator(tokenizer, OmegaConf.create({"mlm_probability": 0.15, "whole_word": False}), 0)
    keyed = pretrain.KeyedRows(pretrain.model_rows(rows, False))
    losses = {"stock": lambda m, b: m(**b).loss, "kotune": masked_lm_loss}
    models = {name: copy.deepcopy(initial) for name in losses}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in models.items()}
    ratios = []
    for step in range(steps + 1):
        inputs = collator([keyed[(0, step * batch + i)] for i in range(batch)])
        seconds = {}
        for name in (("stock", "kotune") if step % 2 else ("kotune", "stock")):
            with timed() as t:
                losses[name](models[name], inputs).backward()
                optimizers[name].step()
                optimizers[name].zero_grad()
            seconds[name] = t["s"]
        if step:
            ratios.append(seconds["stock"] / seconds["kotune"])
    return ratios


def step0_losses(model, tokenizer, rows: list[dict]) -> tuple[float, float]:
    """The stock forward's loss and kotune's on one batch (kotune's masks), initial weights, no dropout."""
    import torch
    from omegaconf import OmegaConf

    from heads.model.mlm import masked_lm_loss
    from tasks import pretrain

    collator = pretrain.training_collator(tokenizer, OmegaConf.create({"mlm_probability": 0.15, "whole_word": False}), 0)
    keyed = pretrain.KeyedRows(pretrain.model_rows(rows, False))
    batch = collator([keyed[(0, i)] for i in range(min(16, len(rows)))])
    model.eval()  # no dropout: the same computation twice
    with torch.no_grad():
        losses = float(model(**batch).loss), float(masked_lm_loss(model, batch))
    model.train()
    return losses


def shape_setup(name: str, lines: list[str], cache_dir: str):
    """Tokenizer, packed blocks and the seeded initial model of one shape."""
    import torch
    from transformers import AutoModelForMaskedLM, BertConfig, BertTokenizer

    from heads.model.encoder import train_wordpiece
    from tasks import pretrain

    sizes, block, batch = SHAPES[name]
    if name == "mini":
        tokenizer = train_wordpiece(lines, 2000, cache_dir)
    else:
        tokenizer = BertTokenizer.from_pretrained(KCBERT_VOCAB, do_lower_case=False)
    ids, offsets = pretrain.tokenize_lines(tokenizer, lines)
    rows = pretrain.pack_blocks(tokenizer, ids, offsets, block)
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **sizes))
    model.train()
    return tokenizer, rows, model, block * batch, batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="alternations of stock and kotune per shape")
    p.add_argument("--steps", type=int, default=6, help="measured steps per round, mini shape")
    p.add_argument("--base-steps", type=int, default=2, help="measured steps per round, base shape")
    p.add_argument("--shapes", default="mini,base")
    p.add_argument("--paired-steps", type=int, default=0,
                   help="also time this many stock and kotune steps back to back (drift-robust ratio)")
    p.add_argument("--before", action="store_true", help="also kotune's step before masked-position prediction")
    p.add_argument("--bf16", action="store_true", help="also kotune with train.precision=bf16 (autocast)")
    p.add_argument("--profile", action="store_true", help="print the top operators of each variant's first round")
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE") or tempfile.gettempdir())
    from bench.common import parse_with_smoke

    a = parse_with_smoke(p, {"rounds": 1, "steps": 1, "base_steps": 1})
    if a.smoke:
        SHAPES.update(SMOKE_SHAPES)
    if not all(os.path.exists(path) for path in CORPUS + [KCBERT_VOCAB]):
        raise SystemExit("skipped: ../shared absent (the corpus and the KcBERT vocabulary)")
    from kotune.devices import quiet_libraries
    from bench.common import median

    quiet_libraries()
    lines = []
    for path in CORPUS:
        with open(path, encoding="utf-8") as f:
            lines += [line.strip() for line in f if line.strip()]
    lines = lines[:SMOKE_LINES] if a.smoke else lines
    results, paired, equal = {}, {}, True
    for name in a.shapes.split(","):
        tokenizer, rows, initial, tokens_per_step, batch = shape_setup(name, lines, a.cache_dir)
        stock_loss, kotune_loss = step0_losses(initial, tokenizer, rows)
        equal &= abs(stock_loss - kotune_loss) < 1e-5
        print(f"{name}: vocabulary {len(tokenizer):,}, {len(rows):,} blocks, step-0 loss stock {stock_loss:.6f} "
              f"kotune {kotune_loss:.6f}", flush=True)
        variants = {"stock": lambda m, s, o: stock_trainer(m, tokenizer, rows, batch, s, o),
                    "kotune": lambda m, s, o: kotune_trainer(m, tokenizer, rows, batch, s, o)}
        if a.before:
            variants["kotune_before"] = lambda m, s, o: kotune_before_trainer(m, tokenizer, rows, batch, s, o)
        if a.bf16:
            variants["kotune_bf16"] = lambda m, s, o: kotune_trainer(m, tokenizer, rows, batch, s, o, "bf16")
        steps = a.steps if name == "mini" else a.base_steps
        rates = {v: [] for v in variants}
        memory = {}
        for round_ in range(a.rounds):
            for variant, make in variants.items():
                measured, peak = measure(make, initial, tokens_per_step, steps, a.profile and round_ == 0)
                rates[variant] += measured
                memory[variant] = max(memory.get(variant, 0), peak)
                print(f"  round {round_ + 1} {variant:11s} {median(measured):9,.0f} tokens/s", flush=True)
        results[name] = {v: median(r) for v, r in rates.items()}
        if a.paired_steps:
            paired[name] = median(paired_ratios(initial, tokenizer, rows, batch, a.paired_steps))
            print(f"{name} paired steps: stock ÷ kotune step time, median of {a.paired_steps}: {paired[name]:.2f}",
                  flush=True)
        for variant, rate in results[name].items():
            print(f"{name} {variant:11s} median {rate:9,.0f} tokens/s over {len(rates[variant])} steps, "
                  f"peak memory +{memory[variant] / 2**20:,.0f} MiB", flush=True)
    speedups = " ".join(f"pretrain_speedup_vs_packed_{n}={r['kotune'] / r['stock']:.2f}" for n, r in results.items())
    rates = " ".join(f"{n}_{v}_tokens_per_s={x:.0f}" for n, r in results.items() for v, x in r.items())
    paired_text = "".join(f" paired_step_speedup_{n}={r:.2f}" for n, r in paired.items())
    print(f"RESULT {speedups} loss_equal_at_step0={'yes' if equal else 'no'}{paired_text} {rates}")


if __name__ == "__main__":
    main()
