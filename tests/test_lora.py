"""``mode=lora`` beyond the contract matrix: rows a task adds to the vocabulary train and reload,
bad ``mode.target_modules`` and checkpoints of another mode are told apart in one line, a changed
base encoder is refused, a merge that cannot be exact is refused on export; and
``train.layer_lr_decay``'s learning rate per parameter group."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import compose

TINY = ["model=tiny", "data=sample", "train.batch_size=16", "train.max_steps=4"]
RE = ["task=re", "task.markers=klue"]  # four new vocabulary rows: <subj> </subj> <obj> </obj>


def one_line_error(res: dict) -> str:
    assert res["status"] == "failed" and "traceback" not in res, res
    assert "\n" not in res["error"], res["error"]
    return res["error"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, cache_dir):
    """One LoRA run on RE with KLUE's entity markers (four new vocabulary rows), saved."""
    from kotune.cli.job import execute

    root = tmp_path_factory.mktemp("lora")
    cfg = compose([*RE, *TINY, "mode=lora", f"cache_dir={cache_dir}"])
    res = execute(cfg, str(root / "train"))
    assert res["status"] == "ok", res.get("error")
    return root, res


def test_added_token_rows_train_and_come_back_with_the_adapter(lora_run, run_job):
    from heads.model.kotune_model import KotuneModel

    root, trained = lora_run
    model = KotuneModel.load(str(root / "train" / "model"))
    assert model.lora["token_rows"] and model.lora["target_modules"] == ["query", "value"]
    tokens = model.encoder.base_model.model.embeddings.word_embeddings.token_adapter
    rows = tokens.trainable_tokens_delta["default"]
    assert rows.shape[0] == len(model.lora["token_rows"]) == 4
    assert rows.requires_grad and not tokens.base_layer.weight.requires_grad
    # trained: the markers' values moved away from the random rows they started as
    assert (rows.detach() - tokens.trainable_tokens_original["default"]).abs().max() > 1e-6
    again = run_job([*RE, *TINY, "action=eval", f"checkpoint={root / 'train'}"], "eval")
    assert again["status"] == "ok", again.get("error")
    assert again["metrics"] == pytest.approx(trained["metrics"], abs=1e-9)


def test_target_modules_naming_no_module_lists_the_linear_layers(run_job):
    error = one_line_error(run_job(["task=nli", *TINY, "mode=lora", "mode.target_modules=[query,qkv]"]))
    assert "'qkv' names no module" in error
    assert "query, key, value, dense, attention.output.dense, intermediate.dense, output.dense" in error
    error = one_line_error(run_job(["task=nli", *TINY, "mode=lora", "mode.target_modules=[LayerNorm]"], "norm"))
    assert "peft refuses it" in error and "linear layers: query" in error


def test_checkpoints_of_another_mode_are_told_apart(lora_run, run_job, tmp_path):
    root, _ = lora_run
    lora = root / "train"
    full = run_job([*RE, *TINY], "full")
    assert full["status"] == "ok", full.get("error")
    asked = one_line_error(run_job([*RE, *TINY, "mode=lora", "action=eval", f"checkpoint={tmp_path / 'full'}"],
                                   "lora_of_full"))
    assert "saved by mode=finetune" in asked and "/encoder" in asked
    continued = one_line_error(run_job([*RE, *TINY, "mode=finetune", f"checkpoint={lora}"], "full_of_lora"))
    assert "saved by mode=lora" in continued and "mode=lora" in continued and "action=export" in continued
    for path in (lora, lora / "model"):
        start = one_line_error(run_job([*RE, "model=klue", f"model.name_or_path={path}", *TINY[1:], "mode=lora"],
                                       "start_from_lora"))
        assert "is a kotune mode=lora model" in start and "action=export" in start
    start = one_line_error(run_job([*RE, "model=klue", f"model.name_or_path={tmp_path / 'full'}", *TINY[1:],
                                    "mode=lora"], "start_from_full"))
    assert "is a kotune mode=finetune model" in start and f"{tmp_path / 'full' / 'model'}/encoder" in start


def test_a_changed_base_encoder_is_refused(lora_run, run_job, tmp_path):
    import shutil

    from kotune.core.atomic_dir import write_manifest

    root, _ = lora_run
    copy = tmp_path / "copy"
    shutil.copytree(root / "train", copy, ignore=shutil.ignore_patterns("checkpoints"))
    spec_path = copy / "model" / "kotune.json"
    spec = json.loads(spec_path.read_text())
    spec["lora"]["base"]["seed"] += 1  # the random base re-initialises to other weights
    spec_path.write_text(json.dumps(spec))
    write_manifest(str(copy / "model"), "kotune-model")  # a whole save of that record, not an interrupted one
    error = one_line_error(run_job([*RE, *TINY, "action=eval", f"checkpoint={copy}"]))
    assert "trained on other weights" in error


def test_export_refuses_a_merge_that_cannot_be_exact(lora_run, run_job, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from kotune.core.atomic_dir import write_manifest

    root, _ = lora_run
    text_cls = run_job(["task=text_cls", *TINY, "mode=lora"], "text_cls")
    assert text_cls["status"] == "ok", text_cls.get("error")
    ok = run_job(["task=text_cls", *TINY, "action=export", f"checkpoint={tmp_path / 'text_cls'}"], "export")
    assert ok["status"] == "ok" and ok["lora_merged"] is True, ok.get("error")
    broken = tmp_path / "broken"
    # without the first export, which went beside its checkpoint (text_cls/hf)
    shutil.copytree(tmp_path / "text_cls", broken, ignore=shutil.ignore_patterns("checkpoints", "hf"))
    weights = broken / "model" / "adapter" / "adapter_model.safetensors"
    state = load_file(str(weights))
    name = next(k for k in state if "lora_B" in k)
    state[name] = torch.full_like(state[name], float("inf"))
    save_file(state, str(weights))
    write_manifest(str(broken / "model"), "kotune-model")  # a whole save of those weights, not an interrupted one
    error = one_line_error(run_job(["task=text_cls", *TINY, "action=export", f"checkpoint={broken}"], "export_broken"))
    assert error.startswith("cannot export") and "merging the LoRA adapter" in error


# ---- train.layer_lr_decay ----------------------------------------------------------------------
def group_rates(overrides: list[str], cache_dir: str, run_dir: str) -> dict[str, tuple[float, float]]:
    """Parameter name → (learning rate, weight decay) of the optimizer group that holds it."""
    from kotune.loading.build import build
    from kotune.training.trainer import make_trainer

    cfg = compose(["task=nli", *TINY, "train.learning_rate=1e-3", "train.weight_decay=0.01", *overrides,
                   f"cache_dir={cache_dir}"])
    b = build(cfg, ("train", "validation"))
    optimizer = make_trainer(cfg, b, run_dir).create_optimizer()
    where = {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    return {n: where[id(p)] for n, p in b.model.named_parameters() if p.requires_grad}


def test_layer_decay_gives_each_layer_the_rate_above_times_the_decay(cache_dir, tmp_path):
    rates = group_rates(["train.layer_lr_decay=0.5"], cache_dir, str(tmp_path))
    expected = {"encoder.embeddings.": 1e-3 * 0.5 ** 3, "encoder.encoder.layer.0.": 1e-3 * 0.5 ** 2,
                "encoder.encoder.layer.1.": 1e-3 * 0.5, "head.": 1e-3}
    for name, (lr, decay) in rates.items():
        prefix = next(p for p in expected if name.startswith(p))
        assert lr == pytest.approx(expected[prefix], rel=1e-12), name
        no_decay = name.endswith("bias") or "LayerNorm" in name
        assert decay == (0.0 if no_decay else 0.01), name
    assert {p for p in expected if any(n.startswith(p) for n in rates)} == set(expected)


def test_layer_decay_under_lora_and_with_the_scalar_mix(cache_dir, tmp_path):
    rates = group_rates(["train.layer_lr_decay=0.8", "mode=lora", "mode.layers=scalar_mix",
                         "train.mix_learning_rate=0.01"], cache_dir, str(tmp_path))
    assert rates["mixer.scalar_mix.scalar_weights"] == (0.01, 0.0)
    lora = {n: lr for n, (lr, _) in rates.items() if "lora_" in n}
    assert lora and all(lr == pytest.approx(1e-3 * 0.8 ** (2 - int(n.split(".layer.")[1].split(".")[0])))
                        for n, lr in lora.items())


def test_layer_decay_refuses_frozen_and_out_of_range(run_job):
    error = one_line_error(run_job(["task=nli", *TINY, "mode=frozen", "train.layer_lr_decay=0.8"]))
    assert "mode=frozen trains only the head" in error
    error = one_line_error(run_job(["task=nli", *TINY, "train.layer_lr_decay=1.5"], "range"))
    assert error.startswith("train.layer_lr_decay=1.5") and "in (0, 1]" in error  # the ranges table (kotune/training/ranges.py)
