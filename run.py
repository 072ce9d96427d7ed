"""kotune's command line: ``python run.py task=nli model=klue`` (Hydra; see conf/).

compose config → read task data → tokenizer + encoder + head → transformers.Trainer → decode →
KLUE metrics → ``results.json`` (atomic) in the run directory, plus the model and predictions.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import json
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import hydra
from omegaconf import DictConfig, OmegaConf

from tasks import build_task
from tasks.base import EncodeSettings, Split, Task, encode_cached, fingerprint, load_splits
from tasks.errors import ConfigError, KotuneError
from tasks.io import write_json_atomic, write_jsonl_atomic
from tasks.log import log

def default_learning_rate(frozen: bool, init: str, recipe: float) -> float:
    """``train.learning_rate``'s default (conf/train/default.yaml): a head's rate when only a head
    trains (``mode=frozen``), a rate at which a randomly initialised encoder leaves the majority
    class (``model.init=random``; 5e-5 does not: measured on hate speech, 34 % vs 57.5 % at 5e-4),
    else the task's recipe."""
    if frozen:
        return 1.0e-3
    if init == "random":
        return 5.0e-4
    return float(recipe)


OmegaConf.register_new_resolver("kotune_lr", default_learning_rate, replace=True)
# the scalar mix's default rate: never slower than the rest, at least 1e-3 (at fine-tuning's 5e-5 its
# weights barely leave uniform: 0.086 vs 0.077 after 2,344 NLI steps; 0.42 at 1e-3)
OmegaConf.register_new_resolver("kotune_mix_lr", lambda lr: max(float(lr), 1.0e-3), replace=True)
CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
GROUPS = ("task", "model", "mode", "train", "data")
UNK_WARN_RATE = 0.05


# ---- building blocks -----------------------------------------------------------------------
def requested_max_length(cfg: DictConfig) -> int:
    """``task.max_length`` where the task sets one (QA windows: 384), else ``train.max_length``."""
    return int(cfg.task.get("max_length") or cfg.train.max_length)


def resolve_max_length(requested: int, encoder_config) -> int:
    from heads.encoder import position_limit

    limit = position_limit(encoder_config)
    if requested > limit:
        log(f"max_length={requested} exceeds the model's {limit} positions: using {limit}")
        return limit
    return requested


def warn_unknown_hangul(tokenizer, texts) -> float:
    from heads.encoder import unk_rate

    rate = unk_rate(tokenizer, texts)
    if rate > UNK_WARN_RATE:
        log(f"WARNING: the tokenizer maps {rate:.0%} of Hangul syllables to [UNK]. A cased Korean "
            "vocabulary loaded with lowercasing/accent stripping decomposes Hangul into jamo: set "
            "model.tokenizer_kwargs.do_lower_case=false")
    return rate


def make_collator(tokenizer, cfg: DictConfig):
    from tasks.collate import DynamicPaddingCollator

    return DynamicPaddingCollator(tokenizer.pad_token_id, pad_multiple(cfg.train))


def pad_multiple(t: DictConfig) -> int:
    """``train.pad_to_multiple_of``; ``auto``: 8 on CUDA (tensor-core tiles), 1 on CPU, where
    rounding up buys nothing and costs ~8 % of the tokens of short KLUE sentences."""
    import torch

    value = t.get("pad_to_multiple_of", "auto")
    if value in (None, "auto"):
        return 8 if torch.cuda.is_available() else 1
    return max(1, int(value))


def dataloader_workers(t: DictConfig) -> int:
    """``train.dataloader_num_workers``; ``auto``: 2 per process on CUDA (collation overlaps the
    GPU step), 0 on CPU, where a worker would take a core from the matmuls."""
    import torch

    value = t.get("dataloader_num_workers", "auto")
    if value in (None, "auto"):
        return min(2, os.cpu_count() or 1) if torch.cuda.is_available() else 0
    return int(value)


def cpu_only() -> bool:
    """No accelerator: accelerate then needs ``cpu=True`` to run gloo DDP under torchrun (else
    every process trains alone on all the data) and to autocast bf16 on the CPU."""
    import torch

    return not torch.cuda.is_available() and not torch.backends.mps.is_available()


@contextlib.contextmanager
def local_rank_zero_first():
    """Under torchrun: each machine's rank 0 builds first (trains the tokenizer, encodes, fills
    the caches) while its other ranks wait, then reads what it wrote: no two processes write one
    cache entry, and the data is tokenized once per machine, not once per process."""
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        yield
        return
    from accelerate import PartialState

    with PartialState(cpu=cpu_only()).local_main_process_first():
        yield


def training_arguments(cfg: DictConfig, run_dir: str, label_names: list[str], do_eval: bool,
                       steps_per_epoch: int | None = None, main_metric: str | None = None,
                       greater_is_better: bool = True):
    """``cfg.train`` → ``TrainingArguments``. ``train.select_best`` (needs ``do_eval``) evaluates
    ``train.evals_per_epoch`` times per epoch and keeps the checkpoint with the best
    ``main_metric``; checkpoints otherwise follow ``train.save_strategy``."""
    import torch
    from transformers import TrainingArguments

    t = cfg.train
    precision = str(t.precision)
    if precision not in ("fp32", "bf16", "fp16"):
        raise ConfigError(f"train.precision must be fp32, bf16 or fp16, got '{precision}'")
    cuda = torch.cuda.is_available()
    if precision == "fp16" and not cuda:
        raise ConfigError("train.precision=fp16 needs a CUDA GPU (autocast with a loss scaler); "
                          "on CPU use bf16 or fp32")
    workers = dataloader_workers(t)
    eval_strategy = str(t.eval_strategy) if do_eval else "no"
    save_strategy, save_steps, eval_steps, best = str(t.save_strategy), int(t.get("save_steps", 500)), None, {}
    if t.get("select_best"):
        if not do_eval:
            raise ConfigError("train.select_best=true needs a validation split to select on")
        evals = max(1, int(t.get("evals_per_epoch", 4)))
        eval_steps = max(1, (steps_per_epoch or 1) // evals)
        eval_strategy = save_strategy = "steps"
        save_steps = eval_steps
        best = {"load_best_model_at_end": True, "metric_for_best_model": main_metric,
                "greater_is_better": greater_is_better}
    return TrainingArguments(
        output_dir=os.path.join(run_dir, "checkpoints"),
        learning_rate=float(t.learning_rate),
        num_train_epochs=float(t.epochs),
        max_steps=int(t.max_steps),
        per_device_train_batch_size=int(t.batch_size),
        per_device_eval_batch_size=int(t.eval_batch_size),
        gradient_accumulation_steps=int(t.grad_accum),
        warmup_steps=float(t.warmup_ratio),  # < 1: a fraction of the total steps
        weight_decay=float(t.weight_decay),
        seed=int(t.seed),
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        torch_compile=bool(t.get("compile", False)),
        eval_strategy=eval_strategy,
        eval_steps=eval_steps,
        save_strategy=save_strategy,
        save_steps=save_steps,
        save_total_limit=t.get("save_total_limit"),
        **best,
        logging_steps=int(t.logging_steps),
        report_to="none",
        remove_unused_columns=False,  # features carry only model inputs; ids stay outside
        label_names=list(label_names),
        train_sampling_strategy="group_by_length" if t.group_by_length else "random",
        use_cpu=cpu_only(),
        dataloader_num_workers=workers,
        dataloader_persistent_workers=workers > 0,  # not re-forked for every evaluation
        dataloader_pin_memory=cuda,
        ddp_find_unused_parameters=bool(cfg.mode.frozen) or None,
        disable_tqdm=not sys.stderr.isatty() and os.environ.get("KOTUNE_PROGRESS", "1") == "0",
    )


# ---- loading: one path for every action ------------------------------------------------------
@dataclass
class Encoder:
    """What an action needs to encode text for a model: the tokenizer, the encoder's config and
    length, and either a trained model (``checkpoint=``) or a fresh encoder (or neither: weights
    not needed, as for the ceiling)."""

    tokenizer: Any
    config: Any
    max_length: int
    token_type_ids: bool
    model: Any = None      # KotuneModel from a checkpoint
    encoder: Any = None    # a fresh encoder (pretrained or random) from cfg.model


def load_encoder_side(cfg: DictConfig, task: Task | None, texts: Iterable[str] | None,
                      weights: bool = True) -> Encoder:
    """Tokenizer + encoder from ``checkpoint=`` (everything as saved) or from ``cfg.model``."""
    from heads.encoder import build_config, load_encoder, load_tokenizer, position_limit, uses_token_type_ids

    if cfg.get("checkpoint"):
        from transformers import AutoTokenizer

        from heads.model import KotuneModel

        model_dir = checkpoint_model_dir(cfg.checkpoint)
        model = KotuneModel.load(model_dir)
        requested = min(requested_max_length(cfg), position_limit(model.encoder.config))
        if task is not None and model.meta.get("max_length") and requested != model.meta["max_length"]:
            log(f"warning: checkpoint {cfg.checkpoint} was trained with max_length={model.meta['max_length']}; "
                f"using it (requested {requested})")
        return Encoder(AutoTokenizer.from_pretrained(model_dir), model.encoder.config,
                       int(model.meta.get("max_length", requested_max_length(cfg))),
                       bool(model.meta.get("token_type_ids", uses_token_type_ids(model.encoder.config))),
                       model=model, encoder=model.encoder)
    log("loading tokenizer")
    texts = list(texts) if texts is not None else None
    tokenizer = load_tokenizer(cfg.model, texts=texts, cache_dir=cfg.cache_dir)
    if texts:
        warn_unknown_hangul(tokenizer, texts)
    encoder = None
    if weights:
        log(f"building encoder ({cfg.model.init}: {cfg.model.name_or_path or cfg.model.name})")
        # a sequence head starts from a pretrained BERT's pooler (heads/native.py): keep it for them
        encoder = load_encoder(cfg.model, vocab_size=len(tokenizer), seed=int(cfg.train.seed),
                               head_kind=task.head if task is not None else None)
    config = encoder.config if encoder is not None else build_config(cfg.model, len(tokenizer))
    return Encoder(tokenizer, config, resolve_max_length(requested_max_length(cfg), config),
                   uses_token_type_ids(config), encoder=encoder)


def task_for_checkpoint(task: Task, meta: dict, checkpoint: str) -> Task:
    """The requested task, with the options the checkpoint's model depends on taken from what was
    saved (``Task.saved_options``): a different head is an error, an encoding difference a warning
    (the saved value is used). Another task that fits (an NLI model on a text_pair file) is fine."""
    saved_head = meta.get("head")
    if saved_head and saved_head != task.head:  # e.g. QA's task.decode=char needs the span_char head
        raise ConfigError(f"checkpoint {checkpoint} has a '{saved_head}' head; task {task.name} with these "
                          f"options needs '{task.head}' (use the task options it was trained with)")
    saved = meta.get("task_options") or {}
    changes = {}
    for option, policy in task.saved_options.items():
        if option not in saved or saved[option] == task.cfg.get(option):
            continue
        if policy == "error":
            raise ConfigError(f"task.{option}={task.cfg.get(option)}: checkpoint {checkpoint} was trained with "
                              f"task.{option}={saved[option]}, which gives a different model")
        log(f"warning: checkpoint {checkpoint} was trained with task.{option}={saved[option]}; using it "
            f"(requested {task.cfg.get(option)})")
        changes[option] = saved[option]
    if changes:
        cfg = OmegaConf.to_container(task.cfg, resolve=True)
        task = type(task)(OmegaConf.create({**cfg, **changes}))
    task.labels = meta.get("labels", task.labels)
    return task


class Built:
    """Everything one run needs: task, splits, tokenizer, model, features."""

    def __init__(self, task: Task, splits: dict[str, Split], tokenizer, model, features: dict, max_length: int):
        self.task, self.splits, self.tokenizer, self.model = task, splits, tokenizer, model
        self.features, self.max_length = features, max_length
        # what Trainer reads per split: the model columns, or with them cached frozen states
        self.inputs = {s: f.select_columns(task.model_columns(f)) for s, f in features.items()}
        self.cache_report: dict = {}


def build(cfg: DictConfig, need: tuple[str, ...]) -> Built:
    """Task, splits, encoder side (fresh or ``checkpoint=``), the model and encoded features."""
    from heads.model import KotuneModel

    seed_everything(int(cfg.train.seed))
    task = build_task(cfg.task)
    if cfg.get("checkpoint"):
        loaded = load_encoder_side(cfg, task, None)
        task = task_for_checkpoint(task, loaded.model.meta | {"head": loaded.model.head_kind}, cfg.checkpoint)
        splits = load_splits(task, cfg.data, need, int(cfg.train.seed))
        model = loaded.model
    else:
        splits = load_splits(task, cfg.data, need, int(cfg.train.seed))
        if "train" in splits:
            task.fit_labels(splits["train"].examples)
            if "validation" in splits:
                task.check_labels(splits["validation"].examples, splits["validation"].where)
        first = splits.get("train") or next(iter(splits.values()))
        loaded = load_encoder_side(cfg, task, task.training_texts(first.examples))
        head_kwargs = dict(task.head_kwargs(), dropout=cfg.train.get("head_dropout"))  # None: the architecture's
        meta = {"task": task.name, "labels": task.labels, "max_length": loaded.max_length,
                "token_type_ids": loaded.token_type_ids, "model": cfg.model.name,
                "task_options": {k: task.cfg.get(k) for k in task.saved_options}}
        model = KotuneModel(loaded.encoder, task.head, head_kwargs, frozen=bool(cfg.mode.frozen), meta=meta,
                            layers=cfg.mode.get("layers", "last"), pooling=cfg.mode.get("pooling"))
    settings = EncodeSettings(max_length=loaded.max_length, token_type_ids=loaded.token_type_ids)
    features = {}
    for split, data in splits.items():
        log(f"encoding {split}: {len(data.examples)} examples")
        features[split] = encode_cached(task, data.examples, loaded.tokenizer, settings, cfg.cache_dir)
    built = Built(task, splits, loaded.tokenizer, model, features, loaded.max_length)
    if cfg.mode.get("cache") and (model.frozen or not cfg.get("checkpoint")):
        use_frozen_cache(cfg, built)
    return built


def seed_everything(seed: int) -> None:
    """Before anything is built (heads, random encoders, dropout): two runs of one config are
    identical, pretrained encoder or not, as HF's examples call ``set_seed`` first."""
    from transformers import set_seed

    set_seed(seed)


def use_frozen_cache(cfg: DictConfig, b: Built) -> None:
    """``mode.cache``: encode each split once with the frozen encoder; Trainer then reads the
    stored states (heads/feature_cache.py)."""
    from heads.feature_cache import CacheSettings, cached_inputs
    from tasks.base import tokenizer_fingerprint

    if not cfg.get("cache_dir"):
        raise ConfigError("mode.cache=true needs cache_dir=DIR (where frozen features are stored)")
    settings = CacheSettings(str(cfg.cache_dir), str(cfg.mode.get("cache_dtype", "float16")),
                             float(cfg.mode.get("cache_max_gb", 20)), int(cfg.train.eval_batch_size))
    identity = {"model": b.model.meta.get("model"), "tokenizer": tokenizer_fingerprint(b.tokenizer),
                "max_length": b.max_length}
    b.inputs, b.cache_report = cached_inputs(b.model, b.inputs, identity, settings, name=b.task.name)


def checkpoint_model_dir(path: str) -> str:
    for candidate in (path, os.path.join(path, "model")):
        if os.path.exists(os.path.join(candidate, "kotune.json")):
            return candidate
    raise KotuneError(f"checkpoint={path}: no saved model there (expected {path}/model/kotune.json)")


# ---- training ----------------------------------------------------------------------------------
COMPLETE = "kotune_complete.json"  # written last into a checkpoint: its absence marks a cut-short save


def trainer_class():
    import safetensors.torch
    from torch.utils.data import SequentialSampler
    from transformers import PreTrainedModel, Trainer

    class KotuneTrainer(Trainer):
        """Trainer with kotune's evaluation order, optimizer groups and checkpoints.

        - Evaluation keeps input order: transformers 5 reuses the *training* length-grouped
          sampler (random megabatches) for evaluation and prediction when
          ``train_sampling_strategy="group_by_length"``, which permutes predictions.
        - The scalar mix gets its own learning rate (``train.mix_learning_rate``).
        - Checkpoints hold only what trains (a frozen encoder is not saved again), end with a
          completion marker carrying the running loss sum (exact ``train_loss`` after a resume),
          and load with the encoder's keys allowed missing."""

        mix_learning_rate: float | None = None

        def _get_eval_sampler(self, eval_dataset):
            if eval_dataset is None or self.args.world_size > 1:
                return None  # distributed: accelerate shards sequentially and gathers in order
            return SequentialSampler(eval_dataset)

        def create_optimizer(self, model=None):
            model = self.model if model is None else model
            mix = [p for n, p in model.named_parameters() if n.startswith("mixer.") and p.requires_grad]
            if self.optimizer is not None or not mix or self.mix_learning_rate is None:
                return super().create_optimizer(model)
            decay = set(self.get_decay_parameter_names(model))
            rest = [(n, p) for n, p in model.named_parameters() if p.requires_grad and not n.startswith("mixer.")]
            groups = [{"params": [p for n, p in rest if n in decay], "weight_decay": self.args.weight_decay},
                      {"params": [p for n, p in rest if n not in decay], "weight_decay": 0.0},
                      {"params": mix, "weight_decay": 0.0, "lr": float(self.mix_learning_rate)}]
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, model)
            self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
            return self.optimizer

        def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
            if state_dict is None and getattr(self.model, "frozen", False):
                state_dict = {k: v for k, v in self.model.state_dict().items() if not k.startswith("encoder.")}
            super()._save(output_dir, state_dict=state_dict)

        def _save_checkpoint(self, model, trial) -> None:
            super()._save_checkpoint(model, trial)
            if self.args.should_save:
                folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
                loss_sum = self._total_loss_scalar + float(self._tr_loss.item())
                write_json_atomic(os.path.join(folder, COMPLETE),
                                  {"step": self.state.global_step, "loss_sum": loss_sum,
                                   "config": getattr(self, "kotune_config", None)})

        def _load_state(self, directory: str) -> None:
            state = safetensors.torch.load_file(os.path.join(directory, "model.safetensors"))
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            allowed = getattr(self.model, "frozen", False)
            if unexpected or any(not (allowed and k.startswith("encoder.")) for k in missing):
                raise KotuneError(f"{directory}: checkpoint does not fit this model "
                                  f"(missing {missing[:3]}, unexpected {unexpected[:3]})")

        def _load_from_checkpoint(self, resume_from_checkpoint, model=None) -> None:
            if isinstance(self.model, PreTrainedModel):  # a whole HF model (pretrain): tied weights and all
                return super()._load_from_checkpoint(resume_from_checkpoint, model)
            self._load_state(resume_from_checkpoint)

        def _load_best_model(self) -> None:
            if isinstance(self.model, PreTrainedModel):
                return super()._load_best_model()
            self._load_state(self.state.best_model_checkpoint)

    return KotuneTrainer


def make_trainer(cfg: DictConfig, b: Built, run_dir: str):
    from tasks.collate import in_order, length_order, restore_order

    Trainer = trainer_class()
    task = b.task
    val = b.features.get("validation")
    train = b.features.get("train")
    do_eval = val is not None and train is not None and (cfg.train.eval_strategy != "no" or cfg.train.get("select_best"))
    val_order = length_order(val) if do_eval else None  # sorted batches, as in predict()

    def compute_metrics(p) -> dict:
        predictions = restore_order(p.predictions, val_order)
        return task.score(task.decode(predictions, val, b.splits["validation"].examples),
                          b.splits["validation"].examples)

    steps_per_epoch = None
    if train is not None:
        world = int(os.environ.get("WORLD_SIZE", 1))
        steps_per_epoch = max(1, math.ceil(len(train) / (int(cfg.train.batch_size) * world)) // int(cfg.train.grad_accum))
    trainer = Trainer(
        model=b.model,
        args=training_arguments(cfg, run_dir, list(b.model.head.label_fields), do_eval, steps_per_epoch,
                                task.main_metric, task.greater_is_better),
        train_dataset=b.inputs.get("train"),
        eval_dataset=in_order(b.inputs["validation"], val_order) if do_eval else None,
        data_collator=make_collator(b.tokenizer, cfg),
        compute_metrics=compute_metrics if do_eval else None,
    )
    trainer.mix_learning_rate = cfg.train.get("mix_learning_rate")
    trainer.kotune_config = resume_identity(cfg)
    return trainer


# ---- resume ------------------------------------------------------------------------------------
# keys that do not change what training computes: another value still resumes
RESUME_IGNORES = ("train.resume", "train.logging_steps", "train.save_strategy", "train.save_steps",
                  "train.save_total_limit", "train.eval_batch_size", "train.dataloader_num_workers", "cache_dir",
                  "save_model", "save_predictions", "keep_going_on_bugs")


def resume_identity(cfg: DictConfig) -> dict:
    """The resolved config that a checkpoint must match to be resumed from, flattened."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    flat = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            flat[prefix[:-1]] = node

    walk(plain, "")
    return {k: v for k, v in flat.items() if not k.startswith(RESUME_IGNORES)}


def find_resume_checkpoint(cfg: DictConfig, run_dir: str) -> tuple[str | None, dict]:
    """``train.resume``: auto → the newest complete ``checkpoints/checkpoint-N`` of this run
    directory (a save cut short by a kill is skipped with a warning); never; or a PATH."""
    mode = str(cfg.train.get("resume", "auto"))
    if mode == "never":
        return None, {}
    if mode != "auto":
        if not os.path.exists(os.path.join(mode, COMPLETE)):
            raise ConfigError(f"train.resume={mode}: not a complete kotune checkpoint (no {COMPLETE})")
        candidates = [mode]
    else:
        root = os.path.join(run_dir, "checkpoints")
        names = os.listdir(root) if os.path.isdir(root) else []
        steps = sorted((int(n.split("-")[1]) for n in names if n.startswith("checkpoint-") and n.split("-")[1].isdigit()),
                       reverse=True)
        candidates = [os.path.join(root, f"checkpoint-{s}") for s in steps]
    for path in candidates:
        try:
            with open(os.path.join(path, COMPLETE), encoding="utf-8") as f:
                marker = json.load(f)
        except (OSError, ValueError):
            log(f"warning: {path} is incomplete (cut short while saving?): skipped")
            continue
        saved, now = marker.get("config") or {}, resume_identity(cfg)
        differ = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        if differ:
            shown = ", ".join(f"{k} ({saved.get(k)!r} → {now.get(k)!r})" for k in differ[:5])
            raise ConfigError(f"cannot resume from {path}: the config differs in {shown}"
                              f"{' …' if len(differ) > 5 else ''}; use train.resume=never to start over "
                              "(or another hydra.run.dir)")
        return path, marker
    return None, {}


def train_resumable(trainer, cfg: DictConfig, run_dir: str) -> tuple[dict, float | None, int | None]:
    """``trainer.train()``, continued from the run dir's newest complete checkpoint (``train.resume``):
    returns Trainer's metrics, the train loss over *all* steps (Trainer's own averages only the steps
    after a resume) and the step resumed from."""
    resume_from, marker = find_resume_checkpoint(cfg, run_dir)
    total = None
    if resume_from:
        with open(os.path.join(resume_from, "trainer_state.json"), encoding="utf-8") as f:
            total = json.load(f).get("max_steps")
        log(f"resume: from {os.path.basename(resume_from)} of {total}")
    if resume_from and total and int(marker["step"]) >= int(total):
        # training had finished: Trainer would run one step more than asked when resumed there
        trainer._load_from_checkpoint(resume_from)
        trainer.state.global_step = int(marker["step"])
        train_metrics, train_loss = {}, marker["loss_sum"] / int(marker["step"])
    else:
        train_metrics = trainer.train(resume_from_checkpoint=resume_from).metrics
        train_loss = train_metrics.get("train_loss")
        if resume_from and train_loss is not None:
            done = int(marker["step"])
            train_loss = (train_loss * (trainer.state.global_step - done) + marker["loss_sum"]) / trainer.state.global_step
    if not math.isfinite(train_loss if train_loss is not None else 0.0):
        raise KotuneError(f"training diverged: loss is {train_loss}")
    return train_metrics, train_loss, int(marker["step"]) if resume_from else None


# ---- prediction and reports --------------------------------------------------------------------
def predict(trainer, b: Built, split: str) -> tuple[list, dict]:
    """Predict in batches sorted by length (little padding), then restore the input order:
    decoders read features row by row (QA windows per example), so they see the original order."""
    from tasks.collate import in_order, length_order, restore_order

    features = b.features[split]
    order = length_order(features)  # b.inputs[split] holds the same rows
    out = trainer.predict(in_order(b.inputs[split], order))
    outputs = b.task.decode(restore_order(out.predictions, order), features, b.splits[split].examples)
    speed = {"eval_samples_per_second": out.metrics.get("test_samples_per_second")}
    return outputs, speed


def write_predictions(run_dir: str, b: Built, split: str, outputs: list) -> str:
    """predictions.jsonl in input order, plus the task's own files (QA: predictions.json)."""
    path = os.path.join(run_dir, "predictions.jsonl")
    write_jsonl_atomic(path, b.task.prediction_records(outputs, b.splits[split].examples))
    b.task.write_outputs(run_dir, outputs, b.splits[split].examples)
    return path


REPORT_KEYS = ("n_train", "n_eval", "n_predict", "trainable_params", "total_params", "head_params", "mix_params",
               "max_length", "layers", "indices", "scalar_mix", "pooling", "cache", "encode_s",
               "head_train_s", "train_samples_per_second", "train_loss", "eval_samples_per_second",
               "checkpoint", "resumed_from", "best_step", "metrics_last", "predictions_file", "metrics", "data")


def run_report(cfg: DictConfig, run_dir: str, b: Built, split: str, outputs: list, speed: dict, **extra) -> dict:
    """The one results.json body of train, eval and predict: every key always present (None where
    it does not apply), so tables can be built over any mix of runs."""
    log(b.model.mixer.describe_mix())
    scored = split == "validation"
    report = dict.fromkeys(REPORT_KEYS)
    report.update(
        {f"n_{'eval' if s == 'validation' else s}": len(d.examples) for s, d in b.splits.items()},
        **b.model.param_counts(), **b.model.mixer.report(), max_length=b.max_length,
        pooling=getattr(b.model.head, "pooling", None), cache=b.cache_report or {"status": "off"},
        encode_s=b.cache_report.get("encode_s"), **speed, checkpoint=cfg.get("checkpoint"),
        metrics=b.task.score(outputs, b.splits[split].examples) if scored else {},
        data={s: d.source for s, d in b.splits.items()})
    if cfg.save_predictions or split == "predict":
        if int(os.environ.get("RANK", 0)) == 0:
            report["predictions_file"] = write_predictions(run_dir, b, split, outputs)
    report.update(extra)
    unknown = set(report) - set(REPORT_KEYS)
    assert not unknown, f"results keys outside REPORT_KEYS: {unknown}"  # one schema for every action
    return report


# ---- actions -------------------------------------------------------------------------------
def action_train(cfg: DictConfig, run_dir: str) -> dict:
    with local_rank_zero_first():
        b = build(cfg, ("train", "validation"))
    trainer = make_trainer(cfg, b, run_dir)
    log(f"training: {len(b.splits['train'].examples)} examples, "
        f"{b.model.param_counts()['trainable_params']:,} trainable parameters")
    train_metrics, train_loss, resumed_from = train_resumable(trainer, cfg, run_dir)
    best = {}
    if cfg.train.get("select_best"):
        last = [h for h in trainer.state.log_history if f"eval_{b.task.main_metric}" in h]
        best = {"best_step": trainer.state.best_global_step,
                "metrics_last": {k[5:]: v for k, v in last[-1].items()
                                 if k.startswith("eval_") and isinstance(v, (int, float))
                                 and k[5:] not in ("loss", "runtime", "samples_per_second", "steps_per_second")}
                if last else None}
    log("evaluating")
    outputs, speed = predict(trainer, b, "validation")
    res = run_report(cfg, run_dir, b, "validation", outputs, speed, train_loss=train_loss,
                     train_samples_per_second=train_metrics.get("train_samples_per_second"),
                     head_train_s=train_metrics.get("train_runtime"),
                     resumed_from=resumed_from, **best)
    if trainer.is_world_process_zero() and cfg.save_model:
        b.model.save(os.path.join(run_dir, "model"), b.tokenizer)
    return res


def predict_from_checkpoint(cfg: DictConfig, run_dir: str, split: str, usage: str) -> dict:
    """Reload ``checkpoint=`` and predict one split (action=eval and action=predict)."""
    if not cfg.get("checkpoint"):
        raise ConfigError(usage)
    with local_rank_zero_first():
        b = build(cfg, (split,))
    outputs, speed = predict(make_trainer(cfg, b, run_dir), b, split)
    return run_report(cfg, run_dir, b, split, outputs, speed)


def action_eval(cfg: DictConfig, run_dir: str) -> dict:
    return predict_from_checkpoint(
        cfg, run_dir, "validation", "action=eval needs checkpoint=RUN_DIR (a directory written by action=train)")


def action_predict(cfg: DictConfig, run_dir: str) -> dict:
    res = predict_from_checkpoint(
        cfg, run_dir, "predict", "action=predict needs checkpoint=RUN_DIR and data.predict_file=FILE")
    log(f"wrote {res['n_predict']} predictions to {res['predictions_file']}")
    return res


def action_ceiling(cfg: DictConfig, run_dir: str) -> dict:
    """Gold labels through the exact encoding and decoding: the best score this tokenizer and
    these settings allow. Needs a tokenizer (and the model's config for its position limit),
    no weights."""
    task = build_task(cfg.task)
    splits = load_splits(task, cfg.data, ("validation",), int(cfg.train.seed))
    examples = splits["validation"].examples
    loaded = load_encoder_side(cfg, task, task.training_texts(examples), weights=False)
    settings = EncodeSettings(max_length=loaded.max_length, token_type_ids=loaded.token_type_ids)
    features = encode_cached(task, examples, loaded.tokenizer, settings, cfg.cache_dir)
    metrics, report = task.ceiling(features, examples)
    for line in report.get("lines", []):
        log(line)
    return {"n_eval": len(examples), "max_length": settings.max_length, "metrics": metrics,
            "ceiling": {k: v for k, v in report.items() if k != "lines"},
            "data": {s: d.source for s, d in splits.items()}}


def action_embed(cfg: DictConfig, run_dir: str) -> dict:
    """Contextual embeddings of ``embed.input`` with ``mode.layers`` and ``mode.pooling``, from a
    checkpoint (its trained scalar mix when the layer choice matches) or the configured encoder;
    ``embed.target`` adds that word's vectors in context, layer by layer (tasks/embed.py for the
    text side, heads/embed.py for the vectors)."""
    from heads.embed import pooled_vectors, token_vectors_by_layer
    from heads.layers import LayerMixer, check_pooling, parse_layers
    from tasks import embed

    if not cfg.embed.get("input"):
        raise ConfigError("action=embed needs embed.input=FILE (one text per line, or CSV/JSONL with embed.column)")
    rows = embed.read_texts(str(cfg.embed.input), str(cfg.embed.column), cfg.embed.get("format"),
                            quoting=cfg.data.get("quoting", "auto"))
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
    vectors = pooled_vectors(encoder, mixer, features, pooling, batch_size=int(cfg.train.eval_batch_size))
    lengths = [len(ids) for ids in features["input_ids"]]
    res = {"n_texts": len(texts), "dim": int(vectors.shape[1]), "encoder": str(source), **mixer.report(),
           "pooling": pooling, "max_length": max_length, "n_truncated": sum(truncated),
           "embed_s": round(time.time() - started, 3), "metrics": {},
           **embed.write_embeddings(run_dir, vectors, rows, str(cfg.embed.input), lengths, truncated)}
    log(f"wrote {vectors.shape[0]} × {vectors.shape[1]} embeddings to {res['embeddings_file']}")
    if cfg.embed.get("target"):
        target = str(cfg.embed.target)
        found = embed.find_target(target, texts, offsets)
        per_layer = token_vectors_by_layer(encoder, features, [(o.row, o.tokens) for o in found],
                                           batch_size=int(cfg.train.eval_batch_size))
        table = embed.cosine_by_layer(per_layer)
        for line in embed.cosine_lines(target, table):
            log(line)
        tokens = {o.row: tokenizer.convert_ids_to_tokens(features[o.row]["input_ids"]) for o in found}
        res["target"] = embed.write_target(run_dir, target, per_layer, found, texts, tokens, table)
    return res


def tokens_per_second(epoch_tokens: int, train_metrics: dict, steps: int, resumed_from: int | None) -> float:
    """Real tokens trained in *this* process per second (after a resume, Trainer's runtime covers
    only the steps since ``resumed_from``, its epoch count all of them)."""
    here = (steps - (resumed_from or 0)) / steps if steps else 0.0
    runtime = train_metrics.get("train_runtime") or float("nan")
    return epoch_tokens * float(train_metrics.get("epoch") or 0) * here / runtime


def action_pretrain(cfg: DictConfig, run_dir: str) -> dict:
    """Masked-LM pretraining (random init, a tokenizer trained on the text) or continued pretraining
    of a checkpoint with its own MLM head: packed blocks (tasks/pretrain.py), the library's MLM
    collator, Trainer; held-out masked-token accuracy and perplexity with one fixed masking before
    and after training; ``model/`` is a standard Hugging Face directory."""
    from heads.encoder import load_tokenizer
    from heads.mlm import held_out_curve, load_mlm_model, masked_lm_trainer, mlm_metrics
    from tasks import pretrain

    p, seed = cfg.pretrain, int(cfg.train.seed)
    objective = pretrain.objective(p)
    cfg = copy.deepcopy(cfg)
    cfg.train.group_by_length = False  # every packed block has the same length
    with local_rank_zero_first():
        text = pretrain.load_text(cfg.data, seed, documents=objective == "mlm+nsp")
        log(f"pretrain: {len(text['train'].lines)} training lines, {len(text['validation'].lines)} held out")
        tokenizer = load_tokenizer(cfg.model, texts=text["train"].lines, cache_dir=cfg.cache_dir)
        pretrain.check_vocabulary(tokenizer, cfg.model, text["train"].source)
        warn_unknown_hangul(tokenizer, text["train"].lines)
        model = load_mlm_model(cfg.model, len(tokenizer), seed, p.get("position_init") or "random",
                               p.get("attention_init") or "random", objective,
                               p.get("mimetic_alpha"), p.get("mimetic_beta"))
        max_length = resolve_max_length(int(cfg.train.max_length), model.config)
        blocks = {s: pretrain.model_blocks(tokenizer, t, max_length, seed) for s, t in text.items()}
    whole = bool(p.whole_word)
    eval_rows = pretrain.model_rows(blocks["validation"], whole)[: p.get("max_eval_blocks") or None]
    held_out = pretrain.masked_batches(eval_rows, pretrain.mlm_collator(tokenizer, p, seed=int(p.eval_seed)),
                                       int(cfg.train.eval_batch_size))
    initial = mlm_metrics(model, held_out)
    log(f"before: masked-token accuracy {initial['mlm_accuracy']:.2f} %, perplexity {initial['perplexity']:.1f}")
    args = training_arguments(cfg, run_dir, ["labels"], do_eval=False)
    curve = [{"step": 0, **initial}]
    trainer = masked_lm_trainer(trainer_class())(
        model=model, args=args, train_dataset=pretrain.KeyedRows(pretrain.model_rows(blocks["train"], whole)),
        data_collator=pretrain.training_collator(tokenizer, p, seed),
        callbacks=[held_out_curve(held_out, int(p.get("eval_every") or 0), curve)])
    log(f"pretraining: {len(blocks['train'])} blocks of {max_length} tokens, "
        f"{sum(x.numel() for x in model.parameters()):,} parameters")
    trainer.kotune_config = resume_identity(cfg)
    train_metrics, loss, resumed_from = train_resumable(trainer, cfg, run_dir)
    metrics = mlm_metrics(trainer.model, held_out)
    log(f"after: masked-token accuracy {metrics['mlm_accuracy']:.2f} %, perplexity {metrics['perplexity']:.1f}")
    runtime = train_metrics.get("train_runtime") or float("nan")
    real_tokens = sum(sum(r["attention_mask"]) for r in blocks["train"])
    res = {"task": "pretrain", "main_metric": "mlm_accuracy", "objective": objective, "max_length": max_length,
           "vocab_size": len(tokenizer), "n_train_lines": len(text["train"].lines),
           "n_eval_lines": len(text["validation"].lines), "n_train_blocks": len(blocks["train"]),
           "n_eval_blocks": len(eval_rows), "padding_efficiency": pretrain.padding_efficiency(blocks["train"]),
           "train_loss": loss, "train_steps": trainer.state.global_step, "train_runtime_s": runtime,
           "tokens_per_second": tokens_per_second(real_tokens, train_metrics, trainer.state.global_step, resumed_from),
           "initial_metrics": initial, "metrics": metrics, "resumed_from": resumed_from, "held_out_curve": curve,
           "loss_curve": [{"step": h["step"], "loss": h["loss"]} for h in trainer.state.log_history if "loss" in h],
           "data": {s: t.source for s, t in text.items()}}
    if trainer.is_world_process_zero() and cfg.save_model:
        out = os.path.join(run_dir, "model")
        trainer.model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        res["model_dir"] = os.path.abspath(out)
    return res


def action_score(cfg: DictConfig, run_dir: str) -> dict:
    """Any system's predictions (``score.predictions``) against the gold ``data.validation_file``,
    with the task's own metrics (tasks/score.py reads and checks them)."""
    from tasks.score import align, read_predictions, to_outputs

    if not cfg.score.get("predictions"):
        raise ConfigError("action=score needs score.predictions=FILE and the gold file as data.validation_file=FILE")
    task = build_task(cfg.task)
    gold = load_splits(task, cfg.data, ("validation",), int(cfg.train.seed))["validation"]
    path = str(cfg.score.predictions)
    predicted = read_predictions(path, str(cfg.score.id_column), cfg.score.get("prediction_column"),
                                 cfg.score.get("format"))
    values = align(predicted, [str(ex["id"]) for ex in gold.examples], path, gold.where)
    outputs = to_outputs(task, values, gold.examples, path)
    return {"n_eval": len(outputs), "predictions_file": os.path.abspath(path),
            "metrics": task.score(outputs, gold.examples), "data": {"validation": gold.source}}


def action_export(cfg: DictConfig, run_dir: str) -> dict:
    """``checkpoint=`` as the native transformers class in ``export.dir`` (default: <run dir>/hf),
    or a one-line refusal for a head with no exact native equivalent (heads/export.py)."""
    from heads.export import export_directory

    if not cfg.get("checkpoint"):
        raise ConfigError("action=export needs checkpoint=RUN_DIR (a directory written by action=train)")
    out_dir = str(cfg.export.get("dir") or os.path.join(run_dir, "hf"))
    res = export_directory(checkpoint_model_dir(cfg.checkpoint), out_dir)
    use = (f"transformers.pipeline(\"{res['pipeline']}\", model=\"{out_dir}\")" if res["pipeline"] else
           f"transformers.{res['native_class']}.from_pretrained(\"{out_dir}\")")
    log(f"exported {res['native_class']} to {out_dir}: {use}")
    return {**res, "checkpoint": cfg.checkpoint, "metrics": {}}


ACTIONS: dict[str, Callable[[DictConfig, str], dict]] = {
    "train": action_train, "eval": action_eval, "predict": action_predict, "ceiling": action_ceiling,
    "embed": action_embed, "pretrain": action_pretrain, "score": action_score, "export": action_export,
}


# ---- results -------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "datasets", "tokenizers", "hydra-core", "kotune"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def config_hash(cfg: DictConfig) -> str:
    """Identity of a job: the resolved config minus what does not change its result."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    return fingerprint(plain)[:16]


def execute(cfg: DictConfig, run_dir: str) -> dict:
    """Run ``cfg.action`` and write ``run_dir/results.json``; returns the results dict."""
    started = time.time()
    os.makedirs(run_dir, exist_ok=True)
    results: dict[str, Any] = {
        "task": cfg.task.name, "model": cfg.model.name, "mode": cfg.mode.name, "action": cfg.action,
        "seed": int(cfg.train.seed), "status": "running", "main_metric": cfg.task.main_metric,
        "config_hash": config_hash(cfg), "run_dir": os.path.abspath(run_dir),
        "world_size": int(os.environ.get("WORLD_SIZE", 1)),
    }
    try:
        if cfg.action not in ACTIONS:
            raise ConfigError(f"unknown action '{cfg.action}' (choices: {', '.join(ACTIONS)})")
        results.update(ACTIONS[cfg.action](cfg, run_dir))
        results["status"] = "ok"
    except KotuneError as e:
        results.update(status="failed", error=str(e), error_type=type(e).__name__)
    except Exception as e:  # noqa: BLE001 - a failed job still leaves a results file behind
        import traceback

        if not cfg.get("keep_going_on_bugs", True):
            raise
        trace = os.path.join(run_dir, "traceback.txt")
        with open(trace, "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        first = str(e).splitlines()[0] if str(e) else ""
        results.update(status="failed", traceback=trace, error_type=type(e).__name__,
                       error=f"{type(e).__name__}: {first} (a bug, not your input? traceback in {trace}; "
                             "keep_going_on_bugs=false raises it)")
    results["runtime_s"] = round(time.time() - started, 3)
    metrics = results.get("metrics") or {}
    results["main_score"] = metrics.get(results["main_metric"])
    results["config"] = OmegaConf.to_container(cfg, resolve=True)
    results["versions"] = versions()
    if int(os.environ.get("RANK", 0)) == 0:
        write_json_atomic(os.path.join(run_dir, "results.json"), results)
    return results


def summary(results: dict) -> str:
    rows = [("task", results["task"]), ("model", results["model"]), ("mode", results["mode"]),
            ("action", results["action"]), ("status", results["status"])]
    for k, v in (results.get("metrics") or {}).items():
        mark = " *" if k == results.get("main_metric") else ""
        rows.append((k + mark, f"{v:.2f}" if isinstance(v, float) else str(v)))
    for k in ("n_train", "n_eval", "trainable_params", "train_samples_per_second", "runtime_s"):
        if results.get(k) is not None:
            v = results[k]
            rows.append((k, f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def finished_results(path: str, cfg: DictConfig) -> dict | None:
    """An earlier ok results.json of this very config (resume of a multirun), else None: failed,
    partial or corrupt files and other configs mean the job runs (again)."""
    try:
        with open(path, encoding="utf-8") as f:
            done = json.load(f)
    except (OSError, ValueError):
        return None
    if isinstance(done, dict) and done.get("status") == "ok" and done.get("config_hash") == config_hash(cfg):
        return done
    return None


def release_memory() -> None:
    """Between the jobs of a multirun: a failed job's (e.g. out-of-memory) model and optimizer
    sit in reference cycles; free them before the next job allocates its own."""
    gc.collect()
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
        sys.modules["torch"].cuda.empty_cache()


def sweep_id(argv: list[str]) -> str:
    """Default multirun directory name: a hash of the command's overrides (not hydra.* options or
    flags), so the same command run again finds its earlier jobs and resumes (conf/config.yaml)."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-")
                 and not a.lstrip("+~").startswith(("hydra.", "hydra/"))]
    return "sweep-" + fingerprint(overrides)[:10]


def worst_score(cfg: DictConfig) -> float:
    return -1e9 if cfg.task.get("greater_is_better", True) else 1e9


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    quiet_libraries()
    path = os.path.join(hc.runtime.output_dir, "results.json")
    results = finished_results(path, cfg) if hc.mode == RunMode.MULTIRUN else None
    if results is not None:
        log(f"resume: {path} is complete for this config (hash {results['config_hash']}): skipped")
    else:
        results = execute(cfg, hc.runtime.output_dir)
        if hc.mode == RunMode.MULTIRUN:
            release_memory()
    if results["status"] == "ok":
        print(f"\n{summary(results)}\n  results: {path}", flush=True)
        score = results.get("main_score")
        return float(score) if score is not None and math.isfinite(score) else worst_score(cfg)
    print(f"error: {results['error']}", file=sys.stderr, flush=True)
    if hc.mode == RunMode.MULTIRUN:  # let the sweep go on; a sweeper gets a finite worst score
        return worst_score(cfg)
    sys.exit(1)


def quiet_libraries() -> None:
    import logging

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    for name in ("transformers", "datasets", "accelerate"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        import transformers

        transformers.logging.set_verbosity_warning()
    except ImportError:
        pass


def check_choices(argv: list[str]) -> None:
    """Unknown task/model/mode on the command line: one line listing the choices."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUPS:
            continue
        choices = sorted(f[:-5] for f in os.listdir(os.path.join(CONF_DIR, key)) if f.endswith(".yaml"))
        for v in value.split(","):
            if v and v not in choices and not v.startswith(("choice(", "range(", "glob(")):
                print(f"error: unknown {key} '{v}' (choices: {', '.join(choices)})", file=sys.stderr)
                sys.exit(2)


OPEN_DICTS = ("model.config_overrides.", "model.tokenizer_kwargs.")


def open_dict_overrides(argv: list[str]) -> list[str]:
    """``model.config_overrides.X=V`` works without Hydra's ``+``/``++``: these dicts are open by
    design (any field of the architecture's config), so the override is made add-or-replace."""
    return [f"++{a}" if a.startswith(OPEN_DICTS) else a for a in argv]


def quote_non_ascii(argv: list[str]) -> list[str]:
    """Hydra's override grammar rejects unquoted non-ASCII values (``embed.target=은행``, a path
    with Hangul): quote plain ones; lists, sweeps and already quoted values stay as typed."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and not key.startswith("-") and not value.isascii() and not any(c in value for c in "'\"[]{}(),"):
            arg = f"{key}='{value}'"
        out.append(arg)
    return out


def shared_run_dir(argv: list[str]) -> list[str]:
    """Under torchrun every process composes its own config: the default run directory's
    timestamp could differ between them (rank 0's results and model in one directory, another
    rank's checkpoint files in another). Without an explicit ``hydra.run.dir`` the processes of
    one launch share ``<date>_torchrun-<launcher pid>`` instead."""
    explicit = any(a.lstrip("+").startswith("hydra.run.dir=") for a in argv)
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1 or explicit:
        return argv
    return argv + ["hydra.run.dir=outputs/${task.name}/${model.name}/${mode.name}/"
                   f"${{now:%Y-%m-%d}}_torchrun-{os.getppid()}"]


if __name__ == "__main__":
    check_choices(sys.argv[1:])
    os.environ.setdefault("KOTUNE_SWEEP_ID", sweep_id(sys.argv[1:]))
    sys.argv[1:] = shared_run_dir(quote_non_ascii(open_dict_overrides(sys.argv[1:])))
    # Idle OpenMP threads sleep rather than spin (read when torch loads, so set before). On a CPU
    # shared with other jobs, or by torchrun processes, spinning threads that lose their core
    # stall every op: measured 2.6x slower BERT-base steps on a busy 2-core machine, a few % the
    # other way on an idle one. An explicit OMP_WAIT_POLICY wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
