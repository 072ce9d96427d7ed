"""Serving speed on CPU: ``transformers.pipeline`` (fp32) against kotune predict (fp32) and kotune
on ONNX Runtime (fp32, dynamic int8), plus the HTTP server batched against one-at-a-time.

    python -m bench.serve_speed             # base shape + tiny, demo dev and 300 KLUE NLI pairs (< ~10 min idle)
    python -m bench.serve_speed --quick     # 48 texts, tiny only (~2 min idle)
    python -m bench.serve_speed --smoke     # every phase, the server included: tiny, 2 steps, 16 texts
    python -m bench.serve_speed --device cuda --precision bf16   # kotune's rows and the server on a GPU, in bf16

Models (one process, ``--threads`` intra-op threads for torch and onnxruntime alike):

* base: a BERT-base-shaped encoder (../shared/vocab/kcbert-base's config and vocabulary), random
  weights (speed does not depend on them), a head trained 1 step; one for the demo set (text_cls),
  one for KLUE NLI pairs;
* tiny: kotune's 2-layer × 128 encoder, trained on the demo set (``--tiny-steps``, 1,000 as the
  README's demo) and briefly on NLI pairs: the trained model whose int8 metric change counts.

Data: the demo dev set (kotune_data/demo/dev.tsv, 471 comments) and the first ``--nli-pairs``
KLUE NLI dev pairs (../shared/data/klue/klue-nli-v1.1_dev.json).

Per model and data set: throughput at batch 32 over the whole set (text in, labels out: tokenizing
included) — pipeline's own batching (input order, padding to each batch's longest), kotune
predict's path (``kotune.inference.predict.predict_rows``: length-sorted batches, dynamic padding; Trainer
for the checkpoint, onnxruntime for the export); latency p50/p95 of single requests at batch 1
(``--latency-n`` texts); peak memory each phase adds (resident set above its start, the model's
loading included); model MB on disk; for the trained tiny model the main metric of each and the
int8 labels' agreement with fp32. Then the server (``action=serve`` on the base int8 export, the
demo texts from 32 concurrent clients on 127.0.0.1) with ``serve.max_batch_size=32`` vs 1; and the
batched server's throughput with 64 concurrent clients vs one client sending one request at a time.

The last line: ``RESULT kotune_vs_pipeline=<x> int8_vs_pipeline=<y> int8_metric_change=<points>
served_batched_vs_single=<z> served_64_clients_vs_one=<w>`` (base shape, demo set; the int8 change
from the trained tiny model; the figures are the device's the report names: the CPU unless --device).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

from bench.common import PeakMemory  # noqa: E402
from bench.serving import percentile, start_server, stop_server  # noqa: E402
from kotune.cli.overrides import compose  # noqa: E402

NLI = SHARED / "data" / "klue" / "klue-nli-v1.1_dev.json"
BASE = ["model=kcbert", f"model.name_or_path={SHARED / 'vocab' / 'kcbert-base'}", "model.init=random"]
DATASETS = {"demo": ["task=text_cls", "data=demo"],
            "nli": ["task=nli", "data=sample", f"data.train_file={NLI}", f"data.validation_file={NLI}"]}


def job(overrides: list[str], run_dir: Path) -> dict:
    from kotune.cli.job import execute

    res = execute(compose(overrides), str(run_dir))
    if res["status"] != "ok":
        raise SystemExit(f"{run_dir.name}: {res['error']}")
    return res


def prepare(name: str, model: list[str], data: str, steps: int, n_eval: int, work: Path, cache: Path) -> dict:
    """Train, then export natively (for pipeline) and to ONNX with int8."""
    common = [*DATASETS[data], *model, f"cache_dir={cache}", f"data.max_eval_samples={n_eval}"]
    train = [f"train.max_steps={steps}", "train.batch_size=32", "save_predictions=false"]
    if steps <= 2:
        train.append("data.max_train_samples=64")
    run = work / name
    trained = job([*common, *train], run / "train")
    hf = job([*common, "action=export", f"checkpoint={run / 'train'}"], run / "hf")
    onnx = job([*common, "action=export", "export.format=onnx", "export.quantize=int8", f"checkpoint={run / 'train'}"],
               run / "onnx")
    return {"name": name, "data": data, "common": common, "checkpoint": run / "train", "hf": hf["export_dir"],
            "onnx": onnx["export_dir"], "metric": trained["main_metric"]}


def size_mb(*paths) -> float:
    return round(sum(os.path.getsize(p) for p in paths) / 1e6, 1)


def run_pipeline(m: dict, examples: list[dict], latency_n: int) -> dict:
    import transformers

    pair = "text_pair" in examples[0]
    inputs = [{"text": e["text"], "text_pair": e["text_pair"]} if pair else e["text"] for e in examples]
    with PeakMemory() as mem:
        pipe = transformers.pipeline("text-classification", model=m["hf"], device=m.get("device", "cpu"))
        pipe(inputs[:8], batch_size=8, truncation=True)  # warm-up (thread pools, first-call setup), as for kotune
        started = time.perf_counter()
        labels = [o["label"] for o in pipe(inputs, batch_size=32, truncation=True)]
        elapsed = time.perf_counter() - started
    latencies = []
    for x in inputs[:latency_n]:
        t = time.perf_counter()
        pipe(x, truncation=True)
        latencies.append(time.perf_counter() - t)
    return {"labels": labels, "throughput": len(inputs) / elapsed, "latencies": latencies, "peak_mb": mem.peak_bytes / 1e6,
            "model_mb": size_mb(os.path.join(m["hf"], "model.safetensors"))}


def run_kotune(m: dict, examples: list[dict], latency_n: int, threads: int, onnx_file: str | None) -> dict:
    """action=predict's path on the examples (encode, sorted batches, decode), then single requests."""
    from kotune.loading.build import build
    from kotune.inference.model_runtimes import predictor_for
    from kotune.inference.predict import predict_rows
    from kotune.serving.app import Predictor

    checkpoint = m["onnx"] if onnx_file else m["checkpoint"]
    cfg = compose([*m["common"], f"checkpoint={checkpoint}", "train.eval_batch_size=32", f"onnx.threads={threads}",
                   *([f"onnx.file={onnx_file}"] if onnx_file else []), *m.get("inference", [])])
    with PeakMemory() as mem:
        b = build(cfg, (), onnx=True)
        predictor = predictor_for(cfg, b, str(Path(checkpoint).parent / "bench-predict"))
        warm = b.task.encode(examples[:8], b.tokenizer, b.settings)
        predict_rows(predictor, b.task, warm, warm.select_columns(b.task.model_columns(warm)), examples[:8])
        started = time.perf_counter()
        features = b.task.encode(examples, b.tokenizer, b.settings)
        inputs = features.select_columns(b.task.model_columns(features))
        outputs, _ = predict_rows(predictor, b.task, features, inputs, examples)
        elapsed = time.perf_counter() - started
    single = Predictor(cfg)
    latencies = []
    for ex in examples[:latency_n]:
        t = time.perf_counter()
        single([ex])
        latencies.append(time.perf_counter() - t)
    files = ([os.path.join(checkpoint, onnx_file)] if onnx_file else
             [str(p) for p in (Path(checkpoint) / "model").rglob("*.safetensors")])
    return {"labels": outputs, "throughput": len(examples) / elapsed, "latencies": latencies,
            "peak_mb": mem.peak_bytes / 1e6, "model_mb": size_mb(*files), "score": b.task.score(outputs, examples)}


async def _post_all(url: str, texts: list[str], clients: int) -> float:
    import httpx

    gate = asyncio.Semaphore(clients)
    async with httpx.AsyncClient(timeout=600) as client:
        async def one(text: str) -> None:
            async with gate:
                r = await client.post(f"{url}/predict", json={"text": text})
                r.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(one(t) for t in texts))
        return time.perf_counter() - started


def served_throughput(m: dict, texts: list[str], max_batch: int, threads: int, work: Path,
                      clients: tuple[int, ...] = ()) -> dict:
    """Texts per second through ``action=serve`` (a real server on 127.0.0.1, stopped after) from 32
    concurrent clients; then, on the same server, from each of ``clients`` concurrent clients
    (``clients_N``: 1 is one request at a time, each waiting for the last one's answer)."""
    import httpx

    proc, url = start_server([*m["common"], f"checkpoint={m['onnx']}", f"serve.max_batch_size={max_batch}",
                              "serve.max_wait_ms=10", f"onnx.threads={threads}", *m.get("inference", [])],
                             work / f"serve-{m['name']}-{max_batch}")
    try:
        elapsed = asyncio.run(_post_all(url, texts, clients=32))
        stats = httpx.get(f"{url}/health", timeout=10).json()
        more = {f"clients_{n}": len(texts) / asyncio.run(_post_all(url, texts, clients=n)) for n in clients}
    finally:
        stop_server(proc)
    return {"throughput": len(texts) / elapsed, "batches": stats["batches"], "largest_batch": stats["largest_batch"],
            **more}


def measure(m: dict, latency_n: int, threads: int) -> dict:
    from tasks import build_task
    from tasks.splits import load_splits

    cfg = compose(m["common"])
    examples = load_splits(build_task(cfg.task), cfg.data, ("validation",), 42)["validation"].examples
    rows = {"pipeline fp32": run_pipeline(m, examples, latency_n),
            "kotune fp32": run_kotune(m, examples, latency_n, threads, None),
            "onnx fp32": run_kotune(m, examples, latency_n, threads, "model.onnx"),
            "onnx int8": run_kotune(m, examples, latency_n, threads, "model_int8.onnx")}
    reference = rows["kotune fp32"]["labels"]
    out = {"model": m["name"], "data": m["data"], "n": len(examples), "metric": m["metric"], "rows": {}}
    for name, r in rows.items():
        out["rows"][name] = {
            "texts_per_s": round(r["throughput"], 2), "vs_pipeline": round(r["throughput"] / rows["pipeline fp32"]["throughput"], 2),
            "p50_ms": round(1000 * percentile(r["latencies"], 50), 1), "p95_ms": round(1000 * percentile(r["latencies"], 95), 1),
            "peak_mb": round(r["peak_mb"]), "model_mb": r["model_mb"],
            "agreement": round(sum(a == b for a, b in zip(r["labels"], reference)) / len(reference), 4),
            "score": (r.get("score") or {}).get(m["metric"])}
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: tiny models only, 48 texts, 10 latency samples")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of torch and onnxruntime")
    p.add_argument("--nli-pairs", type=int, default=300)
    p.add_argument("--demo-n", type=int, default=471, help="demo dev comments (all 471 by default)")
    p.add_argument("--latency-n", type=int, default=50, help="texts timed one at a time (batch 1)")
    p.add_argument("--tiny-steps", type=int, default=1000, help="training steps of the tiny demo model")
    p.add_argument("--no-serve", action="store_true", help="skip the HTTP server comparison")
    p.add_argument("--work", type=Path, default=None, help="working directory (default: a temporary one)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--device", default=None,
                   help="predict.device of the kotune rows and the server (auto, cpu, cuda, cuda:N; default: "
                        "kotune's, auto); the pipeline runs on the device it resolves to, in fp32")
    p.add_argument("--precision", default=None, choices=("fp32", "bf16", "fp16"),
                   help="predict.precision of the kotune rows and the server (default fp32)")
    p.add_argument("--smoke", action="store_true",
                   help="as --quick with 2 training steps, 16 texts and 3 latency samples: every phase in seconds")
    args = p.parse_args(argv)
    args.quick = args.quick or args.smoke
    import torch

    from kotune.devices import quiet_libraries

    torch.set_num_threads(args.threads)
    quiet_libraries()
    work = args.work or Path(tempfile.mkdtemp(prefix="serve_speed-"))
    cache = work / "cache"
    n_demo = 16 if args.smoke else 48 if args.quick else args.demo_n
    n_nli = 16 if args.smoke else 48 if args.quick else args.nli_pairs
    latency_n = 3 if args.smoke else 10 if args.quick else args.latency_n
    tiny_steps = 2 if args.smoke else 150 if args.quick else args.tiny_steps
    started, load = time.time(), os.getloadavg()[0]
    models = [prepare("tiny-demo", ["model=tiny"], "demo", tiny_steps, n_demo, work, cache),
              prepare("tiny-nli", ["model=tiny"], "nli", 2 if args.smoke else 30, n_nli, work, cache)]
    if not args.quick:
        models += [prepare("base-demo", BASE, "demo", 1, n_demo, work, cache),
                   prepare("base-nli", BASE, "nli", 1, n_nli, work, cache)]
    from heads.model.inference import resolve

    chosen = resolve(args.device or "auto", args.precision or "fp32")  # a device that is not there: one line, now
    inference = [*([f"predict.device={args.device}"] if args.device else []),
                 *([f"predict.precision={args.precision}"] if args.precision else [])]
    for m in models:
        m.update(inference=inference, device=chosen.device)
    results = [measure(m, latency_n, args.threads) for m in models]
    served = {}
    if not args.no_serve:
        target = models[2] if len(models) > 2 else models[0]
        cfg = compose(target["common"])
        from tasks import build_task
        from tasks.splits import load_splits

        texts = [e["text"] for e in load_splits(build_task(cfg.task), cfg.data, ("validation",), 42)["validation"].examples]
        served = {"model": target["name"], "n": len(texts),
                  **{f"max_batch_{b}": served_throughput(target, texts, b, args.threads, work, (64, 1) if b == 32 else ())
                     for b in (32, 1)}}
    report = {"threads": args.threads, **chosen.describe(), "load_before": load, "load_after": os.getloadavg()[0],
              "minutes": round((time.time() - started) / 60, 1), "results": results, "served": served}
    print_report(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return report


def print_report(report: dict) -> None:
    print(f"\n{report.get('device', 'cpu')} {report.get('precision', 'fp32')}, threads {report['threads']}, load average {report['load_before']:.1f} → {report['load_after']:.1f} "
          f"(2 cores), {report['minutes']} min")
    print("| model | data | n | backend | texts/s @32 | × pipeline | p50 ms @1 | p95 ms @1 | peak MB | model MB | "
          "agree fp32 | metric |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in report["results"]:
        for name, row in r["rows"].items():
            score = f"{row['score']:.2f}" if isinstance(row["score"], float) else ""
            print(f"| {r['model']} | {r['data']} | {r['n']} | {name} | {row['texts_per_s']} | {row['vs_pipeline']} | "
                  f"{row['p50_ms']} | {row['p95_ms']} | {row['peak_mb']} | {row['model_mb']} | {row['agreement']} | {score} |")
    served = report["served"]
    if served:
        print(f"\nserved ({served['model']} int8, {served['n']} texts, 32 concurrent clients): batched "
              f"{served['max_batch_32']['throughput']:.1f} texts/s (largest batch {served['max_batch_32']['largest_batch']}) "
              f"vs one at a time {served['max_batch_1']['throughput']:.1f} texts/s")
        batched = served["max_batch_32"]
        print(f"served, {report.get('device', 'cpu')} (max_batch_size=32): 64 concurrent clients {batched['clients_64']:.1f} "
              f"texts/s vs one client, one request at a time {batched['clients_1']:.1f} texts/s: "
              f"{batched['clients_64'] / batched['clients_1']:.2f}x")
    by = {(r["model"], r["data"]): r["rows"] for r in report["results"]}
    main = by.get(("base-demo", "demo")) or by[("tiny-demo", "demo")]
    tiny = by[("tiny-demo", "demo")]
    change = (tiny["onnx int8"]["score"] or 0) - (tiny["kotune fp32"]["score"] or 0)
    ratio = (served["max_batch_32"]["throughput"] / served["max_batch_1"]["throughput"]) if served else float("nan")
    clients = (served["max_batch_32"]["clients_64"] / served["max_batch_32"]["clients_1"]) if served else float("nan")
    print(f"RESULT kotune_vs_pipeline={main['kotune fp32']['vs_pipeline']} int8_vs_pipeline={main['onnx int8']['vs_pipeline']} "
          f"int8_metric_change={change:+.2f} served_batched_vs_single={ratio:.2f} served_64_clients_vs_one={clients:.2f}")


if __name__ == "__main__":
    main()
