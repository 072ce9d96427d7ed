"""``action=embed``: contextual embeddings of ``embed.input`` with ``mode.layers`` and
``mode.pooling``, from a checkpoint (its trained scalar mix when the layer choice matches) or the
configured encoder; ``embed.target`` adds that word's vectors in context, layer by layer
(tasks/embed.py for the text side, heads/model/embed.py for the vectors)."""
from __future__ import annotations

import time

from omegaconf import DictConfig

from heads.model.inference import check_batch_tokens, of as inference_of
from kotune.loading.build import load_encoder_side
from kotune.loading.built import resolve_max_length
from kotune.loading.checkpoint import read_spec
from kotune.devices import seed_everything
from tasks import embed
from kotune.core.errors import ConfigError
from kotune.core.log import log


def run(cfg: DictConfig, run_dir: str) -> dict:
    from heads.model.embed import pooled_vectors, token_vectors_by_layer
    from heads.model.layers import LayerMixer, check_pooling, parse_layers

    if not cfg.embed.get("input"):
        raise ConfigError("action=embed needs embed.input=FILE (one text per line, or CSV/JSONL with embed.column)")
    saved = (read_spec(cfg.checkpoint).get("meta") or {}).get("columns") if cfg.get("checkpoint") else None
    column = cfg.embed.get("column")
    rows = embed.read_texts(str(cfg.embed.input), None if column is None else str(column), cfg.embed.get("format"),
                            quoting=cfg.data.get("quoting", "auto"), default=(saved or {}).get("text") or "text")
    texts = [text for _, text in rows]
    seed_everything(int(cfg.train.seed))
    loaded = load_encoder_side(cfg, None, texts)
    tokenizer, encoder, model = loaded.tokenizer, loaded.encoder, loaded.model
    source = cfg.checkpoint if model is not None else (cfg.model.name_or_path or cfg.model.name)
    max_length = loaded.max_length if model is not None else resolve_max_length(int(cfg.train.max_length), loaded.config)
    spec = parse_layers(cfg.mode.get("layers", "last"), int(encoder.config.num_hidden_layers))
    mixer = model.mixer if model is not None and model.mixer.spec == spec else LayerMixer(spec)
    head_pooling = model.head_kwargs.get("pooling") if model is not None else None
    pooling = check_pooling(cfg.mode.get("pooling")) or head_pooling or "cls"
    features, offsets, truncated = embed.encode_texts(texts, tokenizer, max_length, loaded.token_type_ids)
    if any(truncated):
        log(f"embed: {sum(truncated)} text(s) cut at {max_length} tokens (train.max_length)")
    log(f"embedding {len(texts)} texts: {mixer.describe_mix()}, {pooling} pooling")
    started = time.time()
    on = inference_of(cfg)  # predict.device, predict.precision
    padding_free = bool(cfg.model.get("padding_free"))
    if padding_free:  # refused in one line before any batch runs
        from heads.model.packing import check_padding_free

        check_padding_free(encoder)
    vectors = pooled_vectors(encoder, mixer, features, pooling, batch_size=int(cfg.train.eval_batch_size), inference=on,
                             batch_tokens=check_batch_tokens(cfg.predict.get("batch_tokens")), padding_free=padding_free)
    lengths = [len(ids) for ids in features["input_ids"]]
    res = {"n_texts": len(texts), "dim": int(vectors.shape[1]), "encoder": str(source), **mixer.report(),
           "pooling": pooling, "max_length": max_length, "n_truncated": sum(truncated), "inference": on.describe(),
           "embed_s": round(time.time() - started, 3), "metrics": {},
           **embed.write_embeddings(run_dir, vectors, rows, str(cfg.embed.input), lengths, truncated)}
    log(f"wrote {vectors.shape[0]} × {vectors.shape[1]} embeddings to {res['embeddings_file']}")
    if cfg.embed.get("target"):
        target = str(cfg.embed.target)
        found = embed.find_target(target, texts, offsets)
        per_layer = token_vectors_by_layer(encoder, features, [(o.row, o.tokens) for o in found],
                                           batch_size=int(cfg.train.eval_batch_size), inference=on,
                                           padding_free=padding_free)
        table = embed.cosine_by_layer(per_layer)
        for line in embed.cosine_lines(target, table):
            log(line)
        tokens = {o.row: tokenizer.convert_ids_to_tokens(features[o.row]["input_ids"]) for o in found}
        res["target"] = embed.write_target(run_dir, target, per_layer, found, texts, tokens, table)
    return res
