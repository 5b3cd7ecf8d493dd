"""Hybrid targets (GatedDeltaNet + attention): greedy DFlash equals greedy AR through many partial accepts.

Tiny random qwen3_5 (dense and MoE) and qwen3_next targets, loaded from disk
through load_pair. Drafts come from ScriptedDrafter: greedy AR's own output,
made wrong at one seeded random position per round, so rounds accept every
length from 0 to all. The real drafter (sliding window 8) still runs each round.
"""

import json

import mlx.core as mx
import pytest

from app.cli import main as cli
from engine.models.doctor import check_pair
from engine.errors import SettingsError
from engine.decode.prefill import prefill
from engine.decode.settings import GenerationSettings
from engine.tools.parity import dtype_name, first_divergence, logit_margin, near_tie_threshold, run_parity
from engine.decode.prompts import encode_prompt
from engine.models.pair import load_pair
from engine.runtime.streams import STREAM
from engine.models.target import make_target_cache
from fixtures.tiny_hybrid import HYBRID_KINDS, scripted_pair
from kernels.gated_delta import kernel_status

from helpers import PROMPTS, run

WINDOW = 8
LONG_PROMPT = " ".join(reversed(PROMPTS)) * 2  # > 4 sliding windows of the drafter


@pytest.fixture(scope="module")
def hybrid_pairs(hybrid_dirs):
    return {kind: load_pair(*dirs) for kind, dirs in hybrid_dirs.items()}


def parity_with_partial_accepts(pair, prompt, max_tokens=48, **settings):
    """(AR summary, DFlash summary, DFlash rounds), drafts scripted from AR's own output.

    Any divergence must be a floating-point near-tie, located and measured as `parity` does.
    """
    ids = encode_prompt(pair.tokenizer, prompt, chat=False)
    ar, _ = run(pair, ids, mode="ar", max_tokens=max_tokens, **settings)
    df, rounds = run(scripted_pair(pair, ids + ar.token_ids, seed=len(ids)), ids, max_tokens=max_tokens, **settings)
    where = first_divergence(ar.token_ids, df.token_ids)
    if where is not None:
        assert where < min(len(ar.token_ids), len(df.token_ids)), (prompt, "lengths differ", where)
        margin = logit_margin(pair, ids, ar.token_ids[:where])
        assert margin < near_tie_threshold(dtype_name(pair.head.dtype)), (prompt, where, margin)
    return ar, df, rounds


def partial(rounds) -> int:
    return sum(0 < r.accepted < len(r.drafted) for r in rounds)


@pytest.mark.parametrize("mode", ["replay", "rerun"])
@pytest.mark.parametrize("kind", HYBRID_KINDS)
def test_greedy_parity_through_partial_accepts(hybrid_pairs, kind, mode):
    pair = hybrid_pairs[kind]
    assert pair.drafter.cfg.sliding_window == WINDOW
    long_ids = encode_prompt(pair.tokenizer, LONG_PROMPT, chat=False)
    assert len(long_ids) > 4 * WINDOW
    seen = {}
    for prompt in (PROMPTS[1], LONG_PROMPT):
        _, _, rounds = parity_with_partial_accepts(pair, prompt, rollback=mode)
        seen[prompt] = rounds
    all_rounds = [r for rs in seen.values() for r in rs]
    accepted = {r.accepted for r in all_rounds}
    # Many partial accepts, past the drafter's window too, and both extremes: none and all accepted.
    assert partial(all_rounds) >= 10, [r.accepted for r in all_rounds]
    assert partial(seen[LONG_PROMPT]) >= 3
    assert 0 in accepted and 7 in accepted and len(accepted) >= 5, accepted


def test_greedy_parity_full_block_and_odd_block(hybrid_pairs):
    """The drafter's whole block and an odd block of 3 on the MoE target; a larger block than the
    drafter drafts is refused with its range."""
    pair = hybrid_pairs["qwen3_5_moe"]
    own = pair.drafter.cfg.block_size
    with pytest.raises(SettingsError, match=f"outside 1..{own}"):
        GenerationSettings(block_size=own + 1).resolved(pair)
    for block in (own, 3):
        _, _, rounds = parity_with_partial_accepts(pair, PROMPTS[0], block_size=block)
        assert partial(rounds) >= 3, block


def test_unscripted_drafter_stays_lossless(hybrid_pairs):
    """The real (random) drafter: mostly rejections, each a one-step replay; still identical."""
    for kind, pair in hybrid_pairs.items():
        ids = encode_prompt(pair.tokenizer, PROMPTS[0], chat=False)
        result = run_parity(pair, ids, GenerationSettings(max_tokens=24))
        assert result.identical or result.margin_at_divergence < result.near_tie, (kind, result.to_dict())


def test_ar_equals_mlx_lm_generate(hybrid_dirs):
    """The taped GatedDeltaNet forward changes nothing: our AR matches mlx-lm's own greedy generate."""
    from mlx_lm.generate import stream_generate

    from engine.models.target import load_target

    for kind, (target, drafter) in hybrid_dirs.items():
        pair = load_pair(target, drafter)
        ids = encode_prompt(pair.tokenizer, LONG_PROMPT, chat=False)
        ours, _ = run(pair, ids, mode="ar", max_tokens=24)
        model, tokenizer, _ = load_target(target)  # a fresh, untouched model
        with mx.stream(STREAM):
            theirs = [r.token for r in stream_generate(model, tokenizer, mx.array(ids), max_tokens=24)]
        assert ours.token_ids == theirs[: len(ours.token_ids)], kind


def test_taps_compose_with_taped_layers(hybrid_dirs, monkeypatch):
    """Tapped decoder layers holding taped GatedDeltaNet mixers give the same taps and logits as untouched
    ones: bit for bit through the stepwise reference (mlx-lm's own arithmetic), to rounding through the
    CPU's chunked pass, which the prefill takes by default."""
    import kernels.gated_delta as gd
    from engine.models.gdn_tape import gdn_layers, instrument, is_instrumented, uninstrument

    target, drafter = hybrid_dirs["qwen3_5"]
    taped, plain = load_pair(target, drafter), load_pair(target, drafter)
    instrument(taped.target)
    uninstrument(plain.target)
    gdn_ids = {i for i, _ in gdn_layers(taped.target)}
    assert set(taped.taps.layer_ids) <= gdn_ids  # the taps sit on GatedDeltaNet decoder layers
    assert all(is_instrumented(m) for _, m in gdn_layers(taped.target))
    assert not any(is_instrumented(m) for _, m in gdn_layers(plain.target))
    ids = encode_prompt(taped.tokenizer, PROMPTS[0], chat=False)
    with mx.stream(STREAM):
        logits_b, taps_b = prefill(plain, make_target_cache(plain.target), ids, record_taps=True)
        logits_c, taps_c = prefill(taped, make_target_cache(taped.target), ids, record_taps=True)
        monkeypatch.setattr(gd, "_chunked_fits", lambda k, g: False)
        logits_a, taps_a = prefill(taped, make_target_cache(taped.target), ids, record_taps=True)
        assert mx.array_equal(taps_a, taps_b).item()
        assert mx.array_equal(logits_a, logits_b).item()
        assert not mx.array_equal(taps_c, taps_b).item()  # the chunked pass ran (it rounds otherwise)
        assert mx.allclose(taps_c, taps_b, atol=1e-4, rtol=1e-4).item()
        assert mx.allclose(logits_c, logits_b, atol=1e-4, rtol=1e-4).item()


def test_doctor_and_facts_name_the_rollback(hybrid_dirs, hybrid_pairs, qwen3_tied_dirs):
    for kind, dirs in hybrid_dirs.items():
        facts = check_pair(*dirs).facts
        assert facts["rollback"].startswith("tape replay"), kind
        assert facts["gated_delta"] == kernel_status(), kind  # which kernels run the recurrence here
        assert hybrid_pairs[kind].facts()["rollback"] == "tape-replay"
    dense = check_pair(*qwen3_tied_dirs).facts
    assert dense["rollback"].startswith("kv-trim") and "gated_delta" not in dense


def test_rollback_setting_is_checked(hybrid_pairs):
    pair = hybrid_pairs["qwen3_5"]
    with pytest.raises(SettingsError, match="rollback"):
        GenerationSettings(rollback="undo").resolved(pair)


def test_cli_rollback_option(hybrid_dirs, capsys):
    target, drafter = hybrid_dirs["qwen3_next"]
    outputs = []
    for mode in ("replay", "rerun"):
        code = cli(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", PROMPTS[2],
                    "--raw", "--max-tokens", "12", "--rollback", mode, "--json"])
        assert code == 0
        outputs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert outputs[0] == outputs[1]
    assert cli(["parity", "--target", str(target), "--drafter", str(drafter), "--prompt", PROMPTS[2],
                "--raw", "--max-tokens", "8", "--rollback", "rerun", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] or report["margin_at_divergence"] < report["near_tie"], report
    with pytest.raises(SystemExit):  # argparse refuses a choice it does not know
        cli(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "x", "--rollback", "undo"])


def test_window_checks_kernels_on_the_worker_only(hybrid_dirs, qtbot, make_window, monkeypatch):
    """The doctor's verdict runs on the GUI thread; the GatedDeltaNet kernel check (which may
    compile and self-check a GPU kernel) must not: it runs when the worker loads the pair."""
    import threading

    import kernels.gated_delta as gd

    threads = []
    real = gd.kernel_status
    monkeypatch.setattr(gd, "kernel_status", lambda: threads.append(threading.current_thread()) or real())
    w = make_window()
    target, drafter = hybrid_dirs[HYBRID_KINDS[0]]
    w.models.target.set_value(str(target))
    w.models.drafter.set_value(str(drafter))
    w.models.check_now()
    assert w.models.verdict_ok and not threads  # the verdict came from files alone
    with qtbot.waitSignal(w.load_finished, timeout=60_000):
        w.start_load()
    assert threads and all(t is not threading.main_thread() for t in threads)
    assert w.loaded.facts["gated_delta"] == real()


def test_auto_verify_length_stays_lossless_with_tape_replay(hybrid_pairs, monkeypatch):
    """Every verify length in turn (1 skips the drafter) on each hybrid target: tape replay rolls
    back whatever prefix was verified."""
    import itertools

    from engine.decode.verify_length import VerifyLengthController

    counter = itertools.count()
    monkeypatch.setattr(VerifyLengthController, "choose", lambda self, remaining, depth=0: 1 + next(counter) % remaining)
    for kind, pair in hybrid_pairs.items():
        _, _, rounds = parity_with_partial_accepts(pair, PROMPTS[0], auto=True)
        assert {r.verified for r in rounds} >= {1, 2, 3}, kind
