"""The window's parts on their own: token alignment, refresh budget, the rounds view at scale, the gui command."""

import time
from dataclasses import dataclass

import pytest
from PySide6.QtGui import QImage

from app.cli import main as cli
from engine.decode.events import RoundEvent, StartEvent
from app.rounds_view import ChipDelegate, RoundsView
from app.run_record import RunRecord
from app.throttle import Throttle
from app.tokens import SpanAligner, chip_text

from helpers import PROMPTS
from window_helpers import RUN_TIMEOUT_MS, choose


@dataclass
class Tok:
    index: int
    id: int
    start: int = -1
    end: int = -1


def feed_all(table, batches):
    """Feed (text, ids) batches as TextEvents would; returns tokens and spans."""
    aligner, text, tokens, spans = SpanAligner(table), "", [], []
    for piece, ids in batches:
        new = [Tok(len(tokens) + k, i) for k, i in enumerate(ids)]
        tokens += new
        text += piece
        spans += aligner.feed(piece, new)
    spans += aligner.feed("", [], final=True)
    assert "".join(s.text for s in spans) == text  # the spans cover the text exactly, in order
    assert all(text[s.start:s.end] == s.text for s in spans)
    return tokens, spans


def test_aligner_gives_each_token_its_own_text():
    table = ["a", "bc", " d", "\n"]
    tokens, spans = feed_all(table, [("a", [0]), ("bc d", [1, 2]), ("\n", [3])])
    assert [(t.start, t.end) for t in tokens] == [(0, 1), (1, 3), (3, 5), (5, 6)]
    assert [s.tokens for s in spans] == [(0,), (1,), (2,), (3,)]


def test_aligner_waits_for_a_held_back_token():
    """BPE detokenizers hold a lone space until the next token: the space token waits for its text."""
    table = ["x", " ", "y"]
    tokens, spans = feed_all(table, [("x", [0, 1]), (" y", [2])])
    assert [(t.start, t.end) for t in tokens] == [(0, 1), (1, 2), (2, 3)]


def test_aligner_handles_trimmed_and_added_spaces():
    # The first token's leading space trimmed at the very start (BPE), then SentencePiece-style
    # pieces decoded without the space the stream has.
    tokens, _ = feed_all([" Hello", "world"], [("Hello", [0]), (" world", [1])])
    assert [(t.start, t.end) for t in tokens] == [(0, 5), (5, 11)]


def test_aligner_shares_a_batch_it_cannot_split():
    """Two halves of one UTF-8 character decode to U+FFFD alone; the batch shares the text."""
    table = ["\ufffd", "\ufffd", "!"]
    tokens, spans = feed_all(table, [("é", [0, 1]), ("!", [2])])
    assert [s.tokens for s in spans] == [(0, 1), (2,)]
    assert (tokens[0].start, tokens[0].end) == (tokens[1].start, tokens[1].end) == (0, 1)


def test_aligner_without_a_table_spans_whole_batches_and_flushes_eos():
    tokens, spans = feed_all(None, [("ab", [5, 6]), ("c", [7]), ("", [8])])
    assert [s.tokens for s in spans] == [(0, 1), (2,)]
    assert (tokens[3].start, tokens[3].end) == (3, 3)  # EOS: nothing to show


def test_chip_text_makes_whitespace_visible():
    table = [" x", "\n", "", "abcdefghijklmnop"]
    assert chip_text(table, 0) == "·x" and chip_text(table, 1) == "↵" and chip_text(table, 2) == "∅"
    assert chip_text(table, 3, limit=6) == "abcde…" and chip_text(table, 99) == "#99" and chip_text(None, 3) == "#3"


def test_throttle_paces_refreshes_by_the_cpu_they_cost():
    wall, cpu = [0.0], [0.0]
    t = Throttle(min_interval=0.1, budget=0.02, wall=lambda: wall[0], cpu=lambda: cpu[0])
    assert t.due()
    t.started()  # first refresh: nothing measured yet, the minimum gap applies
    wall[0] = 0.05
    assert not t.due()
    wall[0], cpu[0] = 0.1, 0.001  # 1 ms of GUI CPU since: cheap, so the minimum gap again
    assert t.due()
    t.started()
    assert t.last_gap == pytest.approx(0.1)
    wall[0], cpu[0] = 0.2, 0.009  # 8 ms (a refresh and its repaints): wait 8 / 0.02 = 400 ms
    t.started()
    assert t.last_gap == pytest.approx(0.4)
    wall[0] = 0.59
    assert not t.due()
    wall[0] = 0.61
    assert t.due()


def test_throttle_never_waits_longer_than_its_cap():
    """A costly refresh slows the next one, but a view is never older than max_interval."""
    wall, cpu = [0.0], [0.0]
    t = Throttle(min_interval=0.1, budget=0.015, max_interval=1.0, wall=lambda: wall[0], cpu=lambda: cpu[0])
    t.started()
    wall[0], cpu[0] = 0.1, 0.2  # 200 ms of GUI CPU: 13 s at this budget, uncapped
    t.started()
    assert t.last_gap == pytest.approx(1.0)
    wall[0] = 1.11
    assert t.due()
    wall[0], cpu[0] = 1.2, 0.2 + 0.6  # a refresh of 600 ms: capped at 1 s it would take 60% of a core
    t.started()
    assert t.last_gap == pytest.approx(2.4)  # 4 x its cost: a fifth of a core at most


def test_throttle_reset_forgets_the_cpu_spent_between_jobs():
    """The GUI CPU used between two runs (a user clicking through tabs) does not delay the next
    run's first refresh, nor the one after it."""
    wall, cpu = [0.0], [0.0]
    t = Throttle(min_interval=0.1, budget=0.015, max_interval=1.0, wall=lambda: wall[0], cpu=lambda: cpu[0])
    t.started()  # the last refresh of a run
    wall[0], cpu[0] = 30.0, 0.39  # browsing between runs
    t.reset()  # a job starts
    assert t.due()
    t.started()
    assert t.last_gap == pytest.approx(0.1)


def test_a_job_refreshes_at_once_after_a_busy_gui(qtbot, make_window, qwen3_tied_dirs):
    """Starting a run forgets the pacing the previous refreshes earned: its first refresh is due now."""
    w = make_window()
    throttle = w.controller._throttle
    throttle.next_at = time.perf_counter() + 3600.0  # as after a refresh that cost a lot of GUI CPU
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=8)
    with qtbot.waitSignal(w.run_finished, timeout=RUN_TIMEOUT_MS):
        w.start_run()
        assert throttle.due()
    assert w.errors == []


class CountingDelegate(ChipDelegate):
    painted = 0

    def paint(self, painter, option, index):
        CountingDelegate.painted += 1
        super().paint(painter, option, index)


def synthetic_run(n_rounds: int, block: int = 16) -> RunRecord:
    run = RunRecord(StartEvent("dflash", {}, {}, [1, 2, 3]), None, [f"t{i}" for i in range(512)])
    for i in range(n_rounds):
        acc = i % block
        drafted = [(i + k) % 500 for k in range(block - 1)]
        run.add(RoundEvent(i, 3 + i, 7, drafted, min(acc, block - 1), 9, "correction", drafted[:acc] + [9],
                           1.0, 2.0, 0.1, i * 0.01, i))
    return run


def test_rounds_view_scales_to_thousands_of_rounds(qtbot):
    """5000 rounds arrive in one batch insert and only visible rows get painted."""
    view = RoundsView()
    qtbot.addWidget(view)
    delegate = CountingDelegate(view)
    view.setItemDelegateForColumn(2, delegate)
    view.resize(900, 400)
    view.show()
    run = synthetic_run(0)
    view.set_run(run)
    inserts = []
    view.rounds_model.rowsInserted.connect(lambda *a: inserts.append(a))
    big = synthetic_run(5000)
    run.rounds = big.rounds
    view.refresh()
    assert view.rounds_model.rowCount() == 5000 and len(inserts) == 1
    CountingDelegate.painted = 0
    view.grab()
    visible = view.viewport().height() // view.verticalHeader().defaultSectionSize() + 2
    assert 0 < CountingDelegate.painted <= visible
    view.scrollToBottom()
    CountingDelegate.painted = 0
    view.grab()
    assert 0 < CountingDelegate.painted <= visible


def test_gui_screenshot_runs_the_demo_in_both_mode(qwen3_tied_dirs, tmp_path, capsys):
    out = tmp_path / "shots" / "window.png"
    argv = ["gui", "--screenshot", str(out), "--run-demo", "--target", str(qwen3_tied_dirs[0]),
            "--drafter", str(qwen3_tied_dirs[1]), "--max-tokens", "16"]
    assert cli(argv) == 0
    image = QImage(str(out))
    assert not image.isNull() and image.width() >= 1000 and image.height() >= 600
    assert str(out) in capsys.readouterr().out


def test_gui_run_demo_without_a_pair_says_so(capsys):
    assert cli(["gui", "--screenshot", "x.png", "--run-demo"]) == 2
    err = capsys.readouterr().err
    assert "demo pair" in err and "--target" in err and err.count("\n") == 1


def test_gui_screenshot_of_the_empty_window(tmp_path):
    out = tmp_path / "empty.png"
    assert cli(["gui", "--screenshot", str(out)]) == 0
    assert not QImage(str(out)).isNull()


def test_a_long_block_elides_its_middle_and_keeps_the_bonus():
    from app.rounds_view import fit_chips

    gap = 3
    marker = lambda k: 20 + 6 * len(str(k))  # noqa: E731

    def width(items, widths):
        return sum(widths[i] if i >= 0 else marker(-i) for i in items) + gap * (len(items) - 1)

    widths = [34] + [28, 52, 40, 61, 33, 45, 38, 70, 29, 44, 36, 58, 41, 39, 47] + [36]
    assert fit_chips(widths, 10_000, gap, marker) == list(range(len(widths)))
    for avail in (700, 500, 300, 150, 90, 60):
        shown = fit_chips(widths, avail, gap, marker)
        assert shown[-1] == len(widths) - 1, avail  # the bonus / correction chip is always painted
        assert width(shown, widths) <= avail or shown == [len(widths) - 1], avail
        hidden = sum(-i for i in shown if i < 0)
        if shown != [len(widths) - 1]:  # narrower than anchor + marker + bonus: the bonus alone
            assert hidden + sum(1 for i in shown if i >= 0) == len(widths), avail  # every chip counted once
        kept = [i for i in shown if i >= 0]
        assert kept == sorted(kept), avail


def test_gui_screenshot_never_lands_on_a_model_file(qwen3_tied_dirs, tmp_path, capsys):
    import shutil

    t = tmp_path / "target"
    shutil.copytree(qwen3_tied_dirs[0], t)
    weights = (t / "model.safetensors").read_bytes()
    assert cli(["gui", "--screenshot", str(t / "model.safetensors")]) == 2
    assert "is one of the files of the model in" in capsys.readouterr().err
    assert (t / "model.safetensors").read_bytes() == weights


def test_the_verdict_warns_of_a_drafter_trained_for_another_target(qtbot, make_window):
    from pathlib import Path

    models = Path(__file__).resolve().parents[2] / "resources" / "models"
    w = make_window()
    w.models.target.set_value(str(models / "demo-target"))
    w.models.drafter.set_value(str(models / "demo-hybrid-drafter"))
    w.models.check_now()
    text = w.models.verdict.text()
    assert text.startswith("⚠ ready, with a warning") and "⚠ demo-hybrid-drafter was trained for other target weights than these (demo-hybrid-target" in text
    assert w.models.verdict.objectName() == "verdictWarn"  # amber, not the green of a good pair
    from app.catalog import drafter_verdict  # the drafter list's dot and tooltip: green for both, once

    fits, why = drafter_verdict(str(models / "demo-target"), str(models / "demo-hybrid-drafter"))
    assert fits is None and why.startswith("loads, but demo-hybrid-drafter was trained for other target weights")
    assert drafter_verdict(str(models / "demo-target"), str(models / "demo-dflash2-drafter")) == (True, "matches this target")
    w.models.drafter.set_value(str(models / "demo-dflash2-drafter"))
    w.models.check_now()
    assert "⚠" not in w.models.verdict.text() and w.models.verdict.objectName() == "verdictOk"


def test_gui_opens_a_trace_given_on_the_command_line(qwen3_tied_dirs, tmp_path, capsys):
    """`dflash-playground gui TRACE.jsonl` opens it (a parity check here); one that is not a trace is named,
    and a trace with --run-demo is refused."""
    trace = tmp_path / "check.jsonl"
    assert cli(["parity", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1]),
                "--prompt", "def f(x):", "--raw", "--max-tokens", "8", "--trace", str(trace)]) == 0
    capsys.readouterr()
    assert cli(["gui", str(trace), "--screenshot", str(tmp_path / "check.png")]) == 0
    assert not QImage(str(tmp_path / "check.png")).isNull()
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"prompt": "hello"}\n')
    assert cli(["gui", str(bad), "--screenshot", str(tmp_path / "bad.png")]) == 2
    assert "notes.jsonl: no 'dflash-trace/1'" in capsys.readouterr().err and not (tmp_path / "bad.png").exists()
    assert cli(["gui", str(trace), "--screenshot", str(tmp_path / "x.png"), "--run-demo", "--target",
                str(qwen3_tied_dirs[0])]) == 2
    assert "not both" in capsys.readouterr().err


def test_the_style_finds_its_indicator_icons(qapp):
    """Check boxes and radio buttons draw their checked state from SVGs the style names by path
    (Fusion's own were dark on the dark palette: which mode was chosen could hardly be seen)."""
    import re
    from pathlib import Path

    from app.theme import apply_theme

    apply_theme(qapp)
    style = qapp.styleSheet()
    urls = re.findall(r"url\(([^)]+)\)", style)
    assert "ICONS/" not in style and len(urls) >= 2
    assert all(Path(u).is_file() and Path(u).suffix == ".svg" for u in urls), urls


def test_the_save_dialog_offers_a_name_of_its_own_in_a_real_folder(tmp_path, monkeypatch):
    """Ctrl+S offered trace.jsonl in the working folder whatever was on show ('/' for a double-clicked
    app; a second export offered to overwrite the first)."""
    from datetime import datetime
    from pathlib import Path

    from app.menus import suggested_path

    monkeypatch.setenv("HOME", str(tmp_path))
    when = datetime(2026, 11, 27, 15, 4)
    assert suggested_path("trace", ".jsonl", "both", None, when) == str(tmp_path / "trace-both-20261127-150400.jsonl")
    assert suggested_path("trace.chrome", ".json", None, tmp_path / "gone", when) == str(
        tmp_path / "trace-chrome-run-20261127-150400.json")  # a folder no longer there: home
    (tmp_path / "exports").mkdir()
    assert Path(suggested_path("rounds", ".csv", "race", tmp_path / "exports", when)).parent == tmp_path / "exports"


def test_the_cost_curves_measurement_says_how_long_it_has_left():
    """A first Both run on a long prompt spent 19 of its 27 s measuring, the status line counting
    steps with no time (QA pass); the pace is taken after the first step, which compiles."""
    from app.run_messages import calibration_left_s

    assert calibration_left_s(1, 27, 5.0) is None  # the first step: compiling, no pace yet
    assert calibration_left_s(3, 27, 4.0) == pytest.approx(2.0 * 24)
    assert calibration_left_s(27, 27, 30.0) is None


def test_parity_differences_are_coloured_by_what_they_mean():
    """Red for a real divergence, amber for a near-tie flip (it was red too, beside the tab's ≈), muted
    for two samples at T > 0."""
    from types import SimpleNamespace

    from app import theme
    from app.parity_view import diff_colour

    def ar(temperature):
        return SimpleNamespace(start=SimpleNamespace(settings={"sampling": {"temperature": temperature}},
                                                     model={"dtype": "float32"}))

    def result(margin):
        return SimpleNamespace(identical=False, first_divergence=3, margin_at_divergence=margin, cancelled=False,
                               compared=10)

    assert diff_colour(result(1e-5), ar(0.0)) == theme.DIFF_NEAR_TIE  # below float32's 1e-3
    assert diff_colour(result(0.5), ar(0.0)) == theme.DIFF_MARK
    assert diff_colour(result(0.5), ar(1.0)) == theme.DIFF_SAMPLE
    assert len({theme.DIFF_NEAR_TIE, theme.DIFF_MARK, theme.DIFF_SAMPLE}) == 3
