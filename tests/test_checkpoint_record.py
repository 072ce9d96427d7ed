"""A checkpoint is read once (issue 55): a job from ``checkpoint=`` opens its kotune.json one time,
into the :class:`Checkpoint` record that reconcile() and the build read; the record carries what
the job takes from it, and a mode the checkpoint was not saved in is refused from the record."""
from __future__ import annotations

import builtins
import os

import pytest

from conftest import compose
from test_artifact_trust import trained  # noqa: F401  (the fixture: a real tiny NLI run)

pytestmark = pytest.mark.filterwarnings("ignore")


def test_a_predict_job_opens_kotune_json_once(trained, tmp_path, monkeypatch):  # noqa: F811
    from kotune.loading.from_checkpoint import build_from_checkpoint

    cfg = compose([f"checkpoint={trained}", "data=sample", f"cache_dir={tmp_path / 'cache'}"])
    real_open, opened = builtins.open, []

    def spy(file, mode="r", *args, **kwargs):
        if os.path.basename(str(file)) == "kotune.json" and "b" not in mode:  # read as a spec (the manifest hashes its bytes)
            opened.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    built = build_from_checkpoint(cfg, ("validation",))
    assert opened == [str(trained / "model" / "kotune.json")]
    assert built.task.name == "nli" and built.model.meta["task"] == "nli" and len(built.features["validation"])


def test_the_record_holds_what_the_job_takes_and_reconcile_reads_it(trained):  # noqa: F811
    from kotune.core.errors import ConfigError
    from kotune.loading.checkpoint import read_checkpoint
    from kotune.loading.reconcile import reconcile
    from tasks import build_task

    checkpoint = read_checkpoint(str(trained))
    assert checkpoint.folder == str(trained / "model") and not checkpoint.export
    assert checkpoint.meta == checkpoint.spec["meta"] and checkpoint.meta["task"] == "nli"  # the model holds the spec it was handed
    assert checkpoint.head == checkpoint.model.head_description() and checkpoint.runtime.kotune_model
    cfg = compose([f"checkpoint={trained}", "data=sample"])
    reading = reconcile(cfg, checkpoint, build_task(cfg.task), ("validation",))
    assert reading.task.labels == checkpoint.meta["labels"]
    assert reading.settings.max_length == checkpoint.meta["max_length"]
    with pytest.raises(ConfigError, match="was saved by mode=finetune: continue it with mode=finetune"):
        reconcile(compose([f"checkpoint={trained}", "data=sample", "mode=frozen"]), checkpoint,
                  build_task(cfg.task), ("train",))


def test_an_onnx_export_is_read_once_too(trained, tmp_path, monkeypatch):  # noqa: F811
    """An export's kotune_export.json: read and checked once, then handed to OnnxModel (the graph here
    is a placeholder, refused after the spec: what matters is how often the spec was read)."""
    from heads.model.artifact import ArtifactError
    from kotune.loading.checkpoint import read_checkpoint
    from test_artifact_trust import export_like

    export = export_like(trained, tmp_path, lambda spec: None)
    real_open, opened = builtins.open, []

    def spy(file, mode="r", *args, **kwargs):
        if os.path.basename(str(file)) == "kotune_export.json" and "b" not in mode:
            opened.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    with pytest.raises(ArtifactError, match="not an ONNX graph onnxruntime runs"):
        read_checkpoint(str(export), onnx={})
    assert opened == [str(export / "kotune_export.json")]


@pytest.mark.parametrize("runner", ["trainer", "kotune"])
def test_a_checkpoints_predictions_do_not_depend_on_the_random_state_before_it_is_read(trained, tmp_path, runner):  # noqa: F811
    """The checkpoint path does not seed (a fresh build seeds before it makes its model; Trainer seeds
    at its init): a checkpoint read after any random draws predicts the same logits, through Trainer
    and through a BatchPredictor (predict.device set), where nothing seeds."""
    import numpy as np
    import torch

    from kotune.inference.model_runtimes import predictor_for
    from kotune.inference.predict import predict_logits
    from kotune.loading.from_checkpoint import build_from_checkpoint

    cfg = compose([f"checkpoint={trained}", "data=sample", f"cache_dir={tmp_path / 'cache'}",
                   *(["predict.device=cpu"] if runner == "kotune" else [])])
    logits = []
    for seed in (0, 12345):
        torch.manual_seed(seed)
        torch.rand(7)
        b = build_from_checkpoint(cfg, ("validation",))
        predictor = predictor_for(cfg, b, str(tmp_path / f"run{seed}"))
        assert predictor.inference_report()["runner"] == runner
        out, _ = predict_logits(predictor, b.features["validation"], b.inputs["validation"])
        logits.append(np.asarray(out))
    assert logits[0].shape[0] > 0 and np.array_equal(logits[0], logits[1])
