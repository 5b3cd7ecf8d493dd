"""The Why tab: drafter calibration from the run's rounds, and the block-size advisor on demand."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.rounds_view import ROUND_ROLE, round_tooltip, why_lines
from helpers import PROMPTS
from window_helpers import choose, run_and_wait


def test_advise_fills_the_why_tab_from_the_run(qtbot, make_window, alternating_dirs):
    w = make_window()
    # the chain: the advisor prices chains, and the oracle's one draft a round is a chain's count
    choose(w, alternating_dirs, PROMPTS[0], max_tokens=24, block_size=4, block_auto=False, tree_auto=False)
    run_and_wait(qtbot, w)
    assert w.errors == []
    x, y = w.why_view.cal_curve.getData()
    assert x is not None and len(x) > 0 and all(0 <= v <= 1 for v in y)  # calibration from the rounds
    with qtbot.waitSignal(w.job_finished, timeout=60_000):
        w.why_view.advise_button.click()
    assert w.errors == []
    advice = w.why_view.advice
    assert advice is not None and advice["lengths"] == [1, 2, 3, 4]
    # the alternating oracle accepts exactly one draft a round: two tokens a round from block 2 on
    assert all(abs(c - 2) < 0.05 for c in advice["committed"][1:])
    heights = list(w.why_view.adv_current.opts["height"])
    assert heights == [advice["speedup"][3]]  # the run's block size (4) is the marked bar
    # the cost curve spans the drafter's whole block; the advice only the block the run verified
    assert len(w.why_view.cost_verify.getData()[0]) == w.loaded.facts["block_size"]
    assert "best fixed block size" in w.why_view.summary.text()
    # copy lookup is on by default and the oracle repeats itself: the advice says the copies are left out
    copies = sum(r.source == "lookup" for r in w.rounds_run.rounds)
    assert copies > 0 and f"The {copies} rounds that verified a copy of the context are left out" in \
        w.why_view.summary.text()


def test_advise_before_any_run_says_what_to_do(qtbot, make_window):
    w = make_window()
    w.why_view.advise_button.click()
    assert any("run DFlash" in n for n in w.notices)
    assert not w.busy


def test_the_rounds_tooltip_says_where_the_block_broke(qtbot, make_window, alternating_dirs):
    w = make_window()
    choose(w, alternating_dirs, PROMPTS[0], max_tokens=12, block_size=4, block_auto=False)
    run_and_wait(qtbot, w)
    model = w.rounds.model()
    index = model.index(0, 2)
    r = model.data(index, ROUND_ROLE)
    tip = round_tooltip(r, w.rounds_run.table)
    assert "drafter confidence per draft" in tip
    assert "broke at draft 2" in tip and "ranked" in tip
    assert model.data(index, Qt.ItemDataRole.ToolTipRole) == tip


def test_a_copys_break_is_told_from_the_targets_side():
    """A copy (lookup) proposes its tokens with certainty: the tooltip gives no confidence line and names the
    copied token where the copy broke, with the target's probability of it and its own choice's margin; the
    calibration plot, which is about a drafter's confidence, leaves copies out."""
    from engine.decode.confidence import calibration
    from engine.decode.events import RoundEvent

    def event(source, draft_p, target_rank):
        return RoundEvent(index=0, position=10, anchor=1, drafted=[5, 6, 7], accepted=1, bonus=9,
                          bonus_kind="correction", committed=[5, 9], draft_ms=0.0, verify_ms=1.0, rollback_ms=0.0,
                          t=0.1, generated=3, source=source, draft_p=draft_p, target_p=[0.9, 0.2, 0.1],
                          margin=[3.0, 1.5, 0.5], target_rank=target_rank)

    copy = event("lookup", [1.0, 1.0, 1.0], [0, 1, 1])
    tip = why_lines(copy, None)
    assert "confidence" not in tip and "broke at copied token 2" in tip and "target p 0.20" in tip
    assert "margin of 1.50" in tip
    assert calibration([copy]) == []
    drafter = event("drafter", [0.8, 0.6, 0.3], [0, 2, 1])
    assert "drafter confidence per draft: 0.80 0.60 0.30" in why_lines(drafter, None)
    assert calibration([copy, drafter]) == calibration([drafter]) != []
