"""What ``action=distill`` adds to ``action=train`` (kotune/actions/train.py runs both): a teacher
(a kotune run or an export of one, checked as predict checks it: kotune/distill/teacher.py), a
student built from it (K of its layers, a narrower random encoder, or ``model=`` with the teacher's
vocabulary), the teacher's logits on the training rows cached once (heads/distill/teacher_cache.py),
optionally unlabelled in-domain text the teacher labels, the loss of kotune/distill/trainer.py, and
the teacher named in results.json with its score on the same split."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kotune.loading.built import Built, Encoder
from kotune.core.errors import ConfigError
from kotune.core.log import log
from kotune.distill.teacher import Teacher, file_digest, refuse_layer_copy
from tasks.base import IGNORE


@dataclass
class DistillOptions:
    teacher: str
    student_layers: int | None
    layers: Any
    student_hidden: int | None
    temperature: float
    alpha: float
    hidden_weight: float
    attention_weight: float
    unlabeled_file: str | None
    unlabeled_ratio: float


def options(cfg: DictConfig) -> DistillOptions:
    """``distill.*``, checked: each mistake one line, before anything loads."""
    d = cfg.get("distill") or {}
    if not d.get("teacher"):
        raise ConfigError("action=distill needs distill.teacher=RUN: a kotune run directory (or its model/), or an "
                          "ONNX or native export of one, to learn from")
    layers = d.get("layers", "spread")
    opts = DistillOptions(
        teacher=str(d.teacher), student_layers=None if d.get("student_layers") is None else int(d.student_layers),
        layers=OmegaConf.to_container(layers) if OmegaConf.is_config(layers) else layers,
        student_hidden=None if d.get("student_hidden") is None else int(d.student_hidden),
        temperature=float(d.get("temperature", 2.0)), alpha=float(d.get("alpha", 0.5)),
        hidden_weight=float(d.get("hidden_weight", 0.0)), attention_weight=float(d.get("attention_weight", 0.0)),
        unlabeled_file=d.get("unlabeled_file"),
        unlabeled_ratio=float(d.get("unlabeled_ratio", 1.0)))
    if opts.temperature <= 0:
        raise ConfigError(f"distill.temperature={opts.temperature:g}: a temperature above 0 is needed")
    if not 0 <= opts.alpha <= 1:
        raise ConfigError(f"distill.alpha={opts.alpha:g}: the soft targets' share of the loss, from 0 to 1")
    if min(opts.hidden_weight, opts.attention_weight, opts.unlabeled_ratio) < 0:
        raise ConfigError("distill.hidden_weight, distill.attention_weight and distill.unlabeled_ratio cannot be negative")
    for name in ("hidden_weight", "attention_weight"):
        if getattr(opts, name) > 0 and (opts.student_layers is None or opts.student_hidden is not None):
            raise ConfigError(f"distill.{name}: hidden states and attention are matched layer to layer for a student "
                              "copied from the teacher's layers (distill.student_layers=K, no distill.student_hidden)")
    if str(cfg.mode.name) != "finetune":
        raise ConfigError(f"action=distill with mode={cfg.mode.name}: the student trains whole (mode=finetune); "
                          "the teacher may be any mode")
    return opts


class Distillation:
    """One distillation run: the teacher loaded and checked, the student's encoder side for
    kotune.loading.build, and the steps kotune/actions/train.py calls around training."""

    def __init__(self, cfg: DictConfig):
        self.opts = options(cfg)
        path = self.opts.teacher
        if not os.path.isdir(path):
            raise ConfigError(f"distill.teacher={path}: no such directory (a kotune run directory or its model/, "
                              "or an export)")
        self.teacher = Teacher(cfg, path)  # checked as predict checks it: one line where it is not as saved
        refuse_layer_copy(self.teacher, self.opts.student_layers, self.opts.student_hidden)
        self.layer_map: list[int] | None = None
        self.kind: str | None = None
        self.report: dict = {}

    # ---- the student ------------------------------------------------------------------------
    def encoder_side(self, cfg: DictConfig):
        """kotune.loading.build's encoder side for the student: the teacher's tokenizer and length with a
        student encoder made from the teacher (K layers, or narrower); None: ``model=`` builds it."""
        o = self.opts
        if o.student_layers is None and o.student_hidden is None:
            return None
        from heads.distill.student import choose_layers, copy_layers, narrow_encoder

        depth = int(self.teacher.config.num_hidden_layers)
        if o.student_hidden is not None:
            keep = o.student_layers if o.student_layers is not None else depth
            if keep < 1:
                raise ConfigError(f"distill.student_layers={keep}: keep at least 1 layer")
            student = narrow_encoder(self.teacher.config, o.student_hidden, keep, int(cfg.train.seed))
        else:
            self.layer_map = choose_layers(o.layers, depth, o.student_layers)
            student = copy_layers(self.teacher.model.encoder, self.layer_map)  # a LoRA teacher's with its adapter merged
        t = self.teacher.side

        def side(task, texts) -> Encoder:
            return Encoder(t.tokenizer, student.config, t.max_length, t.token_type_ids, encoder=student)

        return side

    def check(self, b: Built) -> None:
        """The teacher fits the student's run: its task, head and labels, and its vocabulary."""
        meta, where = self.teacher.meta, f"distill.teacher={self.opts.teacher}"
        if b.task.windows is not None:
            raise ConfigError("action=distill with task.long_text=windows: a document is several windows, and the "
                              "teacher's logits are cached one row per example of one sequence; set task.long_text=truncate")
        if meta.get("task") != b.task.name:
            raise ConfigError(f"{where} was trained for task={meta.get('task')}, this run is task={b.task.name}: "
                              "a teacher of the same task is needed (leave task= out to take the teacher's)")
        if self.teacher.model.head_description() != b.model.head_description():
            raise ConfigError(f"{where} has a '{self.teacher.model.head_description()}' head, the student a "
                              f"'{b.model.head_description()}' one: give the task options the teacher was trained with")
        if list(meta.get("labels") or []) != list(b.task.labels or []):
            raise ConfigError(f"{where} predicts the labels {meta.get('labels')}, this run's training data has "
                              f"{b.task.labels}: distil on data with the teacher's label set")
        if b.tokenizer.get_vocab() != self.teacher.side.tokenizer.get_vocab():
            raise ConfigError(f"{where}: the student's tokenizer (model={b.model.meta.get('model')}) differs from "
                              "the teacher's; the soft targets are per token: use a model with the teacher's "
                              "vocabulary, or distill.student_layers=K / distill.student_hidden=H")
        from heads.distill.loss import distill_kind

        self.kind = distill_kind(b.model.head)
        if self.kind is None:
            raise ConfigError(f"action=distill: the {b.model.head_description()} head has no soft targets kotune "
                              "distils (sequence, pair, multi-label, regression, relation, token and span heads do)")

    def prepare(self, cfg: DictConfig, b: Built) -> None:
        """After the build: checks, the teacher's head copied into a layer-copied student, the
        unlabelled rows joined, the teacher's logits on every training row (cached)."""
        self.check(b)
        if self.opts.student_hidden is None and self.opts.student_layers is not None:
            b.model.head.load_state_dict(self.teacher.model.head.state_dict())  # DistilBERT: the teacher's init
        train = b.inputs["train"]
        unlabeled = self.unlabeled_rows(cfg, b, len(train)) if self.opts.unlabeled_file else None
        if unlabeled is not None:
            import datasets

            train = datasets.concatenate_datasets([train, unlabeled.cast(train.features)])
        from heads.distill.teacher_cache import TeacherCacheSettings, cached_teacher_logits

        if not cfg.get("cache_dir"):
            raise ConfigError("action=distill keeps the teacher's logits in cache_dir: set cache_dir=DIR")
        settings = TeacherCacheSettings(str(cfg.cache_dir), "float32", batch_size=int(cfg.train.eval_batch_size))
        inputs, cache = cached_teacher_logits(self.teacher.logits_source(), b.model.head, self.kind, {"train": train},
                                              settings, b.task.name)
        b.inputs["train"] = inputs["train"]
        self.report.update(cache=cache, n_unlabeled=0 if unlabeled is None else len(unlabeled))

    def unlabeled_rows(self, cfg: DictConfig, b: Built, n_labelled: int):
        """``distill.unlabeled_file``: ``unlabeled_ratio`` × the labelled rows (seeded sample; all the
        file has when fewer), encoded as the training rows and labelled -100 (the teacher's logits
        are their only target)."""
        task, path = b.task, str(self.opts.unlabeled_file)
        if self.kind != "classes" or task.pair or task.windows is not None:
            raise ConfigError(f"distill.unlabeled_file: unlabelled text is read for single-text classification "
                              f"(one label per text); task={task.name} has a {b.model.head_description()} head"
                              + (" on text pairs" if task.pair else ""))
        if not os.path.exists(path):
            raise ConfigError(f"distill.unlabeled_file={path}: no such file")
        if os.path.splitext(path)[1].lower() in (".txt", ""):
            from tasks.embed import read_texts

            name = os.path.basename(path)
            examples = [{"id": f"{name}:{where}", "text": text} for where, text in read_texts(path)]
        else:
            examples = task.read_file(path, labelled=False)
        wanted = min(len(examples), int(round(self.opts.unlabeled_ratio * n_labelled)))
        if wanted < len(examples):
            examples = random.Random(int(cfg.train.seed)).sample(examples, wanted)
        log(f"distill.unlabeled_file: {len(examples):,} unlabelled rows for {n_labelled:,} labelled "
            f"(ratio {self.opts.unlabeled_ratio:g})")
        from tasks.encode_cache import encode_cached

        features = encode_cached(task, examples, b.tokenizer, b.settings, cfg.cache_dir)
        features = features.add_column("labels", [IGNORE] * len(features))
        return features.select_columns(task.model_columns(features))

    def loss(self):
        from kotune.distill.trainer import DistillLoss

        o = self.opts
        layered = o.hidden_weight > 0 or o.attention_weight > 0
        return DistillLoss(self.kind, o.temperature, o.alpha, o.hidden_weight, o.attention_weight,
                           self.teacher.model.encoder if layered else None, self.layer_map or [])

    # ---- results.json -------------------------------------------------------------------------
    def results(self, cfg: DictConfig, b: Built, split: str) -> dict:
        """results.json ``distill``: the teacher (path, digest, size, its score on ``split``), the
        student's layer map, the loss settings, the logit cache."""
        from kotune.loading.reconcile import task_for_checkpoint
        from kotune.inference.model_runtimes import batch_predictor
        from kotune.inference.predict import predict_rows
        from tasks import build_task

        teacher = self.teacher
        predictor = batch_predictor(cfg, teacher.model, b.collator)  # predict.device, precision, batch_tokens
        # decided as the teacher decides (multi-label: its own tuned thresholds), not as the student
        task = task_for_checkpoint(build_task(cfg.task), teacher.meta | {"head": teacher.model.head_description()},
                                   self.opts.teacher)
        outputs, speed = predict_rows(predictor, task, b.features[split], b.inputs[split], b.splits[split].examples)
        o = self.opts
        return {"teacher": {"path": o.teacher, "source": teacher.describe(), "model_dir": teacher.folder,
                            "digest": file_digest(teacher.folder), "mode": teacher.mode,
                            "layers": int(teacher.config.num_hidden_layers), "params": teacher.params(),
                            "metrics": task.score(outputs, b.splits[split].examples) if split == "validation" else {},
                            "eval_samples_per_second": speed.get("eval_samples_per_second")},
                "student": {"layers": int(b.model.encoder.config.num_hidden_layers),
                            "hidden": int(b.model.encoder.config.hidden_size),
                            "params": b.model.param_counts()["total_params"],
                            "init": "teacher layers" if self.layer_map is not None else
                            "random (narrower)" if o.student_hidden is not None else f"model={cfg.model.name}"},
                "layer_map": self.layer_map, "kind": self.kind, "temperature": o.temperature, "alpha": o.alpha,
                "hidden_weight": o.hidden_weight, "attention_weight": o.attention_weight, "unlabeled_file": o.unlabeled_file,
                "unlabeled_ratio": o.unlabeled_ratio if o.unlabeled_file else None, **self.report}
