"""A checkpoint's or export's files are believed no further than their own bytes (issue 52; the spec
keys' attacks are tests/test_artifact_trust.py's): every file resolves inside the directory the user
named (a symbolic link out of it is refused), every size kotune.json gives is checked against the
weights' own shapes, read from the safetensors header before anything is built, and against the
encoder's positions, a native export's weights must be its class's, and a crafted file is the
artifact's fault: one :class:`ArtifactError` line naming the file, never "a bug, not your input?".

Each tampered directory is resealed (its manifest rewritten), as whoever crafted it would have done:
the manifest proves a save whole, not honest."""
from __future__ import annotations

import functools
import json
import math
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest

from conftest import compose, run_cli_here
from test_artifact_trust import Opener, export_like, trained  # noqa: F401 - trained: the module's checkpoint fixture

PAIR = {"text": "한 남자가 기타를 친다.", "text_pair": "사람이 악기를 연주한다."}


@pytest.fixture(scope="module")
def native(trained, tmp_path_factory) -> Path:
    """The trained checkpoint as a native export (action=export)."""
    from kotune.cli.job import execute

    out = tmp_path_factory.mktemp("native") / "hf"
    cfg = compose(["action=export", f"checkpoint={trained}", f"export.dir={out}"])
    assert execute(cfg, str(out.parent / "export-run"))["status"] == "ok"
    return out


@pytest.fixture(scope="module")
def onnx(trained, tmp_path_factory) -> Path:
    """The trained checkpoint as an ONNX export (action=export export.format=onnx)."""
    from kotune.cli.job import execute

    out = tmp_path_factory.mktemp("onnx") / "onnx"
    cfg = compose(["action=export", f"checkpoint={trained}", f"export.dir={out}", "export.format=onnx"])
    assert execute(cfg, str(out.parent / "export-run"))["status"] == "ok"
    return out


def copied(source: Path, tmp_path: Path, name: str = "ck") -> Path:
    target = tmp_path / name
    shutil.copytree(source, target, symlinks=True)
    return target


def reseal(folder: Path, kind: str = "kotune-model") -> None:
    """The manifest rewritten over the folder's files as they are now (what a crafted directory has)."""
    from kotune.core.atomic_dir import write_manifest

    write_manifest(str(folder), kind)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data, ensure_ascii=False, allow_nan=True), encoding="utf-8")


def one_line(error: BaseException) -> str:
    from heads.model.artifact import ArtifactError

    line = str(error)
    assert isinstance(error, ArtifactError), f"{type(error).__name__}: {line}"
    assert "\n" not in line and "a bug" not in line, line
    return line


def load_error(path: Path, *overrides: str) -> str:
    """The one line ``kotune.load(path)`` fails with (an ArtifactError)."""
    import kotune

    with pytest.raises(Exception) as e:
        kotune.load(path, *overrides)(PAIR)
    return one_line(e.value)


def model_error(model_dir: Path) -> str:
    from heads.model.kotune_model import KotuneModel

    with pytest.raises(Exception) as e:
        KotuneModel.load(str(model_dir))
    return one_line(e.value)


# ---- 1. symbolic links ---------------------------------------------------------------------------
def test_a_model_folder_linked_out_of_the_run_directory_is_refused(trained, tmp_path):
    """``mv RUN/model /x/m && ln -s /x/m RUN/model`` predicted ``status ok``."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(trained / "model", tmp_path / "elsewhere")
    (run / "model").symlink_to(tmp_path / "elsewhere")
    line = load_error(run)
    assert line.startswith(f"{run / 'model'} is a symbolic link to {tmp_path / 'elsewhere'}, outside {run}: "), line


@pytest.mark.parametrize("name", ["tokenizer.json", "encoder/model.safetensors", "head.safetensors", "encoder"])
def test_a_file_linked_out_of_the_checkpoint_is_refused_with_or_without_its_manifest(trained, tmp_path, name):
    """A linked ``tokenizer.json`` or weights loaded as if they were the checkpoint's; with the
    manifest gone, ``tokenizer.json → /etc/passwd`` was opened and parsed."""
    from kotune.loading.checkpoint import read_spec

    ck = copied(trained, tmp_path)
    outside = tmp_path / "outside" / os.path.basename(name)
    outside.parent.mkdir()
    shutil.move(str(ck / "model" / name), outside)
    (ck / "model" / name).symlink_to(outside)
    reseal(ck / "model")
    line = load_error(ck)
    assert f"model/{name} is a symbolic link to {outside}, outside {ck / 'model'}" in line, line
    (ck / "model" / "kotune_manifest.json").unlink()  # a save from before manifests: the link still refused
    edit_json(ck / "model" / "kotune.json", lambda spec: spec.update(manifest=False))
    with pytest.raises(Exception) as e:
        read_spec(str(ck))
    assert f"model/{name} is a symbolic link to {outside}, outside" in one_line(e.value)
    assert f"model/{name} is a symbolic link to {outside}, outside" in model_error(ck / "model")


def test_a_link_to_etc_passwd_is_refused_before_anything_opens_it(trained, tmp_path, monkeypatch):
    ck = copied(trained, tmp_path)
    (ck / "model" / "tokenizer.json").unlink()
    (ck / "model" / "tokenizer.json").symlink_to("/etc/passwd")
    (ck / "model" / "kotune_manifest.json").unlink()
    edit_json(ck / "model" / "kotune.json", lambda spec: spec.update(manifest=False))
    opened = []
    real_open = open

    def spy(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == "/etc/passwd":
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    line = load_error(ck)
    assert "model/tokenizer.json is a symbolic link to /etc/passwd, outside" in line and not opened, (line, opened)


def test_a_link_that_stays_inside_the_checkpoint_is_read(trained, tmp_path):
    """Links are judged by where they lead: one to a file of the checkpoint itself is that file."""
    import kotune

    ck = copied(trained, tmp_path)
    shutil.move(str(ck / "model" / "tokenizer.json"), ck / "model" / "encoder" / "tokenizer.json")
    (ck / "model" / "tokenizer.json").symlink_to(Path("encoder") / "tokenizer.json")
    reseal(ck / "model")
    assert kotune.load(ck)(PAIR)["prediction"] in ("entailment", "neutral", "contradiction")


def test_an_onnx_file_linked_out_of_its_export_is_refused(trained, tmp_path):
    from kotune.export.onnx import OnnxModel

    export = export_like(trained, tmp_path, lambda spec: spec.update(files=["model.onnx", "model_int8.onnx"]))
    (tmp_path / "elsewhere.onnx").write_bytes(b"not a graph")
    (export / "model_int8.onnx").symlink_to(tmp_path / "elsewhere.onnx")
    with pytest.raises(Exception) as e:
        OnnxModel(str(export), "model_int8.onnx")
    assert f"model_int8.onnx is a symbolic link to {tmp_path / 'elsewhere.onnx'}, outside {export}" in one_line(e.value)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_native_export_file_linked_out_of_it_is_refused(native, tmp_path, name):
    from kotune.distill.teacher import native_side

    export = copied(native, tmp_path, "hf")
    shutil.move(str(export / name), tmp_path / name)
    (export / name).symlink_to(tmp_path / name)
    reseal(export, "native-export")
    line = load_error(export)
    assert f"{name} is a symbolic link to {tmp_path / name}, outside {export}" in line, line
    with pytest.raises(Exception) as e:  # a distillation teacher reads it the same way
        native_side(compose(["task=nli", "model=tiny"]), str(export))
    assert f"{name} is a symbolic link" in one_line(e.value)


# ---- 2. every size against the weights' own shapes ------------------------------------------------
@pytest.mark.parametrize("labels", [["entailment"], ["a", "b", "c", "d", "e"]])
def test_label_names_must_match_the_heads_logits(trained, tmp_path, labels):
    """1 or 5 label names on a 3-logit head predicted ``status ok``, records cut to fit."""
    ck = copied(trained, tmp_path)
    edit_json(ck / "model" / "kotune.json", lambda spec: spec["meta"].update(labels=labels))
    reseal(ck / "model")
    line = load_error(ck)
    assert (f"model/kotune.json: meta.labels has {len(labels)} name{'s' if len(labels) > 1 else ''}, but the sequence "
            "head gives 3 logits (head_kwargs.num_labels, as head.safetensors' shapes say)") in line, line


def test_a_head_size_is_checked_against_the_weights_before_anything_is_allocated(trained, tmp_path, monkeypatch):
    """head_kwargs.num_labels=1e8 tried to allocate 51 GB before any shape check: the head is now
    measured against head.safetensors' header first (the guard fails the test on any real head of
    that size)."""
    import torch

    from heads.sequence import SequenceHead

    built = SequenceHead.__init__

    @functools.wraps(built)
    def guard(self, hidden_size, num_labels, *args, **kwargs):
        assert num_labels < 1000 or torch.get_default_device().type == "meta", "a 51 GB head was allocated"
        built(self, hidden_size, num_labels, *args, **kwargs)

    monkeypatch.setattr(SequenceHead, "__init__", guard)
    ck = copied(trained, tmp_path)
    edit_json(ck / "model" / "kotune.json", lambda spec: spec["head_kwargs"].update(num_labels=100_000_000))
    reseal(ck / "model")
    line = model_error(ck / "model")
    assert line == (f"{ck / 'model' / 'head.safetensors'}: out.bias is [3], but kotune.json's "
                    "head_kwargs make it [100000000] (the weights and kotune.json disagree)"), line


def test_the_length_is_checked_against_the_encoders_positions(trained, tmp_path):
    """``meta.max_length=1000000`` was accepted, and a 4,202-token text then failed the whole predict."""
    ck = copied(trained, tmp_path)
    edit_json(ck / "model" / "kotune.json", lambda spec: spec["meta"].update(max_length=1_000_000))
    reseal(ck / "model")
    line = load_error(ck)
    assert ("model/kotune.json: meta.max_length=1000000 is more than the encoder's 512 positions "
            "(encoder/config.json: max_position_embeddings)") in line, line


def test_an_onnx_exports_labels_and_length_are_checked_against_its_graph_and_config(onnx, tmp_path):
    """An export's ``meta.labels`` against its graph's logits, its ``meta.max_length`` against its
    config's positions: 5 names on a 3-logit graph, or 1,000,000 tokens on 512 positions, loaded."""
    export = copied(onnx, tmp_path, "onnx")
    edit_json(export / "kotune_export.json", lambda spec: spec["meta"].update(labels=list("abcde")))
    reseal(export, "onnx-export")
    line = load_error(export)
    assert line == (f"{export / 'kotune_export.json'}: meta.labels has 5 names, but model.onnx gives 3 logits "
                    "(its output logits: ['batch', 3])"), line
    export = copied(onnx, tmp_path, "onnx2")
    edit_json(export / "kotune_export.json", lambda spec: spec["meta"].update(max_length=1_000_000))
    reseal(export, "onnx-export")
    line = load_error(export)
    assert line == (f"{export}/kotune_export.json: meta.max_length=1000000 is more than the encoder's 512 positions "
                    "(config.json: max_position_embeddings)"), line


def test_an_onnx_file_that_is_no_graph_is_the_files_fault(trained, tmp_path):
    from kotune.export.onnx import OnnxModel

    export = export_like(trained, tmp_path, lambda spec: None)  # its model.onnx: b"not a graph"
    with pytest.raises(Exception) as e:
        OnnxModel(str(export))
    assert one_line(e.value).startswith(f"{export / 'model.onnx'}: not an ONNX graph onnxruntime runs (")


# ---- 3. a native export's weights are its class's ------------------------------------------------
def test_a_native_export_whose_class_was_changed_is_refused(native, tmp_path):
    """``architectures`` changed to another class loaded random weights (probabilities 0.33 each)."""
    export = copied(native, tmp_path, "hf")
    edit_json(export / "config.json", lambda config: config.update(architectures=["RobertaForSequenceClassification"]))
    reseal(export, "native-export")
    line = load_error(export)
    assert line.startswith(f"{export / 'model.safetensors'}: not the weights of RobertaForSequenceClassification "
                           "(config.json's architectures): missing classifier.dense.bias, "), line


@pytest.mark.parametrize("key,value,what", [
    ("vocab_size", 4_000_000, "embeddings.word_embeddings.weight is [{vocab}, 128], its config makes it [4000000, 128]"),
    ("num_hidden_layers", 1000, "missing encoder.layer.10.attention.output.LayerNorm.bias, "),
])
def test_an_encoder_config_is_checked_against_its_weights_before_it_is_built(trained, tmp_path, key, value, what):
    """``vocab_size=4000000`` in encoder/config.json made transformers allocate a 2 GB embedding
    (``num_hidden_layers=1000``: a thousand layers) before it found the weights did not fit."""
    ck = copied(trained, tmp_path)
    edit_json(ck / "model" / "encoder" / "config.json", lambda config: config.update({key: value}))
    reseal(ck / "model")
    vocab = json.loads((trained / "model" / "encoder" / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    line = model_error(ck / "model")
    assert line.startswith(f"{ck / 'model' / 'encoder' / 'model.safetensors'}: not the weights its config.json "
                           f"describes: {what.format(vocab=vocab)}"), line


def test_a_native_export_config_asking_for_more_than_its_weights_is_refused(native, tmp_path):
    export = copied(native, tmp_path, "hf")
    edit_json(export / "config.json", lambda config: config.update(num_hidden_layers=1000))
    reseal(export, "native-export")
    line = load_error(export)
    assert line.startswith(f"{export / 'model.safetensors'}: not the weights of BertForSequenceClassification "
                           "(config.json's architectures): missing bert.encoder.layer.10."), line


def test_a_native_export_missing_weights_is_refused(native, tmp_path):
    from safetensors.torch import load_file, save_file

    export = copied(native, tmp_path, "hf")
    weights = load_file(export / "model.safetensors")
    dropped = sorted(k for k in weights if k.startswith("bert.encoder.layer.1."))
    save_file({k: v for k, v in weights.items() if k not in dropped}, export / "model.safetensors",
              metadata={"format": "pt"})
    reseal(export, "native-export")
    line = load_error(export)
    assert line.startswith(f"{export / 'model.safetensors'}: not the weights of BertForSequenceClassification "
                           "(config.json's architectures): missing bert.encoder.layer.1."), line


# ---- 4. a crafted file is the artifact's fault ---------------------------------------------------
@pytest.mark.parametrize("name", ["head.safetensors", "encoder/model.safetensors"])
def test_a_pickle_saved_as_safetensors_is_the_files_fault(trained, tmp_path, name):
    ck = copied(trained, tmp_path)
    (ck / "model" / name).write_bytes(pickle.dumps(Opener(str(tmp_path / "ran"))))
    reseal(ck / "model")
    line = load_error(ck)
    assert f"{ck / 'model' / name}: not a safetensors file (" in line, line
    assert not (tmp_path / "ran").exists()


def test_a_safetensors_header_that_lies_about_its_sizes_is_refused(trained, tmp_path):
    ck = copied(trained, tmp_path)
    path = ck / "model" / "head.safetensors"
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    header["out.weight"]["shape"] = [3, 129]  # more values than its bytes hold
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size:])
    reseal(ck / "model")
    line = model_error(ck / "model")
    assert f"{path}: out.weight's shape [3, 129] of F32 needs 1548 bytes, its offsets give 1536" in line, line


@pytest.mark.parametrize("key,value,what", [
    ("hidden_dropout_prob", math.nan, "hidden_dropout_prob=nan is not a probability (0 to 1)"),
    ("attention_probs_dropout_prob", 1.5, "attention_probs_dropout_prob=1.5 is not a probability (0 to 1)"),
    ("num_attention_heads", -2, "num_attention_heads=-2 is not a positive integer"),
])
def test_a_crafted_encoder_config_is_the_files_fault(trained, tmp_path, key, value, what):
    ck = copied(trained, tmp_path)
    edit_json(ck / "model" / "encoder" / "config.json", lambda config: config.update({key: value}))
    reseal(ck / "model")
    line = load_error(ck)
    assert f"{ck / 'model' / 'encoder' / 'config.json'}: {what}" in line, line


def test_a_head_dropout_out_of_range_is_the_files_fault(trained, tmp_path):
    ck = copied(trained, tmp_path)
    edit_json(ck / "model" / "kotune.json", lambda spec: spec["head_kwargs"].update(dropout=math.nan))
    reseal(ck / "model")
    line = model_error(ck / "model")
    assert "kotune.json: head_kwargs.dropout=nan is not a probability (0 to 1)" in line, line


def test_a_crafted_checkpoint_fails_the_job_as_its_own_fault(trained, tmp_path):
    """On the command line the job's error is the file's (ArtifactError), not a bug's traceback."""
    ck = copied(trained, tmp_path)
    edit_json(ck / "model" / "kotune.json", lambda spec: spec["head_kwargs"].update(num_labels=4))
    reseal(ck / "model")
    proc = run_cli_here(["action=predict", f"checkpoint={ck}", "data=sample", f"hydra.run.dir={tmp_path / 'run'}"])
    results = json.loads((tmp_path / "run" / "results.json").read_text(encoding="utf-8"))
    assert results["error_type"] == "ArtifactError", results["error"]
    assert f"{ck / 'model' / 'head.safetensors'}: out.bias is [3], but kotune.json's head_kwargs make it [4]" in \
        results["error"]
    assert "a bug" not in proc.stderr and not (tmp_path / "run" / "traceback.txt").exists()


def test_a_native_export_with_a_crafted_config_is_the_files_fault(native, tmp_path):
    export = copied(native, tmp_path, "hf")
    edit_json(export / "config.json", lambda config: config.update(hidden_dropout_prob=math.nan))
    reseal(export, "native-export")
    line = load_error(export)
    assert f"{export / 'config.json'}: hidden_dropout_prob=nan is not a probability (0 to 1)" in line, line


# ---- 5. tests that can fail (issue 53) -----------------------------------------------------------
def test_code_keys_at_the_top_of_the_lora_base_record_are_refused(trained, tmp_path):
    """``lora.base.model.trust_remote_code: true`` would let the rebuilt base run its hub code."""
    from heads.model.artifact import check_model_spec

    spec = json.loads((trained / "model" / "kotune.json").read_text(encoding="utf-8"))
    for key, value in [("trust_remote_code", True), ("code_revision", "main"), ("auto_map", "x.Y")]:
        lora = {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": None, "vocab_size": 10,
                "base": {"model": {"name_or_path": "org/model", key: value}, "seed": 1, "vocab_size": 10}}
        with pytest.raises(Exception) as e:
            check_model_spec({**spec, "lora": lora}, "X/kotune.json")
        assert one_line(e.value) == f"X/kotune.json: lora.base.model.{key}={value!r} is not a plain model option"
    plain = {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": None, "vocab_size": 10,
             "base": {"model": {"name_or_path": "org/model", "revision": "main"}, "seed": 1, "vocab_size": 10}}
    assert check_model_spec({**spec, "lora": plain}, "X/kotune.json")["lora"] == plain


def test_the_plugin_a_checkpoint_names_is_never_imported(trained, tmp_path, monkeypatch):
    """``meta.plugin`` names a module on sys.path whose import would leave a marker: the checkpoint
    is refused in one line, and the module is never imported (by the API or the command line)."""
    marker = tmp_path / "imported"
    package = tmp_path / "path"
    package.mkdir()
    (package / "kotune_marker_plugin.py").write_text(f"open({str(marker)!r}, 'w').close()\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(package))
    ck = copied(trained, tmp_path)
    edit_json(ck / "model" / "kotune.json", lambda spec: spec["meta"].update(plugin="kotune_marker_plugin"))
    reseal(ck / "model")
    expected = (f"checkpoint {ck}: model/kotune.json: its task 'nli' comes from the plug-in 'kotune_marker_plugin', "
                "which is not loaded here: install its package (entry point kotune.plugins), or add "
                "plugins=[kotune_marker_plugin]")
    assert load_error(ck) == expected
    proc = run_cli_here(["action=predict", f"checkpoint={ck}", "data=sample", f"hydra.run.dir={tmp_path / 'run'}"])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and errors == [f"error: {expected}"], proc.stderr[-1500:]
    assert not marker.exists() and "kotune_marker_plugin" not in sys.modules
    __import__("kotune_marker_plugin")  # the marker works: importing it is what the checks never do
    assert marker.exists()
    del sys.modules["kotune_marker_plugin"]
