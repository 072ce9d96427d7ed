"""``transformers.Trainer`` as kotune uses it: the Trainer subclass (evaluation order, scalar-mix
learning rate, checkpoints that resume exactly) and the trainer of a built run (its
``TrainingArguments``: kotune/training/arguments.py)."""
from __future__ import annotations

import math
import os
from typing import Callable

import safetensors.torch
import torch
from omegaconf import DictConfig
from torch.utils.data import SequentialSampler
from transformers import PreTrainedModel, Trainer

from kotune.training import compiled, early_stopping

from kotune.sweeps import pruning
from kotune.loading.built import Built
from kotune.training.optim import check_layer_decay, parameter_groups
from kotune.training.resume import COMPLETE, resume_identity
from kotune.devices import world_size
from kotune.training.arguments import plain_progress, prediction_arguments, tensorboard_dir, training_arguments
from kotune.core.errors import KotuneError
from kotune.core.files import write_json_atomic


def _summary_writer(log_dir: str):
    """A SummaryWriter for ``log_dir`` (torch's, else tensorboardX's), as TensorBoardCallback takes it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        from tensorboardX import SummaryWriter
    return SummaryWriter(log_dir=log_dir)


class KotuneTrainer(Trainer):
    """Trainer with kotune's evaluation order, optimizer groups and checkpoints.

    - Evaluation keeps input order: transformers 5 reuses the *training* length-grouped
      sampler (random megabatches) for evaluation and prediction when
      ``train_sampling_strategy="group_by_length"``, which permutes predictions.
    - The scalar mix gets its own learning rate (``mix_learning_rate``: ``train.mix_learning_rate``),
      the encoder's layers decaying ones with ``layer_lr_decay`` < 1 (kotune/training/optim.py).
    - A step's loss is the mean over its effective batch's labelled items whatever the split into
      micro-batches (``train.grad_accum``) and processes: ``num_items_in_batch`` holds, per loss
      term, the items of all of the step's micro-batches (``loss_counts``), and the loss divides
      the heads' sums by it (heads/loss.py), where Trainer's own count covers only ``labels``.
    - Checkpoints hold only what trains (a frozen encoder is not saved again, a LoRA one only as
      its adapter), end with a
      completion marker carrying the running loss sum (exact ``train_loss`` after a resume) and
      ``resume_config`` (what a resume must match), and load with the encoder's keys allowed missing.
    - The running loss sum is kotune's own (``loss_sum``: one device tensor added to at each
      micro-batch, read on the host only at a save and at the end), not Trainer's private
      accumulators, whose meaning after a resume differs between transformers releases (5.17
      averages its train_loss over all steps, 5.25 over the steps of this call).
    - ``before_evaluation`` (a function of the trainer) runs before each evaluation of the
      evaluation split: multi-label ``task.threshold=tune`` tunes its thresholds there, on the
      held-out training slice, so that the evaluation scores the decision training will keep."""

    def __init__(self, *args, mix_learning_rate: float | None = None, resume_config: dict | None = None,
                 tensorboard_dir: str | None = None, layer_lr_decay: float = 1.0, before_evaluation=None,
                 batch_tokens: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        plain_progress(self)
        self.batch_tokens = batch_tokens
        self.before_evaluation = before_evaluation
        self.mix_learning_rate = mix_learning_rate
        self.layer_lr_decay = float(layer_lr_decay)
        self.resume_config = resume_config
        self.loss_sum_before = 0.0  # the steps a resumed run had done: its checkpoint's marker
        self._loss_sum: torch.Tensor | None = None  # this call's steps, on the device
        if self.args.torch_compile:  # one graph for every batch shape (kotune/training/compiled.py)
            compiled.configure()
            self.add_callback(compiled.CompileReport())
        if tensorboard_dir and self.is_world_process_zero():
            from transformers.integrations import TensorBoardCallback

            self.add_callback(TensorBoardCallback(_summary_writer(tensorboard_dir)))


    def inference_report(self) -> dict:
        """Where Trainer ran the batches (results.json ``inference``): train.* (bf16, fp16, use_cpu)
        decide; a BatchPredictor's own: heads/model/inference.py."""
        args = self.args
        precision = "bf16" if args.bf16_full_eval else "fp16" if args.fp16_full_eval else "fp32"
        return {"device": str(args.device), "precision": precision, "batch_tokens": None, "provider": None,
                "runner": "trainer"}

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        if self.before_evaluation is not None and eval_dataset is None:
            self.before_evaluation(self)
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    # DataParallel (several GPUs, one process): each replica's forward computes its share of the loss
    replicas_compute_loss = True
    compile_dynamic = True  # train.compile: batches of many shapes, marked symbolic (kotune/training/compiled.py)

    def _prepare_inputs(self, inputs: dict) -> dict:
        inputs = super()._prepare_inputs(inputs)
        return compiled.mark_dynamic(inputs) if self.args.torch_compile and self.compile_dynamic else inputs

    def loss_counts(self, batch: dict) -> torch.Tensor | None:
        """Per loss term, the labelled items of one micro-batch (``KotuneModel.loss_counts``); None
        for a model that does not count them (Trainer's own rule then applies)."""
        counts = getattr(self.model, "loss_counts", None)
        return counts(batch) if callable(counts) else None

    def _get_num_items_in_batch(self, batch_samples: list, device) -> torch.Tensor | None:
        """``num_items_in_batch``: ``loss_counts`` summed over the micro-batches of one optimizer
        step and, as Trainer's ``average_tokens_across_devices`` does with its single count, over the
        processes (the loss is then multiplied by their number: DDP averages the gradients)."""
        counts = [self.loss_counts(batch) for batch in batch_samples]
        if not counts or any(c is None for c in counts):
            return super()._get_num_items_in_batch(batch_samples, device)
        # made where the batch is (accelerate places it on the device): no copy; else one that does not wait
        total = torch.stack(counts).sum(0).to(device, non_blocking=True)
        average = self.args.average_tokens_across_devices
        if average and self.args.world_size > 1:
            total = self.accelerator.gather(total.unsqueeze(0)).sum(0)
        replicas = self.args.n_gpu if self.replicas_compute_loss else 1
        if replicas > 1:  # scattered along dim 0 with the inputs: a row per replica (Trainer's rule)
            total = total.unsqueeze(0).expand(replicas, -1) / (1 if average else replicas)
        return total

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self._loss_sum is None:
            self._loss_sum = torch.zeros((), dtype=torch.float64 if loss.device.type != "mps" else torch.float32,
                                         device=loss.device)
        if self.args.logging_nan_inf_filter:
            # Trainer's rule, without a host sync: a non-finite micro-batch counts as this call's mean step
            done = 1 + self.state.global_step - getattr(self, "_initial_global_step", 0)
            loss_kept = torch.where(torch.isfinite(loss), loss.to(self._loss_sum.dtype), self._loss_sum / done)
        else:
            loss_kept = loss.to(self._loss_sum.dtype)
        self._loss_sum += loss_kept
        return loss

    def loss_sum(self) -> float:
        """The training loss summed over every optimizer step so far, a resumed run's earlier steps
        included, averaged over the processes as Trainer's logs are (a collective: every rank calls it)."""
        if self._loss_sum is None:
            return float(self.loss_sum_before)
        mine = self._loss_sum.reshape(1)
        if self.args.world_size > 1:
            mine = self.accelerator.gather(mine)
        return float(self.loss_sum_before) + float(mine.double().mean().item())

    def get_train_dataloader(self):
        """``train.batch_tokens``: batches filled to a token budget (kotune/training/token_budget.py); else Trainer's."""
        if not self.batch_tokens or self.train_dataset is None:
            return super().get_train_dataloader()
        from kotune.training.token_budget import train_dataloader

        return train_dataloader(self, self.batch_tokens)

    def _get_eval_sampler(self, eval_dataset):
        if eval_dataset is None or self.args.world_size > 1:
            return None  # distributed: accelerate shards sequentially and gathers in order
        return SequentialSampler(eval_dataset)

    def create_optimizer(self, model=None):
        model = self.model if model is None else model
        mix = [p for n, p in model.named_parameters() if n.startswith("mixer.") and p.requires_grad]
        own_mix = bool(mix) and self.mix_learning_rate is not None
        if self.optimizer is not None or not (own_mix or self.layer_lr_decay < 1.0):
            return super().create_optimizer(model)
        groups = parameter_groups(model, set(self.get_decay_parameter_names(model)), self.args.weight_decay,
                                  self.args.learning_rate, self.mix_learning_rate if own_mix else None,
                                  self.layer_lr_decay)
        optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, model)
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        if state_dict is None and hasattr(self.model, "trained_state_dict"):
            state_dict = self.model.trained_state_dict()
        super()._save(output_dir, state_dict=state_dict)

    def _save_checkpoint(self, model, trial) -> None:
        super()._save_checkpoint(model, trial)
        loss_sum = self.loss_sum()  # every rank: the sum is gathered
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            # stopped: early stopping ends training at this checkpoint, so a rerun is finished (a stop
            # for any other reason, such as an interruption, leaves the run to be resumed)
            write_json_atomic(os.path.join(folder, COMPLETE),
                              {"step": self.state.global_step, "loss_sum": loss_sum, "config": self.resume_config,
                               "stopped": bool(self.control.should_training_stop) and early_stopping.has_stopped(self)})

    def _load_state(self, directory: str) -> None:
        state = safetensors.torch.load_file(os.path.join(directory, "model.safetensors"))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        needed = set(self.model.trained_state_dict())  # the fixed rest comes from the model as built
        if unexpected or any(k in needed for k in missing):
            raise KotuneError(f"{directory}: checkpoint does not fit this model "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None) -> None:
        if isinstance(self.model, PreTrainedModel):  # a whole HF model (pretrain): tied weights and all
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        self._load_state(resume_from_checkpoint)

    def best_checkpoint_dir(self) -> str | None:
        """The best checkpoint in *this* run directory: the state keeps the path it was saved under,
        which a moved or copied run directory no longer has."""
        best = self.state.best_model_checkpoint
        return os.path.join(self.args.output_dir, os.path.basename(best)) if best else None

    def _load_best_model(self) -> None:
        if isinstance(self.model, PreTrainedModel):
            return super()._load_best_model()
        self._load_state(self.best_checkpoint_dir())


def make_trainer(cfg: DictConfig, b: Built, run_dir: str,
                 fit_decision: Callable[[KotuneTrainer], None] | None = None,
                 trainer_class: type[KotuneTrainer] | None = None) -> KotuneTrainer:
    """The trainer of a built run: evaluation in length-sorted batches scored in input order, the
    task's main metric for ``train.select_best``. ``fit_decision``: what fits the task's decision
    on the held-out training slice (kotune.inference.predict.fit_decision, given by action=train), run before
    each evaluation during training, so that an evaluation decides as the end of training will
    (multi-label ``task.threshold=tune``) and ``train.select_best`` keeps a checkpoint by the
    decision it will be saved with (never fitted on the evaluation split). ``trainer_class``: a
    subclass with a loss of its own (action=distill's kotune/distill/trainer.py)."""
    from tasks.collate import in_order, length_order, restore_order

    task = b.task
    # evaluations during training: on the validation split, or on the slice held out of the training
    # folds to select on (data.fold_selection=inner), which the fold scored at the end never is
    evaluated = "select" if "select" in b.features else "validation"
    val = b.features.get(evaluated)
    train = b.features.get("train")
    do_eval = (val is not None and train is not None
               and (cfg.train.eval_strategy != "no" or bool(cfg.train.get("select_best"))))
    val_order = length_order(val) if do_eval else None  # sorted batches, as in predict()

    def compute_metrics(p) -> dict:
        predictions = restore_order(p.predictions, val_order)
        return task.score(task.decode(predictions, val, b.splits[evaluated].examples), b.splits[evaluated].examples)

    steps_per_epoch = None
    batch_tokens = cfg.train.get("batch_tokens")
    if train is not None:
        if batch_tokens:  # the token-budget cut decides the batches (kotune/training/token_budget.py)
            from heads.model.inference import row_sizes
            from kotune.training.token_budget import TokenBudgetBatches

            batches = len(TokenBudgetBatches(row_sizes(b.inputs["train"]), int(batch_tokens), 0,
                                             b.collator.multiple, world_size())) * world_size()
        else:
            batches = math.ceil(len(train) / int(cfg.train.batch_size))
        steps_per_epoch = max(1, math.ceil(batches / world_size()) // int(cfg.train.grad_accum))
    return (trainer_class or KotuneTrainer)(
        model=b.model,
        args=training_arguments(cfg, run_dir, list(b.model.head.label_fields), do_eval, steps_per_epoch,
                                task.main_metric, task.greater_is_better),
        train_dataset=b.inputs.get("train"),
        eval_dataset=in_order(b.inputs[evaluated], val_order) if do_eval else None,
        data_collator=b.collator,
        compute_metrics=compute_metrics if do_eval else None,
        before_evaluation=fit_decision if do_eval and "tune" in b.features else None,
        mix_learning_rate=cfg.train.get("mix_learning_rate"),
        layer_lr_decay=check_layer_decay(cfg.train.get("layer_lr_decay", 1.0), bool(cfg.mode.frozen)),
        resume_config=resume_identity(cfg),
        batch_tokens=int(batch_tokens) if batch_tokens else None,
        tensorboard_dir=tensorboard_dir(cfg, run_dir) if train is not None else None,
        callbacks=early_stopping.callbacks(cfg) + pruning.callbacks(task.main_metric) if train is not None else None,
    )


def prediction_trainer(cfg: DictConfig, b: Built, run_dir: str) -> KotuneTrainer:
    """A trainer that only predicts (a checkpoint's eval and predict, through ``Trainer.predict``):
    Trainer's devices, precision and processes (kotune/training/arguments.py's
    ``prediction_arguments``), batches padded as in training; no optimizer, schedule or callbacks."""
    return KotuneTrainer(model=b.model, args=prediction_arguments(cfg, run_dir, list(b.model.head.label_fields)),
                         data_collator=b.collator)
