"""The plots read at a laptop's size: tick labels apart, legends naming the runs on show, empty plots at
ranges of their own."""

import pytest
from PySide6.QtCore import QCoreApplication, QEvent

from app.plot_axes import GAP_PX, labelled_ticks

from helpers import PROMPTS
from window_helpers import choose, run_and_wait


def lay_out(plots, width, height):
    """The grid laid out and drawn at this size now, as the window's next layout pass and paint would."""
    plots.resize(width, height)
    QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)
    plots.grab()  # a paint: pyqtgraph fits its auto ranges then


def label_gaps(plot, name):
    """Pixels between neighbouring labelled ticks of an axis, as drawn."""
    axis = plot.getAxis(name)
    low, high = axis.range
    size = axis.height() if name == "left" else axis.width()
    ticks = labelled_ticks(plot, name)
    return [(b - a) * size / (high - low) for a, b in zip(ticks, ticks[1:])]


@pytest.mark.parametrize("height", [352, 640])  # the Plots tab at 1280x800; a taller window
def test_tick_labels_keep_apart_on_short_plots(qtbot, make_window, qwen3_tied_dirs, height):
    """At 1280x800 the acceptance axis stacked "10 8 6 4 2 0" into each other, and empty plots "1.0 0.8 0.6":
    every labelled tick is at least a label's room from the next."""
    from app.plots import PlotsPanel

    plots = PlotsPanel()
    qtbot.addWidget(plots)
    plots.show()
    lay_out(plots, 600, height)
    for plot in (plots.p_acc, plots.p_pos):  # empty
        for name in ("left", "bottom"):
            assert all(gap >= GAP_PX[name] - 0.5 for gap in label_gaps(plot, name))
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=40, block_size=8, mode="both")
    run_and_wait(qtbot, w)
    plots.update_runs(w.runs, w.rounds_run)
    lay_out(plots, 600, height)
    for plot in (plots.p_tps, plots.p_acc, plots.p_pos, plots.p_time):
        for name in ("left", "bottom"):
            gaps = label_gaps(plot, name)  # at least one label, and none nearer the next than GAP_PX
            assert labelled_ticks(plot, name) and all(gap >= GAP_PX[name] - 0.5 for gap in gaps), (name, gaps)


def test_an_ar_run_after_dflash_leaves_no_dflash_ranges_and_its_legend_names_only_ar(qtbot, make_window,
                                                                                     qwen3_tied_dirs):
    """Stopping (or just running) AR after a DFlash run: the empty round plots kept the DFlash run's axes,
    and the throughput legend named DFlash beside AR (and AR after a DFlash-only run)."""
    w = make_window()
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=40, block_size=8, mode="dflash")
    run_and_wait(qtbot, w)
    w.plots.grab()
    legend = lambda: [label.text for _s, label in w.plots.tps_legend.items]  # noqa: E731
    assert legend() == ["DFlash"]
    assert w.plots.p_acc.viewRange()[0][1] > 2  # rounds across
    choose(w, qwen3_tied_dirs, mode="ar")
    run_and_wait(qtbot, w)
    w.plots.grab()
    assert legend() == ["AR"]
    for plot in (w.plots.p_acc, w.plots.p_time):
        assert plot.viewRange() == [[0, 1], [0, 1]]
    assert w.plots.p_pos.viewRange()[0] == [0, 1]
    choose(w, qwen3_tied_dirs, mode="dflash")
    run_and_wait(qtbot, w)  # the next run's data is followed again
    w.plots.grab()
    assert w.plots.p_acc.viewRange()[0][1] > 2 and legend() == ["DFlash"]
