"""Rollback for hybrid targets (Qwen3.5 / Qwen3.6 / Qwen3-Next): GatedDeltaNet + attention.

A recurrent state cannot be trimmed. During verify every GatedDeltaNet layer
records a tape (engine/hybrid_gdn.py). After a partial accept of `accepted`
drafts, each such layer gets back:
- its conv state: the last K-1 rows of [conv state before the block; the first
  accepted + 1 projections], a slice of the recorded conv input;
- its recurrent state, by one of two exact strategies:
  "replay" (default): from the pre-verify state, replay
      S_t = g_t * S_{t-1} + k_t (x) delta_t  for accepted + 1 steps
  from the taped innovations (no q, v, beta, no reductions);
  "rerun": from the pre-verify state, re-run the full recurrence on the taped
  inputs k, v, g, beta (recomputes each innovation: simpler, slower).
Both perform the forward's own per-step arithmetic, so they restore the very
state verify passed through after accepted + 1 tokens, bit for bit. When every
draft is accepted the caches already hold the right state and nothing runs.
Attention layers of the same model are trimmed as usual.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache

from engine.errors import DFlashError
from engine.hybrid_gdn import GDNTape, gdn_layers, instrument
from engine.rollback import ROLLBACK_STRATEGIES
from kernels import gated_delta_rerun, tape_replay

ROLLBACK_MODES = ("replay", "rerun")

# model_type values (top level and text_config) whose targets carry GatedDeltaNet layers.
HYBRID_MODEL_TYPES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"})


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

    def before_verify(self) -> None:
        for _, c, _ in self.recurrent:
            c.dflash_tape = GDNTape(keep_inputs=self.mode == "rerun")

    def after_verify(self, accepted: int, length: int) -> None:
        tapes = []
        for i, c, keep in self.recurrent:
            tapes.append((i, c, keep, c.dflash_tape))
            c.dflash_tape = None
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


def applies(model: nn.Module, cache: list) -> bool:
    """A model with GatedDeltaNet layers whose other caches can all be trimmed."""
    recurrent = {i for i, _ in gdn_layers(model)}
    if not recurrent or len(cache) != len(getattr(model, "layers", [])):
        return False
    return all(isinstance(c, ArraysCache) if i in recurrent else c.is_trimmable() for i, c in enumerate(cache))


def make_hybrid_rollback(model: nn.Module, cache: list, prefer: Optional[str] = None) -> HybridRollback:
    return HybridRollback(model, cache, prefer or "replay")


def rollback_fact(model_type: Optional[str]) -> str:
    """What `doctor` says about a target's rollback, from its config's model_type."""
    if model_type in HYBRID_MODEL_TYPES:
        return "tape replay (GatedDeltaNet state; attention layers kv-trim)"
    return "kv-trim (attention caches)"


if (applies, make_hybrid_rollback) not in ROLLBACK_STRATEGIES:
    ROLLBACK_STRATEGIES.append((applies, make_hybrid_rollback))
