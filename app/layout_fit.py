"""Three columns where the window is wide enough, two where it is not.

Wide: settings | output and rounds | plots. The plots' 2x2 grid cannot shrink below its titles
and axes (~550 px: narrower, pyqtgraph lets it run past the window's edge, cut off), the
settings column below its prompt grid (~450 px: narrower, the spin boxes' text is clipped), and
the rounds table wants ~560 px. A window narrower than the three together (a 13-inch MacBook,
a 1280x800 screen) gets two columns, and the plots become a tab beside Output, at the tab
area's full width. The split is decided again on every resize; each arrangement keeps its own
saved splitter sizes.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtWidgets import QSplitter, QTabWidget, QWidget

CENTER_MIN = 560  # px the output and rounds column wants beside the others
PLOTS_SHARE = 0.34  # of a wide window's width, once the plots have their minimum
# The tabs' share of the centre column's height: the plots' tab needs more than the output.
TABS_SHARE = {False: 0.47, True: 0.6}


def plots_min_width(plots: QWidget) -> int:
    """The width under which the plots' grid runs past its view (titles and axes; font-dependent)."""
    ci = getattr(plots, "ci", None)
    if ci is None:
        return plots.minimumSizeHint().width()
    return int(ci.effectiveSizeHint(Qt.SizeHint.MinimumSize).width()) + 8


class ColumnLayout:
    """Moves the plots between the main splitter's third column and a tab of `tabs`, and shares
    the centre column's height (`center`: tabs above, rounds below) to suit."""

    def __init__(self, split: QSplitter, left: QWidget, tabs: QTabWidget, plots: QWidget, center: QSplitter):
        self.split, self.left, self.tabs, self.plots, self.center = split, left, tabs, plots, center
        self.compact: bool | None = None  # not arranged yet: the plots start in the splitter

    def splits(self) -> dict[str, QSplitter]:
        """The splitters by the names their sizes are saved under, for the arrangement on show."""
        suffix = "_compact" if self.compact else ""
        return {"main" + suffix: self.split, "center" + suffix: self.center}

    def left_width(self) -> int:
        return max(self.left.minimumWidth(), self.left.minimumSizeHint().width())

    def wide_enough(self, width: int) -> bool:
        handles = 2 * self.split.handleWidth()
        return width >= self.left_width() + CENTER_MIN + plots_min_width(self.plots) + handles

    def fit(self, width: int, height: int) -> bool:
        """Arrange for a window of this size; True when the arrangement changed (sizes reset)."""
        compact = not self.wide_enough(width)
        if compact == self.compact:
            return False
        self.compact = compact
        left = self.left_width()
        if compact:
            self.tabs.addTab(self.plots, "Plots")  # takes it out of the splitter
            self.split.setSizes([left, max(0, width - left)])
        else:
            self.tabs.removeTab(self.tabs.indexOf(self.plots))
            self.split.addWidget(self.plots)
            self.plots.show()  # a tab page that was not the current one is hidden (a splitter skips it)
            self.split.setStretchFactor(2, 2)
            plots = max(plots_min_width(self.plots), int(width * PLOTS_SHARE))
            self.split.setSizes([left, max(0, width - left - plots), plots])
        center = max(0, height - 80)  # less the menu bar, the status bar and the legend line
        tabs = int(center * TABS_SHARE[compact])
        self.center.setSizes([tabs, center - tabs])
        return True


def restore_splitters(states: dict, splits: dict[str, QSplitter]) -> None:
    """Put back saved splitter states (base64 of saveState()) by name; anything else is skipped."""
    for name, split in splits.items():
        state = states.get(name)
        if isinstance(state, str) and state:
            split.restoreState(QByteArray.fromBase64(state.encode()))


def splitter_states(splits: dict[str, QSplitter]) -> dict[str, str]:
    return {name: bytes(split.saveState().toBase64().data()).decode() for name, split in splits.items()}
