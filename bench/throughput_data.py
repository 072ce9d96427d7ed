"""bench/throughput.py's scenarios and data: the two tasks' settings (NLI, NER: file, max_length,
batch sizes), the encoder (BERT-base shape, random init; --small, --smoke), and :class:`Bench`,
one task built by kotune once, with the same rows padded to max_length for the recipe, and the
batches the timed phases take (kotune's length-grouped epoch, the sorted evaluation order, batches at
quantiles of padded length) with their padding efficiency. The run's clock (:func:`log`) starts here."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from transformers.trainer_pt_utils import LengthGroupedSampler

from kotune.cli.overrides import compose
from kotune.devices import pad_multiple
from kotune.loading.build import build
from kotune.loading.built import Built
from tasks.collate import length_order
from tasks.splits import Split

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

TASKS = {
    "nli": {"file": "data/klue/klue-nli-v1.1_dev.json", "max_length": 128, "batch": 32, "eval_batch": 64,
            "per_token": False},
    "ner": {"file": "data/klue/klue-ner-v1.1_dev.tsv", "max_length": 510, "batch": 8, "eval_batch": 16,
            "per_token": True},
}
ENCODER = ["model=kcbert", "model.init=random", f"model.name_or_path={SHARED / 'vocab' / 'kcbert-base'}",
           "model.config_overrides.max_position_embeddings=512"]  # NER's 510 tokens need 512 positions
SMALL = ["model.config_overrides.num_hidden_layers=2", "model.config_overrides.hidden_size=256",
         "model.config_overrides.num_attention_heads=4", "model.config_overrides.intermediate_size=1024"]
# same-science check: one epoch over `train` examples, `eval` held out (NER's is opt-in: its recipe
# trains at 510 tokens)
QUALITY = {"nli": {"train": 768, "eval": 480, "steps": 24, "batch": 32},
           "ner": {"train": 400, "eval": 300, "steps": 50, "batch": 8}}
# --smoke: the small encoder shrunk again, the first rows of each split, the same-science check at 2 steps,
# the matmul rate on one small shape
SMOKE_SMALL = ["model.config_overrides.num_hidden_layers=1", "model.config_overrides.hidden_size=32",
               "model.config_overrides.num_attention_heads=1", "model.config_overrides.intermediate_size=64"]
SMOKE_DATA = ["data.max_train_samples=128", "data.max_eval_samples=128"]
SMOKE_QUALITY = {"nli": {"train": 64, "eval": 32, "steps": 2, "batch": 8},
                 "ner": {"train": 64, "eval": 32, "steps": 2, "batch": 8}}
SMOKE_PEAK = {"repeats": 1, "budget_s": 0.1, "shapes": ((256, 256, 256),)}
EXTRA: list[str] = []  # SMOKE_DATA under --smoke
PEAK: dict = {}  # SMOKE_PEAK under --smoke


STARTED = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench {time.perf_counter() - STARTED:5.0f}s] {msg}", flush=True)


class Bench:
    """One task: kotune's build of the whole dev split (as train and as validation), its initial
    weights, and the same rows padded to max_length for the recipe."""

    def __init__(self, name: str, args, workdir: str, small: bool = False, extra: tuple = ()):
        spec = TASKS[name]
        self.name, self.spec = name, spec
        path = SHARED / spec["file"]
        self.cfg = compose([f"task={name}", *ENCODER, *(SMALL if small else []), f"data.train_file={path}",
                            f"data.validation_file={path}", f"train.max_length={spec['max_length']}",
                            f"train.batch_size={spec['batch']}", f"train.eval_batch_size={spec['eval_batch']}",
                            f"train.precision={args.precision}", "train.warmup_ratio=0", "train.logging_steps=1000",
                            "save_model=false", f"cache_dir={workdir}/cache", *EXTRA, *extra])
        self.built = build(self.cfg, ("train", "validation"))
        self.model = self.built.model
        self.init_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.features = self.built.features["validation"]
        self.examples = self.built.splits["validation"].examples
        self.lengths = np.array([len(ids) for ids in self.features["input_ids"]])
        self.multiple = pad_multiple(self.cfg.train)
        self.padded = pad_to_max(self.built.inputs["validation"], self.built.tokenizer.pad_token_id,
                                 spec["max_length"])
        enc = self.model.encoder
        self.layers, self.hidden = int(enc.config.num_hidden_layers), int(enc.config.hidden_size)
        self.layer_params = sum(p.numel() for n, p in enc.named_parameters() if ".layer." in f".{n}")
        self.head_params = sum(p.numel() for p in self.model.head.parameters())

    def reset(self) -> None:
        self.model.load_state_dict(self.init_state)

    def padded_len(self, rows) -> int:
        longest = int(self.lengths[rows].max())
        return -(-longest // self.multiple) * self.multiple

    def flops(self, rows_per_batch: int, length: int, train: bool) -> float:
        """Forward FLOPs of one batch of this padded shape (×3 for forward + backward)."""
        per_token_params = self.layer_params + (self.head_params if self.spec["per_token"] else 0)
        dense = 2 * per_token_params * length + (0 if self.spec["per_token"] else 2 * self.head_params)
        attention = 4 * self.layers * length * length * self.hidden  # QK^T and AV
        return (3 if train else 1) * rows_per_batch * (dense + attention)

    def subset(self, rows: list[int], split: str):
        """A Built over just these rows (kotune's pipeline on a slice of the split)."""
        feats = self.features.select(rows)
        exs = [self.examples[i] for i in rows]
        b = Built(self.built.task, {split: Split(exs, {})}, self.built.tokenizer, self.model,
                      {split: feats}, self.built.max_length, self.built.collator)
        if split == "train":  # make_trainer wants a validation split to exist
            b.features["validation"], b.splits["validation"] = feats, Split(exs, {})
            b.inputs["validation"] = b.inputs["train"]
        return b


def pad_to_max(inputs, pad_id: int, max_length: int):
    """The recipe's features: every sequence column padded to max_length (labels with -100)."""
    def pad(batch):
        out = {}
        for key, values in batch.items():
            if values and isinstance(values[0], list):
                fill = pad_id if key == "input_ids" else 0 if key in ("attention_mask", "token_type_ids") else -100
                out[key] = [v + [fill] * (max_length - len(v)) for v in values]
            else:
                out[key] = values
        return out

    return inputs.map(pad, batched=True, desc="padding to max_length")


def epoch_batches(bench: Bench, seed: int) -> list[list[int]]:
    """The batches of one training epoch of kotune's length-grouped sampler over the whole split
    (the sampler Trainer builds for ``train_sampling_strategy="group_by_length"``)."""
    batch = bench.spec["batch"] * int(bench.cfg.train.grad_accum)
    sampler = LengthGroupedSampler(batch, lengths=bench.lengths.tolist(),
                                   generator=torch.Generator().manual_seed(seed))
    order = list(sampler)
    return [order[i:i + bench.spec["batch"]] for i in range(0, len(order), bench.spec["batch"])]


def sorted_batches(bench: Bench) -> list[list[int]]:
    """Evaluation batches as ``predict`` forms them: the split sorted by length."""
    order = length_order(bench.features).tolist()
    size = bench.spec["eval_batch"]
    return [order[i:i + size] for i in range(0, len(order), size)]


def at_quantiles(bench: Bench, batches: list[list[int]], k: int) -> list[list[int]]:
    """k full batches at evenly spaced quantiles of padded length (in their epoch order)."""
    full = [b for b in batches if len(b) == len(batches[0])]
    by_len = sorted(range(len(full)), key=lambda i: bench.padded_len(full[i]))
    picks = sorted({by_len[int((j + 0.5) * len(full) / k)] for j in range(k)})
    return [full[i] for i in picks]


def efficiency(bench: Bench, batches: list[list[int]], fixed: bool = False) -> float:
    real = sum(int(bench.lengths[b].sum()) for b in batches)
    processed = sum(len(b) * (bench.spec["max_length"] if fixed else bench.padded_len(b)) for b in batches)
    return real / processed

