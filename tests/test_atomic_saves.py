"""A model directory, an export and a run's outputs appear whole or not at all (kotune/core/atomic_dir.py):
a save killed midway leaves the previous model as it was (same logits), a file that differs from
the manifest is refused on load naming it, a missing directory left by a kill between two renames
is put back, a rerun never shows the earlier run's results.json beside its new outputs and removes
a dead run's temporary files, and an export directory is refused when not empty unless
``export.overwrite=true``, which replaces it whole (no stale ``model_int8.onnx`` left to load)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import ROOT, compose

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"가나다라마바사아자차카타파하", *(f"##{c}" for c in "가나다라")]
LABELS = ["a", "b", "c"]
TEXTS = ["가나다 라마", "바사 아자차", "카타 파하 가"]

# builds a tiny sequence model with seed SEED and saves it to DIR with the tokenizer in VOCAB_DIR;
# STOP=1 ends the process (os._exit, as a kill would) when the tokenizer is being saved, after the
# encoder, the head and kotune.json were written: the interrupted re-save
SAVE = textwrap.dedent("""
    import os, sys
    sys.path[:0] = [{root!r}, os.path.join({root!r}, "tests")]
    from test_atomic_saves import tiny_model, tokenizer
    tok = tokenizer({vocab!r})
    if {stop}:
        tok.save_pretrained = lambda *a, **k: os._exit(9)
    tiny_model({seed}).save({directory!r}, tok)
""")


def tokenizer(folder: str):
    from transformers import BertTokenizerFast

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "vocab.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(VOCAB) + "\n")
    return BertTokenizerFast(vocab_file=path, do_lower_case=False)


def tiny_model(seed: int):
    from transformers import BertConfig, BertModel

    from heads.model.kotune_model import KotuneModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    return KotuneModel(BertModel(config, add_pooling_layer=False), "sequence", {"num_labels": 3},
                       meta={"task": "text_cls", "labels": LABELS, "max_length": 32, "token_type_ids": True})


def logits(model_dir) -> torch.Tensor:
    from transformers import AutoTokenizer

    from heads.model.kotune_model import KotuneModel

    model = KotuneModel.load(str(model_dir)).eval()
    enc = AutoTokenizer.from_pretrained(str(model_dir))(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**enc)["logits"]


def save_in_subprocess(directory: Path, vocab: Path, seed: int, stop: bool) -> int:
    code = SAVE.format(root=str(ROOT), vocab=str(vocab), seed=seed, directory=str(directory), stop=int(stop))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == (9 if stop else 0), err[-2000:]
    return proc.pid


def dead_pid() -> int:
    """The id of a process that has ended (as a killed run's is)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def saved(tmp_path):
    """A run directory whose model/ holds a tiny model (seed 1) with its tokenizer."""
    tiny_model(1).save(str(tmp_path / "run" / "model"), tokenizer(str(tmp_path / "vocab")))
    return tmp_path / "run" / "model"


def error_of(directory) -> str:
    from heads.model.kotune_model import KotuneModel
    from kotune.core.errors import KotuneError

    with pytest.raises(KotuneError) as e:
        KotuneModel.load(str(directory))
    assert "\n" not in str(e.value)
    return str(e.value)


# ---- the model directory ----------------------------------------------------------------------
def test_a_resave_killed_midway_leaves_the_previous_model_whole_and_loadable(saved, tmp_path):
    """The issue's repro: killed after the encoder, head and kotune.json of a new model were written,
    before its tokenizer. Before: the new encoder beside the old head, loaded silently (0/471
    probabilities matched either model), or a tokenizer traceback."""
    before = logits(saved)
    assert not torch.allclose(before, tiny_model(2).eval()(**_encoded(saved))["logits"], atol=1e-4)
    pid = save_in_subprocess(saved, tmp_path / "vocab", seed=2, stop=True)
    from kotune.core.atomic_dir import HOST

    leftover = saved.parent / f"model.tmp-{HOST}-{pid}"
    assert leftover.is_dir() and (leftover / "kotune.json").exists()  # it got that far, beside model/
    assert torch.equal(logits(saved), before)  # the old model, whole (before: the new encoder and head)
    assert not leftover.exists()  # the load tidied the dead process's staging directory
    save_in_subprocess(saved, tmp_path / "vocab", seed=2, stop=False)  # a save that finishes replaces it
    after = logits(saved)
    assert not torch.allclose(after, before, atol=1e-4)
    assert sorted(os.listdir(saved.parent)) == ["model"]


def _encoded(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))(TEXTS, padding=True, return_tensors="pt")


def test_a_save_that_fails_midway_in_this_process_leaves_the_previous_model(saved, monkeypatch):
    import heads.model.kotune_model

    before = logits(saved)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(heads.model.kotune_model, "save_file", fail)  # the head, written after the encoder
    with pytest.raises(OSError):
        tiny_model(2).save(str(saved))
    assert torch.equal(logits(saved), before)
    assert sorted(os.listdir(saved.parent)) == ["model"]


def test_a_truncated_or_altered_file_is_refused_on_load_naming_it(saved):
    weights = saved / "encoder" / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size - 100)
    message = error_of(saved)
    assert message.startswith(f"{weights}: {size - 100} bytes, the manifest says {size}: an interrupted or altered save")


def test_a_file_altered_in_place_is_refused_on_load_naming_it(saved):
    head = saved / "head.safetensors"
    data = bytearray(head.read_bytes())
    data[-1] ^= 0xFF  # a weight's last byte: same size, other value
    head.write_bytes(bytes(data))
    assert error_of(saved).startswith(f"{head}: its sha256 differs from the manifest's")


def test_a_model_directory_missing_its_tokenizer_is_refused_in_one_line(saved, tmp_path, cache_dir):
    """Killed after kotune.json, before tokenizer.json (the issue): before, accepted as a model and a
    tokenizer traceback followed. The job fails in one line naming the file."""
    from kotune.cli.job import execute

    os.remove(saved / "tokenizer.json")
    assert error_of(saved).startswith(f"{saved / 'tokenizer.json'}: missing, the manifest lists it")
    res = execute(compose(["task=text_cls", "model=tiny", "data=sample", "action=eval", f"checkpoint={saved.parent}",
                           f"cache_dir={cache_dir}"]), str(tmp_path / "eval"))
    assert res["status"] == "failed" and res["error_type"] == "KotuneError", res.get("error")
    assert "tokenizer.json: missing" in res["error"] and "\n" not in res["error"]


def test_a_removed_manifest_is_refused_and_a_model_saved_before_manifests_loads_quietly(saved, caplog):
    before = logits(saved)
    os.remove(saved / "kotune_manifest.json")
    assert "no kotune_manifest.json, though its spec says one was written" in error_of(saved)
    spec = json.loads((saved / "kotune.json").read_text(encoding="utf-8"))
    del spec["manifest"]  # as kotune wrote it before manifests existed
    (saved / "kotune.json").write_text(json.dumps(spec), encoding="utf-8")
    with caplog.at_level(logging.INFO):
        assert torch.equal(logits(saved), before)
    assert not [r for r in caplog.records if "manifest" in r.getMessage() or r.levelno >= logging.WARNING]


def test_a_save_killed_between_its_two_renames_is_put_back_on_load(saved):
    """Where the two directories cannot be exchanged in one step, the old one is renamed aside before
    the new one takes its name: a kill between the two leaves no model/; the next load restores the
    whole one (the new one when its manifest was written, else the old one)."""
    from kotune.loading.checkpoint import checkpoint_model_dir

    before = logits(saved)
    os.rename(saved, saved.parent / f"model.old-{dead_pid()}")
    assert torch.equal(logits(saved), before)
    assert sorted(os.listdir(saved.parent)) == ["model"]
    os.rename(saved, saved.parent / f"model.old-{dead_pid()}")
    assert checkpoint_model_dir(str(saved.parent)) == str(saved)  # checkpoint=RUN finds it too
    assert sorted(os.listdir(saved.parent)) == ["model"]
    # both there: the finished new one wins over the old one
    tiny_model(2).save(str(saved.parent / "other"), tokenizer(str(saved.parent.parent / "vocab")))
    new_logits = logits(saved.parent / "other")
    os.rename(saved, saved.parent / f"model.old-{dead_pid()}")
    os.rename(saved.parent / "other", saved.parent / f"model.tmp-{dead_pid()}")
    assert torch.equal(logits(saved), new_logits)
    assert sorted(os.listdir(saved.parent)) == ["model"]


def test_saves_without_an_atomic_exchange_replace_the_directory_whole(saved, monkeypatch):
    import kotune.core.atomic_dir

    monkeypatch.setattr(kotune.core.atomic_dir, "_exchange", lambda a, b: False)  # e.g. not Linux
    (saved / "stale.bin").write_bytes(b"x")
    tiny_model(2).save(str(saved))
    assert not (saved / "stale.bin").exists() and (saved / "kotune_manifest.json").exists()
    assert sorted(os.listdir(saved.parent)) == ["model"]


# ---- a run's outputs ----------------------------------------------------------------------------
def test_a_rerun_never_shows_the_earlier_results_beside_its_outputs_and_clears_dead_leftovers(
        tmp_path, monkeypatch, cache_dir):
    """The issue: the old results.json (status ok) sat beside the new predictions.jsonl of a rerun
    that was killed. A job removes the earlier results.json when it starts; a dead run's temporary
    files and staging directories are removed, a live process's are not."""
    from kotune.actions import ACTIONS
    from kotune.cli.job import execute

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"status": "ok", "config_hash": "earlier", "metrics": {"f1": 1}}))
    (run / "predictions.jsonl").write_text('{"id": "old"}\n')
    dead = dead_pid()
    (run / f"predictions.jsonl.tmp{dead}").write_text('{"id": "half')
    (run / f"model.tmp-{dead}").mkdir()
    (run / f"model.tmp-{dead}" / "kotune.json").write_text("{}")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / f"results.json.tmp{live.pid}").write_text("{")  # being written by a live process: kept

        def killed_after_predictions(cfg, run_dir):
            (Path(run_dir) / "predictions.jsonl").write_text('{"id": "new"}\n')
            raise KeyboardInterrupt  # a kill: no handler of the job runs

        monkeypatch.setitem(ACTIONS, "predict", killed_after_predictions)
        cfg = compose(["task=text_cls", "model=tiny", "data=sample", "action=predict", f"cache_dir={cache_dir}"])
        with pytest.raises(KeyboardInterrupt):
            execute(cfg, str(run))
        assert (run / "predictions.jsonl").read_text() == '{"id": "new"}\n'
        assert sorted(os.listdir(run)) == ["predictions.jsonl", f"results.json.tmp{live.pid}"]  # no earlier results
    finally:
        live.kill()
        live.wait()


# ---- exports ------------------------------------------------------------------------------------
def export(checkpoint: Path, out: Path, cache_dir: str, *extra: str) -> dict:
    from kotune.cli.job import execute

    return execute(compose(["task=text_cls", "model=tiny", "action=export", f"checkpoint={checkpoint}",
                            f"export.dir={out}", f"cache_dir={cache_dir}", *extra]),
                   str(out.parent / f"job-{out.name}-{len(extra)}"))


def test_an_export_dir_that_is_not_empty_is_refused_unless_overwrite_replaces_it_whole(saved, tmp_path, cache_dir):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    res = export(saved.parent, out, cache_dir)
    assert res["status"] == "failed" and "\n" not in res["error"]
    assert res["error"] == (f"export.dir={out} exists and is not empty: set export.overwrite=true to replace it whole "
                            "(its files are removed), or choose another export.dir")
    assert sorted(os.listdir(out)) == ["notes.txt"]
    res = export(saved.parent, out, cache_dir, "export.overwrite=true")
    assert res["status"] == "ok", res.get("error")
    files = set(os.listdir(out))
    assert "notes.txt" not in files and {"config.json", "model.safetensors", "README.md", "kotune_manifest.json"} <= files
    manifest = json.loads((out / "kotune_manifest.json").read_text())
    assert set(manifest["files"]) == files - {"kotune_manifest.json"}  # the card is in it: written before the swap
    assert res["model_card"] == str(out / "README.md")
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p or ".old-" in p]


def test_an_export_into_the_checkpoint_is_refused_even_with_overwrite(saved, cache_dir):
    res = export(saved.parent, saved.parent, cache_dir, "export.overwrite=true")
    assert res["status"] == "failed" and "holds the checkpoint" in res["error"]
    assert (saved / "kotune.json").exists()


def test_a_model_file_the_onnx_export_does_not_list_is_refused_in_one_line(tmp_path):
    """An export written in place by older kotune: quantized once, exported again without
    ``export.quantize``, its model_int8.onnx stayed and ``onnx.file=model_int8.onnx`` loaded it."""
    pytest.importorskip("onnxruntime")
    from kotune.export.onnx import EXPORT_FILE, OnnxModel
    from kotune.core.errors import KotuneError

    out = tmp_path / "onnx"
    out.mkdir()
    (out / EXPORT_FILE).write_text(json.dumps({"format": "onnx", "head": "sequence", "meta": {"task": "text_cls"}, "files": ["model.onnx"],
                                               "model_file": "model.onnx"}))
    (out / "model.onnx").write_bytes(b"")
    (out / "model_int8.onnx").write_bytes(b"stale")
    for name in ("model_int8.onnx", "config.json", "../onnx/model_int8.onnx"):
        with pytest.raises(KotuneError) as e:
            OnnxModel(str(out), name)
        assert str(e.value) == f"onnx.file={name}: not a model file of the export {out} (its files: model.onnx)"


@pytest.mark.slow
def test_an_onnx_reexport_with_overwrite_leaves_no_stale_int8_and_a_changed_file_is_refused(saved, tmp_path, cache_dir):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from kotune.export.onnx import OnnxModel
    from kotune.core.errors import KotuneError

    out = tmp_path / "onnx"
    first = export(saved.parent, out, cache_dir, "export.format=onnx", "export.quantize=int8")
    assert first["status"] == "ok", first.get("error")
    assert OnnxModel(str(out)).file == "model_int8.onnx"
    again = export(saved.parent, out, cache_dir, "export.format=onnx")
    assert again["status"] == "failed" and "export.overwrite=true" in again["error"]
    again = export(saved.parent, out, cache_dir, "export.format=onnx", "export.overwrite=true", "export.quantize=null")
    assert again["status"] == "ok", again.get("error")
    assert not (out / "model_int8.onnx").exists()
    with pytest.raises(KotuneError) as e:
        OnnxModel(str(out), "model_int8.onnx")
    assert "not a model file of the export" in str(e.value)
    assert OnnxModel(str(out)).file == "model.onnx"
    with open(out / "model.onnx", "r+b") as f:  # cut short, as an interrupted copy leaves it
        f.truncate(1000)
    with pytest.raises(KotuneError) as e:
        OnnxModel(str(out))
    assert str(e.value).startswith(f"{out / 'model.onnx'}: 1000 bytes, the manifest says ")


def test_only_this_hosts_dead_processes_leftovers_are_removed(tmp_path):
    """On a file system several machines share, another host's pid says nothing here: its staging
    directory (a save that may be running there) stays; this host's dead one goes, in the host-named
    form and in the form saves had before hosts were named."""
    from kotune.core.atomic_dir import HOST, clear_leftovers

    dead = dead_pid()
    names = {"mine": f"model.tmp-{HOST}-{dead}", "before_hosts": f"export.tmp-{dead}",
             "other_host": f"model.tmp-othernode_07-{dead}"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "kotune.json").write_text("{}")
    (tmp_path / "model").mkdir()  # the saved model: the staging directories are leftovers, not its only copy
    (tmp_path / "export").mkdir()
    removed = clear_leftovers(str(tmp_path))
    assert sorted(removed) == sorted([names["mine"], names["before_hosts"]])
    assert (tmp_path / names["other_host"]).is_dir()


def test_a_save_names_its_staging_directory_by_host_and_pid(tmp_path):
    from kotune.core.atomic_dir import HOST, written_whole

    with written_whole(str(tmp_path / "model"), "kotune-model") as staging:
        assert os.path.basename(staging) == f"model.tmp-{HOST}-{os.getpid()}"
        (Path(staging) / "kotune.json").write_text("{}")
    assert sorted(os.listdir(tmp_path)) == ["model"]
