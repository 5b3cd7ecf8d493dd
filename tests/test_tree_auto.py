"""--tree auto (engine/decode/tree/plan.py, TreePlanner): a round's tree holds the chain auto verify
length chose and is never deeper; second choices are added only where the cost curve, scaled by each
kind of round's measured time, says their rows pay; and where this run's tree rounds commit less per
ms than the chain's rounds on the same drafts would have, rounds stop planning trees (once every
TRY_EVERY rounds they plan one again). Timings here are given, never measured."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine.decode.cost_curve_data import CostCurve
from engine.decode.drafts import Proposal
from engine.decode.tree.layout import build_tree
from engine.decode.tree.plan import TRY_EVERY, TreePlanner, chain_taken

from helpers import PROMPTS, assert_lossless, run

DRAFTS = 7  # the chain's drafts: auto verify length chose 8 rows


def _curve(per_row: float) -> CostCurve:
    """16 rows; each row past the first costs `per_row` ms (a verify of 1 row: 10 ms)."""
    return CostCurve("t", "cpu", "none", 16, 1, ar_step_ms=10.0, verify_ms=[10.0 + per_row * i for i in range(16)],
                     draft_ms=2.0, measured_at=0.0, draft_by_length_ms=[0.0] + [1.0 + 0.1 * i for i in range(15)])


def _planner(per_row: float = 0.01) -> TreePlanner:
    planner = TreePlanner(0, auto=True)
    planner.price(_curve(per_row))
    return planner


def _proposal(seed: int = 0) -> Proposal:
    """A v1 drafter's block of DRAFTS drafts, unsure at every depth (second choices likely)."""
    logits = mx.array(np.random.default_rng(seed).normal(size=(DRAFTS, 50)).astype(np.float32) * 0.5)
    return Proposal(mx.argmax(logits, -1), None, logits)


def _plan(planner: TreePlanner, seed: int = 0):
    """The planner's choice for a round of DRAFTS drafts at depth 64 (whether or not it would plan)."""
    planner.considers(64, DRAFTS + 1)
    return planner.plan(1, _proposal(seed), 64)


def test_a_tree_holds_the_chain_and_adds_rows_only_where_they_pay():
    tree = _plan(_planner(per_row=0.01))  # rows nearly free: second choices beside the chain
    assert tree is not None and len(tree) > DRAFTS + 1
    chain = tree.on_chain
    assert chain[: DRAFTS + 1].all() and chain.sum() == DRAFTS + 1  # the whole chain, first
    assert tree.depths.max() == DRAFTS  # no deeper than the chain's draft
    assert not chain[DRAFTS + 1 :].any()  # then second choices (and their first children)
    assert tree.tokens[1 : DRAFTS + 1].tolist() == _proposal().drafts.tolist()
    # a row costs 10% of a round: no second choice is worth one, and the round verifies the chain
    assert _plan(_planner(per_row=1.0)) is None


def test_the_chain_where_second_choices_never_pay():
    assert _plan(_planner(per_row=0.2)) is not None  # second choices as likely as the drafter says: a tree
    planner = _planner(per_row=0.2)
    planner.expected, planner.accepted = [10.0, 50.0], [10.0, 0.0]  # chain as predicted, no second choice
    assert _plan(planner) is None


@pytest.mark.parametrize("load", [1.0, 0.2], ids=["curve-as-measured", "curve-from-a-loaded-machine"])
def test_a_tree_rounds_measured_time_prices_its_rows(load):
    """The same drafts and curve: a tree while tree rounds take their price's time; the chain once
    they have taken three times what chain rounds take against their price (the host work the curve
    does not see), whether the curve's prices are this run's times or five times them."""
    planner = _planner()
    tree = _plan(planner)
    assert tree is not None
    for _ in range(20):
        planner.considers(64, DRAFTS + 1)
        planner.record(tree, [0], DRAFTS, ms=3.0 * load * planner.round_price(len(tree)))
        planner.considers(64, DRAFTS + 1)
        planner.record(None, [0], DRAFTS, ms=load * planner.round_price(DRAFTS + 1))
    assert planner.overhead(True) > 2.0 * planner.overhead(False)
    assert _plan(planner) is None


def test_a_planned_round_that_verifies_the_chain_is_timed_as_planned_and_costs_its_wait():
    """Planning waits for the drafts, which a chain round that does not plan need not (a v1 chain
    round queues its verify behind them): a planned round that chose the chain is timed as a planned
    round, never as the chain's, and its wait counts against planning. Planned rounds that choose the
    chain at twice an unplanned round's time stop the planning."""
    planner = _planner(per_row=1.0)  # rows too dear: planned rounds choose the chain
    assert _plan(planner) is None
    planner.record(None, [0, 1], DRAFTS, ms=2.0 * planner.round_price(DRAFTS + 1))
    assert planner.timed_rounds == [0.0, 1.0] and planner.ratios[1] == pytest.approx(2.0)
    planner.considers(64, DRAFTS + 1)  # not followed by plan(): a chain round as a chain run has them
    planner.record(None, [0, 1], DRAFTS, ms=1.0 * planner.round_price(DRAFTS + 1))
    assert planner.timed_rounds == [1.0, 1.0] and planner.ratios[0] == pytest.approx(1.0)
    assert not planner.trees_pay()  # the same tokens both ways, the planned round's at twice the time

    planner = _planner(per_row=1.0)
    for _ in range(3):  # planning at no cost: it still pays (ties go to planning)
        assert _plan(planner) is None
        planner.record(None, [0, 1], DRAFTS, ms=planner.round_price(DRAFTS + 1))
        planner.considers(64, DRAFTS + 1)
        planner.record(None, [0, 1], DRAFTS, ms=planner.round_price(DRAFTS + 1))
    assert planner.trees_pay()


def _side_path(tree) -> list[int]:
    """The root and the first second choice at depth 1 (the chain's first draft rejected)."""
    return [0, next(i for i in range(1, len(tree)) if tree.depths[i] == 1 and tree.ranks[i] > 0)]


@pytest.mark.parametrize("trees_win", [False, True], ids=["trees-lose", "trees-win"])
def test_rounds_stop_planning_trees_where_they_lose(trees_win):
    """Tree rounds whose second choices are never taken commit what the chain's rounds on the same
    drafts would have, on more rows: rounds verify the chain without planning, a tree planned once
    every TRY_EVERY rounds. Where second choices are taken, rounds plan, a chain round unplanned once
    every TRY_EVERY rounds (so both kinds stay timed)."""
    planner = _planner(per_row=0.2)
    planned = []
    for _ in range(4 * TRY_EVERY):
        if planner.considers(64, DRAFTS + 1):
            tree = planner.plan(1, _proposal(), 64)
            planned.append(tree is not None)
            if tree is not None:
                path = _side_path(tree) if trees_win else [0, 1, 2]
                planner.record(tree, path, DRAFTS, ms=planner.round_price(len(tree)))
            else:
                planner.record(None, [0, 1, 2], DRAFTS, ms=planner.round_price(DRAFTS + 1))
        else:
            planned.append(None)
            planner.record(None, [0, 1, 2], DRAFTS, ms=planner.round_price(DRAFTS + 1))
    assert planned[0] is True and planned[1] is None  # a tree tried first, then a chain round timed
    assert planner.trees_pay() is trees_win
    late = planned[2 * TRY_EVERY :]
    other = len(late) // TRY_EVERY
    if trees_win:
        assert late.count(None) == other and late.count(True) == len(late) - other
    else:
        assert len(late) - late.count(None) == other


def test_the_chains_round_is_read_off_the_tree():
    ids = np.array([[5, 6], [7, 8], [9, 10]])
    logq = np.log(np.array([[0.6, 0.3], [0.7, 0.2], [0.8, 0.1]]))
    tree = build_tree(0, ids, logq, 5, chain=3)  # nodes 1-3: the chain 5, 7, 9; then second choices
    assert tree.tokens.tolist() == [0, 5, 7, 9, 6, 7] and tree.parents.tolist() == [-1, 0, 1, 2, 0, 4]
    assert chain_taken(tree, [0, 1, 2, 3]) == (3, 3)
    assert chain_taken(tree, [0, 1]) == (3, 1)
    assert chain_taken(tree, [0, 4, 5]) == (3, 0)  # the path left the chain at once: the chain took nothing
    assert chain_taken(tree, [0]) == (3, 0)


@pytest.mark.parametrize("dirs", ["qwen3_tied_dirs", "sliding_dirs"])
def test_auto_trees_keep_the_chains_draft_and_ar_output(dirs, request):
    from engine.models.pair import load_pair

    pair = load_pair(*request.getfixturevalue(dirs))
    settings = dict(tree_auto=True, auto=True, lookup=True)
    assert_lossless(pair, PROMPTS[:2], **settings)
    _, rounds = run(pair, PROMPTS[0], max_tokens=40, **settings)
    for r in rounds:
        if r.tree_parents and -1 not in r.tree_ranks:  # no copy grafted: the chain's draft, no deeper
            depths = [0] * len(r.tree_parents)
            for node, parent in enumerate(r.tree_parents[1:], 1):
                depths[node] = depths[parent] + 1
            chain = [node for node, rank in enumerate(r.tree_ranks) if node and rank == 0 and depths[node] == node]
            assert max(depths) == len(chain) and r.tree_ranks[1 : len(chain) + 1] == [0] * len(chain)
