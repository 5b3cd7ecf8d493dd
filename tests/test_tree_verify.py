"""engine/decode/tree/verify.py on tiny real targets: a tree's one forward gives every node the logits
a plain causal forward over its root-to-node path gives, and after compaction the cache continues
as AR over the accepted tokens would."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine.decode.tree.layout import build_tree, graft
from engine.decode.tree.verify import TreeVerifier
from engine.errors import DFlashError
from engine.models.kernel_dispatch import install_kernels
from engine.models.target import load_target, make_target_cache
from fixtures import tiny_models as tm
from helpers import prefilled
from kernels import verify_attention as va

FAMILIES = ["qwen3", "llama", "mistral", "gemma3_text"]  # mistral, gemma3: sliding-window layers (8)


@pytest.fixture(scope="module")
def targets(models_root, tokenizer_dir):
    models = {}
    for n, family in enumerate(FAMILIES):
        path = models_root / f"tree-{family}-target"
        if not path.exists():
            tm.write_target(path, tokenizer_dir, seed=60 + n, model_type=family)
        model = load_target(path)[0]
        install_kernels(model, mx.cpu)
        models[family] = model
    return models


def _causal_logits(model, tokens):
    return np.array(model(mx.array(tokens)[None], cache=make_target_cache(model))[0])


def _random_tree(rng, vocab, budget):
    ids = np.stack([rng.choice(vocab, size=3, replace=False) for _ in range(6)])
    logq = np.sort(np.log(rng.dirichlet(np.ones(8), size=6))[:, :3], axis=1)[:, ::-1]
    tree = build_tree(int(rng.integers(vocab)), ids, logq, budget)
    return graft(tree, rng.integers(vocab, size=4).tolist())  # a copy: one more branch


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("path", ["host-kernel", "graph-kernel", "mlx-attention"])
def test_each_node_gets_the_logits_of_its_own_path(targets, family, path, monkeypatch):
    monkeypatch.setattr(va, "MIN_HOST_SCORES", 0 if path == "host-kernel" else 1 << 40)
    monkeypatch.setattr(va, "MIN_GRAPH_SCORES", 0 if path == "graph-kernel" else 1 << 40)
    model = targets[family]
    vocab = model.args.vocab_size
    rng = np.random.default_rng(len(family) + len(path))
    for trial in range(3):
        prompt = rng.integers(vocab, size=int(rng.integers(3, 14))).tolist()  # past the window of 8, and not
        cache = prefilled(model, prompt)
        verifier = TreeVerifier(model, cache)
        tree = _random_tree(rng, vocab, budget=int(rng.integers(6, 20)))
        logits = np.array(verifier.forward(tree))
        assert logits.shape[0] == len(tree) and cache[0].offset == len(prompt) + len(tree)
        leaves = sorted(set(range(len(tree))) - set(tree.parents.tolist()))
        for leaf in leaves:  # one causal forward per leaf covers every node on its path
            path = tree.path_to(leaf)
            want = _causal_logits(model, prompt + tree.tokens[path].tolist())[len(prompt):]
            np.testing.assert_allclose(logits[path], want, atol=2e-4, rtol=1e-4)
        # compaction keeps one path: the next step from the cache is AR's over the accepted tokens
        path = tree.path_to(int(rng.choice(leaves)))[: int(rng.integers(1, 5))]
        verifier.compact(len(prompt), path)
        nxt = int(rng.integers(vocab))
        step = np.array(model(mx.array([[nxt]]), cache=cache)[0, -1])
        accepted = prompt + tree.tokens[path].tolist()
        np.testing.assert_allclose(step, _causal_logits(model, accepted + [nxt])[-1], atol=2e-4, rtol=1e-4)
        assert cache[0].offset == len(accepted) + 1


def test_a_tree_is_not_a_chain_to_the_target(targets):
    """The mask and the positions matter: the flat tree run as a plain causal block gives other logits."""
    model = targets["qwen3"]
    rng = np.random.default_rng(5)
    prompt = rng.integers(model.args.vocab_size, size=6).tolist()
    tree = _random_tree(rng, model.args.vocab_size, 12)
    logits = np.array(TreeVerifier(model, prefilled(model, prompt)).forward(tree))
    flat = _causal_logits(model, prompt + tree.tokens.tolist())[len(prompt):]
    branched = [i for i in range(len(tree)) if tree.path_to(i) != list(range(i + 1))]
    assert branched and not np.allclose(logits[branched], flat[branched], atol=1e-3)
    assert np.allclose(logits[0], flat[0], atol=2e-4)  # the root sees only the context either way


def test_a_quantized_cache_is_refused_clearly(targets):
    from mlx_lm.models.cache import QuantizedKVCache

    model = targets["qwen3"]
    cache = make_target_cache(model)
    cache[1] = QuantizedKVCache()
    with pytest.raises(DFlashError, match="a draft tree needs plain KV caches .*layer 1 keeps a QuantizedKVCache"):
        TreeVerifier(model, cache)


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_rounds_of_tree_verify_give_ar_tokens_at_t0(targets, family, monkeypatch):
    """The pieces as a round loop would use them (build, verify, greedy walk, compact, the bonus as the
    next anchor), with candidates that hold AR's next tokens at random ranks or miss them: the output
    is AR's token for token, and second choices were taken on the way."""
    monkeypatch.setattr(va, "MIN_HOST_SCORES", 0)
    from engine.decode.tree.walk import greedy_walk

    model = targets[family]
    vocab = model.args.vocab_size
    rng = np.random.default_rng(11)
    prompt = rng.integers(vocab, size=9).tolist()
    ar_cache, ar = prefilled(model, prompt[:-1]), [prompt[-1]]
    for _ in range(40):
        ar.append(int(mx.argmax(model(mx.array([[ar[-1]]]), cache=ar_cache)[0, -1]).item()))
    cache, out, took_second = prefilled(model, prompt[:-1]), [prompt[-1]], 0
    verifier = TreeVerifier(model, cache)  # one for the run, as the round loop makes it
    while len(out) < len(ar):
        want = ar[len(out):len(out) + 6]
        ids = np.stack([rng.choice(np.setdiff1d(np.arange(vocab), [t]), size=3, replace=False) for t in want])
        for d, token in enumerate(want):
            if rng.random() < 0.8:
                ids[d, int(rng.integers(3))] = token
        logq = np.sort(np.log(rng.dirichlet(np.ones(6), size=len(want)))[:, :3], axis=1)[:, ::-1]
        tree = build_tree(out[-1], ids, logq, 10)
        prefix = cache[0].offset
        logits = verifier.forward(tree)
        path, bonus = greedy_walk(tree, np.array(mx.argmax(logits, axis=-1)).tolist())
        verifier.compact(prefix, path)
        took_second += int((tree.ranks[path[1:]] > 0).sum())
        out += tree.tokens[path[1:]].tolist() + [bonus]
    assert out[:len(ar)] == ar and took_second > 0
