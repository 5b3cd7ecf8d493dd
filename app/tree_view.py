"""The "Tree" tab: a round that verified a draft tree (--tree), drawn as the tree it was.

Depth runs left to right from the anchor; each node's children are stacked best rank first, so the
drafter's chain (its first choice at every depth) is the straight top line and its second choices
branch below. A node shows its token and the drafter's probability of it given its parent. The
accepted path is green with a thick edge, a second choice the target took has a cyan ring (and its
rank, #2 for the second), the bonus or correction hangs off the path's end, and the candidates the
target judged but refused are dark red; nodes under a refused one were never reached. The numbers
come from engine/decode/tree_stats.py; this module only lays them out and paints.
"""

from __future__ import annotations

import html
from typing import Any, Optional

from PySide6.QtCore import QEvent, QPoint, QRect, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import QLabel, QScrollArea, QToolTip, QVBoxLayout, QWidget

from engine.decode.settings import SamplingSettings
from engine.decode.tree_stats import COPY, chain_depth, is_tree_round, tree_nodes, tree_stats
from app import theme
from app.run_record import RunRecord
from app.tokens import chip_text

NO_RUN = ("Run DFlash with a draft tree (auto tree, or a tree size, in the settings; or open the trace of such "
          "a run) to see its trees: which branch the target took, and which second choices saved a round.")
PICK = ("Select a round marked \"tree N\" in the rounds table below (double-click one to open it here): its "
        "tree is drawn here.")
NOT_TREE = "Round {index} verified a chain, not a tree (auto chose the chain there, or the run drafted no tree)."
KEY = ("<span style='background:%s; color:#fff'>&nbsp;accepted&nbsp;</span>&nbsp; "
       "<span style='border:2px solid %s; color:%s'>&nbsp;a second choice taken (#k: its rank)&nbsp;</span>&nbsp; "
       "<span style='background:%s; color:#fff'>&nbsp;bonus&nbsp;</span>&nbsp; "
       "<span style='background:%s; color:#fff'>&nbsp;correction&nbsp;</span>&nbsp; "
       "<span style='background:%s; color:%s'>&nbsp;refused by the target&nbsp;</span>&nbsp; "
       "<span style='color:#8b93a1'>not reached</span> · the number: the drafter's probability given the parent"
       % (theme.CHIP_ACCEPTED, theme.CHIP_TREE, theme.CHIP_TREE, theme.CHIP_BONUS, theme.CHIP_CORRECTION,
          theme.CHIP_REJECTED, theme.CHIP_REJECTED_TEXT))
# At T > 0 a tree's shape comes from the drafter's ranked probabilities and its rank-r token is the r-th
# draw (engine/decode/tree/walk.py): the number shown is the r-th probability, not the drawn token's
SAMPLED = (" At T > 0 a node's number is the drafter's probability of its rank at that depth (the tree's "
           "shape); its token is a draw, not necessarily that candidate.")
MARGIN, H_GAP, V_GAP, PAD = 8, 18, 6, 5


def node_label(node: dict[str, Any]) -> str:
    """A node's second line: the drafter's probability given its parent, and its rank where not the first."""
    if node["node"] == 0:
        return "anchor"
    if node["copy"]:
        return "copy"
    rank = f" #{node['rank'] + 1}" if node["rank"] > 0 else ""
    return f"{node['p']:.2f}{rank}"


def layout(nodes: list[dict[str, Any]], path_end: int) -> dict[int, tuple[int, int]]:
    """node -> (column, row): column its depth; leaves take rows in order, children best rank first (a
    copy's last), a parent the row of its first child. The bonus is key len(nodes): one more child of
    the path's end, after its own."""
    children: dict[int, list[int]] = {}
    for n in nodes[1:]:
        children.setdefault(n["parent"], []).append(n["node"])
    for kids in children.values():
        kids.sort(key=lambda k: (nodes[k]["rank"] < 0, nodes[k]["rank"], k))
    bonus = len(nodes)
    children.setdefault(path_end, []).append(bonus)
    depth = {n["node"]: n["depth"] for n in nodes}
    depth[bonus] = nodes[path_end]["depth"] + 1
    where: dict[int, tuple[int, int]] = {}
    rows = 0
    stack: list[tuple[int, bool]] = [(0, False)]
    while stack:  # depth first, iteratively (a copy can make a deep line)
        node, done = stack.pop()
        kids = children.get(node, [])
        if done:
            where[node] = (depth[node], where[kids[0]][1])
        elif not kids:
            where[node] = (depth[node], rows)
            rows += 1
        else:
            stack.append((node, True))
            stack.extend((k, False) for k in reversed(kids))
    return where


class TreeCanvas(QWidget):
    """Paints one tree round; `boxes` and `styles` (node -> its chip and style; the bonus is key
    len(nodes)) say what was drawn where."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.font, self.small = theme.chip_font(9.0), theme.chip_font(8.0)
        self.metrics, self.small_metrics = QFontMetrics(self.font), QFontMetrics(self.small)
        self.round: Optional[Any] = None
        self.nodes: list[dict[str, Any]] = []
        self.texts: dict[int, tuple[str, str]] = {}
        self.boxes: dict[int, QRect] = {}
        self.styles: dict[int, str] = {}
        self.setMouseTracking(True)

    def set_round(self, r: Optional[Any], table) -> None:
        self.round, self.nodes, self.texts, self.boxes, self.styles = r, [], {}, {}, {}
        if r is not None and is_tree_round(r):
            self._place(r, table)
        self.setMinimumSize(self.sizeHint())
        self.updateGeometry()
        self.update()

    def _place(self, r: Any, table) -> None:
        nodes = self.nodes = tree_nodes(r)
        path = r.tree_path
        judged = {n["node"] for n in nodes if n["node"] and n["parent"] in set(path)}
        bonus = len(nodes)
        for n in nodes:
            i = n["node"]
            self.texts[i] = (chip_text(table, n["token"], 10), node_label(n))
            self.styles[i] = ("anchor" if i == 0 else "second" if n["second_choice"] else "accepted" if n["accepted"]
                              else "refused" if i in judged else "unreached")
        self.texts[bonus] = (chip_text(table, r.bonus, 10), r.bonus_kind)
        self.styles[bonus] = r.bonus_kind
        width = max(max(self.metrics.horizontalAdvance(a), self.small_metrics.horizontalAdvance(b))
                    for a, b in self.texts.values()) + 2 * PAD
        height = self.metrics.height() + self.small_metrics.height() + 4
        for node, (col, row) in layout(nodes, path[-1]).items():
            self.boxes[node] = QRect(MARGIN + col * (width + H_GAP), MARGIN + row * (height + V_GAP), width, height)

    def sizeHint(self) -> QSize:  # noqa: N802
        if not self.boxes:
            return QSize(0, 0)
        return QSize(max(b.right() for b in self.boxes.values()) + MARGIN,
                     max(b.bottom() for b in self.boxes.values()) + MARGIN)

    def paintEvent(self, _event) -> None:  # noqa: N802
        if not self.boxes:
            return
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        on_path = set(self.round.tree_path)
        bonus = len(self.nodes)
        edges = [(n["parent"], n["node"]) for n in self.nodes[1:]] + [(self.round.tree_path[-1], bonus)]
        thin, thick = QPen(QColor("#4b5263"), 1), QPen(QColor(theme.CHIP_ACCEPTED), 3)
        for parent, child in sorted(edges, key=lambda e: e[1] in on_path):  # the path's edges on top
            a, b = self.boxes[parent], self.boxes[child]
            painter.setPen(thick if child in on_path else thin)
            start, end = QPoint(a.right(), a.center().y()), QPoint(b.left(), b.center().y())
            bend = a.right() + H_GAP // 2
            painter.drawPolyline([start, QPoint(bend, start.y()), QPoint(bend, end.y()), end])
        fills = {"accepted": theme.CHIP_ACCEPTED, "second": theme.CHIP_ACCEPTED, "bonus": theme.CHIP_BONUS,
                 "correction": theme.CHIP_CORRECTION, "refused": theme.CHIP_REJECTED}
        texts = {"anchor": "#c3c8d0", "refused": theme.CHIP_REJECTED_TEXT, "unreached": "#8b93a1"}
        for node, box in self.boxes.items():
            style = self.styles[node]
            ring = style == "second"
            painter.setPen(QPen(QColor(theme.CHIP_TREE if ring else fills.get(style, theme.CHIP_ANCHOR)),
                                3 if ring else 1))
            painter.setBrush(QColor(fills[style]) if style in fills else Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(box, 4, 4)
            if node < bonus and self.nodes[node]["copy"]:
                painter.fillRect(QRect(box.left(), box.top(), 3, box.height()), QColor(theme.CHIP_SOURCE["lookup"]))
            painter.setPen(QColor(texts.get(style, "#ffffff")))
            top, second = self.texts[node]
            painter.setFont(self.font)
            painter.drawText(box.left() + PAD, box.top() + 2 + self.metrics.ascent(), top)
            painter.setFont(self.small)
            painter.drawText(box.left() + PAD, box.bottom() - 2 - self.small_metrics.descent(), second)
        painter.end()

    def node_at(self, pos: QPoint) -> Optional[int]:
        return next((node for node, box in self.boxes.items() if box.contains(pos)), None)

    def tip(self, node: int) -> str:
        if node == len(self.nodes):
            return (f"the {self.round.bonus_kind}: the target's own token after the accepted path "
                    f"(id {self.round.bonus})")
        n = self.nodes[node]
        what = {"anchor": "the anchor (the last committed token)", "accepted": "accepted",
                "second": "accepted: a second choice the chain would not have drafted",
                "refused": "refused: the target chose another token here", "unreached": "not reached: an "
                "ancestor was refused"}[self.styles[node]]
        if node == 0:
            return f"{what}, id {n['token']}"
        source = ("a lookup copy's token" if n["copy"] else
                  f"the drafter's candidate #{n['rank'] + 1} at depth {n['depth']}")
        prob = "" if n["p"] is None else (f"; the drafter's probability {n['p']:.3f} given its parent, "
                                          f"{n['path_p']:.3f} for the whole prefix")
        return f"node {node}, id {n['token']}: {source}{prob}\n{what}"

    def event(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            node = self.node_at(event.pos())
            if node is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(event.globalPos(), self.tip(node), self)
            return True
        return super().event(event)


class TreeView(QWidget):
    """The tab: a line on the round, the key, and the tree (scrolling both ways when it is large)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("treeView")
        self.headline = QLabel(NO_RUN)
        self.headline.setWordWrap(True)
        self.key = QLabel(KEY)
        self.key.setObjectName("hint")
        self.key.setWordWrap(True)
        self.canvas = TreeCanvas()
        self.scroll = QScrollArea()
        self.scroll.setWidget(self.canvas)
        self.scroll.setWidgetResizable(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.headline)
        lay.addWidget(self.key)
        lay.addWidget(self.scroll, 1)
        self.round_index: Optional[int] = None
        self.clear()

    def clear(self, text: str = NO_RUN) -> None:
        self.round_index = None
        self.headline.setText(text)
        self.key.hide()
        self.canvas.set_round(None, None)

    def show_round(self, run: Optional[RunRecord], index: int) -> None:
        """Round `index` of the run: its tree, or a line saying why there is none."""
        r = run.rounds[index] if run is not None and 0 <= index < len(run.rounds) else None
        if r is None:
            self.clear(NO_RUN if run is None else PICK)
            return
        self.round_index = index
        if not is_tree_round(r):
            self.clear(NOT_TREE.format(index=r.index))
            self.round_index = index
            return
        self.canvas.set_round(r, run.table)
        self.key.show()
        sampling = SamplingSettings.from_dict(run.start.settings.get("sampling"))
        self.headline.setText(headline(r, run.table) + ("" if sampling.greedy else SAMPLED))


def headline(r: Any, table) -> str:
    """The round in a line: its tree, what the target took, and what the chain would have."""
    chain, exact = chain_depth(r)
    taken = sum(r.tree_ranks[i] > 0 for i in r.tree_path[1:])
    gain = r.accepted - chain
    verdict = (f"the tree accepted {gain} more" if gain > 0 else "no more than the chain" if exact else
               "the chain might have gone further: the tree ended on its first-choice line")
    copied = sum(r.tree_ranks[i] == COPY for i in r.tree_path[1:])
    copy = (f" {copied} of the accepted came down a copy of the context grafted into the tree (with lookup a "
            "chain's round might have verified that copy)." if copied else "")
    return (f"<b>Round {r.index}</b> at position {r.position}: a draft tree of {len(r.tree_parents) - 1} draft "
            f"nodes; the target accepted {r.accepted} along the path ({taken} second choice{'s' * (taken != 1)}), "
            f"then the {r.bonus_kind} <code>{html.escape(chip_text(table, r.bonus))}</code>. The chain (the "
            f"drafter's first choices, the top line) would have accepted {'' if exact else 'at least '}{chain}: "
            f"{verdict}.{copy}")


def telling_round(rounds: list[Any]) -> Optional[int]:
    """The row of the tree round that shows best what a tree is for (a screenshot's pick): the drafter's
    own second choices before a copy's, then where it beat the chain by most, then the larger tree;
    None without tree rounds."""
    stats = tree_stats(rounds)
    if stats is None:
        return None
    rows = {r.index: row for row, r in enumerate(rounds)}

    def telling(t: tuple) -> tuple:
        r = rounds[rows[t[0]]]
        return (COPY not in [r.tree_ranks[i] for i in r.tree_path], t[1] - t[2], t[3], len(r.tree_parents))

    return rows[max(stats["rounds"], key=telling)[0]]
