"""action=pretrain pretrain.objective=rtd (ELECTRA's replaced-token detection): the loss against a
hand-written reference built from transformers' own ElectraForMaskedLM / ElectraForPreTraining
losses, which positions count as replaced, the shared embeddings and the stopped gradient, the
saved discriminator as transformers loads it, the refusals (exact resume and gradient accumulation:
tests/test_pretrain.py's and tests/test_grad_accum.py's tests, parametrized with rtd)."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from tasks.base import IGNORE
from test_pretrain import TINY, blocks, corpus, tokenizer  # noqa: F401 (fixtures)
from tasks import pretrain

ELECTRA = ["model.architecture=electra", "pretrain.objective=rtd"]


def model_cfg(**overrides):
    return OmegaConf.create({"name": "tiny", "init": "random", "architecture": "electra", "name_or_path": None,
                             "tokenizer": {}, "config_overrides": {
                                 "hidden_size": 32, "embedding_size": 32, "num_hidden_layers": 1,
                                 "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 40,
                                 **overrides}})


def rtd_settings(**kw):
    return OmegaConf.create({"objective": "rtd", "mlm_probability": 0.15, "whole_word": False, "rtd_weight": 50,
                             "generator_size": 0.25, "generator": None, **kw})


def masked(tokenizer, rows, seed: int = 0) -> dict:  # noqa: F811
    collator = pretrain.mlm_collator(tokenizer, rtd_settings(), seed=seed)
    batch = collator(pretrain.model_rows(rows, False))
    batch["attention_mask"][-1, -5:] = 0  # some padding: the discriminator must not score it
    return batch


def test_rtd_loss_equals_the_libraries_generator_and_discriminator_losses(tokenizer, blocks):  # noqa: F811
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    from heads.model.rtd import load_rtd_model

    model = load_rtd_model(model_cfg(), len(tokenizer), 0, rtd_settings(rtd_weight=7.0))
    model.eval()  # no dropout: the reference reruns both models
    batch = masked(tokenizer, blocks[:4])
    out = model(**batch, sampler=torch.Generator().manual_seed(3))
    gen, disc = model.generator, model.discriminator
    assert isinstance(gen, ElectraForMaskedLM) and isinstance(disc, ElectraForPreTraining)
    # the generator: the library's own masked-LM loss (mean over the masked tokens) on the same input
    generator_loss = gen(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         labels=batch["labels"]).loss
    chosen = batch["labels"] != IGNORE
    full_logits = gen(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.allclose(out["generator_logits"], full_logits[chosen], atol=1e-5)
    # the sampling: the softmax of those logits, drawn with the same generator
    probabilities = torch.softmax(full_logits[chosen].float(), -1)
    expected = torch.multinomial(probabilities, 1, generator=torch.Generator().manual_seed(3)).squeeze(-1)
    assert torch.equal(out["sampled"], expected)
    corrupted = batch["input_ids"].clone()
    corrupted[chosen] = expected
    original = torch.where(chosen, batch["labels"], batch["input_ids"])
    # the discriminator: the library's own loss (BCE mean over attention_mask's positions)
    discriminator_loss = disc(input_ids=corrupted, attention_mask=batch["attention_mask"],
                              labels=(corrupted != original).long()).loss
    reference = generator_loss + 7.0 * discriminator_loss
    assert out["loss"].item() == pytest.approx(reference.item(), rel=1e-5)
    assert int(out["real"].sum()) == int(batch["attention_mask"].sum()) < batch["attention_mask"].numel()



def test_detection_loss_over_all_positions_is_the_boolean_indexed_ones(tokenizer, blocks):  # noqa: F811
    """The discriminator's term sums every position's cross-entropy with the padding's zeroed,
    not ``scores[real]``'s (a host wait every step: tests/test_step_waits.py): the loss and the
    gradients are the old formulation's (computed here from the forward's own outputs) to float
    rounding (the sums add the same terms in another order), with padding in the batch."""
    import torch.nn.functional as F

    from heads.loss import cross_entropy_sum, mean_of_terms
    from heads.model.rtd import load_rtd_model, rtd_counts

    model = load_rtd_model(model_cfg(), len(tokenizer), 0, rtd_settings(rtd_weight=7.0))
    model.eval()
    batch = masked(tokenizer, blocks[:4])
    batch["attention_mask"][0, -9:] = 0  # rows of different lengths
    out = model(**batch, sampler=torch.Generator().manual_seed(3))
    real = out["real"]
    assert not real.all()
    scores, replaced = out["discriminator_logits"], out["replaced"]
    old = mean_of_terms([cross_entropy_sum(out["generator_logits"], out["gold"]),
                         7.0 * F.binary_cross_entropy_with_logits(scores[real].float(), replaced[real].float(),
                                                                  reduction="sum")], rtd_counts(batch))
    assert out["loss"].item() == pytest.approx(old.item(), rel=1e-6)
    parameters = list(model.discriminator.parameters())
    new_grads = torch.autograd.grad(out["loss"], parameters, retain_graph=True, allow_unused=True)
    old_grads = torch.autograd.grad(old, parameters, allow_unused=True)
    for new, reference in zip(new_grads, old_grads):
        assert (new is None) == (reference is None)
        assert new is None or torch.allclose(new, reference, rtol=1e-5, atol=1e-7)

def test_replaced_positions_are_the_sampled_tokens_that_differ(tokenizer, blocks):  # noqa: F811
    """A sampled original counts as original (the paper): a generator that always samples token t
    marks as replaced exactly the masked positions whose original is not t."""
    from heads.model.rtd import load_rtd_model

    model = load_rtd_model(model_cfg(), len(tokenizer), 0, rtd_settings())
    batch = masked(tokenizer, blocks[:4])
    chosen = batch["labels"] != IGNORE
    t = int(batch["labels"][chosen][0])  # the original of the first masked position
    with torch.no_grad():
        model.generator.generator_lm_head.bias[t] = 1e4  # the generator's softmax is one-hot on t
    out = model(**batch)
    assert (out["sampled"] == t).all()
    want = chosen & (batch["labels"] != t)
    assert torch.equal(out["replaced"], want)
    assert out["replaced"][chosen].sum() < chosen.sum()  # some masked positions were sampled as their original
    assert not out["replaced"][~chosen].any()


def test_generator_shares_embeddings_and_gets_no_gradient_from_the_discriminator(tokenizer, blocks):  # noqa: F811
    from heads.model.rtd import generator_config, load_rtd_model

    model = load_rtd_model(model_cfg(), len(tokenizer), 0, rtd_settings())
    gen, disc = model.generator, model.discriminator
    assert gen.electra.embeddings is disc.electra.embeddings
    assert gen.generator_lm_head.weight is disc.electra.embeddings.word_embeddings.weight
    assert gen.config.hidden_size == 8 and gen.config.num_hidden_layers == disc.config.num_hidden_layers
    assert hasattr(gen.electra, "embeddings_project")  # 32-wide embeddings into an 8-wide generator
    out = model(**masked(tokenizer, blocks[:4]))
    scores = out["discriminator_logits"][out["real"]]
    torch.nn.functional.binary_cross_entropy_with_logits(scores, out["replaced"][out["real"]].float()).backward()
    assert all(p.grad is None for n, p in gen.named_parameters() if not n.startswith("electra.embeddings"))
    assert disc.electra.embeddings.word_embeddings.weight.grad is not None
    # the checkpoint holds each shared tensor once, and loading it restores both sides
    state = model.trained_state_dict()
    assert "generator.electra.embeddings.word_embeddings.weight" not in state
    assert "discriminator.electra.embeddings.word_embeddings.weight" in state
    fresh = load_rtd_model(model_cfg(), len(tokenizer), 1, rtd_settings())
    fresh.load_state_dict(state, strict=False)
    assert torch.equal(fresh.generator.generator_lm_head.weight, disc.electra.embeddings.word_embeddings.weight)
    assert generator_config(disc.config, 1 / 3).hidden_size == 11  # 1 head, round(32 / 3)
    from kotune.core.errors import ConfigError

    with pytest.raises(ConfigError, match="generator_size"):
        generator_config(disc.config, 1.5)


def test_seeded_rows_sample_alike_in_any_batch(tokenizer, blocks):  # noqa: F811
    """Each row's tokens come from its own seed: half batches (grad_accum=2) sample as one batch.
    Without dropout, as the grad_accum tests: dropout draws other masks for each forward, so the
    generator's probabilities themselves would differ between the halves and the whole."""
    from heads.model.rtd import load_rtd_model

    model = load_rtd_model(model_cfg(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), len(tokenizer), 0,
                           rtd_settings())
    collate = pretrain.training_collator(tokenizer, rtd_settings(), seed=5, index_positions=True)
    items = [{**pretrain.model_rows([r], False)[0], "mask_key": (0, i)} for i, r in enumerate(blocks[:4])]
    whole, halves = collate(items), [collate(items[:2]), collate(items[2:])]
    assert whole["sample_seed"].shape == (4,) and len(set(whole["sample_seed"].tolist())) == 4
    def drawn(batch: dict) -> torch.Tensor:  # a batch's masked_positions slots: its masked positions' draws
        out = model(**batch)
        return out["sampled"][out["gold"] != IGNORE]

    assert torch.equal(drawn(whole), torch.cat([drawn(h) for h in halves]))


def test_masked_positions_index_gives_the_boolean_indexed_rtd_loss_gradients_and_draws(tokenizer):  # noqa: F811
    """The generator's picking and the filling of its draws through a training batch's
    ``masked_positions`` (no host wait) against the boolean indexing of a batch without it: rows
    with different numbers of masked positions, one with none; the same keyed draws, the same
    corrupted input, loss and gradients to float rounding."""
    from heads.model.rtd import load_rtd_model
    from test_pretrain import fixed_batch, loss_and_gradients

    model = load_rtd_model(model_cfg(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), 60, 0,
                           rtd_settings())
    batch = {**fixed_batch(60), "sample_seed": torch.tensor([11, 12, 13, 14])}
    indexed = {**batch, "masked_positions": pretrain.masked_positions(batch["labels"])}
    out, slots = model(**batch), model(**indexed)
    loss, grads = loss_and_gradients(model, out["loss"])
    fixed, fixed_grads = loss_and_gradients(model, slots["loss"])
    torch.testing.assert_close(fixed, loss)
    assert grads.keys() == fixed_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(fixed_grads[name], grad, msg=name)
    scored = slots["gold"] != IGNORE
    assert len(scored) == 16 and torch.equal(slots["gold"][scored], out["gold"])
    assert torch.equal(slots["sampled"][scored], out["sampled"])
    assert torch.equal(slots["replaced"], out["replaced"]) and slots["replaced"].any()
    torch.testing.assert_close(slots["generator_logits"][scored], out["generator_logits"])
    torch.testing.assert_close(slots["discriminator_logits"], out["discriminator_logits"])


def test_rtd_round_trip_saved_discriminator_loads_in_transformers(tmp_path, run_job):
    """model/ is the discriminator alone: ElectraForPreTraining loads every tensor of it and gives
    the logits of the trained discriminator (its last checkpoint); generator/ beside it loads as
    ElectraForMaskedLM and as pretrain.generator; a task fine-tunes on model/."""
    import safetensors.torch
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    text = corpus(tmp_path)
    res = run_job(TINY + ELECTRA + [f"data.train_file={text}", "train.max_steps=4", "train.save_strategy=steps",
                                    "train.save_steps=4"], "pre")
    assert res["status"] == "ok", res.get("error")
    assert res["objective"] == "rtd" and res["main_metric"] == "rtd_accuracy"
    for held_out in (res["initial_metrics"], res["metrics"]):
        assert held_out["rtd_all_original_accuracy"] == pytest.approx(100 - held_out["replaced_share"])
        assert 0 < held_out["replaced_share"] < 15
    disc, info = ElectraForPreTraining.from_pretrained(res["model_dir"], output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    trained = safetensors.torch.load_file(str(tmp_path / "pre" / "checkpoints" / "checkpoint-4" / "model.safetensors"))
    twin = ElectraForPreTraining(disc.config).eval()
    twin.load_state_dict({k[len("discriminator."):]: v for k, v in trained.items() if k.startswith("discriminator.")})
    ids = torch.randint(5, disc.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(disc.eval()(ids).logits, twin(ids).logits, atol=1e-6)
    generator = ElectraForMaskedLM.from_pretrained(res["generator_dir"])
    assert generator.config.hidden_size == disc.config.hidden_size // 4
    # continued from both saved parts: they score before training exactly as the first run did at its end
    again = run_job(["action=pretrain", "model=klue", f"model.name_or_path={res['model_dir']}", *TINY[3:],
                     "pretrain.objective=rtd", f"pretrain.generator={res['generator_dir']}",
                     f"data.train_file={text}", "train.max_steps=1", "save_model=false"], "again")
    assert again["status"] == "ok", again.get("error")
    assert again["initial_metrics"] == pytest.approx(res["metrics"], rel=1e-5)
    out = run_job(["task=nli", "data=sample", "model=klue", f"model.name_or_path={res['model_dir']}",
                   "train.max_steps=2"], "ft")
    assert out["status"] == "ok", out.get("error")


def test_generator_size_and_weight_out_of_range_are_refused(tokenizer):  # noqa: F811
    from heads.model.rtd import load_rtd_model
    from kotune.core.errors import ConfigError

    for settings, key in (({"generator_size": 0}, "generator_size"), ({"generator_size": 2}, "generator_size"),
                          ({"rtd_weight": 0}, "rtd_weight")):
        with pytest.raises(ConfigError, match=f"pretrain.{key}="):
            load_rtd_model(model_cfg(), len(tokenizer), 0, rtd_settings(**settings))


@pytest.mark.parametrize("case", ["bert", "generator_vocab", "no_generator"])
def test_rtd_refusals_are_one_line(case, tmp_path, run_job):
    text = corpus(tmp_path)
    if case == "bert":
        extra, want = ["pretrain.objective=rtd"], "pretrain.objective=rtd needs an ELECTRA model: model tiny is bert"
    elif case == "generator_vocab":
        from transformers import ElectraConfig, ElectraForMaskedLM

        ElectraForMaskedLM(ElectraConfig(vocab_size=77, embedding_size=128, hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=1, intermediate_size=32)).save_pretrained(tmp_path / "g")
        extra, want = ELECTRA + [f"pretrain.generator={tmp_path / 'g'}"], "its vocab_size is 77, the discriminator's "
    else:
        extra, want = ELECTRA + [f"pretrain.generator={tmp_path}"], "no config.json there"
    res = run_job(TINY + extra + [f"data.train_file={text}", "train.max_steps=1"], case)
    assert res["status"] == "failed" and want in res["error"], res.get("error")
    assert "\n" not in res["error"]


def test_keyed_sampler_draws_a_row_alike_in_any_batch_composition():
    """sample() with seeds: a row's tokens depend on its seed and its masked positions' order alone,
    not on which rows are beside it, where it sits in the batch, or rows with nothing masked."""
    from heads.model.rtd import sample

    torch.manual_seed(0)
    counts = [3, 0, 5, 1, 4]
    rows = [torch.softmax(3 * torch.randn(n, 50), -1) for n in counts]
    seeds = torch.tensor([11, 2 ** 62 + 5, 12, 2 ** 40, 7 * 2 ** 33 + 1])

    def drawn(order):
        probabilities = torch.cat([rows[i] for i in order])
        return sample(probabilities, torch.tensor([counts[i] for i in order]), seeds[order], None)

    alone = {i: drawn([i]) for i in range(len(rows)) if counts[i]}
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0], [1, 4, 0]):
        together = drawn(order).split([counts[i] for i in order])
        for i, tokens in zip(order, together):
            assert torch.equal(tokens, alone.get(i, tokens[:0]))
    # another seed draws other tokens (the seed is used at all)
    assert not torch.equal(drawn([2]), sample(rows[2], torch.tensor([5]), torch.tensor([13]), None))


def _chi_square(observed: torch.Tensor, probabilities: torch.Tensor) -> float:
    expected = probabilities * observed.sum()
    return float(((observed - expected) ** 2 / expected).sum())


def test_keyed_sampler_matches_the_probabilities():
    """40,000 keyed draws (4,000 rows of 10, the collator's own 63-bit row seeds) against the
    probabilities by Pearson's chi-square at a 1e-6 significance level (7 degrees of freedom: 40.5),
    and the same counts against a slightly different distribution (0.02 moved between two tokens),
    which the test must reject: a sampler off by that much cannot pass. Zero-probability tokens are
    never drawn; a row's 1st and 2nd draws are independent (their joint counts against p ⊗ p)."""
    from heads.model.rtd import sample

    support = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02], dtype=torch.float64)
    probabilities = torch.zeros(12, dtype=torch.float64)
    live = torch.tensor([1, 2, 4, 5, 6, 8, 9, 11])  # tokens 0, 3, 7, 10 have probability 0
    probabilities[live] = support
    n_rows, per = 4000, 10
    seeds = torch.tensor([pretrain.row_seed(7, 0, r, "sample") >> 1 for r in range(n_rows)])
    tokens = sample(probabilities.float().expand(n_rows * per, -1), torch.full((n_rows,), per), seeds, None)
    assert not torch.isin(tokens, torch.tensor([0, 3, 7, 10])).any()
    observed = torch.bincount(tokens, minlength=12).double()[live]
    assert _chi_square(observed, support) < 40.52  # chi2.isf(1e-6, 7)
    wrong = support.clone()
    wrong[0], wrong[7] = 0.28, 0.04
    assert _chi_square(observed, wrong) > 40.52 * 5
    assert _chi_square(observed, torch.full((8,), 1 / 8, dtype=torch.float64)) > 40.52 * 100
    # the first two draws of each row: joint counts against p ⊗ p (4 × 4 cells, 15 degrees of freedom)
    rank = torch.full((12,), -1, dtype=torch.long)
    rank[live] = torch.arange(8)
    first, second = rank[tokens.view(n_rows, per)[:, 0]], rank[tokens.view(n_rows, per)[:, 1]]
    grouped = torch.tensor([0, 1, 2, 3, 3, 3, 3, 3])  # the rarer tokens pooled: expected counts >= 4000 × 0.09²
    pair = torch.bincount(grouped[first] * 4 + grouped[second], minlength=16).double()
    pooled = torch.cat([support[:3], support[3:].sum().reshape(1)])
    assert _chi_square(pair, torch.outer(pooled, pooled).flatten()) < 56.49  # chi2.isf(1e-6, 15)


def test_held_out_detection_metrics_see_a_ranking_below_the_threshold(tokenizer, blocks):  # noqa: F811
    """rtd_metrics reports the AUC, the recall and the base rate's cross-entropy beside the accuracy:
    a discriminator that ranks the replaced tokens first with every logit below 0 scores exactly the
    always-'original' accuracy, and only its AUC shows what it has learned."""
    import math
    from types import SimpleNamespace

    from sklearn.metrics import roc_auc_score

    from heads.model.rtd import detection_auc, load_rtd_model, rtd_metrics

    model = load_rtd_model(model_cfg(), len(tokenizer), 0, rtd_settings())
    batch = masked(tokenizer, blocks[:4])
    chosen = batch["labels"] != IGNORE
    t = int(batch["labels"][chosen][0])
    with torch.no_grad():
        model.generator.generator_lm_head.bias[t] = 1e4  # every masked position sampled as t

    class BelowZero(torch.nn.Module):  # -3 where the input is t (the replaced tokens and t's originals), else -5
        config = model.discriminator.config

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            return SimpleNamespace(logits=-5.0 + 2.0 * (input_ids == t).float())

    model.discriminator = BelowZero()
    got = rtd_metrics(model, [batch])
    out = model(**batch)
    scores, gold = out["discriminator_logits"][out["real"]], out["replaced"][out["real"]]
    share = float(gold.float().mean())
    assert got["rtd_accuracy"] == pytest.approx(got["rtd_all_original_accuracy"]) == pytest.approx(100 * (1 - share))
    assert got["rtd_recall"] == 0.0
    assert got["rtd_auc"] == pytest.approx(roc_auc_score(gold.numpy(), scores.numpy()))
    assert got["rtd_auc"] > 0.9
    assert got["rtd_base_loss"] == pytest.approx(-(share * math.log(share) + (1 - share) * math.log(1 - share)))
    # ties count half, as sklearn's
    rng = torch.Generator().manual_seed(0)
    scores, gold = torch.randint(0, 5, (500,), generator=rng).float(), torch.rand(500, generator=rng) < 0.3
    assert detection_auc(scores, gold) == pytest.approx(roc_auc_score(gold.numpy(), scores.numpy()))
    assert math.isnan(detection_auc(scores, torch.zeros(500, dtype=torch.bool)))
