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
   RTD − MLM per task, paired by seed, with its paired SE ("shown" beyond two SE either way);
4. ``--adapt-steps N``: domain adaptation as KoELECTRA meets it. The RTD arm's discriminator (an
   ELECTRA discriminator with its generator) continues on ``--adapt-corpus`` (news comments) by masked
   LM (a fresh MLM head on the discriminator's states, the old way) for N steps and by RTD (its own
   head and generator, ``pretrain.generator``) for the same multiply-adds; each adapted model and the
   unadapted one are fine-tuned on hate speech, every seed at the first ``--ft-lrs`` rate, paired by seed.

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
from kotune.cli.overrides import compose  # noqa: E402
from bench.pretraining import (CORPUS, SMOKE, SMOKE_CORPUS_LINES, Bench, arguments, fixed_splits,  # noqa: E402
                               pretrain_dir, pretrain_overrides)
from bench.stats import difference, spread  # noqa: E402


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


def adaptation(a, recipe, rtd_out: str, cost: float) -> dict:
    """Step 4: the RTD arm's discriminator adapted to ``--adapt-corpus`` by masked LM and by RTD
    (equal multiply-adds), then hate speech at every seed: {"rtd_vs_mlm", "mlm_vs_none",
    "rtd_vs_none"} paired differences."""
    import json

    with open(os.path.join(rtd_out, "pretrain_gain.json")) as f:
        args = json.load(f)["args"]
    source = pretrain_dir(SimpleNamespace(**args), a.cache_dir)
    corpus = a.adapt_corpus
    if a.smoke:  # the first lines only, as the smoke pretraining's corpus
        corpus = os.path.join(a.out, "adapt-corpus.txt")
        with open(a.adapt_corpus, encoding="utf-8") as f, open(corpus, "w", encoding="utf-8") as out:
            out.writelines(line for _, line in zip(range(SMOKE_CORPUS_LINES), f))
    steps = {"mlm": a.adapt_steps, "rtd": max(1, round(a.adapt_steps / cost))}
    models = {"none": os.path.join(source, "model")}
    for objective in ("mlm", "rtd"):
        run_dir = os.path.join(a.out, f"adapt_{objective}_{steps[objective]}")
        res = job(["action=pretrain", "model=klue", "model.name=mini-electra", f"model.name_or_path={models['none']}",
                   f"data.train_file={corpus}", f"pretrain.objective={objective}",
                   *([f"pretrain.generator={os.path.join(source, 'generator')}"] if objective == "rtd" else []),
                   f"train.max_length={recipe.block}", f"train.batch_size={recipe.batch}",
                   f"train.max_steps={steps[objective]}", f"train.learning_rate={recipe.lr}", "train.warmup_ratio=0.06",
                   "pretrain.max_eval_blocks=300", f"cache_dir={a.cache_dir}"], run_dir)
        models[objective] = os.path.join(run_dir, "model")
        print(f"adapted by {objective}: {steps[objective]} steps, {res['train_runtime_s'] / 60:.1f} min, "
              f"{res['tokens_per_second']:.0f} tokens/s", flush=True)
    lr = float(recipe.ft_lrs.split(",")[0])
    seeds = [int(s) for s in recipe.seeds.split(",")]
    bench = Bench(SimpleNamespace(**{**vars(recipe), "out": os.path.join(a.out, "adapt"), "cache_dir": a.cache_dir}),
                  models["none"], fixed_splits(a.cache_dir, recipe.ner_eval_split, seed=0))
    scores = {name: [bench.score("hate", "pretrained", lr, s, model_dir=path, tag=f"_{name}") for s in seeds]
              for name, path in models.items()}
    for name, values in scores.items():
        print(f"hate after adaptation by {name}: {spread(values)}  ({', '.join(f'{x:.2f}' for x in values)})")
    diffs = {"rtd_vs_mlm": difference(scores["rtd"], scores["mlm"]),
             "mlm_vs_none": difference(scores["mlm"], scores["none"]),
             "rtd_vs_none": difference(scores["rtd"], scores["none"])}
    for name, d in diffs.items():
        print(f"hate {name.replace('_vs_', ' − ')}: {d['mean']:+.2f} ± {d['se']:.2f} "
              f"({'shown' if d['shown'] else 'not shown'})", flush=True)
    return diffs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrain-steps", type=int, default=3000, help="the masked-LM arm's steps")
    p.add_argument("--timing-steps", type=int, default=40, help="steps of each arm timed (tokens/s)")
    p.add_argument("--timing-rounds", type=int, default=3, help="alternating timed runs of each arm (median)")
    p.add_argument("--budget", default="flops", choices=("flops", "time"),
                   help="equal multiply-adds (step_macs), or equal wall-clock from the timed tokens/s")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_pretrain_rtd"))
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")))
    p.add_argument("--adapt-steps", type=int, default=0, help="domain adaptation's masked-LM steps (0: none)")
    p.add_argument("--adapt-corpus", default=CORPUS[0], help="the adaptation text (default: the news comments)")
    p.add_argument("--smoke", action="store_true", help="tiny settings, every phase (pretrain_gain's --smoke)")
    a, rest = p.parse_known_args()
    if a.smoke:
        a.pretrain_steps, a.timing_steps, a.timing_rounds, a.adapt_steps = 4, 2, 1, 2
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
    # each arm's last held-out point (pretrain_gain scores every steps // 8)
    last = [s // max(1, s // 8) * max(1, s // 8) for s in steps.values()]
    run_module("pretrain_compare", [*outs, "--steps", ",".join(map(str, last))], quiet=False)
    adapted = adaptation(a, recipe, outs[1], cost) if a.adapt_steps else {}
    print(f"RESULT mlm_tokens_per_s={speed['mlm']:.0f} rtd_tokens_per_s={speed['rtd']:.0f} "
          f"rtd_step_time={speed['mlm'] / speed['rtd']:.2f} rtd_step_macs={macs['rtd'] / macs['mlm']:.2f} "
          f"budget={a.budget} mlm_steps={steps['mlm']} rtd_steps={steps['rtd']}"
          + "".join(f" adapt_{k}={v['mean']:.2f} adapt_{k}_se={v['se']:.2f}" for k, v in adapted.items()))


if __name__ == "__main__":
    main()
