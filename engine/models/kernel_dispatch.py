"""Put the project's kernels into a target's model files, by device.

mlx-lm's layers call module-level functions of their own model file (`swiglu` in the MLPs,
`scaled_dot_product_attention` in the attention layers), so those names are replaced there
with dispatchers. On the CPU: kernels/cpu_swiglu.py takes float32 blocks of several tokens
(verifies, prefills), kernels/verify_attention.py's host path takes float32 verify blocks (and
kernels/cpu_attention.py's in-graph attention with a fast exp takes smaller ones), each
attention layer's rope is wrapped so that blocks of rows rotate by angles made once per forward
(kernels/cpu_rope.py), and plain RMSNorm layers compute blocks in compiled kernels
(kernels/cpu_rms_norm.py); both give MLX's own bits.
On a Metal GPU: kernels/verify_attention_metal.py takes half-precision verify blocks whose
shape passed its one-time check. Everything else, one-token steps included, goes to mlx-lm's
function unchanged. Every model of those files in this process gets them (process-wide because
mlx-lm's layers look these names up in their own module): outside the cases they take they are
mlx-lm's own.
DFLASH_NO_CPU_KERNELS=1 leaves mlx-lm alone on any device (to compare, or if one is ever suspected).
"""

from __future__ import annotations

import os
import sys

import mlx.core as mx
import mlx.nn as nn

from kernels.cpu_rms_norm import install_block_norms
from kernels.cpu_rope import install_block_ropes
from kernels.cpu_swiglu import swiglu_with_fallback
from kernels import verify_attention
from kernels.verify_attention_metal import sdpa_with_metal

DISABLE_ENV = "DFLASH_NO_CPU_KERNELS"
CPU_DISPATCHERS = {"swiglu": swiglu_with_fallback, "scaled_dot_product_attention": verify_attention.sdpa_with_fallback}
METAL_DISPATCHERS = {"scaled_dot_product_attention": sdpa_with_metal}
# Part of a cost curve's cache key (engine/decode/cost_curve.py): raised when a kernel's speed, or
# which calls a dispatcher sends to it, changes, so that curves timed through the old ones are
# measured again (2: the in-graph verify attention).
KERNELS_REVISION = 2


def dispatchers_for(device: mx.Device) -> dict:
    """The dispatchers a device gets (none when DFLASH_NO_CPU_KERNELS is set)."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return {}
    if device == mx.cpu:
        return CPU_DISPATCHERS
    return METAL_DISPATCHERS if mx.metal.is_available() else {}


def kernels_status(device: mx.Device) -> str:
    """What the dispatchers do on `device`, for doctor."""
    wanted = dispatchers_for(device)
    if not wanted:
        return f"mlx-lm's own ({DISABLE_ENV} is set)" if os.environ.get(DISABLE_ENV, "") not in ("", "0") \
            else "mlx-lm's own (no kernels for this device)"
    if device == mx.cpu:
        return ("verify blocks' attention on the host (NumPy), or in MLX's graph with a fast exp for smaller "
                "ones, a fast-exp SwiGLU for float32 blocks, RoPE "
                "angles made once per block and compiled RMSNorm for blocks; one-token steps mlx-lm's")
    return "verify blocks' attention in a Metal kernel where its one-time check per shape passed; else mlx-lm's"


def kernels_key(installed: tuple[str, ...]) -> str:
    """What a verify's cost depends on of the kernels a pair runs (`installed`: the names
    install_kernels returned): the names, KERNELS_REVISION and the attention paths' thresholds."""
    return (f"kernels {','.join(installed)} revision {KERNELS_REVISION} host from "
            f"{verify_attention.MIN_HOST_SCORES} graph from {verify_attention.MIN_GRAPH_SCORES}")


def install_kernels(model: nn.Module, device: mx.Device) -> list[str]:
    """Install `device`'s dispatchers in the model files of `model`'s layers (once per file and
    name), and take out any other; return the names that dispatch, e.g. "mlx_lm.models.qwen3.swiglu"."""
    wanted = dispatchers_for(device)
    installed = []
    for name in sorted({type(m).__module__ for m in model.modules()}):
        module = sys.modules.get(name)
        if module is None or not name.startswith("mlx_lm.models."):
            continue
        for function in ("swiglu", "scaled_dot_product_attention"):
            current = getattr(module, function, None)
            if not callable(current):
                continue
            stock = getattr(current, "stock", current)
            wrap = wanted.get(function)
            if wrap is None:  # mlx-lm's own again, should an earlier load have installed one
                setattr(module, function, stock)
                continue
            if getattr(current, "wrapped_by", None) is not wrap:
                dispatcher = wrap(stock)
                dispatcher.wrapped_by = wrap
                setattr(module, function, dispatcher)
            installed.append(f"{name}.{function}")
    return installed + _install_block_layers(model, on=wanted is CPU_DISPATCHERS)


def _install_block_layers(model: nn.Module, on: bool) -> list[str]:
    """The CPU's ropes and norms for blocks in `model`'s layers (per layer: they are modules, not
    names of a model file), or their own again; names like install_kernels' for those installed."""
    names = []
    for what, install in (("rope", install_block_ropes), ("rms_norm", install_block_norms)):
        if install(model, on=on):
            names.append(f"{type(model).__module__}.{what}")
    return names


def install_drafter_kernels(drafter: nn.Module, device: mx.Device) -> None:
    """A drafter's attention ropes and norms take its blocks the CPU's way, as the target's do (an
    inference drafter: a trainer's keeps its own)."""
    _install_block_layers(drafter, on=dispatchers_for(device) is CPU_DISPATCHERS)
