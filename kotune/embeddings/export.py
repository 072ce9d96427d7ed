"""Exports of a bi-encoder checkpoint (head ``bi_encoder``, task=sentence_embedding); the ONNX one is
in kotune/embeddings/onnx.py:

- ``export.format=sentence_transformers``: sentence-transformers' own save of the model built on the
  checkpoint's encoder (heads/model/sentence_transformer.py: stock modules, the layer choice and pooling in
  their configs), so ``SentenceTransformer(export_dir).encode(texts)`` gives kotune's embeddings with
  nothing of kotune installed; kotune's model card (README.md) replaces the library's;
- ``export.format=onnx`` (``export.quantize=int8`` adds the dynamically quantized model): encoder,
  layer choice and pooling traced as one graph with kotune/export/onnx.py's exporter, inputs
  ``input_ids``, ``attention_mask``[, ``token_type_ids``], output ``sentence_embedding``.

Both directories appear whole or not at all (kotune/core/atomic_dir.py)."""
from __future__ import annotations

import os
from typing import Any, Callable

from kotune.core.backends import Exporter
from kotune.core.errors import ConfigError
from kotune.core.registry import register_exporter

ST_CLASS = "SentenceTransformer"


def load_bi_encoder(model_dir: str):
    """The saved KotuneModel of ``model_dir`` and its tokenizer; another head is refused in one line."""
    from transformers import AutoTokenizer

    from heads.model.kotune_model import KotuneModel

    model = KotuneModel.load(model_dir)
    if model.head_kind != "bi_encoder":
        raise ConfigError(f"export.format=sentence_transformers writes a bi-encoder (task=sentence_embedding); "
                          f"{model_dir} has a {model.head_description()} head (export.format=native or onnx)")
    if model.lora:
        from heads.model.lora import merge

        model.encoder = merge(model.encoder, model_dir)
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)


@register_exporter("sentence_transformers")
class SentenceTransformersExporter(Exporter):
    """``export.format=sentence_transformers``: ``SentenceTransformer.save`` of the bi-encoder."""

    default_dir = "sentence_transformers"
    library = "sentence-transformers"

    def export(self, model_dir: str, out_dir: str, options: dict, finish: Callable[[dict, str], Any]) -> dict:
        from heads.model.sentence_transformer import from_kotune_model
        from kotune.core.atomic_dir import written_whole

        model, tokenizer = load_bi_encoder(model_dir)
        st = from_kotune_model(model, tokenizer, device="cpu")
        res = {"export_dir": out_dir, "format": "sentence_transformers", "native_class": ST_CLASS,
               "pipeline": None, "layers": model.mixer.spec.describe(), "pooling": model.head.pooling,
               "dim": embedding_dimension(st), "input_note": None}
        with written_whole(out_dir, "st-export") as staging:
            st.save(staging, create_model_card=False)
            add_unused_pooler(model, staging)
            finish(res, staging)
        return res

    def usage(self, res: dict, out_dir: str) -> str:
        return f"sentence_transformers.SentenceTransformer('{out_dir}').encode(texts)"

    def card_usage(self, res: dict, out_dir: str) -> list[str]:
        from kotune.export.model_card import sentence_transformers_usage

        return sentence_transformers_usage(res)


def add_unused_pooler(model, folder: str) -> None:
    """BERT and RoBERTa build a pooler when loaded; kotune's encoder has none (its heads pool). Its
    weights go into the export (the checkpoint's own pooler where kotune kept it, else zeros), so that
    ``SentenceTransformer(folder)`` loads without a report of missing weights; the pooler's output is
    never read (Pooling reads the token states)."""
    import torch
    from safetensors.torch import load_file, save_file

    from heads.model.encoder import no_pooler

    path = os.path.join(folder, "model.safetensors")
    if not no_pooler(model.encoder.config) or not os.path.exists(path):
        return
    weights = load_file(path)
    if "pooler.dense.weight" in weights:
        return
    hidden = int(model.encoder.config.hidden_size)
    kept = model.pooler_state or {}
    weights["pooler.dense.weight"] = kept.get("weight", torch.zeros(hidden, hidden)).contiguous()
    weights["pooler.dense.bias"] = kept.get("bias", torch.zeros(hidden)).contiguous()
    save_file(weights, path, metadata={"format": "pt"})


def embedding_dimension(st) -> int:
    """A SentenceTransformer's vector size, by the method's name in the installed sentence-transformers
    (6.x: ``get_embedding_dimension``; the old ``get_sentence_embedding_dimension`` there warns)."""
    method = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
    return int(method())
