"""action=distill: the soft-target losses per head kind, the layer choice and copy, the teacher's
logits cached once and equal to the teacher's own, the student as an ordinary run (eval, predict,
ONNX int8 export, results.json naming its teacher and the teacher's score on the same split), and
each bad input refused in one line. tests/test_action_matrix.py distils every task's run."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import compose

TINY = ["model=tiny", "data=sample", "train.batch_size=16", "train.max_steps=6"]


def refused_in_one_line(res: dict) -> str:
    assert res["status"] == "failed" and "traceback" not in res and "\n" not in res["error"], res
    return res["error"]


# ---- losses ----------------------------------------------------------------------------------
def rows(logits: torch.Tensor) -> torch.Tensor:
    """Per-example logits as the cache stores them: [B, 1, 1, C]."""
    return logits[:, None, None, :]


@pytest.mark.parametrize("kind", ["classes", "sigmoid", "regression"])
def test_per_example_soft_targets_vanish_only_at_the_teachers_logits(kind):
    from heads.distill.loss import soft_target_count, soft_target_sum

    torch.manual_seed(0)
    width = 1 if kind == "regression" else 3
    teacher = torch.randn(4, width)
    labels = {"labels": torch.zeros(4, width) if kind == "sigmoid" else torch.zeros(4)}
    same = soft_target_sum(kind, teacher.clone(), rows(teacher), labels, 2.0)
    other = soft_target_sum(kind, teacher + torch.randn(4, width), rows(teacher), labels, 2.0)
    assert same.item() == pytest.approx(0.0, abs=1e-6) and other.item() > 1e-3
    assert soft_target_count(kind, labels, rows(teacher)).item() == (12 if kind == "sigmoid" else 4)


def test_the_classes_loss_is_hintons_t_squared_kl():
    from heads.distill.loss import soft_target_sum

    student, teacher, t = torch.tensor([[1.0, 0.0, -1.0]]), torch.tensor([[0.0, 2.0, 0.5]]), 3.0
    p = torch.softmax(teacher / t, -1)
    expected = t * t * (p * (torch.log(p) - torch.log_softmax(student / t, -1))).sum()
    assert soft_target_sum("classes", student, rows(teacher), {"labels": torch.zeros(1)}, t).item() == \
        pytest.approx(expected.item(), rel=1e-5)


def kl(p: list[float], q: list[float]) -> float:
    """KL(p ‖ q) by hand."""
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def soft(z: list[float], t: float) -> list[float]:
    e = [math.exp(v / t) for v in z]
    return [v / sum(e) for v in e]


def test_token_sigmoid_and_span_losses_are_t_squared_kl_by_hand():
    """Each soft-target loss keeps Hinton's T² (the soft gradients' scale as T changes), checked
    against KLs computed by hand at T = 2: per labelled position (token), per label's two outcomes
    (sigmoid), over the start and the end positions, half each (span)."""
    from heads.distill.loss import soft_target_sum

    t = 2.0
    # token: two positions, the second unlabelled (skipped)
    student, teacher = [[1.0, 0.0, -1.0], [3.0, 0.0, 0.0]], [[0.0, 2.0, 0.5], [0.0, 0.0, 0.0]]
    got = soft_target_sum("positions", torch.tensor([student]), torch.tensor([teacher]).unsqueeze(2),
                          {"labels": torch.tensor([[1, -100]])}, t).item()
    assert got == pytest.approx(t * t * kl(soft(teacher[0], t), soft(student[0], t)), rel=1e-5)
    # sigmoid: two labels, each a two-outcome KL
    s, z = [0.5, -1.0], [2.0, 1.0]
    two = [kl([1 / (1 + math.exp(-a / t)), 1 - 1 / (1 + math.exp(-a / t))],
              [1 / (1 + math.exp(-b / t)), 1 - 1 / (1 + math.exp(-b / t))]) for a, b in zip(z, s)]
    got = soft_target_sum("sigmoid", torch.tensor([s]), rows(torch.tensor([z])), {"labels": torch.zeros(1, 2)}, t).item()
    assert got == pytest.approx(t * t * sum(two), rel=1e-5)
    # span: one answered row, three positions; the start and the end each weigh a half
    start_s, end_s, start_t, end_t = [1.0, 0.0, 0.5], [0.0, 1.0, 2.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0]
    teacher_span = torch.tensor([[start_t, end_t]]).transpose(1, 2).unsqueeze(2)  # [1, L, 1, 2]
    got = soft_target_sum("span", (torch.tensor([start_s]), torch.tensor([end_s])), teacher_span,
                          {"start_positions": torch.tensor([0])}, t).item()
    expected = t * t * (kl(soft(start_t, t), soft(start_s, t)) + kl(soft(end_t, t), soft(end_s, t))) / 2
    assert got == pytest.approx(expected, rel=1e-5)


def test_token_soft_targets_count_labelled_positions_only():
    from heads.distill.loss import soft_target_count, soft_target_sum

    torch.manual_seed(0)
    teacher = torch.randn(2, 5, 4)
    labels = torch.tensor([[-100, 1, 2, -100, -100], [-100, 0, 0, 3, -100]])
    student = teacher.clone()
    student[labels == -100] = torch.randn(5, 4) * 5  # unlabelled positions (specials, padding, subwords) do not count
    assert soft_target_sum("positions", student, teacher.unsqueeze(2), {"labels": labels}, 1.0).item() == \
        pytest.approx(0.0, abs=1e-6)
    student[0, 1, 0] += 1.0
    assert soft_target_sum("positions", student, teacher.unsqueeze(2), {"labels": labels}, 1.0).item() > 1e-3
    assert soft_target_count("positions", {"labels": labels}, teacher.unsqueeze(2)).item() == 5


def test_span_soft_targets_read_real_positions_of_answered_rows():
    from heads.distill.loss import soft_target_sum
    from heads.span import MASKED

    torch.manual_seed(0)
    start, end = torch.randn(2, 6), torch.randn(2, 6)
    start[:, 4:], end[:, 4:] = MASKED, MASKED  # padding
    teacher = torch.stack([start, end], -1).unsqueeze(2).clone()
    teacher[:, 4:] = 0.0  # the collator pads cached rows with zeros: they must not count as positions
    labels = {"start_positions": torch.tensor([1, -100]), "end_positions": torch.tensor([2, -100])}
    assert soft_target_sum("span", (start, end), teacher, labels, 2.0).item() == pytest.approx(0.0, abs=1e-5)
    moved = (start.clone(), end.clone())
    moved[0][1, 0] += 3.0  # the unanswered row does not count
    assert soft_target_sum("span", moved, teacher, labels, 2.0).item() == pytest.approx(0.0, abs=1e-5)
    moved[0][0, 0] += 3.0
    assert soft_target_sum("span", moved, teacher, labels, 2.0).item() > 1e-3


# ---- students --------------------------------------------------------------------------------
def test_attention_loss_counts_real_queries_and_vanishes_at_the_teachers_maps():
    from heads.distill.loss import attention_sum

    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    teacher = torch.softmax(torch.randn(2, 2, 4, 4).masked_fill(mask[:, None, None, :] == 0, -1e9), -1)
    student = teacher.clone()
    student[0, :, 3] = torch.rand(2, 4)  # a padded query's row does not count
    student[1, :, 2:] = torch.rand(2, 2, 4)
    assert attention_sum([student], [teacher], mask).item() == pytest.approx(0.0, abs=1e-7)
    student[0, 1, 0, 0] += 0.5  # one head of one real query: 0.5² summed over keys, averaged over 2 heads
    assert attention_sum([student, teacher], [teacher, teacher], mask).item() == pytest.approx(0.125, rel=1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_student_identical_to_its_teacher_has_no_attention_loss_with_dropout_on(attention):
    """TinyBERT matches the attention maps before attention dropout: in training, the maps a layer
    returns are dropped out (zeros, the rest scaled by 1 / (1 − p)), and a student identical to its
    teacher (evaluation, no dropout) would have a loss of about p² · 0.1 / 0.9 per entry."""
    import copy

    from transformers import BertConfig, BertModel

    from heads.distill.loss import attention_sum
    from kotune.distill.trainer import AttentionMaps

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)
    config._attn_implementation = attention
    teacher = BertModel(config, add_pooling_layer=False).eval()
    student = copy.deepcopy(teacher).train()
    student_maps, teacher_maps = AttentionMaps(student, training_only=True), AttentionMaps(teacher, recording=False)
    ids, mask = torch.randint(0, 50, (2, 6)), torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    student(input_ids=ids, attention_mask=mask)
    with torch.no_grad(), teacher_maps.record():
        reference = teacher(input_ids=ids, attention_mask=mask, output_attentions=attention == "eager")
    assert len(student_maps) == len(teacher_maps) == 2
    assert attention_sum(student_maps, teacher_maps, mask).item() == pytest.approx(0.0, abs=1e-6)
    if attention == "eager":  # the teacher's maps are those transformers returns in evaluation
        for ours, theirs in zip(teacher_maps, reference.attentions):
            torch.testing.assert_close(ours * mask[:, None, :, None], theirs * mask[:, None, :, None])
    teacher(input_ids=ids, attention_mask=mask)  # outside the loss (the teacher's own score): nothing kept
    assert len(teacher_maps) == 2
    student.eval()(input_ids=ids, attention_mask=mask)  # evaluation keeps none
    assert len(student_maps) == 2


def test_one_process_on_several_gpus_is_refused_in_one_line():
    """DataParallel scatters the batch and with it the step's loss counts: torchrun (DDP) is asked for."""
    from types import SimpleNamespace

    from kotune.core.errors import ConfigError
    from kotune.distill.trainer import DistillLoss, DistillTrainer

    with pytest.raises(ConfigError, match="torchrun --nproc_per_node=2") as e:
        DistillTrainer.use(SimpleNamespace(args=SimpleNamespace(n_gpu=2)), DistillLoss("classes", 2.0, 0.5))
    assert "\n" not in str(e.value)


def test_layer_choices():
    from heads.distill.student import choose_layers
    from kotune.core.errors import ConfigError

    assert choose_layers("spread", 12, 6) == [0, 2, 4, 7, 9, 11]  # DistilBERT's extraction
    assert choose_layers("spread", 12, 4) == [0, 4, 7, 11]
    assert choose_layers("first", 12, 3) == [0, 1, 2] and choose_layers("last", 12, 2) == [10, 11]
    assert choose_layers([5, 1], 12, 2) == [1, 5]
    for bad in (("spread", 2, 3), ("spread", 2, 0), ([1, 1], 4, 2), ([7], 4, 1), ("middle", 4, 2)):
        with pytest.raises(ConfigError):
            choose_layers(*bad)


def test_copied_layers_are_the_teachers():
    from transformers import BertConfig, BertModel

    from heads.distill.student import copy_layers, narrow_encoder

    torch.manual_seed(0)
    teacher = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
                                   intermediate_size=32), add_pooling_layer=False).eval()
    whole = copy_layers(teacher, [0, 1, 2, 3]).eval()
    ids = torch.randint(0, 50, (2, 7))
    torch.testing.assert_close(whole(input_ids=ids).last_hidden_state, teacher(input_ids=ids).last_hidden_state)
    student = copy_layers(teacher, [0, 3])
    assert student.config.num_hidden_layers == 2 and teacher.config.num_hidden_layers == 4
    torch.testing.assert_close(student.encoder.layer[1].output.dense.weight, teacher.encoder.layer[3].output.dense.weight)
    assert student.encoder.layer[1].output.dense.weight.data_ptr() != teacher.encoder.layer[3].output.dense.weight.data_ptr()
    narrow = narrow_encoder(teacher.config, 8, 1, seed=0)
    assert (narrow.config.hidden_size, narrow.config.num_attention_heads, narrow.config.num_hidden_layers,
            narrow.config.intermediate_size, narrow.config.vocab_size) == (8, 1, 1, 16, 50)


# ---- runs -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def teacher(tmp_path_factory, cache_dir) -> dict:
    from kotune.cli.job import execute

    root = tmp_path_factory.mktemp("distill")
    res = execute(compose(["task=text_cls", *TINY, f"cache_dir={cache_dir}"]), str(root / "teacher"))
    assert res["status"] == "ok", res.get("error")
    return {"dir": root / "teacher", "res": res, "root": root}


def distil(run_job, teacher: dict, *extra: str, name: str = "student") -> dict:
    return run_job(["action=distill", f"distill.teacher={teacher['dir']}", "data=sample", "train.batch_size=16",
                    "train.max_steps=6", *extra], name)


def test_a_student_names_its_teacher_and_the_teachers_score(run_job, teacher, tmp_path):
    from tasks.splits import sample_file

    res = distil(run_job, teacher, "distill.student_layers=1")
    assert res["status"] == "ok", res.get("error")
    d = res["distill"]
    assert d["teacher"]["path"] == str(teacher["dir"]) and len(d["teacher"]["digest"]) == 64
    assert d["teacher"]["metrics"] == pytest.approx(teacher["res"]["metrics"])  # the same split, the same score
    assert d["layer_map"] == [0] and d["student"]["layers"] == 1 and d["teacher"]["layers"] == 2
    assert res["task"] == "text_cls" and res["total_params"] < teacher["res"]["total_params"]
    # an ordinary run: eval of its checkpoint gives its metrics; predict and an int8 ONNX export read it
    again = run_job([f"checkpoint={tmp_path / 'student'}", "action=eval", "data=sample"], "eval")
    assert again["metrics"] == pytest.approx(res["metrics"])
    onnx = run_job([f"checkpoint={tmp_path / 'student'}", "action=export", "export.format=onnx",
                    "export.quantize=int8", f"export.dir={tmp_path / 'onnx'}"], "export")
    assert onnx["status"] == "ok", onnx.get("error")
    dev = sample_file(compose(["task=text_cls"]).task, "validation")
    for checkpoint in ("student", "onnx"):
        predicted = run_job([f"checkpoint={tmp_path / checkpoint}", "action=predict", f"data.predict_file={dev}"],
                            f"predict_{checkpoint}")
        assert predicted["status"] == "ok" and predicted["n_predict"] == res["n_eval"], predicted.get("error")
    fp32 = [json.loads(line)["prediction"] for line in (tmp_path / "predict_student" / "predictions.jsonl").open()]
    int8 = [json.loads(line)["prediction"] for line in (tmp_path / "predict_onnx" / "predictions.jsonl").open()]
    assert np.mean([a == b for a, b in zip(fp32, int8)]) >= 0.8


def test_teacher_logits_are_computed_once_and_are_the_teachers(run_job, teacher, monkeypatch):
    from heads.model import feature_cache
    from heads.model.feature_cache import FeatureStore
    from heads.model.kotune_model import KotuneModel

    builds = []
    real_build = feature_cache._build
    monkeypatch.setattr(feature_cache, "_build", lambda *a, **k: builds.append(1) or real_build(*a, **k))
    import heads.distill.teacher_cache as teacher_cache

    monkeypatch.setattr(teacher_cache, "_build", feature_cache._build)
    first = distil(run_job, teacher, "distill.student_layers=1", "distill.temperature=3", name="a")
    second = distil(run_job, teacher, "distill.student_layers=2", "distill.alpha=0.9", name="b")
    assert [first["distill"]["cache"]["splits"]["train"]["status"],
            second["distill"]["cache"]["splits"]["train"]["status"]] in (["miss", "hit"], ["hit", "hit"])
    assert len(builds) <= 1 and second["train_loss"] != first["train_loss"]
    store = FeatureStore(first["distill"]["cache"]["splits"]["train"]["path"])
    model = KotuneModel.load(str(teacher["dir"] / "model")).eval()
    from kotune.loading.build import build

    b = build(compose(["task=text_cls", "data=sample", f"checkpoint={teacher['dir']}",
                       f"cache_dir={first['config']['cache_dir']}"]), ("train",))
    for i in range(3):
        row = b.inputs["train"][i]
        with torch.no_grad():
            logits = model(**{k: torch.tensor([row[k]]) for k in ("input_ids", "attention_mask", "token_type_ids")
                              if k in row})["logits"]
        np.testing.assert_allclose(store.row(i)[0, 0], logits[0].numpy(), atol=1e-5)


def test_students_from_a_preset_or_narrower_and_hidden_matching(run_job, teacher):
    preset = distil(run_job, teacher, "model=tiny", name="preset")  # the tiny tokenizer of the same text
    narrow = distil(run_job, teacher, "distill.student_hidden=64", "distill.student_layers=1", name="narrow")
    matched = distil(run_job, teacher, "distill.student_layers=1", "distill.hidden_weight=1", name="hidden")
    attention = distil(run_job, teacher, "distill.student_layers=1", "distill.hidden_weight=1",
                       "distill.attention_weight=1", name="attention")
    for res in (preset, narrow, matched, attention):
        assert res["status"] == "ok", res.get("error")
    assert attention["distill"]["attention_weight"] == 1.0 and attention["train_loss"] > matched["train_loss"]
    assert preset["distill"]["student"]["init"] == "model=tiny" and preset["distill"]["layer_map"] is None
    assert narrow["distill"]["student"]["hidden"] == 64 and narrow["distill"]["student"]["layers"] == 1
    assert matched["distill"]["hidden_weight"] == 1.0 and matched["distill"]["layer_map"] == [0]


def test_unlabelled_text_is_labelled_by_the_teacher(run_job, teacher, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("정말 좋은 영화였다\n\n별로였어요 진짜\n그냥 그래요\n최고의 작품\n", encoding="utf-8")
    res = distil(run_job, teacher, "distill.student_layers=1", f"distill.unlabeled_file={corpus}",
                 "distill.unlabeled_ratio=0.03")
    assert res["status"] == "ok", res.get("error")
    assert res["distill"]["n_unlabeled"] == 2 and res["distill"]["cache"]["splits"]["train"]["rows"] == res["n_train"] + 2


def test_bad_inputs_are_refused_in_one_line(run_job, teacher, tmp_path):
    from tasks.splits import sample_file

    assert "the teacher has 2 layer(s)" in refused_in_one_line(distil(run_job, teacher, "distill.student_layers=3"))
    assert "task=text_cls" in refused_in_one_line(distil(run_job, teacher, "distill.student_layers=1", "task=nli"))
    assert "tokenizer" in refused_in_one_line(distil(run_job, teacher, "model=tiny", "model.tokenizer.vocab_size=300"))
    assert "distill.teacher" in refused_in_one_line(run_job(["action=distill", "task=text_cls", *TINY]))
    assert "no such directory" in refused_in_one_line(distil(run_job, {"dir": tmp_path / "none"}, "distill.student_layers=1"))
    # another label set: training data with two of the teacher's labels
    train = Path(sample_file(compose(["task=text_cls"]).task, "train"))
    lines = train.read_text(encoding="utf-8").splitlines()
    labels = sorted({line.split("\t")[-1] for line in lines[1:] if line.strip()})
    subset = tmp_path / "two_labels.tsv"
    subset.write_text("\n".join([lines[0]] + [line for line in lines[1:] if line.split("\t")[-1] in labels[:2]]) + "\n",
                      encoding="utf-8")
    assert "label" in refused_in_one_line(distil(run_job, teacher, "distill.student_layers=1",
                                                 f"data.train_file={subset}", f"data.validation_file={subset}"))
    # a teacher whose files are not as saved (its manifest)
    broken = tmp_path / "broken"
    shutil.copytree(teacher["dir"] / "model", broken / "model")
    head = broken / "model" / "head.safetensors"
    head.write_bytes(head.read_bytes()[:-4] + b"\0\0\0\0")
    assert "head.safetensors" in refused_in_one_line(distil(run_job, {"dir": broken}, "distill.student_layers=1"))
    # options
    assert "distill.alpha" in refused_in_one_line(distil(run_job, teacher, "distill.student_layers=1", "distill.alpha=1.5"))
    assert "hidden" in refused_in_one_line(distil(run_job, teacher, "model=tiny", "distill.hidden_weight=1"))
    assert "attention" in refused_in_one_line(distil(run_job, teacher, "distill.student_hidden=64",
                                                     "distill.attention_weight=1"))
    assert "mode=finetune" in refused_in_one_line(distil(run_job, teacher, "distill.student_layers=1", "mode=frozen"))


def test_token_and_span_students(run_job, tmp_path_factory, cache_dir):
    from kotune.cli.job import execute

    root = tmp_path_factory.mktemp("distill_heads")
    for task in ("ner", "qa"):
        teacher = execute(compose([f"task={task}", *TINY, f"cache_dir={cache_dir}"]), str(root / task))
        assert teacher["status"] == "ok", teacher.get("error")
        res = distil(run_job, {"dir": root / task}, "distill.student_layers=1", name=task)
        assert res["status"] == "ok", res.get("error")
        assert res["distill"]["kind"] == {"ner": "positions", "qa": "span"}[task]
        assert res["distill"]["teacher"]["metrics"] == pytest.approx(teacher["metrics"])
        meta = json.loads(Path(res["distill"]["cache"]["splits"]["train"]["path"], "meta.json").read_text())
        assert meta["shape"][1:] == [1, 2 if task == "qa" else len(teacher_labels(root / task))]
        unlabeled = tmp_path_factory.mktemp("u") / "u.txt"
        unlabeled.write_text("한 줄\n", encoding="utf-8")
        assert "single-text classification" in refused_in_one_line(
            distil(run_job, {"dir": root / task}, "distill.student_layers=1", f"distill.unlabeled_file={unlabeled}",
                   name=f"{task}_unlabeled"))


def teacher_labels(run_dir: Path) -> list:
    return json.loads((run_dir / "model" / "kotune.json").read_text(encoding="utf-8"))["meta"]["labels"]


def test_model_padding_free_runs_a_kotune_teachers_encoder_packed(teacher, cache_dir):
    """model.padding_free=true reaches the teacher of a distillation too (a kotune run's encoder runs
    packed, its logits unchanged: tests/test_padding_free.py), not only the student."""
    from test_padding_free import older_transformers

    from kotune.distill.teacher import Teacher

    if older_transformers():
        pytest.skip("transformers<5.25: model.padding_free is refused (tests/test_padding_free.py)")
    overrides = ["action=distill", f"distill.teacher={teacher['dir']}", "data=sample", f"cache_dir={cache_dir}"]
    assert not Teacher(compose(overrides), str(teacher["dir"])).model.padding_free
    assert Teacher(compose(overrides + ["model.padding_free=true"]), str(teacher["dir"])).model.padding_free


def test_a_sweep_searches_the_students_depth_temperature_and_alpha(teacher, tmp_path, cache_dir):
    import yaml

    from conftest import run_cli

    proc = run_cli(["-m", "hparams_search=distill", f"distill.teacher={teacher['dir']}", "data=sample",
                    "train.max_steps=2", "train.batch_size=16", "hydra.sweeper.n_trials=2",
                    "distill.student_layers=choice(1,2)", f"cache_dir={cache_dir}", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    best = yaml.safe_load((tmp_path / "sweep" / "best_trial.yaml").read_text(encoding="utf-8"))
    assert {"distill.student_layers", "distill.temperature", "distill.alpha"} <= set(best["params"])
    assert best["n_ok_runs"] == 2 and best["main_metric"] == "macro_f1"


def test_a_frozen_teacher_lends_its_layers(run_job, tmp_path):
    frozen = run_job(["task=text_cls", *TINY, "mode=frozen"], "frozen_teacher")
    assert frozen["status"] == "ok", frozen.get("error")
    res = distil(run_job, {"dir": tmp_path / "frozen_teacher"}, "distill.student_layers=1", name="from_frozen")
    assert res["status"] == "ok" and res["mode"] == "finetune" and res["distill"]["teacher"]["mode"] == "frozen"
    assert res["distill"]["teacher"]["metrics"] == pytest.approx(frozen["metrics"])


def cached_rows(res: dict) -> list[np.ndarray]:
    from heads.model.feature_cache import FeatureStore

    split = res["distill"]["cache"]["splits"]["train"]
    store = FeatureStore(split["path"])
    return [store.row(i) for i in range(split["rows"])]


@pytest.mark.parametrize("task,formats", [("text_cls", ("onnx", "native")), ("ner", ("onnx",)), ("qa", ("native",))])
def test_an_export_teaches_with_its_logits(run_job, tmp_path, task, formats):
    """An ONNX or a native export is a teacher: its task from its spec or its model card, its
    logits those the run it was exported from gives (the student is model= or narrower), its score
    the run's; a student of its layers is refused in one line."""
    from heads.span import MASKED

    run = run_job([f"task={task}", *TINY], "teacher")
    assert run["status"] == "ok", run.get("error")
    from_run = distil(run_job, {"dir": tmp_path / "teacher"}, "model=tiny", name="from_run")
    assert from_run["status"] == "ok", from_run.get("error")
    for fmt in formats:
        export = run_job([f"checkpoint={tmp_path / 'teacher'}", "action=export", f"export.format={fmt}",
                          f"export.dir={tmp_path / fmt}"], f"export_{fmt}")
        assert export["status"] == "ok", export.get("error")
        res = distil(run_job, {"dir": tmp_path / fmt}, "model=tiny", name=f"from_{fmt}")  # no task=: the export's
        assert res["status"] == "ok" and res["task"] == task, res.get("error")
        assert res["distill"]["teacher"]["source"].startswith(f"{fmt} export")
        assert res["distill"]["teacher"]["metrics"] == pytest.approx(run["metrics"], abs=1e-6)
        assert res["distill"]["cache"]["splits"]["train"]["status"] == "miss"  # another teacher: another key
        for ours, theirs in zip(cached_rows(from_run), cached_rows(res), strict=True):
            real = ours > MASKED / 2  # a span head's positions outside the context: masked by the student's loss
            np.testing.assert_allclose(theirs[real], ours[real], atol=2e-4)
        assert "export lends its logits only" in refused_in_one_line(
            distil(run_job, {"dir": tmp_path / fmt}, "distill.student_layers=1", name=f"layers_{fmt}"))
    narrow = distil(run_job, {"dir": tmp_path / formats[0]}, "distill.student_hidden=64", "distill.student_layers=1",
                    name="narrow")
    assert narrow["status"] == "ok" and narrow["distill"]["student"]["hidden"] == 64, narrow.get("error")
