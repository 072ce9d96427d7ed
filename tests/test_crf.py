"""A CRF for token tagging (``task.crf=true``): IOB2's invalid moves are forbidden and stay so through
training, Viterbi decodes over the label slots only, gold tags that break IOB2 per token are opened
as B-X, and a task without tags refuses the option in one line."""
from __future__ import annotations

import pytest

from conftest import compose, run_cli

LABELS = ["B-PS", "I-PS", "B-LC", "I-LC", "O"]


def test_iob2_forbids_inside_tags_at_the_start_after_o_and_after_another_type():
    from tasks.transitions import bio_constraints, repair_bio

    c = bio_constraints(LABELS)
    named = {(LABELS[i], LABELS[j]) for i, j in c["transitions"]}
    assert [LABELS[j] for j in c["start"]] == ["I-PS", "I-LC"]
    assert named == {("O", "I-PS"), ("B-LC", "I-PS"), ("I-LC", "I-PS"), ("O", "I-LC"), ("B-PS", "I-LC"),
                     ("I-PS", "I-LC")}
    assert bio_constraints(["NOUN", "VERB"], "none") == {"start": [], "transitions": []}
    assert repair_bio(["I-PS", "I-PS", "O", "I-LC", "B-PS", "I-LC"]) == (
        ["B-PS", "I-PS", "O", "B-LC", "B-PS", "B-LC"], 3)


def crf_layer():
    import torch

    from heads.crf import ChainCRF
    from tasks.transitions import bio_constraints

    torch.manual_seed(0)
    return ChainCRF(len(LABELS), bio_constraints(LABELS))


def test_viterbi_never_takes_a_forbidden_move_and_reads_only_the_slots():
    import torch

    crf = crf_layer()
    o, b_ps, i_ps = LABELS.index("O"), LABELS.index("B-PS"), LABELS.index("I-PS")
    # position by position the scores prefer I-PS at the start and I-PS right after O: both invalid
    emissions = torch.zeros(1, 5, len(LABELS))
    emissions[0, 0, i_ps], emissions[0, 0, b_ps] = 5.0, 4.0
    emissions[0, 1, o] = 5.0  # not a slot (a word's later subword): the chain skips it
    emissions[0, 2, i_ps], emissions[0, 2, o] = 3.0, 2.0
    emissions[0, 3, o], emissions[0, 4, i_ps], emissions[0, 4, b_ps] = 5.0, 5.0, 4.5
    slots = torch.tensor([[True, False, True, True, True]])
    out = crf.viterbi(emissions, slots)
    path = out[0].argmax(-1).tolist()
    assert [LABELS[t] for t in (path[0], path[2], path[3], path[4])] == ["B-PS", "I-PS", "O", "B-PS"]
    assert torch.equal(out[0, 1], emissions[0, 1])  # a non-slot keeps its emissions
    assert out[0, [0, 2, 3, 4]].sum(-1).tolist() == [1.0] * 4  # one-hot on the slots


def test_forbidden_moves_stay_forbidden_after_optimizer_steps_with_weight_decay():
    import torch

    from heads.crf import FORBIDDEN

    crf = crf_layer()
    optimizer = torch.optim.AdamW(crf.parameters(), lr=0.5, weight_decay=0.1)
    labels = torch.tensor([[LABELS.index(t) for t in ("B-PS", "I-PS", "O", "B-LC")]])
    for _ in range(3):
        optimizer.zero_grad()
        loss = crf.nll(torch.randn(1, 4, len(LABELS)), labels)
        loss.backward()
        optimizer.step()
    assert torch.isfinite(loss)
    force = crf.parameters_in_force()
    assert (force["transitions"][crf.forbidden_moves] == FORBIDDEN).all()
    assert (force["start_transitions"][crf.forbidden_start] == FORBIDDEN).all()
    assert (force["transitions"][~crf.forbidden_moves] != FORBIDDEN).all()


def test_the_likelihood_is_pytorch_crfs_over_the_packed_slots():
    import torch
    from torch.func import functional_call

    crf = crf_layer()
    emissions = torch.randn(2, 6, len(LABELS))
    labels = torch.tensor([[-100, 0, 1, -100, 4, -100], [-100, 4, 2, 3, -100, -100]])
    packed = torch.stack([emissions[0, [1, 2, 4]], torch.cat([emissions[1, [1, 2, 3]]])])
    tags = torch.tensor([[0, 1, 4], [4, 2, 3]])
    expected = -functional_call(crf.crf, crf.parameters_in_force(), (packed, tags, torch.ones(2, 3, dtype=torch.bool)))
    assert crf.nll(emissions, labels).item() == pytest.approx(expected.item(), abs=1e-5)  # summed over rows



def boolean_indexed_nll(crf, emissions, labels):
    """The likelihood as heads/crf.py computed it before it stopped waiting on the device (kept as
    the reference): the chain as wide as the most slots of any row (a host read), the rows without
    slots left out by boolean indexing (a host read of their count)."""
    import torch
    from torch.func import functional_call

    from heads.crf import chain

    slots = labels != -100
    positions, mask = chain(slots)
    packed = torch.gather(emissions.float(), 1, positions.unsqueeze(-1).expand(-1, -1, emissions.size(-1)))
    rows = mask.any(1)
    if not rows.any():
        return emissions.sum() * 0.0
    tags = torch.gather(labels.long().clamp(min=0), 1, positions)
    return -functional_call(crf.crf, crf.parameters_in_force(), (packed[rows], tags[rows], mask[rows]))


def nll_and_gradients(nll, crf, emissions, labels):
    import torch

    crf.zero_grad()
    emissions = emissions.clone().requires_grad_()
    loss = nll(crf, emissions, labels)
    loss.backward()
    return loss.detach(), emissions.grad, [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                                           for p in crf.parameters()]


def random_batch(seed: int, rows: int, length: int, share_unlabelled: float):
    """Emissions and random gold tags (IOB2 breaks included: forbidden moves score FORBIDDEN),
    ``share_unlabelled`` of the positions -100: rows of different numbers of slots."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    emissions = 3 * torch.randn(rows, length, len(LABELS), generator=generator)
    labels = torch.randint(0, len(LABELS), (rows, length), generator=generator)
    labels[torch.rand(rows, length, generator=generator) < share_unlabelled] = -100
    return emissions, labels


@pytest.mark.parametrize("seed", range(6))
def test_the_likelihood_without_host_reads_is_the_boolean_indexed_ones(seed):
    """``nll`` spans the whole row and scores slot-less rows on a one-step chain left out of the
    sum, instead of reading the widest row and dropping those rows by boolean indexing (host waits,
    tests/test_step_waits.py): loss and gradients exactly the old formulation's when every row has
    a slot (rows of 1 to 9 slots here); with slot-less rows the rows' values are the same and their
    sum to float rounding (the old sum skipped them, this one adds zeros); a batch without slots is
    0 with zero gradients."""
    import torch

    from heads.crf import ChainCRF

    crf = crf_layer()
    emissions, labels = random_batch(seed, 5, 11, 0.5)
    labels[:, 0], labels[1:, 2:] = 0, -100  # every row has a slot; row 0 up to 11, the others up to 2 of them
    if seed % 2:
        labels[0] = labels[0].clamp(min=0)  # every position of row 0 a slot
    new, old = nll_and_gradients(ChainCRF.nll, crf, emissions, labels), \
        nll_and_gradients(boolean_indexed_nll, crf, emissions, labels)
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
    assert len(new[2]) == len(old[2]) > 0 and all(torch.equal(a, b) for a, b in zip(new[2], old[2]))

    labels[[1, 3]] = -100  # two rows without slots
    new, old = nll_and_gradients(ChainCRF.nll, crf, emissions, labels), \
        nll_and_gradients(boolean_indexed_nll, crf, emissions, labels)
    assert new[0].item() == pytest.approx(old[0].item(), rel=1e-6) and torch.equal(new[1], old[1])
    assert len(new[2]) == len(old[2]) > 0
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(new[2], old[2]))

    labels[:] = -100  # nothing to learn in this batch
    new, old = nll_and_gradients(ChainCRF.nll, crf, emissions, labels), \
        nll_and_gradients(boolean_indexed_nll, crf, emissions, labels)
    assert new[0].item() == old[0].item() == 0.0 and not new[1].any() and not any(g.any() for g in new[2])


def test_masked_steps_past_a_rows_slots_change_no_viterbi_path():
    """What ``nll``'s whole-row chain rests on, seen on the decoder (``viterbi`` keeps the narrow
    chain): pytorch-crf's best paths over the chain as wide as the row equal those over the chain as
    wide as the most slots, on rows of different numbers of slots."""
    import torch
    from torch.func import functional_call

    from heads.crf import chain

    crf = crf_layer()
    for seed in range(6):
        emissions, labels = random_batch(seed, 6, 10, 0.6)
        labels[:, 0] = 0
        slots = labels != -100
        paths = []
        for width in (None, slots.size(1)):
            positions, mask = chain(slots, width)
            packed = torch.gather(emissions, 1, positions.unsqueeze(-1).expand(-1, -1, len(LABELS)))
            paths.append(functional_call(crf.crf, crf.parameters_in_force(), (packed,), {"mask": mask}))
        assert paths[0] == paths[1] and [len(p) for p in paths[0]] == slots.sum(1).tolist()

def test_gold_tags_that_break_iob2_per_token_open_their_entity(cache_dir):
    """An entity that starts inside a token: the token takes its first character's O and the next
    token I-PS, which the CRF's transitions forbid; the label becomes B-PS (and slots mark the chain)."""
    from transformers import BertTokenizerFast

    from tasks import build_task
    from tasks.base import EncodeSettings

    task = build_task(compose(["task=ner", "task.crf=true"]).task)
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "가나", "##다"])},
                                  do_lower_case=False)  # cased: lowercasing decomposes Hangul
    example = {"id": "s0", "source": "x.tsv", "line": 1, "units": ["가", "나", "다"], "tags": ["O", "B-PS", "I-PS"]}
    features = task.encode([example], tokenizer, EncodeSettings(max_length=16))
    assert [task.labels[i] if i >= 0 else None for i in features["labels"][0]] == [None, "O", "B-PS", None]
    assert features["label_slots"][0] == [0, 1, 1, 0]
    assert task.head_description() == "token (crf=true)" and "label_slots" in task.model_columns(features)


def test_a_crf_on_a_task_without_tags_is_refused_in_one_line(tmp_path):
    proc = run_cli(["task=text_cls", "model=tiny", "data=sample", "task.crf=true", f"hydra.run.dir={tmp_path}"])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr[-1500:]
    assert "task.crf=true: task text_cls has no such option" in errors[0] and "task=ner" in errors[0]


def test_the_closing_table_names_the_crf_head(tmp_path, cache_dir):
    from conftest import run_cli_here

    out = run_cli_here(["task=ner", "model=tiny", "data=sample", "task.crf=true", "train.max_steps=1",
                        "save_model=false", "save_predictions=false", f"cache_dir={cache_dir}",
                        f"hydra.run.dir={tmp_path / 'cli'}"])
    assert out.returncode == 0, out.stderr[-2000:]
    heads = [line.split(None, 1)[-1].strip() for line in out.stdout.splitlines() if line.strip().startswith("head ")]
    assert heads == ["token (crf=true)"]
