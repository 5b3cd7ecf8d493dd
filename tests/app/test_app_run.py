"""Runs through the real worker thread: the views hold what the engine's events said."""

import json

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QTextCursor

from engine.decode.events import PrefillEvent, RoundEvent, SummaryEvent
from engine.decode.generate import generate
from engine.decode.tree_stats import tree_nodes
from engine.decode.settings import DEFAULTS, GenerationSettings
from engine.tools.parity import first_divergence
from app import theme
from engine.decode.prompts import encode_prompt
from engine.models.pair import load_pair
from app.run_record import ACCEPTED, AR, PREFILL

from helpers import PROMPTS
from window_helpers import RUN_TIMEOUT_MS, choose, run_and_wait, split_events


def point_of_token(view, token_index):
    """A viewport point inside the token's first character."""
    start, _end = view.token_span(token_index)
    cursor = QTextCursor(view.document())
    cursor.setPosition(start)
    rect = view.cursorRect(cursor)
    return QPoint(rect.left() + 2, rect.center().y())


@pytest.mark.parametrize("dirs_name", ["qwen3_tied_dirs", "oracle_dirs", "alternating_dirs"])
def test_dflash_run_views_hold_the_engine_events(qtbot, make_window, request, dirs_name):
    dirs = request.getfixturevalue(dirs_name)
    w = make_window()
    choose(w, dirs, PROMPTS[0], max_tokens=40, block_auto=False)  # fixed blocks: every event a round
    run_and_wait(qtbot, w)
    assert w.errors == []
    run = w.rounds_run
    rounds, texts, summary = split_events(run)
    assert summary.num_rounds == len(rounds) > 0

    # Rounds: one row per RoundEvent, in order, showing its numbers.
    model = w.rounds.rounds_model
    assert model.rowCount() == len(rounds)
    for row, r in enumerate(rounds):
        assert model.round_at(row) is r
        assert model.index(row, 3).data() == f"{r.accepted}/{len(r.drafted)}"
        assert model.index(row, 5).data() == f"{r.verify_ms:.2f}"

    # Output: the engine's text, and every token's provenance from its round.
    assert w.output.plain_text() == summary.text
    assert run.token_ids() == summary.token_ids
    assert run.tokens[0].kind == PREFILL and run.tokens[0].round is None
    for r in rounds:
        toks = [run.tokens[i] for i in run.round_tokens[r.index]]
        assert [t.id for t in toks] == r.committed
        assert [t.kind for t in toks] == [ACCEPTED if k < r.accepted else r.bonus_kind for k in range(len(toks))]
        assert [t.block_pos for t in toks] == list(range(1, len(toks) + 1))

    # Plots: acceptance per round, per position, stacked times, throughput.
    s = w.plots.series()
    np.testing.assert_allclose(s["acceptance_length"], [r.accepted + 1 for r in rounds])
    np.testing.assert_allclose(s["position_rate"], summary.per_position_acceptance, atol=1e-4)
    draft = np.array([r.draft_ms for r in rounds])
    verify = np.array([r.verify_ms for r in rounds])
    total = draft + verify + np.array([r.rollback_ms for r in rounds])
    np.testing.assert_allclose(s["stack_draft"], draft)
    np.testing.assert_allclose(s["stack_verify"], draft + verify)
    np.testing.assert_allclose(s["stack_rollback"], total)
    timed = [t for t in texts if t.token_ids and t.t > 0]
    assert len(s["tps_dflash"]) == len(timed) and len(s["tps_ar"]) == 0
    assert s["tps_dflash"][-1] == pytest.approx(summary.num_generated / timed[-1].t)

    # Status bar.
    assert w.status_labels["rounds"].text() == f"rounds: {len(rounds)}"
    assert w.status_labels["tokens"].text() == f"tokens: {summary.num_generated}"
    assert f"{summary.mean_acceptance_length:.2f}" in w.status_labels["tau"].text()


def test_run_matches_an_independent_engine_run(qtbot, make_window, qwen3_tied_dirs):
    """Greedy decoding is deterministic: the window's run equals one made here without the app."""
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[1], max_tokens=24, block_size=4, block_auto=False)
    run_and_wait(qtbot, w)
    pair = load_pair(*qwen3_tied_dirs)
    ids = encode_prompt(pair.tokenizer, PROMPTS[1], chat=False)
    events = list(generate(pair, ids, GenerationSettings(max_tokens=24, block_size=4, lookup=True,
                                                    tree_auto=DEFAULTS.tree_auto)))  # the window's defaults
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    assert w.rounds_run.token_ids() == summary.token_ids
    assert [(r.accepted, r.source) for r in w.rounds_run.rounds] == [
        (e.accepted, e.source) for e in events if isinstance(e, RoundEvent)]
    # the block size reached the run: a chain drafts 3, a tree's drafter nodes are 3 deep at most (a copy
    # grafted into the tree can run deeper)
    assert all(len(r.drafted) <= 3 for r in w.rounds_run.rounds if r.source == "drafter" and not r.tree_parents)
    assert all(n["depth"] <= 3 for r in w.rounds_run.rounds for n in tree_nodes(r) if not n["copy"])


def test_round_selection_and_token_clicks_are_linked(qtbot, make_window, alternating_dirs):
    w = make_window()
    choose(w, alternating_dirs, PROMPTS[2], max_tokens=30, block_size=4, block_auto=False)
    run_and_wait(qtbot, w)
    run = w.rounds_run
    assert len(run.rounds) >= 4

    # Selecting a round highlights exactly its committed tokens in the output.
    w.rounds.selectRow(2)
    expected = sorted(w.output.token_span(i) for i in run.round_tokens[2])
    assert sorted(w.output.highlighted()) == [e for e in expected if e[1] > e[0]]
    assert w.output.highlighted()

    # Clicking a token of another round selects that round's row.
    token = run.round_tokens[3][0]
    qtbot.mouseClick(w.output.viewport(), Qt.MouseButton.LeftButton, pos=point_of_token(w.output, token))
    assert w.rounds.currentIndex().row() == 3
    assert sorted(w.output.highlighted()) == sorted(
        s for s in (w.output.token_span(i) for i in run.round_tokens[3]) if s[1] > s[0])

    # Hovering a token names its round, block position and id.
    tok = run.tokens[token]
    assert w.output.token_at(point_of_token(w.output, token)) is tok
    tip = w.output.tooltip_for(tok)
    assert f"round {tok.round}" in tip and f"block position {tok.block_pos}" in tip and f"id {tok.id}" in tip


def test_ar_mode_tokens_are_plain_ar(qtbot, make_window, qwen3_tied_dirs):
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=12, mode="ar")
    run_and_wait(qtbot, w)
    run = w.current_run
    assert run.mode == "ar" and w.rounds_run is None
    assert w.rounds.rounds_model.rowCount() == 0
    assert [t.kind for t in run.tokens] == [PREFILL] + [AR] * (len(run.tokens) - 1)
    assert w.output.plain_text() == run.summary.text
    assert len(w.plots.series()["tps_ar"]) > 0


def test_stop_mid_run_with_esc(qtbot, make_window, qwen3_tied_dirs):
    w = make_window()
    # the fixtures' context is 4096; copies are off because this random target loops, and lookup
    # would write its 4000 tokens in about 2 s, before the Esc
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=4000, lookup=False)
    w.activateWindow()
    w.start_run()
    qtbot.waitUntil(lambda: w.rounds.rounds_model.rowCount() >= 3, timeout=60_000)
    with qtbot.waitSignal(w.run_finished, timeout=30_000):
        qtbot.keyClick(w.prompt.editor, Qt.Key.Key_Escape)
    run = w.rounds_run
    assert run.summary.stop_reason == "cancelled"
    assert run.summary.num_generated < 4000
    assert w.rounds.rounds_model.rowCount() == run.summary.num_rounds + run.summary.num_plain_steps  # auto's too
    assert w.output.plain_text() == run.summary.text
    assert w.errors == [] and w.prompt.run_button.isEnabled() and not w.prompt.stop_button.isEnabled()
    # Still usable: Ctrl+Enter runs again, to the end this time.
    w.prompt.max_tokens.setValue(8)
    with qtbot.waitSignal(w.run_finished, timeout=60_000):
        qtbot.keyClick(w.prompt.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert w.rounds_run.summary.stop_reason == "max_tokens"


def test_stop_in_both_mode_compares_what_both_runs_wrote(qtbot, make_window, qwen3_tied_dirs):
    """Stop during the DFlash half: its output is shorter than AR's, and that is no divergence."""
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=1500, mode="both", lookup=False, block_auto=False)
    w.activateWindow()
    w.start_run()
    qtbot.waitUntil(lambda: "dflash" in w.controller.runs and len(w.controller.runs["dflash"].tokens) > 1,
                    timeout=120_000)
    with qtbot.waitSignal(w.run_finished, timeout=30_000):
        qtbot.keyClick(w.prompt.editor, Qt.Key.Key_Escape)
    ar, df = w.controller.runs["ar"], w.controller.runs["dflash"]
    assert df.summary.stop_reason == "cancelled" and len(df.tokens) < len(ar.tokens)
    assert w.center_tabs.tabText(1) == "Parity ✓"
    assert w.parity_view.headline.text().startswith(
        f"Stopped before the end: identical over the {len(df.tokens):,} tokens")
    assert w.parity_view.differences == []
    assert w.errors == []


def test_stop_in_both_mode_during_ar_does_not_start_dflash(qtbot, make_window, qwen3_tied_dirs, tmp_path):
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=4000, mode="both", lookup=False, block_auto=False)
    w.activateWindow()
    w.start_run()
    qtbot.waitUntil(lambda: "ar" in w.controller.runs and len(w.controller.runs["ar"].tokens) > 1, timeout=60_000)
    with qtbot.waitSignal(w.run_finished, timeout=30_000):
        qtbot.keyClick(w.prompt.editor, Qt.Key.Key_Escape)
    assert "dflash" not in w.controller.runs
    assert w.center_tabs.tabText(1) == "Parity –"
    assert w.parity_view.headline.text().startswith("Stopped during the AR run")
    assert w.errors == [] and w.prompt.run_button.isEnabled()
    # Saved, the stopped check is what it was: the AR run alone, nothing compared.
    w2 = reopened(make_window, w, tmp_path / "stopped.jsonl")
    assert_same_comparison(w, w2)
    assert not w2.export_rounds_csv(tmp_path / "rounds.csv") and "no DFlash run" in w2.errors[-1]


def test_both_mode_marks_a_divergence(qtbot, make_window, qwen3_tied_dirs, tmp_path):
    """A diverging case built honestly: at temperature 1 AR and DFlash draw their random numbers
    differently (speculative sampling), so with the same seed their outputs differ."""
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[3], max_tokens=24, mode="both", temperature=1.0, seed=3, block_auto=False)
    run_and_wait(qtbot, w)
    ar, df = w.runs["ar"], w.runs["dflash"]
    result = w.parity_view.result
    where = first_divergence(ar.token_ids(), df.token_ids())
    assert where is not None, "this seed must give a diverging pair of outputs"
    assert not result.identical and result.first_divergence == where
    assert result.margin_at_divergence is not None
    assert result.speedup == pytest.approx(df.summary.tok_per_s / ar.summary.tok_per_s, rel=1e-6)
    # Side by side, each text as its run produced it; differing tokens marked on both sides.
    assert w.parity_view.ar.plain_text() == ar.summary.text
    assert w.parity_view.dflash.plain_text() == df.summary.text
    diffs = [i for i in range(max(len(ar.tokens), len(df.tokens)))
             if i >= len(ar.tokens) or i >= len(df.tokens) or ar.tokens[i].id != df.tokens[i].id]
    assert w.parity_view.differences == diffs and diffs[0] == where
    for view in (w.parity_view.ar, w.parity_view.dflash):
        spans = sorted(s for s in (view.token_span(i) for i in diffs if view.token_span(i)) if s[1] > s[0])
        assert sorted(view.marked()) == spans
    text = w.parity_view.headline.text()
    # two samples at T > 0: the tab says so instead of crying wolf, in one line: no logit margin (it
    # decides nothing there), the differences not in an error's red, each pane's token count
    assert text.startswith("Two samples at temperature 1:") and f"differ from token {where}" in text
    assert "margin" not in text and "tests/" not in text
    assert w.parity_view.ar.mark_colour == w.parity_view.dflash.mark_colour == theme.DIFF_SAMPLE
    assert w.parity_view.labels["AR"].text() == f"AR · {len(ar.tokens):,} tokens"
    assert w.parity_view.labels["DFlash"].text() == f"DFlash · {len(df.tokens):,} tokens"
    assert "~" in w.center_tabs.tabText(1) and "✗" not in w.center_tabs.tabText(1)
    # Rounds and round plots show the DFlash run; throughput shows both.
    assert w.rounds_run is df and w.rounds.rounds_model.rowCount() == df.summary.num_rounds
    s = w.plots.series()
    assert len(s["tps_ar"]) > 0 and len(s["tps_dflash"]) > 0
    # Saved and opened again, the divergence shows as it did: marks, headline and margin.
    w2 = reopened(make_window, w, tmp_path / "diverged.jsonl")
    assert_same_comparison(w, w2)
    assert w2.parity_view.result.margin_at_divergence == result.margin_at_divergence


def test_both_mode_greedy_is_identical(qtbot, make_window, qwen3_tied_dirs):
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=16, mode="both")
    run_and_wait(qtbot, w)
    assert w.parity_view.result.identical
    assert w.parity_view.differences == [] and w.parity_view.ar.marked() == []
    assert "Identical" in w.parity_view.headline.text() and "✓" in w.center_tabs.tabText(1)
    r = w.parity_view.result
    assert "tok/\u2060s" in w.parity_view.headline.text()  # a line never wraps inside "tok/s"
    # Legends sit outside the plots' data areas.
    qtbot.waitExposed(w)
    for legend, plot in ((w.plots.tps_legend, w.plots.p_tps), (w.plots.time_legend, w.plots.p_time)):
        assert legend.isVisible() and legend.sceneBoundingRect().height() > 0
        assert not legend.sceneBoundingRect().intersects(plot.getViewBox().sceneBoundingRect())
    assert r.round_in_ar_steps > 0 and f"breaks even at tau {r.round_in_ar_steps:.2f}" in w.parity_view.headline.text()
    assert f"this run's tau: {r.mean_acceptance_length:.2f}" in w.parity_view.headline.text()


def reopened(make_window, w, path):
    """Export `w`'s Both run as a trace and open it in a fresh window with no model loaded."""
    assert w.export_trace(path)
    assert "both runs and the parity verdict" in w.statusBar().currentMessage()
    w2 = make_window()
    assert w2.open_trace(path) and w2.loaded is None and w2.errors == []
    return w2


def assert_same_comparison(w, w2):
    """Both windows show one comparison: texts, marks, headline, tab mark, rounds and runs."""
    assert w2.center_tabs.tabText(1) == w.center_tabs.tabText(1)
    assert w2.center_tabs.currentWidget() is w2.parity_view and w2.prompt.mode() == "both"
    assert w2.prompt.prompt() == w.prompt.prompt()
    assert w2.parity_view.headline.text() == w.parity_view.headline.text()
    assert w2.parity_view.differences == w.parity_view.differences
    for side in ("ar", "dflash"):
        a, b = getattr(w.parity_view, side), getattr(w2.parity_view, side)
        assert b.plain_text() == a.plain_text() and b.marked() == a.marked()
    assert sorted(w2.controller.runs) == sorted(w.controller.runs)
    for mode, run in w.controller.runs.items():
        assert w2.controller.runs[mode].token_ids() == run.token_ids()
    assert (w2.rounds_run is None) == (w.rounds_run is None)
    if w.rounds_run is not None:
        assert w2.rounds_run.rounds == w.rounds_run.rounds


def test_a_both_run_exports_both_runs_and_the_verdict(qtbot, make_window, qwen3_tied_dirs, tmp_path):
    """A parity check is saved whole (schema dflash-trace/2: AR's run, DFlash's, the verdict) and opens as
    the comparison it was; re-exported, it is the same file."""
    from engine.tools.trace import RUNS_SCHEMA, read_runs

    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=8, mode="both")
    run_and_wait(qtbot, w)
    path = tmp_path / "both.jsonl"
    w2 = reopened(make_window, w, path)
    trace = read_runs(path)
    assert [r.header["mode"] for r in trace.runs] == ["ar", "dflash"]
    assert all(r.header["schema"] == RUNS_SCHEMA for r in trace.runs)
    assert trace.parity["identical"] is True and trace.parity["compared"] == len(w.runs["ar"].tokens)
    assert_same_comparison(w, w2)
    assert w2.export_trace(tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_text() == path.read_text()
    # Perfetto gets both runs, one process each
    assert w2.export_chrome(tmp_path / "both.json")
    events = json.loads((tmp_path / "both.json").read_text())["traceEvents"]
    assert sorted(e["args"]["name"] for e in events if e.get("name") == "process_name") == \
        ["AR run: " + qwen3_tied_dirs[0].name, "DFlash run: " + qwen3_tied_dirs[0].name]


def test_auto_verify_length_from_the_window_is_lossless(qtbot, make_window, qwen3_tied_dirs):
    from app.rounds_view import round_tooltip

    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[1], max_tokens=24, mode="both")
    w.prompt.block_auto.setChecked(True)
    assert w.prompt.settings().auto
    run_and_wait(qtbot, w)
    assert w.errors == [] and w.parity_view.result.identical
    rounds = w.rounds_run.rounds
    # a chain's round verifies its drafts and the anchor; a tree's (auto tree, when on) its nodes
    assert rounds and all(r.verified == (len(r.tree_parents) or len(r.drafted) + 1) for r in rounds)
    # what auto picks depends on this machine's timings: a round that drafted names its verified
    # positions, a plain step says it is one
    drafted = [r for r in rounds if r.drafted]
    plain = [r for r in rounds if r.bonus_kind == "plain"]
    for r in drafted[:1]:
        assert f"verified {r.verified} positions" in round_tooltip(r, w.rounds_run.table)
    for r in plain[:1]:
        assert "a plain step (auto skipped the drafter" in round_tooltip(r, w.rounds_run.table)
    w.save_settings()
    from app.settings import load_settings

    assert load_settings()[0].block_auto is True


def test_a_window_run_takes_copies_by_default_and_can_be_told_not_to(qtbot, make_window, alternating_dirs):
    """Copy lookup is on in a fresh window, as on the command line: on the alternating oracle's
    repeating output a DFlash run verifies copies (chips of the lookup source) and stays identical
    to AR; unticked, every draft is the drafter's, and the choice is saved."""
    from app.settings import load_settings

    w = make_window()
    assert w.prompt.lookup.isChecked() and w.prompt.settings().lookup
    choose(w, alternating_dirs, PROMPTS[2], max_tokens=40, mode="both")
    run_and_wait(qtbot, w)
    assert w.errors == [] and w.parity_view.result.identical
    assert "lookup" in {r.source for r in w.rounds_run.rounds if r.drafted}
    w.prompt.lookup.setChecked(False)
    run_and_wait(qtbot, w)
    assert w.errors == [] and w.parity_view.result.identical
    assert {r.source for r in w.rounds_run.rounds if r.drafted} == {"drafter"}
    w.save_settings()
    assert load_settings()[0].lookup is False


def test_a_second_run_of_the_prompt_reuses_its_prefill_and_says_so(qtbot, make_window, qwen3_tied_dirs):
    """Same prompt with new settings: the prefill is taken from the last run, the status line says how
    much, and the tokens are those of a run that prefilled afresh."""
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[1], max_tokens=12, mode="ar")
    run_and_wait(qtbot, w)
    n = w.current_run.summary.prompt_tokens
    assert w.current_run.summary.reused_tokens == 0
    w.prompt.set_mode("dflash")
    w.prompt.max_tokens.setValue(16)
    run_and_wait(qtbot, w)
    summary = w.rounds_run.summary
    assert summary.reused_tokens == n and f"prompt reused {n:,}/{n:,}" in w.statusBar().currentMessage()
    pair = load_pair(*qwen3_tied_dirs)
    ids = encode_prompt(pair.tokenizer, PROMPTS[1], chat=False)
    cold = list(generate(pair, ids, GenerationSettings(max_tokens=16)))[-1]
    assert summary.token_ids == cold.token_ids
    assert all(not isinstance(e, PrefillEvent) for e in w.rounds_run.events)  # progress is not part of a trace
    w.prompt.set_mode("both")  # DFlash's half takes AR's prefill: the line says so, not "reused" bare
    run_and_wait(qtbot, w)
    assert f"prompt reused {n:,}/{n:,} from the AR run" in w.statusBar().currentMessage()


def test_a_refused_run_leaves_the_kept_prefill_for_the_next(qtbot, make_window, qwen3_tied_dirs):
    """A setting the engine refuses (max tokens past the context; top-k past the vocabulary was the
    other, before the box was bounded by it) stops a run before it touches the caches: the next run
    still starts from the last run's prefill (it was thrown away, and a long prompt was prefilled
    again for one mistyped box)."""
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[1], max_tokens=8, mode="dflash")
    run_and_wait(qtbot, w)
    n = w.current_run.summary.prompt_tokens
    w.prompt.max_tokens.setValue(1_000_000)
    run_and_wait(qtbot, w)
    assert len(w.errors) == 1 and "context" in w.errors[0], w.errors
    w.errors.clear()
    w.prompt.max_tokens.setValue(8)
    run_and_wait(qtbot, w)
    assert w.errors == [] and w.current_run.summary.reused_tokens == n


def test_a_one_token_run_shows_no_speed(qtbot, make_window, qwen3_tied_dirs):
    """The only token is the prefill's: a rate over it (thousands of tok/s) would mean nothing."""
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=1)
    run_and_wait(qtbot, w)
    assert w.current_run.summary.num_generated == 1
    assert w.status_labels["tok/s"].text() == "tok/s: –"
    assert w.statusBar().currentMessage() == "dflash: 1 token, max_tokens"


def test_a_run_the_target_ends_at_once_says_so_instead_of_a_count(qtbot, make_window, oracle_first_eos_dirs):
    """EOS as the first token is the target's doing: the status line says it and what to try, not
    "1 token, eos" beside an empty output."""
    w = make_window()
    choose(w, oracle_first_eos_dirs, "hello world", max_tokens=8)
    run_and_wait(qtbot, w)
    assert w.current_run.summary.ended_at_once
    assert w.status_labels["tok/s"].text() == "tok/s: –"
    assert w.statusBar().currentMessage().startswith("dflash: the target wrote EOS first; write on")
    w.prompt.set_mode("both")  # the parity tab gave a speedup of two one-token runs (30,815 against 45,110 tok/s)
    run_and_wait(qtbot, w)
    text = w.parity_view.headline.text()
    assert text.startswith("The target wrote EOS as its first token in both runs") and "tok/" not in text
    assert w.parity_view.labels["AR"].text() == "AR · 1 token"


def test_a_refused_run_leaves_the_last_results_on_show(qtbot, make_window, qwen3_tied_dirs):
    """A run the engine refuses before it starts (prompt plus max tokens past the context) shows its
    error and keeps the last run's output, rounds and figures, instead of clearing them first."""
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=12)
    run_and_wait(qtbot, w)
    last = w.current_run
    text, rows = w.output.plain_text(), w.rounds.rounds_model.rowCount()
    w.prompt.max_tokens.setValue(100_000)  # the fixtures' context is 4096
    with qtbot.waitSignal(w.error_shown, timeout=RUN_TIMEOUT_MS):
        run_and_wait(qtbot, w)
    assert "max tokens" in w.errors[-1]
    assert w.current_run is last and w.output.plain_text() == text and w.rounds.rounds_model.rowCount() == rows
    assert w.status_labels["tokens"].text() == f"tokens: {len(last.tokens)}"
    assert w.statusBar().currentMessage() == "the run did not start; the last results are still on show"
    # and the next run that starts replaces them
    w.prompt.max_tokens.setValue(5)
    run_and_wait(qtbot, w)
    assert w.current_run is not last and w.current_run.summary.num_generated == 5


@pytest.mark.measures_cost_curve
def test_the_cost_curves_measurement_shows_its_progress_and_time_left(qtbot, make_window, qwen3_tied_dirs,
                                                                      monkeypatch, tmp_path):
    """A first auto run measures the cost curve: a strip above the tabs says what it measures, with a
    progress bar of its steps and, once a pace is known, about how long is left (a long prompt's first
    run spent 19 of 27 s there, counting only, in a status line cut at 1280x800)."""
    from engine.decode import cost_curve as cc

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))  # no curve cached: this run measures
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS, 64))
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=8, mode="dflash", block_size=4, block_auto=True)
    measuring = []
    w.progress.shown.connect(measuring.append)
    run_and_wait(qtbot, w)
    assert measuring and all("measuring this machine's cost curve (block 4, draft window 256)" in m and m.endswith("Esc stops")
                             for m in measuring)
    assert [int(m.split(": ")[-1].split("/")[0]) for m in measuring] == sorted(set(
        int(m.split(": ")[-1].split("/")[0]) for m in measuring))  # the bar only moves on
    assert not w.progress.isVisible()  # gone with the measurement
    assert any(", about " in m and " s left" in m for m in measuring)  # after the first step, a pace
    assert not measuring[0].count("s left")  # the first step compiles: no pace from it
    assert w.current_run.summary.num_generated == 8


@pytest.mark.measures_cost_curve
def test_both_mode_stopped_while_dflash_measures_keeps_ars_figures(qtbot, make_window, qwen3_tied_dirs,
                                                                   monkeypatch, tmp_path):
    """Stop while the DFlash half measures the cost curve: the AR half finished, and the status line's
    figures are its own (they read 'tok/s: –, tokens: 0, peak: 0 MB'; QA pass)."""
    from engine.decode import cost_curve as cc

    from engine.decode import speculative

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS, 64))
    measure = speculative.cost_curve_steps

    def held_after_first_step(*args, cancel, **kwargs):
        """The measurement waits at its first step for the window's Stop: on a cold first run the
        worker finished measuring and decoding before the window read the first progress event."""
        steps = measure(*args, cancel=cancel, **kwargs)
        yield next(steps)
        assert cancel.wait(30), "the window never stopped the run"
        return (yield from steps)

    monkeypatch.setattr(speculative, "cost_curve_steps", held_after_first_step)
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=8, mode="both", block_size=4, block_auto=True)
    on_show = []

    def measuring(_line):
        on_show.append(w.output.plain_text())  # while DFlash measures: AR's text, not a blank pane
        w.stop()

    w.progress.shown.connect(measuring)
    run_and_wait(qtbot, w)
    ar, df = w.runs["ar"], w.runs["dflash"]
    assert on_show and on_show[0] == ar.summary.text
    assert len(ar.tokens) == 8 and not df.tokens and "stopped before its first token" in w.statusBar().currentMessage()
    assert w.status_labels["tokens"].text() == "tokens: 8"
    assert w.status_labels["peak"].text() != "peak: 0 MB"
