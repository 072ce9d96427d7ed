"""The pure helpers of the pretraining benches (bench/stats.py, bench/pretraining.py): the paired-gain
statistics and the NER split."""
from __future__ import annotations

import math

import pytest

from bench.pretraining import split_blocks, split_rows
from bench.stats import difference, paired_gain


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


def test_split_rows_keeps_groups_together_and_the_header_on_both_sides():
    header = "id\tscore\tsentence1\tsentence2"
    rows = [f"{i}\t{i % 5}.0\tfirst {i // 3}\tsecond {i}" for i in range(30)]  # 10 groups of 3 pairs
    text = "\n".join([header, *rows]) + "\n"
    rest, held = split_rows(text, 0.2, seed=0, group_column="sentence1")
    assert split_rows(text, 0.2, seed=0, group_column="sentence1") == (rest, held)
    rest_rows, held_rows = rest.splitlines(), held.splitlines()
    assert rest_rows[0] == held_rows[0] == header
    assert len(held_rows) - 1 == 6 and len(rest_rows) - 1 == 24  # 2 of 10 groups, 3 rows each
    group = lambda row: row.split("\t")[2]  # noqa: E731
    assert not {group(r) for r in rest_rows[1:]} & {group(r) for r in held_rows[1:]}
    assert sorted(rest_rows[1:] + held_rows[1:]) == sorted(rows)
    assert rest_rows[1:] == [r for r in rows if r in rest_rows]  # file order kept
    with pytest.raises(ValueError, match="too few"):
        split_rows(f"{header}\n0\t1.0\ta\tb\n", 0.5, seed=0, group_column="sentence1")


def test_recipe_difference_is_shown_in_either_direction():
    from bench.pretrain_compare import held_out_at

    worse = difference([40.0, 41.0, 39.0], [45.0, 46.0, 44.5])
    assert worse["mean"] == pytest.approx(-5.1666, abs=1e-3) and worse["shown"]
    assert not difference([46.0, 43.0, 47.0], [44.0, 44.0, 44.0])["shown"]  # +1.33 ± 1.20
    assert held_out_at([{"step": 750, "mlm_loss": 5.0}], 750)["mlm_loss"] == 5.0
    assert held_out_at([{"step": 750, "mlm_loss": 5.0}], 3000) is None


def test_probe_best_single_layer_ignores_the_mixes():
    from bench.probe_layers import best_single

    rows = [{"choice": "0", "mean": 1.0}, {"choice": "3", "mean": 5.0}, {"choice": "4", "mean": 2.0},
            {"choice": "scalar_mix", "mean": 9.0}]
    assert best_single(rows) == 3
