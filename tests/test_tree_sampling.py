"""At T > 0 a tree verify must emit exactly the target's distribution: recursive rejection sampling over
siblings (engine/decode/tree/walk.py), against a synthetic target and drafter over a 4-token vocabulary
whose AR distribution is known exactly; and the mutations that break it are caught."""

from __future__ import annotations

import itertools
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from engine.decode.drafts import Proposal
from engine.decode.tree import walk
from engine.decode.tree.layout import COPY_RANK, best_first, build_tree, graft, ranked_candidates
from engine.decode.tree.plan import candidates
from engine.decode.tree.walk import HostRows, sampled_candidates, tree_rejection_sample

ALPHA = 1e-3  # false-alarm rate of each statistical test
V, DEPTH, WIDTH, EMIT = 4, 3, 3, 2  # vocabulary, tree depth, candidates per depth, tokens compared
TRIALS = 6000


class Target:
    """p(next | context): a fixed random distribution per context (a Dirichlet draw seeded by it)."""

    def __init__(self, seed: int):
        self.seed = seed

    def __call__(self, context: tuple) -> np.ndarray:
        key = self.seed * 7919 + sum((t + 1) * 5**i for i, t in enumerate(context))
        return np.random.default_rng(key).dirichlet(np.full(V, 0.7))


class NodeRows:
    """Rows per node, made when read (the walk reads only the nodes it visits)."""

    def __init__(self, row):
        self.row = row

    def __getitem__(self, node):
        return self.row(node)


def sampled_tree(anchor, logq, width, budget, key):
    """The tree a round at T > 0 verifies, as the planner makes it (plan.candidates, then build_tree)."""
    ids, ranked, follow = candidates(Proposal(mx.argmax(logq, axis=-1), logq, None), key, width)
    return build_tree(anchor, ids, ranked, budget, follow=follow)


def one_round(target, q, context, budget, copy, sampled, key, rng):
    """(tokens one round of tree verify emits after `context`, whose last token is the anchor; the
    ranks of the accepted nodes)."""
    logq = mx.log(mx.array(q))
    if sampled:
        tree = sampled_tree(context[-1], logq, WIDTH, budget, key)
    else:
        tree = build_tree(context[-1], *ranked_candidates(logq, WIDTH), budget)
    if copy:
        tree = graft(tree, copy)
    flags = (tree.ranks != COPY_RANK) if sampled else None
    path_tokens = [tuple(tree.tokens[tree.path_to(i)][1:].tolist()) for i in range(len(tree))]
    p = NodeRows(lambda node: target(context + path_tokens[node]))
    draft = HostRows(mx.array(q), tree.depths)
    path, token = tree_rejection_sample(tree, p, draft, flags, rng)
    return [int(t) for t in tree.tokens[path][1:]] + [token], tree.ranks[path[1:]].tolist()


def emitted_counts(target, q, budget=6, copy=(), sampled=True, seed=0, trials=TRIALS):
    rng = np.random.default_rng(seed)
    key = mx.random.key(seed)
    counts, ranks = Counter(), Counter()
    for _ in range(trials):
        context, out = (2,), []
        while len(out) < EMIT:
            key, sub = mx.random.split(key)
            tokens, accepted = one_round(target, q, context + tuple(out), budget, list(copy), sampled, sub, rng)
            ranks.update(accepted or ["none"])
            out += tokens
        counts[tuple(out[:EMIT])] += 1
    return counts, ranks


def pvalue(target, counts):
    outcomes = list(itertools.product(range(V), repeat=EMIT))
    exact = [np.prod([target((2,) + o[:i])[o[i]] for i in range(EMIT)]) for o in outcomes]
    n = sum(counts.values())
    return chisquare([counts[o] for o in outcomes], [e * n for e in exact]).pvalue


def _drafter(seed):
    return np.random.default_rng(100 + seed).dirichlet(np.full(V, 0.7), size=DEPTH)


@pytest.mark.parametrize("budget, copy, sampled, filtered", [
    (2, (), True, False),  # siblings at the root only
    (8, (), True, False),
    (8, (3, 0, 1), True, True),  # a grafted copy: fixed tokens beside sampled siblings; q without token 1
    (6, (), False, False),  # the drafter's top-k as fixed tokens
])
def test_tree_verify_emits_the_targets_distribution(budget, copy, sampled, filtered):
    target = Target(seed=budget + len(copy))
    q = _drafter(budget)
    if filtered:  # a drafter filter (top-k, top-p) left token 1 no mass: the target still has some
        q[:, 1] = 0.0
        q /= q.sum(axis=1, keepdims=True)
    counts, ranks = emitted_counts(target, q, budget, copy, sampled)
    assert pvalue(target, counts) > ALPHA, counts
    # every way a node can end: nothing accepted, its first child, a later sibling (or the copy)
    assert min(ranks["none"], ranks[0], sum(ranks[r] for r in ranks if r != "none" and r != 0)) > 50, ranks


@pytest.mark.parametrize("mutation", ["residual not renormalised", "sampled siblings not removed from q",
                                      "fixed tokens tested against q"])
def test_the_mutations_are_caught(mutation, monkeypatch):
    target = Target(seed=8)
    q = _drafter(8)
    sampled = True
    if mutation == "residual not renormalised":
        monkeypatch.setattr(walk, "_residual", lambda p, proposal: np.maximum(p - proposal, 0.0))
    elif mutation == "sampled siblings not removed from q":
        monkeypatch.setattr(walk, "_without", lambda q, token: q)
    else:  # the top-k tree (not sampled from q) verified as if its children were q's samples
        real = walk.tree_rejection_sample

        def as_sampled(tree, p, draft, flags, rng):
            return real(tree, p, draft, np.ones(len(tree), dtype=bool), rng)

        sampled = False
        monkeypatch.setitem(globals(), "tree_rejection_sample", as_sampled)
    counts, _ = emitted_counts(target, q, 8, (), sampled, trials=2000)  # each gave p < 1e-25 at this size
    assert pvalue(target, counts) < ALPHA, counts


def test_sampled_candidates_are_draws_without_replacement_in_order():
    """The Gumbel top-k trick: the first candidate is distributed as q, the second as q without the first."""
    q = np.array([0.5, 0.3, 0.15, 0.05])
    key = mx.random.key(4)
    firsts, seconds = Counter(), Counter()
    for _ in range(300):
        key, sub = mx.random.split(key)
        ids, _ = best_first(*sampled_candidates(mx.log(mx.array(np.tile(q, (20, 1)))), 2, sub))
        assert (ids[:, 0] != ids[:, 1]).all()
        firsts.update(ids[:, 0].tolist())
        seconds.update(ids[ids[:, 0] == 0, 1].tolist())
    n = sum(firsts.values())
    assert chisquare([firsts[i] for i in range(4)], q * n).pvalue > ALPHA
    rest = q[1:] / q[1:].sum()
    m = sum(seconds.values())
    assert chisquare([seconds[i] for i in range(1, 4)], rest * m).pvalue > ALPHA


def test_tokens_the_drafter_filtered_out_are_never_placed():
    logq = mx.log(mx.array([[0.7, 0.0, 0.3, 0.0], [0.0, 0.0, 0.0, 1.0]]))
    key = mx.random.key(9)
    for _ in range(50):
        key, sub = mx.random.split(key)
        tree = sampled_tree(2, logq, 3, 10, sub)
        assert len(tree) == 5 and set(tree.tokens[tree.depths == 1].tolist()) == {0, 2}
        assert set(tree.tokens[tree.depths == 2].tolist()) == {3}
