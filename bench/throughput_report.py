"""bench/throughput.py's report: each task's medians over the rounds (samples/s, MFU, peak memory,
padding efficiency, speedups) and the printed table and same-science lines."""
from __future__ import annotations

from bench.common import median
from bench.throughput_data import Bench


def task_report(bench: Bench, plan: dict, rec: dict, agreements: list[float], gaps: list[float], peak: float) -> dict:
    """One task's entry of throughput.json: ``plan`` its batches' padding efficiencies, ``rec`` the
    timed runs per pipeline and phase, ``agreements`` and ``gaps`` per round, ``peak`` the best matmul rate."""
    t = {"max_length": bench.spec["max_length"], "batch": bench.spec["batch"], "eval_batch": bench.spec["eval_batch"],
         "mean_tokens": float(bench.lengths.mean()),
         "kotune_train_epoch_padding_efficiency": plan["epoch_efficiency"],
         "kotune_eval_epoch_padding_efficiency": plan["eval_epoch_efficiency"],
         "prediction_agreement": min(agreements), "max_logit_gap": max(gaps)}
    for pipeline in ("kotune", "recipe"):
        for phase in ("train", "eval"):
            runs = rec[pipeline][phase]
            t[f"{pipeline}_{phase}_samples_per_s"] = median([x["samples"] / x["s"] for x in runs])
            t[f"{pipeline}_{phase}_mfu"] = median([x["flops"] / x["s"] / x["peak"] for x in runs])
            t[f"{pipeline}_{phase}_mfu_vs_best_peak"] = median([x["flops"] / x["s"] / peak for x in runs])
            t[f"{pipeline}_{phase}_peak_mem_mb"] = max(x["mem"] for x in runs) / 2**20
            t[f"{pipeline}_{phase}_padding_efficiency"] = runs[0]["efficiency"]
    for phase in ("train", "eval"):
        t[f"{phase}_speedup"] = t[f"kotune_{phase}_samples_per_s"] / t[f"recipe_{phase}_samples_per_s"]
    return t


def print_report(report: dict) -> None:
    print(f"\n{report['command']}\nencoder {report['encoder']} ({report['attention']} attention), "
          f"{report['precision']}, {report['threads']} threads on "
          f"{report['device']}; best matmul rate {report['matmul_peak_gflops']:.0f} GFLOP/s; medians of "
          f"{report['rounds']} rounds; {report['runtime_s']:.0f} s", flush=True)
    print("MFU: model FLOPs of the padded shapes / the matmul rate measured just before and after the phase "
          "(MFU*: / the best rate seen)")
    print(f"{'task':5} {'pipeline':8} {'train/s':>8} {'eval/s':>8} {'pad eff':>8} {'MFU':>6} {'MFU*':>6} "
          f"{'eval MFU':>8} {'train MB':>9} {'eval MB':>8}")
    for name, t in report["tasks"].items():
        for p in ("kotune", "recipe"):
            print(f"{name:5} {p:8} {t[f'{p}_train_samples_per_s']:8.2f} {t[f'{p}_eval_samples_per_s']:8.2f} "
                  f"{t[f'{p}_train_padding_efficiency']:8.1%} {t[f'{p}_train_mfu']:6.1%} "
                  f"{t[f'{p}_train_mfu_vs_best_peak']:6.1%} {t[f'{p}_eval_mfu']:8.1%} "
                  f"{t[f'{p}_train_peak_mem_mb']:9.0f} {t[f'{p}_eval_peak_mem_mb']:8.0f}")
        print(f"{name:5} speedup  {t['train_speedup']:7.2f}x {t['eval_speedup']:7.2f}x   (max_length "
              f"{t['max_length']}, mean {t['mean_tokens']:.1f} tokens; whole-epoch padding efficiency "
              f"{t['kotune_train_epoch_padding_efficiency']:.1%} train, "
              f"{t['kotune_eval_epoch_padding_efficiency']:.1%} eval)\n      same weights, both pipelines: same predictions on {t['prediction_agreement']:.1%} "
              f"of the evaluated examples, largest logit difference {t['max_logit_gap']:.1e}")
    for name, q in (report.get("padding_inert") or {}).items():
        print(f"padding is inert {name}: small encoder, dropout off, {q['steps']} steps on kotune's batches of "
              f"{q['batch']}, padded by kotune and to max_length: largest per-step loss difference "
              f"{q['max_loss_gap']:.1e}; afterwards same held-out predictions on {q['agreement']:.1%}, "
              f"largest logit difference {q['max_logit_gap']:.1e}")
    for name, q in (report.get("same_science") or {}).items():
        print(f"same science {name}, small encoder ({q['steps']} steps × {q['batch']} from {q['train_examples']} "
              f"examples, {q['eval_examples']} held out), seeds as listed:")
        for key, label, digits in (("score", q["metric"], 2), ("loss", "held-out loss", 4)):
            v = q[key]
            print(f"  {label}: kotune {fmt(v['kotune'], digits)}, recipe {fmt(v['recipe'], digits)}; "
                  f"difference of means {v['pipeline_gap']:+.{digits}f}, seed std {v['seed_std']:.{digits}f}, "
                  f"t = {v['t']:.2f} (95 % bound {v['t_critical']:.2f}) → "
                  f"{'within' if v['within_noise'] else 'OUTSIDE'} seed noise")


def fmt(values: list[float], digits: int = 2) -> str:
    return "/".join(f"{v:.{digits}f}" for v in values)
