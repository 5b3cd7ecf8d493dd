"""Greedy DFlash must equal greedy AR token for token; any flip must be a near-tie, and is reported."""

import pytest

from engine.decode.settings import GenerationSettings
from engine.tools.parity import run_parity
from engine.decode.prompts import encode_prompt
from engine.models.pair import load_pair

from helpers import PROMPTS, assert_lossless


@pytest.mark.parametrize("dirs", ["qwen3_tied_dirs", "qwen3_untied_dirs", "llama_dirs"])
def test_greedy_parity_across_families(dirs, request):
    pair = load_pair(*request.getfixturevalue(dirs))
    assert_lossless(pair, PROMPTS)


@pytest.mark.parametrize("block_size", [1, 2, 7, 16])
def test_greedy_parity_block_sizes(qwen3_pair, block_size):
    assert_lossless(qwen3_pair, PROMPTS[:2], block_size=block_size)


def test_block_size_one_never_drafts(qwen3_pair):
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[0], chat=False)
    result = run_parity(qwen3_pair, ids, GenerationSettings(max_tokens=12, block_size=1))
    assert result.dflash.num_rounds == 11  # the first token comes from prefill
    assert result.dflash.mean_acceptance_length is None


def test_sliding_drafter_prompt_longer_than_window(sliding_dirs):
    pair = load_pair(*sliding_dirs)
    assert pair.drafter.cfg.sliding_window == 8
    long_prompt = " ".join(PROMPTS) * 2
    assert len(encode_prompt(pair.tokenizer, long_prompt, chat=False)) > 4 * 8
    assert_lossless(pair, [long_prompt, PROMPTS[1]])


def test_divergence_is_located_with_margin(qwen3_pair):
    """A forced mismatch is located at the exact token with AR's margin there."""
    from engine.tools.parity import first_divergence, logit_margin

    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 5]) == 2
    assert first_divergence([1, 2], [1, 2]) is None
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[0], chat=False)
    margin = logit_margin(qwen3_pair, ids, [])
    assert margin >= 0.0


def _stop_after(mode: str, texts: int, cancel):
    """An on_event that presses Stop once `mode`'s run has streamed `texts` text events."""
    from engine.decode.events import StartEvent, TextEvent

    seen = {"mode": None, "n": 0}

    def on_event(event):
        if isinstance(event, StartEvent):
            seen["mode"], seen["n"] = event.mode, 0
        elif isinstance(event, TextEvent) and seen["mode"] == mode:
            seen["n"] += 1
            if seen["n"] == texts:
                cancel.cancel()
    return on_event


def test_stop_during_dflash_compares_only_what_both_runs_wrote(qwen3_pair):
    """A DFlash run that Stop cut short is shorter than AR's: that missing tail is no divergence."""
    from engine.decode.cancel import CancelToken

    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[0], chat=False)
    cancel = CancelToken()
    result = run_parity(qwen3_pair, ids, GenerationSettings(max_tokens=48, block_size=4, lookup=False),
                        on_event=_stop_after("dflash", 3, cancel), cancel=cancel)
    assert result.dflash.stop_reason == "cancelled"
    assert len(result.dflash.token_ids) < len(result.ar.token_ids) == 48
    assert result.cancelled and result.compared == len(result.dflash.token_ids)
    assert result.identical and result.first_divergence is None  # greedy: the common part is equal


def test_stop_during_ar_does_not_start_dflash(qwen3_pair):
    from engine.decode.cancel import CancelToken
    from engine.decode.events import StartEvent

    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[0], chat=False)
    cancel, modes = CancelToken(), []
    stop = _stop_after("ar", 3, cancel)

    def on_event(event):
        if isinstance(event, StartEvent):
            modes.append(event.mode)
        stop(event)

    result = run_parity(qwen3_pair, ids, GenerationSettings(max_tokens=48), on_event=on_event, cancel=cancel)
    assert modes == ["ar"] and result.dflash is None
    assert result.ar.stop_reason == "cancelled" and result.cancelled and result.compared == 0
    assert result.to_dict()["dflash_tokens"] == 0
