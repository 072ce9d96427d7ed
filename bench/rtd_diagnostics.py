"""Why an RTD discriminator stays at the base rate (issue 54): the bench's mini ELECTRA (bench/pretraining.py's
recipe: ``--hidden``, ``--layers``, ``--vocab``, ``--block``, ``--batch``, sinusoidal positions, tied
query/key init, dropout 0) trained by a plain loop (AdamW, linear warmup ``--warmup`` then decay, gradient
norm 1) on the action's own blocks, keyed masks and model (heads/model/rtd.py ``load_rtd_model``), one arm:

- ``uniform``: the discriminator alone, every masked position replaced by a uniform random token;
- ``unigram``: the discriminator alone, replacements drawn from the corpus's token frequencies (what
  a generator that has learned only the unigram distribution proposes: its identity tells nothing);
- ``frozen``: the whole RTD path (generator, sampling, ``masked_scatter``, labels), the generator
  frozen at its random init (near-uniform replacements), only the discriminator's loss;
- ``rtd``: RTD as built (``pretrain.objective=rtd``'s loss);
- ``mlm``: masked LM on the same encoder (``load_mlm_model``): does it read context in this budget?

At each step of ``--at``, on the held-out blocks (one fixed masking and sampling): the detection
accuracy against always 'original', recall, BCE against the base rate's entropy, AUC; for ``rtd``
also the generator's masked cross-entropy against the unigram's and the AUC of a detector that sees
only the token (each token's replaced rate under the current generator, counted on 20 training
batches); for ``mlm`` the masked accuracy against always answering the most frequent token.

    OMP_NUM_THREADS=1 python -m bench.rtd_diagnostics --arm uniform --steps 200 --at 50,100,200
    OMP_NUM_THREADS=1 python -m bench.rtd_diagnostics --smoke                    # tiny settings

Prints ``RESULT arm=… steps=… auc=… accuracy=… base=…`` (the last checkpoint).
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from bench.pretraining import SMOKE, pretrain_overrides
from bench.common import add_mini_shape_arguments

ARMS = ("uniform", "unigram", "frozen", "rtd", "mlm")


def main() -> None:
    from heads.model.encoder import load_tokenizer
    from heads.model.mlm import load_mlm_model, masked_lm_loss, mlm_metrics
    from heads.model.rtd import detection_auc, load_rtd_model
    from kotune.cli.overrides import compose
    from tasks import pretrain
    from tasks.base import IGNORE

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", default="rtd", choices=ARMS)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--at", default="50,100,300", help="the steps scored (0 always)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=float, default=0.06, help="warmup share of --steps")
    add_mini_shape_arguments(p, vocab=2000)
    p.add_argument("--eval-blocks", type=int, default=100)
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--smoke", action="store_true", help="tiny settings, every arm's code on 2 steps")
    a = p.parse_args()
    if a.smoke:
        a.vocab, a.hidden, a.layers, a.block, a.batch = (SMOKE[k] for k in ("vocab", "hidden", "layers", "block", "batch"))
        a.steps, a.at, a.eval_blocks = 2, "1,2", 8
    torch.manual_seed(0)
    recipe = SimpleNamespace(vocab=a.vocab, hidden=a.hidden, layers=a.layers, block=a.block, batch=a.batch, lr=a.lr,
                             pretrain_steps=a.steps, dropout=0.0, position_init="sinusoidal", attention_init="tied_qk",
                             objective="rtd", architecture="electra", ft_max_length=max(128, a.block), smoke=a.smoke)
    cfg = compose(pretrain_overrides(recipe, a.cache_dir))
    settings = cfg.pretrain
    text = pretrain.load_text(cfg.data, 0)
    tokenizer = load_tokenizer(cfg.model, texts=text["train"].lines, cache_dir=cfg.cache_dir)
    blocks = {s: pretrain.model_blocks(tokenizer, t, a.block, 0) for s, t in text.items()}
    held = pretrain.masked_batches(pretrain.model_rows(blocks["validation"], False)[:a.eval_blocks],
                                   pretrain.mlm_collator(tokenizer, settings, seed=0), 50)
    rows = pretrain.KeyedRows(pretrain.model_rows(blocks["train"], False))
    collate = pretrain.training_collator(tokenizer, settings, 0)
    vocab = len(tokenizer)
    counts = torch.zeros(vocab)
    for row in blocks["train"]:
        counts += torch.bincount(torch.tensor(row["input_ids"]), minlength=vocab).float()
    unigram = counts / counts.sum()
    model = load_rtd_model(cfg.model, vocab, 0, settings, pad_token_id=tokenizer.pad_token_id)
    if a.arm == "mlm":
        model = load_mlm_model(cfg.model, vocab, 0, "sinusoidal", "tied_qk", pad_token_id=tokenizer.pad_token_id)
    if a.arm == "frozen":
        for name, weight in model.generator.named_parameters():
            weight.requires_grad_(name.startswith("electra.embeddings"))  # the shared embeddings train
    noise = torch.Generator().manual_seed(1)

    def replaced_by_hand(batch: dict, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = batch["labels"] != IGNORE
        original = torch.where(chosen, batch["labels"], batch["input_ids"])
        if a.arm == "unigram":
            drawn = torch.multinomial(unigram, original.numel(), replacement=True, generator=generator)
        else:
            drawn = torch.randint(5, vocab, (original.numel(),), generator=generator)
        corrupted = torch.where(chosen, drawn.view(original.shape), original)
        return corrupted, corrupted != original

    def detect(batch: dict, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Discriminator logits, replaced, and the discriminator's input, at the real tokens."""
        real = batch["attention_mask"].bool()
        if a.arm in ("uniform", "unigram"):
            corrupted, replaced = replaced_by_hand(batch, generator or noise)
            logits = model.discriminator(corrupted, attention_mask=batch["attention_mask"]).logits
            return logits[real], replaced[real], corrupted[real]
        out = model(**batch, sampler=generator)
        chosen = batch["labels"] != IGNORE
        corrupted = torch.where(chosen, batch["labels"], batch["input_ids"]).masked_scatter(chosen, out["sampled"])
        return out["discriminator_logits"][real], out["replaced"][real], corrupted[real]

    @torch.no_grad()
    def score(step: int) -> dict:
        model.eval()
        if a.arm == "mlm":
            m = mlm_metrics(model, held)
            gold = torch.cat([b["labels"][b["labels"] != IGNORE] for b in held])
            top = 100 * float((gold == unigram.argmax()).float().mean())
            print(f"step {step}: masked accuracy {m['mlm_accuracy']:.2f} % (most frequent token {top:.2f} %), "
                  f"loss {m['mlm_loss']:.3f} (unigram {-float(unigram[gold].clamp_min(1e-12).log().mean()):.3f})",
                  flush=True)
            model.train()
            return {"auc": float("nan"), "accuracy": m["mlm_accuracy"], "base": top}
        extra = ""
        if a.arm == "rtd":  # the generator, and what the replaced token's identity alone tells
            m = mlm_metrics(model.generator, held)
            gold = torch.cat([b["labels"][b["labels"] != IGNORE] for b in held])
            replaced_count, seen = torch.zeros(vocab), torch.zeros(vocab)
            fit = torch.Generator().manual_seed(5)
            for i in range(20):  # keys of an epoch never trained on
                keys = [(10 ** 6, (i * a.batch + j) % len(rows)) for j in range(a.batch)]
                _, replaced, corrupted = detect(collate([rows[k] for k in keys]), fit)
                seen += torch.bincount(corrupted, minlength=vocab).float()
                replaced_count += torch.bincount(corrupted[replaced], minlength=vocab).float()
            rate = (replaced_count + 0.14) / (seen + 1)
        scores, gold_all, identity = [], [], []
        fixed = torch.Generator().manual_seed(0)
        for batch in held:
            logits, replaced, corrupted = detect(batch, fixed)
            scores.append(logits.float())
            gold_all.append(replaced)
            if a.arm == "rtd":
                identity.append(rate[corrupted])
        scores, gold_all = torch.cat(scores), torch.cat(gold_all)
        if a.arm == "rtd":
            extra = (f" | generator masked accuracy {m['mlm_accuracy']:.2f} %, loss {m['mlm_loss']:.3f} (unigram "
                     f"{-float(unigram[gold].clamp_min(1e-12).log().mean()):.3f}); token-identity-only AUC "
                     f"{detection_auc(torch.cat(identity), gold_all):.3f}")
        share = float(gold_all.float().mean())
        entropy = -sum(q * math.log(q) for q in (share, 1 - share) if q > 0)
        found = scores > 0
        point = {"auc": detection_auc(scores, gold_all), "accuracy": 100 * float((found == gold_all).float().mean()),
                 "base": 100 * (1 - share)}
        print(f"step {step}: detection accuracy {point['accuracy']:.2f} % (always 'original' {point['base']:.2f} %), "
              f"recall {100 * float((found & gold_all).sum()) / max(1, int(gold_all.sum())):.2f} %, BCE "
              f"{float(F.binary_cross_entropy_with_logits(scores, gold_all.float())):.4f} (base rate "
              f"{entropy:.4f}), AUC {point['auc']:.3f}{extra}", flush=True)
        model.train()
        return point

    optimizer = torch.optim.AdamW([w for w in model.parameters() if w.requires_grad], lr=a.lr, weight_decay=0.0)
    warm = max(1, int(a.warmup * a.steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warm, max(0.0, (a.steps - s) / max(1, a.steps - warm))))
    sampler = pretrain.EpochSampler(len(rows), 0)

    def keys():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from iter(sampler)
            epoch += 1

    order, at = keys(), {int(s) for s in a.at.split(",") if s}
    point = score(0)
    for step in range(1, a.steps + 1):
        batch = collate([rows[next(order)] for _ in range(a.batch)])
        if a.arm == "mlm":
            loss = masked_lm_loss(model, batch)
        elif a.arm == "rtd":
            loss = model(**batch)["loss"]
        else:
            logits, replaced, _ = detect(batch)
            loss = F.binary_cross_entropy_with_logits(logits, replaced.float())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step in at:
            point = score(step)
    print(f"RESULT arm={a.arm} steps={a.steps} lr={a.lr} auc={point['auc']:.3f} accuracy={point['accuracy']:.2f} "
          f"base={point['base']:.2f}")


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    main()
