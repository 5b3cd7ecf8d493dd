"""Where the window goes on its screen: a first launch fills the screen's available area (less a
margin), up to the size the layout was designed at; a restored size that is larger than the
screen now (a laptop after an external monitor) is shrunk and moved back onto it.

The sizes here are client sizes, as `resize()` takes them; the window manager adds a title bar
above (28 px on macOS), which the first show cannot measure yet, so room is left for it.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QRect, QSize
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget

PREFERRED = QSize(1600, 1000)  # what the three-column layout was designed at
MARGIN = 16  # px left free on every side of a first window
TITLE_BAR = 32  # px kept above the client area for the window manager's title bar


def available_geometry(window: QWidget) -> QRect:
    """The window's screen less menu bar, dock and task bars (tests replace this function)."""
    screen = window.screen() or QGuiApplication.primaryScreen()
    return screen.availableGeometry()


def first_geometry(available: QRect, preferred: QSize = PREFERRED) -> QRect:
    """The client rectangle of a first launch: `preferred`, or the available area less the margin
    and the title bar where that is smaller; centred in the available area."""
    width = min(preferred.width(), available.width() - 2 * MARGIN)
    height = min(preferred.height(), available.height() - 2 * MARGIN - TITLE_BAR)
    x = available.x() + (available.width() - width) // 2
    y = available.y() + TITLE_BAR + (available.height() - TITLE_BAR - height) // 2
    return QRect(x, y, width, height)


def clamp_geometry(client: QRect, available: QRect) -> QRect:
    """`client` shrunk to the available area (title bar included) and moved inside it."""
    room = QRect(available.x(), available.y() + TITLE_BAR, available.width(), available.height() - TITLE_BAR)
    width, height = min(client.width(), room.width()), min(client.height(), room.height())
    x = min(max(client.x(), room.x()), room.right() + 1 - width)
    y = min(max(client.y(), room.y()), room.bottom() + 1 - height)
    return QRect(x, y, width, height)


def place(window: QWidget, saved_geometry: str) -> None:
    """Restore the saved geometry (base64 of saveGeometry()) clamped to the screen, or on a first
    launch (nothing saved) size the window to the screen."""
    if saved_geometry and window.restoreGeometry(QByteArray.fromBase64(saved_geometry.encode())):
        if window.isMaximized() or window.isFullScreen():
            return  # the window manager sizes those to the screen itself
        available = available_geometry(window)
        fitted = clamp_geometry(window.geometry(), available)
        if fitted != window.geometry():
            window.setGeometry(fitted)
        return
    window.setGeometry(first_geometry(available_geometry(window)))
