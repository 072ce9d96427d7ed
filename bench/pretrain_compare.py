"""Compare pretraining recipes measured by ``bench/pretrain_gain.py``: e.g. ``pretrain.objective``
mlm vs mlm+nsp, or ``pretrain.attention_init`` random vs tied_qk vs mimetic. Each argument is one
run's ``--out`` folder (its ``pretrain_gain.json``); the first is the baseline.

    python -m bench.pretrain_gain --tasks hate,sts,korsts --out OUT_MLM
    python -m bench.pretrain_gain --tasks hate,sts,korsts --objective mlm+nsp --out OUT_NSP
    python -m bench.pretrain_compare OUT_MLM OUT_NSP
    python -m bench.pretrain_compare --smoke   # makes two: pretrain_gain.py --smoke (hate), mlm and mlm+nsp

Per recipe: the pretraining's minutes and held-out masked-LM loss / accuracy at ``--steps`` (each
run's own held-out rows: the same blocks and masks for every mlm recipe; an mlm+nsp run's rows are
its sentence pairs, so ``--common`` also scores every final model on the baseline's held-out blocks).
Per task the runs share: each recipe's fine-tuned score (mean ± sd over the seeds), its gain over
its own random twin, and its difference from the baseline, paired by seed (mean ± paired SE;
"shown" only beyond two standard errors either way). Prints ``RESULT`` per recipe.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from types import SimpleNamespace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.pretraining import common_held_out as score_held_out, pretrain_dir, pretrain_overrides  # noqa: E402
from bench.stats import difference, spread  # noqa: E402
from kotune.cli.overrides import compose  # noqa: E402


def recipe_name(args: dict) -> str:
    name = f"{args.get('objective', 'mlm')}:{args['attention_init']}"
    name += f":{args['layers']}L" if args.get("layers", 2) != 2 else ""
    return name + (f":seed{args['pretrain_seed']}" if args.get("pretrain_seed") is not None else "")


def held_out_at(curve: list[dict], step: int) -> dict | None:
    """The held-out point at ``step`` (None when the run was not evaluated there)."""
    return next((point for point in curve if point["step"] == step), None)


def common_held_out(args: dict, model_dir: str) -> dict:
    """A final model on the mlm recipe's held-out blocks (bench/pretrain_variants.py's measure)."""
    recipe = SimpleNamespace(**{**args, "objective": "mlm"})
    return score_held_out(compose(pretrain_overrides(recipe, args["cache_dir"])), model_dir)


def smoke_outs(out: str, cache_dir: str) -> list[str]:
    """Two ``python -m bench.pretrain_gain --smoke`` runs on hate speech (mlm, mlm+nsp) under ``out``, in
    this process (run as ``-m`` runs it, not imported; their output on stderr: their RESULT lines are
    not this bench's)."""
    import contextlib
    import runpy

    outs = [os.path.join(out, "mlm"), os.path.join(out, "mlm_nsp")]
    for folder, objective in zip(outs, ("mlm", "mlm+nsp")):
        if not os.path.exists(os.path.join(folder, "pretrain_gain.json")):
            argv, sys.argv = sys.argv, ["pretrain_gain.py", "--smoke", "--tasks", "hate", "--curve-tasks", "",
                                        "--objective", objective, "--cache-dir", cache_dir, "--out", folder]
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    runpy.run_module("bench.pretrain_gain", run_name="__main__", alter_sys=True)
            finally:
                sys.argv = argv
    return outs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outs", nargs="*", help="bench/pretrain_gain.py --out folders; the first is the baseline")
    p.add_argument("--steps", default="750,3000", help="pretraining steps whose held-out loss is shown")
    p.add_argument("--common", action="store_true", help="also score each final model on the baseline's held-out blocks")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "kotune_pretrain_compare_smoke"),
                   help="--smoke: where its two runs go")
    p.add_argument("--cache-dir", default=os.environ.get("KOTUNE_CACHE", os.path.join(tempfile.gettempdir(), "kotune")),
                   help="--smoke: its runs' cache_dir")
    from bench.common import parse_with_smoke

    a = parse_with_smoke(p, {"steps": "2,4", "common": True})
    if a.smoke and not a.outs:
        a.outs = smoke_outs(a.out, a.cache_dir)
    if not a.outs:
        p.error("give the bench/pretrain_gain.py --out folders to compare (or --smoke)")
    runs = []
    for out in a.outs:
        path = os.path.join(out, "pretrain_gain.json")
        if not os.path.exists(path):
            raise SystemExit(f"{path} not found: run bench/pretrain_gain.py --out {out} first")
        with open(path) as f:
            runs.append(json.load(f))
    differing = [out for out, r in zip(a.outs, runs) if r["args"]["seeds"] != runs[0]["args"]["seeds"]]
    if differing:
        raise SystemExit(f"{differing[0]} fine-tuned seeds {runs[a.outs.index(differing[0])]['args']['seeds']}, "
                         f"the baseline {runs[0]['args']['seeds']}: paired differences need the same seeds")
    steps = [int(s) for s in a.steps.split(",")]
    names = [recipe_name(r["args"]) for r in runs]
    print(f"{'recipe':<22}{'minutes':>8}" + "".join(f"{f'step {s}: loss / acc %':>26}" for s in steps)
          + (f"{'common held-out loss / acc %':>32}" if a.common else ""))
    common = {}
    for name, r in zip(names, runs):
        cells = []
        for s in steps:
            point = held_out_at(r["pretrain"]["held_out_curve"], s)
            cells.append(f"{point['mlm_loss']:.3f} / {point['mlm_accuracy']:.2f}" if point else "-")
        line = f"{name:<22}{r['pretrain']['train_runtime_s'] / 60:>8.1f}" + "".join(f"{c:>26}" for c in cells)
        if a.common:
            model_dir = os.path.join(pretrain_dir(SimpleNamespace(**r["args"]), r["args"]["cache_dir"]), "model")
            common[name] = common_held_out(r["args"], model_dir)
            line += f"{common[name]['mlm_loss']:>21.3f} / {common[name]['mlm_accuracy']:.2f}"
        nsp = r["pretrain"]["metrics"].get("nsp_accuracy")
        print(line + (f"   next-sentence acc {nsp:.2f} %" if nsp is not None else ""))
    base, base_name = runs[0], names[0]
    shared = [t for t in base["gains"] if all(t in r["gains"] for r in runs[1:])]
    print(f"\n| task | recipe | fine-tuned (mean ± sd) | gain over its random twin ± SE | vs {base_name} ± paired SE | beyond 2 SE |")
    print("| --- | --- | --- | --- | --- | --- |")
    results = {name: {} for name in names}
    for task in shared:
        base_scores = base["finetune"][f"{task}/pretrained"]["scores"]
        for name, r in zip(names, runs):
            chosen, gain = r["finetune"][f"{task}/pretrained"], r["gains"][task]
            cell = "(baseline)"
            shown = ""
            if r is not base:
                d = difference(chosen["scores"], base_scores)
                results[name][task] = d
                cell, shown = f"{d['mean']:+.2f} ± {d['se']:.2f}", "shown" if d["shown"] else "not shown"
            print(f"| {task} | {name} | {spread(chosen['scores'])} (lr {chosen['lr']:g}) | "
                  f"{gain['mean']:+.2f} ± {gain['se']:.2f} | {cell} | {shown} |")
    for name, r in zip(names[1:], runs[1:]):
        loss = {s: held_out_at(r["pretrain"]["held_out_curve"], s) for s in steps}
        print(f"RESULT recipe={name} baseline={base_name} "
              + " ".join(f"held_out_loss_{s}={v['mlm_loss']:.3f}" for s, v in loss.items() if v)
              + "".join(f" {t}_diff={d['mean']:.2f} {t}_diff_se={d['se']:.2f}" for t, d in results[name].items()))


if __name__ == "__main__":
    main()
