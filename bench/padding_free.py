"""``model.padding_free`` against the padded batch: one training step's forward + backward time on a batch of
skewed lengths (a few long rows, many short ones), as a ratio to the padded path measured in the same process.

    python -m bench.padding_free            # BERT 4 layers × 256, 32 rows: 2 of 256 tokens, 30 of 8-32
    python -m bench.padding_free --smoke    # 1 layer × 32, 8 rows, 3 repeats: the code path, not a figure

The model is kotune's (``KotuneModel``: a random encoder and the sequence head, dropout off so both paths
compute the same thing); both paths run alternately, ``--repeats`` times each after a warm-up, and the
median of each is kept. Each step's loss and gradients are compared too (the packed path must give the
padded path's, within 1e-5). The device is whatever torch runs on here; on a CPU the attention kernel is the
same dense one for both paths (block-diagonal mask over the N packed tokens: N² scores where the padded
batch computes B·T²), and what packing saves is the linear layers' work on the pads. The last line:

    RESULT device=<cpu|cuda> rows=<B> padded_tokens=<B·T> real_tokens=<N> padded_s=<s> packed_s=<s>
           ratio=<packed/padded> max_loss_diff=<d> max_grad_diff=<d>   (one line)
"""
from __future__ import annotations

import argparse
import os

import torch


def skewed_batch(rows: int, long_rows: int, long: int, short: tuple[int, int], vocab: int, seed: int) -> dict:
    """``long_rows`` rows of ``long`` tokens, the rest of ``short[0]``–``short[1]``, right-padded."""
    g = torch.Generator().manual_seed(seed)
    lengths = [long] * long_rows + torch.randint(short[0], short[1] + 1, (rows - long_rows,), generator=g).tolist()
    mask = (torch.arange(long) < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(5, vocab, mask.shape, generator=g).masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "labels": torch.randint(0, 3, (rows,), generator=g)}


def build(args):
    from transformers import AutoConfig, AutoModel

    from heads.model.kotune_model import KotuneModel

    config = AutoConfig.for_model("bert", vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                  num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden,
                                  max_position_embeddings=max(512, args.long), hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(args.seed)
    encoder = AutoModel.from_config(config, add_pooling_layer=False)
    return KotuneModel(encoder, "sequence", {"num_labels": 3, "dropout": 0.0}).train()


def step(model, batch: dict, padding_free: bool) -> tuple[float, list[torch.Tensor]]:
    """One forward + backward; the loss and the gradients it left."""
    from bench.common import sync

    model.padding_free = padding_free
    model.zero_grad(set_to_none=True)
    loss = model(**batch)["loss"]
    loss.backward()
    sync()
    return float(loss.detach()), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--long-rows", type=int, default=2)
    parser.add_argument("--long", type=int, default=256, help="the long rows' length (the padded length)")
    parser.add_argument("--short", type=int, nargs=2, default=(8, 32), help="the short rows' lengths, low high")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    from bench.common import device, median, parse_with_smoke, timed

    args = parse_with_smoke(parser, {"layers": 1, "hidden": 32, "vocab": 100, "rows": 8, "long_rows": 1, "long": 48,
                                     "short": (2, 8), "repeats": 3})
    from heads.model.packing import check_padding_free

    on = device()
    model = build(args).to(on)
    check_padding_free(model.encoder)  # one line where this transformers cannot
    batch = {k: v.to(on) for k, v in skewed_batch(args.rows, args.long_rows, args.long, tuple(args.short), args.vocab,
                                                  args.seed).items()}
    real = int(batch["attention_mask"].sum())
    print(f"# model.padding_free on {on.type}: BERT {args.layers} x {args.hidden}, {args.rows} rows "
          f"({args.long_rows} of {args.long} tokens, the rest {args.short[0]}-{args.short[1]}): {real} real tokens of "
          f"{batch['input_ids'].numel()} padded; torch threads {torch.get_num_threads()}, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    padded_loss, padded_grads = step(model, batch, False)  # warm-up, and the reference
    packed_loss, packed_grads = step(model, batch, True)
    loss_diff = abs(packed_loss - padded_loss)
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(padded_grads, packed_grads))
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for padding_free in (False, True):  # alternately: a drift in the machine's load hits both
            with timed() as t:
                step(model, batch, padding_free)
            times[padding_free].append(t["s"])
    padded_s, packed_s = median(times[False]), median(times[True])
    print(f"padded  forward+backward {padded_s * 1e3:8.1f} ms (median of {args.repeats})")
    print(f"packed  forward+backward {packed_s * 1e3:8.1f} ms  ratio {packed_s / padded_s:.2f} of padded  "
          f"|loss diff| {loss_diff:.1e}  max |grad diff| {grad_diff:.1e}")
    print(f"RESULT device={on.type} rows={args.rows} padded_tokens={batch['input_ids'].numel()} real_tokens={real} "
          f"padded_s={padded_s:.4f} packed_s={packed_s:.4f} ratio={packed_s / padded_s:.3f} "
          f"max_loss_diff={loss_diff:.1e} max_grad_diff={grad_diff:.1e}")
    if loss_diff > 1e-5 or grad_diff > 1e-5:
        raise SystemExit(f"the packed step differs from the padded one (loss {loss_diff:.1e}, gradients {grad_diff:.1e})")


if __name__ == "__main__":
    main()
