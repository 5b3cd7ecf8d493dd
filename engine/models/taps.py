"""Layer taps: the hidden states of a few target layers, which the drafter conditions on.

Each tapped decoder layer's class is swapped for a subclass (engine/models/layer_swap.py)
that stores its output while a capture is open. No mlx-lm file is edited, weights keep
their names, and outside a capture the cost is one attribute check.

With a pipelined target (engine/models/sharding.py) each rank runs only some layers:
a tap is recorded on the rank that owns its layer, the others contribute zeros, and
one all_sum gives every rank (each holds a replica of the drafter) the same taps.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import mlx.core as mx
import mlx.nn as nn

from engine.models.layer_swap import swap, unswap
from engine.models.sharding import pipeline_span
from engine.models.target import decoder_layers

KIND = "Tapped"


class TapRecorder:
    """Holds the outputs of the tapped layers from the last forward pass."""

    def __init__(self, layer_ids: list[int], group: Any = None):
        self.layer_ids = list(layer_ids)
        self.group = group  # the pipeline group, when this rank holds only some of the layers
        self.recording = False
        self.outputs: dict[int, mx.array] = {}
        self.shape_probe: Optional[mx.array] = None  # any local layer's output (pipeline only)

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
        if self.group is None:
            return mx.concatenate([self.outputs[i] for i in self.layer_ids], axis=-1)
        # Run this rank's layers (and their sends/receives) first, so every rank reaches the
        # all_sum after its share of the pipeline, whichever taps it owns.
        mx.eval(list(self.outputs.values()) + [self.shape_probe])
        like = self.shape_probe
        local = [self.outputs[i] if i in self.outputs else mx.zeros_like(like) for i in self.layer_ids]
        return mx.distributed.all_sum(mx.concatenate(local, axis=-1), group=self.group)


def _tapped_call(cls: type):
    def __call__(self, *args, **kwargs):
        out = cls.__call__(self, *args, **kwargs)
        recorder, index = self.__dict__["_dflash_tap"]
        if recorder.recording:
            hidden = out[0] if isinstance(out, tuple) else out
            if index is not None:
                recorder.outputs[index] = hidden
            recorder.shape_probe = hidden
        return out

    return __call__


def install_taps(model: nn.Module, layer_ids: list[int], group: Any = None) -> TapRecorder:
    """Tap `layer_ids` (global layer numbers). `group`: the pipeline group of a pipelined target."""
    span = pipeline_span(model)
    if span is None:
        recorder = TapRecorder(layer_ids)
        local = {i: decoder_layers(model)[i] for i in layer_ids}
    else:
        first, end = span
        recorder = TapRecorder(layer_ids, group)
        # A pipelined model's `layers` lists only this rank's layers, first at index 0.
        local = {i: decoder_layers(model)[i - first] for i in layer_ids if first <= i < end}
        if first not in local:
            local[None] = decoder_layers(model)[0]  # records only the shape, for the zeros
    for i, layer in local.items():
        # object.__setattr__: nn.Module would otherwise store the tuple as a child.
        object.__setattr__(layer, "_dflash_tap", (recorder, i))
        swap(layer, KIND, _tapped_call)
    return recorder


def remove_taps(model: nn.Module) -> None:
    for layer in decoder_layers(model):
        unswap(layer, KIND)
        layer.__dict__.pop("_dflash_tap", None)
