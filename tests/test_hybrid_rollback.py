"""Rollback of hybrid targets, one verify block at a time, on tiny in-memory qwen3_5 / qwen3_next models.

- The taped GatedDeltaNet forward is mlx-lm's forward, bit for bit (outputs and caches),
  through the stepwise reference; to rounding through the CPU's chunked pass.
- After every possible partial accept, tape replay and re-run restore the same state
  (bit for bit through the reference, to rounding after a chunked verify), and it is
  the state of running only the accepted tokens.
- A fully accepted block leaves the caches alone; attention caches are trimmed.
"""

import mlx.core as mx
import pytest

import kernels.gated_delta as gd
from mlx_lm.models.cache import ArraysCache, KVCache

from engine.decode.hybrid_rollback import HybridRollback
from engine.models.gdn_tape import is_hybrid as applies
from engine.models.gdn_tape import gdn_layers, instrument, is_instrumented, uninstrument
from engine.decode.rollback import make_rollback
from engine.models.target import rollback_kind
from engine.models.target import make_target_cache
from fixtures.tiny_hybrid import HYBRID_KINDS, hybrid_config, sharpen
from fixtures.tiny_models import build_target_model, target_config

VOCAB = 96
BLOCK = 6


def build(kind: str, seed: int = 0):
    mx.random.seed(seed)
    model = build_target_model(hybrid_config(kind, VOCAB, 0))
    sharpen(model)
    model.eval()  # as mlx_lm.load leaves it; in training mode the layer defers to mlx-lm's own forward
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="module", params=HYBRID_KINDS)
def model(request):
    return build(request.param, seed=HYBRID_KINDS.index(request.param))


@pytest.fixture(params=["reference", "chunked"])
def same(request, monkeypatch):
    """How closely two ways to the same state must agree: bit for bit through the stepwise
    reference, to rounding when the verify took the chunked pass."""
    if request.param == "reference":
        monkeypatch.setattr(gd, "_chunked_fits", lambda k, g: False)
        return lambda a, b: mx.array_equal(a, b).item()
    return lambda a, b: mx.allclose(a, b, atol=1e-4, rtol=1e-4).item()


def tokens(n: int, seed: int) -> mx.array:
    mx.random.seed(seed)
    return mx.random.randint(0, VOCAB, (1, n))


def states(cache) -> list:
    out = []
    for c in cache:
        if isinstance(c, ArraysCache):
            out += [c[0], c[1]]
        else:
            out += [c.keys[..., : c.offset, :], c.values[..., : c.offset, :]]
    return out


def prefilled(model, prompt):
    cache = make_target_cache(model)
    model(prompt, cache=cache)
    mx.eval(states(cache))
    return cache


def test_taped_forward_is_mlx_lm_forward(model, same):
    prompt, block = tokens(11, 1), tokens(BLOCK, 2)
    uninstrument(model)
    assert not any(is_instrumented(m) for _, m in gdn_layers(model))
    plain = prefilled(model, prompt)
    plain_logits = [model(block, cache=plain), model(block[:, :1], cache=plain)]
    assert instrument(model) == len(list(gdn_layers(model))) > 0
    taped = prefilled(model, prompt)
    taped_logits = [model(block, cache=taped), model(block[:, :1], cache=taped)]
    for a, b in zip(plain_logits + states(plain), taped_logits + states(taped)):
        assert same(a, b)


@pytest.mark.parametrize("accepted", range(BLOCK))
def test_replay_and_rerun_restore_the_accepted_state(model, accepted, same):
    prompt, block = tokens(9, 3), tokens(BLOCK, 4)
    n = accepted + 1
    restored = {}
    for mode in ("replay", "rerun"):
        cache = prefilled(model, prompt)
        rollback = make_rollback(model, cache, prefer=mode)
        assert isinstance(rollback, HybridRollback) and rollback.mode == mode
        with rollback.recording():
            mx.eval(model(block, cache=cache))
        rollback.after_verify(accepted, BLOCK)
        restored[mode] = cache

    # The two strategies agree.
    for a, b in zip(states(restored["replay"]), states(restored["rerun"])):
        assert same(a, b)

    # And they are where running only the accepted tokens leads (to floating-point noise:
    # the projections of n rows and of BLOCK rows may round differently).
    reference = prefilled(model, prompt)
    model(block[:, :n], cache=reference)
    for a, b in zip(states(restored["replay"]), states(reference)):
        assert a.shape == b.shape
        assert mx.allclose(a, b, atol=1e-5, rtol=1e-5).item()
    for c in restored["replay"]:
        if isinstance(c, KVCache):
            assert c.offset == prompt.shape[1] + n  # attention layers trimmed to the accepted tokens
    nxt = tokens(1, 5)
    assert mx.allclose(model(nxt, cache=restored["replay"]), model(nxt, cache=reference), atol=1e-4).item()


def test_full_accept_replays_nothing(model):
    cache = prefilled(model, tokens(9, 6))
    rollback = make_rollback(model, cache)
    with rollback.recording():
        model(tokens(BLOCK, 7), cache=cache)
    recurrent = [c for c in cache if isinstance(c, ArraysCache)]
    after_verify = [(c[0], c[1]) for c in recurrent]
    offsets = [c.offset for c in cache if isinstance(c, KVCache)]
    rollback.after_verify(BLOCK - 1, BLOCK)
    assert all(c[0] is conv and c[1] is state for c, (conv, state) in zip(recurrent, after_verify))  # untouched
    assert [c.offset for c in cache if isinstance(c, KVCache)] == offsets
    assert rollback.tapes == {}  # the tape is dropped


def test_tape_holds_fp32_innovations(model):
    cache = prefilled(model, tokens(5, 8))
    rollback = make_rollback(model, cache)
    with rollback.recording():
        model(tokens(BLOCK, 9), cache=cache)
    model(tokens(1, 10), cache=cache)  # a step outside the block records nothing: the tapes keep BLOCK steps
    for _, c, keep in rollback.recurrent:
        tape = rollback.tapes[id(c)]
        assert tape.recorded and tape.delta.dtype == mx.float32 and tape.g.dtype == mx.float32
        assert tape.delta.shape[1] == tape.k.shape[1] == tape.g.shape[1] == BLOCK
        assert tape.conv_input.shape[1] == keep + BLOCK
        assert tape.v is None and tape.beta is None  # replay needs neither
    rollback.after_verify(0, BLOCK)


def test_strategy_selection():
    hybrid = build("qwen3_5")
    assert applies(hybrid, make_target_cache(hybrid))
    assert rollback_kind(hybrid) == "tape-replay"
    assert make_rollback(hybrid, make_target_cache(hybrid), prefer="rerun").kind == "rerun"
    mx.random.seed(0)
    dense = build_target_model(target_config(VOCAB, 0))
    assert not applies(dense, make_target_cache(dense))
    assert rollback_kind(dense) == "kv-trim"
    from engine.errors import DFlashError

    with pytest.raises(DFlashError, match="rollback"):
        make_rollback(hybrid, make_target_cache(hybrid), prefer="undo")


def test_untied_qwen3_5_head_is_borrowed(tokenizer_dir, tmp_path):
    """qwen3_5 keeps an untied lm_head under language_model: the drafter must borrow that, not the embedding."""
    from engine.models.pair import load_pair
    from fixtures.tiny_hybrid import write_hybrid_drafter, write_hybrid_target

    target = write_hybrid_target(tmp_path / "t", tokenizer_dir, "qwen3_5", tie_word_embeddings=False)
    write_hybrid_drafter(tmp_path / "d", target)
    pair = load_pair(target, tmp_path / "d")
    assert pair.head.lm_head is pair.target.language_model.lm_head


def test_a_whole_sequence_trains_through_the_chunked_pass(model, monkeypatch):
    """Without a cache (training, the drafter trainer's target pass) the CPU takes the chunked pass;
    its loss and gradients are mlx-lm's stepwise ones to rounding."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    x = tokens(24, 8)
    calls = []
    chunked = gd.gated_delta_tape_chunked
    monkeypatch.setattr(gd, "gated_delta_tape_chunked", lambda *a: calls.append(1) or chunked(*a))

    def loss_and_grads():
        loss = lambda m: nn.losses.cross_entropy(m(x[:, :-1]), x[:, 1:], reduction="mean")  # noqa: E731
        value, grads = nn.value_and_grad(model, loss)(model)
        return value, dict(tree_flatten(grads))

    model.train()
    try:
        uninstrument(model)
        want, want_grads = loss_and_grads()
        assert not calls
        instrument(model)
        got, got_grads = loss_and_grads()
    finally:
        model.eval()
    assert len(calls) == len(list(gdn_layers(model)))
    assert mx.allclose(got, want, atol=1e-5, rtol=1e-5).item()
    assert want_grads.keys() == got_grads.keys()
    for name, g in want_grads.items():
        assert mx.allclose(got_grads[name], g, atol=1e-4, rtol=1e-3).item(), name
