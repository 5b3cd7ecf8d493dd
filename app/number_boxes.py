"""Spin boxes that clamp a typed value out of range and say so, where Qt's own silently put back the
last value ("0" in Max tokens came back as 128) or dropped the keystroke that left the range (block size
"999" became 9)."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Signal
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox


class _Clamps:
    """The shared part: a number typed out of range is Intermediate while typed, then clamped on Enter
    or leaving the box, with `clamped` carrying the notice. `name` is how the notice calls the box;
    `why_max` (set_bound) says where a maximum below the box's own comes from."""

    clamped: Signal
    why_max: Optional[str] = None

    def __init__(self, name: str, **kwargs):
        super().__init__(**kwargs)
        self.name = name

    def _typed(self, text: str) -> Optional[float]:
        raise NotImplementedError

    def validate(self, text: str, pos: int):
        result = super().validate(text, pos)
        state = result[0] if isinstance(result, tuple) else result
        if state == QValidator.State.Invalid and self._typed(text) is not None:
            return QValidator.State.Intermediate, text, pos  # typed on: clamped when the box is left
        return result

    def fixup(self, text: str) -> str:
        typed = self._typed(text)
        if typed is None or self.minimum() <= typed <= self.maximum():
            return super().fixup(text)
        value = min(max(typed, self.minimum()), self.maximum())
        if typed > self.maximum():
            limit = f"more than {self.why_max}" if self.why_max else f"above {self._said(self.maximum())}"
        else:
            limit = f"below {self._said(self.minimum())}"
        self.clamped.emit(f"{self.name} {self._said(typed)} is {limit}: set to {self._said(value)}.")
        return self.textFromValue(value)

    def _said(self, value: float) -> str:
        """A number as the notice writes it: integers with thousands separators, decimals as the box shows them."""
        return f"{value:,}" if isinstance(value, int) else self.textFromValue(value)

    def _body(self, text: str) -> str:
        """The text without the prefix, suffix and group separators."""
        body = text.strip()
        if self.prefix() and body.startswith(self.prefix()):
            body = body[len(self.prefix()):]
        if self.suffix() and body.endswith(self.suffix()):
            body = body[: -len(self.suffix())]
        return body.strip().replace(self.locale().groupSeparator(), "")


class ClampedSpinBox(_Clamps, QSpinBox):
    clamped = Signal(str)

    def _typed(self, text: str) -> Optional[float]:
        body = self._body(text)
        return int(body) if body.lstrip("-").isdigit() else None

    def set_bound(self, maximum: int, why: Optional[str]) -> Optional[str]:
        """A maximum from the loaded pair (`why`: "this target's 2,048-token context allows"); the notice
        when it cut the value, else None."""
        before = self.value()
        self.why_max = why
        self.setMaximum(maximum)
        if self.value() == before:
            return None
        return f"{self.name} {before:,} is more than {why}: set to {self.value():,}."


class ClampedDoubleSpinBox(_Clamps, QDoubleSpinBox):
    clamped = Signal(str)

    def _typed(self, text: str) -> Optional[float]:
        value, ok = self.locale().toDouble(self._body(text))
        return value if ok else None
