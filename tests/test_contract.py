"""The task↔head contract, checked for every registered task: the head kind's label fields are
defined once (the head class's label_fields, which the task's agree with), the task encodes exactly the columns its head reads, and a
collated batch of real features trains the head. Plus: one results.json schema for every action."""
from __future__ import annotations

import math

import pytest

from conftest import compose

TOKEN_FIXTURE = "서울\tB-LC\n에\tO\n갔다\tO\n\n김\tB-PS\n철수\tI-PS\n왔다\tO\n"


def sample_train_file(task_name: str, tmp_path) -> str:
    from tasks.splits import sample_file
    from kotune.core.errors import ConfigError

    try:
        return sample_file(compose([f"task={task_name}"]).task, "train")
    except ConfigError:  # tasks that read any user file ship no sample: a hand-written one
        path = tmp_path / "train.conll"
        path.write_text(TOKEN_FIXTURE * 3, encoding="utf-8")
        return str(path)


def registered_tasks() -> list[str]:
    from tasks import TASKS

    return sorted(TASKS)


@pytest.mark.parametrize("task_name", registered_tasks())
def test_every_task_feeds_its_head(task_name, tmp_path, cache_dir):
    import torch

    from heads.registry import HEADS
    from heads.model.encoder import load_encoder, load_tokenizer
    from heads.model.kotune_model import KotuneModel
    from tasks import build_task
    from tasks.base import MODEL_INPUTS, EncodeSettings
    from tasks.collate import DynamicPaddingCollator

    cfg = compose([f"task={task_name}", "model=tiny", f"cache_dir={cache_dir}"])
    task = build_task(cfg.task)
    task.use_columns(cfg.data)
    examples = task.read_file(sample_train_file(task_name, tmp_path))
    task.fit_labels(examples)
    assert HEADS.get(task.head).label_fields == task.label_fields, "the head reads other label keys"
    tokenizer = load_tokenizer(cfg.model, texts=list(task.training_texts(examples)), cache_dir=cache_dir)
    features = task.encode(examples, tokenizer, EncodeSettings(max_length=256, token_type_ids=True))
    columns = task.model_columns(features)
    assert set(task.label_fields) <= set(columns), "training features lack the head's labels"
    encoder = load_encoder(cfg.model, vocab_size=len(tokenizer), seed=0)
    model = KotuneModel(encoder, task.head, task.head_kwargs())
    if getattr(task, "runner", None) == "sentence_transformers":  # a bi-encoder: sentence-transformers' loss
        return assert_the_bi_encoder_trains(task, examples, model, tokenizer)
    batch = DynamicPaddingCollator(tokenizer.pad_token_id, 1)([features.select_columns(columns)[i]
                                                               for i in range(min(4, len(features)))])
    assert set(columns) == {*MODEL_INPUTS, *model.head.label_fields, *model.head.extra_inputs} & set(features.column_names) \
        and set(model.head.label_fields) | set(model.head.extra_inputs) <= set(columns), "the head's contract"
    out = model(**batch)  # every column the task sends is an input the head takes, or a label
    assert "loss" in out and math.isfinite(float(out["loss"].detach()))
    out["loss"].backward()
    assert any(p.grad is not None and torch.any(p.grad != 0) for p in model.head.parameters())


def assert_the_bi_encoder_trains(task, examples, model, tokenizer) -> None:
    """task=sentence_embedding: its head pools (no weights, no loss of its own); the training rows the
    task reads, through the loss their shape picks, give a finite loss whose gradient reaches the
    encoder, and the head's vectors are the SentenceTransformer's (kotune/embeddings/)."""
    import torch

    from heads.model.sentence_transformer import from_kotune_model
    from kotune.embeddings.train import loss_for, training_dataset
    from tasks.sentence_embedding import shape_of

    assert task.label_fields == () and not list(model.head.parameters())
    st = from_kotune_model(model, tokenizer, device="cpu")
    loss, _ = loss_for(task, st, shape_of(examples))
    rows = training_dataset(task, examples).select(range(4))
    texts = [c for c in rows.column_names if c != "score"]
    features = [st.tokenize(list(rows[c])) for c in texts]
    value = loss(features, torch.tensor(list(rows["score"])) if "score" in rows.column_names else None)
    assert math.isfinite(float(value.detach()))
    value.backward()
    assert any(p.grad is not None and torch.any(p.grad != 0) for p in model.encoder.parameters())
    first = list(rows[texts[0]])
    batch = tokenizer(first, padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = model.eval()(**batch)["logits"]
    assert torch.allclose(ours, st.encode(first, convert_to_tensor=True), atol=1e-5)


def test_train_eval_and_predict_write_one_schema(run_job, tmp_path):
    from kotune.inference.predict import REPORT_KEYS

    trained = run_job(["task=nli", "model=tiny", "data=sample", "train.max_steps=3"], "train")
    evaluated = run_job(["task=nli", "model=tiny", "data=sample", "action=eval",
                         f"checkpoint={tmp_path / 'train'}"], "eval")
    predicted = run_job(["task=nli", "model=tiny", "data=sample", "action=predict",
                         f"checkpoint={tmp_path / 'train'}",
                         "data.predict_file=" + sample_train_file("nli", tmp_path).replace("train.", "dev.")], "predict")
    for res in (trained, evaluated, predicted):
        assert res["status"] == "ok", res.get("error")
        assert set(REPORT_KEYS) <= res.keys()
    assert trained.keys() == evaluated.keys() == predicted.keys()
    assert evaluated["max_length"] == trained["max_length"] and evaluated["pooling"] == trained["pooling"]
    assert evaluated["metrics"] == pytest.approx(trained["metrics"])
    rows = open(predicted["predictions_file"], encoding="utf-8").read().splitlines()
    assert predicted["n_predict"] == len(rows) == trained["n_eval"] == 21  # the sample's dev rows, each predicted


def test_checkpoint_options_error_or_saved(run_job, tmp_path, capsys):
    trained = run_job(["task=ner", "model=tiny", "data=sample", "train.max_steps=2"], "train")
    assert trained["status"] == "ok", trained.get("error")
    ckpt = f"checkpoint={tmp_path / 'train'}"
    other_head = run_job(["task=ner", "model=tiny", "data=sample", "action=eval", ckpt, "task.decode=char"], "e1")
    assert other_head["status"] == "failed" and other_head["error"] == (
        f"task=ner: checkpoint {tmp_path / 'train'} has a 'token' head, this task with these options needs "
        "'token (units=char)' (leave the task options out: the checkpoint's apply)")
    capsys.readouterr()
    saved = run_job(["task=ner", "model=tiny", "data=sample", "action=eval", ckpt, "task.label_subwords=all"], "e2")
    assert saved["status"] == "ok", saved.get("error")
    assert "was trained with task.label_subwords=first; using it (requested all)" in capsys.readouterr().out
    assert saved["metrics"] == pytest.approx(trained["metrics"])  # the saved label_subwords was used


def test_an_unexpected_error_leaves_its_traceback_in_the_run_dir(tmp_path, monkeypatch):
    import json

    from kotune.actions import ACTIONS
    from kotune.cli.job import execute

    def boom(cfg, run_dir):
        raise RuntimeError("kaboom")

    monkeypatch.setitem(ACTIONS, "train", boom)
    res = execute(compose(["task=nli", "model=tiny", "data=sample"]), str(tmp_path / "job"))
    assert res["status"] == "failed" and "kaboom" in res["error"] and "traceback.txt" in res["error"]
    assert "RuntimeError: kaboom" in (tmp_path / "job" / "traceback.txt").read_text()
    assert json.loads((tmp_path / "job" / "results.json").read_text())["traceback"].endswith("traceback.txt")
    with pytest.raises(RuntimeError):
        execute(compose(["task=nli", "model=tiny", "data=sample", "keep_going_on_bugs=false"]),
                    str(tmp_path / "job2"))


def test_a_checkpoint_read_with_nothing_asked_says_one_true_thing(run_job, tmp_path, capsys):
    """Only ``checkpoint=``: the log says what is taken from the checkpoint and warns of nothing the
    user did not ask for (it once said an override would win, then 'using it (requested 128)' for
    a default nobody gave); a max_length asked for is named as not used."""
    trained = run_job(["task=text_cls", "model=tiny", "data=sample", "train.max_steps=1", "train.max_length=64",
                       "task.long_text=windows"], "train")
    assert trained["status"] == "ok", trained.get("error")
    capsys.readouterr()
    plain = run_job(["action=eval", f"checkpoint={tmp_path / 'train'}", "data=sample"], "eval")
    assert plain["status"] == "ok", plain.get("error")
    said = [line for line in capsys.readouterr().out.splitlines() if "checkpoint" in line]
    assert [line for line in said if line.startswith("[kotune] checkpoint ")] == [
        f"[kotune] checkpoint {tmp_path / 'train'}: task=text_cls model=tiny mode=finetune ++task.long_text='windows' "
        "++task.window_stride=32 ++task.window_pool='mean' train.max_length=64 (as it was trained)"]
    assert not [line for line in said if "warning" in line], said
    asked = run_job(["action=eval", f"checkpoint={tmp_path / 'train'}", "data=sample", "train.max_length=128"], "e2")
    assert asked["status"] == "ok" and asked["max_length"] == 64, asked.get("error")
    assert (f"warning: checkpoint {tmp_path / 'train'} was trained with max_length=64: reading with it, not the "
            "max_length=128 asked for") in capsys.readouterr().out
