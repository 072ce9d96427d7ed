"""The masked-LM model of ``action=pretrain``: ``AutoModelForMaskedLM`` from a hub id or a local
directory (continued pretraining from the checkpoint's own MLM head), or from its config with
random weights; its loss computed at the masked positions only; and the held-out masked-token
accuracy and perplexity."""
from __future__ import annotations

import math

import torch
from omegaconf import DictConfig

from heads.encoder import _from_hub_or_cache, build_config
from tasks.collate import IGNORE
from tasks.errors import ConfigError
from tasks.log import log, warn
from tasks.pretrain import EpochSampler


def sinusoidal_positions(model: torch.nn.Module) -> None:
    """Overwrite the learned position table with sin/cos waves (Vaswani et al.) at the init scale.
    Why: a shift of sinusoids is one linear map, so attention to a token's neighbours is one
    matrix to learn instead of a pattern over every pair of random rows. Still trainable. Measured
    on the shared corpus (2×128 BERT): a slightly lower early loss (5.73 vs 5.77 at step 300), not
    an escape from the unigram plateau (README, "Pretrain or adapt an encoder")."""
    table = model.base_model.embeddings.position_embeddings.weight
    n, d = table.shape
    angle = torch.arange(n).unsqueeze(1) / 10000 ** (torch.arange(0, d, 2) / d)
    waves = torch.zeros(n, d)
    waves[:, 0::2], waves[:, 1::2] = torch.sin(angle), torch.cos(angle[:, : d // 2])
    with torch.no_grad():
        table.copy_(waves * (model.config.initializer_range / waves.std()))


def mimetic_attention(model: torch.nn.Module) -> None:
    """Mimetic query/key init (Trockman & Kolter, ICML 2023): each head's query and key weights
    are the same random orthonormal rows, so W_q W_kᵀ is a projection and a token attends, from
    step 0, to tokens whose embedding is like its own — with sinusoidal positions, to its
    neighbours. Why: from the standard init the attention of a small BERT stayed uniform or
    collapsed onto one token on the shared corpus (the unigram plateau); with this init it learns
    to read its context within a few hundred steps (README, "Pretrain or adapt an encoder")."""
    heads = model.config.num_attention_heads
    with torch.no_grad():
        for module in model.modules():
            query, key = getattr(module, "query", None), getattr(module, "key", None)
            if not (isinstance(query, torch.nn.Linear) and isinstance(key, torch.nn.Linear)):
                continue
            size = query.out_features // heads
            for h in range(heads):
                rows = torch.linalg.qr(torch.randn(query.in_features, query.in_features))[0][:, :size].T
                query.weight[h * size:(h + 1) * size] = rows
                key.weight[h * size:(h + 1) * size] = rows


def load_mlm_model(model_cfg: DictConfig, vocab_size: int | None, seed: int,
                   position_init: str = "random", attention_init: str = "random") -> torch.nn.Module:
    """``AutoModelForMaskedLM``; a checkpoint without an MLM head gets a fresh one (warning).
    Random init only: ``position_init`` random | sinusoidal, ``attention_init`` random | mimetic."""
    from transformers import AutoModelForMaskedLM

    init = model_cfg.get("init", "pretrained")
    if init not in ("pretrained", "random"):
        raise ConfigError(f"model.init must be pretrained or random, got '{init}'")
    if position_init not in ("random", "sinusoidal"):
        raise ConfigError(f"pretrain.position_init={position_init}: must be random or sinusoidal")
    if attention_init not in ("random", "mimetic"):
        raise ConfigError(f"pretrain.attention_init={attention_init}: must be random or mimetic")
    config = build_config(model_cfg, vocab_size)
    if init == "random":
        torch.manual_seed(seed)
        model = AutoModelForMaskedLM.from_config(config)
        if position_init == "sinusoidal":
            sinusoidal_positions(model)
        if attention_init == "mimetic":
            mimetic_attention(model)
        return model
    for key, value in (("position_init", position_init), ("attention_init", attention_init)):
        if value != "random":
            warn(f"pretrain.{key}={value} ignored: {model_cfg.name_or_path} brings its own weights")
    model, info = _from_hub_or_cache(AutoModelForMaskedLM, model_cfg.name_or_path, config=config,
                                     dtype=torch.float32, revision=model_cfg.get("revision"),
                                     output_loading_info=True)
    prefix = model.base_model_prefix + "."
    fresh = [k for k in info.get("missing_keys", ()) if not k.startswith(prefix)]
    if fresh:
        warn(f"{model_cfg.name_or_path} has no masked-LM head ({len(fresh)} tensors missing, e.g. {sorted(fresh)[0]}): "
             "the head starts fresh (random init), only the encoder continues from the checkpoint")
    return model


# The MLM head of each ``*ForMaskedLM`` kotune computes at the masked positions only: hidden states
# [N, hidden] → logits [N, vocab], exactly what the class's own forward applies at every position.
MASKED_LM_HEADS = {
    "bert": lambda model, hidden: model.cls(hidden),
    "roberta": lambda model, hidden: model.lm_head(hidden),
    "electra": lambda model, hidden: model.generator_lm_head(model.generator_predictions(hidden)),
}


def masked_logits(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and gold ids of the labelled positions of ``batch`` (row-major order): the encoder
    runs on every position, the MLM head (transform and vocabulary projection) only on the ~15 %
    that carry a label. Why: the projection onto the vocabulary is most of a small model's FLOPs
    (README, "Pretrain or adapt an encoder"). Architectures not in ``MASKED_LM_HEADS`` run their
    own full forward."""
    labels = batch["labels"]
    chosen = labels != IGNORE
    head = MASKED_LM_HEADS.get(model.config.model_type)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if head is None:
        return model(**inputs).logits[chosen], labels[chosen]
    hidden = model.base_model(**inputs).last_hidden_state
    return head(model, hidden[chosen]), labels[chosen]


def masked_lm_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """The ``*ForMaskedLM`` loss (mean cross-entropy over the labelled positions) from
    ``masked_logits``: equal to the model's own, with its gradients."""
    logits, gold = masked_logits(model, batch)
    return torch.nn.functional.cross_entropy(logits, gold)


@torch.no_grad()
def mlm_metrics(model: torch.nn.Module, batches: list[dict]) -> dict:
    """Masked-token accuracy (%) and perplexity (exp of the mean cross-entropy over the masked
    tokens) of ``batches`` (already masked with a fixed seed)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, correct, count = 0.0, 0, 0
    for batch in batches:
        picked, gold = masked_logits(model, {k: v.to(device) for k, v in batch.items()})
        if not len(gold):
            continue
        picked = picked.float()
        loss_sum += float(torch.nn.functional.cross_entropy(picked, gold, reduction="sum"))
        correct += int((picked.argmax(-1) == gold).sum())
        count += len(gold)
    model.train(was_training)
    if not count:
        return {"mlm_accuracy": float("nan"), "perplexity": float("nan"), "mlm_loss": float("nan"), "n_masked": 0}
    loss = loss_sum / count
    return {"mlm_accuracy": 100.0 * correct / count, "perplexity": math.exp(min(loss, 700.0)),
            "mlm_loss": loss, "n_masked": count}


def held_out_curve(batches: list[dict], every: int, curve: list[dict]):
    """A Trainer callback that scores ``batches`` every ``every`` optimizer steps into ``curve``
    (the learning curve of results.json: is the held-out accuracy still climbing?)."""
    from transformers import TrainerCallback

    class HeldOutCurve(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if every > 0 and state.global_step % every == 0 and state.is_world_process_zero:
                point = {"step": state.global_step, **mlm_metrics(model, batches)}
                curve.append(point)
                log(f"step {point['step']}: held-out masked-token accuracy {point['mlm_accuracy']:.2f} %, "
                    f"loss {point['mlm_loss']:.3f}")

    return HeldOutCurve()


def masked_lm_trainer(base: type) -> type:
    """``base`` (a ``transformers.Trainer`` class) for pretraining: the loss is ``masked_lm_loss``
    (the MLM head at the masked positions only), and the training rows come in
    ``tasks.pretrain.EpochSampler``'s order, keyed for ``KeyedRows`` and ``KeyedMasking`` (exact
    resume). A wrapped model (DistributedDataParallel, ``train.compile``) keeps its own forward:
    calling its inner modules would bypass the wrapper."""
    class MaskedLMTrainer(base):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if return_outputs or model is not self.model:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return masked_lm_loss(model, inputs)

        def _get_train_sampler(self, train_dataset=None):
            dataset = self.train_dataset if train_dataset is None else train_dataset
            return EpochSampler(len(dataset), self.args.data_seed if self.args.data_seed is not None else self.args.seed)

    return MaskedLMTrainer
