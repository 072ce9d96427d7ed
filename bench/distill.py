"""Does ``action=distill`` make a small student that keeps the teacher's quality, beyond the noise, at
an acceptable training cost? Hate speech (``--shared``: train.tsv → dev.tsv's 471 comments, the
``hate`` column); the teacher is a mini pretrained encoder of bench/pretrain_gain.py
(``--model-dir``: its default 2 layers, or ``--layers 6``) fine-tuned on it, one teacher per seed.
Per seed and per student depth K (half and a third of the teacher's layers, ``--ks``; a 2-layer
encoder gives K = 1 only):

* distilled: ``action=distill distill.student_layers=K`` (the teacher's layers spread, its head,
  ``--temperature``, ``--alpha``), the teacher's logits computed once and cached;
* no teacher: the same student, the same init and steps, ``distill.alpha=0`` (the task's loss only);
* alone: K layers of the pretrained encoder (not the fine-tuned teacher's) fine-tuned as any run:
  the student a user would train without kotune's distillation, and the wall-time baseline;
* with ``--unlabeled``: distilled with ``--unlabeled-ratio`` × the labelled rows of the shared
  unlabelled news comments (data/corpus/news-comments.txt) labelled by the teacher.

Per comparison the paired difference over seeds, its mean and paired SE sd(d)/√n; "shown" only
where |mean| > 2 SE. The student's share of the teacher's score (target ≥ 97 %), and the wall time of
a distillation (its teacher's logits computed, cache miss) over the alone run's (target ≤ 1.3×).
``--speed``: texts per second of a 4-layer int8 student against its BERT-base-shaped teacher, and
p50/p95 milliseconds of single requests to ``action=serve`` for each.

    python -m bench.distill --model-dir DIR                 # 3 seeds, 400 steps
    python -m bench.distill --model-dir DIR --seeds 1,2,3,4,5 --unlabeled
    python -m bench.distill --smoke --model-dir DIR         # tiny settings, every step (tests/test_bench_smoke.py)

Prints the table and ``RESULT distill k=… share=… gain_vs_no_teacher=…±… wall_ratio=…``; every job is
an in-process ``kotune.cli.job.execute`` (what the CLI runs), reused when its run directory already
holds an ok result of the same config.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.hate_speech import SMOKE, SMOKE_DATA, fine_tuning_options, hate_speech, model_overrides  # noqa: E402
from bench.jobs import job  # noqa: E402
from bench.stats import difference, spread  # noqa: E402


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    fine_tuning_options(p, "1,2,3", "kotune_distill")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ks", default=None, help="student depths (default: half and a third of the teacher's layers)")
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--hidden-weight", type=float, default=0.0, help="distill.hidden_weight of the distilled arms")
    p.add_argument("--attention-weight", type=float, default=0.0, help="distill.attention_weight of the distilled arms")
    p.add_argument("--unlabeled", action="store_true", help="also distil with the unlabelled news comments")
    p.add_argument("--unlabeled-ratio", type=float, default=1.0)
    p.add_argument("--task", default="hate", choices=("hate", "ner"),
                   help="hate speech, or KLUE NER dev split in two (bench/pretraining.py's fixed 80/20 split)")
    p.add_argument("--speed", action="store_true", help="also time a 4-layer int8 student on the BERT-base shape")
    p.add_argument("--speed-texts", type=int, default=256, help="demo dev texts timed")
    p.add_argument("--latency-n", type=int, default=100, help="single requests timed per server (--speed)")
    from bench.common import parse_with_smoke

    a = parse_with_smoke(p, {"steps": SMOKE["steps"], "batch": SMOKE["batch"], "max_length": SMOKE["max_length"],
                             "seeds": SMOKE["seeds"], "unlabeled": True, "unlabeled_ratio": 0.1, "speed": True,
                             "speed_texts": 16, "latency_n": 4,
                             "out": os.path.join(tempfile.gettempdir(), "kotune_distill_smoke")})
    if not a.model_dir:
        raise SystemExit("--model-dir DIR is needed (the mini encoder: python -m bench.pretrain_gain --only-pretrain)")
    return a


def depths(a, teacher_layers: int) -> list[int]:
    if a.ks:
        return [int(k) for k in a.ks.split(",")]
    return sorted({max(1, round(teacher_layers / 2)), max(1, round(teacher_layers / 3))}, reverse=True)


def main() -> None:
    a = options()
    if a.task == "ner":  # the pretraining benches' fixed split of KLUE NER dev (entity F1)
        from bench.pretraining import fixed_splits, task_data

        train, evaluation = task_data("ner", fixed_splits(a.cache_dir, 0.2, seed=0))
        data = [*train, *evaluation, *(SMOKE_DATA if a.smoke else [])]
        a.unlabeled = False  # unlabelled text is read for single-text classification
    else:
        data_dir = hate_speech(a)
        data = ["task=text_cls", f"data.train_file={data_dir}/train.tsv", f"data.validation_file={data_dir}/dev.tsv",
                "data.text_column=comments", "data.label_column=hate", "data.format=tsv", *(SMOKE_DATA if a.smoke else [])]
    recipe = [f"train.learning_rate={a.lr}", f"train.max_steps={a.steps}", f"train.batch_size={a.batch}",
              f"train.max_length={a.max_length}", "train.warmup_ratio=0.1", f"cache_dir={a.cache_dir}"]
    corpus = os.path.join(a.shared, "data", "corpus", "news-comments.txt")
    with open(os.path.join(a.model_dir, "config.json"), encoding="utf-8") as f:
        teacher_layers = int(json.load(f)["num_hidden_layers"])
    ks = depths(a, teacher_layers)
    seeds = [int(s) for s in a.seeds.split(",")]
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}; "
          f"teacher {teacher_layers} layers, students K = {ks}", flush=True)
    started = time.time()
    rows: dict[str, list[dict]] = {}
    for seed in seeds:
        out = os.path.join(a.out, f"s{seed}")
        teacher_dir = os.path.join(out, "teacher")
        teacher = job([*data, *model_overrides("mini", a.model_dir, a.cache_dir), *recipe, f"train.seed={seed}"],
                      teacher_dir)
        rows.setdefault("teacher", []).append(teacher)
        distil = ["action=distill", f"distill.teacher={teacher_dir}", *data,
                  *model_overrides("mini", a.model_dir, a.cache_dir), *recipe, f"train.seed={seed}",
                  f"distill.temperature={a.temperature}", "save_model=false"]
        for k in ks:
            soft = [f"distill.alpha={a.alpha}", f"distill.hidden_weight={a.hidden_weight}",
                    f"distill.attention_weight={a.attention_weight}"]
            arms = {"distilled": soft, "no teacher": ["distill.alpha=0"]}
            if a.unlabeled:
                arms["distilled + unlabelled"] = [*soft, f"distill.unlabeled_file={corpus}",
                                                  f"distill.unlabeled_ratio={a.unlabeled_ratio}"]
            for arm, extra in arms.items():
                tag = settings_tag(a, layers=arm != "no teacher")
                res = job([*distil, f"distill.student_layers={k}", *extra],
                          os.path.join(out, f"k{k}_{arm.replace(' ', '_').replace('+', 'and')}{tag}"))
                rows.setdefault(f"K={k} {arm}", []).append(res)
            alone = job([*data, *model_overrides("mini", a.model_dir, a.cache_dir), *recipe, f"train.seed={seed}",
                         f"model.config_overrides.num_hidden_layers={k}", "save_model=false"],
                        os.path.join(out, f"k{k}_alone"))
            rows.setdefault(f"K={k} alone", []).append(alone)
        print(f"seed {seed}: " + ", ".join(f"{name} {r[-1]['main_score']:.2f}" for name, r in rows.items()), flush=True)
    report(a, rows, ks, seeds, teacher_layers, time.time() - started)
    if a.speed:
        speed(a)


def speed(a) -> None:
    """Texts per second on the demo dev texts at batch 32, tokenizing included, in this process: the
    teacher (BERT-base shape, ../shared/vocab/kcbert-base, random weights: speed does not depend on
    them) through ``transformers.pipeline`` against a 4-layer student distilled from it, exported to
    int8 ONNX, through action=predict's path (``kotune.inference.predict.predict_rows``). --smoke: the tiny encoder."""
    import transformers

    from kotune.loading.build import build
    from kotune.cli.overrides import compose
    from kotune.inference.model_runtimes import predictor_for
    from kotune.inference.predict import predict_rows

    out = os.path.join(a.out, "speed")
    shape = (["model=tiny"] if a.smoke else
             ["model=kcbert", f"model.name_or_path={os.path.join(a.shared, 'vocab', 'kcbert-base')}", "model.init=random"])
    demo = ["task=text_cls", "data=demo", f"cache_dir={a.cache_dir}", "data.max_train_samples=64", "save_predictions=false"]
    brief = ["train.max_steps=1", "train.batch_size=8"]
    job([*demo, *shape, *brief], os.path.join(out, "teacher"))
    keep = 1 if a.smoke else 4
    job(["action=distill", f"distill.teacher={os.path.join(out, 'teacher')}", f"distill.student_layers={keep}", *demo,
         *shape, *brief], os.path.join(out, "student"))
    native = job([*demo, *shape, "action=export", f"checkpoint={os.path.join(out, 'teacher')}",
                  "export.overwrite=true"], os.path.join(out, "teacher_export"))["export_dir"]
    onnx = job([*demo, *shape, "action=export", "export.format=onnx", "export.quantize=int8", "export.overwrite=true",
                f"checkpoint={os.path.join(out, 'student')}"], os.path.join(out, "student_export"))["export_dir"]
    cfg = compose([f"checkpoint={onnx}", "data=demo", "train.eval_batch_size=32", "onnx.file=model_int8.onnx",
                   f"cache_dir={a.cache_dir}"])
    b = build(cfg, ("validation",), onnx=True)
    examples = b.splits["validation"].examples[: a.speed_texts]
    texts = [e["text"] for e in examples]
    pipe = transformers.pipeline("text-classification", model=native, device="cpu")
    pipe(texts[:8], batch_size=8, truncation=True)  # warm-up, as for the student
    started = time.perf_counter()
    pipe(texts, batch_size=32, truncation=True)
    teacher_rate = len(texts) / (time.perf_counter() - started)
    predictor = predictor_for(cfg, b, os.path.join(out, "predict"))
    warm = b.task.encode(examples[:8], b.tokenizer, b.settings)
    predict_rows(predictor, b.task, warm, warm.select_columns(b.task.model_columns(warm)), examples[:8])
    started = time.perf_counter()
    features = b.task.encode(examples, b.tokenizer, b.settings)
    predict_rows(predictor, b.task, features, features.select_columns(b.task.model_columns(features)), examples)
    student_rate = len(texts) / (time.perf_counter() - started)
    print(f"speed ({len(texts)} demo texts, batch 32, {os.cpu_count()} cores): teacher ({'tiny' if a.smoke else 'BERT-base'}"
          f" shape) through transformers.pipeline {teacher_rate:.1f} texts/s; {keep}-layer student int8 ONNX through "
          f"action=predict {student_rate:.1f} texts/s: {student_rate / teacher_rate:.2f}x")
    print(f"RESULT distill_speed student_vs_teacher={student_rate / teacher_rate:.2f} texts={len(texts)}")
    served_latency(a, out, os.path.join(out, "teacher"), onnx, texts)


def served_latency(a, out: str, teacher: str, student_onnx: str, texts: list[str]) -> None:
    """p50/p95 milliseconds of single requests to ``action=serve``: the teacher's run (torch) against
    the student's int8 ONNX export, one server at a time, the same texts one after another."""
    from bench.serving import request_latency, start_server, stop_server

    served = {}
    for name, overrides in (("teacher", [f"checkpoint={teacher}"]),
                            ("student", [f"checkpoint={student_onnx}", "onnx.file=model_int8.onnx"])):
        proc, url = start_server(overrides, os.path.join(out, f"serve_{name}"))
        try:
            served[name] = request_latency(url, texts[: a.latency_n])
        finally:
            stop_server(proc)
    t, s = served["teacher"], served["student"]
    print(f"served, one request at a time ({t['n']} texts): teacher p50 {t['p50_ms']:.1f} ms, p95 {t['p95_ms']:.1f} ms; "
          f"student int8 ONNX p50 {s['p50_ms']:.1f} ms, p95 {s['p95_ms']:.1f} ms: p50 {t['p50_ms'] / s['p50_ms']:.2f}x, "
          f"p95 {t['p95_ms'] / s['p95_ms']:.2f}x faster")
    print(f"RESULT distill_served teacher_p50_ms={t['p50_ms']:.1f} teacher_p95_ms={t['p95_ms']:.1f} "
          f"student_p50_ms={s['p50_ms']:.1f} student_p95_ms={s['p95_ms']:.1f}")


def settings_tag(a, layers: bool) -> str:
    """The run directories' suffix for settings other than the defaults (T, alpha; the layer losses
    of the distilled arms): another setting into the same --out keeps the first setting's runs (a
    job is rerun in place when its config differs)."""
    parts = {"T": (a.temperature, 2.0), "alpha": (a.alpha, 0.5)}
    if layers:
        parts |= {"hidden": (a.hidden_weight, 0.0), "attention": (a.attention_weight, 0.0)}
    return "".join(f"_{name}{value:g}" for name, (value, default) in parts.items() if value != default)


def percent_of(scores: list[float], teacher: list[float]) -> float:
    """The mean score as a percentage of the teacher's mean (NaN where the teacher scores 0)."""
    return 100 * statistics.mean(scores) / statistics.mean(teacher) if statistics.mean(teacher) else float("nan")


def report(a, rows: dict[str, list[dict]], ks: list[int], seeds: list[int], teacher_layers: int,
           wall_s: float) -> None:
    metric = rows["teacher"][0]["main_metric"]
    scores = {name: [r["main_score"] for r in runs] for name, runs in rows.items()}
    teacher = scores["teacher"]
    lines = [f"{'KLUE NER (20 % of dev held out)' if a.task == 'ner' else 'hate speech dev'}, {metric} (mean ± sd over {len(seeds)} seeds), {a.steps} steps, lr {a.lr:g}, "
             f"batch {a.batch}, T {a.temperature:g}, alpha {a.alpha:g}, hidden {a.hidden_weight:g}, "
             f"attention {a.attention_weight:g}", "",
             "| model | layers | params | score | share of teacher | vs no teacher ± SE | vs alone ± SE | train wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |",
             f"| teacher | {teacher_layers} | {rows['teacher'][0]['total_params']:,} | "
             f"{spread(teacher)} | 100 % | | | {statistics.mean(r['runtime_s'] for r in rows['teacher']):.0f} |"]
    summary = []
    for k in ks:
        for arm in [n for n in scores if n.startswith(f"K={k} ")]:
            runs = rows[arm]
            share = percent_of(scores[arm], teacher)
            vs = {base: difference(scores[arm], scores[f"K={k} {base}"]) for base in ("no teacher", "alone")
                  if arm != f"K={k} {base}"}
            cells = [f"{d['mean']:+.2f} ± {d['se']:.2f} ({'shown' if d['shown'] else 'not shown'})" if d else ""
                     for d in (vs.get("no teacher"), vs.get("alone"))]
            lines.append(f"| {arm} | {k} | {runs[0]['total_params']:,} | {spread(scores[arm])} | {share:.1f} % | "
                         f"{cells[0]} | {cells[1]} | {statistics.mean(r['runtime_s'] for r in runs):.0f} |")
        distilled, alone = rows[f"K={k} distilled"], rows[f"K={k} alone"]
        ratio = statistics.mean(d["runtime_s"] / s["runtime_s"] for d, s in zip(distilled, alone))
        # the training loop with the teacher's logits computed, against the alone run's training loop
        loop = statistics.mean((d["head_train_s"] + d["distill"]["cache"]["seconds"]) / s["head_train_s"]
                               for d, s in zip(distilled, alone))
        logits_s = statistics.mean(d["distill"]["cache"]["seconds"] for d in distilled)
        gain = difference(scores[f"K={k} distilled"], scores[f"K={k} no teacher"])
        share = percent_of(scores[f"K={k} distilled"], teacher)
        summary.append(f"k={k} share={share:.1f} gain_vs_no_teacher={gain['mean']:+.2f}±{gain['se']:.2f} "
                       f"shown={gain['shown']} wall_ratio={ratio:.2f} loop_ratio={loop:.2f}")
        cache = "/".join(sorted({d["distill"]["cache"]["splits"]["train"]["status"] for d in distilled}))
        lines.append(f"| wall time, K={k}: distillation (teacher logits: {cache}) / alone: whole run | | | | | | | "
                     f"{ratio:.2f}× |")
        lines.append(f"| training loop + teacher logits ({logits_s:.1f} s) / alone's training loop, K={k} | | | | | | | "
                     f"{loop:.2f}× |")
    print("\n".join(lines))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "distill.json"), "w", encoding="utf-8") as fh:
        json.dump({"args": vars(a), "scores": scores,
                   "runtime_s": {n: [r["runtime_s"] for r in runs] for n, runs in rows.items()}}, fh, indent=1)
    print(f"RESULT distill {' '.join(summary)} seeds={len(seeds)} wall_s={wall_s:.0f}")


if __name__ == "__main__":
    main()
