"""Prefix reuse: a run that shares a prompt prefix with the last one starts from its caches, and its
tokens are a cold run's; prefill reports progress and a Stop keeps what was done."""

from __future__ import annotations

import pytest

import engine.decode.prefill as prefill
from engine.decode.generate import generate
from engine.decode.events import PrefillEvent
from engine.decode.prefix_cache import PrefixCache
from engine.decode.prompts import encode_prompt
from engine.decode.settings import GenerationSettings, SamplingSettings
from engine.models.pair import load_pair
from engine.tools.parity import run_parity

from helpers import PROMPTS

CHUNK = 8
LONG = " ".join(PROMPTS) * 2


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(prefill, "chunk_size", lambda: CHUNK)


def _run(pair, ids, prefix=None, cancel=None, **settings):
    events = list(generate(pair, ids, GenerationSettings(max_tokens=24, **settings), cancel, prefix=prefix))
    return events[-1], [e for e in events if isinstance(e, PrefillEvent)]


def _ids(pair, text):
    return encode_prompt(pair.tokenizer, text, chat=False)


@pytest.mark.parametrize("mode", ["dflash", "ar"])
def test_the_same_prompt_again_reuses_the_whole_prefill(qwen3_pair, mode):
    ids = _ids(qwen3_pair, LONG)
    cold, _ = _run(qwen3_pair, ids, mode=mode)
    prefix = PrefixCache()
    first, progress = _run(qwen3_pair, ids, prefix, mode=mode)
    assert first.reused_tokens == 0 and first.token_ids == cold.token_ids
    assert [e.done for e in progress] == [min(b, len(ids)) for b in range(CHUNK, len(ids) + CHUNK, CHUNK)]
    again, progress = _run(qwen3_pair, ids, prefix, mode=mode)
    assert again.reused_tokens == len(ids) and again.token_ids == cold.token_ids
    assert [(e.done, e.reused) for e in progress] == [(len(ids), len(ids))]  # nothing left to compute


def test_a_prompt_edited_at_its_end_reuses_the_chunks_it_shares(qwen3_pair):
    ids = _ids(qwen3_pair, LONG)
    edited = ids[:-5] + _ids(qwen3_pair, " return 1")
    shared = len(ids) - 5
    prefix = PrefixCache()
    _run(qwen3_pair, ids, prefix)
    warm, progress = _run(qwen3_pair, edited, prefix)
    assert warm.reused_tokens == shared // CHUNK * CHUNK > 0  # the deepest chunk boundary inside the prefix
    assert progress[0].reused == progress[0].done == warm.reused_tokens and progress[-1].done == len(edited)
    cold, _ = _run(qwen3_pair, edited)
    assert warm.token_ids == cold.token_ids


def test_another_prompt_or_pair_starts_cold(qwen3_pair, qwen3_untied_dirs):
    ids = _ids(qwen3_pair, LONG)
    prefix = PrefixCache()
    _run(qwen3_pair, ids, prefix)
    other, _ = _run(qwen3_pair, _ids(qwen3_pair, PROMPTS[2] + LONG), prefix)
    assert other.reused_tokens == 0
    _run(qwen3_pair, ids, prefix)
    another = load_pair(*qwen3_untied_dirs)
    assert _run(another, ids, prefix)[0].reused_tokens == 0


def test_both_modes_second_run_reuses_the_first_and_stays_identical(qwen3_pair):
    ids = _ids(qwen3_pair, LONG)
    result = run_parity(qwen3_pair, ids, GenerationSettings(max_tokens=24))
    assert result.identical and result.ar.reused_tokens == 0 and result.dflash.reused_tokens == len(ids)


def test_sampling_with_reuse_is_a_cold_runs(qwen3_pair):
    ids = _ids(qwen3_pair, LONG)
    sampling = SamplingSettings(temperature=0.8, seed=5)
    cold, _ = _run(qwen3_pair, ids, sampling=sampling)
    prefix = PrefixCache()
    _run(qwen3_pair, ids, prefix, mode="ar")
    warm, _ = _run(qwen3_pair, ids, prefix, sampling=sampling)
    assert warm.reused_tokens == len(ids) and warm.token_ids == cold.token_ids


class _StopAfter:
    """A cancel token that turns on after `reads` checks."""

    def __init__(self, reads: int):
        self.left = reads

    @property
    def cancelled(self) -> bool:
        self.left -= 1
        return self.left < 0

    def cancel(self) -> None:
        pass


def test_a_stopped_prefill_is_kept_and_the_next_run_goes_on_from_it(qwen3_pair):
    ids = _ids(qwen3_pair, LONG)
    assert len(ids) > 3 * CHUNK
    prefix = PrefixCache()
    stopped, progress = _run(qwen3_pair, ids, prefix, cancel=_StopAfter(3))  # three chunks, then Stop
    assert stopped.stop_reason == "cancelled" and stopped.num_generated == 0
    assert [e.done for e in progress] == [CHUNK, 2 * CHUNK, 3 * CHUNK]
    resumed, progress = _run(qwen3_pair, ids, prefix)
    assert resumed.reused_tokens == 3 * CHUNK and progress[0].done == 3 * CHUNK
    assert resumed.token_ids == _run(qwen3_pair, ids)[0].token_ids


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_next"])
def test_a_hybrid_target_goes_back_through_its_recurrent_state(hybrid_dirs, kind):
    pair = load_pair(*hybrid_dirs[kind])
    ids = _ids(pair, LONG)
    edited = ids[:-3] + _ids(pair, " x")
    prefix = PrefixCache()
    for prompt in (ids, edited, ids):
        warm, _ = _run(pair, prompt, prefix)
        cold, _ = _run(pair, prompt)
        assert warm.token_ids == cold.token_ids
    assert warm.reused_tokens > 0
