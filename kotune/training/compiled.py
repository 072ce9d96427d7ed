"""``train.compile``: torch.compile with one graph for every batch shape, not one per shape.

Dynamo's default (``dynamic=None``) compiles the first batch's shapes as constants, then
recompiles with the sizes that changed (a new padded length, a new row count under
``train.batch_tokens``) symbolic, and again for a size that changes later. kotune's batches differ
in both from the start, so the trainers mark them symbolic on the first batch (``mark_dynamic``): the rows and
the padded length of every tensor that has them. One graph then serves every batch; a batch of
one row (an epoch's last, often) is compiled apart: torch specializes sizes 0 and 1 (an unbacked
row count would not, but breaks the graph in the regression and multi-label losses of heads/sequence.py,
measured). Evaluation and prediction
run uncompiled (Trainer's; no graph is compiled for them). ``RECOMPILE_LIMIT`` caps the graphs of
one function: past it dynamo runs that function uncompiled instead of compiling again. The count
is logged when training ends (bench/compile_speed.py measures it: docs/actions/train.md)."""
from __future__ import annotations

from transformers import TrainerCallback

from kotune.core.log import log

# graphs of one function: every batch, the one-row batch, and room for a model's own specialization
# (a head's shape-dependent code); torch's default is 8
RECOMPILE_LIMIT = 4
TOKEN_COLUMNS = ("input_ids", "attention_mask")  # the columns whose sizes are the batch's rows × padded length


def configure() -> None:
    """Cap the graphs per compiled function (never raising a lower cap set before)."""
    import torch._dynamo

    config = torch._dynamo.config
    config.recompile_limit = min(int(config.recompile_limit), RECOMPILE_LIMIT)


def mark_dynamic(inputs: dict) -> dict:
    """Every tensor's rows (dim 0) and padded length (dim 1, where it is the token columns' length)
    symbolic for the compiler, on the tensors the model receives (marks do not survive a copy to
    another device). Sizes of a batch without token columns are left to dynamo's own rule."""
    import torch._dynamo

    shape = next((inputs[c].shape for c in TOKEN_COLUMNS if torch.is_tensor(inputs.get(c))), None)
    if shape is None or len(shape) < 2:
        return inputs
    for value in inputs.values():
        if not torch.is_tensor(value) or value.dim() == 0:
            continue
        if value.size(0) == shape[0]:
            torch._dynamo.maybe_mark_dynamic(value, 0)
        if value.dim() >= 2 and value.size(1) == shape[1]:
            torch._dynamo.maybe_mark_dynamic(value, 1)
    return inputs


def compilations() -> int:
    """Frames compiled so far in this process (a graph each, more with graph breaks)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


class CompileReport(TrainerCallback):
    """Logs, when training ends, how many graphs this training compiled."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.before = compilations()

    def on_train_end(self, args, state, control, **kwargs):
        done = compilations() - getattr(self, "before", 0)
        log(f"train.compile: {done} graph(s) compiled during training (at most {RECOMPILE_LIMIT} per function; "
            "a batch of one row gets its own)")
