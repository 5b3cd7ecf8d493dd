"""The Race tab through the real worker thread: every method runs in turn, the table holds the
engine's figures, a row opens its run, Stop and a bad draft model behave."""

import csv
import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from app import files, theme
from app.race_view import COLUMNS
from app.rounds_view import round_tooltip
from app.selector_view import NOT_DFLASH, V1

from helpers import PROMPTS
from window_helpers import RUN_TIMEOUT_MS, choose


def race(w, methods, draft_model=None, num_draft=3):
    """Tick the methods (and the draft model) in the Race tab, as a user would."""
    view = w.race_view
    w.center_tabs.setCurrentWidget(view)
    view.set_methods(methods)
    if draft_model is not None:
        view.draft_model.setText(str(draft_model))
        view.num_draft.setValue(num_draft)
    return view


def race_and_wait(qtbot, w, timeout=RUN_TIMEOUT_MS):
    with qtbot.waitSignal(w.run_finished, timeout=timeout):
        qtbot.mouseClick(w.race_view.race_button, Qt.MouseButton.LeftButton)


def test_a_race_runs_every_method_and_shows_the_engine_figures(qtbot, make_window, qwen3_tied_dirs, tmp_path):
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=24, block_size=4)
    methods = ["ar", "dflash", "lookup", "dflash+lookup", "draft-model"]
    view = race(w, methods, draft_model=qwen3_tied_dirs[0])  # the target as its own draft model
    assert view.draft_model.isEnabled() and view.num_draft.isEnabled()
    race_and_wait(qtbot, w)
    assert w.errors == []
    assert view.rows == methods and view.table.rowCount() == len(methods)
    assert list(w.runs) == methods and w.controller.race.methods == methods and not w.controller.race.cancelled

    ar = w.runs["ar"].summary
    for m in methods:
        run = w.runs[m]
        s = run.summary
        assert s.stop_reason == "max_tokens" and s.num_generated == 24
        if m != "ar":  # every later method starts from the prompt's prefill, kept by the run before it
            assert s.reused_tokens == s.prompt_tokens
        f = view.results[m].figures
        assert f["dflash_tok_s"] == pytest.approx(s.tok_per_s, rel=1e-3)
        assert view.cell(m, "tok/s") == f"{f['dflash_tok_s']:.1f}"
        assert view.cell(m, "tokens") == str(s.num_generated)
        if m == "ar":
            assert view.cell(m, "speedup") == "×1.00" and view.cell(m, "vs AR") == "reference"
            continue
        assert f["speedup"] == pytest.approx(s.tok_per_s / ar.tok_per_s, rel=1e-2)
        assert view.cell(m, "speedup") == f"×{f['speedup']:.2f}"
        assert f["mean_acceptance_length"] == pytest.approx(s.mean_acceptance_length)
        assert view.cell(m, "τ") == f"{s.mean_acceptance_length:.2f}"
        assert s.token_ids == ar.token_ids and view.cell(m, "vs AR") == "✓ identical"
        assert "identical" in view.table.item(methods.index(m), COLUMNS.index("vs AR")).toolTip()
    # Where the drafts came from, per method, as the rounds say.
    sources = {m: {r.source for r in w.runs[m].rounds if r.drafted} for m in methods[1:]}
    assert sources["dflash"] == {"drafter"} and sources["draft-model"] == {"draft-model"}
    assert sources["lookup"] <= {"lookup"} and sources["dflash+lookup"] <= {"drafter", "lookup"}

    # The throughput plot: one curve per method, each in the legend.
    series = w.plots.series()
    for m in methods:
        assert len(series[f"tps_{m}"]) > 0
    legend = [label.text for _sample, label in w.plots.tps_legend.items]
    assert sorted(legend) == sorted(theme.METHOD_LABEL[m] for m in methods)

    # A row opens that method's run: rounds, output, round plots, status line.
    for m in ("lookup", "draft-model", "dflash"):
        view.select_method(m)
        run = w.runs[m]
        assert w.rounds_run is run and w.current_run is run
        assert w.rounds.rounds_model.rowCount() == len(run.rounds) == run.summary.num_rounds + \
            run.summary.num_plain_steps
        assert [w.rounds.rounds_model.round_at(i) for i in range(len(run.rounds))] == run.rounds
        assert w.output.plain_text() == run.summary.text
        assert list(w.plots.series()["acceptance_length"]) == [r.accepted + 1 for r in run.rounds]
        assert theme.METHOD_LABEL[m] in w.status_labels["tok/s"].text()
        # the Selector tab says why it has nothing to show (it said "No drafted positions yet." for copies
        # and a draft model's drafts), and every drafted round carries how sure each side was
        assert w.selector_view.empty.text() == (V1 if m == "dflash" else NOT_DFLASH[m])
        drafted = [r for r in run.rounds if r.drafted]
        assert all(len(r.draft_p) == len(r.target_p) == len(r.drafted) for r in drafted)
        if m == "draft-model":
            assert "draft model confidence per draft" in round_tooltip(drafted[0], run.table)
        # File > Export writes the method on show (it once wrote the fixed-block DFlash run whatever the row)
        assert w.export_trace(tmp_path / f"{m}.jsonl")
        saved = files.open_trace(tmp_path / f"{m}.jsonl")
        assert saved.token_ids() == run.token_ids() and [r.source for r in saved.rounds] == \
            [r.source for r in run.rounds]
        assert saved.start.mode == run.start.mode
        assert saved.start.settings == json.loads(json.dumps(run.start.settings))  # as JSON keeps it
    view.select_method("ar")
    assert w.rounds_run is None and w.current_run is w.runs["ar"] and w.rounds.rounds_model.rowCount() == 0
    assert w.status_labels["tok/s"].text() == f"ar tok/s: {w.runs['ar'].tok_per_s:.1f}"  # not AR beside DFlash

    # File > Export race table: every method's figures side by side, as the table reads (a trace holds
    # one method's run; the table could not be kept)
    from app.race_export import export_race_table

    assert export_race_table(w, tmp_path / "race.csv")
    race_runs, race_speed = dict(w.runs), view.cell("dflash", "tok/s")
    with open(tmp_path / "race.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(COLUMNS) and [r[0] for r in rows[1:]] == [view.table.item(i, 0).text() for i in
                                                                     range(len(methods))]
    assert all(r[COLUMNS.index("tok/s")] == view.cell(m, "tok/s") for r, m in zip(rows[1:], methods))

    # A plain run afterwards keeps the race: its table, its export, and a row picked shows that method's run
    choose(w, qwen3_tied_dirs, max_tokens=8, mode="dflash")
    with qtbot.waitSignal(w.run_finished, timeout=RUN_TIMEOUT_MS):
        w.start_run()
    assert list(w.runs) == ["dflash"] and w.runs["dflash"] is not race_runs["dflash"]
    assert view.table.rowCount() == len(methods) and view.cell("dflash", "tok/s") == race_speed
    assert w.race_export_action.isEnabled() and export_race_table(w, tmp_path / "again.csv")
    assert (tmp_path / "again.csv").read_text() == (tmp_path / "race.csv").read_text()
    assert [label.text for _s, label in w.plots.tps_legend.items] == ["DFlash"]  # no AR in a DFlash-only run
    view.select_method("dflash+lookup")
    assert w.current_run is race_runs["dflash+lookup"] and w.controller.job_mode == "race"


def test_the_race_export_waits_for_a_race(qtbot, make_window, qwen3_tied_dirs):
    """File > Export race table is off until a race has finished, and off again while the next one runs."""
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=8, block_size=4)
    assert not w.race_export_action.isEnabled()
    view = race(w, ["ar", "dflash"])
    for _ in range(2):
        with qtbot.waitSignal(w.run_finished, timeout=RUN_TIMEOUT_MS):
            w.start_race()
            assert not w.race_export_action.isEnabled()
        assert w.race_export_action.isEnabled() and view.table.rowCount() == 2


def test_drafted_chips_show_their_source_and_the_legend_names_them(qtbot, make_window, alternating_dirs):
    """The alternating oracle repeats itself: DFlash+lookup's rounds move from the drafter to copies."""
    w = make_window()
    choose(w, alternating_dirs, PROMPTS[2], max_tokens=60, block_size=4)
    view = race(w, ["ar", "dflash+lookup"])
    race_and_wait(qtbot, w)
    assert w.errors == [] and view.cell("dflash+lookup", "vs AR") == "✓ identical"
    run = w.runs["dflash+lookup"]
    assert w.rounds_run is run  # the rounds follow the last method
    rows = {source: next(i for i, r in enumerate(run.rounds) if r.source == source and r.drafted)
            for source in ("drafter", "lookup")}
    w.resize(1440, 900)
    qtbot.waitExposed(w)
    for source, row in rows.items():
        w.rounds.scrollTo(w.rounds.rounds_model.index(row, 0))
        rect = w.rounds.visualRect(w.rounds.rounds_model.index(row, 2))
        image = w.rounds.viewport().grab(rect).toImage()
        colours = {image.pixelColor(x, y).name() for x in range(image.width()) for y in range(image.height())}
        assert QColor(theme.CHIP_SOURCE[source]).name() in colours, source
        other = "lookup" if source == "drafter" else "drafter"
        assert QColor(theme.CHIP_SOURCE[other]).name() not in colours, source
    assert all(label in w.rounds_legend.text() for label in theme.SOURCE_LABEL.values())


def test_a_race_at_temperature_says_samples(qtbot, make_window, qwen3_tied_dirs):
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[1], max_tokens=16, temperature=0.8, seed=3)
    view = race(w, ["ar", "dflash", "lookup"])
    race_and_wait(qtbot, w)
    assert w.errors == []
    for m in ("dflash", "lookup"):
        assert view.cell(m, "vs AR") == "~ samples"
        assert "two samples" in view.table.item(view.rows.index(m), COLUMNS.index("vs AR")).toolTip()


def test_stop_mid_race_stops_with_a_notice_and_the_window_stays_usable(qtbot, make_window, qwen3_tied_dirs):
    w = make_window()
    # AR runs first and whole; then dflash's rounds of about one token each leave hundreds of rounds to stop in
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=800)
    view = race(w, ["ar", "dflash", "lookup"])
    qtbot.mouseClick(view.race_button, Qt.MouseButton.LeftButton)
    assert view.stop_button.isEnabled() and not view.race_button.isEnabled()
    qtbot.waitUntil(lambda: "dflash" in w.runs and len(w.runs["dflash"].rounds) >= 3, timeout=120_000)
    with qtbot.waitSignal(w.run_finished, timeout=30_000):
        qtbot.mouseClick(view.stop_button, Qt.MouseButton.LeftButton)
    assert w.errors == []
    assert "race stopped: 1 of 3 methods finished, dflash stopped part-way" in w.notices[-1]  # said "after 1 of 3"
    assert w.controller.race.cancelled and w.controller.race.methods == ["ar"]
    assert w.runs["dflash"].summary.stop_reason == "cancelled" and "lookup" not in w.runs
    assert view.cell("ar", "vs AR") == "reference"
    assert view.cell("dflash", "vs AR") == "stopped" and view.cell("lookup", "vs AR") == "not run"
    assert view.race_button.isEnabled() and not view.stop_button.isEnabled() and w.prompt.run_button.isEnabled()
    # Still usable: a short race runs to the end.
    w.prompt.max_tokens.setValue(8)
    race_and_wait(qtbot, w)
    assert w.errors == [] and w.controller.race.methods == ["ar", "dflash", "lookup"]
    assert view.cell("lookup", "vs AR") == "✓ identical"


def test_a_bad_draft_model_gives_the_engine_line_before_anything_runs(qtbot, make_window, qwen3_tied_dirs,
                                                                      tmp_path):
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=8)
    missing = tmp_path / "no-such-draft-model"
    view = race(w, ["ar", "dflash", "draft-model"], draft_model=missing)
    with qtbot.waitSignal(w.error_shown, timeout=RUN_TIMEOUT_MS) as shown:
        race_and_wait(qtbot, w)
    message = shown.args[0]
    assert str(missing) in message and "no such folder" in message and "\n" not in message
    assert w.error_box is not None and w.error_box.isVisible() and w.error_box.text() == message
    assert w.runs == {} and view.cell("ar", "vs AR") == "not run"
    assert view.race_button.isEnabled()
    # AR alone: nothing to race it against; the window says so, nothing is submitted.
    view.set_methods(["ar"])
    w.start_race()
    assert not w.busy and "tick a method besides AR" in w.errors[-1]
    # One token to write: the first is the prefill's, so a race would time nothing (it showed 9,000 tok/s).
    view.set_methods(["ar", "dflash"])
    w.prompt.max_tokens.setValue(1)
    w.start_race()
    assert not w.busy and "leaves nothing to time" in w.errors[-1]
    w.prompt.max_tokens.setValue(8)
    # Unticked draft-model with no model named: the window says so itself, nothing is submitted.
    view.set_methods(["ar", "draft-model"])
    view.draft_model.setText("")
    w.start_race()
    assert not w.busy and "needs a draft model" in w.errors[-1]
    # Untick it: the race runs.
    view.set_methods(["ar", "dflash"])
    assert not view.draft_model.isEnabled()
    race_and_wait(qtbot, w)
    assert len(w.errors) == 4 and view.cell("dflash", "vs AR") == "✓ identical"
