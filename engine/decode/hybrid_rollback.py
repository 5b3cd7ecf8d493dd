"""Rollback for hybrid targets (Qwen3.5 / Qwen3.6 / Qwen3-Next): GatedDeltaNet + attention.

A recurrent state cannot be trimmed. During verify every GatedDeltaNet layer
records a tape (engine/models/gdn_tape.py). After a partial accept of `accepted`
drafts, each such layer gets back:
- its conv state: the last K-1 rows of [conv state before the block; the first
  accepted + 1 projections], a slice of the recorded conv input;
- its recurrent state, by one of two exact strategies:
  "replay" (default): from the pre-verify state, replay
      S_t = g_t * S_{t-1} + k_t (x) delta_t  for accepted + 1 steps
  from the taped innovations (no q, v, beta, no reductions);
  "rerun": from the pre-verify state, re-run the full recurrence on the taped
  inputs k, v, g, beta (recomputes each innovation: simpler, slower).
After a stepwise verify (the reference, the GPU kernels) both perform the forward's
own per-step arithmetic, so they restore the very state verify passed through after
accepted + 1 tokens, bit for bit; after the CPU's chunked verify they restore it to
rounding (the chunked pass never forms the intermediate states). When every
draft is accepted the caches already hold the right state and nothing runs.
Attention layers of the same model are trimmed as usual.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from engine.decode.settings import ROLLBACK_MODES
from engine.errors import DFlashError
from engine.models.gdn_tape import GDNTape, gdn_layers, instrument, recording
from kernels import gated_delta_rerun, tape_replay



class HybridRollback:
    """Trim attention caches; restore GatedDeltaNet caches from the verify tape."""

    def __init__(self, model: nn.Module, cache: list, mode: str = "replay"):
        if mode not in ROLLBACK_MODES:
            raise DFlashError(f"rollback '{mode}' is not one of: {', '.join(ROLLBACK_MODES)}.")
        instrument(model)
        self.mode = mode
        self.kind = "tape-replay" if mode == "replay" else "rerun"
        recurrent = {i: mixer.conv_kernel_size - 1 for i, mixer in gdn_layers(model)}
        self.recurrent = [(i, cache[i], keep) for i, keep in recurrent.items()]
        self.trimmable = [c for i, c in enumerate(cache) if i not in recurrent]
        self.tapes: dict[int, GDNTape] = {}  # id(cache) -> what the last verify recorded

    def recording(self):
        """Open around the verify forward: every GatedDeltaNet layer records its tape."""
        self.tapes = {id(c): GDNTape(keep_inputs=self.mode == "rerun") for _, c, _ in self.recurrent}
        return recording(self.tapes)

    def after_verify(self, accepted: int, length: int) -> None:
        tapes = [(i, c, keep, self.tapes.get(id(c))) for i, c, keep in self.recurrent]
        self.tapes = {}
        n = accepted + 1
        if n >= length:
            return  # everything accepted: the caches hold the state after the whole block
        for c in self.trimmable:
            c.trim(length - n)
        restored = []
        for i, c, keep, tape in tapes:
            if tape is None or not tape.recorded:
                raise DFlashError(f"GatedDeltaNet layer {i} ran verify without recording a tape; cannot roll it back.")
            c[0] = mx.contiguous(tape.conv_input[:, n : n + keep])
            if self.mode == "replay":
                c[1] = tape_replay(tape.state, tape.k[:, :n], tape.g[:, :n], tape.delta[:, :n])
            else:
                c[1] = gated_delta_rerun(tape.state, tape.k[:, :n], tape.v[:, :n], tape.g[:, :n], tape.beta[:, :n])
            restored += [c[0], c[1]]
        mx.eval(restored)  # inside the round's rollback time, not the next verify's
