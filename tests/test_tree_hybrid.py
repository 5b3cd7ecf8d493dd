"""Draft trees on hybrid GatedDeltaNet targets: each node's recurrence steps from its parent's state and
its conv reads its own ancestors, so every node's output is that of a plain causal pass over its
root-to-node path; the commit replays the accepted path's tape, so the rounds give AR's tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import engine.decode.tree.verify as tree_verify
import engine.models.gdn_tape as gdn_tape
from engine.decode.prompts import encode_prompt
from engine.decode.settings import GenerationSettings
from engine.decode.tree.layout import build_tree, graft
from engine.decode.tree.verify import TreeVerifier
from engine.errors import DFlashError
from engine.models.demo import demo_pairs, sample_prompt
from engine.models.gdn_tape import gdn_layers, instrument
from engine.models.gdn_tree import TreeRows, path_rows
from engine.models.pair import load_pair
from engine.models.target import make_target_cache
from engine.tools.parity import run_parity
from fixtures.tiny_hybrid import HYBRID_KINDS, hybrid_config, sharpen, write_hybrid_drafter, write_hybrid_target
from fixtures.tiny_models import build_target_model
from kernels.gated_delta_ref import gated_delta_tape_ref, tape_replay_ref
from kernels.gated_delta_tree import gated_delta_tree, gated_delta_tree_ref

from helpers import PROMPTS, assert_lossless, prefilled, run

VOCAB = 96


def _random_parents(rng, n: int) -> np.ndarray:
    return np.array([-1] + [int(rng.integers(i)) for i in range(1, n)])


def _path(parents, node):
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


@pytest.mark.parametrize("per_key_gate", [False, True])
def test_each_node_is_the_stepwise_pass_over_its_path(per_key_gate):
    """Random trees: every node's output and innovation equal those of the reference over its root-to-node
    path, bit for bit; replaying a path's tape gives that pass's state. The flat previous row as the
    parent (a chain) does not."""
    rng = np.random.default_rng(5)
    mx.random.seed(5)
    for n in (1, 7, 23):
        hk, hv, dk, dv = 2, 4, 16, 8
        q, k = mx.random.normal((1, n, hk, dk)), mx.random.normal((1, n, hk, dk))
        v, beta = mx.random.normal((1, n, hv, dv)), mx.sigmoid(mx.random.normal((1, n, hv)))
        g = mx.exp(-mx.abs(mx.random.normal((1, n, hv, dk) if per_key_gate else (1, n, hv))))
        state = mx.random.normal((1, hv, dv, dk))
        parents = _random_parents(rng, n)
        y, delta = gated_delta_tree_ref(q, k, v, g, beta, state, parents)
        for node in range(n):
            idx = mx.array(_path(parents, node))
            want_y, want_state, want_delta = gated_delta_tape_ref(q[:, idx], k[:, idx], v[:, idx], g[:, idx],
                                                                 beta[:, idx], state)
            assert mx.array_equal(y[:, node], want_y[:, -1]).item()
            assert mx.array_equal(delta[:, node], want_delta[:, -1]).item()
            assert mx.array_equal(tape_replay_ref(state, k[:, idx], g[:, idx], delta[:, idx]), want_state).item()
        branched = [i for i in range(n) if _path(parents, i) != list(range(i + 1))]
        if branched:
            flat, _ = gated_delta_tree_ref(q, k, v, g, beta, state, np.arange(-1, n - 1))
            assert not mx.allclose(flat[:, branched], y[:, branched], atol=1e-3).item()


def test_the_closed_form_tree_pass_matches_the_paths_to_rounding():
    """On the CPU with one gate per head, gated_delta_tree solves the whole tree at once: each node's
    output and innovation are the stepwise pass's over its path to rounding; flat parents are not."""
    rng = np.random.default_rng(9)
    mx.random.seed(9)
    n, hk, hv, dk, dv = 29, 2, 4, 16, 8
    q, k = mx.random.normal((1, n, hk, dk)), mx.random.normal((1, n, hk, dk))
    q, k = q / mx.linalg.norm(q, axis=-1, keepdims=True), k / mx.linalg.norm(k, axis=-1, keepdims=True)
    v, beta = mx.random.normal((1, n, hv, dv)), mx.sigmoid(mx.random.normal((1, n, hv)))
    g = mx.exp(-mx.abs(mx.random.normal((1, n, hv))))
    state = mx.random.normal((1, hv, dv, dk))
    parents = _random_parents(rng, n)
    y, delta = gated_delta_tree(q, k, v, g, beta, state, parents)
    want_y, want_delta = gated_delta_tree_ref(q, k, v, g, beta, state, parents)
    assert not mx.array_equal(y, want_y).item()  # the closed form ran, not the reference
    assert mx.allclose(y, want_y, atol=1e-4).item() and mx.allclose(delta, want_delta, atol=1e-4).item()
    flat, _ = gated_delta_tree(q, k, v, g, beta, state, np.arange(-1, n - 1))
    assert not mx.allclose(flat, want_y, atol=1e-3).item()


def test_the_tree_rows_made_once_per_verify_are_each_nodes_ancestors():
    """TreeRows (built a generation at a time) against each node's path walked one parent at a time: the
    ancestor mask, and the conv rows at several conv widths (the conv state where a path is shorter)."""
    rng = np.random.default_rng(2)
    for n in (1, 2, 9, 40):
        for _ in range(5):
            parents = _random_parents(rng, n)
            rows = TreeRows(parents)
            want = np.zeros((n, n), dtype=bool)
            for node in range(n):
                want[node, _path(parents, node)] = True
            assert (rows.ancestors == want).all() and (np.array(rows.seen) == want).all()
            for keep in (0, 1, 3, 5):
                got = np.array(rows.conv_rows(keep))
                assert got.tolist() == [path_rows(_path(parents, node), keep, keep + 1) for node in range(n)]
    with pytest.raises(ValueError, match="node 2's parent 3 does not come before it"):
        TreeRows(np.array([-1, 0, 3, 1]))


def _model(kind: str):
    mx.random.seed(HYBRID_KINDS.index(kind))
    model = build_target_model(hybrid_config(kind, VOCAB, 0))
    sharpen(model)
    model.eval()
    mx.eval(model.parameters())
    instrument(model)
    return model


def _causal(model, tokens):
    cache = make_target_cache(model)
    return np.array(model(mx.array(tokens)[None], cache=cache)[0]), cache


def _random_tree(rng):
    ids = np.stack([rng.choice(VOCAB, size=3, replace=False) for _ in range(5)])
    logq = np.sort(np.log(rng.dirichlet(np.ones(8), size=5))[:, :3], axis=1)[:, ::-1]
    return graft(build_tree(int(rng.integers(VOCAB)), ids, logq, int(rng.integers(6, 16))),
                 rng.integers(VOCAB, size=3).tolist())


def _check_tree_verify(model, rng):
    """One random tree over a random prompt: logits per node as a causal pass over its path; after
    compact, the caches those of a causal pass over the accepted tokens."""
    prompt = rng.integers(VOCAB, size=int(rng.integers(2, 9))).tolist()
    cache, tree = prefilled(model, prompt), _random_tree(rng)
    verifier = TreeVerifier(model, cache)
    logits = np.array(verifier.forward(tree))
    for leaf in sorted(set(range(len(tree))) - set(tree.parents.tolist())):
        path = tree.path_to(leaf)
        want, _ = _causal(model, prompt + tree.tokens[path].tolist())
        np.testing.assert_allclose(logits[path], want[len(prompt):], atol=2e-4, rtol=1e-4)
    path = tree.path_to(int(rng.integers(len(tree))))
    verifier.compact(len(prompt), path)
    _, want = _causal(model, prompt + tree.tokens[path].tolist())
    for i, _ in gdn_layers(model):
        for got, ref in zip(cache[i].cache, want[i].cache):
            np.testing.assert_allclose(np.array(got), np.array(ref), atol=2e-5, rtol=1e-4)
    nxt = int(rng.integers(VOCAB))
    step = np.array(model(mx.array([[nxt]]), cache=cache)[0, -1])
    np.testing.assert_allclose(step, _causal(model, prompt + tree.tokens[path].tolist() + [nxt])[0][-1],
                               atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("impl", ["closed-form", "reference"])
@pytest.mark.parametrize("kind", HYBRID_KINDS)
def test_tree_verify_is_a_causal_pass_per_path_and_commits_the_accepted_one(kind, impl, monkeypatch):
    if impl == "reference":
        monkeypatch.setattr(gdn_tape, "gated_delta_tree", lambda *a: gated_delta_tree_ref(*a[:-1]))  # no mask
    model, rng = _model(kind), np.random.default_rng(HYBRID_KINDS.index(kind))
    for _ in range(4):
        _check_tree_verify(model, rng)


@pytest.mark.parametrize("broken", ["recurrence", "conv", "commit"])
def test_flat_rows_instead_of_ancestors_fail(broken, monkeypatch):
    """Mutations: the previous flat row's state, or the previous flat rows in the conv, instead of the
    node's parent and ancestors; the commit replaying the flat rows instead of the accepted path. The
    per-path check catches each."""
    chain = lambda parents: np.arange(-1, len(parents) - 1)  # noqa: E731
    if broken == "commit":
        real = tree_verify.commit_path
        monkeypatch.setattr(tree_verify, "commit_path", lambda caches, path: real(caches, list(range(len(path)))))
    elif broken == "recurrence":
        real = gdn_tape.gated_delta_tree  # (..., parents, seen): the flat parents and their mask
        monkeypatch.setattr(gdn_tape, "gated_delta_tree", lambda *a: real(*a[:-2], chain(a[-2])))
    else:
        real = gdn_tape.conv_windows
        monkeypatch.setattr(gdn_tape, "conv_windows",
                            lambda conv, x, tree, keep: real(conv, x, TreeRows(chain(tree.parents)), keep))
    model, rng = _model("qwen3_5"), np.random.default_rng(0)
    with pytest.raises(AssertionError):
        for _ in range(4):
            _check_tree_verify(model, rng)


def test_a_commit_without_the_tree_tape_is_refused():
    model = _model("qwen3_next")
    cache = prefilled(model, [3, 4, 5])
    tree = build_tree(1, np.array([[2, 3]]), np.log(np.array([[0.6, 0.3]])), 2)
    verifier = TreeVerifier(model, cache)
    mx.eval(verifier.forward(tree))
    verifier.compact(3, [0, 2])
    with pytest.raises(DFlashError, match="without recording its tree tape"):
        verifier.compact(3, [0])


@pytest.fixture(scope="module")
def hybrid_pair(models_root, tokenizer_dir):
    target = models_root / "tree-hybrid-target"
    if not target.exists():
        write_hybrid_target(target, tokenizer_dir, "qwen3_5", seed=3)
        write_hybrid_drafter(models_root / "tree-hybrid-drafter", target)
    return load_pair(target, models_root / "tree-hybrid-drafter")


@pytest.mark.parametrize("settings", [dict(tree=6), dict(tree=10, lookup=True), dict(tree_auto=True),
                                      dict(tree_auto=True, auto=True, lookup=True), dict(tree=6, rollback="rerun")],
                         ids=["tree6", "tree10-lookup", "auto", "auto-lookup", "tree6-rerun"])
def test_tiny_hybrid_tree_rounds_give_ar_output(hybrid_pair, settings):
    assert GenerationSettings(**settings).resolved(hybrid_pair).uses_tree
    assert_lossless(hybrid_pair, PROMPTS[:2], **settings)
    tree, rounds = run(hybrid_pair, PROMPTS[0], max_tokens=32, **settings)
    chain, _ = run(hybrid_pair, PROMPTS[0], max_tokens=32, **{k: v for k, v in settings.items() if "tree" not in k})
    assert tree.token_ids == chain.token_ids
    if "tree" in settings:
        assert any(r.tree_parents for r in rounds)


def test_demo_hybrid_pair_trees_are_lossless_and_take_second_choices():
    target, drafter = next((t, d) for t, d in demo_pairs() if "hybrid" in t.name)
    pair = load_pair(target, drafter)
    ids = encode_prompt(pair.tokenizer, sample_prompt(target), chat=False)
    for settings in (dict(tree=15), dict(tree=15, lookup=True), dict(tree_auto=True, auto=True, lookup=True)):
        result = run_parity(pair, ids, GenerationSettings(max_tokens=64, **settings))
        assert result.identical, (settings, result.first_divergence, result.margin_at_divergence)
    _, rounds = run(pair, ids, max_tokens=64, tree=15)
    trees = [r for r in rounds if r.tree_parents]
    assert trees and any(any(r.tree_ranks[i] > 0 for i in r.tree_path) for r in trees)
