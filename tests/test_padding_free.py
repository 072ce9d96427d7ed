"""``model.padding_free`` (heads/model/packing.py): the encoder reads a batch's real tokens packed into one
row, and every head gives the logits and loss it gives on the padded batch, for BERT, ELECTRA and RoBERTa;
an encoder or a transformers that cannot is refused in one line.

Every head kind a task builds (one task per head, as tests/test_action_matrix.py enumerates them, with the
pair, regression, mean-pooling, CRF, windowed-document and bi-encoder cases besides) runs on its own
sample rows, the shortest and the longest in one batch, on a small random encoder of each family with
dropout off: eval logits within 1e-5 (per-token logits on the real tokens: the pads' states are zeros
packed, left-overs padded, and no head reads them), then one training step's loss and gradients.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from conftest import compose

ARCHS = ("bert", "electra", "roberta")
ATOL = 1e-5


def head_cases() -> dict[str, tuple[str, list[str]]]:
    from test_action_matrix import one_task_per_head

    cases = {task: (task, []) for task in one_task_per_head()}
    cases.update({"nli": ("nli", []), "sts": ("sts", []), "text_cls+mean": ("text_cls", ["mode.pooling=mean"]),
                  "ner+crf": ("ner", ["task.crf=true"]),
                  "text_pair+windows": ("text_pair", ["task.long_text=windows", "train.max_length=18",
                                                      "task.window_stride=1"]),
                  "sentence_embedding": ("sentence_embedding", [])})
    return cases


def transformers_refuses() -> str | None:
    """The refusal of this transformers (before 5.25), on a small BERT; None where packing works."""
    from test_native_heads import small_encoder

    from heads.model.packing import padding_free_refusal

    return padding_free_refusal(small_encoder("bert", "sequence"))


def older_transformers() -> bool:
    import transformers
    from packaging.version import Version

    from heads.model.packing import NEEDS_TRANSFORMERS

    return Version(transformers.__version__) < Version(NEEDS_TRANSFORMERS)


# by the version alone: a packing that breaks on a new transformers fails these tests, never skips them
needs_packing = pytest.mark.skipif(older_transformers(), reason="transformers<5.25: refused "
                                   "(test_this_transformers_packs_or_refuses_naming_the_version)")


@pytest.fixture(scope="module")
def task_batches(cache_dir):
    """Per case: the task's head arguments, its pooling, its windowing and a batch of its shortest and
    longest training rows (model=tiny, data=sample), built once."""
    from kotune.devices import quiet_libraries
    from kotune.loading.build import build
    from tasks.collate import DynamicPaddingCollator

    quiet_libraries()
    built = {}

    def of(case: str):
        if case not in built:
            task, extra = head_cases()[case]
            cfg = compose([f"task={task}", "model=tiny", "data=sample", f"cache_dir={cache_dir}", *extra])
            b = build(cfg, ("train",))
            rows = b.inputs["train"]
            lengths = [len(ids) if not isinstance(ids[0], list) else sum(map(len, ids)) for ids in rows["input_ids"]]
            order = sorted(range(len(lengths)), key=lengths.__getitem__)
            picked = order[:3] + order[-2:]  # the shortest and the longest: rows of different lengths
            assert lengths[picked[-1]] > lengths[picked[0]], lengths
            pad = b.tokenizer.pad_token_id
            batch = DynamicPaddingCollator(pad, 1)([rows[i] for i in picked])
            built[case] = Case(b.model.head_kind, dict(b.task.head_kwargs(), dropout=0.0), cfg.mode.get("pooling"),
                               b.task.windows, batch, len(b.tokenizer), pad)
        return built[case]

    return of


@dataclass
class Case:
    head: str
    head_kwargs: dict
    pooling: str | None
    windows: Any
    batch: dict
    vocab: int
    pad: int


def small_config(arch: str, vocab: int, pad: int):
    """A small random ``arch`` as kotune configures one (model.init=random): the tokenizer's vocabulary and pad id."""
    from omegaconf import OmegaConf

    from heads.model.encoder import build_config

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=514, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if arch == "electra":
        sizes["embedding_size"] = 16
    if arch == "roberta":
        sizes["type_vocab_size"] = 1
    return build_config(OmegaConf.create({"name": "small", "name_or_path": None, "init": "random",
                                          "architecture": arch, "config_overrides": sizes}), vocab, pad)


def model_for(arch: str, case: Case, lora: dict | None = None):
    """The case's head on a small random encoder of ``arch`` (dropout off: both paths compute the same)."""
    from transformers import AutoModel

    from heads.model.encoder import no_pooler
    from heads.model.kotune_model import KotuneModel

    config = small_config(arch, case.vocab, case.pad)
    torch.manual_seed(0)
    model = KotuneModel(AutoModel.from_config(config, **no_pooler(config)), case.head, case.head_kwargs,
                        pooling=case.pooling, lora=lora)
    model.windows = case.windows
    return model


def inputs_for(arch: str, batch: dict) -> dict:
    """The batch as kotune feeds the family: RoBERTa reads no token types (heads/model/encoder.py)."""
    return {k: v for k, v in batch.items() if not (arch == "roberta" and k == "token_type_ids")}


def assert_same(padded, packed, real: torch.Tensor, what: str) -> None:
    """Logits (a tensor or a tuple of them) equal; those with a token axis on the real tokens only."""
    if isinstance(padded, (tuple, list)):
        for a, b in zip(padded, packed, strict=True):
            assert_same(a, b, real, what)
        return
    if padded.dim() >= 2 and tuple(padded.shape[:2]) == tuple(real.shape):
        padded, packed = padded[real], packed[real]
    gap = float((padded.float() - packed.float()).abs().max()) if padded.numel() else 0.0
    assert gap <= ATOL, f"{what}: packed differs from padded by {gap:.2g}"


def assert_same_gradients(padded: dict, packed: dict, what: str) -> None:
    """Every gradient equal, within 1e-5 of the largest of its tensor (a sum over every token: float
    rounding grows with it)."""
    assert padded.keys() == packed.keys()
    for name, grad in padded.items():
        gap = float((grad - packed[name]).abs().max())
        assert gap <= ATOL * max(1.0, float(grad.abs().max())), f"{what} grad {name}: packed differs by {gap:.2g}"


def run_both(model, inputs: dict, train: bool):
    """(padded, packed) outputs of ``model`` on ``inputs``; in training, with each path's gradients."""
    outs = []
    for padding_free in (False, True):
        model.set_padding_free(padding_free)
        model.train(train)
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(train):
            out = model(**inputs)
            if train:
                if "loss" not in out:  # the bi-encoder's loss is sentence-transformers': its vectors' squares stand in
                    out["loss"] = out["logits"].pow(2).sum()
                out["loss"].backward()
                out["loss"] = out["loss"].detach()
                out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        outs.append(out)
    return outs


@needs_packing
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(head_cases()))
def test_every_head_gives_the_padded_paths_logits_and_training_step(task_batches, case, arch):
    model = model_for(arch, task_batches(case))
    inputs = inputs_for(arch, task_batches(case).batch)
    real = inputs["attention_mask"].bool()
    assert len(set(real.sum(1).tolist())) > 1, "the batch's rows have one length: nothing to pack"
    padded, packed = run_both(model, inputs, train=False)
    assert_same(padded["logits"], packed["logits"], real, f"{case} {arch} eval logits")
    padded, packed = run_both(model, inputs, train=True)
    assert float(padded["loss"]) == pytest.approx(float(packed["loss"]), abs=ATOL), (case, arch)
    assert_same_gradients(padded["grads"], packed["grads"], f"{case} {arch}")


@needs_packing
@pytest.mark.parametrize("arch", ARCHS)
def test_every_layer_of_rows_from_one_token_to_three_hundred(arch):
    """mode.layers reads every layer (scalar_mix; the frozen cache stores what layer_states gives):
    each is re-padded, on rows of 1 to 300 tokens, RoBERTa numbering positions from its pad id 1."""
    from test_native_heads import small_config as native_config

    from transformers import AutoModel

    from heads.model.kotune_model import KotuneModel

    config = native_config(arch)
    config.max_position_embeddings = 302 + (2 if arch == "roberta" else 0)
    torch.manual_seed(0)
    model = KotuneModel(AutoModel.from_config(config), "token", {"num_labels": 3}, layers="scalar_mix").eval()
    lengths = torch.tensor([1, 300, 7, 2, 45])
    mask = (torch.arange(300) < lengths[:, None]).long()
    pad = int(config.pad_token_id or 0)
    ids = torch.randint(5, 80, mask.shape, generator=torch.Generator().manual_seed(1)).masked_fill(mask == 0, pad)
    with torch.no_grad():
        padded = model.layer_states(ids, mask)
        model.set_padding_free(True)
        packed = model.layer_states(ids, mask)
    assert padded.shape == packed.shape == (5, 300, config.num_hidden_layers + 1, config.hidden_size)
    assert_same(padded, packed, mask.bool(), f"{arch} every layer")
    assert float(packed[~mask.bool()].abs().max()) == 0.0  # the pads' states: zeros


@needs_packing
def test_lora_runs_its_adapter_on_the_packed_row(task_batches):
    """mode=lora: peft wraps the encoder and passes the packed row's position ids through."""
    lora = {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None, "token_rows": []}
    model = model_for("bert", task_batches("ner"), lora=lora)
    batch = task_batches("ner").batch
    with torch.no_grad():  # LoRA's B starts at zero: a random one, so the adapter changes the states
        for name, p in model.encoder.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    real = batch["attention_mask"].bool()
    padded, packed = run_both(model, batch, train=False)
    assert_same(padded["logits"], packed["logits"], real, "lora eval logits")
    padded, packed = run_both(model, batch, train=True)
    assert float(padded["loss"]) == pytest.approx(float(packed["loss"]), abs=ATOL)
    assert any("lora_" in n for n in packed["grads"])
    assert_same_gradients(padded["grads"], packed["grads"], "lora")


# ---- through the command line's config --------------------------------------------------------
NO_DROPOUT = ["model.config_overrides.hidden_dropout_prob=0", "model.config_overrides.attention_probs_dropout_prob=0",
              "train.head_dropout=0"]
JOB = ["task=ner", "model=tiny", "data=sample", "train.max_steps=4", "train.batch_size=16", *NO_DROPOUT]


def job(overrides: list[str], run_dir, cache: str) -> dict:
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    quiet_libraries()
    return execute(compose(overrides + [f"cache_dir={cache}"]), str(run_dir))


@needs_packing
@pytest.mark.parametrize("mode", [[], ["mode=frozen", "mode.cache=true", "mode.layers=scalar_mix"], ["mode=lora"]],
                         ids=["finetune", "frozen-cache-scalar-mix", "lora"])
def test_a_run_and_its_checkpoint_read_either_way_give_the_same_results(cache_dir, tmp_path, mode):
    """model.padding_free=true trains as the padded run does (the frozen cache, a cache of its own here,
    stores packed states; LoRA's record of its base encoder leaves the option out), and a checkpoint,
    trained either way, is read either way with the same metrics: the option is how the encoder runs,
    not saved with the model."""
    def run_job(overrides, name, cache=cache_dir):
        return job(overrides, tmp_path / name, cache)

    padded = run_job(JOB + mode, "padded")
    packed = run_job(JOB + mode + ["model.padding_free=true"], "packed", str(tmp_path / "packed_cache"))
    assert padded["status"] == packed["status"] == "ok", (padded.get("error"), packed.get("error"))
    assert packed["train_loss"] == pytest.approx(padded["train_loss"], abs=1e-5)
    assert packed["metrics"] == pytest.approx(padded["metrics"], abs=1e-5)
    assert "padding_free" not in (tmp_path / "packed" / "model" / "kotune.json").read_text()
    read = run_job(["action=eval", f"checkpoint={tmp_path / 'padded'}", "model.padding_free=true"], "eval_packed")
    assert read["status"] == "ok", read.get("error")
    assert read["metrics"] == pytest.approx(padded["metrics"], abs=1e-5)
    read = run_job(["action=eval", f"checkpoint={tmp_path / 'packed'}"], "eval_padded")
    assert read["metrics"] == pytest.approx(packed["metrics"], abs=1e-5)


# ---- refusals --------------------------------------------------------------------------------
def refused_in_one_line(call) -> str:
    from kotune.core.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


def test_this_transformers_packs_or_refuses_naming_the_version():
    """transformers 5.25 reads restarting position ids as packed rows; before it (the lowest kotune declares,
    5.3) packed rows would attend to one another: the option is refused in one line naming 5.25."""
    import transformers

    why = transformers_refuses()
    if not older_transformers():
        assert why is None, why
    else:
        assert why and "transformers>=5.25" in why and transformers.__version__ in why, why


@pytest.mark.parametrize("arch", ARCHS)
def test_a_family_that_does_not_read_packed_rows_is_refused_naming_it(arch, monkeypatch):
    """An encoder whose attention does not keep packed rows apart (here: transformers' packed-row
    detection taken away) is refused by the check, which runs a small encoder of its class both ways."""
    import transformers
    import transformers.masking_utils as masking
    from test_native_heads import small_encoder

    from heads.model import packing
    from heads.model.kotune_model import KotuneModel

    monkeypatch.setattr(packing, "_checked", {})
    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)
    model = KotuneModel(small_encoder(arch, "sequence"), "sequence", {"num_labels": 2})
    why = refused_in_one_line(lambda: model.set_padding_free(True))
    assert not model.padding_free
    assert f"{arch} encoder" in why, why
    monkeypatch.setattr(transformers, "__version__", "5.3.0")
    monkeypatch.setattr(packing, "_checked", {})
    why = refused_in_one_line(lambda: model.set_padding_free(True))
    assert "needs transformers>=5.25" in why and "5.3.0" in why, why


def test_left_padding_and_an_export_are_refused_in_one_line():
    from heads.model.packing import pack
    from kotune.loading.built import use_padding_free

    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    why = refused_in_one_line(lambda: pack(torch.ones_like(mask), mask, None))
    assert "right-padded" in why and "model.padding_free=false" in why

    class Export:
        runtime = "onnxruntime"

    why = refused_in_one_line(lambda: use_padding_free(Export(), True))
    assert "onnxruntime" in why and "model.padding_free=false" in why
    use_padding_free(Export(), False)  # off: nothing to refuse


def test_pretraining_refuses_the_option_in_one_line(tmp_path, cache_dir):
    """action=pretrain trains transformers' own pretraining model on blocks packed to full length, not
    through kotune's encoder wrapper: model.padding_free=true is refused before any text is read."""
    res = job(["action=pretrain", "model=tiny", "model.padding_free=true"], tmp_path / "pretrain", cache_dir)
    assert res["status"] == "failed" and "\n" not in res["error"], res
    assert "action=pretrain" in res["error"] and "model.padding_free=false" in res["error"], res["error"]
