"""engine/decode/tree: the best-first tree, the grafted copy, the ancestor-only mask, and the greedy walk,
each against a brute force over random candidates."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest

from engine.decode.tree.layout import COPY_RANK, attention_mask, build_tree, graft, ranked_candidates
from engine.decode.tree.walk import greedy_walk


def _candidates(rng, depth, width, vocab=50):
    ids = np.stack([rng.choice(vocab, size=width, replace=False) for _ in range(depth)])
    logq = np.sort(np.log(rng.dirichlet(np.ones(vocab), size=depth))[:, :width], axis=1)[:, ::-1]
    return ids, logq


def _rank_paths(tree):
    """Each node's ranks from the root, e.g. (0, 1) for the second choice under the first choice."""
    return [tuple(int(tree.ranks[n]) for n in tree.path_to(i)[1:]) for i in range(len(tree))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [0, 1, 5, 17, 200])
def test_the_tree_holds_the_best_scoring_prefixes(seed, budget):
    rng = np.random.default_rng(seed)
    ids, logq = _candidates(rng, depth=4, width=3)
    tree = build_tree(7, ids, logq, budget)
    every = [r for d in range(1, 5) for r in itertools.product(range(3), repeat=d)]
    best = sorted(every, key=lambda r: -sum(logq[i, k] for i, k in enumerate(r)))[:budget]
    assert len(tree) == min(budget, len(every)) + 1
    assert set(_rank_paths(tree)[1:]) == set(best)
    assert tree.tokens[0] == 7 and tree.parents[0] == -1 and tree.depths[0] == 0
    for node in range(1, len(tree)):
        parent = tree.parents[node]
        assert 0 <= parent < node and tree.depths[node] == tree.depths[parent] + 1
        assert tree.tokens[node] == ids[tree.depths[node] - 1, tree.ranks[node]]
        assert np.isclose(tree.scores[node], tree.scores[parent] + logq[tree.depths[node] - 1, tree.ranks[node]])
        siblings = tree.children(parent)
        assert [tree.ranks[s] for s in siblings] == sorted(tree.ranks[s] for s in siblings)


def test_impossible_candidates_are_never_taken():
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    logq = np.array([[-0.1, -2.0, -np.inf], [-0.5, -np.inf, -np.inf]])
    tree = build_tree(0, ids, logq, 50)
    assert sorted(tree.tokens[1:].tolist()) == [1, 2, 4, 4]


def test_a_copy_follows_the_tree_where_it_matches_and_branches_where_it_does_not():
    rng = np.random.default_rng(3)
    ids, logq = _candidates(rng, 3, 2)
    tree = build_tree(9, ids, logq, 14)  # every prefix of 3 depths of 2
    chain = tree.tokens[tree.path_to(max(range(len(tree)), key=lambda i: tree.depths[i]))[1:]].tolist()
    assert len(chain) == 3
    copy = chain[:2] + [999, 998]
    grown = graft(tree, copy)
    assert len(grown) == len(tree) + 2
    assert grown.tokens[grown.path_to(len(grown) - 1)].tolist() == [9] + copy
    assert grown.ranks[-2:].tolist() == [COPY_RANK, COPY_RANK] and grown.depths[-1] == 4
    assert graft(tree, chain) is tree  # already there: nothing added


@pytest.mark.parametrize("seed", range(5))
def test_the_mask_lets_a_node_see_the_context_and_its_ancestors_only(seed):
    rng = np.random.default_rng(seed)
    tree = graft(build_tree(1, *_candidates(rng, 5, 3), 12), [5, 6, 7])
    prefix, n = 9, len(tree)
    mask = np.array(attention_mask(tree, prefix))
    assert mask.shape == (n, prefix + n) and mask[:, :prefix].all()
    for i in range(n):
        assert set(np.flatnonzero(mask[i, prefix:])) == set(tree.path_to(i))
    assert (tree.positions(prefix) == prefix + np.array([len(tree.path_to(i)) - 1 for i in range(n)])).all()
    window = 4
    windowed = np.array(attention_mask(tree, prefix, window))
    keys = np.concatenate([np.arange(prefix), tree.positions(prefix)])
    assert (windowed == mask & (tree.positions(prefix)[:, None] - keys[None] < window)).all()


@pytest.mark.parametrize("seed", range(20))
def test_the_greedy_walk_commits_the_deepest_path_the_target_agrees_with(seed):
    rng = np.random.default_rng(seed)
    ids, logq = _candidates(rng, 5, 3, vocab=4 + seed % 3)
    tree = build_tree(0, ids, logq, 14)
    choice = rng.integers(0, 4 + seed % 3, size=len(tree))
    for node in rng.choice(len(tree), size=2):  # make some deep paths agree
        for a, b in zip(tree.path_to(int(node)), tree.path_to(int(node))[1:]):
            choice[a] = tree.tokens[b]
    path, bonus = greedy_walk(tree, choice)

    def agrees(i):
        p = tree.path_to(i)
        return all(choice[a] == tree.tokens[b] for a, b in zip(p, p[1:]))

    deepest = max((i for i in range(len(tree)) if agrees(i)), key=lambda i: tree.depths[i])
    assert path == tree.path_to(deepest) and bonus == choice[deepest]


def test_a_chain_walk_is_the_chains_acceptance():
    tree = build_tree(5, np.array([[1], [2], [3]]), np.zeros((3, 1)), 3)  # one candidate a depth: a chain
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    assert greedy_walk(tree, [1, 2, 0, 9]) == ([0, 1, 2], 0)
    assert greedy_walk(tree, [1, 2, 3, 9]) == ([0, 1, 2, 3], 9)
    assert greedy_walk(tree, [4, 2, 3, 9]) == ([0], 4)


def test_ranked_candidates_are_each_rows_best_tokens_in_order():
    logits = mx.random.normal((3, 40), key=mx.random.key(1))
    ids, logq = ranked_candidates(logits, 5)
    want = np.argsort(-np.array(logits), axis=-1)[:, :5]
    assert (ids == want).all()
    lp = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
    np.testing.assert_allclose(logq, np.take_along_axis(lp, want, axis=-1), rtol=1e-5)


def test_ranked_candidates_at_a_real_vocabulary_take_ties_by_token_id_as_argmax_does():
    """The top k of a vocabulary's row without sorting it (top_k_indices' chunks at 4096): the order
    of a full stable sort, so ties go to the lower token id and rank 0 is the row's argmax."""
    rows = np.array(mx.random.normal((3, 4096), key=mx.random.key(2)))
    rows[1, [3000, 17, 900]] = 9.0  # a three-way tie for the best
    rows[1, 50] = 8.0
    rows[2] = np.round(rows[2], 1)  # many ties at the second and later ranks
    ids, logq = ranked_candidates(mx.array(rows), 4)
    want = np.argsort(-rows, axis=-1, kind="stable")[:, :4]
    assert (ids == want).all() and ids[1].tolist() == [17, 900, 3000, 50]
    assert (ids[:, 0] == np.array(mx.argmax(mx.array(rows), axis=-1))).all()
    assert (np.diff(logq, axis=-1) <= 0).all()
