"""The masked-LM model of ``action=pretrain``: ``AutoModelForMaskedLM`` (``AutoModelForPreTraining``
for BERT's masked LM + next-sentence prediction) from a hub id or a local directory (continued
pretraining from the checkpoint's own heads), or from its config with random weights; its loss
computed at the masked positions only; and the held-out masked-token (and next-sentence) accuracy
and perplexity."""
from __future__ import annotations

import math

import torch
from omegaconf import DictConfig

from heads.model.encoder import _from_hub_or_cache, build_config
from heads.loss import cross_entropy_sum, labelled, mean_of_terms
from tasks.base import IGNORE
from kotune.core.errors import ConfigError
from kotune.core.log import log, warn


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


ATTENTION_INITS = ("random", "tied_qk", "mimetic")
# kotune's defaults, query-key α₁ = β₁ = 0.7 and value-output α₂ = β₂ = 0.4: the ViT values implementations
# citing Trockman & Kolter use, not checked against the paper's text (README, "Pretrain or adapt an encoder").
MIMETIC_ALPHA, MIMETIC_BETA = (0.7, 0.4), (0.7, 0.4)


def self_attentions(model: torch.nn.Module):
    """Each BERT-style self-attention's (query, key, value, output) linear layers."""
    for module in model.modules():
        inner = getattr(module, "self", None)
        output = getattr(getattr(module, "output", None), "dense", None)
        if all(isinstance(getattr(inner, n, None), torch.nn.Linear) for n in ("query", "key", "value")) \
                and isinstance(output, torch.nn.Linear):
            yield inner.query, inner.key, inner.value, output


def tied_qk_attention(model: torch.nn.Module) -> None:
    """Tied query/key init (the query-key half of mimetic init, in a tied form): each head's query
    and key weights are the same random orthonormal rows, so W_q W_kᵀ is a projection and a token
    attends, from step 0, to tokens whose embedding is like its own — with sinusoidal positions, to
    its neighbours; values and outputs keep the standard init. Why: from the standard init the
    attention of a small BERT stayed uniform or collapsed onto one token on the shared corpus (the
    unigram plateau); with this init it learns to read its context within a few hundred steps
    (README, "Pretrain or adapt an encoder")."""
    heads = model.config.num_attention_heads
    with torch.no_grad():
        for query, key, _, _ in self_attentions(model):
            size = query.out_features // heads
            for h in range(heads):
                rows = torch.linalg.qr(torch.randn(query.in_features, query.in_features))[0][:, :size].T
                query.weight[h * size:(h + 1) * size] = rows
                key.weight[h * size:(h + 1) * size] = rows


def factor(target: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``left`` [d, rank], ``right`` [rank, d] with ``left @ right`` the best rank-``rank``
    approximation of ``target`` (SVD, the singular values split evenly)."""
    u, s, vh = torch.linalg.svd(target)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


def mimetic_attention(model: torch.nn.Module, alpha: tuple[float, float] = MIMETIC_ALPHA,
                      beta: tuple[float, float] = MIMETIC_BETA) -> None:
    """Mimetic init (Trockman & Kolter, ICML 2023): per head, W_qᵀW_k (the d × d bilinear form of the
    attention scores) is the rank-d_head SVD factorisation of α₁Z + β₁I, and over all heads the value
    → output map W_vᵀW_oᵀ is α₂Z' − β₂I, Z and Z' with N(0, 1/d) entries (fresh per head and layer).
    Biases keep the standard init (zero)."""
    heads = model.config.num_attention_heads
    with torch.no_grad():
        for query, key, value, output in self_attentions(model):
            d, size = query.in_features, query.out_features // heads
            eye = torch.eye(d)
            for h in range(heads):
                left, right = factor(alpha[0] * torch.randn(d, d) / d ** 0.5 + beta[0] * eye, size)
                query.weight[h * size:(h + 1) * size] = left.T
                key.weight[h * size:(h + 1) * size] = right
            left, right = factor(alpha[1] * torch.randn(d, d) / d ** 0.5 - beta[1] * eye, d)
            value.weight.copy_(left.T)  # all heads' values together are d wide (BERT-style models)
            output.weight.copy_(right.T)


def mimetic_scales(alpha, beta) -> tuple[tuple[float, float], tuple[float, float]]:
    """``pretrain.mimetic_alpha`` / ``mimetic_beta``: each [query-key, value-output], numbers ≥ 0
    (None: ``MIMETIC_ALPHA`` / ``MIMETIC_BETA``)."""
    scales = []
    for name, value, default in (("mimetic_alpha", alpha, MIMETIC_ALPHA), ("mimetic_beta", beta, MIMETIC_BETA)):
        value = default if value is None else value
        try:
            pair = tuple(float(v) for v in value)
        except (TypeError, ValueError):
            pair = ()
        if len(pair) != 2 or min(pair) < 0:
            raise ConfigError(f"pretrain.{name}={value}: must be two numbers >= 0 [query-key, value-output]")
        scales.append(pair)
    return scales[0], scales[1]


def checked_init(model_cfg: DictConfig, position_init: str, attention_init: str) -> str:
    """``model.init`` (pretrained | random), with ``pretrain.position_init`` and ``attention_init`` checked."""
    init = model_cfg.get("init", "pretrained")
    if init not in ("pretrained", "random"):
        raise ConfigError(f"model.init must be pretrained or random, got '{init}'")
    if position_init not in ("random", "sinusoidal"):
        raise ConfigError(f"pretrain.position_init={position_init}: must be random or sinusoidal")
    if attention_init not in ATTENTION_INITS:
        raise ConfigError(f"pretrain.attention_init={attention_init}: must be one of {', '.join(ATTENTION_INITS)}")
    return init


def random_init(model: torch.nn.Module, position_init: str, attention_init: str,
                alpha: tuple[float, float], beta: tuple[float, float]) -> None:
    """A from-scratch model's position table and attention weights as ``pretrain.position_init`` and
    ``attention_init`` ask (random: the library's init, left as it is)."""
    if position_init == "sinusoidal":
        sinusoidal_positions(model)
    if attention_init == "tied_qk":
        tied_qk_attention(model)
    elif attention_init == "mimetic":
        mimetic_attention(model, alpha, beta)


def warn_inits_ignored(model_cfg: DictConfig, position_init: str, attention_init: str) -> None:
    for key, value in (("position_init", position_init), ("attention_init", attention_init)):
        if value != "random":
            warn(f"pretrain.{key}={value} ignored: {model_cfg.name_or_path} brings its own weights")


def load_mlm_model(model_cfg: DictConfig, vocab_size: int | None, seed: int,
                   position_init: str = "random", attention_init: str = "random", objective: str = "mlm",
                   mimetic_alpha=None, mimetic_beta=None, pad_token_id: int | None = None) -> torch.nn.Module:
    """``AutoModelForMaskedLM`` (``objective`` mlm+nsp: BERT's ``AutoModelForPreTraining``); a
    checkpoint without those heads gets fresh ones (warning). Random init only: ``position_init``
    random | sinusoidal, ``attention_init`` random | tied_qk | mimetic (``mimetic_alpha``,
    ``mimetic_beta``: [query-key, value-output], None: ``MIMETIC_ALPHA`` / ``MIMETIC_BETA``), and the
    tokenizer's ``pad_token_id`` (heads/model/encoder.py's ``build_config``)."""
    from transformers import AutoModelForMaskedLM, AutoModelForPreTraining

    init = checked_init(model_cfg, position_init, attention_init)
    alpha, beta = mimetic_scales(mimetic_alpha, mimetic_beta)
    config = build_config(model_cfg, vocab_size, pad_token_id)
    if objective == "mlm+nsp" and config.model_type != "bert":
        raise ConfigError(f"pretrain.objective=mlm+nsp needs a BERT model: {config.model_type} has no "
                          "next-sentence head (use pretrain.objective=mlm)")
    auto = AutoModelForPreTraining if objective == "mlm+nsp" else AutoModelForMaskedLM
    if init == "random":
        torch.manual_seed(seed)
        model = auto.from_config(config)
        random_init(model, position_init, attention_init, alpha, beta)
        return model
    warn_inits_ignored(model_cfg, position_init, attention_init)
    model, info = _from_hub_or_cache(auto, model_cfg.name_or_path, config=config,
                                     dtype=torch.float32, revision=model_cfg.get("revision"),
                                     output_loading_info=True)
    prefix = model.base_model_prefix + "."
    fresh = [k for k in info.get("missing_keys", ()) if not k.startswith(prefix)]
    if fresh:
        head = "masked-LM" if objective == "mlm" else "masked-LM / next-sentence"
        warn(f"{model_cfg.name_or_path} has no {head} head ({len(fresh)} tensors missing, e.g. {sorted(fresh)[0]}): "
             "the head starts fresh (random init), only the encoder continues from the checkpoint")
    return model


# The MLM head of each ``*ForMaskedLM`` kotune computes at the masked positions only: hidden states
# [N, hidden] → logits [N, vocab], exactly what the class's own forward applies at every position.
MASKED_LM_HEADS = {
    "bert": lambda model, hidden: model.cls(hidden),
    "roberta": lambda model, hidden: model.lm_head(hidden),
    "electra": lambda model, hidden: model.generator_lm_head(model.generator_predictions(hidden)),
}


def at_masked(values: torch.Tensor, labels: torch.Tensor,
              positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``values`` [batch, length, ...] and ``labels`` [batch, length] at the masked positions, row-major.
    With ``positions`` (tasks/pretrain.py's ``masked_positions``, [batch, K], ``IGNORE`` past a row's
    own): every slot, [batch·K, ...], a padding slot's gold ``IGNORE`` (its values those of position 0,
    which the loss ignores); a gather, whose size the host knows. Without: boolean indexing, the
    labelled positions alone, whose number the device holds (the host waits for it)."""
    if positions is None:
        chosen = labels != IGNORE
        return values[chosen], labels[chosen]
    slot = positions != IGNORE
    index = torch.where(slot, positions, 0)
    spread = index.reshape(*index.shape, *(1,) * (values.dim() - 2)).expand(*index.shape, *values.shape[2:])
    gold = labels.gather(1, index).masked_fill(~slot, IGNORE)
    return values.gather(1, spread).flatten(0, 1), gold.flatten()


def pretraining_logits(model: torch.nn.Module, batch: dict,
                       full_forward: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Logits and gold ids of the masked positions of ``batch`` (``at_masked``: with the batch's
    ``masked_positions``, a fixed-shape slot per row's masked position, padding slots' gold
    ``IGNORE``; without, the labelled positions alone), and the next-sentence logits where the batch
    has ``next_sentence_label`` (``BertForPreTraining``), else None: the encoder runs on every
    position, the MLM head (transform and vocabulary projection) only at the masked ones (~15 %).
    Why: the projection onto the vocabulary is most of a small model's FLOPs (README, "Pretrain or
    adapt an encoder"). Architectures not in ``MASKED_LM_HEADS``, and ``full_forward`` (a wrapped
    model: DistributedDataParallel, ``torch.compile``, whose inner modules must not be called past
    the wrapper), run the model's own full forward."""
    labels, positions = batch["labels"], batch.get("masked_positions")
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "next_sentence_label", "masked_positions")}
    if full_forward:
        out = model(**inputs)
        if "next_sentence_label" in batch:
            return (*at_masked(out.prediction_logits, labels, positions), out.seq_relationship_logits)
        return (*at_masked(out.logits, labels, positions), None)
    if "next_sentence_label" in batch:
        out = model.base_model(**inputs)
        hidden, gold = at_masked(out.last_hidden_state, labels, positions)
        return model.cls.predictions(hidden), gold, model.cls.seq_relationship(out.pooler_output)
    head = MASKED_LM_HEADS.get(model.config.model_type)
    if head is None:
        return (*at_masked(model(**inputs).logits, labels, positions), None)
    hidden, gold = at_masked(model.base_model(**inputs).last_hidden_state, labels, positions)
    return head(model, hidden), gold, None


def masked_logits(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``pretraining_logits``' masked-token logits and gold ids (padding slots' gold ``IGNORE``)."""
    return pretraining_logits(model, batch)[:2]


def pretraining_counts(batch: dict) -> torch.Tensor:
    """The items each term of the pretraining loss is a mean over: the masked tokens (and the
    sentence pairs, where the batch has ``next_sentence_label``)."""
    counts = [labelled(batch["labels"])]
    if "next_sentence_label" in batch:
        counts.append(labelled(batch["next_sentence_label"]))
    return torch.stack(counts)


def masked_lm_loss(model: torch.nn.Module, batch: dict, counts: torch.Tensor | None = None,
                   full_forward: bool = False) -> torch.Tensor:
    """The ``*ForMaskedLM`` loss (mean cross-entropy over the labelled positions) from
    ``pretraining_logits``, plus the next-sentence cross-entropy where the batch has
    ``next_sentence_label`` (``BertForPreTraining``'s loss): equal to the model's own, with its
    gradients. ``counts``: the ``pretraining_counts`` of the whole optimizer step this batch is a
    share of (gradient accumulation, data parallel; heads/loss.py), else the batch's own."""
    logits, gold, next_logits = pretraining_logits(model, batch, full_forward)
    sums = [cross_entropy_sum(logits, gold)]
    if next_logits is not None:
        sums.append(cross_entropy_sum(next_logits, batch["next_sentence_label"]))
    return mean_of_terms(sums, pretraining_counts(batch) if counts is None else counts)


@torch.no_grad()
def mlm_metrics(model: torch.nn.Module, batches: list[dict]) -> dict:
    """Masked-token accuracy (%) and perplexity (exp of the mean cross-entropy over the masked
    tokens) of ``batches`` (already masked with a fixed seed); with next-sentence labels also the
    next-sentence accuracy (%) and loss over the pairs."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, correct, count = 0.0, 0, 0
    next_loss, next_correct, next_random, pairs = 0.0, 0, 0, 0
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        picked, gold, next_logits = pretraining_logits(model, batch)
        if next_logits is not None:
            next_gold = batch["next_sentence_label"]
            next_loss += float(torch.nn.functional.cross_entropy(next_logits.float(), next_gold, reduction="sum"))
            next_correct += int((next_logits.argmax(-1) == next_gold).sum())
            next_random += int(next_gold.sum())
            pairs += len(next_gold)
        masked = int(labelled(gold))  # a batch with masked_positions: its padding slots are IGNORE
        if not masked:
            continue
        picked = picked.float()
        loss_sum += float(torch.nn.functional.cross_entropy(picked, gold, ignore_index=IGNORE, reduction="sum"))
        correct += int((picked.argmax(-1) == gold).sum())  # an argmax is never IGNORE
        count += masked
    model.train(was_training)
    nsp = {}
    if pairs:  # the majority label's share: what always guessing it scores (one-sentence texts are all random-next)
        majority = max(next_random, pairs - next_random) / pairs
        nsp = {"nsp_accuracy": 100.0 * next_correct / pairs, "nsp_loss": next_loss / pairs, "n_pairs": pairs,
               "nsp_majority_accuracy": 100.0 * majority}
    if not count:
        return {"mlm_accuracy": float("nan"), "perplexity": float("nan"), "mlm_loss": float("nan"), "n_masked": 0, **nsp}
    loss = loss_sum / count
    return {"mlm_accuracy": 100.0 * correct / count, "perplexity": math.exp(min(loss, 700.0)),
            "mlm_loss": loss, "n_masked": count, **nsp}


def held_out_curve(batches: list[dict], every: int, curve: list[dict], metrics=None):
    """A Trainer callback that scores ``batches`` every ``every`` optimizer steps into ``curve``
    (the learning curve of results.json: is the held-out accuracy still climbing?). ``metrics``: a
    function of (model, batches) with ``mlm_accuracy`` and ``mlm_loss`` among its keys (default
    ``mlm_metrics``; replaced-token detection: ``heads.model.rtd.rtd_metrics``)."""
    metrics = metrics or mlm_metrics
    from transformers import TrainerCallback

    class HeldOutCurve(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if every > 0 and state.global_step % every == 0 and state.is_world_process_zero:
                point = {"step": state.global_step, **metrics(model, batches)}
                curve.append(point)
                log(f"step {point['step']}: held-out masked-token accuracy {point['mlm_accuracy']:.2f} %, "
                    f"loss {point['mlm_loss']:.3f}")

    return HeldOutCurve()
