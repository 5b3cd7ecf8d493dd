"""Turning the block size down after an auto run measures nothing: the curve measured up to the longer
block holds every shorter verify (block 9 after 16 measured for ~20 s, the Output pane cleared)."""

import pytest

from helpers import PROMPTS
from window_helpers import choose, run_and_wait


@pytest.mark.measures_cost_curve
def test_a_shorter_block_runs_on_the_measured_curve(qtbot, make_window, qwen3_tied_dirs, monkeypatch, tmp_path):
    from engine.decode import cost_curve as cc

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))  # nothing cached: the first run measures
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS, 64))
    w = make_window()
    measuring = []
    w.progress.shown.connect(measuring.append)
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=8, mode="dflash", block_size=6, block_auto=True)
    run_and_wait(qtbot, w)
    assert measuring and "block 6" in measuring[-1]
    measuring.clear()
    for block in (5, 3):
        choose(w, qwen3_tied_dirs, block_size=block)
        run_and_wait(qtbot, w)
        assert measuring == [] and w.errors == [] and len(w.current_run.tokens) == 8
        assert all(len(r.drafted) <= block - 1 for r in w.rounds_run.rounds)
    choose(w, qwen3_tied_dirs, block_size=7)  # longer than measured: a curve of its own
    run_and_wait(qtbot, w)
    assert measuring and "block 7" in measuring[-1]
