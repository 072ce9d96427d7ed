"""The pure helpers of bench/pretrain_gain.py: the paired-gain statistics and the NER split."""
from __future__ import annotations

import math

import pytest

from bench.pretrain_gain import paired_gain, split_blocks


def test_paired_gain_mean_se_and_random_spread():
    g = paired_gain([52.0, 51.0, 53.0], [20.0, 21.0, 19.0])
    assert g["gains"] == [32.0, 30.0, 34.0]
    assert g["mean"] == pytest.approx(32.0)
    assert g["se"] == pytest.approx(2.0 / math.sqrt(3))  # sd of the gains 2.0
    assert g["random_sd"] == pytest.approx(1.0)
    assert g["shown"]


def test_gain_within_two_standard_errors_is_not_shown():
    # mean +1.0, sd 2.0 over 4 seeds: SE 1.0, so 1.0 < 2 SE
    g = paired_gain([51.0, 49.0, 53.0, 51.0], [50.0, 50.0, 50.0, 50.0])
    assert g["mean"] == pytest.approx(1.0) and g["se"] == pytest.approx(math.sqrt(8 / 3) / 2)
    assert not g["shown"]
    # pairing matters: a constant +1 on every seed is shown though both sides spread widely
    assert paired_gain([41.0, 61.0, 51.0], [40.0, 60.0, 50.0])["shown"]
    assert not paired_gain([-3.0, -2.0], [0.0, 0.0])["shown"]  # a loss is never a gain


def test_one_seed_has_no_standard_error_and_shows_nothing():
    g = paired_gain([60.0], [20.0])
    assert math.isnan(g["se"]) and not g["shown"]


def test_unpaired_scores_are_refused():
    with pytest.raises(ValueError, match="paired"):
        paired_gain([1.0, 2.0], [1.0])


def blocks(text: str) -> list[str]:
    return [b.strip("\n") for b in text.split("\n\n") if b.strip()]


def test_split_blocks_is_seeded_whole_and_complete():
    text = "## header\n## s0\na\tO\n\n" + "\n\n".join(f"## s{i}\nx\tB-PS\ny\tI-PS" for i in range(1, 10)) + "\n"
    rest, held = split_blocks(text, 0.2, seed=0)
    assert split_blocks(text, 0.2, seed=0) == (rest, held)
    assert split_blocks(text, 0.2, seed=1) != (rest, held)
    assert len(blocks(held)) == 2 and len(blocks(rest)) == 8
    assert sorted(blocks(rest) + blocks(held)) == sorted(blocks(text))
    with pytest.raises(ValueError, match="too few"):
        split_blocks("## only\na\tO\n", 0.5, seed=0)
