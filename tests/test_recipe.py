"""Fine-tuning as the reference recipes do: seeded heads on the pretrained path, fp32 loading,
KLUE-baseline's per-task defaults, best-checkpoint selection, learning rates that learn."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import assert_best_evaluation_kept, compose


@pytest.fixture(scope="module")
def saved_encoder(tmp_path_factory):
    """A 'pretrained' checkpoint directory as a user downloads one: config, weights, tokenizer."""
    from transformers import BertConfig, BertModel

    from heads.model.encoder import train_wordpiece
    from tasks.splits import sample_file

    texts = [json.dumps(row, ensure_ascii=False) for row in
             json.loads(open(sample_file(compose(["task=nli"]).task, "train"), encoding="utf-8").read())]
    root = tmp_path_factory.mktemp("encoders")
    tokenizer = train_wordpiece(texts, 500, None)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128)
    paths = {}
    for dtype in ("float32", "bfloat16"):
        import torch

        torch.manual_seed(0)
        model = BertModel(config).to(getattr(torch, dtype))
        paths[dtype] = str(root / dtype)
        model.save_pretrained(paths[dtype])
        tokenizer.save_pretrained(paths[dtype])
    return paths


def pretrained(path: str) -> list[str]:
    return ["task=nli", "model=klue", f"model.name_or_path={path}", "data=sample", "train.max_steps=3"]


def test_two_runs_of_one_config_on_a_pretrained_encoder_are_identical(saved_encoder, run_job, tmp_path):
    a = run_job(pretrained(saved_encoder["float32"]), "a")
    b = run_job(pretrained(saved_encoder["float32"]), "b")
    assert a["status"] == b["status"] == "ok", (a.get("error"), b.get("error"))
    heads = [load_file(str(tmp_path / run / "model" / "head.safetensors")) for run in ("a", "b")]
    assert heads[0].keys() == heads[1].keys()
    assert all((heads[0][k] == heads[1][k]).all() for k in heads[0])
    assert a["metrics"] == b["metrics"] and a["train_loss"] == b["train_loss"]


def test_a_bf16_checkpoint_loads_in_fp32(saved_encoder, run_job, tmp_path):
    import torch

    from heads.model.kotune_model import KotuneModel

    res = run_job(pretrained(saved_encoder["bfloat16"]) + ["mode=frozen"], "bf16")
    assert res["status"] == "ok", res.get("error")
    # frozen: the saved encoder is the loaded one, unchanged, so its dtype is what loading gave
    encoder = KotuneModel.load(str(tmp_path / "bf16" / "model")).encoder.state_dict()
    checkpoint = load_file(str(Path(saved_encoder["bfloat16"]) / "model.safetensors"))
    assert {v.dtype for v in checkpoint.values()} == {torch.bfloat16}
    assert {v.dtype for k, v in encoder.items() if k in checkpoint} == {torch.float32}
    assert all(torch.equal(encoder[k], checkpoint[k].float()) for k in checkpoint if k in encoder)


@pytest.mark.parametrize("overrides, lr", [
    (["task=nli", "model=klue"], 5e-5),
    (["task=mrc", "model=klue"], 3e-5),              # KLUE-baseline's MRC rate
    (["task=nli", "model=tiny"], 5e-4),              # a random encoder
    (["task=nli", "model=kcbert", "model.init=random"], 5e-4),
    (["task=nli", "model=klue", "mode=frozen"], 1e-3),   # only a head trains
    (["task=nli", "model=tiny", "train.learning_rate=2e-5"], 2e-5),  # the command line wins
])
def test_default_learning_rates(overrides, lr):
    assert compose(overrides).train.learning_rate == pytest.approx(lr)


def test_klue_recipes_are_the_defaults_and_stay_overridable():
    nli, ner, mrc, other = (compose([f"task={t}"]).train for t in ("nli", "ner", "mrc", "text_cls"))
    assert (nli.epochs, nli.weight_decay, nli.warmup_ratio, nli.batch_size) == (5, 0.0, 0.1, 32)
    assert (ner.max_length, ner.warmup_ratio, ner.epochs) == (510, 0.0, 3)
    assert (mrc.batch_size, mrc.epochs) == (16, 5) and compose(["task=mrc"]).task.max_length == 510
    assert (other.epochs, other.weight_decay, other.max_length) == (3, 0.01, 128)  # no recipe: kotune's
    assert compose(["task=nli", "train.epochs=2"]).train.epochs == 2
    klue = compose(["task=nli", "train=klue"]).train
    assert klue.select_best and klue.evals_per_epoch == 4 and klue.epochs == 5


def test_select_best_keeps_the_best_evaluation(run_job, tmp_path):
    res = run_job(["task=nli", "model=tiny", "data=sample", "train=klue", "train.epochs=2", "train.batch_size=16"])
    assert res["status"] == "ok", res.get("error")
    assert_best_evaluation_kept(tmp_path / "job", res)
    assert res["metrics"]["accuracy"] >= res["metrics_last"]["accuracy"] - 1e-9


def test_the_scalar_mix_has_its_own_learning_rate(cache_dir, tmp_path):
    from kotune.loading.build import build
    from kotune.training.trainer import make_trainer

    cfg = compose(["task=nli", "model=tiny", "data=sample", "mode.layers=scalar_mix",
                   "train.mix_learning_rate=0.05", f"cache_dir={cache_dir}"])
    b = build(cfg, ("train", "validation"))
    trainer = make_trainer(cfg, b, str(tmp_path))
    optimizer = trainer.create_optimizer()
    mix = {id(p) for p in b.model.mixer.parameters()}
    groups = [g for g in optimizer.param_groups if any(id(p) in mix for p in g["params"])]
    assert len(groups) == 1 and groups[0]["lr"] == pytest.approx(0.05)
    assert {id(p) for p in groups[0]["params"]} == mix
    assert all(g["lr"] == pytest.approx(cfg.train.learning_rate) for g in optimizer.param_groups if g is not groups[0])


def test_report_to_tensorboard_writes_into_the_run_dir(run_job, tmp_path, monkeypatch):
    """``train.report_to=tensorboard``: Trainer's TensorBoard logger, its events in <run dir>/tensorboard
    (not ./runs of the working directory); ``none`` (the default) writes none."""
    pytest.importorskip("tensorboard")  # the [tensorboard] extra; [dev] installs it
    monkeypatch.chdir(tmp_path)
    logged = run_job(["task=nli", "model=tiny", "data=sample", "train.max_steps=4", "train.logging_steps=1",
                      "train.report_to=tensorboard"], "logged")
    assert logged["status"] == "ok", logged.get("error")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "logged" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]  # every logged step's loss
    assert not (tmp_path / "runs").exists()
    quiet = run_job(["task=nli", "model=tiny", "data=sample", "train.max_steps=2"], "quiet")
    assert quiet["status"] == "ok" and not (tmp_path / "quiet" / "tensorboard").exists()
