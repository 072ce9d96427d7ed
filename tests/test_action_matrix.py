"""Every action on every task and training mode: each registered task is trained once (tiny
encoder, its sample files), then every other action is tried against it, and each cell gives what another path gives,
or refuses in one line saying why:

- a rerun of a finished run (results.json lost: a crash in the final prediction, a sweep rerunning a
  failed job) = the first run, with the plain recipe and with ``train=klue`` (best checkpoint);
- a run resumed from an earlier checkpoint = the uninterrupted run (tests/test_resume.py kills one);
- ``eval`` of the checkpoint = the training run's metrics;
- ``predict`` on the dev file with its labels removed = the training run's predictions.jsonl, given
  only ``checkpoint=`` (task, task options, columns and model come from the checkpoint);
- ``score`` of the run's own predictions.jsonl = the training run's metrics;
- ``export`` writes the native class whose logits, through the task's decoding, give the training
  run's predictions; the tasks whose head has no native class (EXPORT_REFUSED) refuse in one line;
- ``ceiling`` of the tasks with an alignment to lose (CEILINGS) gives the reference alignment's
  score (lossless: 100; NER: the entities with a boundary inside a token, counted apart; QA: the
  whole tokens around each answer); the others refuse in one line;
- ``export.format=onnx``: onnxruntime's logits = the checkpoint's (1e-4) on every dev example, and
  ``predict`` from the export = the training run's predictions.jsonl; the native refusals and
  documents read as windows (ONNX_REFUSED) refuse in one line;
- ``serve``'s predictor (tests/test_serve.py runs the HTTP server) answers the dev inputs as
  ``predict`` did, or the action refuses in one line;
- ``embed`` gives a vector of the encoder's width per text;
- ``rerank`` of a pair task's model scores (query, candidate) pairs as ``predict`` does; the other
  tasks refuse in one line;
- ``label_issues`` needs a k-fold multirun's out-of-fold predictions: a plain run or a checkpoint is
  refused in one line (tests/test_label_issues.py runs it on a k-fold run);
- ``probe`` (frozen heads on two layer choices of one encoding) reads the checkpoint's hidden
  states, and its predictions score what its table says;
- ``pretrain`` on the task's training text, then fine-tuning from it (one task per head kind) starts
  from exactly the pretrained encoder.

Options that change a task's model go through the same cells as variants of their task
(``VARIANTS``): documents as windows (``task.long_text=windows``, a pair's second text), a CRF
(``task.crf``, on subwords and on characters); their ``train=klue`` runs stop early
(``train.early_stopping_patience``), so the rerun cell checks that a stopped run's rerun equals it.

``mode=lora`` goes through every cell as a variant too, on the tasks of ``LORA_TASKS``: what LoRA
changes is the encoder under the head, and no head touches the encoder (``KotuneModel`` runs it the
same way for every head and hands the head its states; heads/model/lora.py, the adapter's save and load
and export's merge never look at the head), so a sentence-pair task and a per-token one (logits of
each shape through the merge, natively and in ONNX) cover LoRA's paths, and every head kind goes
through every cell in the other modes (the rows a task adds to the vocabulary, which LoRA trains as
peft's token rows: tests/test_lora.py). Its ``train=klue`` recipe runs on ``KLUE_RECIPE_LORA`` only
(the best checkpoint's path differs between modes only in what a checkpoint holds, which the plain
recipe covers); LoRA also starts from ``pretrain``'s model for ``LORA_FROM_PRETRAINING``, read back
by ``eval``.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from conftest import assert_best_evaluation_kept, compose, encoder_inputs

SMALL = ["data=sample", "train.batch_size=16", "train.logging_steps=1"]
TINY = ["model=tiny", *SMALL]
PLAIN = TINY + ["train.max_steps=6", "train.save_strategy=steps", "train.save_steps=2", "train.save_total_limit=null"]
KLUE = TINY + ["train=klue", "train.epochs=1"]  # select_best: evaluations 4 times per epoch, the best kept
COMPARED = ("metrics", "train_loss", "best_step", "metrics_last", "early_stopping")
# variant → (its task, the options it trains and is used with); its klue run also stops early
VARIANTS = {
    "text_pair+windows": ("text_pair", ["task.long_text=windows", "train.max_length=18", "task.window_stride=1",
                                        "task.max_windows_per_batch=8"]),
    "ner+crf": ("ner", ["task.crf=true"]),
    "token_cls+crf+char": ("token_cls", ["task.crf=true", "task.decode=char"]),
}
EARLY_STOPPING = ["train.early_stopping_patience=1"]
# the README's list: heads with no native transformers class (RE's default entity-start pooling, DP's
# parser, a CRF), by task or variant
EXPORT_REFUSED = {"dp": "dependency", "dp_klue": "dependency", "re": "relation", "ner+crf": "token (crf=true)",
                  "token_cls+crf+char": "token (crf=true, units=char)"}
# ONNX: the native refusals, and documents read as windows (their logits combine outside the class)
ONNX_REFUSED = set(EXPORT_REFUSED) | {"text_pair+windows"}
# tasks whose encoding can lose gold labels (token alignment, windows); sentence tasks have none to lose
CEILINGS = {"ner", "token_cls", "mrc", "korquad", "qa", "dp", "dp_klue", "ner+crf", "token_cls+crf+char"}
# their sample words all start a token, or the decode is per character: every gold label survives
LOSSLESS = {"token_cls", "dp", "dp_klue", "token_cls+crf+char"}
KLUE_RECIPE_LORA = ("nli",)
# action=distill: the heads without soft targets, and documents read as windows (a row of several sequences)
DISTILL_REFUSED = {"dp": "dependency", "dp_klue": "dependency", "text_pair+windows": "task.long_text=windows"}
# task=sentence_embedding and its preset: a bi-encoder trained by sentence-transformers' trainer on its
# losses (kotune/embeddings/): test_a_bi_encoder_answers_every_action_or_refuses_in_one_line tries every
# action on it, tests/test_sentence_embedding.py checks what each one gives (exports, predictions, serving)
BI_ENCODER = ("sentence_embedding", "sentence_embedding_kor")
LORA_FROM_PRETRAINING = "nli"


def registered_tasks() -> list[str]:
    """Every task a user can name: conf/task/*.yaml (the registry's tasks and presets such as dp_klue),
    but the bi-encoder's (BI_ENCODER: its model trains through sentence-transformers, its cells below)."""
    from conftest import ROOT

    return sorted(p.stem for p in (ROOT / "conf" / "task").glob("*.yaml") if p.stem not in BI_ENCODER)


def one_task_per_head() -> list[str]:
    from tasks import build_task

    first: dict[str, str] = {}
    for name in registered_tasks():
        first.setdefault(build_task(compose([f"task={name}"]).task).head, name)
    return sorted(first.values())


LORA_TASKS = ("nli", "ner")  # a pair head and a token head: the module's docstring
LORA = {f"{task}+lora": (task, ["mode=lora"]) for task in LORA_TASKS}


def job(overrides: list[str], run_dir: Path, cache_dir: str) -> dict:
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    quiet_libraries()
    return execute(compose(overrides + [f"cache_dir={cache_dir}"]), str(run_dir))


def ok(res: dict) -> dict:
    assert res["status"] == "ok", res.get("error")
    return res


def refused_in_one_line(res: dict) -> str:
    assert res["status"] == "failed" and res.get("error_type") != "RuntimeError", res
    assert "traceback" not in res and "\n" not in res["error"], res["error"]
    return res["error"]


def same(a: dict, b: dict, keys=COMPARED) -> None:
    for key in keys:
        assert a.get(key) == pytest.approx(b.get(key), abs=1e-6), (key, a.get(key), b.get(key))


def copy_run(src: Path, dst: Path, keep_checkpoints: int | None = None) -> Path:
    """The run directory as a crash leaves it: no results.json, predictions or model; with
    ``keep_checkpoints``, only the checkpoints up to that step (a run killed there)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("results.json", "predictions*", "model", "hf"))
    if keep_checkpoints is not None:
        for ckpt in (dst / "checkpoints").glob("checkpoint-*"):
            if int(ckpt.name.split("-")[1]) > keep_checkpoints:
                shutil.rmtree(ckpt)
    return dst


def predictions(run_dir: Path) -> list[dict]:
    """What was predicted, row by row (without gold fields, and without ids, which files without an
    id column take from their path and line)."""
    lines = (run_dir / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("gold") and k != "id"} for line in lines]


# ---- the dev sample with its labels removed, per file format ---------------------------------
def _json_without(path: Path, out: Path, keys: tuple[str, ...]) -> None:
    rows = json.loads(path.read_text(encoding="utf-8"))
    out.write_text(json.dumps([{k: v for k, v in r.items() if k not in keys} for r in rows], ensure_ascii=False),
                   encoding="utf-8")


def _squad_without_answers(path: Path, out: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                for key in ("answers", "is_impossible", "plausible_answers"):
                    qa.pop(key, None)
    out.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def _columns_without(path: Path, out: Path, drop: tuple[int, ...], keep_header: bool) -> None:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("##"):
            lines.append(line)
            continue
        cells = line.split("\t")
        lines.append("\t".join(c for k, c in enumerate(cells) if k not in {d % len(cells) for d in drop}))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


UNLABELLED = {
    "ynat": lambda p, o: _json_without(p, o, ("label",)),
    "nli": lambda p, o: _json_without(p, o, ("gold_label", "label", "author", "label2", "label3", "label4", "label5")),
    "sts": lambda p, o: _json_without(p, o, ("labels", "annotations")),
    "re": lambda p, o: _json_without(p, o, ("label",)),
    "text_pair": None,  # JSONL: below
    "multi_label": None,  # by column name: below
    "text_cls": lambda p, o: _columns_without(p, o, (-1,), keep_header=True),
    "ner": lambda p, o: _columns_without(p, o, (-1,), keep_header=False),
    "token_cls": lambda p, o: _columns_without(p, o, (-1,), keep_header=False),
    "dp": lambda p, o: _columns_without(p, o, (4, 5), keep_header=False),
    "mrc": _squad_without_answers,
    "korquad": _squad_without_answers,
    "qa": _squad_without_answers,
}


def _named_columns_without(path: Path, out: Path, names: set[str]) -> None:
    """JSONL or a TSV with a header, without the columns ``names``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in lines if line.strip()]
        out.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in names}, ensure_ascii=False) + "\n"
                               for r in rows), encoding="utf-8")
        return
    header = lines[0].split("\t")
    keep = [k for k, name in enumerate(header) if name not in names]
    out.write_text("".join("\t".join(line.split("\t")[k] for k in keep) + "\n" for line in lines if line.strip()),
                   encoding="utf-8")


def unlabelled_dev(task_name: str, dev: Path, out_dir: Path) -> Path:
    task = compose([f"task={task_name}"]).task
    task_name = task.get("kind") or task.name  # a preset (dp_klue) reads its task's format
    out = out_dir / f"unlabelled{dev.suffix}"
    if task_name == "text_pair":
        _named_columns_without(dev, out, {"label"})
    elif task_name == "multi_label":  # every label column (the hate-speech preset has two)
        label = task.columns.label
        _named_columns_without(dev, out, {label} if isinstance(label, str) else set(label))
    else:
        UNLABELLED[task_name](dev, out)
    return out


def sample(task_name: str, split: str) -> Path:
    from tasks.splits import sample_file

    return Path(sample_file(compose([f"task={task_name}"]).task, split))


# ---- one training per task, shared by every cell ---------------------------------------------
@pytest.fixture(scope="module", params=registered_tasks() + list(VARIANTS) + list(LORA))
def trained(request, tmp_path_factory, cache_dir):
    task, options = {**VARIANTS, **LORA}.get(request.param, (request.param, []))
    lora = request.param in LORA
    root = tmp_path_factory.mktemp(f"matrix-{request.param}")
    recipes = {"plain": [f"task={task}", *options, *PLAIN]}
    if not lora or task in KLUE_RECIPE_LORA:
        recipes["klue"] = [f"task={task}", *options, *KLUE, *(EARLY_STOPPING if options and not lora else [])]
    runs = {name: ok(job(overrides, root / name, cache_dir)) for name, overrides in recipes.items()}
    if "klue" in runs:
        klue = runs["klue"]
        assert_best_evaluation_kept(root / "klue", klue)
        assert (klue["early_stopping"] is not None) == (bool(options) and not lora)
        assert not options or lora or klue["early_stopping"]["stopped_early"]  # so the rerun cell reruns a stopped run
    if lora:  # the adapter and head only: the encoder's weights stay out of every checkpoint
        assert runs["plain"]["trainable_params"] < runs["plain"]["total_params"]
        saved = load_file(str(root / "plain" / "checkpoints" / "checkpoint-6" / "model.safetensors"))
        encoder_keys = [k for k in saved if k.startswith("encoder.")]
        assert encoder_keys and all("lora_" in k or "trainable_tokens" in k for k in encoder_keys), encoder_keys
        assert not (root / "plain" / "model" / "encoder").exists() and (root / "plain" / "model" / "adapter").is_dir()
    # every other cell runs the task with the variant's options; a LoRA variant is its task's for the
    # cells that do not depend on the mode (export refusals, ceilings)
    return {"name": task if lora else request.param, "task": task, "options": [f"task={task}", *options],
            "root": root, **runs, "mode": "lora" if lora else "finetune", "recipes": recipes, "cache": cache_dir}


def newest_checkpoint(run_dir: Path) -> int:
    complete = (run_dir / "checkpoints").glob("checkpoint-*/kotune_complete.json")
    return max(int(p.parent.name.split("-")[1]) for p in complete)


def test_rerun_of_a_finished_run_gives_the_first_result(trained):
    for recipe, overrides in trained["recipes"].items():
        run_dir = copy_run(trained["root"] / recipe, trained["root"] / f"rerun-{recipe}")
        again = ok(job(overrides, run_dir, trained["cache"]))
        assert again["resumed_from"] == newest_checkpoint(run_dir)  # it did find the finished training
        same(again, trained[recipe])
        assert predictions(run_dir) == predictions(trained["root"] / recipe)


def test_a_resumed_run_ends_where_the_uninterrupted_one_ends(trained):
    run_dir = copy_run(trained["root"] / "plain", trained["root"] / "resumed", keep_checkpoints=2)
    again = ok(job(trained["recipes"]["plain"], run_dir, trained["cache"]))
    assert again["resumed_from"] == 2
    same(again, trained["plain"])


def test_eval_of_the_checkpoint_gives_the_training_runs_metrics(trained):
    run = trained["root"] / "plain"
    res = ok(job([*trained["options"], *TINY, "action=eval", f"checkpoint={run}"],
                 trained["root"] / "eval", trained["cache"]))
    same(res, trained["plain"], keys=("metrics",))


def test_predict_without_labels_gives_the_training_runs_predictions(trained):
    """Neither task= nor model= given: the checkpoint's task, task options, columns and model apply."""
    task = trained["task"]
    unlabelled = unlabelled_dev(task, sample(task, "validation"), trained["root"])
    out = trained["root"] / "predict"
    res = job(["action=predict", f"checkpoint={trained['root'] / 'plain'}", f"data.predict_file={unlabelled}"],
              out, trained["cache"])
    ok(res)
    assert (res["task"], res["model"], res["mode"]) == (task, "tiny", trained["mode"])
    assert predictions(out) == predictions(trained["root"] / "plain")
    # a tiny run often predicts one label for every row: the model also read the same inputs from both files
    setting = [*trained["options"], *TINY, f"checkpoint={trained['root'] / 'plain'}", f"cache_dir={trained['cache']}"]
    assert encoder_inputs([*setting, f"data.predict_file={unlabelled}"], "predict") == \
        encoder_inputs(setting, "validation")


def test_score_of_the_runs_own_predictions_gives_its_metrics(trained):
    task = trained["task"]
    res = ok(job([*trained["options"], *TINY, "action=score", f"data.validation_file={sample(task, 'validation')}",
                  f"score.predictions={trained['root'] / 'plain' / 'predictions.jsonl'}"],
                 trained["root"] / "score", trained["cache"]))
    same(res, trained["plain"], keys=("metrics",))


def with_native_logits(model, native):
    """``model`` (a KotuneModel) with its encoder and head replaced by an exported native class: the
    native logits in the head's layout (a span head's (start, end)), pooled over a document's
    windows as kotune pools them; its loss, prediction and decoding stay kotune's."""
    from heads.model.windows import pool_windows

    span = model.head_kind == "span"

    def logits(ids, mask, types):
        out = model.native(input_ids=ids, attention_mask=mask, **({} if types is None else {"token_type_ids": types}))
        return (out.start_logits, out.end_logits) if span else out.logits

    model.native = native
    model.tokens_logits = lambda ids, mask, types, layer_states, inputs: logits(ids, mask, types)
    model.document_logits = lambda ids, mask, types, window_doc, inputs: pool_windows(
        logits(ids, mask, types), window_doc, model.windows.pool)
    return model


def native_predictions(trained, export: dict, out: Path) -> list[dict]:
    """The dev sample's predictions.jsonl as the exported class (loaded by transformers alone) gives
    it: kotune's features in, its logits through the task's own decoding. On the way, its logits
    equal the kotune model's (1e-5, the real tokens of per-token heads)."""
    import transformers

    from kotune.loading.build import build

    from kotune.inference.predict import predict, run_report
    from kotune.training.trainer import make_trainer

    cfg = compose([*trained["options"], *TINY, f"checkpoint={trained['root'] / 'plain'}",
                   f"cache_dir={trained['cache']}"])
    b = build(cfg, ("validation",))
    rows = b.inputs["validation"]
    batch = b.collator([rows[i] for i in range(min(8, len(rows)))])
    with torch.no_grad():
        mine = b.model.eval()(**batch)["logits"]
        native = getattr(transformers, export["native_class"]).from_pretrained(export["export_dir"])
        theirs = with_native_logits(b.model, native).eval()(**batch)["logits"]
    real = batch["attention_mask"].bool()
    for a, t in zip(*((x,) if torch.is_tensor(x) else x for x in (mine, theirs))):
        if b.model.head_kind in ("token", "span"):  # kotune masks padding for decoding; the native class does not
            a, t = a[real], t[real]
        assert torch.allclose(a, t, atol=1e-5), (a - t).abs().max()
    outputs, _ = predict(make_trainer(cfg, b, str(out)), b, "validation")
    run_report(OmegaConf.merge(cfg, {"save_predictions": True}), str(out), b, "validation", outputs, {})
    return predictions(out)


def test_export_writes_the_native_class_that_predicts_as_kotune_or_refuses_in_one_line(trained):
    from transformers import AutoConfig

    name = trained["name"]
    res = job([*trained["options"], *TINY, "action=export", f"checkpoint={trained['root'] / 'plain'}"],
              trained["root"] / "export", trained["cache"])
    if name in EXPORT_REFUSED:
        assert f"the {EXPORT_REFUSED[name]} head has no native transformers class" in refused_in_one_line(res)
        return
    ok(res)
    config = AutoConfig.from_pretrained(res["export_dir"])
    assert config.num_labels == res["num_labels"] and config.architectures == [res["native_class"]]
    assert res["lora_merged"] == (trained["mode"] == "lora")
    # equal records; probabilities to 1e-5 (a merged LoRA adapter computes within the merge's 1e-4)
    same_records(native_predictions(trained, res, trained["root"] / "native"), predictions(trained["root"] / "plain"))


def same_records(ours: list[dict], theirs: list[dict]) -> None:
    """Equal records; floats (an STS score, a label's probability) to 1e-5, as batches padded
    otherwise round otherwise."""
    def close(a, b) -> bool:
        if isinstance(a, float) or isinstance(b, float):
            return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-5
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
        return a == b

    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert close(a, b), (a, b)


def real_positions(head: str, features) -> list:
    """Per dev row, the logit positions both models compute alike: all of a sequence head's, a
    token or span head's real tokens (kotune's span head masks padding, the native one does not)."""
    if head == "sequence":
        return [slice(None)] * len(features)
    return [slice(0, len(ids)) for ids in features["input_ids"]]


def test_onnx_export_gives_the_checkpoints_logits_and_predictions_or_refuses_in_one_line(trained):
    import numpy as np

    from kotune.export.onnx import OnnxModel
    from kotune.loading.build import build
    from heads.model.inference import BatchPredictor
    from kotune.inference.model_runtimes import torch_forward
    from tasks.collate import in_order, length_order

    task, run = trained["task"], trained["root"] / "plain"
    res = job([*trained["options"], *TINY, "action=export", "export.format=onnx", f"checkpoint={run}"],
              trained["root"] / "onnx", trained["cache"])
    if trained["name"] in ONNX_REFUSED:
        assert "cannot export" in refused_in_one_line(res)
        return
    ok(res)
    export = res["export_dir"]
    cfg = compose([*trained["options"], *TINY, f"checkpoint={run}", f"cache_dir={trained['cache']}"])
    b = build(cfg, ("validation",))
    rows = in_order(b.inputs["validation"], length_order(b.features["validation"]))
    collator = b.collator
    ours = BatchPredictor(torch_forward(b.model), 16, collator).predict(rows).predictions
    theirs = BatchPredictor(OnnxModel(export), 16, collator).predict(rows).predictions
    ours, theirs = (x if isinstance(x, tuple) else (x,) for x in (ours, theirs))
    places = real_positions(b.model.head_kind, rows)
    for a, t in zip(ours, theirs):
        assert a.shape == t.shape
        worst = max(float(np.abs(a[i][p] - t[i][p]).max()) for i, p in enumerate(places))
        assert worst <= 1e-4, worst

    unlabelled = unlabelled_dev(task, sample(task, "validation"), trained["root"])
    out = trained["root"] / "onnx-predict"
    ok(job([*trained["options"], *TINY, "action=predict", f"checkpoint={export}", f"data.predict_file={unlabelled}"],
           out, trained["cache"]))
    same_records(predictions(out), predictions(run))


def request_item(task, ex: dict) -> dict:
    """A dev example as the server takes it: its task's request fields."""
    if "units" in ex:
        return {"text": task.join.join(ex["units"])}
    return {k: ex[k] for k in task.request_fields}


def test_serving_answers_as_predict_or_refuses_in_one_line(trained):
    from kotune.serving.app import Predictor
    from tasks import build_task

    task, run = trained["task"], trained["root"] / "plain"
    if build_task(compose(trained["options"]).task).request_fields is None:
        res = job([*trained["options"], *TINY, "action=serve", f"checkpoint={run}"], trained["root"] / "serve",
                  trained["cache"])
        assert "action=serve" in refused_in_one_line(res)
        return
    served = Predictor(compose([*trained["options"], *TINY, f"checkpoint={run}", f"cache_dir={trained['cache']}"]))
    examples = served.b.task.read_file(str(sample(task, "validation")), labelled=False)
    answers = served(served.examples([request_item(served.b.task, ex) for ex in examples]))
    same_records([{k: v for k, v in a.items() if k != "gold"} for a in answers], predictions(run))


def test_rerank_scores_pairs_as_predict_or_refuses_in_one_line(trained):
    """``rerank`` (tests/test_rerank.py: exports, sentence-transformers' CrossEncoder): a pair task's model
    scores (the first dev text, each dev second text) as predict does (the regression value, or the
    positive label's probability); a task that reads no pairs refuses in one line."""
    from kotune.serving.app import Predictor
    from tasks import build_task, rerank

    run, root = trained["root"] / "plain", trained["root"]
    task = build_task(compose(trained["options"]).task)
    queries, candidates = root / "rerank-queries.txt", root / "rerank-candidates.txt"
    if rerank.refusal(task):
        queries.write_text("질문\n", encoding="utf-8")
        candidates.write_text("하나\n둘\n", encoding="utf-8")
        res = job([*trained["options"], *TINY, "action=rerank", f"checkpoint={run}", f"rerank.queries={queries}",
                   f"rerank.candidates={candidates}"], root / "rerank", trained["cache"])
        assert "action=rerank: task" in refused_in_one_line(res)
        return
    served = Predictor(compose([*trained["options"], *TINY, f"checkpoint={run}", f"cache_dir={trained['cache']}"]))
    examples = served.b.task.read_file(str(sample(trained["task"], "validation")), labelled=False)
    query, texts = examples[0]["text"], [ex["text_pair"] for ex in examples]
    queries.write_text(query + "\n", encoding="utf-8")
    candidates.write_text("\n".join(texts) + "\n", encoding="utf-8")
    res = ok(job([*trained["options"], *TINY, "action=rerank", f"checkpoint={run}", f"rerank.queries={queries}",
                  f"rerank.candidates={candidates}"], root / "rerank", trained["cache"]))
    ranked = json.loads(Path(res["rankings_file"]).read_text(encoding="utf-8").splitlines()[0])["ranked"]
    records = served(served.examples([{"text": query, "text_pair": t} for t in texts]))
    expected = [r["prediction"] if res["positive_label"] is None else r["probabilities"][res["positive_label"]]
                for r in records]
    assert len(ranked) == len(texts)
    for c in ranked:
        assert c["score"] == pytest.approx(expected[int(c["row"]) - 1], abs=1e-4)


def reference_qa_ceiling(task, examples: list[dict], tokenizer) -> dict:
    """Token decoding's best, worked out apart from tasks/qa.py: each answerable question's first
    valid answer widened to the whole tokens it touches (the context's own offsets), null otherwise."""
    outputs = []
    for ex in examples:
        gold = next((a for a in ex["answers"] if a["valid"]), None)
        if gold is None:
            outputs.append({"answer": ""})
            continue
        start, end = gold["answer_start"], gold["answer_start"] + len(gold["text"])
        touched = [(s, e) for s, e in tokenizer(ex["context"], return_offsets_mapping=True,
                                                add_special_tokens=False)["offset_mapping"] if s < end and e > start]
        outputs.append({"answer": ex["context"][touched[0][0]:touched[-1][1]]})
    return task.score(outputs, examples)


def test_ceiling_gives_the_reference_alignments_score_or_refuses_in_one_line(trained):
    from heads.model.encoder import load_tokenizer
    from tasks import build_task
    from tasks.splits import load_splits

    task_name = trained["task"]
    res = job([*trained["options"], *TINY, "action=ceiling"], trained["root"] / "ceiling", trained["cache"])
    if trained["name"] not in CEILINGS:
        assert "no pipeline ceiling" in refused_in_one_line(res)
        return
    metrics = ok(res)["metrics"]
    if trained["name"] in LOSSLESS:  # every score 100, no word left out (dp_klue's n_words_excluded)
        assert {k: v for k, v in metrics.items() if not k.startswith("n_")} == pytest.approx(
            {k: 100.0 for k in metrics if not k.startswith("n_")}) and metrics.get("n_words_excluded", 0) == 0
        assert len(metrics) > 1
        return
    cfg = compose([*trained["options"], *TINY])
    task = build_task(cfg.task)
    examples = load_splits(task, cfg.data, ("validation",), 42)["validation"].examples
    # the ceiling's tokenizer: model=tiny trains it on the scored file's text
    tokenizer = load_tokenizer(cfg.model, texts=list(task.training_texts(examples)), cache_dir=trained["cache"])
    if task_name == "ner":
        from test_ner import boundary_inside_token_count

        total, lost = boundary_inside_token_count(tokenizer, sample(task_name, "validation"))
        report = res["ceiling"]
        assert (report["gold_entities"], report["inexpressible"]) == (total, lost) and 0 < lost < total
        found = total - lost  # every expressible entity is found; each lost one decodes to a wrong span
        assert metrics["entity_f1_micro"] == pytest.approx(200 * found / (2 * found + lost + report["spurious"]))
    else:
        assert metrics == pytest.approx(reference_qa_ceiling(task, examples, tokenizer))
        assert 0 < metrics["exact_match"] < 100  # the sample has answers with an edge inside a token


def test_label_issues_of_a_plain_run_or_checkpoint_refuses_in_one_line(trained):
    """label_issues reads a k-fold multirun's out-of-fold predictions (tests/test_label_issues.py):
    a plain run, or a checkpoint, is refused in one line saying so."""
    run = trained["root"] / "plain"
    for given, error in ((f"label_issues.runs={run}", "is not a cross-validation fold's training run"),
                         (f"checkpoint={run}", "not a checkpoint: label_issues.runs=DIR")):
        res = job([*trained["options"], *TINY, "action=label_issues", given], trained["root"] / "label_issues",
                  trained["cache"])
        assert error in refused_in_one_line(res)


def test_distill_makes_a_student_that_is_an_ordinary_run_or_refuses_in_one_line(trained):
    """action=distill with the plain run as teacher (finetune or LoRA) and one of its two layers as
    the student: results.json gives the teacher's score on the validation split as the teacher's own
    run gave it, and eval of the student's checkpoint gives the student's metrics; the heads without
    soft targets (DP's parser) and documents read as windows (DISTILL_REFUSED) refuse in one line."""
    root, teacher = trained["root"], trained["root"] / "plain"
    options = [o for o in trained["options"] if o != "mode=lora"]  # the student trains whole, whatever its teacher
    res = job([*options, *SMALL, "action=distill", f"distill.teacher={teacher}", "distill.student_layers=1",
               "train.max_steps=2"], root / "distilled", trained["cache"])
    if trained["name"] in DISTILL_REFUSED:
        assert DISTILL_REFUSED[trained["name"]] in refused_in_one_line(res)
        return
    ok(res)
    assert res["distill"]["teacher"]["metrics"] == pytest.approx(trained["plain"]["metrics"])
    assert res["distill"]["teacher"]["mode"] == trained["mode"] and res["mode"] == "finetune"
    again = ok(job([*options, *SMALL, "action=eval", f"checkpoint={root / 'distilled'}"],
                   root / "distilled_eval", trained["cache"]))
    same(again, res, keys=("metrics",))


def test_distill_from_the_runs_onnx_export_or_refuses_in_one_line(trained):
    """action=distill with the plain run's ONNX export as teacher (its logits only; the student is
    model=): the teacher's score on the validation split is the run's, taken by onnxruntime; the
    tasks distillation refuses (DISTILL_REFUSED) refuse an export teacher in one line too."""
    if trained["name"] in ONNX_REFUSED - set(DISTILL_REFUSED):
        pytest.skip("no ONNX export of this head to teach with (the ONNX cell checks the refusal)")
    root = trained["root"]
    options = [o for o in trained["options"] if o != "mode=lora"]
    teacher = root / "distill_teacher_onnx"
    if trained["name"] not in DISTILL_REFUSED:
        ok(job([*trained["options"], *TINY, "action=export", "export.format=onnx", f"checkpoint={root / 'plain'}",
                f"export.dir={teacher}"], root / "distill_teacher_export", trained["cache"]))
    else:
        teacher = root / "plain"  # refused before the teacher's kind matters
    res = job([*options, *TINY, "action=distill", f"distill.teacher={teacher}", "train.max_steps=2"],
              root / "distilled_from_onnx", trained["cache"])
    if trained["name"] in DISTILL_REFUSED:
        assert DISTILL_REFUSED[trained["name"]] in refused_in_one_line(res)
        return
    ok(res)
    assert res["distill"]["teacher"]["source"].startswith("onnx export")
    # onnxruntime's float sums: a correlation may move in its fourth digit, a label may not change
    assert res["distill"]["teacher"]["metrics"] == pytest.approx(trained["plain"]["metrics"], rel=1e-3, abs=1e-2)


def test_embed_with_the_checkpoint(trained):
    texts = trained["root"] / "texts.txt"
    texts.write_text("서울에서 회의가 열렸다.\n오늘 날씨가 맑다.\n", encoding="utf-8")
    embedded = ok(job([*trained["options"], *TINY, "action=embed", f"checkpoint={trained['root'] / 'plain'}",
                       f"embed.input={texts}"], trained["root"] / "embed", trained["cache"]))
    from transformers import AutoTokenizer

    from heads.model.kotune_model import KotuneModel

    model_dir = str(trained["root"] / "plain" / "model")
    encoder, tokenizer = KotuneModel.load(model_dir).encoder.eval(), AutoTokenizer.from_pretrained(model_dir)
    with torch.no_grad():  # the checkpoint's encoder, its last layer's [CLS] state
        expected = encoder(**tokenizer(texts.read_text(encoding="utf-8").splitlines(), padding=True,
                                       return_tensors="pt")).last_hidden_state[:, 0].numpy()
    assert embedded["n_texts"] == 2 and embedded["dim"] == encoder.config.hidden_size
    assert (embedded["layers"], embedded["pooling"]) == ("last", "cls")
    assert np.allclose(np.load(trained["root"] / "embed" / "embeddings.npy"), expected, atol=1e-5)


def test_probe_reads_the_checkpoints_states_and_scores_what_its_table_says(trained):
    from heads.model.feature_cache import FeatureStore
    from heads.model.kotune_model import KotuneModel
    from kotune.loading.build import build

    task, run = trained["task"], trained["root"] / "probe"
    overrides = [*trained["options"], *TINY, "mode=frozen", "train.max_steps=2",
                 f"checkpoint={trained['root'] / 'plain'}"]
    res = job([*overrides, "action=probe", "probe.choices=[0,scalar_mix]"], run, trained["cache"])
    if "task.long_text=windows" in trained["options"]:  # the frozen cache probe reads holds one sequence per row
        assert "frozen feature cache" in refused_in_one_line(res)
        return
    ok(res)
    rows = {row["choice"]: row for row in res["probe"]["rows"]}
    assert list(rows) == ["0", "scalar_mix"] and len(rows["scalar_mix"]["scalar_mix"]["weights"]) == 3
    assert (run / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the cache every head read: each validation row's every hidden state, from the checkpoint's encoder
    encoder = KotuneModel.load(str(trained["root"] / "plain" / "model")).encoder.eval()
    cfg = compose([*overrides, "mode.cache=false", f"cache_dir={trained['cache']}"])
    features = build(cfg, ("train", "validation"), new_head=True).features["validation"]
    store = FeatureStore(res["cache"]["splits"]["validation"]["path"])
    assert len(store) == len(features)
    for i in range(min(3, len(features))):
        inputs = {k: torch.tensor([features[i][k]]) for k in ("input_ids", "attention_mask", "token_type_ids")
                  if k in features.column_names}
        with torch.no_grad():
            states = torch.stack(encoder(**inputs, output_hidden_states=True).hidden_states, dim=2)[0]
        assert np.allclose(store.row(i).astype(np.float32), states.numpy(), rtol=1e-3, atol=2e-3)
    # predictions.jsonl is the best row's (first) head: scored apart, it gives that row's score
    best = rows[res["probe"]["best_on_validation"]]
    scored = ok(job([*trained["options"], *TINY, "action=score", f"data.validation_file={sample(task, 'validation')}",
                     f"score.predictions={run / 'predictions.jsonl'}"], trained["root"] / "probe-score",
                    trained["cache"]))
    assert scored["metrics"][res["main_metric"]] == pytest.approx(best["scores"][0], nan_ok=True)
    assert res["metrics"] == {} and res["main_score"] is None  # the table is the result


def initial_encoders(monkeypatch) -> list[dict]:
    """The encoder of each training run started in this test, as it was before its first step."""
    import kotune.training.trainer

    seen, make = [], kotune.training.trainer.make_trainer

    def snapshot(cfg, b, run_dir, **options):
        seen.append({k: v.detach().clone() for k, v in b.model.encoder.state_dict().items()})
        return make(cfg, b, run_dir, **options)

    # action=train imports make_trainer when it runs (after the data is read): patched where it is defined
    monkeypatch.setattr(kotune.training.trainer, "make_trainer", snapshot)
    return seen


@pytest.mark.parametrize("task", one_task_per_head())
def test_pretrain_on_the_tasks_text_then_fine_tune_from_it(task, tmp_path, cache_dir, monkeypatch):
    """Task-adaptive pretraining: the task's own training text, then the task from that encoder."""
    from transformers import AutoModel

    from tasks import build_task
    from test_pretrain import assert_consistent_held_out_metrics

    built = build_task(compose([f"task={task}"]).task)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(built.training_texts(built.read_file(str(sample(task, "train"))))) + "\n",
                    encoding="utf-8")
    pretrained = ok(job(["action=pretrain", "model=tiny", "model.tokenizer.vocab_size=200", f"data.train_file={text}",
                         "train.max_steps=3", "train.max_length=64", "train.batch_size=8"], tmp_path / "pretrain",
                        cache_dir))
    assert_consistent_held_out_metrics(pretrained["metrics"])  # NaN, nothing masked, a mixed-up loss fail
    encoders = initial_encoders(monkeypatch)
    tune = [f"task={task}", *SMALL, "train.max_steps=3", "model=klue", "model.init=pretrained",
            f"model.name_or_path={pretrained['model_dir']}"]
    tuned = ok(job(tune, tmp_path / "tuned", cache_dir))
    assert math.isfinite(tuned["metrics"][compose([f"task={task}"]).task.main_metric])
    (initial,) = encoders
    saved = AutoModel.from_pretrained(pretrained["model_dir"]).state_dict()
    compared = [k for k in initial if not k.startswith("pooler.")]  # an MLM checkpoint has no pooler
    assert len(compared) > 10 and set(compared) <= set(saved)
    assert all(torch.equal(initial[k], saved[k]) for k in compared), "fine-tuning did not start from the pretrained one"
    if task == LORA_FROM_PRETRAINING:  # its model/ holds the adapter only; eval rebuilds the pretrained base
        lora = ok(job([*tune, "mode=lora"], tmp_path / "lora", cache_dir))
        again = ok(job([f"task={task}", *SMALL, "action=eval", f"checkpoint={tmp_path / 'lora'}"],
                       tmp_path / "eval", cache_dir))
        same(again, lora, keys=("metrics",))


def test_a_bi_encoder_answers_every_action_or_refuses_in_one_line(tmp_path, cache_dir):
    """task=sentence_embedding against every action: the ones that make sense for sentence vectors run
    (their results are checked in tests/test_sentence_embedding.py), the others refuse in one line
    saying why; an action added later is refused until it is thought through (kotune/embeddings/)."""
    from kotune.actions import ACTIONS
    from kotune.embeddings import OWN, REFUSED, RUNS

    bi = ["task=sentence_embedding", *TINY]
    run = ok(job([*bi, "train.max_steps=2"], tmp_path / "train", cache_dir))
    assert run["head"] == "bi_encoder"
    texts = tmp_path / "texts.txt"
    texts.write_text("서울에서 회의가 열렸다.\n오늘 날씨가 맑다.\n", encoding="utf-8")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("서울에서 회의가 열렸다.\n" * 20, encoding="utf-8")
    dev = sample("sts", "validation")
    given = {"eval": [f"checkpoint={tmp_path / 'train'}"], "embed": [f"checkpoint={tmp_path / 'train'}", f"embed.input={texts}"],
             "predict": [f"checkpoint={tmp_path / 'train'}", f"data.predict_file={dev}"],
             "export": [f"checkpoint={tmp_path / 'train'}", "export.format=sentence_transformers"],
             "pretrain": [f"data.train_file={corpus}", "train.max_steps=1", "model.tokenizer.vocab_size=25"]}
    for action in ACTIONS:
        if action in ("train", "serve"):  # trained above; served over HTTP in tests/test_sentence_embedding.py
            continue
        res = job([*bi, f"action={action}", *given.get(action, [f"checkpoint={tmp_path / 'train'}"])],
                  tmp_path / action, cache_dir)
        if action in RUNS or action in OWN:
            ok(res)
        else:
            error = refused_in_one_line(res)
            assert error.startswith(f"action={action} does not apply to task=sentence_embedding"), error
            if action in REFUSED:  # an action with a reason of its own says it
                assert REFUSED[action] in error, error
