"""``action=pretrain``: masked-LM pretraining (random init, a tokenizer trained on the text) or
continued pretraining of a checkpoint with its own MLM head: packed blocks (tasks/pretrain.py), the
library's MLM collator, Trainer; held-out masked-token accuracy and perplexity with one fixed
masking before and after training; ``model/`` is a standard Hugging Face directory.
``pretrain.objective=rtd``: ELECTRA's replaced-token detection (heads/model/rtd.py); ``model/`` is
the discriminator alone (``ElectraForPreTraining``), ``generator/`` beside it its generator."""
from __future__ import annotations

import copy
import os

from omegaconf import DictConfig

from kotune.loading.built import resolve_max_length, warn_unknown_hangul
from kotune.training.resume import resume_identity, train_resumable
from kotune.devices import host_reads_wait, local_rank_zero_first
from kotune.training.pretraining import RTDTrainer
from kotune.training.pretraining import PretrainingTrainer
from kotune.training.arguments import tensorboard_dir, training_arguments
from tasks import pretrain
from kotune.core.atomic_dir import written_whole
from kotune.core.errors import ConfigError
from kotune.core.log import log


def tokens_per_second(epoch_tokens: int, train_metrics: dict, steps: int, resumed_from: int | None) -> float:
    """Real tokens trained in *this* process per second (after a resume, Trainer's runtime covers
    only the steps since ``resumed_from``, its epoch count all of them)."""
    here = (steps - (resumed_from or 0)) / steps if steps else 0.0
    runtime = train_metrics.get("train_runtime") or float("nan")
    return epoch_tokens * float(train_metrics.get("epoch") or 0) * here / runtime


def described(metrics: dict) -> str:
    """The held-out scores as a log line: the masked-token accuracy and perplexity (RTD: the
    generator's) and, for RTD, the discriminator's accuracy against always answering "original"."""
    line = f"masked-token accuracy {metrics['mlm_accuracy']:.2f} %, perplexity {metrics['perplexity']:.1f}"
    if "rtd_accuracy" in metrics:
        line = (f"replaced-token detection accuracy {metrics['rtd_accuracy']:.2f} % (all 'original': "
                f"{metrics.get('rtd_all_original_accuracy', float('nan')):.2f} %), AUC "
                f"{metrics.get('rtd_auc', float('nan')):.3f}, loss {metrics['rtd_loss']:.3f} (base rate's "
                f"{metrics.get('rtd_base_loss', float('nan')):.3f}); generator's {line}")
    return line


def run(cfg: DictConfig, run_dir: str) -> dict:
    from heads.model.encoder import load_tokenizer
    from heads.model.mlm import held_out_curve, load_mlm_model, mlm_metrics
    from heads.model.rtd import load_rtd_model, rtd_metrics

    p, seed = cfg.pretrain, int(cfg.train.seed)
    objective = pretrain.objective(p)
    if cfg.model.get("padding_free"):  # refused before any text is read
        raise ConfigError("model.padding_free=true: action=pretrain trains transformers' own pretraining model on "
                          "blocks packed to full length (tasks/pretrain.py: only a last block or an NSP pair is "
                          "padded), not through kotune's encoder wrapper; set model.padding_free=false")
    cfg = copy.deepcopy(cfg)
    cfg.train.group_by_length = False  # every packed block has the same length
    with local_rank_zero_first():
        text = pretrain.load_text(cfg.data, seed, documents=objective == "mlm+nsp")
        log(f"pretrain: {len(text['train'].lines)} training lines, {len(text['validation'].lines)} held out")
        tokenizer = load_tokenizer(cfg.model, texts=text["train"].lines, cache_dir=cfg.cache_dir)
        pretrain.check_vocabulary(tokenizer, cfg.model, text["train"].source)
        warn_unknown_hangul(tokenizer, text["train"].lines)
        if objective == "rtd":
            model = load_rtd_model(cfg.model, len(tokenizer), seed, p, pad_token_id=tokenizer.pad_token_id)
        else:
            model = load_mlm_model(cfg.model, len(tokenizer), seed, p.get("position_init") or "random",
                                   p.get("attention_init") or "random", objective,
                                   p.get("mimetic_alpha"), p.get("mimetic_beta"), pad_token_id=tokenizer.pad_token_id)
        max_length = resolve_max_length(int(cfg.train.max_length), model.config)
        if cfg.train.get("batch_tokens"):  # every packed block is max_length tokens long: the budget is rows
            cfg.train.batch_size = max(1, int(cfg.train.batch_tokens) // max_length)
            log(f"train.batch_tokens={cfg.train.batch_tokens}: {cfg.train.batch_size} blocks of {max_length} a batch")
        blocks = {s: pretrain.model_blocks(tokenizer, t, max_length, seed) for s, t in text.items()}
    whole = bool(p.whole_word)
    eval_rows = pretrain.model_rows(blocks["validation"], whole)[: p.get("max_eval_blocks") or None]
    held_out = pretrain.masked_batches(eval_rows, pretrain.mlm_collator(tokenizer, p, seed=int(p.eval_seed)),
                                       int(cfg.train.eval_batch_size))
    rtd = objective == "rtd"
    score = (lambda m, batches: rtd_metrics(m, batches, int(p.eval_seed))) if rtd else mlm_metrics
    initial = score(model, held_out)
    log(f"before: {described(initial)}")
    curve = [{"step": 0, **initial}]
    trainer = (RTDTrainer if rtd else PretrainingTrainer)(
        model=model, args=training_arguments(cfg, run_dir, ["labels"], do_eval=False),
        train_dataset=pretrain.KeyedRows(pretrain.model_rows(blocks["train"], whole)),
        data_collator=pretrain.training_collator(tokenizer, p, seed, index_positions=host_reads_wait()),
        callbacks=[held_out_curve(held_out, int(p.get("eval_every") or 0), curve, score)],
        resume_config=resume_identity(cfg), tensorboard_dir=tensorboard_dir(cfg, run_dir))
    log(f"pretraining: {len(blocks['train'])} blocks of {max_length} tokens, "
        f"{sum(x.numel() for x in model.parameters()):,} parameters")
    train_metrics, loss, resumed_from = train_resumable(trainer, cfg, run_dir)
    metrics = score(trainer.model, held_out)
    log(f"after: {described(metrics)}")
    runtime = train_metrics.get("train_runtime") or float("nan")
    real_tokens = sum(sum(r["attention_mask"]) for r in blocks["train"])
    res = {"task": "pretrain", "main_metric": "rtd_accuracy" if rtd else "mlm_accuracy", "objective": objective, "max_length": max_length,
           "vocab_size": len(tokenizer), "n_train_lines": len(text["train"].lines),
           "n_eval_lines": len(text["validation"].lines), "n_train_blocks": len(blocks["train"]),
           "n_eval_blocks": len(eval_rows), "padding_efficiency": pretrain.padding_efficiency(blocks["train"]),
           "train_loss": loss, "train_steps": trainer.state.global_step, "train_runtime_s": runtime,
           "tokens_per_second": tokens_per_second(real_tokens, train_metrics, trainer.state.global_step, resumed_from),
           "initial_metrics": initial, "metrics": metrics, "resumed_from": resumed_from, "held_out_curve": curve,
           "loss_curve": [{"step": h["step"], "loss": h["loss"], "grad_norm": h.get("grad_norm")}
                          for h in trainer.state.log_history if "loss" in h],
           "data": {s: t.source for s, t in text.items()}}
    if trainer.is_world_process_zero() and cfg.save_model:
        out = os.path.join(run_dir, "model")
        saved = {out: trainer.model.discriminator, os.path.join(run_dir, "generator"): trainer.model.generator} \
            if rtd else {out: trainer.model}
        for folder, part in saved.items():
            with written_whole(folder, "pretrained-encoder") as staging:  # whole or not at all, as kotune's models
                part.save_pretrained(staging)
                tokenizer.save_pretrained(staging)
        res["model_dir"] = os.path.abspath(out)
        if rtd:
            res["generator_dir"] = os.path.abspath(os.path.join(run_dir, "generator"))
    return res
