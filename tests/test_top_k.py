"""The DFlash2 selector's candidates at a large vocabulary: top_k_indices finds the same top k as a
partition of the whole row (chunked rows, rows no chunk divides, ties, -inf), and rounds drafted
through its chunked path are the rounds of the plain partition."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import engine.decode.top_k as top_k
from engine.decode.top_k import top_k_indices

from engine.decode.settings import SamplingSettings
from engine.models.pair import load_pair

from fixtures.tiny_dflash2 import write_dflash2_drafter
from helpers import run


@pytest.fixture(scope="module")
def dflash2_pair(qwen3_untied_dirs, tmp_path_factory):
    target = qwen3_untied_dirs[0]
    return load_pair(target, write_dflash2_drafter(tmp_path_factory.mktemp("dflash2") / "drafter", target, seed=5))


def _top_values(x: np.ndarray, k: int) -> np.ndarray:
    return -np.sort(-np.partition(x, x.shape[-1] - k, axis=-1)[..., -k:], axis=-1)


@pytest.mark.parametrize("shape", [(15, 151936), (3, 32064), (2, 4, 9088), (3, 20001)])
def test_the_same_indices_as_a_partition_of_the_row(shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)  # distinct values: one right answer
    got = np.array(top_k_indices(mx.array(x), 8))
    want = np.argpartition(-x, 7, axis=-1)[..., :8]
    assert got.shape == want.shape
    assert (np.sort(got, axis=-1) == np.sort(want, axis=-1)).all()


def test_a_row_of_few_finite_entries_gives_each_once():
    """Fewer finite entries than k, on the chunked path: each finite entry once, then other real
    indices (at -inf), never one twice (a padded last chunk once gave its clamped index twice)."""
    for width in (2944, 2946):  # chunks of 128; a width no chunk size divides
        x = np.full((2, width), -np.inf, np.float32)
        x[0, [2673, 2772, width - 1]] = 0.0
        x[1, :8] = np.arange(8)
        got = np.array(top_k_indices(mx.array(x), 5))
        assert {2673, 2772, width - 1} <= set(got[0]) and len(set(got[0])) == 5 and got.max() < width
        assert sorted(got[1]) == [3, 4, 5, 6, 7]


def test_ties_and_minus_infinity_give_the_top_values_at_real_indices():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 5, size=(4, 30000)).astype(np.float32)  # thousands of ties at every value
    x[3] = -np.inf
    x[3, [7, 29999]] = 1.0  # two finite entries: the rest of the top 8 are -inf
    got = np.array(top_k_indices(mx.array(x), 8))
    assert got.min() >= 0 and got.max() < 30000
    for row, idx in zip(x[:3], got[:3]):
        assert len(set(idx)) == 8
        assert (np.sort(row[idx])[::-1] == _top_values(row, 8)).all()
    assert {7, 29999} <= set(got[3])


def test_rounds_through_the_chunked_path_are_the_partitions(dflash2_pair, monkeypatch):
    """The fixtures' vocabulary is small enough for one partition; chunks of 4 send the same drafter
    through the chunked path: the same drafts, candidates and tokens."""
    def rounds():
        summary, events = run(dflash2_pair, "def add(a, b):", max_tokens=40, block_size=8)
        return summary.token_ids, [(r.drafted, r.accepted, sorted(map(sorted, r.candidates))) for r in events]

    plain = rounds()
    monkeypatch.setattr(top_k, "CHUNK", 4)
    k = dflash2_pair.drafter.cfg.selector.selector_top_k
    assert -(-dflash2_pair.head.vocab_size // 4) > 4 * k  # the chunked path, not the fallback
    assert rounds() == plain
    assert any(drafted for drafted, _, _ in plain[1])


def test_a_152k_vocabulary_pair_decodes_as_ar(tokenizer_dir, tmp_path):
    """A target with Qwen's 151,936-row head (its tokenizer smaller, as Qwen's is) and a DFlash2
    drafter of that vocabulary, loaded from disk: the selector's chunked path drafts, greedy output
    is AR's token for token, and a sampled run finishes."""
    import json
    import shutil

    from fixtures.tiny_models import TOKENIZER_FILES, _save, _vocab_and_eos, build_target_model, target_config

    target = tmp_path / "target"
    target.mkdir()
    _, eos, _ = _vocab_and_eos(tokenizer_dir)
    config = target_config(151936, eos, hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, intermediate=64)
    mx.random.seed(4)
    _save(build_target_model(config), target, mx.float32)
    (target / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, target / name)
    pair = load_pair(target, write_dflash2_drafter(tmp_path / "drafter", target, layers=1, rank=4, seed=6))
    assert -(-pair.head.vocab_size // top_k.CHUNK) > 4 * pair.drafter.cfg.selector.selector_top_k
    ar, _ = run(pair, "def add(a, b):", mode="ar", max_tokens=24)
    df, rounds = run(pair, "def add(a, b):", max_tokens=24, block_size=8)
    assert df.token_ids == ar.token_ids and any(r.drafted for r in rounds)
    sampled, _ = run(pair, "def add(a, b):", max_tokens=24, block_size=8, sampling=SamplingSettings(temperature=0.8))
    assert sampled.num_generated > 0
