"""Layer taps: the hidden states of a few target layers, which the drafter conditions on.

Each tapped decoder layer's class is swapped for a subclass (engine/models/layer_swap.py)
that stores its output while a capture is open. No mlx-lm file is edited, weights keep
their names, and outside a capture the cost is one attribute check.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import mlx.core as mx
import mlx.nn as nn

from engine.models.layer_swap import swap, unswap
from engine.models.target import decoder_layers

KIND = "Tapped"


class TapRecorder:
    """Holds the outputs of the tapped layers from the last forward pass."""

    def __init__(self, layer_ids: list[int]):
        self.layer_ids = list(layer_ids)
        self.recording = False
        self.outputs: dict[int, mx.array] = {}

    @contextmanager
    def capture(self, on: bool = True) -> Iterator["TapRecorder"]:
        """Record the tapped layers' outputs during the forward passes inside the block."""
        self.recording = on
        try:
            yield self
        finally:
            self.recording = False

    def concatenated(self) -> mx.array:
        """(B, L, n_taps * H): taps in the order the drafter's fc expects."""
        return mx.concatenate([self.outputs[i] for i in self.layer_ids], axis=-1)


def _tapped_call(cls: type):
    def __call__(self, *args, **kwargs):
        out = cls.__call__(self, *args, **kwargs)
        recorder, index = self.__dict__["_dflash_tap"]
        if recorder.recording:
            recorder.outputs[index] = out[0] if isinstance(out, tuple) else out
        return out

    return __call__


def install_taps(model: nn.Module, layer_ids: list[int]) -> TapRecorder:
    layers = decoder_layers(model)
    recorder = TapRecorder(layer_ids)
    for i in layer_ids:
        layer = layers[i]
        # object.__setattr__: nn.Module would otherwise store the tuple as a child.
        object.__setattr__(layer, "_dflash_tap", (recorder, i))
        swap(layer, KIND, _tapped_call)
    return recorder


def remove_taps(model: nn.Module) -> None:
    for layer in decoder_layers(model):
        unswap(layer, KIND)
        layer.__dict__.pop("_dflash_tap", None)
