"""Three columns where the window is wide enough, two where it is not.

Wide: settings | output and rounds | plots. The plots' 2x2 grid cannot shrink below its titles
and axes (~550 px: narrower, pyqtgraph lets it run past the window's edge, cut off), the
settings column below its prompt grid (~450 px: narrower, the spin boxes' text is clipped), and
the rounds table wants ~560 px. A window narrower than the three together (a 13-inch MacBook,
a 1280x800 screen) gets two columns, and the plots become a tab beside Output, at the tab
area's full width. The split is decided again on every resize; each arrangement keeps its own
saved splitter sizes.

Short screens (a 1280x800 laptop at 150% scaling has 533 logical pixels of height) get scroll
bars instead of a window taller than the screen: the settings column scrolls (the mode and Run stay
pinned below it), and the plots scroll rather than squash into flat strips with their axis labels
printed over each other.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QSize, Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QSizePolicy, QSplitter, QTabWidget, QVBoxLayout, QWidget

CENTER_MIN = 560  # px the output and rounds column wants beside the others
PLOTS_SHARE = 0.34  # of a wide window's width, once the plots have their minimum
# The tabs' share of the centre column's height: the plots' tab needs more than the output.
TABS_SHARE = {False: 0.47, True: 0.6}
PLOTS_SLACK = 8  # px the columns give the plots beyond their grid's least width
PLOTS_MIN_HEIGHT = 320  # two rows of plots with their titles, legends and axes, readable (a 1280x800 tab: 352)
SCROLL_MIN_HEIGHT = 120  # the settings column's least height (then it scrolls)


class VerticalScroll(QScrollArea):
    """`inner` at the scroll area's width, scrolling up and down only: as wide as `inner` needs, and
    as short as SCROLL_MIN_HEIGHT, so it never makes the window taller than the screen."""

    def __init__(self, inner: QWidget):
        super().__init__()
        self.setWidget(inner)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        inner = self.widget()
        width = max(inner.minimumWidth(), inner.minimumSizeHint().width())
        return QSize(width + self.verticalScrollBar().sizeHint().width(), SCROLL_MIN_HEIGHT)


def settings_column(models: QWidget, prompt: QWidget, pinned: QWidget) -> QWidget:
    """The models and prompt panels, scrolling where the screen is short, `pinned` (the mode and Run)
    always in view below them."""
    settings = QWidget()
    lay = QVBoxLayout(settings)
    lay.setContentsMargins(6, 6, 6, 6)
    lay.addWidget(models)
    lay.addWidget(prompt, 1)
    settings.setMinimumWidth(330)
    column = QWidget()
    outer = QVBoxLayout(column)
    outer.setContentsMargins(0, 0, 0, 0)
    outer.setSpacing(0)
    outer.addWidget(VerticalScroll(settings), 1)
    outer.addWidget(pinned)
    return column


def scrolled(page: QWidget) -> QWidget:
    """A frameless scroll area filling `page`; returns the widget to lay the page's content in. A tab
    smaller than that content's least size (a laptop at 125-150% scaling) then scrolls, instead of
    squashing it or asking the window for more height than the screen has."""
    inner = QWidget()
    area = QScrollArea()
    area.setWidget(inner)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    lay = QVBoxLayout(page)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.addWidget(area)
    return inner


def readable(plots: QWidget, height: int) -> None:
    """A pyqtgraph grid (or a text pane) keeps `height` px, readable in a `scrolled` page, and asks for no
    more: its own size hint (480 px for a grid) would make its page scroll before it shrinks."""
    plots.setMinimumHeight(height)
    policy = plots.sizePolicy()
    policy.setVerticalPolicy(QSizePolicy.Policy.Ignored)
    plots.setSizePolicy(policy)


class PlotsScroll(QScrollArea):
    """The plots at the page's size, but never below the size they can be read at (their titles and
    axes across, PLOTS_MIN_HEIGHT down): smaller, the page scrolls."""

    def __init__(self, plots: QWidget):
        super().__init__()
        self.setWidget(plots)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        plots.setMinimumHeight(PLOTS_MIN_HEIGHT)

    def fit_plots(self) -> None:
        """The plots' least width, again: it grows with their legends (a race's methods)."""
        self.widget().setMinimumWidth(plots_min_width(self.widget()) - PLOTS_SLACK)

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(0, 0)  # the splitter's third column is sized by ColumnLayout, the tab by the window

    def showEvent(self, event) -> None:  # noqa: N802
        self.fit_plots()
        super().showEvent(event)


def plots_min_width(plots: QWidget) -> int:
    """The width under which the plots' grid runs past its view (titles and axes; font-dependent)."""
    if isinstance(plots, QScrollArea):
        plots = plots.widget()
    ci = getattr(plots, "ci", None)
    if ci is None:
        return plots.minimumSizeHint().width()
    return int(ci.effectiveSizeHint(Qt.SizeHint.MinimumSize).width()) + PLOTS_SLACK


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
        if isinstance(self.plots, PlotsScroll):
            self.plots.fit_plots()
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
