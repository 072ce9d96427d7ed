"""Every command the README and the docs show is run here, or excluded with its reason.

``doc_commands()`` reads each fenced code block of README.md and docs/**/*.md and takes every
``python run.py …``, ``kotune …``, ``python report.py …``, ``python -m bench.…`` and ``torchrun …``
command (continued lines joined, ``&&`` chains split, comments dropped). Each must be a key of
``RUN`` (it runs offline at a cheap size) or of ``EXCLUDED`` (with the reason it cannot run here:
the hub, ../shared, a GPU, hours); a new or edited doc command that is in neither fails
``test_every_doc_command_is_run_or_excluded``, naming it.

A command runs as written, in a folder of its own page (a page's commands in order, so a page's
train → export → serve journey runs as one), with local files named as the page names them
(``reviews.csv``, ``train.conll``, …: small fixtures from tasks/samples), at a cheap size: a hub
model preset becomes ``model=tiny`` (a command with neither ``model=`` nor ``checkpoint=`` gets it
too), ``train.max_steps=2``, the demo cut to 200 training and 40 validation rows, one shared cache.
A ``checkpoint=`` that names nothing on disk (``RUN``, ``outputs/…/RUN``) is a tiny run trained
once here (text_cls; or NER where the entry says so). ``action=serve`` is not served: its
checkpoint is loaded as the server loads it (``kotune.load``) and answers one text. The command
line runs in this process (``conftest.run_cli_here``); ``report.py`` is ``kotune.reporting.main``.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import re
import shlex
from pathlib import Path

import pytest

from conftest import ROOT, run_cli_here

SAMPLES = ROOT / "tasks" / "samples"
HUB_MODELS = ("klue", "klue-roberta", "kcbert", "koelectra", "kr-electra")
START = re.compile(r"(python run\.py|kotune\s|python report\.py|python -m bench\.|torchrun\s)")

HUB = "needs the Hugging Face hub (a KLUE dataset or a hub model's weights)"
SHARED = "reads ../shared (the real corpora; the real-data tests cover them where present)"
BENCH = "a benchmark (minutes to hours); tests/test_bench_smoke.py runs each bench's smoke settings"
GPU = "needs GPUs"

# command (as normalized by doc_commands) → what running it needs: run: which tiny run a
# checkpoint= placeholder is ("text_cls" unless said), sub: tokens replaced before it runs,
# extra: overrides added (where the page says where the run goes in words: "→ RUN")
RUN: dict[str, dict] = {
    # README
    "python run.py task=text_cls model=tiny data=demo train.max_steps=1000": {},
    "python run.py task=text_cls model=klue data.train_file=reviews.csv data.validation_split=0.2 "
    "data.text_column=review data.label_column=sentiment": {},
    "python run.py task=token_cls model=klue data.train_file=train.conll data.validation_file=dev.conll": {},
    "python run.py action=predict checkpoint=outputs/text_cls/klue/finetune/RUN data.predict_file=new.csv": {},
    "python run.py action=predict checkpoint=RUN data.predict_file=sentences.txt": {"run": "ner"},
    "python run.py action=export checkpoint=outputs/text_cls/klue/finetune/RUN export.dir=my-model": {},
    "python run.py action=export checkpoint=RUN export.format=onnx export.quantize=int8 export.dir=my-onnx": {},
    "python run.py action=serve checkpoint=my-onnx": {},
    "python run.py -m task=text_cls model=tiny data=demo train.learning_rate=3e-4,1e-3 train.seed=1,2,3": {},
    "python report.py multirun/sweep-<id>": {},
    "python report.py multirun/sweep-<id> --paper": {"sub": {"multirun/sweep-<id>": "@root"}},  # the tiny runs
    # abstention, eval, predict, serve, rerank
    "python run.py task=text_cls model=tiny data=demo data.max_train_samples=1000 train.max_steps=150 "
    "predict.min_confidence=0.5": {},
    "python run.py action=predict checkpoint=outputs/text_cls/tiny/finetune/RUN data.predict_file=unlabelled.tsv": {},
    "python run.py action=serve checkpoint=RUN": {},
    "python run.py action=serve checkpoint=RUN predict.batch_tokens=16384": {},
    "python run.py task=text_pair model=klue data.train_file=pairs.jsonl data.validation_split=0.1":
        {"extra": ["hydra.run.dir=RUN"]},  # rerank.md: the pair model its next commands call RUN
    'python run.py action=rerank checkpoint=RUN rerank.query="커피 마시면 잠이 깨는 이유가 뭘까요?" '
    "rerank.candidates=candidates.txt": {},
    "python run.py action=rerank checkpoint=RUN rerank.queries=queries.csv rerank.candidates=docs.jsonl "
    "rerank.top_k=10": {},
    # cross-validation and label issues
    "python run.py -m task=text_cls data.train_file=reviews.tsv data.folds=5 data.fold=0,1,2,3,4 "
    "hydra.sweep.dir=multirun/cv": {},
    "python run.py action=label_issues label_issues.runs=multirun/cv hydra.run.dir=outputs/issues": {},
    "python run.py task=text_cls data.train_file=reviews.tsv data.validation_file=dev.tsv "
    "data.exclude_ids=outputs/issues/label_issues.ids": {},
    "python report.py multirun/cv": {},
    # distillation: train, distil, export, serve (issue 53: the export is where serve looks)
    "python run.py task=text_cls model=tiny data=demo train.max_steps=1000 hydra.run.dir=runs/teacher": {},
    "python run.py action=distill distill.teacher=runs/teacher distill.student_layers=1 data=demo "
    "train.max_steps=1000 hydra.run.dir=runs/student": {},
    "python run.py action=export checkpoint=runs/student export.format=onnx export.quantize=int8": {},
    "python run.py action=serve checkpoint=runs/student/onnx": {},
    # serve.md: the page's own run, its ONNX export beside it, predict and eval of the export
    "python run.py task=text_cls model=tiny action=export checkpoint=RUN export.format=onnx export.quantize=int8": {},
    "python run.py task=text_cls model=tiny action=predict checkpoint=RUN/onnx data.predict_file=FILE":
        {"sub": {"FILE": "unlabelled.tsv"}},
    "python run.py task=text_cls model=tiny action=eval checkpoint=RUN/onnx onnx.file=model.onnx data=demo": {},
    "python run.py task=text_cls model=tiny action=serve checkpoint=RUN": {},
    # your data, classification, tagging, multi-label, long documents, pretraining
    "python run.py task=text_cls model=tiny data.train_file=train.csv data.validation_split=0.2": {},
    "python run.py task=text_pair data.train_file=pairs.csv data.validation_file=dev.csv": {},
    "python run.py task=token_cls data.train_file=train.conll data.validation_file=dev.conll": {},
    "python run.py task=text_cls data.train_file=train.csv data.validation_split=0.2": {},
    "python run.py action=predict checkpoint=outputs/text_cls/klue/finetune/2026-01-01_10-00-00 "
    "data.predict_file=unlabelled.csv": {},
    "python run.py task=text_pair model=klue data.train_file=pairs.tsv data.validation_file=dev.tsv "
    "data.text_column=question data.text_pair_column=answer data.label_column=label": {},
    "python run.py task=token_cls model=klue data.train_file=train.conll data.validation_file=dev.conll "
    "task.crf=true": {},
    "python run.py task=multi_label model=klue data.train_file=train.jsonl data.validation_file=dev.jsonl": {},
    "python run.py task=text_cls model=klue data.train_file=reviews.tsv data.validation_file=dev.tsv "
    "task.long_text=windows task.window_stride=64 task.window_pool=mean": {},
    "python run.py action=pretrain model=tiny data.train_file=comments.txt train.max_steps=4 train.batch_size=16 "
    "train.grad_accum=1 train.logging_steps=1": {},
    "python run.py action=pretrain model=tiny data.train_file=comments.txt train.max_steps=4 train.batch_size=4 "
    "train.grad_accum=4 train.logging_steps=1": {},
    "python run.py action=pretrain model=tiny model.architecture=electra pretrain.objective=rtd "
    "data.train_file=comments.txt train.max_steps=4 train.batch_size=16 hydra.run.dir=runs/rtd": {},
    "python run.py -m hparams_search=text_cls model=tiny data=demo train.max_steps=300 hparams_search.n_trials=4 "
    "save_model=false save_predictions=false": {},
}

# a page where a command's run is named in words ("# → outputs/.../RUN"): where it goes there
ON_PAGE: dict[tuple[str, str], dict] = {
    ("docs/serve.md", "python run.py task=text_cls model=tiny data=demo train.max_steps=1000"):
        {"extra": ["hydra.run.dir=RUN"]},
}

EXCLUDED: dict[str, str] = {
    # README
    "python run.py task=nli model=klue": HUB,
    "python run.py -m task=ynat,nli,sts model=klue,kcbert,koelectra": HUB,
    "python run.py task=nli model=klue mode=lora": HUB,
    "python run.py task=nli model=klue mode=frozen": HUB,
    "python run.py -m hparams_search=nli model=klue": HUB,
    "torchrun --nproc_per_node=4 run.py task=mrc model=klue": GPU + " (4) and the hub",
    "python run.py -m hydra/launcher=slurm task=ynat,nli model=klue,kcbert": "needs a SLURM cluster and the hub",
    "python run.py -m hparams_search=nli model=klue hparams_search.n_jobs=auto": GPU + " and the hub",
    "python run.py -m hparams_search=nli model=klue hparams_search.storage=postgresql+psycopg://user@host/db":
        "needs a PostgreSQL server and the hub",
    "python -m bench.pretrain_gain": BENCH,
    "python -m bench.serve_speed": BENCH,
    # actions
    "python run.py task=ner action=ceiling model=kcbert model.name_or_path=../shared/vocab/kcbert-base "
    "data.validation_file=../shared/data/klue/klue-ner-v1.1_dev.tsv train.max_length=510 task.decode=char": SHARED,
    "python run.py action=embed model=klue embed.input=texts.txt": HUB,
    "python run.py action=embed checkpoint=RUN embed.input=reviews.csv embed.column=review 'mode.layers=[8]' "
    "mode.pooling=mean": "mode.layers=[8] is a 12-layer encoder's layer (the tiny one has 2); "
                         "tests/test_action_matrix.py embeds a tiny checkpoint",
    "python run.py action=embed model=klue embed.input=sentences.txt embed.target=은행": HUB,
    "python run.py action=eval task=nli checkpoint=outputs/nli/klue/finetune/RUN": HUB + ": a KLUE NLI run",
    "python run.py action=eval task=sts checkpoint=RUN data.validation_file=klue-sts-v1.1_dev.json":
        SHARED + ": KLUE STS's dev file",
    "python run.py action=export checkpoint=outputs/nli/klue/finetune/RUN export.dir=nli-hf": HUB + ": a KLUE NLI run",
    "python run.py -m task=ner data.train_file=train.tsv data.folds=5 data.fold=0,1,2,3,4 task.unit_probabilities=true "
    "hydra.sweep.dir=multirun/ner_cv": "five more cross-validation jobs (minutes): the text_cls cross-validation "
                                       "and its label_issues on the same page run here",
    "python run.py action=label_issues label_issues.runs=multirun/ner_cv hydra.run.dir=outputs/ner_issues":
        "reads the NER cross-validation above (excluded)",
    "python run.py action=predict checkpoint=RUN data.predict_file=FILE predict.device=cuda:1 predict.precision=bf16":
        GPU,
    "python run.py action=pretrain model=tiny model.tokenizer.vocab_size=2000 train.max_length=64 "
    "data.train_file=[../shared/data/corpus/news-comments.txt,../shared/data/corpus/korsts-train-sentences.txt] "
    "train.batch_size=64 train.learning_rate=1e-3 train.max_steps=3000 pretrain.position_init=sinusoidal "
    "pretrain.attention_init=tied_qk hydra.run.dir=runs/mini": SHARED,
    "python run.py action=pretrain model=kcbert data.train_file=comments.txt train.learning_rate=5e-5": HUB,
    "python run.py action=pretrain model=koelectra pretrain.objective=rtd data.train_file=comments.txt "
    "train.learning_rate=5e-5": HUB,
    "python run.py task=nli model=klue model.name_or_path=runs/mini/model train.learning_rate=1e-3": HUB,
    "python run.py action=probe task=nli model=klue mode=frozen 'probe.seeds=[1,2,3]'": HUB,
    "python run.py action=probe task=ner mode=frozen checkpoint=RUN_DIR 'probe.choices=[0,6,12,last4_concat]'":
        "layers 6 and 12 are a 12-layer encoder's (the tiny one has 2); tests/test_probe.py probes a tiny one",
    "python run.py action=probe task=text_cls model=tiny data=hate_speech mode=frozen mode.pooling=mean "
    "train.learning_rate=0.005 train.max_steps=300 'probe.seeds=[1,2]'": SHARED,
    "python run.py action=score task=korquad data=sample data.validation_file=../shared/data/korquad/"
    "KorQuAD_v1.0_dev.json score.predictions=other_system/predictions.json": SHARED,
    "python run.py action=score task=nli data=sample data.validation_file=../shared/data/klue/klue-nli-v1.1_dev.json "
    "score.predictions=system.csv score.id_column=guid score.prediction_column=label": SHARED,
    # pages on options
    "python run.py task=nli train.calibrate=temperature": HUB,
    "python -m bench.calibration --model tiny --seeds 1,2,3,4,5": BENCH,
    "python -m bench.calibration --model mini --model-dir DIR --seeds 1,2,3,4,5": BENCH,
    "python run.py task=ner model=klue task.crf=true": HUB,
    "python run.py task=ner model=klue task.crf=true task.decode=char": HUB,
    "python -m bench.ner_crf --cache-dir CACHE --model-dir CACHE/pretrain_gain/<recipe hash>/model": BENCH,
    "python run.py -m task=text_cls data.train_file=reviews.tsv data.folds=5 data.fold=0,1,2,3,4 "
    "train.select_best=true data.fold_selection=inner hydra.sweep.dir=multirun/cv_inner":
        "five more cross-validation jobs (minutes): the plain cross-validation on the same page runs here",
    "python run.py task=ner model=klue train=klue train.epochs=10 train.early_stopping_patience=3": HUB,
    "python run.py task=ynat model=kcbert train.select_best=true train.evals_per_epoch=1 "
    "train.early_stopping_patience=2": HUB,
    "python run.py task=sentence_embedding model=klue data.train_file=pairs.tsv data.validation_file=dev.json":
        "its files are sentence-embedding pairs and a KLUE STS dev file; tests/test_sentence_embedding.py trains "
        "on the task's samples",
    "python run.py task=sentence_embedding_kor model=klue": HUB,
    "python run.py task=sentence_embedding model=klue data.validation_file=dev.json "
    "'task.stages=[{file: nli.tsv, epochs: 1}, {file: sts.tsv, epochs: 4}]'": "KorNLI and KorSTS files (../shared); "
                                                                           "tests/test_sentence_embedding.py runs stages",
    "python -m bench.pretrain_gain --only-pretrain": BENCH,
    "python -m bench.embeddings --model-dir DIR --seeds 1,2,3,4,5 --speed-texts 512 --repeats 2": BENCH,
    "python run.py task=text_cls model=klue data=hate_speech data.examples_per_class=16 mode=setfit": SHARED,
    "python run.py task=text_cls model=klue data=hate_speech data.examples_per_class=16": SHARED,
    "python run.py task=ynat model=kcbert train.epochs=5": HUB,
    "python run.py action=pretrain model=tiny data.train_file=demo800.txt train.max_steps=4 "
    "train.batch_size=$((16 / k)) train.grad_accum=$k train.logging_steps=1 save_model=false "
    "model.config_overrides.hidden_dropout_prob=0 model.config_overrides.attention_probs_dropout_prob=0 "
    "hydra.run.dir=runs/ga$k": "the body of a shell loop ($k); the two commands above it run here",
    "python run.py task=text_cls data=hate_speech data.label_column=bias train.class_weights=balanced": SHARED,
    "python run.py task=ner train.class_weights=balanced": HUB,
    'python run.py task=text_cls … "train.class_weights=[0.5,2,2]"': "a fragment (… stands for the rest)",
    "python -m bench.class_weights --model-dir DIR --shared ../shared": BENCH,
    "python run.py task=nli model=kcbert model.init=random model.name_or_path=../shared/vocab/kcbert-base "
    "model.config_overrides.num_hidden_layers=2 data=sample": SHARED,
    "python run.py task=ner model=klue mode=frozen mode.layers=scalar_mix": HUB,
    "python run.py -m task=nli model=klue mode=frozen 'mode.layers=[1],[4],[8],[12]'": HUB,
    "python run.py task=ner model=koelectra mode=lora mode.r=16 'mode.target_modules=[query,key,value,dense]'": HUB,
    "python run.py task=ynat model=klue train.layer_lr_decay=0.8": HUB,
    "python -m bench.modes --model-dir DIR": BENCH,
    "python run.py task=nli model=klue model.init=pretrained model.name_or_path=outputs/pretrain/…/model mode=lora":
        HUB,
    "python run.py task=nli model=klue model.name_or_path=RUN/model/encoder +model.tokenizer_path=RUN/model "
    "mode=lora": HUB,
    "python -m bench.modes --skip-cost --seeds 1,2,3 --ft-steps 200 --model-dir DIR": BENCH,
    "python run.py task=hate_multi_label data=hate_speech_multi_label model=tiny": SHARED,
    "python run.py task=hate_multi_label data=hate_speech_multi_label model=tiny task.threshold=0.5": SHARED,
    "python run.py task=hate_multi_label data=hate_speech_multi_label model=tiny train.max_steps=150 "
    "train.learning_rate=1e-3 train.max_length=128 train.warmup_ratio=0.1 train.seed=1 train.select_best=true "
    "train.evals_per_epoch=8": SHARED,
    "python -m bench.multi_label --model-dir DIR --shared ../shared": BENCH,
    "python -m bench.pretrain_gain --smoke --out OUT": BENCH,
    "python -m bench.pretrain_gain --attention-init random --tasks ner --curve-tasks '' --out OUT_RANDOM": BENCH,
    "python -m bench.pretrain_gain --tasks ner --curve-tasks '' --out OUT_TIED": BENCH,
    "python -m bench.pretrain_gain --attention-init mimetic --tasks ner --curve-tasks '' --out OUT_MIMETIC": BENCH,
    "python -m bench.pretrain_compare OUT_RANDOM OUT_TIED OUT_MIMETIC --common": BENCH,
    "python -m bench.pretrain_variants --steps 750 --variants mlm:random,mlm:tied_qk,mlm:mimetic": BENCH,
    "python -m bench.pretrain_gain --tasks hate,ner,sts,korsts --curve-tasks '' --out OUT_MLM": BENCH,
    "python -m bench.pretrain_gain --objective mlm+nsp --tasks hate,sts,korsts --curve-tasks '' --out OUT_NSP": BENCH,
    "python -m bench.pretrain_compare OUT_MLM OUT_NSP --common": BENCH,
    "python -m bench.pretrain_rtd --pretrain-steps 750 --timing-steps 60 --timing-rounds 3 --tasks hate,ner "
    "--ft-lrs 1e-3 --adapt-steps 300 --out OUT": BENCH,
    "python run.py task=mrc model=klue train.save_strategy=steps train.save_steps=500 hydra.run.dir=outputs/mrc-klue":
        HUB,
    # scale-out
    "python run.py -m task=text_cls data.train_file=train.csv data.validation_split=0.2 model=tiny "
    "train.learning_rate=1e-3,3e-4 train.seed=1,2,3": "six more sweep jobs: the README's sweep of the same grid "
                                                      "on the demo runs here",
    "python run.py -m hparams_search=text_cls data.train_file=train.csv data.validation_split=0.2 model=klue": HUB,
    "python run.py -m hparams_search=text_cls model=tiny data=demo train.max_steps=300 hparams_search.n_trials=4 "
    "save_model=false save_predictions=false 'train.learning_rate=tag(log, interval(1e-5, 1e-4))'":
        "the search above with another range: four more trials; the search above runs here",
    "python run.py -m hparams_search=text_cls model=klue train=klue hparams_search.pruner=median": HUB,
    "python run.py -m hparams_search=nli model=klue hparams_search.n_jobs=auto": GPU + " and the hub",
    "python run.py -m hparams_search=nli model=klue hparams_search.storage=postgresql+psycopg://user@host/db "
    "hydra.sweep.dir=/shared/multirun/nli-search": "needs a PostgreSQL server and the hub",
    "python run.py -m task=ynat,nli,sts,ner,mrc model=klue,kcbert,koelectra mode=finetune,frozen train.seed=1,2,3": HUB,
    "python -m bench.serve_speed --quick": BENCH,
    # tasks
    "python run.py task=ynat model=klue": HUB,
    "python run.py task=sts model=klue data.train_file=sts-train.tsv data.label_column=score": HUB + ": KLUE STS's "
        "validation split (and KorSTS's file)",
    "python run.py task=dp_klue model=klue train=klue data.train_file=klue-dp-v1.1_train.tsv "
    "data.validation_file=klue-dp-v1.1_dev.tsv": SHARED + ": KLUE DP's files",
    "python run.py task=dp action=predict checkpoint=RUN_DIR data.predict_file=sentences.tsv": "a DP run of KLUE DP's "
        "files (above, excluded); tests/test_dp.py predicts with a tiny one",
    "python run.py task=dp action=score data.validation_file=klue-dp-v1.1_dev.tsv "
    "score.predictions=RUN_DIR/predictions.jsonl": SHARED + ": KLUE DP's dev file",
    "python run.py task=ner model=klue": HUB,
    "python run.py task=ner model=kcbert data.train_file=klue-ner-v1.1_train.tsv "
    "data.validation_file=klue-ner-v1.1_dev.tsv task.decode=char": SHARED + ": KLUE NER's files",
    "python -m bench.ner_decode --seeds 2 --steps 400": BENCH,
    "python run.py task=mrc model=klue": HUB,
    "python run.py task=korquad model=kcbert data.train_file=KorQuAD_v1.0_train.json "
    "data.validation_file=KorQuAD_v1.0_dev.json task.decode=char": SHARED + ": KorQuAD's files",
    "python run.py task=korquad action=ceiling model=kcbert model.init=random "
    "model.name_or_path=../shared/vocab/kcbert-base data.validation_file=../shared/data/korquad/KorQuAD_v1.0_dev.json "
    "task.decode=char": SHARED,
    "python run.py task=re model=klue train=klue task.markers=klue task.pooling=cls": HUB,
}


# ---- reading the docs ----------------------------------------------------------------------------
def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def doc_commands(path: Path) -> list[tuple[int, str]]:
    """(line, command) of each command in the page's fenced code blocks: continued lines joined,
    ``&&`` chains split, a trailing ``# comment`` dropped, whitespace collapsed."""
    found, in_block, pending, start = [], False, None, 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            in_block, pending = not in_block, None
            continue
        if not in_block:
            continue
        if pending is None:
            pending, start = "", number
        pending += " " + stripped.rstrip("\\")
        if stripped.endswith("\\"):
            continue
        for part in pending.split("&&"):
            command = " ".join(drop_comment(part).split())
            if START.match(command):
                found.append((start, command))
        pending = None
    return found


def drop_comment(text: str) -> str:
    """The command without a trailing ``# …`` (a ``#`` inside quotes stays)."""
    quote = None
    for i, ch in enumerate(text):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote == ch else ch
        elif ch == "#" and quote is None and (i == 0 or text[i - 1].isspace()):
            return text[:i]
    return text


def all_commands() -> dict[str, list[str]]:
    """command → the pages (and lines) that show it."""
    out: dict[str, list[str]] = {}
    for page in doc_pages():
        for number, command in doc_commands(page):
            out.setdefault(command, []).append(f"{page.relative_to(ROOT)}:{number}")
    return out


def test_the_reader_finds_commands_as_written(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text `python run.py inline`\n```bash\npython run.py a=1 \\\n    b=2   # note\n"
                    "pip install x && python run.py c=3\nkotune report DIR\nprint('python run.py')\n```\n"
                    "python run.py outside\n", encoding="utf-8")
    assert doc_commands(page) == [(3, "python run.py a=1 b=2"), (5, "python run.py c=3"), (6, "kotune report DIR")]


def test_every_doc_command_is_run_or_excluded():
    commands = all_commands()
    missing = {c: where for c, where in commands.items() if c not in RUN and c not in EXCLUDED}
    assert not missing, ("doc commands neither run nor excluded in tests/test_doc_commands.py (add each to RUN, or "
                         "to EXCLUDED with the reason): " + "; ".join(f"{w[0]}: {c}" for c, w in missing.items()))
    both = set(RUN) & set(EXCLUDED)
    assert not both, f"both run and excluded: {both}"
    stale = [c for c in [*RUN, *EXCLUDED] if c not in commands]
    assert not stale, f"listed but in no page any more (drop them): {stale}"


# ---- running them --------------------------------------------------------------------------------
def write_table(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t" if path.suffix == ".tsv" else ",")
        writer.writerow(header)
        writer.writerows(rows)


def sample_rows(task: str, split: str) -> list:
    if task == "text_cls":
        lines = (SAMPLES / "text_cls" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
        return [line.split("\t") for line in lines if line.strip()]
    path = SAMPLES / task / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def make_files(folder: Path, pairs_as_dev: bool = False) -> None:
    """The local files the pages name, from tasks/samples: text files carry every column name the
    pages use for a text and a label (text, review, sentence; label, sentiment)."""
    texts = {s: sample_rows("text_cls", s) for s in ("train", "dev")}
    pairs = {s: sample_rows("text_pair", s) for s in ("train", "dev")}
    text_header = ["text", "review", "sentence", "label", "sentiment"]
    labelled = {s: [[t, t, t, label, label] for t, label in texts[s]] for s in texts}
    pair_header = ["text", "text_pair", "question", "answer", "label"]
    pair_rows = {s: [[r["text"], r["text_pair"], r["text"], r["text_pair"], r["label"]] for r in pairs[s]]
                 for s in pairs}
    for name in ("reviews.csv", "reviews.tsv", "train.csv"):
        write_table(folder / name, text_header, labelled["train"])
    write_table(folder / "dev.tsv", *((pair_header, pair_rows["dev"]) if pairs_as_dev else
                                      (text_header, labelled["dev"])))
    for name in ("new.csv", "unlabelled.csv", "unlabelled.tsv"):
        write_table(folder / name, ["text", "review", "sentence"], [[t, t, t] for t, _ in texts["dev"]])
    for name in ("pairs.csv", "pairs.tsv"):
        write_table(folder / name, pair_header, pair_rows["train"])
    write_table(folder / "dev.csv", pair_header, pair_rows["dev"])
    (folder / "pairs.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                for r in pairs["train"] + pairs["dev"]), encoding="utf-8")
    for split in ("train", "dev"):
        (folder / f"{split}.conll").write_text((SAMPLES / "token_cls" / f"{split}.conll").read_text(encoding="utf-8"),
                                               encoding="utf-8")
        (folder / f"{split}.jsonl").write_text((SAMPLES / "multi_label" / f"{split}.jsonl").read_text(encoding="utf-8"),
                                               encoding="utf-8")
    all_texts = [t for s in texts.values() for t, _ in s]
    demo = (ROOT / "kotune_data" / "demo" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    comments = [line.split("\t")[1] for line in demo if line.strip()]  # text enough for tiny's 8,000-unit vocabulary
    (folder / "comments.txt").write_text("\n".join(comments) + "\n", encoding="utf-8")
    (folder / "sentences.txt").write_text("\n".join(all_texts[:8]) + "\n", encoding="utf-8")
    (folder / "candidates.txt").write_text("\n".join(r["text_pair"] for r in pairs["dev"]) + "\n", encoding="utf-8")
    write_table(folder / "queries.csv", ["query"], [[r["text"]] for r in pairs["dev"][:3]])
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": r["text_pair"]}, ensure_ascii=False) + "\n"
                                               for r in pairs["dev"]), encoding="utf-8")


def cheap(args: list[str], cache: str) -> list[str]:
    """The command's overrides at a cheap size: model=tiny for a hub model (or where none is named and
    no checkpoint brings one), two training steps, the demo cut, the session's cache."""
    out, keys = [], {a.split("=", 1)[0] for a in args if "=" in a}
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "model" and value in HUB_MODELS:
            arg = "model=tiny"
        elif key == "train.max_steps":
            arg = "train.max_steps=2"
        elif key == "data.max_train_samples":
            arg = "data.max_train_samples=200"
        out.append(arg)
    action = next((a.split("=", 1)[1] for a in args if a.startswith("action=")), "train")
    trains = action in ("train", "distill", "pretrain")
    if "model" not in keys and "checkpoint" not in keys and "action=label_issues" not in args:
        out.append("model=tiny")
    if trains and "train.max_steps" not in keys:
        out.append("train.max_steps=2")
    if "data=demo" in args:
        out += [a for a in ("data.max_train_samples=200", "data.max_eval_samples=40")
                if a.split("=")[0] not in keys]
    return out + [f"cache_dir={cache}"]


def resolve(args: list[str], spec: dict, runs: dict, folder: Path) -> list[str]:
    """Placeholders: the entry's substitutions; ``<id>`` a sweep directory already there; a
    checkpoint that names nothing on disk, the tiny run the entry asks for."""
    out = []
    for arg in args:
        for old, new in (spec.get("sub") or {}).items():
            arg = arg.replace(old, str(runs[new[1:]]) if new.startswith("@") else new)
        if "<id>" in arg:
            found = glob.glob(str(folder / arg.split("=")[-1].replace("<id>", "*")))
            assert len(found) == 1, (arg, found)
            arg = arg.replace(arg.split("=")[-1], found[0])
        key, sep, value = arg.partition("=")
        if sep and key == "checkpoint" and not (folder / value).exists():
            arg = f"checkpoint={runs[spec.get('run', 'text_cls')]}"
        out.append(arg)
    return out


def serve_check(args: list[str]) -> None:
    """What action=serve serves, without the server: the checkpoint loaded as it loads it, one answer."""
    import kotune

    checkpoint = next(a.split("=", 1)[1] for a in args if a.startswith("checkpoint="))
    overrides = [a for a in args if a.split("=")[0] not in ("action", "checkpoint", "task", "model", "cache_dir")]
    predictor = kotune.load(checkpoint, *overrides)
    assert predictor(["정말 좋아요"])[0]["prediction"] is not None


def run_command(command: str, spec: dict, runs: dict, folder: Path) -> None:
    from kotune.reporting import main as report

    words = shlex.split(command)
    if words[:2] == ["python", "report.py"]:
        args = resolve(words[2:], spec, runs, folder)
        assert report(args) == 0, command
        return
    assert words[:2] == ["python", "run.py"], command
    args = resolve(cheap(words[2:] + list(spec.get("extra") or []), runs["cache"]), spec, runs, folder)
    if "action=serve" in args:
        serve_check(args)
        return
    proc = run_cli_here(args)
    assert proc.returncode == 0, f"{command}\n→ {args}\n{proc.stderr[-2000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir) -> dict:
    """The tiny runs a page's ``checkpoint=RUN`` stands for: text_cls (the README's own-CSV command) and NER."""
    from kotune.cli.job import execute
    from kotune.devices import quiet_libraries

    from conftest import compose

    quiet_libraries()
    root = tmp_path_factory.mktemp("doc-runs")
    make_files(root)
    out = {"cache": cache_dir, "root": root}
    for name, overrides in (("text_cls", ["task=text_cls", f"data.train_file={root / 'reviews.csv'}",
                                          "data.validation_split=0.2", "data.text_column=review",
                                          "data.label_column=sentiment"]),
                            ("ner", ["task=ner", "data=sample"])):
        res = execute(compose([*overrides, "model=tiny", "train.max_steps=2", f"cache_dir={cache_dir}"]),
                      str(root / name))
        assert res["status"] == "ok", res.get("error")
        out[name] = root / name
    return out


PAGES_RUN = sorted({where.split(":")[0] for c, where in all_commands().items() if c in RUN for where in where})


# pages that repeat another page's commands run in its folder, after it, and skip what already ran
# there (the same demo run; the same cross-validation, whose report is this page's own command)
SHARES = {"docs/index.md": "README.md", "docs/getting-started.md": "README.md",
          "docs/cross-validation.md": "docs/actions/label-issues.md"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """page → its folder and the commands already run there; ``_base``: where the folders go."""
    return {"_base": tmp_path_factory.mktemp("doc-pages")}


def run_page(page: str, runs: dict, folders: dict) -> None:
    """The page's runnable commands in page order, in its folder (made with the files on first use)."""
    owner = SHARES.get(page, page)
    if owner != page and owner not in folders:
        run_page(owner, runs, folders)
    if owner not in folders:
        folder = folders["_base"] / f"page-{len(folders)}"
        folder.mkdir()
        make_files(folder, pairs_as_dev=owner == "docs/tasks/classification.md")
        folders[owner] = {"folder": folder, "done": set()}
    folder, done = folders[owner]["folder"], folders[owner]["done"]
    os.chdir(folder)
    for _, command in doc_commands(ROOT / page):
        if command in RUN and command not in done:
            run_command(command, ON_PAGE.get((page, command), RUN[command]), runs, folder)
            done.add(command)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_RUN)
def test_the_pages_commands_run(page, runs, folders, monkeypatch):
    monkeypatch.chdir(ROOT)  # back where it was after the page's folder
    run_page(page, runs, folders)

