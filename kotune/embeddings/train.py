"""``action=train task=sentence_embedding``: the bi-encoder (a KotuneModel whose head pools,
heads/bi_encoder.py) trained as a SentenceTransformer on the same encoder (heads/model/sentence_transformer.py)
by ``SentenceTransformerTrainer`` (a ``transformers.Trainer``) with the loss the data's shape calls for
(tasks/sentence_embedding.py), one stage per file of ``task.stages`` (the two-stage recipe) or the
training split alone; then the validation split is embedded and scored by kotune (kotune/embeddings/vectors.py),
and the model saved as every kotune model is (model/: kotune.json, encoder/, tokenizer)."""
from __future__ import annotations

import os
import time
from dataclasses import fields

from omegaconf import DictConfig, OmegaConf

from kotune.core.errors import ConfigError
from kotune.core.log import log


def stage_list(cfg: DictConfig) -> list[dict]:
    """``task.stages`` as ``[{file, epochs, max_steps}]``, checked; [] when unset."""
    stages = cfg.task.get("stages")
    if not stages:
        return []
    if cfg.data.get("train_file"):
        raise ConfigError(f"task.stages trains on its own files: data.train_file={cfg.data.train_file} is set too "
                          "(drop one)")
    out = []
    for n, stage in enumerate(OmegaConf.to_container(stages, resolve=True)):
        if not isinstance(stage, dict) or not isinstance(stage.get("file"), str):
            raise ConfigError(f"task.stages[{n}]: expected {{file: PATH, epochs: N}}, got {stage!r}")
        unknown = set(stage) - {"file", "epochs", "max_steps"}
        if unknown:
            raise ConfigError(f"task.stages[{n}]: unknown key(s) {', '.join(sorted(unknown))} (file, epochs, max_steps)")
        out.append(stage)
    return out


def staged_config(cfg: DictConfig, stages: list[dict]) -> DictConfig:
    """The job's config with the first stage's file as the training file (what build() reads and
    a tiny tokenizer learns from) and the preset's validation file where data gives none."""
    if not stages:
        return cfg
    staged = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    staged.data.train_file = stages[0]["file"]
    if not staged.data.get("validation_file") and staged.task.get("validation_file"):
        staged.data.validation_file = staged.task.validation_file
    staged.data.source = "files"
    return staged


def st_arguments(cfg: DictConfig, run_dir: str, triplets: bool, epochs: float | None, max_steps: int | None):
    """kotune's ``TrainingArguments`` (kotune/training/arguments.py: one reading of ``cfg.train``) as
    sentence-transformers' arguments; in-batch negatives get batches without duplicate texts."""
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers

    from kotune.training.arguments import training_arguments

    if cfg.train.get("select_best"):
        raise ConfigError("train.select_best: a sentence_embedding run is scored once, after training (its "
                          "checkpoints hold no evaluation to select on): set train.select_best=false")
    args = training_arguments(cfg, run_dir, [], do_eval=False)
    init = {f.name for f in fields(SentenceTransformerTrainingArguments) if f.init}
    given = {f.name: getattr(args, f.name) for f in fields(type(args)) if f.init and f.name in init}
    given.update(label_names=None, batch_sampler=BatchSamplers.NO_DUPLICATES if triplets else BatchSamplers.BATCH_SAMPLER)
    if epochs is not None:
        given["num_train_epochs"] = float(epochs)
    if max_steps is not None:
        given["max_steps"] = int(max_steps)
    return SentenceTransformerTrainingArguments(**given)


def loss_for(task, model, shape: str):
    """The loss of a training file's shape (task.loss=auto) or the one named: CoSENT or
    cosine-similarity regression for scored pairs, multiple-negatives ranking otherwise."""
    from sentence_transformers.sentence_transformer import losses

    name = task.loss if task.loss != "auto" else ("cosent" if shape == "scored" else "mnrl")
    scored = shape == "scored"
    if (name in ("cosent", "cosine")) != scored:
        raise ConfigError(f"task.loss={name} does not fit {shape} rows: "
                          f"{'cosent or cosine take scored pairs' if not scored else 'mnrl takes triplets or queries'}")
    if name == "cosent":
        return losses.CoSENTLoss(model), name
    if name == "cosine":
        return losses.CosineSimilarityLoss(model), name
    return losses.MultipleNegativesRankingLoss(model), name


def training_dataset(task, examples: list[dict]):
    """Rows of texts in the column order the loss reads (its label last, named ``score``)."""
    import datasets

    from tasks.sentence_embedding import shape_of

    if shape_of(examples) == "scored":
        top = float(task.cfg.get("max_score") or 5.0) if task.loss == "cosine" else 1.0
        return datasets.Dataset.from_dict({"sentence1": [ex["text"] for ex in examples],
                                           "sentence2": [ex["text_pair"] for ex in examples],
                                           "score": [float(ex["score"]) / top for ex in examples]})
    columns = ["anchor", "positive"] + (["negative"] if "negative" in examples[0] else [])
    return datasets.Dataset.from_dict({c: [ex[c] for ex in examples] for c in columns})


def train_stage(cfg: DictConfig, run_dir: str, st, task, examples: list[dict], where: str,
                stage: dict | None, number: int) -> dict:
    from sentence_transformers import SentenceTransformerTrainer

    from tasks.sentence_embedding import shape_of

    shape = shape_of(examples)
    loss, name = loss_for(task, st, shape)
    stage = stage or {}
    args = st_arguments(cfg, os.path.join(run_dir, f"stage{number}") if number else run_dir, shape != "scored",
                        stage.get("epochs"), stage.get("max_steps"))
    trainer = SentenceTransformerTrainer(model=st, args=args, train_dataset=training_dataset(task, examples), loss=loss)
    log(f"training stage {number + 1}: {len(examples)} {shape} rows of {where}, loss {type(loss).__name__}")
    started = time.time()
    out = trainer.train()
    return {"file": where, "shape": shape, "rows": len(examples), "loss": name, "steps": int(out.global_step),
            "train_loss": round(float(out.training_loss), 6), "train_s": round(time.time() - started, 3)}


def run(cfg: DictConfig, run_dir: str) -> dict:
    from heads.model.sentence_transformer import from_kotune_model
    from kotune.loading.build import build
    from kotune.embeddings.vectors import check_model, report, score_split
    from kotune.core.files import sha256_of

    stages = stage_list(cfg)
    b = build(staged_config(cfg, stages), ("train", "validation"))
    check_model(b.model)
    b.task.check_main_metric(b.splits["validation"].examples, b.splits["validation"].where)
    st = from_kotune_model(b.model, b.tokenizer)
    runs = [(b.splits["train"].examples, b.splits["train"].where, stages[0] if stages else None)]
    for stage in stages[1:]:
        runs.append((b.task.read_file(stage["file"]), stage["file"], stage))
    done = [train_stage(cfg, run_dir, st, b.task, examples, where, stage, n)
            for n, (examples, where, stage) in enumerate(runs)]
    metrics, speed = score_split(b, "validation", int(cfg.train.eval_batch_size))
    res = report(cfg, b, metrics, speed, train_loss=done[-1]["train_loss"],
                 head_train_s=round(sum(s["train_s"] for s in done), 3))
    res["data"].update({f"stage{n + 1}": {"file": s["file"], "sha256": sha256_of(s["file"])}
                        for n, s in enumerate(done) if n})
    res["stages"] = done
    if cfg.save_model:
        b.model.save(os.path.join(run_dir, "model"), b.tokenizer)
    return res
