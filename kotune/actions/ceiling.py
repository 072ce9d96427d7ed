"""``action=ceiling``: gold labels through the exact encoding and decoding — the best score this
tokenizer and these settings allow. Needs a tokenizer (and the model's config for its position
limit), no weights."""
from __future__ import annotations

from omegaconf import DictConfig

from kotune.loading.build import load_encoder_side
from tasks import build_task
from tasks.base import EncodeSettings
from tasks.encode_cache import encode_cached
from tasks.splits import load_splits
from kotune.core.log import log


def run(cfg: DictConfig, run_dir: str) -> dict:
    task = build_task(cfg.task)
    splits = load_splits(task, cfg.data, ("validation",), int(cfg.train.seed))
    examples = splits["validation"].examples
    task.fit_labels(examples)  # a label set learned from data (text_cls, token_cls): the gold file's
    loaded = load_encoder_side(cfg, task, task.training_texts(examples), weights=False)
    settings = EncodeSettings(max_length=loaded.max_length, token_type_ids=loaded.token_type_ids)
    features = encode_cached(task, examples, loaded.tokenizer, settings, cfg.cache_dir)
    metrics, report = task.ceiling(features, examples)
    for line in report.get("lines", []):
        log(line)
    return {"n_eval": len(examples), "max_length": settings.max_length, "metrics": metrics,
            "ceiling": {k: v for k, v in report.items() if k != "lines"},
            "data": {s: d.source for s, d in splits.items()}}
