"""A kotune model as the architecture's native transformers class (``BertForSequenceClassification``,
``ElectraForTokenClassification``, ``RobertaForQuestionAnswering``, …): the class, the weight
mapping, and a one-line refusal for heads with no exact native equivalent.

The heads are built to equal the native ones (heads/native.py), so the mapping is a renaming:

=========  ==============================  ==============================  ======================
head       bert                            roberta / electra               native class suffix
=========  ==============================  ==============================  ======================
sequence   dense → ``bert.pooler.dense``   dense → ``classifier.dense``    ForSequenceClassification
           out → ``classifier``            out → ``classifier.out_proj``
token      out → ``classifier``            out → ``classifier``            ForTokenClassification
span       out → ``qa_outputs``            out → ``qa_outputs``            ForQuestionAnswering
=========  ==============================  ==============================  ======================
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from kotune.core.backends import Exporter
from heads.base import NativeHead
from heads.native import head_style
from tasks import TASKS
from kotune.core.atomic_dir import written_whole
from kotune.core.errors import ConfigError
from kotune.core.log import warn
from kotune.core.registry import register_exporter

CLASS_PREFIX = {"bert": "Bert", "roberta": "Roberta", "electra": "Electra"}


def native_head(model) -> NativeHead:
    """The head's native twin (``Head.native_export``), or a one-line refusal."""
    reason = refusal(model)
    if reason:
        raise ConfigError(f"cannot export: {reason}")
    return model.head.native_export()


def refusal(model) -> str | None:
    """Why ``model`` has no exact native equivalent, or None when it has one."""
    config, native = model.encoder.config, model.head.native_export()
    if not isinstance(native, NativeHead):
        return f"the {model.head.describe()} head has no native transformers class" + (f": {native}" if native else "")
    if config.model_type not in CLASS_PREFIX:
        return (f"encoder type '{config.model_type}' is not one of {', '.join(CLASS_PREFIX)}, whose native "
                "heads kotune reproduces")
    spec = model.mixer.spec
    if spec.name != "last":
        return (f"the head reads mode.layers={spec.describe()}; native classes read the last layer only"
                + (" (a learned scalar mix has no native form)" if spec.learned else ""))
    if getattr(model.head, "pooling", "cls") != "cls":
        return f"mode.pooling={model.head.pooling}: native classifiers read the [CLS] state only"
    style = getattr(model.head, "architecture", head_style(config))
    if style != head_style(config):
        return (f"its sequence head has the {style} shape on a {config.model_type} encoder (saved by an "
                "older kotune); retrain to export")
    return None


def native_class_name(model) -> str:
    return CLASS_PREFIX[model.encoder.config.model_type] + native_head(model).suffix


def native_class(model):
    import transformers

    return getattr(transformers, native_class_name(model))


def head_key_map(model) -> dict[str, str]:
    """kotune head parameter name → native parameter name."""
    return native_head(model).key_map(head_style(model.encoder.config))


def native_state_dict(model) -> dict[str, torch.Tensor]:
    """The native class's state dict: encoder under its base-model prefix, head renamed."""
    prefix = native_class(model).base_model_prefix
    out = {f"{prefix}.{k}": v for k, v in model.encoder.state_dict().items()}
    head = model.head.state_dict()
    mapping = head_key_map(model)
    if set(head) != set(mapping):
        raise ConfigError(f"cannot export: head parameters {sorted(head)} do not map onto "
                          f"{native_class_name(model)} ({sorted(mapping)})")
    out.update({mapping[k]: v for k, v in head.items()})
    return out


def native_config(model, labels: list[str] | None = None):
    """The encoder's config with the head's label count, label names and dropout (``Head.native_config``)."""
    import copy

    config = copy.deepcopy(model.encoder.config)
    model.head.native_config(config, model.head_kwargs)
    if labels and model.head.label_fields == ("labels",) and len(labels) == config.num_labels:
        config.id2label = {i: str(name) for i, name in enumerate(labels)}
        config.label2id = {str(name): i for i, name in enumerate(labels)}
    config.architectures = [native_class_name(model)]
    return config


class Native(NamedTuple):
    """A kotune model ready to export: the model, its native twin, the tokenizer to ship, the input
    note (None for plain text) and whether a LoRA adapter was merged in."""

    model: Any
    native: Any
    tokenizer: Any
    note: str | None
    lora_merged: bool


def to_native(model, labels: list[str] | None = None):
    """A native transformers model with ``model``'s weights (strict: every parameter mapped)."""
    cls = native_class(model)
    native = cls(native_config(model, labels))
    state = native_state_dict(model)
    missing, unexpected = native.load_state_dict(state, strict=False)
    # buffers a config rebuilds (position ids) may be absent from the kotune side; weights may not
    missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]
    if missing or unexpected:
        raise ConfigError(f"cannot export to {cls.__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return native.eval()


def load_native(model_dir: str, model=None) -> "Native":
    """A saved kotune model (``model_dir``) as its native transformers model (:class:`Native`), or a
    one-line refusal for a head with no exact native equivalent. The tokenizer keeps the model's
    ``do_lower_case``, gets ``model_max_length`` = the model's max_length and drops token type ids
    where the model had none; special tokens the task added (KLUE RE's ``<subj>``) stay. A task whose
    input is more than plain text (RE's entity markers) says so in one warning line, in the note and
    in the native config (``kotune_input``). A LoRA model's adapter is merged into its encoder first
    (``heads.model.lora.merged_exactly``: refused in one line where the merge would change the outputs).
    ``model``: the saved model, where the caller has loaded it already."""
    from heads.model.kotune_model import KotuneModel

    model = model if model is not None else KotuneModel.load(model_dir)
    reason = refusal(model)
    if reason:
        raise ConfigError(f"cannot export {model_dir}: {reason}")
    merged = merge_adapter(model, model_dir)
    native = to_native(model, model.meta.get("labels"))
    thresholds = (model.meta.get("task_options") or {}).get("threshold")
    if model.head_kwargs.get("multi_label") and isinstance(thresholds, list):
        # the decision the model was trained (or tuned) with: label predicted at probability ≥ its threshold
        native.config.kotune_thresholds = dict(zip(native.config.id2label.values(), thresholds))
    note = input_note(model.meta)
    if note:  # e.g. RE: the model never saw unmarked text, and a pipeline would feed it some
        warn(note)
        native.config.kotune_input = note
    for key, value in input_fields(model.meta).items():  # e.g. how to window a long document
        setattr(native.config, key, value)
    return Native(model, native, export_tokenizer(model, model_dir), note, merged)


def merge_adapter(model, model_dir: str) -> bool:
    """mode=lora: the adapter merged into the encoder's weights (in place), checked to compute the same
    (``heads.model.lora.merged_exactly``); whether there was one."""
    if not model.lora:
        return False
    from heads.model.lora import merged_exactly

    model.encoder, model.lora = merged_exactly(model.encoder, model_dir), None
    return True


def export_tokenizer(model, model_dir: str):
    """The saved model's tokenizer as an export ships it: its ``do_lower_case``, ``model_max_length`` =
    the model's max_length, no token type ids where the model had none; the task's special tokens stay."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if model.meta.get("max_length"):
        tokenizer.model_max_length = int(model.meta["max_length"])
    if not model.meta.get("token_type_ids", True):  # e.g. RoBERTa: type ids other than 0 would break it
        tokenizer.model_input_names = [n for n in tokenizer.model_input_names if n != "token_type_ids"]
        tokenizer.init_kwargs["model_input_names"] = tokenizer.model_input_names
    return tokenizer


def export_summary(n: "Native", out_dir: str) -> dict:
    return {"export_dir": out_dir, "native_class": type(n.native).__name__, "pipeline": n.model.head.native_export().pipeline,
            "num_labels": n.native.config.num_labels, "problem_type": n.native.config.problem_type,
            "input_note": n.note, "lora_merged": n.lora_merged}


def export_directory(model_dir: str, out_dir: str, finish: Callable[[dict, str], Any] | None = None) -> dict:
    """Write a saved kotune model (``model_dir``) as a standard transformers directory that
    ``transformers.pipeline(<task>, model=out_dir)`` serves: the native class's config (with
    ``id2label``/``label2id``) and weights, and the model's own tokenizer (:func:`load_native`).
    ``out_dir`` appears whole or not at all, replacing what was there (kotune/core/atomic_dir.py, with
    ``kotune_manifest.json``); ``finish(summary, folder)`` adds files (the model card) before that."""
    n = load_native(model_dir)
    res = export_summary(n, out_dir)
    with written_whole(out_dir, "native-export") as staging:
        n.native.save_pretrained(staging)
        n.tokenizer.save_pretrained(staging)
        if finish is not None:
            finish(res, staging)
    return res


@register_exporter("native")
class NativeExporter(Exporter):
    """``export.format=native`` (the default): :func:`export_directory`, served by ``transformers.pipeline``."""

    default_dir = "hf"
    library = "transformers"

    def export(self, model_dir: str, out_dir: str, options: dict, finish: Callable[[dict, str], Any]) -> dict:
        return export_directory(model_dir, out_dir, finish)

    def usage(self, res: dict, out_dir: str) -> str:
        use = (f"transformers.pipeline(\"{res['pipeline']}\", model=\"{out_dir}\")" if res["pipeline"] else
               f"transformers.{res['native_class']}.from_pretrained(\"{out_dir}\")")
        if res.get("problem_type") == "multi_label_classification":
            use = use[:-1] + ", top_k=None)  (a sigmoid per label; kotune's thresholds: config.kotune_thresholds)"
        return use

    def card_usage(self, res: dict, out_dir: str) -> list[str]:
        from kotune.export.model_card import native_usage

        return native_usage(res)


def input_note(meta: dict) -> str | None:
    """The saved task's word on the exported model's input (``Task.export_note``), if any."""
    task = TASKS.get(str(meta.get("task")), None)
    return task.export_note(meta.get("task_options") or {}) if task is not None else None


def input_fields(meta: dict) -> dict:
    """The saved task's config fields for the exported model (``Task.export_fields``)."""
    task = TASKS.get(str(meta.get("task")), None)
    return task.export_fields(meta.get("task_options") or {}) if task is not None else {}
