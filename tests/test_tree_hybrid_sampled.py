"""Draft trees on a hybrid GatedDeltaNet target at T > 0: a round's commit replays the recurrent state and
the conv rows along the accepted path, so the tokens after it are distributed exactly as AR's; a commit
of the flat first rows instead (or of their conv rows alone) is caught once a second choice was taken.

The pair is softened so that second choices are accepted often and the outcomes are few: both heads
see only three tokens (the untied head's bias), sampled at top-k 3. Each run's first four tokens are
the prefill's, round 1's tree (block 2: its accepted node and the token after it), then the first
token whose target pass starts from round 1's committed state."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import pytest

import engine.decode.tree.verify as tree_verify
import engine.models.gdn_tree as gdn_tree
from engine.decode.settings import SamplingSettings
from engine.models.pair import load_pair
from fixtures.tiny_hybrid import write_hybrid_drafter, write_hybrid_target

from distribution import RUNS, assert_draws_from, assert_rejected, exact_outcomes
from helpers import run

SAMPLED = dict(temperature=1.0, top_k=3)
TREE = dict(tree=2, block_size=2)  # the root's first and second choice: a second choice is an off-chain path
TOKENS = 4  # the prefill's, round 1's (at most two), then one past round 1's commit
SHOWN = (100, 200, 300)  # the only tokens either head can give (the rest 100 below)


@pytest.fixture(scope="module")
def soft_hybrid(models_root, tokenizer_dir):
    """A tiny qwen3_next target (untied head) and a random drafter, both confined to SHOWN: the head's
    bias leaves every other token 100 below, so the top 3 of both are SHOWN at probabilities set by
    each one's hidden state. They overlap by construction, and the drafter, random, is often wrong
    first and right second. The target's final norm is tripled: its logits, and so what a wrong
    recurrent state moves them by, three times as large (the mutations' effect)."""
    target, drafter = models_root / "soft-hybrid-target", models_root / "soft-hybrid-drafter"
    if not target.exists():
        write_hybrid_target(target, tokenizer_dir, "qwen3_next", seed=3)
        write_hybrid_drafter(drafter, target, block_size=4)
    pair = load_pair(target, drafter)
    head = pair.head.lm_head  # the target's own head, which the drafter borrows
    bias = mx.full((head.weight.shape[0],), -100.0)
    bias[mx.array(SHOWN)] = 0.0
    head.bias = bias
    pair.target.model.norm.weight = pair.target.model.norm.weight * 3
    return pair


@pytest.fixture(scope="module")
def exact_first_four(soft_hybrid):
    """AR's exact distribution of the first TOKENS tokens (tests/distribution.py)."""
    ids = [7, 8, SHOWN[0]]
    return ids, exact_outcomes(soft_hybrid, ids, SamplingSettings(**SAMPLED), tokens=TOKENS)


def _first_four(pair, ids, seeds) -> tuple[Counter, int]:
    """(outcomes, runs whose first tree round accepted a second choice and committed before the last
    measured token): the runs in which a commit along an off-chain path decides a measured token."""
    counts, off_chain = Counter(), 0
    for seed in seeds:
        summary, rounds = run(pair, ids, sampling=SamplingSettings(seed=seed, **SAMPLED), max_tokens=TOKENS, **TREE)
        counts[tuple(summary.token_ids[:TOKENS])] += 1
        first = rounds[0]
        assert first.tree_parents and first.source == "drafter"
        if any(first.tree_ranks[i] > 0 for i in first.tree_path) and 1 + len(first.committed) < TOKENS:
            off_chain += 1
    return counts, off_chain


def test_sampled_hybrid_tree_rounds_give_the_target_distribution(soft_hybrid, exact_first_four):
    """About a third of the runs take round 1's second choice; over all of them, the first four tokens
    (the last after round 1's commit) fit AR's exact distribution (chi-square)."""
    ids, exact = exact_first_four
    counts, off_chain = _first_four(soft_hybrid, ids, range(RUNS))
    assert off_chain >= RUNS // 8, off_chain
    assert_draws_from(counts, exact)


# Runs each mutation needs: runs_for_power (tests/distribution.py) on its effect measured over 2,400
# runs, with a margin (docs/test-suite.md has the figures).
MUTATION_RUNS = {"flat rows committed": 250, "flat conv rows committed": 120}


@pytest.mark.parametrize("mutation", list(MUTATION_RUNS))
def test_sampled_hybrid_commit_mutations_are_caught(soft_hybrid, exact_first_four, monkeypatch, mutation):
    """The commit replaying the tree's first rows (range(len(path))) instead of the accepted path, or
    only its conv rows taken from them: the state after a second choice is the first choice's, and
    the next token is not AR's."""
    if mutation == "flat rows committed":
        real = tree_verify.commit_path
        monkeypatch.setattr(tree_verify, "commit_path", lambda caches, path: real(caches, list(range(len(path)))))
    else:
        rows = gdn_tree.path_rows
        monkeypatch.setattr(gdn_tree, "path_rows", lambda path, keep, width: rows(list(range(len(path))), keep, width))
    ids, exact = exact_first_four
    counts, off_chain = _first_four(soft_hybrid, ids, range(5000, 5000 + MUTATION_RUNS[mutation]))
    assert off_chain >= MUTATION_RUNS[mutation] // 8, off_chain  # the mutation had runs to show in
    assert_rejected(counts, exact)
