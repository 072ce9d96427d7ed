"""Export formats and runtimes are registries (kotune/core/backends.py): action=export looks its format up
and has no per-format branch, and the three places that ask how a loaded model runs (predict's
predictor, the loader's mode check, the server's forward) ask its runtime. A plug-in adds either
with one class; kotune's own refusals keep their one-line wording."""
from __future__ import annotations

import json
import os

import pytest
from omegaconf import OmegaConf

import kotune
from kotune.core.errors import ConfigError
from kotune.core.registry import EXPORTERS, RUNTIMES


@pytest.fixture
def registered():
    """Registers plug-in entries for one test and takes them out again afterwards."""
    added: list[tuple[object, str]] = []

    def add(registry, name: str):
        def decorate(cls):
            added.append((registry, name))
            return registry.register(name)(cls)
        return decorate

    yield add
    for registry, name in added:
        registry._entries.pop(name, None)


def export_cfg(**export) -> OmegaConf:
    base = {"dir": None, "overwrite": False, "format": "native", "quantize": None, "license": "unknown",
            "push_to_hub": None, "private": False}
    return OmegaConf.create({"checkpoint": "RUN", "export": {**base, **export}})


def test_kotune_registers_its_formats_and_runtimes():
    from heads.model.kotune_model import KotuneModel
    from kotune.export.onnx import OnnxModel
    from kotune.actions.export import exporter_for
    from kotune.api.native import NativeModel
    from kotune.inference.model_runtimes import runtime_of

    assert type(exporter_for(export_cfg())).__name__ == "NativeExporter"
    assert {"native", "onnx"} <= set(EXPORTERS)
    assert (EXPORTERS.get("native").default_dir, EXPORTERS.get("onnx").default_dir) == ("hf", "onnx")
    assert [(m.runtime, runtime_of(m).trainer, runtime_of(m).kotune_model, runtime_of(m).kind)
            for m in (KotuneModel, OnnxModel, NativeModel)] == [
        ("torch", True, True, "kotune"), ("onnxruntime", False, False, "onnx"),
        ("transformers", False, False, "native")]
    assert {"torch", "onnxruntime", "transformers"} <= set(RUNTIMES)
    assert kotune.Exporter is EXPORTERS.get("onnx").__mro__[1] and kotune.Runtime.__name__ == "Runtime"


def test_an_unknown_format_and_an_option_of_another_format_are_one_line():
    from kotune.actions.export import run

    with pytest.raises(ConfigError, match=r"^export.format must be one of native, onnx, sentence_transformers, got 'zip'$"):
        run(export_cfg(format="zip"), "RUN_DIR")
    with pytest.raises(ConfigError, match=r"^export.quantize=int8 quantizes an ONNX export: add export.format=onnx$"):
        run(export_cfg(quantize="int8"), "RUN_DIR")


def test_a_plugin_adds_a_format_with_one_class(registered, tmp_path, monkeypatch, capsys):
    import kotune.actions.export as action

    @registered(EXPORTERS, "plain")
    class Plain(kotune.Exporter):
        options = {"stride": "sets a plain export's stride"}
        default_dir = "plain"

        def export(self, model_dir, out_dir, options, finish):
            os.makedirs(out_dir)
            with open(os.path.join(out_dir, "weights.json"), "w", encoding="utf-8") as f:
                json.dump({"from": model_dir, **options}, f)
            res = {"native_class": "PlainModel", "export_dir": out_dir}
            finish(res, out_dir)
            return res

        def usage(self, res, out_dir):
            return f"plain.load({out_dir!r})"

    model_dir = tmp_path / "run" / "model"
    model_dir.mkdir(parents=True)
    monkeypatch.setattr(action, "checkpoint_model_dir", lambda checkpoint: str(model_dir))
    monkeypatch.setattr(action, "read_spec", lambda path: {"meta": {}, "head": "sequence"})

    def card(res, meta, head, checkpoint, license, push, folder, exporter):
        path = os.path.join(folder, "README.md")
        open(path, "w").close()
        return path

    monkeypatch.setattr(action, "write_model_card", card)
    cfg = export_cfg(format="plain")
    cfg.export.stride = 2
    res = action.run(cfg, str(tmp_path / "job"))
    out = tmp_path / "run" / "plain"  # beside the checkpoint, in the format's default_dir
    assert res["export_dir"] == str(out) and res["model_card"] == str(out / "README.md")
    assert json.loads((out / "weights.json").read_text()) == {"from": str(model_dir), "stride": 2}
    assert f"exported PlainModel to {out}: plain.load('{out}')" in capsys.readouterr().out
    # its option on kotune's own formats: refused in one line naming the format that reads it
    with pytest.raises(ConfigError, match=r"^export.stride=2 sets a plain export's stride: add export.format=plain$"):
        action.run(OmegaConf.merge(cfg, {"export": {"format": "native"}}), str(tmp_path / "job2"))
    with pytest.raises(ConfigError, match=r"^export.format must be one of native, onnx, plain, sentence_transformers, got 'zip'$"):
        action.run(export_cfg(format="zip"), "RUN_DIR")


def test_an_exporter_summary_needs_no_export_dir_and_the_card_is_the_formats_own(registered, tmp_path, monkeypatch,
                                                                                  capsys):
    """The exporter contract (docs/development/plugins.md): kotune fills in ``export_dir`` and ``format``
    (a summary without them failed with a KeyError once the files were written), a summary that is not a
    dict is one line naming the exporter, and the model card shows the format's own usage and library,
    never transformers' (``transformers.None.from_pretrained``)."""
    import kotune.actions.export as action

    @registered(EXPORTERS, "bare")
    class Bare(kotune.Exporter):
        default_dir = "bare"

        def export(self, model_dir, out_dir, options, finish):
            os.makedirs(out_dir)
            res = {"files": 0}
            finish(res, out_dir)
            return res

        def usage(self, res, out_dir):
            return f"bare.load({out_dir!r})"

    (tmp_path / "run" / "model").mkdir(parents=True)
    monkeypatch.setattr(action, "checkpoint_model_dir", lambda checkpoint: str(tmp_path / "run" / "model"))
    monkeypatch.setattr(action, "read_spec", lambda path: {"meta": {"task": "score"}, "head": "sequence"})
    out = tmp_path / "out"
    res = action.run(export_cfg(format="bare", dir=str(out)), str(tmp_path / "job"))
    assert (res["export_dir"], res["format"], res["files"]) == (str(out), "bare", 0)
    assert f"exported the model as bare to {out}: bare.load('{out}')" in capsys.readouterr().out
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "library_name" not in card.split("---")[1] and "transformers" not in card
    assert f"```\nbare.load('{out}')\n```" in card
    monkeypatch.setattr(Bare, "library", "bare-lib")
    action.run(export_cfg(format="bare", dir=str(tmp_path / "out2")), str(tmp_path / "job2"))
    assert "library_name: bare-lib" in (tmp_path / "out2" / "README.md").read_text(encoding="utf-8")
    monkeypatch.setattr(Bare, "export", lambda self, model_dir, out_dir, options, finish: None)
    with pytest.raises(ConfigError, match=r"^export.format=bare: test_backends\..*Bare.export returned NoneType, "
                                          r"not the summary dict results.json keeps"):
        action.run(export_cfg(format="bare", dir=str(tmp_path / "out3")), str(tmp_path / "job3"))


def test_a_plugin_runtime_runs_its_model_through_a_batch_predictor(registered, monkeypatch):
    import numpy as np

    from kotune.inference import model_runtimes
    from kotune.inference.model_runtimes import runtime_of

    @registered(RUNTIMES, "doubling")
    class Doubling(kotune.Runtime):
        kind = "doubling"

        def forward(self, model):
            return lambda batch: np.asarray(batch) * model.factor

    class DoublingModel:
        runtime, factor = "doubling", 2

    class Built:
        model, tokenizer = DoublingModel(), None
        collator = staticmethod(lambda rows: [[r] for r in rows])

    cfg = OmegaConf.create({"train": {"eval_batch_size": 2}})
    predictor = model_runtimes.predictor_for(cfg, Built(), "RUN_DIR")
    assert isinstance(predictor, model_runtimes.BatchPredictor) and runtime_of(DoublingModel()).kind == "doubling"
    assert predictor.predict([1, 2, 3]).predictions.tolist() == [[2], [4], [6]]

    class Unknown:
        runtime = "tflite"

    with pytest.raises(ConfigError, match=r"^unknown runtime 'tflite' \(choices: doubling, onnxruntime, torch"):
        runtime_of(Unknown())
