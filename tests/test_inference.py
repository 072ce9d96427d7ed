"""Inference's device, precision and token budget (heads/model/inference.py), on the CPU: ``predict.device``
resolved against the machine (auto → cpu here; a CUDA device that is not there, one line), ``predict.precision``
(bf16 on the CPU labels the demo dev set as fp32 does; fp16 on the CPU refused), batches filled to
``predict.batch_tokens`` (the budget kept, the outputs those of unsplit batches, the input order kept),
and the one forward every inference path runs: serve's and ``kotune.load``'s predictor, rerank's scorer,
action=embed, a bi-encoder's vectors and the distillation teacher's logits all call it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import compose

DEMO = ["task=text_cls", "model=tiny", "data=demo"]


def refused(res: dict) -> str:
    assert res["status"] == "failed" and "traceback" not in res and "\n" not in res["error"], res
    return res["error"]


# ---- the device and the precision ---------------------------------------------------------------
def test_auto_is_the_cpu_without_cuda_and_a_missing_cuda_device_is_one_line(monkeypatch):
    import torch

    from heads.model.inference import resolve
    from kotune.core.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve("auto", "fp32").device == "cpu" and resolve(None, None).precision == "fp32"
    assert resolve("cpu", "bf16").precision == "bf16"
    with pytest.raises(ConfigError) as e:
        resolve("cuda", "fp32")
    assert str(e.value) == ("predict.device=cuda: no CUDA device is visible (torch.cuda.is_available() is False); "
                            "use predict.device=cpu or auto")
    with pytest.raises(ConfigError, match=r"^predict.device=tpu: expected auto, cpu, cuda or cuda:N$"):
        resolve("tpu", "fp32")
    with pytest.raises(ConfigError, match=r"^predict.precision=fp16: float16 autocast runs on CUDA only"):
        resolve("cpu", "fp16")
    with pytest.raises(ConfigError, match=r"^predict.precision=int8: expected fp32, bf16 or fp16$"):
        resolve("cpu", "int8")
    # one GPU visible: cuda is cuda:0, auto picks it, cuda:1 is not there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve("cuda", "fp32").device == "cuda" and resolve("auto", "fp16").device == "cuda"  # the current one
    assert resolve("cuda:0", "fp32").device == "cuda:0"
    with pytest.raises(ConfigError, match=r"^predict.device=cuda:1: 1 CUDA device is visible \(cuda:0\)"):
        resolve("cuda:1", "fp32")


def test_batch_tokens_must_be_a_positive_count():
    from heads.model.inference import check_batch_tokens
    from kotune.core.errors import ConfigError

    assert check_batch_tokens(None) is None and check_batch_tokens(512) == 512
    for bad in (0, -5, "many", 1.5, True):
        with pytest.raises(ConfigError, match=rf"^predict.batch_tokens={bad}: expected a positive number"):
            check_batch_tokens(bad)


# ---- batches filled to a token budget -------------------------------------------------------------
def test_token_batches_keep_the_budget_and_every_row_once_in_order():
    from heads.model.inference import token_batches

    rng = np.random.default_rng(0)
    lengths = sorted(rng.integers(3, 60, size=200).tolist(), reverse=True)  # as predict sorts them: longest first
    for budget, multiple in ((64, 1), (100, 8), (500, 8), (10_000, 1)):
        batches = token_batches([(1, n) for n in lengths], budget, 32, multiple)
        assert [i for b in batches for i in b] == list(range(len(lengths)))  # each row once, in order
        for b in batches:
            padded = -(-max(lengths[i] for i in b) // multiple) * multiple
            assert len(b) == 1 or len(b) * padded <= budget  # a row alone over the budget runs alone
            after = b.stop
            if after < len(lengths):  # filled: the next row would not have fitted
                assert (len(b) + 1) * max(padded, -(-lengths[after] // multiple) * multiple) > budget
    # without a budget: batch_size rows; windows count as rows of their document
    assert token_batches([(1, 5)] * 5, None, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert token_batches([(3, 10), (3, 10), (1, 10)], 60, 32) == [range(0, 2), range(2, 3)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory, cache_dir):
    """A tiny model trained briefly on the demo set (enough that its labels are not all one class)."""
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    quiet_libraries()
    root = tmp_path_factory.mktemp("inference")
    res = execute(compose([*DEMO, "data.max_train_samples=1000", "train.max_steps=150", f"cache_dir={cache_dir}"]),
                  str(root / "train"))
    assert res["status"] == "ok", res.get("error")
    return {"root": root, "run": root / "train", "cache": cache_dir}


def test_a_small_token_budget_splits_batches_and_changes_no_output(demo):
    from kotune.loading.build import build
    from heads.model.inference import BatchPredictor
    from kotune.inference.model_runtimes import batch_predictor
    from kotune.inference.predict import predict_logits

    cfg = compose([*DEMO, f"checkpoint={demo['run']}", f"cache_dir={demo['cache']}", "predict.batch_tokens=96"])
    b = build(cfg, ("validation",))
    features, rows = b.features["validation"], b.inputs["validation"]
    budgeted = batch_predictor(cfg, b.model, b.collator)
    assert isinstance(budgeted, BatchPredictor) and budgeted.batch_tokens == 96
    shapes, forward = [], budgeted.forward

    def recording(batch):
        shapes.append(tuple(batch["input_ids"].shape))
        return forward(batch)

    budgeted.forward = recording
    split, _ = predict_logits(budgeted, features, rows)
    whole = BatchPredictor(forward, 512, budgeted.collator)  # every row in one batch
    unsplit, _ = predict_logits(whole, features, rows)
    assert len(shapes) > 10 and sum(n for n, _ in shapes) == len(rows) == 471
    assert all(n * length <= 96 or n == 1 for n, length in shapes), shapes
    assert float(np.abs(split - unsplit).max()) <= 1e-5
    # input order: row i's logits are row i's alone
    single = forward(budgeted.collator([rows[7]]))[0]
    assert float(np.abs(split[7] - single).max()) <= 1e-5


def test_eval_and_predict_honour_device_precision_and_budget(demo, run_job):
    """action=eval of the checkpoint: Trainer by default; predict.device=cpu, bf16 or a token budget run the
    one forward (results.json inference says where); bf16 labels ≥ 99 % those of fp32; fp16 refused."""
    base = [*DEMO, "action=eval", f"checkpoint={demo['run']}"]
    fp32 = run_job(base, "fp32")
    assert fp32["status"] == "ok" and fp32["inference"]["runner"] == "trainer"
    cpu = run_job([*base, "predict.device=cpu", "predict.batch_tokens=256"], "cpu")
    assert cpu["inference"] == {"device": "cpu", "precision": "fp32", "batch_tokens": 256, "provider": None,
                                "runner": "kotune"}
    assert cpu["metrics"] == pytest.approx(fp32["metrics"], abs=1e-6)
    bf16 = run_job([*base, "predict.precision=bf16"], "bf16")
    assert bf16["inference"]["precision"] == "bf16" and bf16["inference"]["device"] == "cpu"

    def labels(name: str) -> list:
        lines = (Path(bf16["run_dir"]).parent / name / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
        return [json.loads(line)["prediction"] for line in lines]

    ours, theirs = labels("bf16"), labels("fp32")
    assert len(ours) == 471 and len(set(theirs)) >= 2
    assert sum(a == b for a, b in zip(ours, theirs)) / len(ours) >= 0.99
    assert refused(run_job([*base, "predict.precision=fp16"], "fp16")).startswith(
        "predict.precision=fp16: float16 autocast runs on CUDA only")
    assert refused(run_job([*base, "predict.device=cuda"], "cuda")).startswith(
        "predict.device=cuda: no CUDA device is visible")


# ---- one forward for every inference path -----------------------------------------------------------
@pytest.fixture
def counted(monkeypatch):
    """Every call of the one forward, by the function it ran (the model's class or the states function)."""
    from heads.model import inference

    calls: list[str] = []
    real = inference.Inference.forward

    def forward(self, fn, *args, **inputs):
        calls.append(getattr(fn, "__name__", type(fn).__name__))
        return real(self, fn, *args, **inputs)

    monkeypatch.setattr(inference.Inference, "forward", forward)
    return calls


def test_serve_load_and_rerank_run_the_one_forward(demo, counted, run_job, tmp_path):
    import kotune
    from kotune.serving.app import Predictor

    served = Predictor(compose([*DEMO, "action=serve", f"checkpoint={demo['run']}", f"cache_dir={demo['cache']}",
                                "predict.device=cpu"]))
    assert served.describe()["device"] == "cpu" and served.describe()["precision"] == "fp32"
    served.answer(served.examples([{"text": "좋은 하루"}, {"text": "나쁜 말"}]))
    assert counted == ["KotuneModel"]
    loaded = kotune.load(str(demo["run"]), "predict.device=cpu", "predict.batch_tokens=64")
    loaded(["좋은 하루", "아주 긴 문장 " * 20])
    assert counted[1:] == ["KotuneModel", "KotuneModel"]  # the long text split off by the budget

    # rerank: a pair model, its (query, candidate) pairs through the one forward
    assert run_job(["task=text_pair", "model=tiny", "data=sample", "train.max_steps=2", "train.batch_size=8"],
                   "pair")["status"] == "ok"
    candidates = demo["root"] / "candidates.txt"
    candidates.write_text("커피를 마시면 왜 잠이 안 오나요?\n화분에 물은 얼마나 자주 줘야 하나요?\n", encoding="utf-8")
    del counted[:]
    res = run_job(["action=rerank", f"checkpoint={tmp_path / 'pair'}", "rerank.query=커피 마시면 잠이 깨는 이유",
                   f"rerank.candidates={candidates}", "predict.device=cpu"], "rerank")
    assert res["status"] == "ok" and res["inference"]["device"] == "cpu" and counted == ["KotuneModel"]


def test_embed_and_the_teachers_logits_run_the_one_forward(demo, counted, run_job, tmp_path):
    from heads.distill.teacher_cache import TeacherCacheSettings, cached_teacher_logits, kotune_teacher
    from heads.model.inference import resolve
    from kotune.loading.build import build

    texts = tmp_path / "texts.txt"
    texts.write_text("좋은 하루\n나쁜 말\n", encoding="utf-8")
    res = run_job([*DEMO, "action=embed", f"embed.input={texts}", "predict.device=cpu", "predict.precision=bf16"])
    assert res["status"] == "ok" and res["inference"] == {"device": "cpu", "precision": "bf16"}
    assert counted == ["vectors"]
    cfg = compose([*DEMO, f"checkpoint={demo['run']}", f"cache_dir={tmp_path / 'cache'}"])
    b = build(cfg, ("validation",))
    teacher = kotune_teacher(b.model, resolve("cpu", "fp32"))
    cached_teacher_logits(teacher, b.model.head, "classes", {"validation": b.inputs["validation"]},
                          TeacherCacheSettings(str(tmp_path / "cache"), "float32", batch_size=256), "demo")
    assert counted[1:] == ["logits"] * 2  # 471 rows, 256 a batch


# ---- an ONNX export's execution provider ------------------------------------------------------------
class FakeSession:
    def __init__(self, path, options=None, providers=()):
        self.providers = list(providers)

    def get_providers(self) -> list[str]:
        return [p[0] if isinstance(p, tuple) else p for p in self.providers]


def test_onnx_providers_follow_the_device(monkeypatch, capsys):
    import types

    import onnxruntime as ort

    from heads.model.inference import Inference
    from kotune.core.errors import ConfigError
    from kotune.inference.model_runtimes import onnx_run_on

    def model():
        return types.SimpleNamespace(path="m.onnx", options=None, file="model.onnx",
                                     session=FakeSession("m.onnx", providers=["CPUExecutionProvider"]))

    monkeypatch.setattr(ort, "InferenceSession", FakeSession)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    m = model()
    onnx_run_on(m, Inference("cuda:1", "fp32", explicit=True))
    assert m.session.providers == [("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]
    assert m.provider == "CUDAExecutionProvider"
    m = model()
    onnx_run_on(m, Inference("cpu"))
    assert m.provider == "CPUExecutionProvider" and m.session.providers == ["CPUExecutionProvider"]
    # a CPU-only onnxruntime: auto falls back (and says so), a named CUDA device is one line
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    m = model()
    onnx_run_on(m, Inference("cuda:0", "fp32", explicit=False))
    assert m.provider == "CPUExecutionProvider" and "no CUDA provider" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"^predict.device=cuda:0: this onnxruntime has no CUDAExecutionProvider"):
        onnx_run_on(model(), Inference("cuda:0", "fp32", explicit=True))


def test_an_onnx_export_says_which_provider_ran_it(demo, run_job, tmp_path):
    export = run_job([*DEMO, "action=export", "export.format=onnx", f"checkpoint={demo['run']}",
                      f"export.dir={tmp_path / 'onnx'}"], "export")
    assert export["status"] == "ok", export.get("error")
    res = run_job([*DEMO, "action=eval", f"checkpoint={tmp_path / 'onnx'}"], "eval")
    assert res["inference"]["provider"] == "CPUExecutionProvider" and res["inference"]["device"] == "cpu"


def test_embed_with_a_token_budget_gives_the_same_vectors(run_job, tmp_path, monkeypatch):
    """action=embed (the path of a bi-encoder's vectors too): predict.batch_tokens splits its batches, the
    vectors stay those of unsplit batches, in input order."""
    from tasks import collate

    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"{'아주 ' * (i % 7)}긴 문장 {i}\n" for i in range(40)), encoding="utf-8")
    widths: list[tuple] = []
    whole = run_job([*DEMO, "action=embed", f"embed.input={texts}", "train.eval_batch_size=64"], "whole")
    original = collate.DynamicPaddingCollator.__call__

    def recording(self, rows):
        batch = original(self, rows)
        widths.append(tuple(batch["input_ids"].shape))
        return batch

    monkeypatch.setattr(collate.DynamicPaddingCollator, "__call__", recording)
    split = run_job([*DEMO, "action=embed", f"embed.input={texts}", "train.eval_batch_size=64",
                     "predict.batch_tokens=48"], "split")
    assert whole["status"] == split["status"] == "ok"
    assert len(widths) > 3 and all(n * t <= 48 or n == 1 for n, t in widths), widths
    a, b = np.load(whole["embeddings_file"]), np.load(split["embeddings_file"])
    assert a.shape == b.shape == (40, a.shape[1]) and float(np.abs(a - b).max()) <= 1e-5


def test_no_module_runs_a_model_for_inference_outside_the_one_forward():
    """A new inference path cannot forget the device: no module but heads/model/inference.py opens
    torch.inference_mode, pins the CPU or brings logits back with .float().numpy() itself."""
    from conftest import ROOT

    found = []
    for package in ("kotune", "heads", "tasks"):
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "heads" / "model" / "inference.py":
                continue
            text = path.read_text(encoding="utf-8")
            found += [f"{path.relative_to(ROOT)}: {needle}" for needle in
                      ("inference_mode", 'torch.device("cpu")', ".float().numpy()") if needle in text]
    assert not found, found
