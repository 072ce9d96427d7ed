"""ELECTRA's replaced-token detection (Clark et al., ICLR 2020), ``pretrain.objective=rtd``: a
small generator (an ``ElectraForMaskedLM``) fills the masked positions with tokens sampled from
its softmax (no gradient through the sampling), and the discriminator (an
``ElectraForPreTraining``, the model being pretrained) learns at every real position whether its
token was replaced. Loss = the generator's MLM mean over the masked tokens + λ · the
discriminator's binary cross-entropy mean over the real (non-padding) tokens. The generator and
the discriminator share their embeddings (token, position, type), as in the paper; a generator
narrower than its embeddings gets ``ElectraModel``'s ``embeddings_project``."""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from heads.loss import cross_entropy_sum, labelled, mean_of_terms
from heads.model.encoder import _from_hub_or_cache, build_config
from heads.model.mlm import (MASKED_LM_HEADS, at_masked, checked_init, mimetic_scales, mlm_metrics, random_init,
                             warn_inits_ignored)
from tasks.base import IGNORE
from kotune.core.errors import ConfigError
from kotune.core.log import warn

RTD_WEIGHT = 50.0  # λ, the paper's
GENERATOR_SIZE = 0.25  # the generator's width over the discriminator's: the paper's 1/4 – 1/3 rule


def generator_config(config, size: float):
    """The generator's config from the discriminator's: hidden, intermediate and heads scaled by
    ``size`` (the paper's generators keep the depth and shrink the width), the same embeddings
    (size, vocabulary, positions) so that the two can share them."""
    if not 0.0 < size <= 1.0:
        raise ConfigError(f"pretrain.generator_size={size}: must be in (0, 1] (the generator's width "
                          "over the discriminator's; ELECTRA's rule is 1/4 to 1/3)")
    generator = config.__class__.from_dict(config.to_dict())
    heads = max(1, round(config.num_attention_heads * size))
    generator.num_attention_heads = heads
    generator.hidden_size = max(heads, round(config.hidden_size * size / heads) * heads)
    generator.intermediate_size = max(1, round(config.intermediate_size * size))
    return generator


def share_embeddings(discriminator: torch.nn.Module, generator: torch.nn.Module) -> None:
    """The generator reads (and its output layer projects onto) the discriminator's embedding
    module itself: one set of weights, trained by both losses."""
    generator.electra.embeddings = discriminator.electra.embeddings
    generator.generator_lm_head.weight = discriminator.electra.embeddings.word_embeddings.weight


class ReplacedTokenDetection(torch.nn.Module):
    """The discriminator and its generator as one module for Trainer: ``forward`` takes a masked
    batch (``input_ids`` with the masked tokens, ``labels`` the originals there, IGNORE elsewhere)
    and returns the loss; ``loss_counts`` (masked tokens, real tokens of the whole optimizer
    step: heads/loss.py's ``mean_of_terms``) make a step's loss the same whatever its split into
    micro-batches and processes."""

    def __init__(self, discriminator: torch.nn.Module, generator: torch.nn.Module, rtd_weight: float = RTD_WEIGHT):
        super().__init__()
        if not rtd_weight > 0:
            raise ConfigError(f"pretrain.rtd_weight={rtd_weight}: must be > 0 (the paper's λ is 50)")
        self.discriminator, self.generator, self.rtd_weight = discriminator, generator, float(rtd_weight)
        share_embeddings(discriminator, generator)
        self.config = discriminator.config  # what Trainer reads of a model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, loss_counts: torch.Tensor | None = None,
                sample_seed: torch.Tensor | None = None, sampler: torch.Generator | None = None,
                masked_positions: torch.Tensor | None = None) -> dict:
        """``loss`` and what it was computed from: ``generator_logits`` and ``gold`` (the masked
        positions, row-major: heads/model/mlm.py's ``at_masked``; with ``masked_positions``, every
        slot, padding slots' gold IGNORE), ``sampled`` (the generator's tokens there), ``replaced``
        [batch, length] (1 where the discriminator's input differs from the original: a sampled
        original counts as original, as in the paper), ``discriminator_logits`` [batch, length],
        ``real`` (the positions scored). ``sample_seed`` [batch]: each row's tokens drawn from a
        generator of its own seed (training: keyed on the row's place, tasks/pretrain.py's
        ``KeyedMasking``, so a row is sampled alike in any batch, micro-batch, process or resumed
        run); else from ``sampler`` (the held-out scoring's), else from torch's global RNG.
        ``masked_positions`` [batch, K] (tasks/pretrain.py's): the masked positions picked and filled
        without a host wait (a padding slot draws too, so a ``sampler``'s draws are not the boolean
        path's; keyed draws are the same)."""
        chosen = labels != IGNORE
        hidden = self.generator.electra(input_ids, attention_mask=attention_mask,
                                        token_type_ids=token_type_ids).last_hidden_state
        picked, gold = at_masked(hidden, labels, masked_positions)
        logits = MASKED_LM_HEADS["electra"](self.generator, picked)
        with torch.no_grad():  # ELECTRA stops the gradient at the sampling
            probabilities = torch.softmax(logits.detach().float(), -1)
            original = torch.where(chosen, labels, input_ids)
            if masked_positions is None:
                sampled = sample(probabilities, chosen.sum(1), sample_seed, sampler) if len(gold) else gold
                corrupted = original.masked_scatter(chosen, sampled)
            else:  # each row's K slots, its masked positions first: the k-th draws as the boolean path's k-th
                rows, k = masked_positions.shape
                sampled = sample(probabilities, torch.full((rows,), k, device=labels.device), sample_seed, sampler)
                # a padding slot writes to a column past the end, dropped: no write races a real position's
                into = torch.where(masked_positions != IGNORE, masked_positions, original.shape[1])
                corrupted = F.pad(original, (0, 1)).scatter(1, into, sampled.view(rows, k))[:, :-1]
            replaced = corrupted != original
        scores = self.discriminator(corrupted, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
        real = torch.ones_like(chosen) if attention_mask is None else attention_mask.bool()
        # every position's term, padding's zeroed, not scores[real]: that size is the data's (a host
        # wait every step); torch.where, not a 0 weight, so that no padded logit adds NaN or gradient
        detection = F.binary_cross_entropy_with_logits(scores.float(), replaced.float(), reduction="none")
        sums = [cross_entropy_sum(logits, gold), self.rtd_weight * torch.where(real, detection, 0.0).sum()]
        counts = rtd_counts({"labels": labels, "attention_mask": attention_mask}) if loss_counts is None else loss_counts
        return {"loss": mean_of_terms(sums, counts), "generator_logits": logits, "gold": gold, "sampled": sampled,
                "replaced": replaced, "discriminator_logits": scores, "real": real}

    def trained_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict with each shared tensor once (the discriminator's name kept): what a
        checkpoint holds (safetensors refuses shared tensors); loading it restores both sides."""
        kept, seen = {}, set()
        for key, tensor in self.state_dict().items():
            if tensor.numel() and tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            kept[key] = tensor
        return kept


def sample(probabilities: torch.Tensor, per_row: torch.Tensor, seeds: torch.Tensor | None,
           sampler: torch.Generator | None) -> torch.Tensor:
    """One token per masked position from ``probabilities`` [masked, vocab] (row-major, ``per_row``
    of them in each row): with ``seeds``, by inverse-CDF sampling with ``keyed_uniforms`` (the k-th
    masked position of a row draws from the row's seed and k alone: the same tokens in any batch,
    micro-batch or process; all rows at once, no generator per row); else ``torch.multinomial``."""
    if seeds is None:
        return torch.multinomial(probabilities, 1, generator=sampler).squeeze(-1)
    per_row = per_row.to(probabilities.device)
    # output_size (the masked positions, known here): else repeat_interleave reads sum(per_row) from the device
    row = torch.repeat_interleave(torch.arange(len(per_row), device=probabilities.device), per_row,
                                  output_size=len(probabilities))
    starts = torch.cumsum(per_row, 0) - per_row
    ordinal = torch.arange(len(row), device=row.device) - starts[row]
    precise = torch.float32 if probabilities.device.type == "mps" else torch.float64  # MPS has no float64
    cdf = torch.cumsum(probabilities.to(precise), -1)
    target = (keyed_uniforms(seeds.to(row.device)[row], ordinal).to(precise) * cdf[:, -1]).unsqueeze(-1)
    # the first token whose cumulative probability exceeds the target: one of zero probability never is
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probabilities.shape[-1] - 1)


_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """``x * constant`` mod 2³² for ``x`` in [0, 2³²) held in int64, in 16-bit halves of the
    constant so that no product leaves int64's range (torch's integer overflow is not defined)."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijection of [0, 2³²) with full avalanche (Wellons' "lowbias32" integer hash)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keyed_uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """A float64 uniform in [0, 1) (53 random bits; float32 with 24 on MPS) for each (``seed``, ``counter``) pair, a
    counter-based hash of the two (integer torch ops, any device): the same pair gives the same
    number whatever else is computed beside it."""
    seeds, counters = seeds.long(), counters.long()
    low32, high32, counters = seeds & _MASK32, (seeds >> 32) & _MASK32, counters & _MASK32
    high = _mix32(_mix32(_mix32(low32 ^ 0x9E3779B9) ^ high32) ^ counters)  # two lanes: 27 + 26 bits
    low = _mix32(_mix32(_mix32(high32 ^ 0x85EBCA6B) ^ low32) ^ counters)
    bits = (high >> 5) * 67108864 + (low >> 6)
    if bits.device.type == "mps":  # no float64 there: the top 24 bits
        return (bits >> 29).float() / 16777216.0
    return bits.double() / 9007199254740992.0


def rtd_counts(batch: dict) -> torch.Tensor:
    """The items each term of the RTD loss is a mean over: the masked tokens (generator), the real
    tokens (discriminator)."""
    mask = batch.get("attention_mask")
    real = mask.sum() if mask is not None else torch.tensor(batch["labels"].numel())
    return torch.stack([labelled(batch["labels"]), real.to(batch["labels"].device)])


def load_rtd_model(model_cfg: DictConfig, vocab_size: int | None, seed: int, p: DictConfig,
                   pad_token_id: int | None = None) -> ReplacedTokenDetection:
    """The discriminator (``ElectraForPreTraining``: from a checkpoint, its own
    ``discriminator_predictions`` reused; or from its config with random weights, ``pretrain``'s
    position and attention inits applied) and the generator (``pretrain.generator``: a saved
    ``ElectraForMaskedLM`` directory; else a fresh one ``pretrain.generator_size`` as wide). Any
    other architecture is refused. ``pad_token_id``: the tokenizer's, for a random init
    (heads/model/encoder.py's ``build_config``); the generator's config is the discriminator's."""
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    position_init, attention_init = p.get("position_init") or "random", p.get("attention_init") or "random"
    init = checked_init(model_cfg, position_init, attention_init)
    alpha, beta = mimetic_scales(p.get("mimetic_alpha"), p.get("mimetic_beta"))
    config = build_config(model_cfg, vocab_size, pad_token_id)
    if config.model_type != "electra":
        raise ConfigError(f"pretrain.objective=rtd needs an ELECTRA model: model {model_cfg.name} is "
                          f"{config.model_type} (model=koelectra or kr-electra, or model.architecture=electra "
                          "with model.init=random for a from-scratch one)")
    size = float(GENERATOR_SIZE if p.get("generator_size") is None else p.get("generator_size"))
    weight = float(RTD_WEIGHT if p.get("rtd_weight") is None else p.get("rtd_weight"))
    generator_config(config, size)  # its size checked before any weights are built or loaded
    if not weight > 0:
        raise ConfigError(f"pretrain.rtd_weight={weight}: must be > 0 (the paper's λ is 50)")
    if init == "random":
        torch.manual_seed(seed)
        discriminator = ElectraForPreTraining(config)
        random_init(discriminator, position_init, attention_init, alpha, beta)
    else:
        warn_inits_ignored(model_cfg, position_init, attention_init)
        discriminator, info = _from_hub_or_cache(ElectraForPreTraining, model_cfg.name_or_path, config=config,
                                                 dtype=torch.float32, revision=model_cfg.get("revision"),
                                                 output_loading_info=True)
        fresh = [k for k in info.get("missing_keys", ()) if not k.startswith("electra.")]
        if fresh:
            warn(f"{model_cfg.name_or_path} has no replaced-token detection head ({len(fresh)} tensors missing, "
                 f"e.g. {sorted(fresh)[0]}): the head starts fresh (random init)")
        torch.manual_seed(seed)
    generator = saved_generator(p.get("generator"), config) if p.get("generator") else None
    if generator is None:
        generator = ElectraForMaskedLM(generator_config(config, size))
        random_init(generator, "random", attention_init if init == "random" else "random", alpha, beta)
    return ReplacedTokenDetection(discriminator, generator, weight)


def saved_generator(path: str, config) -> torch.nn.Module:
    """``pretrain.generator``: a saved ``ElectraForMaskedLM`` (an earlier run's ``generator/``), its
    vocabulary and embedding size checked against the discriminator's (its embeddings are replaced
    by the discriminator's: they are shared)."""
    from transformers import AutoConfig, ElectraForMaskedLM

    where = os.path.expanduser(str(path))
    if not os.path.isfile(os.path.join(where, "config.json")):
        raise ConfigError(f"pretrain.generator={path}: no config.json there (a generator/ folder that "
                          "action=pretrain pretrain.objective=rtd saved)")
    saved = AutoConfig.from_pretrained(where)
    for key in ("model_type", "vocab_size", "embedding_size"):
        if getattr(saved, key, None) != getattr(config, key, None):
            raise ConfigError(f"pretrain.generator={path}: its {key} is {getattr(saved, key, None)}, the "
                              f"discriminator's {getattr(config, key, None)} (the two share their embeddings)")
    return ElectraForMaskedLM.from_pretrained(where, config=saved, dtype=torch.float32, use_safetensors=True)


def detection_auc(scores: torch.Tensor, replaced: torch.Tensor) -> float:
    """The area under the ROC curve of ``scores`` for ``replaced`` (ties count half): the chance that
    a replaced token scores above an original one, whatever the threshold; nan without both kinds."""
    replaced = replaced.bool()
    n_replaced = int(replaced.sum())
    n_original = len(replaced) - n_replaced
    if not n_replaced or not n_original:
        return float("nan")
    _, inverse, counts = torch.unique(scores.double(), return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    ranks = (ends - (counts.double() - 1) / 2)[inverse]  # 1-based, tied scores share their mean rank
    return float((ranks[replaced].sum() - n_replaced * (n_replaced + 1) / 2) / (n_replaced * n_original))


@torch.no_grad()
def rtd_metrics(model: ReplacedTokenDetection, batches: list[dict], seed: int = 0) -> dict:
    """The generator's masked-token accuracy and perplexity (``mlm_metrics``) and the
    discriminator's replaced-token detection on ``batches`` (masked with a fixed seed), the
    replacements sampled with ``seed``: accuracy (%) and mean binary cross-entropy over the real
    tokens, the replaced share, and what always answering "original" scores (accuracy, and
    ``rtd_base_loss``: the cross-entropy of answering the replaced share everywhere); the recall (%
    of the replaced tokens found at logit > 0) and ``rtd_auc`` (threshold-free: a discriminator
    that ranks replaced tokens higher without crossing 0 shows there, not in the accuracy)."""
    metrics = mlm_metrics(model.generator, batches)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    sampler = torch.Generator(device=device).manual_seed(seed)
    all_scores, all_gold = [], []
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        out = model(**batch, sampler=sampler)
        all_scores.append(out["discriminator_logits"][out["real"]].float().cpu())
        all_gold.append(out["replaced"][out["real"]].cpu())
    model.train(was_training)
    scores = torch.cat(all_scores) if all_scores else torch.zeros(0)
    gold = torch.cat(all_gold) if all_gold else torch.zeros(0, dtype=torch.bool)
    tokens, replaced = len(gold), int(gold.sum())
    if not tokens:
        return {**metrics, "rtd_accuracy": float("nan"), "rtd_loss": float("nan"), "n_tokens": 0}
    share = replaced / tokens
    base = -sum(q * math.log(q) for q in (share, 1 - share) if q > 0)
    return {**metrics, "rtd_accuracy": 100.0 * int(((scores > 0) == gold).sum()) / tokens,
            "rtd_loss": float(F.binary_cross_entropy_with_logits(scores, gold.float(), reduction="sum")) / tokens,
            "rtd_base_loss": base, "rtd_auc": detection_auc(scores, gold),
            "rtd_recall": 100.0 * int(((scores > 0) & gold).sum()) / replaced if replaced else float("nan"),
            "replaced_share": 100.0 * share, "rtd_all_original_accuracy": 100.0 * (1 - share), "n_tokens": tokens}
