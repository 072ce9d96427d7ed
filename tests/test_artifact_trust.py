"""A checkpoint or an ONNX export is data, never code (docs/actions/checkpoints.md). Every value
read from its ``kotune.json`` / ``kotune_export.json`` is checked before it reaches Hydra or a
loader: the task and mode are presets, each task option one the task saves and of its type, a
string holds nothing OmegaConf would resolve, a file name is a name. A crafted one is refused in
one line naming the file and the key, before anything runs.

The attack these tests replay (issue 40): ``meta.task = '../../…/evil'`` made Hydra compose a YAML
shipped with the checkpoint, whose ``hydra.callbacks`` were instantiated by a plain ``action=eval
checkpoint=DIR``: ``builtins.open(path, 'w')`` truncated a file, ``torch.load(weights_only=False)``
ran a pickle. Here both would leave a marker file; none may appear."""
from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, compose, run_cli_here
from heads.model.artifact import shown

CONF_TASK = ROOT / "conf" / "task"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir) -> Path:
    """A real tiny NLI checkpoint (one step on the shipped sample data): its run directory."""
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    run = tmp_path_factory.mktemp("trained") / "run"
    cfg = compose(["model=tiny", "data=sample", "train.max_steps=1", "train.batch_size=8", f"cache_dir={cache_dir}"])
    quiet_libraries()
    assert execute(cfg, str(run))["status"] == "ok"
    return run


class Opener:
    """Unpickled, it opens (creates) ``path``: what ``torch.load(weights_only=False)`` would run."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def evil_config(tmp_path: Path) -> tuple[str, list[Path]]:
    """``tmp_path/evil.yaml``, a config whose Hydra callbacks create marker files, and the
    ``meta.task`` that reached it from conf/task/ on the old code."""
    markers = [tmp_path / "opened", tmp_path / "unpickled"]
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps(Opener(str(markers[1]))))
    (tmp_path / "evil.yaml").write_text(
        "# @package _global_\n"
        "hydra:\n  callbacks:\n"
        f"    opened:\n      _target_: builtins.open\n      file: {markers[0]}\n      mode: w\n"
        f"    unpickled:\n      _target_: torch.load\n      f: {tmp_path / 'evil.pkl'}\n      weights_only: false\n",
        encoding="utf-8")
    return os.path.relpath(tmp_path / "evil", CONF_TASK), markers


def refused(args: list[str], tmp_path: Path, markers: tuple[Path, ...] = ()) -> str:
    """The one error line of a command refused before Hydra starts (exit status 2, no traceback),
    none of ``markers`` created."""
    proc = run_cli_here([*args, f"hydra.run.dir={tmp_path / 'run'}"])
    assert not [m.name for m in markers if m.exists()], "the crafted config ran: " + proc.stderr[-1500:]
    assert proc.returncode == 2, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-1500:]
    assert not (tmp_path / "run").exists()  # no job started
    return errors[0]


def tampered_checkpoint(trained: Path, tmp_path: Path, change) -> Path:
    """A copy of the trained model whose kotune.json ``change(spec)`` altered."""
    ck = tmp_path / "ck"
    shutil.copytree(trained / "model", ck / "model")
    spec_file = ck / "model" / "kotune.json"
    spec = json.loads(spec_file.read_text(encoding="utf-8"))
    change(spec)
    spec_file.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return ck


def export_like(trained: Path, tmp_path: Path, change) -> Path:
    """An ONNX export's directory as action=export writes it (config, tokenizer, kotune_export.json),
    its spec altered by ``change``. The graph itself is a placeholder: the refusal comes before any
    file but kotune_export.json is read (a real export costs half a minute; tests/test_serve.py and
    tests/test_action_matrix.py load real ones, whose spec passes these checks)."""
    out = tmp_path / "onnx"
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(trained / "model" / name, out / name)
    shutil.copy(trained / "model" / "encoder" / "config.json", out / "config.json")
    (out / "model.onnx").write_bytes(b"not a graph")
    saved = json.loads((trained / "model" / "kotune.json").read_text(encoding="utf-8"))
    spec = {"format": "onnx", "head": saved["head"], "meta": saved["meta"],
            "inputs": ["input_ids", "attention_mask", "token_type_ids"], "outputs": ["logits"],
            "files": ["model.onnx"], "model_file": "model.onnx", "opset": 20, "exporter": "torch.onnx (dynamo)",
            "native_class": "BertForSequenceClassification"}
    change(spec)
    (out / "kotune_export.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return out


@pytest.mark.parametrize("artifact, spec_file", [("checkpoint", "model/kotune.json"),
                                                 ("onnx export", "kotune_export.json")])
def test_an_artifact_whose_task_leads_out_of_conf_is_refused_and_runs_nothing(artifact, spec_file, trained, tmp_path):
    task, markers = evil_config(tmp_path)
    assert len(markers) == 2 and not any(m.exists() for m in markers)  # what the crafted config would create
    make = tampered_checkpoint if artifact == "checkpoint" else export_like
    path = make(trained, tmp_path, lambda spec: spec["meta"].update(task=task))
    line = refused(["action=eval", f"checkpoint={path}", "data=sample"], tmp_path, markers)  # and no marker
    assert line.startswith(f"error: checkpoint {path}: {spec_file}: meta.task={shown(task)} is not a kotune task "
                           "(known: "), line
    assert "nli" in line


def test_the_model_name_and_the_mode_are_checked_too(trained, tmp_path):
    """meta.model may be the user's own name (``model.name=``), but a plain name: never a path."""
    task, markers = evil_config(tmp_path)
    assert len(markers) == 2  # refused() checks that none of them appears
    ck = tampered_checkpoint(trained, tmp_path, lambda spec: spec["meta"].update(model=task))
    line = refused(["action=eval", f"checkpoint={ck}", "data=sample"], tmp_path, markers)
    assert f"model/kotune.json: meta.model={shown(task)} is not a plain model name (letters, digits, '_', '-')" in line, line
    spec_file = ck / "model" / "kotune.json"
    spec = json.loads(spec_file.read_text(encoding="utf-8"))
    spec["meta"]["model"], spec["mode"] = "tiny", task
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    line = refused(["action=eval", f"checkpoint={ck}", "data=sample"], tmp_path, markers)
    assert f"model/kotune.json: mode={shown(task)} is not a kotune mode (known: finetune, frozen, lora, setfit)" in line, line


def minimal_checkpoint(tmp_path: Path, task_options: dict, task: str = "token_cls", **spec) -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "kotune.json").write_text(json.dumps({
        "head": "token", "frozen": False, "meta": {"task": task, "model": "tiny", "task_options": task_options},
        **spec}), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("options,key,why", [
    ({"name": "x"}, "meta.task_options.name", "is not an option task token_cls saves (it saves: decode, crf, join"),
    ({"join=x,hydra.callbacks.a._target_": "os.system"}, "meta.task_options has the key 'join=x,hydra",
     "not a task option's name"),
    ({"crf": "true"}, "meta.task_options.crf='true'", "does not fit task token_cls's crf (its preset has False)"),
    ({"join": "${oc.env:HOME}"}, "meta.task_options.join='${oc.env:HOME}'", "is not a plain value"),
    ({"join": "${kotune_log_range:1e-5,1e-3}"}, "meta.task_options.join='${kotune_log_range:1e-5,1e-3}'",
     "is not a plain value"),
    ({"join": "a\nb"}, "meta.task_options.join='a\\nb'", "is not a plain value"),
    ({"scheme": {"_target_": "os.system"}}, "meta.task_options.scheme={'_target_': 'os.system'}", "is not a plain value"),
])
def test_a_bad_task_option_is_refused_naming_it(tmp_path, options, key, why):
    from heads.model.artifact import ArtifactError
    from kotune.cli.checkpoint_overrides import checkpoint_overrides

    ck = minimal_checkpoint(tmp_path, options)
    with pytest.raises(ArtifactError) as e:
        checkpoint_overrides([f"checkpoint={ck}", "action=predict"])
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"checkpoint {ck}: model/kotune.json: {key}") and why in line, line


def test_a_bad_task_option_on_the_command_line_is_one_line(tmp_path):
    ck = minimal_checkpoint(tmp_path, {"join": "${oc.env:HOME}"})
    line = refused(["action=predict", f"checkpoint={ck}"], tmp_path)
    assert line == (f"error: checkpoint {ck}: model/kotune.json: meta.task_options.join='${{oc.env:HOME}}' is not a "
                    "plain value (a number, true/false, null, a string without '${' or control characters, or a "
                    "list of them)")


@pytest.mark.parametrize("join", ["", " ", "\t", "a'b", 'a"b', "a,b", "[1,2]", "{a}", "a\\b", "a\\", "\\'", "x=1 y=2",
                                  "x' task.crf='true", "$HOME", "은행"])
def test_a_saved_string_option_comes_back_exactly_and_injects_nothing(tmp_path, join):
    """The override carrying a saved string gives Hydra exactly that string: quotes, commas,
    brackets, backslashes and ``=`` can neither end it nor add another override."""
    ck = minimal_checkpoint(tmp_path, {"join": join, "decode": "subword", "crf": False})
    cfg = compose([f"checkpoint={ck}", "action=predict"])
    assert cfg.task.join == join and cfg.task.crf is False and cfg.task.name == "token_cls"


def add_auto_map(path: Path) -> None:
    config = json.loads(path.read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoModel": "evil.EvilModel", "AutoTokenizer": ["evil.EvilTokenizer", None]}
    path.write_text(json.dumps(config), encoding="utf-8")


@pytest.mark.parametrize("plant,line", [
    (lambda model, marker: (model / "encoder" / "pytorch_model.bin").write_bytes(pickle.dumps(Opener(marker))),
     "encoder/pytorch_model.bin is a pickle-format file; kotune reads weights from safetensors only"),
    (lambda model, marker: (model / "head.pt").write_bytes(pickle.dumps(Opener(marker))),
     "head.pt is a pickle-format file"),
    (lambda model, marker: (model / "evil.py").write_text(f"open({marker!r}, 'w')\n"), "evil.py is Python code"),
    (lambda model, marker: add_auto_map(model / "encoder" / "config.json"),
     "encoder/config.json has auto_map={'AutoModel': 'evil.EvilModel'"),
    (lambda model, marker: add_auto_map(model / "tokenizer_config.json"), "tokenizer_config.json has auto_map="),
])
def test_weights_are_safetensors_and_no_file_names_code(trained, tmp_path, plant, line):
    """Weights load from safetensors only: a pickle beside them is refused, not left for a loader to
    choose (transformers' and peft's would read it with weights_only=True; kotune reads none). No
    Python file, and no ``auto_map`` (transformers' pointer to code it would offer to run)."""
    from heads.model.artifact import ArtifactError
    from heads.model.kotune_model import KotuneModel
    from kotune.loading.checkpoint import read_spec

    ck = tampered_checkpoint(trained, tmp_path, lambda spec: None)
    plant(ck / "model", str(tmp_path / "ran"))
    for read in (read_spec, KotuneModel.load):
        with pytest.raises(ArtifactError) as e:
            read(str(ck / "model"))
        assert line in str(e.value), str(e.value)
    assert not (tmp_path / "ran").exists()


def test_an_export_whose_config_names_code_is_refused(trained, tmp_path):
    from heads.model.artifact import ArtifactError
    from kotune.loading.checkpoint import read_spec

    export = export_like(trained, tmp_path, lambda spec: None)
    assert read_spec(str(export))["format"] == "onnx"
    add_auto_map(export / "config.json")
    with pytest.raises(ArtifactError, match=r"onnx/config.json has auto_map="):
        read_spec(str(export))


def test_the_trained_checkpoint_passes_and_a_crafted_one_fails_where_the_model_loads(trained, tmp_path):
    """The checks also guard the loaders themselves (a sweep over checkpoints composes without
    checkpoint_overrides): KotuneModel.load and OnnxModel refuse what read_spec refuses."""
    from heads.model.artifact import ArtifactError, check_export_spec
    from heads.model.kotune_model import KotuneModel
    from kotune.loading.checkpoint import read_spec

    assert read_spec(str(trained))["meta"]["task"] == "nli"
    assert KotuneModel.spec(str(trained / "model"))["head"] == "sequence"
    ck = tampered_checkpoint(trained, tmp_path, lambda spec: spec["meta"].update(task="../../x/evil"))
    with pytest.raises(ArtifactError, match=r"kotune.json: meta.task='../../x/evil' is not a task preset's name"):
        KotuneModel.load(str(ck / "model"))
    for change, line in [
            ({"model_file": "../../../etc/passwd", "files": ["../../../etc/passwd"]},
             "files=['../../../etc/passwd'] is not a list of file names"),
            ({"model_file": "other.onnx"}, "model_file='other.onnx' is not one of its files (model.onnx)"),
            ({"hydra": {"callbacks": {}}}, "hydra is not a key kotune writes"),
            ({"native_class": "x; import os"}, "native_class='x; import os' is not a class name")]:
        spec = json.loads((trained / "model" / "kotune.json").read_text(encoding="utf-8"))
        export = {"format": "onnx", "head": spec["head"], "meta": spec["meta"], "files": ["model.onnx"],
                  "model_file": "model.onnx", **change}
        with pytest.raises(ArtifactError) as e:
            check_export_spec(export, "X/kotune_export.json")
        assert line in str(e.value), str(e.value)


@pytest.mark.parametrize("change,line", [
    (lambda s: s.update(head_kwargs={"num_labels": 3, "_target_": "os.system"}),
     "head_kwargs._target_ is not an argument of the sequence head"),
    (lambda s: s.update(lora={"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": None, "vocab_size": 10,
                              "base": {"model": {"name_or_path": "${oc.env:HOME}"}, "seed": 1, "vocab_size": 10}}),
     "lora.base.model.name_or_path='${oc.env:HOME}' is not a plain model option"),
    (lambda s: s.update(lora={"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": None, "vocab_size": 10,
                              "base": {"model": {"name_or_path": "org/model",
                                                 "tokenizer_kwargs": {"trust_remote_code": True}},
                                       "seed": 1, "vocab_size": 10}}),
     "lora.base.model.tokenizer_kwargs={'trust_remote_code': True} is not a plain model option"),
    (lambda s: s["meta"].update(columns={"text": {"_target_": "os.system"}}),
     "meta.columns.text={'_target_': 'os.system'} is not a column name"),
    (lambda s: s["meta"].update(max_length="128"), "meta.max_length='128' is not a positive integer"),
    (lambda s: s.update(callbacks=[]), "callbacks is not a key kotune writes"),
])
def test_every_key_of_kotune_json_is_checked(trained, tmp_path, change, line):
    from heads.model.artifact import ArtifactError
    from kotune.loading.checkpoint import read_spec

    ck = tampered_checkpoint(trained, tmp_path, change)
    with pytest.raises(ArtifactError) as e:
        read_spec(str(ck))
    assert str(e.value).startswith(f"checkpoint {ck}: model/kotune.json: ") and line in str(e.value), str(e.value)


def test_the_encoder_loader_never_trusts_a_models_code(tmp_path):
    """A LoRA checkpoint names its base encoder (a hub id or a directory): transformers is told not
    to run code that encoder's config names (``auto_map``), so it refuses rather than asking."""
    from heads.model.encoder import _from_hub_or_cache

    class Loader:
        @staticmethod
        def from_pretrained(name, **kwargs):
            return kwargs

    assert _from_hub_or_cache(Loader, str(tmp_path))["trust_remote_code"] is False
    assert _from_hub_or_cache(Loader, str(tmp_path), trust_remote_code=True)["trust_remote_code"] is True  # the user's own
