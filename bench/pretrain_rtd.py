"""ELECTRA's replaced-token detection against masked-LM pretraining at equal compute (issue 54).
Both arms pretrain the same ELECTRA-shaped model (``--hidden``, ``--layers``: bench/pretraining.py's
recipe, ``--architecture electra``) on the shared corpus; the RTD arm (``pretrain.objective=rtd``: a
generator a quarter as wide, λ = 50) runs for as many steps as fit in the masked-LM arm's budget:

1. speed: ``--timing-steps`` steps of each arm, alternating, ``--timing-rounds`` times: the median
   tokens/s of each (the generator's cost; a shared machine's load drifts between runs);
2. the RTD arm's steps = ``--pretrain-steps`` × the masked-LM step's cost over the RTD step's:
   ``--budget flops`` (the default) counts each step's multiply-adds per token (``step_macs``:
   deterministic, where a wall-clock on shared cores is not), ``--budget time`` uses step 1's tokens/s;
3. ``bench/pretrain_gain.py`` for each arm (``--out OUT/mlm``, ``OUT/rtd``; the same fine-tuning
   protocol, seeds and tasks; no downstream curve), then ``bench/pretrain_compare.py OUT/mlm OUT/rtd``:
   RTD − MLM per task, paired by seed, with its paired SE ("shown" beyond two SE either way).

    python -m bench.pretrain_rtd --tasks hate,ner,sts --out OUT     # see --help; other options go to pretrain_gain
    python -m bench.pretrain_rtd --smoke                             # tiny settings, every phase

Prints each arm's tokens/s, the steps, the comparison's table and
``RESULT mlm_tokens_per_s=… rtd_tokens_per_s=… rtd_step_time=… rtd_step_macs=… budget=… mlm_steps=… rtd_steps=…``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import statistics
import sys
import tempfile
from types import SimpleNamespace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.jobs import job  # noqa: E402
from heads.model.encoder import build_config  # noqa: E402
from kotune.overrides import compose  # noqa: E402
from bench.pretraining import SMOKE, arguments, pretrain_overrides  # noqa: E402


def run_module(name: str, argv: list[str], quiet: bool) -> None:
    """``python -m bench.<name> ARGV`` in this process (as ``-m`` runs it); ``quiet``: its output on stderr."""
    saved, sys.argv = sys.argv, [f"{name}.py", *argv]
    try:
        with contextlib.redirect_stdout(sys.stderr) if quiet else contextlib.nullcontext():
            runpy.run_module(f"bench.{name}", run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved


def timed(recipe, cache_dir: str, out: str, objective: str, steps: int, round_: int) -> dict:
    """``steps`` steps of one arm of ``recipe`` (no held-out scoring inside them, nothing saved): its results."""
    recipe = SimpleNamespace(**{**vars(recipe), "objective": objective, "architecture": "electra",
                                "pretrain_steps": steps})
    overrides = [o for o in pretrain_overrides(recipe, cache_dir) if not o.startswith("pretrain.eval_every=")]
    run_dir = os.path.join(out, f"timing_{objective}_{steps}_round{round_}")
    return job(overrides + ["pretrain.eval_every=0", "save_model=false"], run_dir)


def step_macs(config, block: int, objective: str, masked: float = 0.15) -> float:
    """Multiply-adds per token of one arm's forward (its backward is twice that in both arms): the
    encoder's linear layers and attention scores at every position; masked LM: the head (transform,
    projection onto the vocabulary) at the masked share; RTD: the discriminator's head at every
    position plus the generator (``heads.model.rtd.generator_config``) with its own masked-LM head."""
    from heads.model.rtd import generator_config

    def encoder(c) -> float:
        layer = 4 * c.hidden_size ** 2 + 2 * c.hidden_size * c.intermediate_size + 2 * block * c.hidden_size
        projection = c.embedding_size * c.hidden_size if c.embedding_size != c.hidden_size else 0
        return c.num_hidden_layers * layer + projection

    def lm_head(c) -> float:
        return masked * (c.hidden_size * c.embedding_size + c.embedding_size * c.vocab_size)

    if objective == "mlm":
        return encoder(config) + lm_head(config)
    generator = generator_config(config, 0.25)
    return encoder(config) + config.hidden_size ** 2 + config.hidden_size + encoder(generator) + lm_head(generator)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrain-steps", type=int, default=3000, help="the masked-LM arm's steps")
    p.add_argument("--timing-steps", type=int, default=40, help="steps of each arm timed (tokens/s)")
    p.add_argument("--timing-rounds", type=int, default=3, help="alternating timed runs of each arm (median)")
    p.add_argument("--budget", default="flops", choices=("flops", "time"),
                   help="equal multiply-adds (step_macs), or equal wall-clock from the timed tokens/s")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_pretrain_rtd"))
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--smoke", action="store_true", help="tiny settings, every phase (pretrain_gain's --smoke)")
    a, rest = p.parse_known_args()
    if a.smoke:
        a.pretrain_steps, a.timing_steps, a.timing_rounds = 4, 2, 1
        rest = ["--tasks", "hate", *rest]
    # the recipe (shape, batch, …) as bench/pretrain_gain.py reads it, for the timing runs
    parser = arguments("")
    if a.smoke:
        parser.set_defaults(**SMOKE)
    recipe = parser.parse_known_args(rest)[0]
    recipe.smoke = a.smoke
    os.makedirs(a.out, exist_ok=True)
    rounds = [{o: timed(recipe, a.cache_dir, a.out, o, a.timing_steps, r) for o in ("mlm", "rtd")}
              for r in range(1, a.timing_rounds + 1)]
    runs = rounds[0]
    speed = {o: statistics.median(float(r[o]["tokens_per_second"]) for r in rounds) for o in runs}
    config = compose(pretrain_overrides(SimpleNamespace(**{**vars(recipe), "objective": "rtd"}), a.cache_dir)).model
    config = build_config(config, runs["rtd"]["vocab_size"])
    macs = {o: step_macs(config, runs[o]["max_length"], o) for o in runs}
    cost = macs["rtd"] / macs["mlm"] if a.budget == "flops" else speed["mlm"] / speed["rtd"]
    steps = {"mlm": a.pretrain_steps, "rtd": max(1, round(a.pretrain_steps / cost))}
    print(f"tokens/s, median of {a.timing_rounds} alternating runs of {a.timing_steps} steps: mlm {speed['mlm']:.0f}, rtd {speed['rtd']:.0f} (an RTD step: "
          f"{speed['mlm'] / speed['rtd']:.2f} masked-LM steps of time); multiply-adds per token: mlm "
          f"{macs['mlm']:,.0f}, rtd {macs['rtd']:,.0f} ({macs['rtd'] / macs['mlm']:.2f}×); equal {a.budget}: "
          f"mlm {steps['mlm']} steps, rtd {steps['rtd']} steps", flush=True)
    outs = []
    for objective in ("mlm", "rtd"):
        outs.append(os.path.join(a.out, objective))
        run_module("pretrain_gain", [*(["--smoke"] if a.smoke else []), "--architecture", "electra",
                                     "--objective", objective, "--pretrain-steps", str(steps[objective]),
                                     "--curve-tasks", "", "--cache-dir", a.cache_dir, "--out", outs[-1], *rest],
                   quiet=True)
    run_module("pretrain_compare", [*outs, "--steps", f"{steps['mlm']},{steps['rtd']}"], quiet=False)
    print(f"RESULT mlm_tokens_per_s={speed['mlm']:.0f} rtd_tokens_per_s={speed['rtd']:.0f} "
          f"rtd_step_time={speed['mlm'] / speed['rtd']:.2f} rtd_step_macs={macs['rtd'] / macs['mlm']:.2f} "
          f"budget={a.budget} mlm_steps={steps['mlm']} rtd_steps={steps['rtd']}")


if __name__ == "__main__":
    main()
