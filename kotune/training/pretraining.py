"""``action=pretrain``'s trainers: ``PretrainingTrainer`` (masked LM, with next-sentence prediction
where the batch has it: the sampler, keyed masks and exact resume) and ``RTDTrainer``
(``pretrain.objective=rtd``: the replaced-token detection loss of heads/model/rtd.py, whose counts
are the masked tokens and the real tokens of the whole optimizer step); both are kotune's
``KotuneTrainer`` (kotune/training/trainer.py)."""
from __future__ import annotations

import torch

from kotune.training.trainer import KotuneTrainer


class PretrainingTrainer(KotuneTrainer):
    """``action=pretrain``'s trainer: the loss is ``heads.model.mlm.masked_lm_loss`` (the MLM head at the
    masked positions only; plus next-sentence prediction where the batch has it), and the training
    rows come in ``tasks.pretrain.EpochSampler``'s order, keyed for ``KeyedRows`` and ``KeyedMasking``
    (exact resume). The loss divides by the masked tokens (and sentence pairs) of the whole
    optimizer step (``pretraining_counts``). A wrapped model (DistributedDataParallel,
    ``train.compile``, DataParallel) keeps its own forward: calling its inner modules would bypass
    the wrapper; the loss is then computed on its gathered outputs."""

    loss_is_scaled_for_ga = True  # compute_loss divides by the whole step's counts
    replicas_compute_loss = False
    compile_dynamic = False  # blocks of one length: dynamo's static shapes

    def loss_counts(self, batch: dict) -> torch.Tensor:
        from heads.model.mlm import pretraining_counts

        return pretraining_counts(batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from heads.model.mlm import masked_lm_loss

        if return_outputs:  # Trainer's evaluation: the model's own loss (action=pretrain scores itself)
            return super().compute_loss(model, inputs, return_outputs)
        loss = masked_lm_loss(model, inputs, num_items_in_batch, full_forward=model is not self.model)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # the counts span the processes; DDP averages
        return loss

    def _get_train_sampler(self, train_dataset=None):
        from tasks.pretrain import EpochSampler

        dataset = self.train_dataset if train_dataset is None else train_dataset
        return EpochSampler(len(dataset), self.args.data_seed if self.args.data_seed is not None else self.args.seed)


class RTDTrainer(PretrainingTrainer):
    """The loss is the model's own forward (``ReplacedTokenDetection``: generator, sampling,
    discriminator in one call), so a wrapped model (DistributedDataParallel, ``train.compile``)
    runs through its wrapper unchanged."""

    def loss_counts(self, batch: dict) -> torch.Tensor:
        from heads.model.rtd import rtd_counts

        return rtd_counts(batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs, loss_counts=num_items_in_batch)
        loss = out["loss"]
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes  # the counts span the processes; DDP averages
        return (loss, out) if return_outputs else loss
