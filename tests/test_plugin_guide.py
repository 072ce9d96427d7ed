"""docs/development/plugins.md's worked example runs as printed: its code blocks (``# my_scores/...`` as
their first line) are written into a package in a temporary folder, and its commands (the ``kotune``
lines) run there on tests/fixtures/scores/, so the page cannot drift from kotune. What each step gives is
checked: a plug-in regression task reports pearson and no f1 borrowed from STS, its exporter's summary
needs no ``export_dir``, its model card names no transformers class, its head without a native twin
exports to ONNX as the kotune model and predicts as the run did, and ``train.calibrate`` is refused
before training in the page's own line. Also here: the head contract's loss types, checked at every
batch, and the regression threshold (tasks/metric_sets.py)."""
from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from test_plugins import error_line, rows

PAGE = ROOT / "docs" / "development" / "plugins.md"
FIXTURES = ROOT / "tests" / "fixtures" / "scores"


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def code_files(text: str) -> dict[str, str]:
    """The page's code blocks that name their file on their first line (``# my_scores/heads.py``)."""
    files = {}
    for body in re.findall(r"```(?:python|yaml)\n(.*?)```", text, flags=re.S):
        first = body.splitlines()[0]
        if re.fullmatch(r"# my_scores/[\w/]+\.(py|yaml)", first):
            files[first[2:]] = body
    return files


def commands(text: str) -> list[tuple[dict, list[str]]]:
    """The page's ``kotune`` command lines: (environment assignments, arguments after ``kotune``)."""
    out = []
    for line in (line for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S) for line in block.splitlines()):
        words = shlex.split(line)
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        if words and words[0] == "kotune":
            out.append((env, words[1:]))
    return out


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]  # only code blocks start so


@pytest.fixture(scope="module")
def guide(tmp_path_factory, cache_dir):
    """The page's package and data in a folder, and each of its commands run there in order."""
    where = tmp_path_factory.mktemp("guide")
    files = code_files(page())
    assert set(files) == {"my_scores/__init__.py", "my_scores/tasks.py", "my_scores/heads.py",
                          "my_scores/exporters.py", "my_scores/conf/task/score.yaml"}, sorted(files)
    for name, body in files.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(body, encoding="utf-8")
    for split in ("train", "dev"):
        shutil.copy(FIXTURES / f"{split}.tsv", where / f"{split}.tsv")
    steps = commands(page())
    assert len(steps) == 6, steps
    for env, args in steps:  # the session's tokenizer cache: the same tiny tokenizer, trained once
        proc = run_cli([*args, f"cache_dir={cache_dir}"], env=env, cwd=where)
        assert proc.returncode == 0, (args, proc.stderr[-3000:])
    return where


def results(where: Path, run: str) -> dict:
    res = json.loads((where / "runs" / run / "results.json").read_text(encoding="utf-8"))
    assert res["status"] == "ok", res.get("error")
    return res


def test_the_regression_plugin_trains_and_evaluates_with_pearson_and_no_borrowed_threshold(guide):
    trained, evaluated = results(guide, "score"), results(guide, "score-eval")
    assert trained["head"] == "mean_regression" and trained["task"] == "score"
    assert set(trained["metrics"]) == {"pearson"}  # no f1 at STS's 3.0: the preset sets no threshold
    assert evaluated["metrics"] == pytest.approx(trained["metrics"])
    spec = json.loads((guide / "runs" / "score" / "model" / "kotune.json").read_text(encoding="utf-8"))
    assert spec["head_kwargs"] == {"num_labels": 1, "dropout": 0.1} and spec["meta"]["plugin"] == "my_scores.tasks"


def test_its_predictions_are_values(guide):
    predicted = rows(Path(results(guide, "score-predict")["predictions_file"]))
    assert len(predicted) == 20 and all(isinstance(r["prediction"], float) for r in predicted)
    assert [r["prediction"] for r in predicted] == pytest.approx([r["prediction"] for r in rows(
        guide / "runs" / "score" / "predictions.jsonl")], abs=1e-5)


def test_its_own_export_format_gets_export_dir_filled_in_and_a_card_of_its_own(guide):
    from safetensors.numpy import load_file

    res = results(guide, "score-export")
    out = guide / "runs" / "score-safetensors"
    assert (guide / res["export_dir"]).resolve() == out.resolve() and res["format"] == "safetensors"
    weights = load_file(str(out / "model.safetensors"))
    head = load_file(str(guide / "runs" / "score" / "model" / "head.safetensors"))
    assert set(head) == {"out.weight", "out.bias"} and all((weights[f"head.{k}"] == v).all() for k, v in head.items())
    card = (out / "README.md").read_text(encoding="utf-8")
    front = card.split("---")[1]
    assert "library_name" not in front and "transformers" not in card.split("## Training")[0]
    assert f"safetensors.torch.load_file('{res['export_dir']}/model.safetensors')" in card


def test_a_head_without_a_native_twin_exports_to_onnx_and_predicts_as_the_run(guide):
    res = results(guide, "score-export-onnx")
    assert res["native_class"] is None and res["format"] == "onnx" and res["onnx_files"] == ["model.onnx"]
    spec = json.loads((guide / "runs" / "score-onnx" / "kotune_export.json").read_text(encoding="utf-8"))
    assert spec["head"] == "mean_regression" and spec["outputs"] == ["logits"]
    onnx = rows(Path(results(guide, "score-onnx-predict")["predictions_file"]))
    torch_run = rows(Path(results(guide, "score-predict")["predictions_file"]))
    assert [r["id"] for r in onnx] == [r["id"] for r in torch_run]
    assert [r["prediction"] for r in onnx] == pytest.approx([r["prediction"] for r in torch_run], abs=1e-4)


def test_calibrating_the_regression_is_refused_before_training_in_the_pages_line(guide, tmp_path):
    env, args = commands(page())[0]
    run = tmp_path / "calibrated"
    line = error_line(run_cli([*[a for a in args if not a.startswith("hydra.run.dir=")], "train.calibrate=temperature",
                              f"hydra.run.dir={run}"], env=env, cwd=guide))
    assert line in error_lines(page()), line
    assert not (run / "model").exists() and not (run / "checkpoints").exists()  # nothing was trained


# ---- the head contract's loss types, one line naming the head -------------------------------------
def tiny_model(head_class):
    """A KotuneModel of a 2-layer BERT with ``head_class`` registered under a test kind (taken out after)."""
    from transformers import BertConfig, BertModel

    from heads.model.kotune_model import KotuneModel
    from kotune.core.registry import HEADS

    HEADS.register("contract_probe")(head_class)
    encoder = BertModel(BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=32), add_pooling_layer=False)
    return KotuneModel(encoder, "contract_probe", {"num_labels": 1})


@pytest.fixture
def probe_head():
    from torch import nn

    import kotune
    from kotune.core.registry import HEADS

    class ProbeHead(kotune.Head):
        sums: object = None
        counts: object = None

        def __init__(self, hidden_size: int, num_labels: int = 1, dropout: float = 0.1):
            super().__init__()
            self.out = nn.Linear(hidden_size, num_labels)

        def forward(self, hidden_states, attention_mask):
            return self.out(hidden_states[:, 0])

        def loss_sums(self, logits, labels):
            return self.sums(logits, labels)

        def loss_counts(self, labels):
            return self.counts(labels)

    yield ProbeHead
    HEADS._entries.pop("contract_probe", None)


@pytest.mark.parametrize("sums, counts, words", [
    # a bare tensor, not a list of one: what a plug-in writes first
    (lambda z, y: ((z.squeeze(-1) - y) ** 2).sum(), lambda y: (y == y).sum().reshape(1),
     "loss_sums returned a Tensor of shape []; it must return a list of 0-d float tensors"),
    (lambda z, y: [((z.squeeze(-1) - y) ** 2)], lambda y: (y == y).sum().reshape(1),
     "loss_sums returned a list of a Tensor of shape [3]; it must return a list of 0-d float tensors"),
    (lambda z, y: [((z.squeeze(-1) - y) ** 2).sum()], lambda y: len(y),
     "loss_counts returned int; it must return a 1-d tensor with 1 entry"),
    (lambda z, y: [((z.squeeze(-1) - y) ** 2).sum()], lambda y: (y == y).sum(),
     "loss_counts returned a Tensor of shape []; it must return a 1-d tensor with 1 entry"),
])
def test_a_head_breaking_the_loss_contract_is_one_line_naming_it(probe_head, sums, counts, words):
    import torch

    from kotune.core.errors import KotuneError

    probe_head.sums, probe_head.counts = staticmethod(sums), staticmethod(counts)
    model = tiny_model(probe_head)
    batch = {"input_ids": torch.tensor([[2, 5, 6, 3]] * 3), "attention_mask": torch.ones(3, 4, dtype=torch.long),
             "labels": torch.tensor([0.5, 1.0, 2.0])}
    with pytest.raises(KotuneError) as caught:
        model(**batch)
    message = str(caught.value)
    assert message.startswith("the contract_probe head (test_plugin_guide.") and words in message
    assert "\n" not in message
    if words.startswith("loss_sums returned a Tensor of shape []"):  # the page shows this one, as the CLI prints it
        shown = [line for line in error_lines(page()) if "loss_sums returned" in line]
        assert [line.split("): ", 1)[1] for line in shown] == [message.split("): ", 1)[1]]
    if "loss_counts" in words:  # the Trainer's count of a step's items reads the same contract
        with pytest.raises(KotuneError, match=r"^the contract_probe head .*: loss_counts returned "):
            model.loss_counts(batch)


def test_a_head_keeping_the_contract_trains_as_before(probe_head):
    import torch

    probe_head.sums = staticmethod(lambda z, y: [((z.squeeze(-1) - y) ** 2).sum()])
    probe_head.counts = staticmethod(lambda y: torch.tensor([y.numel()]))
    model = tiny_model(probe_head)
    batch = {"input_ids": torch.tensor([[2, 5, 6, 3]] * 3), "attention_mask": torch.ones(3, 4, dtype=torch.long),
             "labels": torch.tensor([0.5, 1.0, 2.0])}
    out = model(**batch)
    expected = ((out["logits"].squeeze(-1) - batch["labels"]) ** 2).mean()
    assert torch.allclose(out["loss"], expected) and model.loss_counts(batch).tolist() == [3]


def test_a_head_without_class_probabilities_refuses_calibration(probe_head):
    from heads.calibration import why_not_calibrated

    model = tiny_model(probe_head)  # an `out` layer and no num_labels: before, nothing said it was a regression
    assert "yields no class probabilities" in why_not_calibrated(model.head)
    probe_head.probabilities = "softmax"
    assert why_not_calibrated(model.head) is None


# ---- a regression's threshold: STS's option, not every regression's ----------------------------
def test_a_regression_reports_f1_only_with_a_threshold_of_its_own():
    from omegaconf import OmegaConf

    from tasks.classification import ClassificationTask
    from tasks.metrics import binary_f1_at

    preds, golds = [0.1, 0.4, 0.6, 0.9], [0.0, 0.5, 0.5, 1.0]
    examples = [{"label": g} for g in golds]
    plain = {"name": "score", "regression": True, "columns": {"text": "text", "label": "score"},
             "main_metric": "pearson", "labels": None}
    assert set(ClassificationTask(OmegaConf.create(plain)).score(preds, examples)) == {"pearson"}
    own = ClassificationTask(OmegaConf.create({**plain, "threshold": 0.5})).score(preds, examples)
    assert own["f1"] == binary_f1_at(preds, golds, 0.5) == 80.0
    sts = OmegaConf.load(ROOT / "conf" / "task" / "sts.yaml")
    assert sts.threshold == 3.0  # STS keeps KLUE's F1 at 3.0: its preset says so
