"""KLUE RE AUPRC when a relation has no gold example (a held-out split, ``data.max_eval_samples``).

Synthetic: 800 examples over 30 relations, relation 0 never gold, logits = noise + ``signal`` on
the gold relation. Today's scikit-learn gives the absent relation recall 1 at every threshold and
an area of 0.5 (KLUE-baseline's pinned 0.24.1: NaN for the whole AUPRC); kotune leaves it out.
The 0.5 pulls the mean towards 50: up for a weak model, down for a strong one.

    python -m bench.auprc_absent_class
    python -m bench.auprc_absent_class --smoke   # 200 examples: the same steps (tests/test_bench_smoke.py)

Prints per signal the mean over all 30 relations and over the 29 present ones, and
``RESULT auprc_absent_bias_weak=<all − present, signal 0.5> auprc_absent_bias_strong=<signal 2>``.
"""
from __future__ import annotations

import argparse

import numpy as np

from tasks.metrics import _pr_auc, klue_re_auprc


def biases(n: int = 800, k: int = 30, seed: int = 0) -> dict[float, tuple[float, float]]:
    rng = np.random.default_rng(seed)
    golds = rng.integers(1, k, size=n)  # relation 0 never gold
    out = {}
    for signal in (0.5, 2.0):
        logits = rng.normal(size=(n, k))
        logits[np.arange(n), golds] += signal
        probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        onehot = np.eye(k)[golds]
        every = 100 * float(np.mean([_pr_auc(onehot[:, c], probs[:, c]) for c in range(k)]))
        out[signal] = (every, klue_re_auprc(probs.tolist(), golds.tolist()))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=800, help="synthetic examples")
    p.add_argument("--smoke", action="store_true", help="200 examples: every step, the table and the RESULT line")
    a = p.parse_args()
    result = biases(n=200 if a.smoke else a.n)
    print("| signal | AUPRC, all 30 (absent = 0.5) | AUPRC, 29 present (kotune) | difference |")
    print("| --- | --- | --- | --- |")
    for signal, (every, present) in result.items():
        print(f"| {signal} | {every:.2f} | {present:.2f} | {every - present:+.2f} |")
    weak, strong = (result[s][0] - result[s][1] for s in (0.5, 2.0))
    print(f"RESULT auprc_absent_bias_weak={weak:+.2f} auprc_absent_bias_strong={strong:+.2f}")


if __name__ == "__main__":
    main()
