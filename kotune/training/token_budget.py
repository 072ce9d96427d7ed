"""``train.batch_tokens``: training batches filled to a token budget (fairseq's ``--max-tokens``)
instead of ``train.batch_size`` rows. The rows are sorted by length (ties in a seeded random order,
new each epoch), cut into batches whose padded size — rows × the longest row, rounded up as the
collator pads — stays within the budget (heads/model/inference.py's ``token_batches``, the cut
inference uses), and the batches come in a seeded random order per epoch. The cut depends on the
sorted lengths only, so every epoch has the same number of batches and Trainer's schedule, resume
(``set_epoch`` and skipped batches) and step counts hold. A step's loss stays the mean over its
labelled items whatever rows a batch holds (kotune/training/trainer.py's ``loss_counts``)."""
from __future__ import annotations

import numpy as np
import torch

from heads.model.inference import row_sizes, token_batches
from kotune.core.log import log


class TokenBudgetBatches(torch.utils.data.Sampler):
    """Batches of row indices within ``batch_tokens`` padded tokens, a process's share of them
    (``rank`` of ``world``: every process gets as many batches, the remainder of the shuffled
    list dropped, as ``drop_last`` would)."""

    def __init__(self, sizes: list[tuple[int, int]], batch_tokens: int, seed: int, multiple: int = 1,
                 world: int = 1, rank: int = 0):
        self.sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        self.seed, self.epoch, self.world, self.rank = int(seed), 0, max(1, int(world)), int(rank)
        # longest first, then the most windows: ties are only reordered among rows of the same size,
        # so the cut below is the same every epoch
        key = np.lexsort((-self.sizes[:, 0], -self.sizes[:, 1]))
        self.cuts = token_batches([tuple(s) for s in self.sizes[key]], batch_tokens, 1, multiple)
        self.per_process = len(self.cuts) // self.world
        if self.per_process == 0:
            raise ValueError(f"train.batch_tokens={batch_tokens}: {len(self.cuts)} batch(es) for {self.world} "
                             "processes; lower it or add data")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.per_process

    def batches(self) -> list[list[int]]:
        """Every process's batches of this epoch, in this epoch's order."""
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        tiebreak = torch.rand(len(self.sizes), generator=g).numpy()
        order = np.lexsort((tiebreak, -self.sizes[:, 0], -self.sizes[:, 1]))
        batches = [order[c.start:c.stop].tolist() for c in self.cuts]
        shuffled = torch.randperm(len(batches), generator=g).tolist()
        return [batches[i] for i in shuffled[: self.per_process * self.world]]

    def __iter__(self):
        return iter(self.batches()[self.rank::self.world])


def train_dataloader(trainer, batch_tokens: int):
    """The trainer's training DataLoader on :class:`TokenBudgetBatches`, prepared by its accelerator
    (device placement, skipped batches on resume) and passed through accelerate's shard wrapper:
    the batches are already this process's share."""
    from functools import partial

    from transformers.trainer_utils import seed_worker

    args = trainer.args
    seed = args.data_seed if args.data_seed is not None else args.seed
    batches = TokenBudgetBatches(row_sizes(trainer.train_dataset), batch_tokens, seed,
                                 getattr(trainer.data_collator, "multiple", 1), args.world_size, args.process_index)
    log(f"train.batch_tokens={batch_tokens}: {len(batches)} batches an epoch, "
        f"{len(trainer.train_dataset) / (len(batches) * args.world_size):.1f} rows a batch on average "
        "(the learning rate is not rescaled: docs/actions/train.md)")
    workers = args.dataloader_num_workers
    loader = torch.utils.data.DataLoader(
        trainer.train_dataset, batch_sampler=batches, collate_fn=trainer.data_collator, num_workers=workers,
        pin_memory=args.dataloader_pin_memory, persistent_workers=args.dataloader_persistent_workers,
        worker_init_fn=partial(seed_worker, num_workers=workers, rank=args.process_index))
    prepared = trainer.accelerator.prepare(loader)
    shard = getattr(prepared, "batch_sampler", None)
    if shard is not None and getattr(shard, "batch_sampler", None) is batches:
        shard.num_processes, shard.process_index = 1, 0
    return prepared
