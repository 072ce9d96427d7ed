"""``action=rerank checkpoint=RUN_OR_EXPORT rerank.candidates=FILE rerank.query=TEXT`` (or
``rerank.queries=FILE``): a pair model (a cross-encoder: the sequence head on ``[CLS] query [SEP]
candidate [SEP]``) scores every (query, candidate) pair; ``rankings.jsonl`` holds each query's
candidates best first (tasks/rerank.py reads the files and turns outputs into scores).

The model is served as ``action=serve`` and ``kotune.load`` serve it (kotune/serving/app.py: a run
directory or an ONNX export; kotune/api/native.py: a native export), and its batches run through
kotune/inference/predict.py's length-sorted prediction: no inference loop of its own."""
from __future__ import annotations

import os
import time

from omegaconf import DictConfig

from kotune.core.errors import ConfigError
from kotune.core.files import write_jsonl_atomic
from kotune.core.log import log
from tasks import build_task, rerank

USAGE = ("action=rerank needs checkpoint=RUN_OR_EXPORT (a pair model), rerank.candidates=FILE and "
         "rerank.query=TEXT or rerank.queries=FILE")


def scorer(cfg: DictConfig):
    """Serving's predictor over ``checkpoint=``: a run directory, an ONNX or a native export."""
    from kotune.api.native import native_predictor
    from kotune.export.native_card import is_native_export

    path = str(cfg.checkpoint)
    if is_native_export(path):
        options = cfg.get("predict") or {}
        return native_predictor(path, [f"train.eval_batch_size={int(cfg.train.eval_batch_size)}",
                                       *(f"predict.{k}={options[k]}" for k in ("device", "precision", "batch_tokens")
                                         if options.get(k) is not None)])
    refuse(build_task(cfg.task))  # before the model loads: the checkpoint's task (kotune/loading/checkpoint.py)
    from kotune.serving.app import Predictor

    return Predictor(cfg)


def refuse(task) -> None:
    why = rerank.refusal(task)
    if why:
        raise ConfigError(f"action=rerank: task {task.name} {why}")


def run(cfg: DictConfig, run_dir: str) -> dict:
    if not cfg.get("checkpoint"):
        raise ConfigError(USAGE)
    options, quoting = cfg.rerank, str(cfg.data.get("quoting", "auto"))
    top_k = rerank.check_top_k(options.get("top_k"))
    queries = rerank.read_queries(options.get("query"), options.get("queries"), options.get("query_column"), quoting)
    candidates = rerank.read_candidates(options.get("candidates"), options.get("candidate_column"), quoting)
    served = scorer(cfg)
    task = served.b.task
    refuse(task)
    labels = None if getattr(task, "regression", False) else list(task.labels)
    positive = None if labels is None else rerank.positive_label(labels, options.get("positive_label"))
    score = "the regression value" if labels is None else f"the probability of label {positive}"
    log(f"reranking {len(candidates)} candidates for {len(queries)} queries: the score is {score}")
    from kotune.inference.predict import predict_logits

    started, records = time.perf_counter(), []
    for query in queries:  # one query's pairs at a time: memory bounded by the candidate file
        examples = [{"id": f"{query['row']}|{c['row']}", "text": query["text"], "text_pair": c["text"]}
                    for c in candidates]
        features, inputs = served.encoded(examples)
        logits, _ = predict_logits(served.batches, features, inputs)
        records.append(rerank.ranking(query, candidates, rerank.pair_scores(logits, labels, positive), top_k))
    seconds = time.perf_counter() - started
    path = os.path.join(run_dir, "rankings.jsonl")
    write_jsonl_atomic(path, records)
    log(f"wrote {len(records)} rankings to {path}")
    pairs = len(queries) * len(candidates)
    return {"n_queries": len(queries), "n_candidates": len(candidates), "n_pairs": pairs, "score": score,
            "positive_label": positive, "top_k": top_k, "runtime": str(served.runtime),
            "inference": served.batches.inference_report(),
            "pairs_per_second": round(pairs / max(seconds, 1e-9), 1), "rankings_file": path, "metrics": {}}
