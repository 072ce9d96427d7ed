"""``action=pretrain pretrain.objective=rtd``'s trainer: ``PretrainingTrainer`` (its sampler, keyed
masks and checkpoints) with the replaced-token detection loss of heads/model/rtd.py, whose counts
are the masked tokens and the real tokens of the whole optimizer step."""
from __future__ import annotations

import torch

from kotune.training.trainer import PretrainingTrainer


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
