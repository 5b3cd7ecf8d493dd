"""Where a draft tree paid (engine/decode/tree_stats.py): the chain's depth on a tree round, read from
the tree, against the chain itself verifying from the same position; acceptance by sibling rank."""

from __future__ import annotations

import math

from engine.decode.events import RoundEvent, from_dict, to_dict
from engine.decode.prompts import encode_prompt
from engine.decode.tree_stats import chain_depth, rank_counts, tree_nodes, tree_stats
from engine.models.demo import demo_pairs, sample_prompt
from engine.models.pair import load_pair

from helpers import PROMPTS, run


def _round(parents, ranks, path, scores=None, index=0):
    n = len(parents)
    return RoundEvent(index=index, position=10, anchor=5, drafted=[9] * (len(path) - 1), accepted=len(path) - 1,
                      bonus=3, bonus_kind="correction", committed=[], draft_ms=0, verify_ms=0, rollback_ms=0, t=0,
                      generated=0, tree_parents=parents, tree_tokens=[5] + [10 + i for i in range(1, n)],
                      tree_scores=scores or [0.0] * n, tree_ranks=ranks, tree_path=path)


#      0 (anchor)
#     / \
#    1r0 2r1 --- 5r0
#    |     \
#    3r0    6r1
#    |
#    4r0
TREE = dict(parents=[-1, 0, 0, 1, 3, 2, 2], ranks=[0, 0, 1, 0, 0, 0, 1])


def test_the_chain_breaks_where_the_path_takes_a_second_choice():
    r = _round(**TREE, path=[0, 2, 6])  # the target took rank 1 at depth 1, then rank 1 again
    assert chain_depth(r) == (0, True)
    assert [n["second_choice"] for n in tree_nodes(r)] == [False, False, True, False, False, False, True]
    # judged: the root's two children and node 2's two; accepted: one rank 1 at each
    assert rank_counts(r) == {0: (0, 2), 1: (2, 2)}


def test_the_chain_keeps_step_along_rank_zero_and_is_a_bound_where_the_tree_ends():
    whole = _round(**TREE, path=[0, 1, 3, 4])  # the rank-0 line accepted to its leaf: the chain may go on
    assert chain_depth(whole) == (3, False)
    refused = _round(**TREE, path=[0, 1])  # node 1's rank-0 child (3) was refused: so would the chain's be
    assert chain_depth(refused) == (1, True)
    stats = tree_stats([whole, refused, _round(**TREE, path=[0, 2, 5], index=2)])
    assert stats["rounds"] == [(0, 3, 3, False), (0, 1, 1, True), (2, 2, 0, True)]
    assert stats["deeper"] == 1 and stats["bounded"] == 1
    assert math.isclose(stats["mean_tree"], 2.0) and math.isclose(stats["mean_chain"], 4 / 3)
    assert stats["by_rank"] == {0: (5, 7), 1: (1, 4)}


def test_a_copy_off_the_tree_leaves_the_chain_a_bound_and_its_nodes_have_no_probability():
    # node 2 is a lookup copy grafted under node 1, which has no rank-0 child of its own
    r = _round(parents=[-1, 0, 1], ranks=[0, 0, -1], path=[0, 1, 2], scores=[0.0, math.log(0.5), math.log(0.5)])
    assert chain_depth(r) == (1, False)
    nodes = tree_nodes(r)
    assert math.isclose(nodes[1]["p"], 0.5) and nodes[2]["copy"] and nodes[2]["p"] is None
    assert not nodes[2]["second_choice"] and rank_counts(r) == {0: (1, 1), -1: (1, 1)}


def test_probabilities_are_each_node_given_its_parent():
    r = _round(parents=[-1, 0, 1], ranks=[0, 0, 0], path=[0], scores=[0.0, math.log(0.8), math.log(0.8 * 0.25)])
    assert [round(n["p"], 6) for n in tree_nodes(r)[1:]] == [0.8, 0.25]
    assert round(tree_nodes(r)[2]["path_p"], 6) == 0.2 and [n["depth"] for n in tree_nodes(r)] == [0, 1, 2]


def test_chain_rounds_have_no_tree_stats():
    chain = RoundEvent(index=0, position=1, anchor=1, drafted=[2], accepted=1, bonus=3, bonus_kind="bonus",
                       committed=[2, 3], draft_ms=0, verify_ms=0, rollback_ms=0, t=0, generated=2)
    assert tree_stats([chain]) is None and tree_nodes(chain) == []


def test_the_chain_depth_read_from_a_tree_is_the_chains_own_on_the_same_context():
    """T = 0, the demo pair: wherever the tree run and a chain run (the same block, no auto) have a
    round at the same position, the context is the same (both are AR's output), so the chain run's
    accepted count must be what chain_depth read off the tree: equal where exact, at least it where
    a bound. Trace records read back give the same statistics."""
    target, drafter = demo_pairs()[0]
    pair = load_pair(target, drafter)
    compared = deeper = 0
    for prompt in (sample_prompt(target), *PROMPTS):
        ids = encode_prompt(pair.tokenizer, prompt, chat=False)
        _, trees = run(pair, ids, max_tokens=48, tree=15)
        _, chains = run(pair, ids, max_tokens=48)
        chain_at = {r.position: r.accepted for r in chains}
        for r in trees:
            if r.tree_parents and r.position in chain_at:
                depth, exact = chain_depth(r)
                assert chain_at[r.position] == depth if exact else chain_at[r.position] >= depth, (prompt, r.index)
                compared += 1
                deeper += r.accepted > chain_at[r.position]
        stats = tree_stats(trees)
        assert stats == tree_stats([to_dict(r) for r in trees]) == tree_stats([from_dict(to_dict(r)) for r in trees])
    assert compared >= 10 and deeper >= 1  # the tree took a second choice the chain would have missed
