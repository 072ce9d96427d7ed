"""``action=distill``'s Trainer: kotune's (kotune/training/trainer.py) with the distillation loss

    (1 − alpha) · task loss + alpha · soft-target loss (heads/distill/loss.py)
      [+ hidden · hidden-state loss + attention · attention loss]

The soft targets are the batch's cached teacher logits (heads/distill/teacher_cache.py): the teacher
does not run during training, unless hidden-state or attention matching (``distill.hidden_weight``,
``distill.attention_weight``) needs its layers' outputs at each step. Each term is a mean over its
own items across the optimizer step's micro-batches: ``loss_counts`` appends the soft-target items
(every row the teacher labelled, labelled or not) and the layer-matching items (real tokens × mapped
layers) to the task's counts."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from heads.distill.loss import attention_sum, hidden_state_sum, soft_target_count, soft_target_sum
from heads.model.feature_cache import CachedInputs, row_lengths
from heads.distill.student import layer_stack
from heads.distill.teacher_cache import COLUMN
from kotune.core.errors import ConfigError
from kotune.training.trainer import KotuneTrainer


@dataclass
class DistillLoss:
    kind: str                 # heads/distill/loss.py's KINDS
    temperature: float
    alpha: float              # the soft targets' share; 1 − alpha the task loss's
    hidden_weight: float = 0.0
    attention_weight: float = 0.0
    teacher_encoder: torch.nn.Module | None = None  # hidden-state or attention matching only
    layer_map: list[int] = field(default_factory=list)  # student layer i ← teacher layer layer_map[i]

    @property
    def layered(self) -> bool:
        return self.hidden_weight > 0 or self.attention_weight > 0


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


class DistillTrainer(KotuneTrainer):
    loss_is_scaled_for_ga = True  # compute_loss divides by the whole step's counts
    replicas_compute_loss = False
    distill: DistillLoss  # set by kotune/actions/distill.py before training

    def use(self, distill: DistillLoss) -> None:
        if self.args.n_gpu > 1:
            # DataParallel would scatter the step's loss counts with the batch; DDP keeps one count per process
            raise ConfigError(f"action=distill on {self.args.n_gpu} GPUs in one process (DataParallel): start it with "
                              f"torchrun --nproc_per_node={self.args.n_gpu} run.py ... (one process per GPU), or "
                              "show it one GPU (CUDA_VISIBLE_DEVICES=0)")
        self.distill = distill
        self._student_states: list[torch.Tensor] = []
        self._student_maps = AttentionMaps.none()  # hooks fill them with an attention loss
        self._teacher_maps = AttentionMaps.none()
        if distill.layered:
            distill.teacher_encoder.to(self.args.device)

            def keep(module, inputs, output) -> None:  # training steps only (evaluation keeps nothing)
                if module.training:
                    self._student_states.append(_first(output))

            for layer in layer_stack(self.model.encoder):
                layer.register_forward_hook(keep)
        if distill.attention_weight > 0:
            self._student_maps = AttentionMaps(self.model.encoder, training_only=True)  # evaluation keeps none
            self._teacher_maps = AttentionMaps(distill.teacher_encoder, recording=False)

    def _get_train_sampler(self, train_dataset=None):
        """Length-grouped batches from the rows' token counts, read at once (Trainer would read every
        row of a dataset that is not a ``datasets.Dataset`` to learn them)."""
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if self.args.train_sampling_strategy != "group_by_length" or not isinstance(dataset, CachedInputs):
            return super()._get_train_sampler(train_dataset)
        from transformers.trainer_pt_utils import LengthGroupedSampler

        return LengthGroupedSampler(self.args.train_batch_size * self.args.gradient_accumulation_steps,
                                    lengths=row_lengths(dataset.features).tolist())

    def loss_counts(self, batch: dict) -> torch.Tensor | None:
        task = super().loss_counts(batch)
        if task is None or COLUMN not in batch:
            return task
        labels = {k: batch[k] for k in self.model.head.label_fields}
        soft = soft_target_count(self.distill.kind, labels, batch[COLUMN]).to(task.device)
        hidden = batch["attention_mask"].sum() * len(self.distill.layer_map) if self.distill.layered else 0
        return torch.cat([task.reshape(-1), soft.reshape(1), torch.as_tensor(hidden).reshape(1).to(task.device)])

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        teacher = inputs.pop(COLUMN, None)
        if teacher is None or return_outputs:  # evaluation: the model's own loss
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        d = self.distill
        counts = num_items_in_batch if num_items_in_batch is not None else self.loss_counts({**inputs, COLUMN: teacher})
        counts = torch.as_tensor(counts).reshape(-1)
        self._student_states = []
        self._student_maps.clear()
        outputs = model(**inputs, num_items_in_batch=counts[:-2])
        labels = {k: inputs[k] for k in self.model.head.label_fields}
        soft = soft_target_sum(d.kind, outputs["logits"], teacher, labels, d.temperature)
        loss = (1 - d.alpha) * outputs["loss"] + d.alpha * soft / counts[-2].clamp(min=1)
        if d.layered:
            loss = loss + self.layer_loss(inputs) / counts[-1].clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # the counts span the processes; DDP averages
        return loss

    def layer_loss(self, inputs: dict) -> torch.Tensor:
        """TinyBERT's intermediate losses, weighted: the student's layers' outputs and attention
        distributions (caught by hooks in this step's forward) against those of the teacher layers
        they were copied from, on the same batch."""
        d = self.distill
        attention = d.attention_weight > 0
        with torch.no_grad(), self._teacher_maps.record():
            d.teacher_encoder.eval()
            out = d.teacher_encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                    token_type_ids=inputs.get("token_type_ids"), output_hidden_states=True)
        mask, n = inputs["attention_mask"], len(d.layer_map)
        loss = mask.new_zeros((), dtype=torch.float)
        if d.hidden_weight > 0:  # hidden_states[0]: the embeddings
            loss = loss + d.hidden_weight * hidden_state_sum(self._student_states[-n:],
                                                             [out.hidden_states[j + 1] for j in d.layer_map], mask)
        if attention:
            loss = loss + d.attention_weight * attention_sum(self._student_maps[-n:],
                                                             [self._teacher_maps[j] for j in d.layer_map], mask)
        return loss


def self_attention(layer: torch.nn.Module) -> torch.nn.Module:
    """The self-attention module of a BERT-family layer, ``attention.self`` (BERT, RoBERTa, ELECTRA):
    its query and key projections give the layer's attention distributions (``AttentionMaps``)."""
    module = getattr(getattr(layer, "attention", None), "self", None)
    if module is None or not all(hasattr(module, a) for a in ("query", "key", "attention_head_size", "scaling")):
        raise ConfigError(f"distill.attention_weight: a {type(layer).__name__} has no attention.self module with "
                          "query and key projections to compute attention distributions from; "
                          "set distill.attention_weight=0")
    return module


class AttentionMaps(list):
    """The attention distributions ([B, heads, query, key]) of each layer of ``encoder`` at its
    forwards, in layer order: softmax(q·kᵀ · scaling + mask), recomputed from each self-attention
    module's inputs. In training, the distributions a layer returns are those after attention dropout
    (zeros, and the rest scaled by 1 / (1 − p)): matched against the teacher's (evaluation, no dropout),
    a student identical to its teacher would be pulled away from it. TinyBERT matches the maps before
    dropout; recomputing them also leaves both encoders on their fused attention (SDPA)."""

    def __init__(self, encoder: torch.nn.Module, training_only: bool = False, recording: bool = True) -> None:
        super().__init__()
        self.training_only = training_only
        self.recording = recording  # off: the teacher's forwards outside the loss (its score after training)
        for layer in layer_stack(encoder) if encoder is not None else ():
            self_attention(layer).register_forward_hook(self._keep, with_kwargs=True)

    @classmethod
    def none(cls) -> AttentionMaps:
        """Hooked to no encoder (no attention loss): stays empty."""
        return cls(None)

    @contextmanager
    def record(self) -> Iterator[None]:
        """This forward's maps only, kept while the block runs."""
        self.clear()
        self.recording = True
        try:
            yield
        finally:
            self.recording = False

    def _keep(self, module, args: tuple, kwargs: dict, output) -> None:
        if not self.recording or (self.training_only and not module.training):
            return
        hidden = args[0] if args else kwargs["hidden_states"]
        shape = (*hidden.shape[:-1], -1, module.attention_head_size)
        query = module.query(hidden).view(shape).transpose(1, 2)
        key = module.key(hidden).view(shape).transpose(1, 2)
        scores = torch.matmul(query, key.transpose(2, 3)) * module.scaling
        mask = kwargs.get("attention_mask")
        if mask is not None:  # eager: added (0 or the dtype's minimum); SDPA: True where a key is seen
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool \
                else scores + mask
        self.append(torch.softmax(scores, dim=-1))
