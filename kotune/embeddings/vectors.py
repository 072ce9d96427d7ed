"""kotune's side of the bi-encoder: a split's distinct texts embedded in length-sorted batches by the
model's own layer choice and pooling (heads/model/embed.py, the path ``action=embed`` takes), scored by
the task (tasks/embedding_metrics.py), and ``action=eval`` / ``predict`` / ``embed`` of a checkpoint."""
from __future__ import annotations

import os
import time

import numpy as np
from omegaconf import DictConfig

from heads.model.inference import Inference, check_batch_tokens, of as inference_of
from kotune.core.errors import ConfigError
from kotune.core.files import write_jsonl_atomic
from kotune.core.log import log


def check_model(model) -> None:
    """A bi-encoder trains its encoder: frozen mode would train nothing, LoRA is not wired to its trainer."""
    if getattr(model, "runtime", "torch") != "torch":  # an ONNX export: nothing to train, read as it is
        return
    if model.frozen:
        raise ConfigError("mode=frozen: a bi-encoder's only weights are its encoder's, which frozen mode does not "
                          "train (compare frozen features with action=embed, or bench/embeddings.py)")
    if model.lora:
        raise ConfigError("mode=lora: task=sentence_embedding trains the whole encoder (mode=finetune)")


def embed_features(model, features, batch_size: int, on: Inference | None = None,
                   batch_tokens: int | None = None) -> tuple[np.ndarray, float]:
    """[N, H] vectors of tokenized texts (row i = feature i) and the texts per second, on ``on``'s
    device and precision (predict.device, predict.precision; None: auto, fp32), ``batch_size`` rows or
    ``batch_tokens`` tokens (predict.batch_tokens) a batch."""
    from heads.model.embed import pooled_vectors

    started = time.time()
    if getattr(model, "runtime", "torch") == "onnxruntime":  # an ONNX export (kotune/embeddings/onnx.py)
        vectors = onnx_vectors(model, features, batch_size, on, batch_tokens)
    else:
        vectors = pooled_vectors(model.encoder, model.mixer, features, model.head.pooling, batch_size=batch_size,
                                 inference=on, batch_tokens=batch_tokens, padding_free=getattr(model, "padding_free", False))
    return vectors, round(len(features) / max(time.time() - started, 1e-9), 2)


def onnx_vectors(model, features, batch_size: int, on: Inference | None = None,
                 batch_tokens: int | None = None) -> np.ndarray:
    """An ONNX export's ``sentence_embedding`` of each row, in the same length-sorted batches (its
    execution provider chosen by ``on``'s device)."""
    import torch

    from heads.model.feature_cache import iter_states

    model.run_on(on)

    def run(ids, mask, token_types):
        batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_types}
        return torch.from_numpy(np.asarray(model({k: v for k, v in batch.items() if v is not None})))

    out: np.ndarray | None = None
    # padding is masked out of every real token's state and of the pooling: any id serves
    for rows, batch in iter_states(run, features, pad_token_id=0,
                                   batch_size=batch_size, inference=Inference(), what="embedding",
                                   batch_tokens=batch_tokens):
        if out is None:  # the batch reaches onnxruntime as numpy: the CPU side of its provider
            out = np.zeros((len(features), batch.shape[-1]), dtype=np.float32)
        out[rows] = batch
    return out


def score_split(b, split: str, batch_size: int, on: Inference | None = None) -> tuple[dict, dict]:
    """The split's metrics (tasks/sentence_embedding.py) from kotune's embeddings of its texts."""
    vectors, rate = embed_features(b.model, b.features[split], batch_size, on)
    metrics = b.task.score_vectors(vectors.tolist(), b.splits[split].examples)
    log(" ".join(f"{k}={v:.2f}" for k, v in metrics.items()))
    return metrics, {"eval_samples_per_second": rate}


def report(cfg: DictConfig, b, metrics: dict, speed: dict, **extra) -> dict:
    """The one results body of train, eval and predict (kotune/inference/predict.py's REPORT_KEYS)."""
    from kotune.inference.predict import REPORT_KEYS

    out = dict.fromkeys(REPORT_KEYS)
    out.update({f"n_{'eval' if s == 'validation' else s}": len(d.examples) for s, d in b.splits.items()},
               head=b.model.head_description(), **b.model.report(), max_length=b.max_length,
               cache={"status": "off"}, **speed, checkpoint=cfg.get("checkpoint"), metrics=metrics,
               data={s: d.source for s, d in b.splits.items()})
    out.update(extra)
    return out


def evaluate(cfg: DictConfig, run_dir: str) -> dict:
    """``action=eval checkpoint=RUN``: the validation split's metrics (RUN: a run, or its ONNX export)."""
    from kotune.loading.build import build

    if not cfg.get("checkpoint"):
        raise ConfigError("action=eval needs checkpoint=RUN_DIR (a directory written by action=train)")
    b = build(cfg, ("validation",), onnx=True)
    b.task.check_main_metric(b.splits["validation"].examples, b.splits["validation"].where)
    metrics, speed = score_split(b, "validation", int(cfg.train.eval_batch_size), inference_of(cfg))
    return report(cfg, b, metrics, speed)


def predict(cfg: DictConfig, run_dir: str) -> dict:
    """``action=predict checkpoint=RUN data.predict_file=FILE``: per row, the text's embedding (a file
    of texts) or the pair's cosine similarity (pairs, triplets: anchor with positive and negative)."""
    from kotune.loading.build import build
    if not cfg.get("checkpoint"):
        raise ConfigError("action=predict needs checkpoint=RUN_DIR (a directory written by action=train)")
    b = build(cfg, ("predict",), onnx=True)
    examples = b.splits["predict"].examples
    vectors, rate = embed_features(b.model, b.features["predict"], int(cfg.train.eval_batch_size), inference_of(cfg),
                                   check_batch_tokens(cfg.predict.get("batch_tokens")))
    if "text" not in examples[0]:
        raise ConfigError(f"action=predict reads texts (an embedding each) or pairs (their similarity): "
                          f"{b.splits['predict'].where} holds {examples[0]['shape']} rows (action=eval scores them)")
    outputs = b.task.decode(vectors, b.features["predict"], examples)
    path = os.path.join(run_dir, "predictions.jsonl")
    write_jsonl_atomic(path, b.task.prediction_records(outputs, examples))
    return report(cfg, b, {}, {"eval_samples_per_second": rate}, predictions_file=path)


def embed(cfg: DictConfig, run_dir: str) -> dict:
    """``action=embed checkpoint=RUN embed.input=FILE``: the trained bi-encoder's vectors (its own layer
    choice and pooling), written as action=embed writes any model's (tasks/embed.py)."""
    from kotune.loading.build import load_encoder_side
    from tasks import embed as texts_io

    if not cfg.get("checkpoint"):
        raise ConfigError("action=embed with task=sentence_embedding embeds with a trained bi-encoder: "
                          "checkpoint=RUN_DIR (an untrained encoder's features: leave task= out)")
    if not cfg.embed.get("input"):
        raise ConfigError("action=embed needs embed.input=FILE (one text per line, or CSV/JSONL with embed.column)")
    if cfg.embed.get("target"):
        raise ConfigError("embed.target: a word's vectors by layer come from the encoder's layers; leave "
                          "task=sentence_embedding out (the checkpoint's encoder is read the same way)")
    column = cfg.embed.get("column")
    rows = texts_io.read_texts(str(cfg.embed.input), None if column is None else str(column), cfg.embed.get("format"),
                               quoting=cfg.data.get("quoting", "auto"))
    texts = [text for _, text in rows]
    loaded = load_encoder_side(cfg, None, texts)
    check_model(loaded.model)
    features, _, truncated = texts_io.encode_texts(texts, loaded.tokenizer, loaded.max_length, loaded.token_type_ids)
    on = inference_of(cfg)
    vectors, rate = embed_features(loaded.model, features, int(cfg.train.eval_batch_size), on,
                                   check_batch_tokens(cfg.predict.get("batch_tokens")))
    lengths = [len(ids) for ids in features["input_ids"]]
    log(f"wrote {vectors.shape[0]} × {vectors.shape[1]} embeddings ({loaded.model.describe()}, "
        f"{loaded.model.head.pooling} pooling)")
    return {"n_texts": len(texts), "dim": int(vectors.shape[1]), "encoder": str(cfg.checkpoint),
            **loaded.model.mixer.report(), "pooling": loaded.model.head.pooling, "max_length": loaded.max_length,
            "n_truncated": sum(truncated), "texts_per_second": rate, "inference": on.describe(), "metrics": {},
            **texts_io.write_embeddings(run_dir, vectors, rows, str(cfg.embed.input), lengths, truncated)}
