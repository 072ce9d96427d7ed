"""The benches' paired statistics over seeds: a gain (or difference) per seed, its mean and paired
standard error, and "shown" only beyond two standard errors (tests/test_bench_gain.py)."""
from __future__ import annotations

import math
import statistics


def paired_gain(pretrained: list[float], random_twin: list[float]) -> dict:
    """Paired gains over seeds: mean, standard error sd(g)/√n, the random twin's seed spread, and
    ``shown`` (mean > 2 SE; never with fewer than two seeds)."""
    if len(pretrained) != len(random_twin) or not pretrained:
        raise ValueError(f"paired scores needed: {len(pretrained)} pretrained vs {len(random_twin)} random")
    gains = [p - r for p, r in zip(pretrained, random_twin)]
    n = len(gains)
    mean, se = statistics.mean(gains), statistics.stdev(gains) / math.sqrt(n) if n > 1 else math.nan
    return {"gains": gains, "mean": mean, "se": se, "shown": n > 1 and mean > 2 * se,
            "random_sd": statistics.stdev(random_twin) if n > 1 else math.nan}


def difference(scores: list[float], baseline: list[float]) -> dict:
    """``scores`` − ``baseline`` paired by seed: mean, paired SE and ``shown`` in either direction."""
    d = paired_gain(scores, baseline)
    return {"mean": d["mean"], "se": d["se"], "gains": d["gains"],
            "shown": len(scores) > 1 and abs(d["mean"]) > 2 * d["se"]}


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {sd:.2f}"
