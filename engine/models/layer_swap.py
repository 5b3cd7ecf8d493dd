"""Swap a layer instance's class for a subclass with another `__call__`, and back.

Taps (engine/models/taps.py) and tape-recording GatedDeltaNet layers
(engine/models/gdn_tape.py) both change what one mlx-lm layer does without editing
mlx-lm's files: the layer keeps its weights and names, only its class changes.
"""

from __future__ import annotations

from typing import Callable

# (base class, kind) -> the subclass made for it, so each is made once: process-wide because classes
# are (is_swapped() and original_class() recognise a swapped layer by its class); one per model class.
_SUBCLASSES: dict[tuple[type, str], type] = {}


def swapped_class(base: type, kind: str, make_call: Callable[[type], Callable]) -> type:
    """The subclass of `base` named `<kind><Base>` whose __call__ is make_call(base)."""
    key = (base, kind)
    if key not in _SUBCLASSES:
        _SUBCLASSES[key] = type(f"{kind}{base.__name__}", (base,), {"__call__": make_call(base)})
    return _SUBCLASSES[key]


def is_swapped(obj: object, kind: str) -> bool:
    cls = type(obj)
    return _SUBCLASSES.get((cls.__mro__[1], kind)) is cls if len(cls.__mro__) > 1 else False


def original_class(obj: object) -> type:
    """The class the layer had before any swap."""
    cls = type(obj)
    while any(sub is cls for sub in _SUBCLASSES.values()):
        cls = cls.__mro__[1]
    return cls


def swap(obj: object, kind: str, make_call: Callable[[type], Callable]) -> None:
    """Give `obj` the `kind` subclass of its original class (idempotent)."""
    obj.__class__ = swapped_class(original_class(obj), kind, make_call)


def unswap(obj: object, kind: str) -> None:
    if is_swapped(obj, kind):
        obj.__class__ = original_class(obj)
