"""The Why tab's draft-tree section: where the tree paid, over the run's tree rounds.

Two plots from engine/decode/tree_stats.py: how many drafts each tree round accepted, beside what the
chain (the drafter's first choices, the tree's top line) would have accepted on the same round; and
acceptance by sibling rank, of the candidates the target judged (their parent reached). Hidden while
the run has no tree round.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from engine.decode.tree_stats import COPY, tree_stats
from app import theme
from app.layout_fit import readable
from app.plot_axes import thin_axes
from app.plots import TITLE, empty_bars
from app.run_record import RunRecord

TREE_PLOTS_HEIGHT = 190
BAR = 0.38  # each depth's two bars, side by side
HOW = ("The chain's count is read from the tree, not run: it keeps step with the accepted path while the path "
       "takes the drafter's first choices and stops where the path takes another (the target chose that token). "
       "Where the path ends on the first-choice line, the chain might have gone on past the tree: those rounds "
       "count as a lower bound. At T > 0 the count is the chain's in distribution, not for the same draw.")


def rank_name(rank: int) -> str:
    return "copy" if rank == COPY else f"#{rank + 1}"


class TreeWhy(QWidget):
    """`update_run(run)` from the run's rounds; `stats` holds what is shown (None: hidden)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.summary = QLabel()
        self.summary.setObjectName("hint")
        self.summary.setWordWrap(True)
        self.summary.setToolTip(HOW)
        self.plots = pg.GraphicsLayoutWidget()
        self.p_depth = self.plots.addPlot(row=0, col=0, axisItems=thin_axes())
        self.p_depth.setTitle("Tree rounds: accepted drafts, tree vs chain", **TITLE)
        self.p_depth.setLabel("bottom", "drafts accepted in the round")
        self.p_depth.setLabel("left", "rounds")
        self.p_depth.addLegend(offset=(-6, 2), labelTextSize="8pt")
        self.tree_bars = empty_bars(theme.PLOT_DFLASH, 220)
        self.chain_bars = empty_bars(theme.PLOT_AR, 170)
        self.p_depth.addItem(self.tree_bars)
        self.p_depth.addItem(self.chain_bars)
        self.p_depth.legend.addItem(self.tree_bars, "with the tree")
        self.p_depth.legend.addItem(self.chain_bars, "the chain (first choices)")
        self.p_rank = self.plots.addPlot(row=0, col=1, axisItems=thin_axes())
        self.p_rank.setTitle("Accepted by sibling rank", **TITLE)
        self.p_rank.setLabel("bottom", "the drafter's rank of the candidate (taken / judged above each)")
        self.p_rank.setLabel("left", "share taken")
        self.rank_bars = empty_bars(theme.CHIP_TREE, 200)
        self.p_rank.addItem(self.rank_bars)
        self.rank_labels: list[pg.TextItem] = []
        readable(self.plots, TREE_PLOTS_HEIGHT)
        # its least height set, not hinted: the Why page's layout kept the hint it read while this was hidden
        self.setMinimumHeight(TREE_PLOTS_HEIGHT + 3 * self.summary.fontMetrics().lineSpacing())
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.summary)
        lay.addWidget(self.plots, 1)  # the room the summary does not need
        self.stats: Optional[dict] = None
        self.update_run(None)

    def update_run(self, run: Optional[RunRecord]) -> None:
        stats = self.stats = tree_stats(run.rounds) if run is not None else None
        for label in self.rank_labels:
            self.p_rank.removeItem(label)
        self.rank_labels = []
        self.setVisible(stats is not None)
        if stats is None:
            self.tree_bars.setOpts(x=np.zeros(0), height=np.zeros(0))
            self.chain_bars.setOpts(x=np.zeros(0), height=np.zeros(0))
            self.rank_bars.setOpts(x=np.zeros(0), height=np.zeros(0))
            return
        rounds = stats["rounds"]
        top = max(max(t, c) for _, t, c, _ in rounds)
        depths = np.arange(top + 1)
        tree = np.bincount([t for _, t, _, _ in rounds], minlength=top + 1)
        chain = np.bincount([c for _, _, c, _ in rounds], minlength=top + 1)
        self.tree_bars.setOpts(x=depths + BAR / 2, height=tree, width=BAR)
        self.chain_bars.setOpts(x=depths - BAR / 2, height=chain, width=BAR)
        ranks = list(stats["by_rank"].items())
        x = np.arange(len(ranks), dtype=float)
        rates = np.array([a / j if j else 0.0 for _, (a, j) in ranks])
        self.rank_bars.setOpts(x=x, height=rates, width=0.7)
        self.p_rank.getAxis("bottom").setTicks([[(i, rank_name(r)) for i, (r, _) in enumerate(ranks)]])
        # room for the counts above a full bar
        self.p_rank.setRange(xRange=(-0.6, len(ranks) - 0.4), yRange=(0, 1.3), padding=0)
        for i, (_, (a, j)) in enumerate(ranks):
            label = pg.TextItem(f"{a}/{j}", color=theme.FOREGROUND, anchor=(0.5, 1))
            label.setPos(i, rates[i])
            self.p_rank.addItem(label)
            self.rank_labels.append(label)
        second = sum(a for r, (a, _) in ranks if r > 0)
        n = stats["tree_rounds"]
        self.summary.setText(
            f"Draft trees: {n} tree round{'s' * (n != 1)} accepted {stats['mean_tree']:.2f} drafts a round; the chain "
            f"(the drafter's first choices) would have accepted {stats['mean_chain']:.2f} on the same rounds"
            + (f" (at least, in {stats['bounded']} of them)" if stats["bounded"] else "")
            + f". The tree went deeper in {stats['deeper']}; {second} accepted node{'s' * (second != 1)} "
            "were second choices. (Hover for how the chain's count is read from the tree.)")
