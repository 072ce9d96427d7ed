"""Where and how a job runs: devices, padding multiple, seeding, the
rank-zero-first guard of distributed runs, library log levels and memory between jobs."""
from __future__ import annotations

import contextlib
import gc
import os
import sys
import warnings

from omegaconf import DictConfig


def cpu_only() -> bool:
    """No accelerator: accelerate then needs ``cpu=True`` to run gloo DDP under torchrun (else
    every process trains alone on all the data) and to autocast bf16 on the CPU."""
    import torch

    return not torch.cuda.is_available() and not torch.backends.mps.is_available()


def host_reads_wait() -> bool:
    """Whether reading a device value on the host makes the host wait for the device (an accelerator):
    then a step is built from shapes the host knows, even at some extra compute; on a CPU such a read
    costs nothing, and the plain way is kept."""
    return not cpu_only()


def pad_multiple(t: DictConfig) -> int:
    """``train.pad_to_multiple_of``; ``auto``: 8 on CUDA (tensor-core tiles), 1 on CPU, where
    rounding up buys nothing and costs ~8 % of the tokens of short KLUE sentences."""
    import torch

    value = t.get("pad_to_multiple_of", "auto")
    if value in (None, "auto"):
        return 8 if torch.cuda.is_available() else 1
    return max(1, int(value))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", 0)) == 0


@contextlib.contextmanager
def local_rank_zero_first():
    """Under torchrun: each machine's rank 0 builds first (trains the tokenizer, encodes, fills
    the caches) while its other ranks wait, then reads what it wrote: no two processes write one
    cache entry, and the data is tokenized once per machine, not once per process."""
    if world_size() <= 1:
        yield
        return
    from accelerate import PartialState

    with PartialState(cpu=cpu_only()).local_main_process_first():
        yield


def seed_everything(seed: int) -> None:
    """Before anything is built (heads, random encoders, dropout): two runs of one config are
    identical, pretrained encoder or not, as HF's examples call ``set_seed`` first."""
    from transformers import set_seed

    set_seed(seed)


def quiet_libraries() -> None:
    """transformers, datasets and accelerate at warning level: kotune's own log says what happens."""
    import logging

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft asks transformers 5 the old way
    # a notebook without ipywidgets: tqdm.auto says so, then draws its text bar (as kotune's trainers do: plain_progress)
    warnings.filterwarnings("ignore", message="IProgress not found")
    for name in ("transformers", "datasets", "accelerate"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if "transformers" in sys.modules:
        sys.modules["transformers"].logging.set_verbosity_warning()
    else:  # read when it loads: a command that fails before it does not import it (a second) to quiet it
        os.environ["TRANSFORMERS_VERBOSITY"] = "warning"


def release_memory() -> None:
    """Between the jobs of a multirun: a failed job's (e.g. out-of-memory) model and optimizer
    sit in reference cycles; free them before the next job allocates its own."""
    gc.collect()
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
        sys.modules["torch"].cuda.empty_cache()
