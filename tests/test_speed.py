"""Speed defaults that must not change results: length-sorted prediction gives every example its
own prediction back, and a 2-process torchrun (gloo on CPU) trains the same model as one process
with the same global batch, writing one results.json."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, compose

# dropout off and a training set that divides the global batch: one process with batch 16 and two
# with batch 8 then take identical steps, so their losses agree to float rounding
SAME_STEPS = ["task=nli", "model=tiny", "data=sample", "data.max_train_samples=64", "train.max_steps=8",
              "train.logging_steps=8", "train.learning_rate=1e-3", "train.group_by_length=false",
              "train.head_dropout=0", "model.config_overrides.hidden_dropout_prob=0",
              "model.config_overrides.attention_probs_dropout_prob=0"]


@pytest.mark.parametrize("task", ["nli", "ner"])
def test_sorted_prediction_returns_rows_in_input_order(task, tmp_path, cache_dir):
    import torch

    from kotune.loading.build import build
    from kotune.inference.predict import predict
    from kotune.training.trainer import make_trainer
    from tasks.collate import length_order

    cfg = compose([f"task={task}", "model=tiny", "data=sample", "train.eval_batch_size=4",
                   f"cache_dir={cache_dir}"])
    b = build(cfg, ("validation",))
    features = b.features["validation"]
    assert not np.array_equal(length_order(features), np.arange(len(features))), \
        "the sample split is already sorted by length: this test would not see a wrong order"
    seen = {}
    decode = b.task.decode

    def capture(predictions, feats, examples):
        seen["predictions"] = predictions
        return decode(predictions, feats, examples)

    b.task.decode = capture
    outputs, _ = predict(make_trainer(cfg, b, str(tmp_path)), b, "validation")
    assert len(outputs) == len(b.splits["validation"].examples)

    b.model.eval()
    encoder_inputs = [c for c in ("input_ids", "attention_mask", "token_type_ids") if c in features.column_names]
    with torch.no_grad():
        alone = [b.model(**{k: torch.tensor([v]) for k, v in row.items()})["logits"][0].numpy()
                 for row in features.select_columns(encoder_inputs)]
    atol = 1e-5  # padding in a batch moves these logits by ~1e-6
    batch = [np.asarray(seen["predictions"])[i] for i in range(len(alone))]
    common = (lambda a, c: (a[: min(len(a), len(c))], c[: min(len(a), len(c))]) if a.ndim > 1 else (a, c))
    for i, mine in enumerate(alone):
        np.testing.assert_allclose(*common(batch[i], mine), atol=atol, err_msg=f"row {i} got another row's logits")
        # two rows of a random encoder can lie closer than atol (3.7e-5 seen), so the order is also checked
        # as nearest neighbours: row i's batched logits are nearer its own alone logits than any other row's
        distance = [np.abs(np.subtract(*common(batch[i], other))).max() for other in alone]
        assert distance[i] <= min(distance), (i, int(np.argmin(distance)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=2 run.py ARGS`` on a free port (tests may run side by side)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(ROOT / "run.py"), *args]
    env = dict(os.environ, KOTUNE_PROGRESS="0", OMP_NUM_THREADS="1")
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_torchrun_two_processes_match_one_process(tmp_path, cache_dir, run_job):
    out = tmp_path / "ddp"
    proc = torchrun(SAME_STEPS + ["train.batch_size=8", f"hydra.run.dir={out}", f"cache_dir={cache_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = list(tmp_path.rglob("results.json"))
    assert written == [out / "results.json"], written
    ddp = json.loads(written[0].read_text())
    assert ddp["status"] == "ok" and ddp["world_size"] == 2
    assert len((out / "predictions.jsonl").read_text().splitlines()) == ddp["n_eval"]
    reloaded = run_job(SAME_STEPS + ["action=eval", f"checkpoint={out}"], name="eval")  # the one saved model
    assert reloaded["status"] == "ok", reloaded.get("error")
    assert reloaded["metrics"] == pytest.approx(ddp["metrics"])

    one = run_job(SAME_STEPS + ["train.batch_size=16"], name="single")
    assert one["status"] == "ok" and one["world_size"] == 1
    # two processes that each trained alone on all the data (no gradient averaging) or a loss
    # scaled by the process count would drift apart within these 8 steps
    assert ddp["train_loss"] == pytest.approx(one["train_loss"], rel=1e-3)
    one_example = 100.0 / ddp["n_eval"]
    for key, value in one["metrics"].items():
        assert abs(ddp["metrics"][key] - value) <= one_example + 1e-9, (key, ddp["metrics"], one["metrics"])


@pytest.mark.slow
def test_torchrun_frozen_mode_trains_and_saves_once(tmp_path, cache_dir, run_job):
    out = tmp_path / "frozen"
    args = ["task=nli", "model=tiny", "data=sample", "mode=frozen", "train.max_steps=4"]
    proc = torchrun([*args, f"hydra.run.dir={out}", f"cache_dir={cache_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "ok" and results["world_size"] == 2, results.get("error")
    assert results["trainable_params"] == results["head_params"] < results["total_params"]
    reloaded = run_job([*args, "action=eval", f"checkpoint={out}"], name="eval")  # the saved head: the trained one
    assert reloaded["status"] == "ok", reloaded.get("error")
    assert reloaded["metrics"] == pytest.approx(results["metrics"])


@pytest.mark.slow
def test_torchrun_lora_matches_one_process_and_saves_the_adapter_once(tmp_path, cache_dir, run_job):
    """Under DDP only the adapters and the head have gradients to average: two processes still take
    one process's steps."""
    out = tmp_path / "lora"
    proc = torchrun(SAME_STEPS + ["mode=lora", "train.batch_size=8", f"hydra.run.dir={out}", f"cache_dir={cache_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = json.loads((out / "results.json").read_text())
    assert ddp["status"] == "ok" and ddp["world_size"] == 2, ddp.get("error")
    assert (out / "model" / "adapter" / "adapter_model.safetensors").exists() and not (out / "model" / "encoder").exists()
    one = run_job(SAME_STEPS + ["mode=lora", "train.batch_size=16"], name="single")
    assert one["status"] == "ok", one.get("error")
    assert ddp["train_loss"] == pytest.approx(one["train_loss"], rel=1e-3)
    assert ddp["trainable_params"] == one["trainable_params"] < one["total_params"]
