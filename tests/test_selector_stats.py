"""The DFlash2 selector's statistics (engine/decode/selector_stats.py): by hand, from traces, from a real run."""

from __future__ import annotations

import pytest

from engine.decode.events import RoundEvent, to_dict
from engine.decode.selector_stats import miss, positions, selector_stats, top_k
from engine.models.pair import load_pair
from fixtures.tiny_dflash2 import write_dflash2_drafter
from helpers import PROMPTS, run


def _round(index, drafted, accepted, bonus, candidates=(), ranks=(), plain=()):
    scores = [[float(len(c) - j) for j in range(len(c))] for c in candidates]
    return RoundEvent(index, 10 * index, 1, list(drafted), accepted, bonus,
                      "bonus" if accepted == len(drafted) else "correction", [], 1.0, 1.0, 0.0, 0.1 * index, index,
                      candidates=[list(c) for c in candidates], candidate_scores=scores,
                      target_candidate_rank=list(ranks), plain_top=list(plain))


# A: breaks at draft 2, the target's token not a candidate (the drafter's miss); draft 3 comes after the break
# B: breaks at draft 1, the target's token is candidate #2 and the plain argmax (the selector's miss)
# C: every draft accepted, the second one rescored away from the plain argmax
# D: drafted nothing (the last round of a run)
ROUNDS = [
    _round(0, [5, 6, 7], 1, 9, [[5, 8, 2], [8, 6, 3], [7, 1, 4]], [0, -1, 2], [5, 8, 1]),
    _round(1, [2, 3], 0, 4, [[2, 4, 0], [3, 0, 1]], [1, 0], [4, 3]),
    _round(2, [1, 1], 2, 3, [[1, 0, 2], [1, 2, 0]], [0, 0], [1, 2]),
    _round(3, [], 0, 3),
]
EXPECTED = {"top_k": 3, "rounds": 3, "judged": 5, "rank_counts": [3, 1, 0], "not_candidate": 1,
            "rescored": 2 + 1, "rescored_accepted": 1, "rescored_plain_was_target": 1, "kept": 2, "kept_accepted": 2,
            "misses": {"drafter": 1, "selector": 1, "sampling": 0}}


def test_stats_count_the_judged_drafts():
    assert selector_stats(ROUNDS) == EXPECTED


def test_trace_records_give_the_same_stats():
    assert selector_stats([to_dict(r) for r in ROUNDS]) == EXPECTED


def test_positions_and_misses_of_one_round():
    a = positions(ROUNDS[0])
    assert [row["status"] for row in a] == ["accepted", "rejected", "after the break"]
    assert [row["target_choice"] for row in a] == [5, None, 4]
    assert [row["rescored"] for row in a] == [False, True, True]
    assert a[1]["drafted_rank"] == 1 and a[1]["candidates"] == [(8, 3.0), (6, 2.0), (3, 1.0)]
    assert miss(ROUNDS[0])["kind"] == "drafter" and miss(ROUNDS[0])["position"] == 2
    assert miss(ROUNDS[1])["kind"] == "selector" and miss(ROUNDS[1])["target_choice"] == 4
    assert miss(ROUNDS[2]) is None
    sampled = _round(4, [5], 0, 6, [[5, 6]], [0], [5])  # the draft was the target's choice, yet rejected (T > 0)
    assert miss(sampled)["kind"] == "sampling"


def test_v1_rounds_carry_no_selector():
    v1 = [_round(0, [5, 6], 1, 9), _round(1, [], 0, 2)]
    assert selector_stats(v1) is None and selector_stats([]) is None
    assert positions(v1[0]) == [] and miss(v1[0]) is None and top_k(v1) == 0
    old = {k: v for k, v in to_dict(v1[0]).items() if k not in ("candidates", "candidate_scores",
                                                                 "target_candidate_rank", "plain_top")}
    assert selector_stats([old]) is None and positions(old) == []  # a trace written before DFlash2


@pytest.fixture(scope="module")
def dflash2_pair(qwen3_untied_dirs, tmp_path_factory):
    target = qwen3_untied_dirs[0]
    return load_pair(target, write_dflash2_drafter(tmp_path_factory.mktemp("dflash2") / "drafter", target, seed=5))


def test_stats_of_a_real_greedy_run(dflash2_pair):
    _, rounds = run(dflash2_pair, PROMPTS[0], mode="dflash", max_tokens=32, block_size=6)
    stats = selector_stats(rounds)
    assert stats is not None and stats["top_k"] == 8
    judged = [row for r in rounds for row in positions(r)[: r.accepted + 1]]
    assert stats["judged"] == len(judged) == sum(stats["rank_counts"]) + stats["not_candidate"]
    assert stats["kept"] + stats["rescored"] == len(judged)
    accepted = sum(r.accepted for r in rounds)
    assert stats["kept_accepted"] + stats["rescored_accepted"] == accepted
    # greedy: the path is each position's best score, and an accepted draft was the target's choice
    assert all(row["drafted_rank"] == 0 for r in rounds for row in positions(r))
    assert stats["rank_counts"][0] >= accepted
    broke = sum(r.accepted < len(r.drafted) for r in rounds)
    assert sum(stats["misses"].values()) == broke and stats["misses"]["sampling"] == 0
