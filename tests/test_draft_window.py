"""The drafter's context window and sink: what the cache keeps, that runs stay lossless with them,
and that they reach round events, traces and doctor."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.decode.prompts import encode_prompt
from engine.decode.settings import GenerationSettings, SamplingSettings
from engine.errors import SettingsError
from engine.models.drafter import ContextCache
from engine.models.pair import load_pair

from distribution import check_exactness, exact_outcomes, verified_unfiltered
from helpers import PROMPTS, assert_lossless, run

LONG = " ".join(PROMPTS) * 2


def _rows(first: int, n: int) -> mx.array:
    """(1, 1, n, 1) keys whose value is their absolute position."""
    return mx.arange(first, first + n, dtype=mx.float32).reshape(1, 1, n, 1)


@pytest.mark.parametrize("window, sink, chunks", [
    (5, 0, [3, 1, 4, 2, 7]),
    (5, 2, [3, 1, 4, 2, 7]),
    (4, 3, [1, 1, 1, 1, 1, 1, 1, 1, 1]),
    (6, 3, [20]),  # the sink and the window from one append
    (8, 2, [2, 3]),  # fewer positions than the window: everything
])
def test_the_cache_keeps_the_sink_and_the_last_window(window, sink, chunks):
    cache = ContextCache(window, sink)
    seen = 0
    for n in chunks:
        cache.append(_rows(seen, n), _rows(seen, n) * 10)
        seen += n
        want = sorted(set(range(min(sink, seen))) | set(range(max(seen - window, 0), seen)))
        assert cache.keys[0, 0, :, 0].tolist() == want
        assert cache.values[0, 0, :, 0].tolist() == [10 * p for p in want]
        assert cache.positions().tolist() == want
        assert cache.offset == seen


def test_a_cache_without_a_window_keeps_everything():
    cache = ContextCache()
    for first, n in ((0, 3), (3, 40), (43, 1)):
        cache.append(_rows(first, n), _rows(first, n))
    assert cache.positions().tolist() == list(range(44)) == cache.keys[0, 0, :, 0].tolist()


@pytest.mark.parametrize("window, sink", [(4, 0), (6, 2), (1, 1)])
def test_greedy_stays_lossless_with_a_window_and_sink(qwen3_pair, window, sink):
    assert_lossless(qwen3_pair, [LONG, PROMPTS[1]], draft_window=window, draft_sink=sink)


def test_a_sliding_drafter_keeps_its_trained_window_whatever_the_setting(sliding_dirs):
    pair = load_pair(*sliding_dirs)
    cache = pair.drafter.make_cache(window=3, sink=1)
    assert (cache[0].window, cache[0].sink) == (pair.drafter.cfg.sliding_window - 1, 0)
    assert (cache[1].window, cache[1].sink) == (3, 1)
    assert_lossless(pair, [LONG], draft_window=3, draft_sink=1)


def test_rounds_say_how_much_context_the_drafter_saw(qwen3_pair):
    ids = encode_prompt(qwen3_pair.tokenizer, LONG, chat=False)
    _, whole = run(qwen3_pair, ids, max_tokens=24)
    assert [r.draft_context for r in whole if r.drafted] == [r.position for r in whole if r.drafted]
    _, windowed = run(qwen3_pair, ids, max_tokens=24, draft_window=6, draft_sink=2)
    assert [r.draft_context for r in windowed if r.drafted] == [min(r.position, 8) for r in windowed if r.drafted]


@pytest.mark.parametrize("mutation", [None, verified_unfiltered], ids=["exact", "mutated"])
def test_sampling_stays_exact_with_a_window(qwen3_pair, monkeypatch, mutation):
    """At T > 0 the first two tokens after a long prompt are distributed as AR's with a window and sink."""
    ids = encode_prompt(qwen3_pair.tokenizer, LONG, chat=False)
    exact = exact_outcomes(qwen3_pair, ids, SamplingSettings(temperature=1.0, top_k=3), tokens=2)

    def outcome(seed):
        sampling = SamplingSettings(temperature=1.0, top_k=3, seed=seed)
        summary, _ = run(qwen3_pair, ids, mode="dflash", sampling=sampling, max_tokens=2, draft_window=5,
                         draft_sink=1)
        return tuple(summary.token_ids)

    check_exactness(monkeypatch, mutation, exact, outcome)


@pytest.mark.parametrize("settings, words", [
    (dict(draft_window=-1), "draft window -1"),
    (dict(draft_window=0, draft_sink=4), "needs a draft window"),
    (dict(draft_window=8, draft_sink=-2), "draft sink -2"),
    (dict(draft_window=1 << 30), "outside"),
])
def test_absurd_windows_are_refused(qwen3_pair, settings, words):
    with pytest.raises(SettingsError, match=words):
        GenerationSettings(**settings).resolved(qwen3_pair)


def test_doctor_and_the_trace_say_what_the_drafter_keeps(qwen3_tied_dirs, tmp_path, capsys):
    import json

    from app.cli import main

    assert main(["doctor", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1])]) == 0
    out = capsys.readouterr().out
    assert "drafter_context: 2 full-attention layer(s) keep the run's draft window and sink" in out
    assert "draft_context_default:" in out
    trace = tmp_path / "t.jsonl"
    assert main(["generate", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1]),
                 "--prompt", LONG, "--raw", "--max-tokens", "8", "--draft-window", "6", "--draft-sink", "2",
                 "--trace", str(trace), "--json"]) == 0
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    header = records[0]
    assert header["settings"]["draft_window"] == 6 and header["settings"]["draft_sink"] == 2
    assert "full-attention" in header["model"]["drafter_context"]
    assert all(r["draft_context"] == 8 for r in records if r.get("type") == "round" and r["drafted"])


def test_a_whole_context_needs_no_sink_flag(qwen3_tied_dirs, tmp_path):
    """--draft-window 0 alone keeps the whole context (the default sink goes with the default window
    only); the defaults keep a window and a sink; an explicit sink with no window is still refused."""
    import json

    from app.cli import main
    from engine.decode.settings import DEFAULTS

    assert DEFAULTS.draft_window > 0 and DEFAULTS.draft_sink > 0
    common = ["generate", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1]),
              "--prompt", LONG, "--raw", "--max-tokens", "4"]
    for extra, expected in ((["--draft-window", "0"], (0, 0)), ([], (DEFAULTS.draft_window, DEFAULTS.draft_sink))):
        trace = tmp_path / f"t{len(extra)}.jsonl"
        assert main(common + extra + ["--trace", str(trace)]) == 0
        settings = json.loads(trace.read_text().splitlines()[0])["settings"]
        assert (settings["draft_window"], settings["draft_sink"]) == expected
    assert main(common + ["--draft-window", "0", "--draft-sink", "4"]) == 2


def test_the_window_sends_no_sink_beside_the_whole_context(qtbot):
    from app.prompt_panel import PromptPanel

    panel = PromptPanel()
    qtbot.addWidget(panel)
    assert panel.draft_sink.isEnabled() and panel.settings().draft_sink > 0
    panel.draft_window.setValue(0)
    assert not panel.draft_sink.isEnabled()
    assert panel.settings().draft_sink == 0 and panel.settings().draft_window == 0


def test_the_defaults_are_what_a_run_gets_when_nothing_is_said():
    """settings.DEFAULTS is what the command line runs without flags (auto and lookup on), not the
    dataclass's own fields (both off: code that builds settings says what it wants)."""
    from engine.decode.settings import DEFAULTS
    from engine.tools.cli import _settings
    from engine.tools.cli_parser import build_parser

    from dataclasses import replace

    given = _settings(build_parser().parse_args(["generate", "--prompt", "x"]), "dflash")
    # the command line computes the diagnostic tables only for a trace
    assert given == replace(DEFAULTS, diagnostics=False) and DEFAULTS.auto and DEFAULTS.lookup
