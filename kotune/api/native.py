"""A native export (``action=export``: the architecture's transformers class, kotune/export/native.py) behind
``kotune.load``: the transformers model stands in for the kotune model where kotune only predicts (as
an ONNX export's :class:`kotune.export.onnx.OnnxModel` does), and ``action=serve``'s predictor
(kotune/serving/app.py) encodes, batches, decodes and writes the records.

A native export keeps what transformers reads, not kotune's ``kotune.json``: the task is the one its
model card names (the export's README.md tags: ``kotune``, the task, the head), the labels those of
``config.json`` (``id2label``), a multi-label model's thresholds ``config.kotune_thresholds``, the
length and token type ids the tokenizer's. Other task options are the task preset's (give
``task.X=`` overrides for a model trained with others; ``task=NAME`` where the card names none)."""
from __future__ import annotations

import os
from typing import Any

from heads.model.inference import Inference
from kotune.core.backends import Runtime
from kotune.api.compose import compose_job
from kotune.core.atomic_dir import settle, verify_manifest
from kotune.core.errors import KotuneError
from kotune.core.registry import register_runtime
from kotune.export.native_card import card_task

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def native_suffix(head: str) -> str:
    """The native class name's ending of a head kind (``Head.native``), "?" for a head without one."""
    from heads.registry import HEADS

    native = HEADS.get(head).native
    return native.suffix if native is not None else "?"


@register_runtime("transformers")
class TransformersRuntime(Runtime):
    """:class:`NativeModel`: a padded batch in, the logits out (it is its own forward)."""

    kind = "native"

    def forward(self, model: Any) -> Any:
        model.run_on(self.inference)
        return model


class NativeModel:
    """A native export run by transformers, standing in for a KotuneModel where kotune only
    predicts: ``head_kind`` and ``meta`` as kotune would have saved them, and a call that turns one
    padded batch into the logits KotuneModel would give (a tuple for the span head)."""

    runtime = "transformers"
    frozen = False
    windows = None

    def __init__(self, path: str, head_kind: str, meta: dict):
        import transformers

        config = transformers.AutoConfig.from_pretrained(path)
        name = (getattr(config, "architectures", None) or [""])[0]
        cls = getattr(transformers, name, None) if name.endswith(native_suffix(head_kind)) else None
        if cls is None:
            raise KotuneError(f"{path}: config.json's architecture {name or 'none'} is not a class kotune exports")
        self.native = native_weights(cls, path).eval()
        self.head_kind, self.meta, self.file = head_kind, meta, None
        self.span = name.endswith("ForQuestionAnswering")
        self.inference = Inference()  # the CPU until run_on (predict.device)

    def run_on(self, inference: Inference | None) -> None:
        """Batches on ``inference``'s device and precision from now on (the model moved once)."""
        self.inference = inference or Inference()
        self.inference.place(self.native)

    def __call__(self, batch: dict) -> Any:
        import torch

        feed = {k: torch.as_tensor(batch[k]) for k in INPUTS if k in batch}
        if not self.meta.get("token_type_ids", True):
            feed.pop("token_type_ids", None)

        def logits(**inputs):  # the head's logits as KotuneModel gives them (a QA model's start and end)
            out = self.native(**inputs)
            return (out.start_logits, out.end_logits) if self.span else out.logits

        return self.inference.forward(logits, **feed)

    def report(self) -> dict:
        return {"layers": "last", "pooling": "cls" if self.head_kind == "sequence" else None}

    def head_description(self) -> str:
        return self.head_kind  # an export's head has no options (kotune/export/native.py refuses those that do)

    def describe(self) -> str:
        return f"transformers: {type(self.native).__name__}"


def native_weights(cls, path: str):
    """``cls`` (config.json's architecture) from the export's weights, every weight its own: a key
    missing, unexpected or of another shape (config.json's class changed to another: its weights
    would be random) is one line naming the file and a few keys, as is a file transformers fails on."""
    from heads.model.artifact import BUFFERS, ArtifactError, check_against_weights

    weights = os.path.join(path, "model.safetensors")
    what = f"not the weights of {cls.__name__} (config.json's architectures)"
    try:  # its sizes against the weights' headers first: nothing allocated for a config that lies
        check_against_weights(lambda: cls(cls.config_class.from_pretrained(path)), path, what)
        native, info = cls.from_pretrained(path, output_loading_info=True)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as e:  # the files', not kotune's
        raise ArtifactError(f"{path}: its config.json and weights do not make a {cls.__name__} "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    wrong = {"missing": [k for k in info.get("missing_keys") or [] if not k.endswith(BUFFERS)],
             "unexpected": [k for k in info.get("unexpected_keys") or [] if not k.endswith(BUFFERS)],
             "of another shape": [str(k[0] if isinstance(k, (tuple, list)) else k)
                                  for k in info.get("mismatched_keys") or []]}
    found = [f"{what} {', '.join(sorted(keys)[:3])}" + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
             for what, keys in wrong.items() if keys]
    if found:
        raise ArtifactError(f"{weights}: {what}: " + "; ".join(found))
    return native


def checked_native_export(path: str) -> None:
    """A native export's files before any is read: every one inside ``path`` and of its kind
    (heads/model/artifact.py's check_files), then as its manifest lists them."""
    from heads.model.artifact import check_files, check_weights

    settle(path)  # an export killed while swapping its directory in: the whole one back
    check_files(path, path)
    verify_manifest(path, True, "export it again (action=export)")
    check_weights(path)


def load_native(path: str, task) -> tuple[NativeModel, Any]:
    """The native export at ``path`` read for ``task`` (a built task): the model, with ``meta`` as
    kotune would have saved it (labels from ``id2label``, thresholds, length, token type ids), and
    its tokenizer. An export that does not fit the task, or reads documents as windows: one line."""
    from transformers import AutoConfig, AutoTokenizer

    config, tokenizer = AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    if getattr(config, "kotune_windows", None):
        raise KotuneError(f"{path}: a native export of a model that reads documents as windows (config.kotune_windows); "
                          "load the run directory or an ONNX export of it")
    suffix = native_suffix(task.head)
    if not (getattr(config, "architectures", None) or [""])[0].endswith(suffix):
        raise KotuneError(f"{path}: a {(config.architectures or ['?'])[0]} does not fit task {task.name} "
                          f"(its {task.head} head exports as *{suffix})")
    labels = [config.id2label[i] for i in sorted(config.id2label)] if task.label_fields == ("labels",) else None
    options = {"threshold": list(config.kotune_thresholds.values())} if getattr(config, "kotune_thresholds", None) else {}
    max_length = int(min(tokenizer.model_max_length, config.max_position_embeddings))
    meta = {"task": task.name, "labels": labels, "max_length": max_length,
            "token_type_ids": "token_type_ids" in tokenizer.model_input_names, "task_options": options}
    return NativeModel(path, task.head, meta), tokenizer


def native_predictor(path: str, overrides: list[str]):
    """``action=serve``'s predictor over the native export at ``path``."""
    from kotune.devices import pad_multiple
    from kotune.loading.built import Built, make_collator, use_padding_free
    from kotune.loading.reconcile import task_for_checkpoint
    from kotune.inference.model_runtimes import batch_predictor
    from kotune.serving.app import Predictor, servable
    from tasks import build_task
    from tasks.abstention import checked_threshold
    from tasks.base import EncodeSettings

    checked_native_export(path)
    asked = {o.lstrip("+").partition("=")[0] for o in overrides}
    named = card_task(path)
    if named is None and "task" not in asked:
        raise KotuneError(f"{path}: a native export whose model card names no kotune task: "
                          "load(path, 'task=NAME') says which")
    cfg = compose_job(["action=predict", *([f"task={named}"] if "task" not in asked else []), *overrides])
    task = build_task(cfg.task)
    model, tokenizer = load_native(path, task)
    max_length, meta = model.meta["max_length"], model.meta
    task = task_for_checkpoint(task, meta | {"head": task.head}, path)
    servable(task)
    predictor = Predictor.__new__(Predictor)  # serving's predictor, over a model it did not build
    use_padding_free(model, bool(cfg.model.get("padding_free")))  # a native export runs padded: refused in one line
    predictor.b = Built(task, {}, tokenizer, model, {}, max_length, make_collator(tokenizer, pad_multiple(cfg.train)))
    predictor.b.settings = EncodeSettings(max_length=max_length, token_type_ids=meta["token_type_ids"])
    predictor.b.min_confidence = checked_threshold((cfg.get("predict") or {}).get("min_confidence"), task)
    predictor.runtime = model.runtime
    predictor.batches = batch_predictor(cfg, model, predictor.b.collator)  # predict.device, precision, batch_tokens
    return predictor
