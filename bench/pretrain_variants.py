"""A short check of pretraining variants with ``bench/pretrain_gain.py``'s mini recipe on
../shared/data/corpus: ``pretrain.objective`` (mlm | mlm+nsp) and ``pretrain.attention_init``
(random | tied_qk | mimetic), each pretrained for ``--steps`` steps from the same seed. Every model
is scored on the same held-out masked blocks (the mlm run's packed blocks of the held-out lines,
each model with its own tokenizer), so an mlm+nsp model, whose own held-out rows are sentence
pairs, is compared on the same text; plus its own held-out next-sentence accuracy.

    python -m bench.pretrain_variants --steps 300
    python -m bench.pretrain_variants --steps 750 --variants mlm:random,mlm:tied_qk,mlm:mimetic
    python -m bench.pretrain_variants --smoke   # every variant, 4 steps of a 1-layer × 32 recipe, 2,000 lines a file

Prints one row per variant and ``RESULT variant=… mlm_loss=… mlm_accuracy=… nsp_accuracy=…``.
Runs are cached under ``cache_dir/pretrain_variants/<recipe hash>`` (never in the project).
"""
from __future__ import annotations

import argparse
import os
import tempfile
from types import SimpleNamespace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.jobs import job  # noqa: E402
from bench.pretraining import CORPUS, common_held_out, pretrain_overrides  # noqa: E402
from kotune.cli.overrides import compose  # noqa: E402

MINI = dict(vocab=2000, hidden=128, layers=2, block=64, batch=64, lr=1e-3, dropout=0.0, ft_max_length=128,
            position_init="sinusoidal")
# --smoke: the recipe shrunk as bench/pretrain_gain.py's --smoke shrinks it
SMOKE_MINI = {**MINI, "vocab": 500, "hidden": 32, "layers": 1, "block": 32, "batch": 8, "ft_max_length": 64}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--variants", default="mlm:random,mlm:tied_qk,mlm:mimetic,mlm+nsp:tied_qk",
                   help="objective:attention_init, comma-separated")
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    from bench.common import parse_with_smoke
    from tasks.encode_cache import fingerprint

    a = parse_with_smoke(p, {"steps": 4})
    mini = SMOKE_MINI if a.smoke else MINI

    print(f"{'variant':<18} {'minutes':>7} {'MLM loss':>8} {'MLM acc %':>9} {'NSP acc % (before → after)':>40}")
    for variant in a.variants.split(","):
        objective, init = variant.split(":")
        recipe = SimpleNamespace(**mini, attention_init=init, pretrain_steps=a.steps, objective=objective, smoke=a.smoke)
        overrides = pretrain_overrides(recipe, a.cache_dir)
        run_dir = os.path.join(a.cache_dir, "pretrain_variants", fingerprint(overrides)[:12])
        res = job(overrides, run_dir)
        scores = common_held_out(compose(overrides), res["model_dir"])
        before, after = res["initial_metrics"], res["metrics"]
        nsp = (f"{before['nsp_accuracy']:.1f} → {after['nsp_accuracy']:.1f} (majority {after['nsp_majority_accuracy']:.1f})"
               if "nsp_accuracy" in after else "-")
        print(f"{variant:<18} {res['train_runtime_s'] / 60:>7.1f} {scores['mlm_loss']:>8.3f} "
              f"{scores['mlm_accuracy']:>9.2f} {nsp:>40}")
        print(f"RESULT variant={variant} steps={res['train_steps']} mlm_loss={scores['mlm_loss']:.4f} "
              f"mlm_accuracy={scores['mlm_accuracy']:.3f} nsp_accuracy={after.get('nsp_accuracy', float('nan')):.2f} "
              f"n_masked={scores['n_masked']} data={','.join(os.path.basename(c) for c in CORPUS)}", flush=True)


if __name__ == "__main__":
    main()
