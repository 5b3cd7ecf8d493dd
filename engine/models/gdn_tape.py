"""GatedDeltaNet layers that can record a tape: mlx-lm's qwen3_5 and qwen3_next mixers.

Each GatedDeltaNet mixer instance gets its class swapped for a subclass (the
technique engine/models/taps.py uses for taps, engine/models/layer_swap.py; mlx-lm's files are not edited and
weights keep their names). The subclass runs the same layer, with the
recurrence going through `kernels.gated_delta_tape`: single steps (AR decoding)
take the stepwise reference (mlx-lm's arithmetic), multi-token blocks (prefill,
verify) the GPU kernel, or on the CPU the closed-form chunked pass. Inside `recording(tapes)` (the rollback opens it around a
verify), a layer whose cache has a tape there also records what a rollback needs: the state and conv inputs before the block,
and per step k_t, g_t and the innovation delta_t (fp32). Inside a tree verify (engine/models/gdn_tree.py)
each node's conv and recurrence read its ancestors instead of the previous row.

Calls this path does not cover (a padding mask, batched lengths, training with a
cache, and on a GPU any call without a cache) go to mlx-lm's own forward unchanged.
On the CPU a call without a cache (training, the drafter trainer's target pass) takes
the chunked pass, which is differentiable, instead of mlx-lm's step-per-token ops.
Tensor-parallel layers (qwen3_5's `shard()`) are covered: sharding divides the head counts and dims this forward reads
and slices out_proj, whose partial outputs this forward sums across the ranks as mlx-lm's
does; mlx-lm's `sum_gradients` is the identity forward.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache

from engine.errors import DFlashError
from engine.models.gdn_tree import PENDING, active_tree, conv_windows
from engine.models.layer_swap import is_swapped, swap, unswap
from kernels import gated_delta_tape
from kernels.gated_delta_tree import gated_delta_tree

# mlx-lm's GatedDeltaNet mixers, by the private module that defines each. They are looked up among
# the modules already imported, never imported here: loading a hybrid target imports its family's
# module, and a dense target never touches these internals (a rename there breaks hybrids only).
GDN_CLASS_NAMES = {"mlx_lm.models.qwen3_5": "GatedDeltaNet", "mlx_lm.models.qwen3_next": "Qwen3NextGatedDeltaNet"}

KIND = "Taped"

# id(layer cache) -> the tape it records into; set only inside `recording()`. A context variable, not
# an argument: mlx-lm calls the swapped layer as layer(x, mask, cache), so the tape is found by its cache.
_ACTIVE_TAPES: ContextVar[dict[int, "GDNTape"]] = ContextVar("dflash_active_tapes", default={})

# model_type values (top level and text_config) whose targets carry GatedDeltaNet layers.
HYBRID_MODEL_TYPES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"})


def gdn_classes() -> tuple[type, ...]:
    """The GatedDeltaNet classes of the hybrid families loaded so far (none for a dense target)."""
    found = []
    for module, name in GDN_CLASS_NAMES.items():
        if module in sys.modules:
            cls = getattr(sys.modules[module], name, None)
            if cls is None:
                raise DFlashError(f"this mlx-lm has no {module}.{name}, which hybrid targets' rollback needs; "
                                  "install the mlx-lm version pyproject.toml names.")
            found.append(cls)
    return tuple(found)


@dataclass
class GDNTape:
    """What one GatedDeltaNet layer saw during one verify block of T tokens."""

    keep_inputs: bool = False  # also keep v and beta (the "rerun" rollback needs them)
    state: Optional[mx.array] = None  # [B, Hv, Dv, Dk] fp32, before the block
    conv_input: Optional[mx.array] = None  # [B, K-1+T, C]: conv state before the block, then the T projections
    k: Optional[mx.array] = None  # [B, T, Hk, Dk]
    g: Optional[mx.array] = None  # [B, T, Hv] fp32
    delta: Optional[mx.array] = None  # [B, T, Hv, Dv] fp32
    v: Optional[mx.array] = None  # [B, T, Hv, Dv], keep_inputs only
    beta: Optional[mx.array] = None  # [B, T, Hv], keep_inputs only

    @property
    def recorded(self) -> bool:
        return self.delta is not None


@contextmanager
def recording(tapes: dict[int, GDNTape]) -> Iterator[dict[int, GDNTape]]:
    """Record into `tapes` (keyed by id of each GatedDeltaNet layer's cache) during the block."""
    token = _ACTIVE_TAPES.set(tapes)
    try:
        yield tapes
    finally:
        _ACTIVE_TAPES.reset(token)


def _project(layer: nn.Module, x: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """(pre-conv q|k|v [B, S, C], z [B, S, Hv, Dv], b, a) as each family computes them."""
    B, S, _ = x.shape
    if hasattr(layer, "in_proj_qkvz"):  # qwen3_next projects q, k, v and z together
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x), layer.in_proj_ba(x))
        qkv = mx.concatenate([q.reshape(B, S, -1), k.reshape(B, S, -1), v.reshape(B, S, -1)], axis=-1)
        return qkv, z, b, a
    qkv = layer.in_proj_qkv(x)
    z = layer.in_proj_z(x).reshape(B, S, layer.num_v_heads, layer.head_v_dim)
    return qkv, z, layer.in_proj_b(x), layer.in_proj_a(x)


def taped_forward(layer: nn.Module, inputs: mx.array, cache: Any) -> mx.array:
    """mlx-lm's GatedDeltaNet forward with a cache and no mask, recording into its cache's tape while
    a `recording()` block holds one."""
    from mlx_lm.models.gated_delta import compute_g, normalize_qk  # imported with the hybrid family's module

    B, S, _ = inputs.shape
    qkv, z, b, a = _project(layer, inputs)

    n_keep = layer.conv_kernel_size - 1
    conv_state = cache[0]
    if conv_state is None:
        conv_state = mx.zeros((B, n_keep, layer.conv_dim), dtype=inputs.dtype)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    tree = active_tree()  # a tree verify: each node's conv and state come from its own ancestors
    if tree is None:
        cache[0] = mx.contiguous(conv_input[:, -n_keep:, :])
        conv_out = nn.silu(layer.conv1d(conv_input))
    else:
        conv_out = nn.silu(conv_windows(layer.conv1d, conv_input, tree, n_keep))

    q, k, v = [
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [layer.key_dim, 2 * layer.key_dim], -1),
            [layer.num_k_heads, layer.num_k_heads, layer.num_v_heads],
            [layer.head_k_dim, layer.head_k_dim, layer.head_v_dim],
        )
    ]
    q, k = normalize_qk(q, k, inv_scale=layer.head_k_dim**-0.5, eps=1e-6)
    beta = mx.sigmoid(b)
    g = compute_g(layer.A_log, a, layer.dt_bias)
    state = cache[1]
    if state is None:
        state = mx.zeros((B, layer.num_v_heads, layer.head_v_dim, layer.head_k_dim), dtype=mx.float32)

    if tree is not None:  # the cache keeps the state before the tree until commit_path
        out, delta = gated_delta_tree(q, k, v, g, beta, state, tree.parents, tree.seen)
        setattr(cache, PENDING, GDNTape(state=state, conv_input=conv_input, k=k, g=g, delta=delta))
    else:
        out, new_state, delta = gated_delta_tape(q, k, v, g, beta, state)
        tape = _ACTIVE_TAPES.get().get(id(cache))
        if tape is not None:
            tape.state, tape.conv_input, tape.k, tape.g, tape.delta = state, conv_input, k, g, delta
            if tape.keep_inputs:
                tape.v, tape.beta = v, beta
        cache[1] = new_state
    cache.advance(S)

    out = layer.out_proj(layer.norm(out, z).reshape(B, S, -1))
    group = getattr(layer, "sharding_group", None)  # tensor parallel: out_proj holds a slice of the sum
    return mx.distributed.all_sum(out, group=group) if group is not None else out


def _covered(layer: nn.Module, mask: Optional[mx.array], cache: Any) -> bool:
    if mask is not None:
        return False
    if cache is None:  # a whole sequence (training, the trainer's target pass): the chunked pass on the CPU
        # not a sharded layer: mlx-lm's sum_gradients sums its input gradients across ranks
        return mx.default_device() == mx.cpu and getattr(layer, "sharding_group", None) is None
    return getattr(cache, "lengths", None) is None and getattr(cache, "left_padding", None) is None and not layer.training


def _taped_call(cls: type):
    def __call__(self, inputs, mask=None, cache=None):
        if not _covered(self, mask, cache):
            if active_tree() is not None:
                raise DFlashError("tree verify: a GatedDeltaNet layer was called with a mask, padding or no "
                                  "cache; its state per node cannot be kept there.")
            return cls.__call__(self, inputs, mask, cache)
        return taped_forward(self, inputs, ArraysCache(size=2) if cache is None else cache)

    return __call__


def gdn_layers(model: nn.Module) -> Iterator[tuple[int, nn.Module]]:
    """(decoder layer index, GatedDeltaNet mixer) for every recurrent layer of a supported model."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list):
        return
    classes = gdn_classes()
    for i, layer in enumerate(layers):
        mixer = getattr(layer, "linear_attn", None) if isinstance(layer, nn.Module) else None
        if classes and isinstance(mixer, classes):
            yield i, mixer


def instrument(model: nn.Module) -> int:
    """Swap every GatedDeltaNet mixer's class for its taped subclass (idempotent); how many."""
    n = 0
    for _, mixer in gdn_layers(model):
        swap(mixer, KIND, _taped_call)
        n += 1
    return n


def uninstrument(model: nn.Module) -> None:
    for _, mixer in gdn_layers(model):
        unswap(mixer, KIND)


def is_instrumented(mixer: nn.Module) -> bool:
    return is_swapped(mixer, KIND)


def is_hybrid(model: nn.Module, cache: list) -> bool:
    """A model with GatedDeltaNet layers whose other caches can all be trimmed."""
    recurrent = {i for i, _ in gdn_layers(model)}
    if not recurrent or len(cache) != len(getattr(model, "layers", [])):
        return False
    return all(isinstance(c, ArraysCache) if i in recurrent else c.is_trimmable() for i, c in enumerate(cache))


def rollback_fact(model_type: Optional[str]) -> str:
    """What `doctor` says about a target's rollback, from its config's model_type."""
    if model_type in HYBRID_MODEL_TYPES:
        return "tape replay (GatedDeltaNet state; attention layers kv-trim)"
    return "kv-trim (attention caches)"
