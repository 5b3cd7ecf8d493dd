"""Exports (trace JSONL, Chrome trace, rounds CSV, plots PNG) and replaying a trace with no model loaded."""

import csv
import json

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage

from app.status_line import DEVICE_WIDTH
from engine.decode.events import to_dict
from engine.tools.trace import SCHEMA, read_trace

from helpers import PROMPTS
from window_helpers import choose, run_and_wait


def finished_run(qtbot, make_window, dirs, **settings):
    w = make_window()
    choose(w, dirs, PROMPTS[0], **{"max_tokens": 30, **settings})
    run_and_wait(qtbot, w)
    assert w.errors == []
    return w


def test_export_then_open_trace_round_trip(qtbot, make_window, alternating_dirs, tmp_path):
    w = finished_run(qtbot, make_window, alternating_dirs, block_size=4)
    run = w.rounds_run
    path = tmp_path / "out" / "run.jsonl"
    assert w.export_trace(path)

    header, records = read_trace(path)
    assert header["schema"] == SCHEMA and header == json.loads(json.dumps(run.header))
    assert header["prompt_ids"] == run.start.prompt_ids
    assert records == [to_dict(e) for e in run.events[1:]]

    # A fresh window, no model loaded: the trace replays into rounds, plots and output.
    w2 = make_window()
    assert w2.loaded is None
    assert w2.open_trace(path)
    replay = w2.rounds_run
    assert w2.loaded is None and w2.controller.replaying == path
    assert w2.rounds.rounds_model.rowCount() == len(run.rounds)
    assert [w2.rounds.rounds_model.round_at(i) for i in range(len(run.rounds))] == run.rounds
    assert w2.output.plain_text() == run.summary.text == w.output.plain_text()
    assert [(t.id, t.kind, t.round, t.block_pos) for t in replay.tokens] == \
           [(t.id, t.kind, t.round, t.block_pos) for t in run.tokens]
    # The target's tokenizer is still on disk, so tokens get their own spans as in the live run.
    assert [(t.start, t.end) for t in replay.tokens] == [(t.start, t.end) for t in run.tokens]
    live, again = w.plots.series(), w2.plots.series()
    for key in ("acceptance_length", "position_rate", "stack_draft", "stack_verify", "stack_rollback",
                "tps_dflash"):
        np.testing.assert_allclose(again[key], live[key], err_msg=key)
    assert w2.status_labels["rounds"].text() == w.status_labels["rounds"].text() == \
        f"rounds: {run.stats.rounds}" + (f" (+{run.stats.plain_steps} plain)" if run.stats.plain_steps else "")
    # The prompt, its format, the settings and the device come from the trace's header.
    assert header["prompt"] == {"text": w.prompt.prompt(), "format": "raw"}
    assert w2.prompt.prompt() == w.prompt.prompt() and w2.prompt.format.currentData() == "raw"
    assert w2.prompt.block_size.value() == 4 and w2.prompt.max_tokens.value() == w.prompt.max_tokens.value()
    assert w2.prompt.mode() == "dflash"
    assert w2.prompt.lookup.isChecked() is header["settings"]["lookup"] is True
    assert w2.status_labels["device"].toolTip() == f"device: {header['device']}"
    # the same machine reads the same, live and replayed (live said "cpu (blas: …", replayed "cpu (Linux
    # x86_64, …"); the BLAS library's path is left to the tooltip
    assert w2.status_labels["device"].line == w.status_labels["device"].line and "/" not in w.status_labels["device"].line

    # Exporting the replay writes the same trace again.
    again_path = tmp_path / "again.jsonl"
    assert w2.export_trace(again_path)
    assert read_trace(again_path) == (header, records)
    assert not any("cut short" in n for n in w2.notices)

    # A copy cut short (half its lines, the last one torn) opens what it holds and says what is missing.
    lines = path.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[: len(lines) // 2]) + lines[len(lines) // 2][:10])
    assert w2.open_trace(cut)
    kept = w2.rounds_run
    assert kept.summary is None and 0 < len(kept.rounds) < len(run.rounds)
    assert w2.notices[-1].startswith(f"cut.jsonl ends after {len(kept.rounds)} rounds, without the run's summary")
    assert "did not finish" in w2.notices[-1]
    assert w2.notice_box.isVisible() and w2.notice_box.text() == w2.notices[-1]  # whole, not cut by the status bar
    # its first rounds' rate is no run's speed (a live run shows its running rate; a cut file has none)
    assert kept.tok_per_s is None and w2.status_labels["tok/s"].text() == "tok/s: –"


def test_a_trace_of_an_ar_run_leaves_the_dflash_choices_alone(make_window):
    """An AR (or draft-model) run's settings say auto and lookup are off because that mode takes
    neither, not because its user turned them off: opening its trace keeps the boxes as they were.
    A DFlash run's trace sets them."""
    w = make_window()
    assert w.prompt.lookup.isChecked() and w.prompt.block_auto.isChecked()
    w.prompt.apply_trace_header({"mode": "ar", "settings": {"auto": False, "lookup": False}})
    assert w.prompt.mode() == "ar" and w.prompt.lookup.isChecked() and w.prompt.block_auto.isChecked()
    w.prompt.apply_trace_header({"mode": "dflash", "settings": {"auto": True, "lookup": False}})
    assert not w.prompt.lookup.isChecked() and w.prompt.block_auto.isChecked()
    # A draft-model run (the Race tab's) keeps the panel's mode, and its block (num_draft + 1) is no block size.
    w.prompt.set_mode("ar")
    w.prompt.block_size.setValue(8)
    w.prompt.apply_trace_header({"mode": "draft-model", "settings": {"block_size": 4, "max_tokens": 33}})
    assert w.prompt.mode() == "ar" and w.prompt.block_size.value() == 8 and w.prompt.max_tokens.value() == 33


def test_replay_without_the_tokenizer_keeps_the_text(qtbot, make_window, qwen3_tied_dirs, tmp_path):
    """When the target folder is gone, each committed batch is one span; the text is still exact."""
    w = finished_run(qtbot, make_window, qwen3_tied_dirs)
    path = tmp_path / "run.jsonl"
    w.export_trace(path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["target"] = str(tmp_path / "deleted-target")
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    w2 = make_window()
    assert w2.open_trace(path)
    assert w2.output.plain_text() == w.rounds_run.summary.text
    assert w2.rounds_run.table is None
    # Chips fall back to ids; each round's tokens share its batch's text.
    model = w2.rounds.rounds_model
    r0 = w.rounds_run.rounds[0]
    assert f"#{r0.anchor}" in model.index(0, 3).data(Qt.ItemDataRole.ToolTipRole)
    for r in w2.rounds_run.rounds:
        spans = {(t.start, t.end) for t in (w2.rounds_run.tokens[i] for i in w2.rounds_run.round_tokens[r.index])}
        assert len(spans) == 1


def test_chrome_csv_and_png_exports(qtbot, make_window, qwen3_tied_dirs, tmp_path):
    w = finished_run(qtbot, make_window, qwen3_tied_dirs)
    rounds = w.rounds_run.rounds

    chrome = tmp_path / "run.chrome.json"
    assert w.export_chrome(chrome)
    events = json.loads(chrome.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X" and e["name"] != "prefill"]
    assert len(spans) == 3 * len(rounds) and sum(e["name"] == "prefill" for e in events) == 1
    assert {e["args"]["round"] for e in spans} == {r.index for r in rounds}

    table = tmp_path / "rounds.csv"
    assert w.export_rounds_csv(table)
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(rounds)
    for row, r in zip(rows, rounds):
        assert int(row["index"]) == r.index and int(row["accepted"]) == r.accepted
        assert [int(x) for x in row["drafted"].split()] == r.drafted
        assert abs(float(row["verify_ms"]) - r.verify_ms) < 1e-6
        assert all(len(row[c].partition(".")[2]) <= 6 for c in ("t", "draft_ms", "verify_ms", "rollback_ms"))
        assert abs(float(row["t"]) - r.t) < 1e-6
    w.rounds_run.rounds[0].t = 36.757999999999996  # a sum's noise, as one run wrote it
    assert w.export_rounds_csv(table)
    with open(table, newline="") as f:
        assert next(csv.DictReader(f))["t"] == "36.758"

    png = tmp_path / "plots.png"
    shown = w.plots.size()
    assert w.save_plots_png(png)
    image = QImage(str(png))  # laid out at 1600x900 at least: a slide's
    assert image.width() >= 1600 and image.height() >= 900 and w.plots.size() == shown


def test_export_with_nothing_and_a_bad_trace_are_refused(qtbot, make_window, tmp_path):
    w = make_window()
    assert not w.export_trace(tmp_path / "x.jsonl")
    assert "nothing" in w.errors[-1].lower() or "run a prompt" in w.errors[-1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "round"}\n')
    assert not w.open_trace(bad)
    assert SCHEMA in w.errors[-1] and str(bad) in w.errors[-1]
    assert w.error_box.isVisible() and not w.error_box.isModal()


def test_a_trace_of_the_drafters_own_block_reopens_as_drafters(qtbot, make_window, alternating_dirs, tmp_path):
    """A run resolves the window's "drafter's" block to the drafter's own size: opening its trace puts
    "drafter's" back, not that number (which would pin the block if the drafter changed)."""
    w = finished_run(qtbot, make_window, alternating_dirs, block_size=0)
    assert w.prompt.block_size.value() == 0
    assert w.export_trace(tmp_path / "run.jsonl")
    w2 = make_window()
    w2.prompt.block_size.setValue(3)
    assert w2.open_trace(tmp_path / "run.jsonl")
    assert w2.prompt.block_size.value() == 0 and w2.prompt.block_size.text() == "drafter's"


def parity_trace(dirs, path, *extra):
    from app.cli import main as cli

    assert cli(["parity", "--target", str(dirs[0]), "--drafter", str(dirs[1]), "--prompt", PROMPTS[0], "--raw",
                "--max-tokens", "24", "--block-size", "4", "--trace", str(path), *extra]) == 0
    return path


def test_an_unfinished_parity_check_opens_with_both_runs_and_no_verdict(make_window, qwen3_tied_dirs, tmp_path,
                                                                         capsys):
    """A check cut short (Ctrl-C, a crash: no verdict, DFlash's run unfinished) shows both runs side by side
    and says what is missing; exported again it is the same file, and the open file is never written over."""
    from engine.tools.trace import read_runs

    whole = parity_trace(qwen3_tied_dirs, tmp_path / "whole.jsonl")
    capsys.readouterr()
    lines = whole.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-2]))  # no verdict, no DFlash summary
    w = make_window()
    assert w.open_trace(cut) and w.errors == []
    ar, dflash = w.controller.runs["ar"], w.controller.runs["dflash"]
    assert ar.summary is not None and dflash.summary is None and dflash.tokens
    assert w.center_tabs.currentWidget() is w.parity_view and w.center_tabs.tabText(1) == "Parity –"
    assert w.parity_view.ar.plain_text() == ar.summary.text and w.parity_view.dflash.plain_text() == dflash.text
    assert w.parity_view.headline.text().startswith("This check did not finish, so its file has no verdict: "
                                                    f"identical over the {len(dflash.tokens)} tokens")
    assert w.notices[-1].startswith("cut.jsonl: its DFlash run ends after")
    assert "×" not in w.status_labels["tok/s"].text()  # no speedup from an unfinished run's first rounds
    assert w.prompt.mode() == "both"
    again = tmp_path / "again.jsonl"
    assert w.export_trace(again) and again.read_text() == cut.read_text()
    assert read_runs(again).parity is None
    assert not w.export_trace(cut) and "input" in w.errors[-1] and cut.read_text() == "".join(lines[:-2])

    # Only the AR run (Stop came before DFlash started, the verdict lost with it): said so.
    ar_only = tmp_path / "ar-only.jsonl"
    first_dflash = next(i for i, line in enumerate(lines) if '"mode": "dflash"' in line and '"header"' in line)
    ar_only.write_text("".join(lines[:first_dflash]))
    assert w.open_trace(ar_only)
    assert "dflash" not in w.controller.runs and w.parity_view.headline.text().startswith(
        "This check did not finish: its file holds the AR run only")
    assert w.notices[-1] == "ar-only.jsonl: this parity check did not finish, so the file has no verdict and no " \
                            "DFlash run."


def test_a_parity_record_that_contradicts_its_runs_is_refused(qwen3_tied_dirs, tmp_path, capsys):
    from engine.errors import DFlashError
    from engine.tools.trace import read_runs

    path = parity_trace(qwen3_tied_dirs, tmp_path / "check.jsonl", "--temperature", "1", "--seed", "3")
    capsys.readouterr()
    lines = path.read_text().splitlines()
    record = json.loads(lines[-1])
    for field, value in (("first_divergence", 999), ("identical", not record["identical"]),
                         ("compared", record["compared"] + 1)):
        bad = tmp_path / f"bad-{field}.jsonl"
        bad.write_text("\n".join(lines[:-1] + [json.dumps({**record, field: value})]) + "\n")
        with pytest.raises(DFlashError, match=f"does not match its runs: '{field}'"):
            read_runs(bad)


def test_opening_a_trace_is_one_undoable_edit_and_picks_its_pair(qtbot, make_window, qwen3_tied_dirs, tmp_path,
                                                                 capsys):
    """The prompt the user typed comes back with Ctrl+Z; the pickers hold the pair the trace was made with."""
    path = parity_trace(qwen3_tied_dirs, tmp_path / "check.jsonl")
    capsys.readouterr()
    w = make_window()
    w.prompt.editor.setFocus()
    w.prompt.set_prompt("my own long prompt")
    assert w.models.target_value() != str(qwen3_tied_dirs[0])
    assert w.open_trace(path)
    assert w.prompt.prompt() == PROMPTS[0]
    assert (w.models.target_value(), w.models.drafter_value()) == tuple(map(str, qwen3_tied_dirs))
    w.prompt.editor.undo()
    assert w.prompt.prompt() == "my own long prompt"


def test_a_live_run_after_a_trace_shows_this_machines_device(qtbot, make_window, qwen3_tied_dirs, tmp_path):
    """A trace made on a Mac says so while it is on show; the next run here says where it ran, and the
    status line counts rounds as the engine does (auto's plain steps apart)."""
    w = finished_run(qtbot, make_window, qwen3_tied_dirs)
    here = w.status_labels["device"].toolTip()
    path = tmp_path / "mac.jsonl"
    assert w.export_trace(path)
    lines = path.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "device": "gpu (Darwin arm64, blas: accelerate)"})
    path.write_text("\n".join(lines) + "\n")
    assert w.open_trace(path)
    device = w.status_labels["device"]
    assert device.toolTip() == "device: gpu (Darwin arm64, blas: accelerate)"
    # wider than the bar allows, or than the room a laptop-sized bar leaves it: cut with an ellipsis
    # to the label's width (clipped, "blas: acc" read as a whole line)
    metrics = device.fontMetrics()
    assert metrics.horizontalAdvance(device.toolTip()) > DEVICE_WIDTH >= device.width()
    for width in (DEVICE_WIDTH, 120):
        device.resize(width, device.height())
        text = device.text()
        assert metrics.horizontalAdvance(text) <= width and text.endswith("…") and device.toolTip().startswith(text[:-1])
    device.setContentsMargins(8, 0, 8, 0)  # a style's margins (the bar's on Linux): the "…" stays inside them
    device.resize(160, device.height())
    assert metrics.horizontalAdvance(device.text()) <= device.contentsRect().width() and device.text().endswith("…")
    device.set_line("device: cpu")  # a line that fits is asked room for, margins included, and shown whole
    device.resize(device.sizeHint())
    assert device.text() == "device: cpu"
    assert w.statusBar().toolTip() == w.statusBar().currentMessage() == f"replaying {path}"  # not the run's line
    run_and_wait(qtbot, w)
    assert w.status_labels["device"].toolTip() == here
    stats = w.rounds_run.stats
    plain = f" (+{stats.plain_steps} plain)" if stats.plain_steps else ""
    assert w.status_labels["rounds"].text() == f"rounds: {stats.rounds}{plain}"


def test_gui_screenshot_never_lands_on_the_trace_it_shows(qwen3_tied_dirs, tmp_path, capsys):
    from app.cli import main as cli

    path = parity_trace(qwen3_tied_dirs, tmp_path / "check.jsonl")
    before = path.read_bytes()
    assert cli(["gui", str(path), "--screenshot", str(path)]) == 2
    assert "input" in capsys.readouterr().err and path.read_bytes() == before


def test_a_trace_opened_from_the_desktop_opens_in_the_window(make_window, qwen3_tied_dirs, tmp_path, capsys):
    """macOS hands a file opened with the app (Finder's Open With, a drop on the Dock icon) to the running
    program as a QFileOpenEvent: a trace is opened, a model folder goes to its picker."""
    from PySide6.QtGui import QFileOpenEvent
    from PySide6.QtWidgets import QApplication

    from app.file_open import FileOpenFilter

    path = parity_trace(qwen3_tied_dirs, tmp_path / "check.jsonl")
    capsys.readouterr()
    w = make_window()
    app = QApplication.instance()
    opener = FileOpenFilter(w)
    app.installEventFilter(opener)
    try:
        QApplication.sendEvent(app, QFileOpenEvent(str(path)))
        assert w.controller.replaying == path and "dflash" in w.controller.runs
        QApplication.sendEvent(app, QFileOpenEvent(str(qwen3_tied_dirs[1])))
        assert w.models.drafter_value() == str(qwen3_tied_dirs[1])
        QApplication.sendEvent(app, QFileOpenEvent(str(tmp_path)))
        assert "no readable config.json" in w.errors[-1]
    finally:
        app.removeEventFilter(opener)


def test_a_parity_trace_of_runs_that_ended_at_once_opens_without_a_speed(qtbot, make_window, oracle_first_eos_dirs,
                                                                        tmp_path):
    """A check whose target wrote EOS first, saved by the CLI and opened: no speedup of two one-token runs."""
    from app.cli import main as cli

    trace = tmp_path / "eos.jsonl"
    assert cli(["parity", "--target", str(oracle_first_eos_dirs[0]), "--drafter", str(oracle_first_eos_dirs[1]),
                "--prompt", "hello world", "--raw", "--max-tokens", "8", "--trace", str(trace)]) == 0
    w = make_window()
    assert w.open_trace(trace)
    text = w.parity_view.headline.text()
    assert text.startswith("The target wrote EOS as its first token in both runs") and "tok/" not in text


def test_a_parity_trace_of_one_token_runs_opens_without_a_speed(qtbot, make_window, qwen3_tied_dirs, tmp_path):
    """`parity --max-tokens 1` records no speedup (null): the window formatted it and crashed on opening."""
    trace = parity_trace(qwen3_tied_dirs, tmp_path / "one.jsonl", "--max-tokens", "1")
    w = make_window()
    assert w.open_trace(trace) and w.errors == []
    text = w.parity_view.headline.text()
    assert "no speed: only the prefill's token was written" in text.lower() and "×" not in text


def test_a_trace_of_a_pair_not_on_this_machine_says_run_would_use_another(qtbot, make_window, alternating_dirs,
                                                                        qwen3_tied_dirs, tmp_path):
    """The trace's folders deleted (or another machine's): its rounds still replay, but the pickers keep
    what they hold, and a silent swap would let Run check the prompt on a pair the user did not mean."""
    w = finished_run(qtbot, make_window, alternating_dirs, block_size=4)
    path = tmp_path / "run.jsonl"
    assert w.export_trace(path)
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["target"], header["drafter"] = str(tmp_path / "gone-target"), str(tmp_path / "gone-drafter")
    moved = tmp_path / "moved.jsonl"
    moved.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))

    w2 = make_window()
    choose(w2, qwen3_tied_dirs)
    assert w2.open_trace(moved) and w2.errors == []
    assert w2.rounds_run is not None and len(w2.rounds_run.rounds) == len(w.rounds_run.rounds)
    assert (w2.models.target_value(), w2.models.drafter_value()) == tuple(map(str, qwen3_tied_dirs))
    notice = w2.notices[-1]
    assert f"target {tmp_path / 'gone-target'} and drafter {tmp_path / 'gone-drafter'} are not on this machine" \
        in notice and "Run would use the pair chosen in the Models panel" in notice
    assert w2.notice_box.isVisible()

    # Only the drafter gone: the trace's target is chosen, the drafter picker left alone, and said so.
    header["target"] = str(alternating_dirs[0])
    moved.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    assert w2.open_trace(moved)
    assert w2.models.target_value() == str(alternating_dirs[0])
    assert w2.models.drafter_value() == str(qwen3_tied_dirs[1])
    assert "this trace's drafter" in w2.notices[-1] and "is not on this machine" in w2.notices[-1]
    # Both here: chosen, nothing said beyond the replay.
    assert w2.open_trace(path) and len(w2.notices) == 2
    assert (w2.models.target_value(), w2.models.drafter_value()) == tuple(map(str, alternating_dirs))
