"""The RTD step's sampling (heads/model/rtd.py ``sample``) against the per-row sampler it replaced
(one ``torch.Generator`` and one ``torch.multinomial`` per row): both timed in one process, on the
same masked batch of the bench's mini ELECTRA (``--hidden``, ``--layers``, ``--vocab`` the size the
mini recipe's WordPiece comes out at, ``--block``, ``--batch``; random weights and token ids):
``sample`` alone, and a whole training step (generator, sampling, discriminator, backward) with
each, single steps alternating, ``--rounds`` rounds, medians.

    OMP_NUM_THREADS=1 python -m bench.rtd_sample_speed     # --smoke: tiny settings

Prints ``RESULT sample_ms_per_row=… sample_ms_keyed=… step_ms_per_row=… step_ms_keyed=… step_ratio=…``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def per_row_sample(probabilities, per_row, seeds, sampler):
    """The replaced sampler: each row's draws from a generator seeded with its seed."""
    drawn = []
    for rows, seed in zip(probabilities.split(per_row.tolist()), seeds.tolist()):
        if len(rows):
            generator = torch.Generator(device=rows.device).manual_seed(int(seed))
            drawn.append(torch.multinomial(rows, 1, generator=generator).squeeze(-1))
    return torch.cat(drawn)


def main() -> None:
    import heads.model.rtd as rtd
    from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

    from tasks.base import IGNORE
    from bench.common import add_mini_shape_arguments

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_mini_shape_arguments(p, vocab=4135)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=6, help="timed steps of each a round (and 4x as many sample calls)")
    p.add_argument("--smoke", action="store_true", help="tiny settings")
    a = p.parse_args()
    if a.smoke:
        a.hidden, a.layers, a.vocab, a.block, a.batch, a.rounds, a.steps = 32, 1, 300, 16, 4, 1, 1
    torch.manual_seed(0)
    config = ElectraConfig(vocab_size=a.vocab, embedding_size=a.hidden, hidden_size=a.hidden,
                           num_hidden_layers=a.layers, num_attention_heads=max(1, a.hidden // 64),
                           intermediate_size=4 * a.hidden, max_position_embeddings=a.block,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = rtd.ReplacedTokenDetection(ElectraForPreTraining(config),
                                       ElectraForMaskedLM(rtd.generator_config(config, rtd.GENERATOR_SIZE)))
    ids = torch.randint(5, a.vocab, (a.batch, a.block))
    chosen = torch.rand(a.batch, a.block) < 0.15
    batch = {"input_ids": ids.masked_fill(chosen, 4), "labels": ids.masked_fill(~chosen, IGNORE),
             "attention_mask": torch.ones_like(ids), "sample_seed": torch.randint(0, 2 ** 62, (a.batch,))}
    probabilities = torch.softmax(torch.randn(int(chosen.sum()), a.vocab), -1)
    samplers = {"per_row": per_row_sample, "keyed": rtd.sample}

    def sample_ms(fn) -> float:
        start = time.perf_counter()
        for _ in range(4 * a.steps):
            fn(probabilities, chosen.sum(1), batch["sample_seed"], None)
        return (time.perf_counter() - start) / (4 * a.steps) * 1000

    def step_ms(fn) -> float:
        rtd.sample = fn
        start = time.perf_counter()
        model.zero_grad()
        model(**batch)["loss"].backward()
        return (time.perf_counter() - start) * 1000

    keyed = rtd.sample
    try:
        for fn in samplers.values():  # warm up
            step_ms(fn)
        times = {(kind, name): [] for kind in ("sample", "step") for name in samplers}
        for r in range(a.rounds):
            for name, fn in samplers.items():
                times["sample", name].append(sample_ms(fn))
            for _ in range(a.steps):  # single steps, alternating (a shared machine's load drifts)
                for name, fn in (samplers.items() if r % 2 else reversed(samplers.items())):
                    times["step", name].append(step_ms(fn))
    finally:
        rtd.sample = keyed
    ms = {key: statistics.median(v) for key, v in times.items()}
    print(f"{a.batch} rows x {a.block} tokens, {int(chosen.sum())} masked, vocab {a.vocab}, {torch.get_num_threads()} "
          f"thread(s); medians over {a.rounds} rounds ({a.rounds * a.steps} single steps of each, alternating)")
    for kind in ("sample", "step"):
        print(f"{kind}: per-row generators {ms[kind, 'per_row']:.1f} ms, keyed {ms[kind, 'keyed']:.1f} ms "
              f"({ms[kind, 'per_row'] / ms[kind, 'keyed']:.2f}x)")
    print(f"RESULT sample_ms_per_row={ms['sample', 'per_row']:.1f} sample_ms_keyed={ms['sample', 'keyed']:.1f} "
          f"step_ms_per_row={ms['step', 'per_row']:.1f} step_ms_keyed={ms['step', 'keyed']:.1f} "
          f"step_ratio={ms['step', 'per_row'] / ms['step', 'keyed']:.2f}")


if __name__ == "__main__":
    main()
