"""Read a DFlash drafter's config.json in either published schema.

Legacy: top-level ``block_size``, ``rope_theta``, ``num_target_layers`` and
``dflash_config: {mask_token_id, target_layer_ids}``. Newer: ``dflash_config:
{block_size, mask_token_id, target_layer_ids}``, ``rope_parameters`` and mixed
``layer_types`` with ``sliding_window``. rope_theta is never defaulted: a silent
default collapses long-context acceptance.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine import json_text
from engine.errors import CheckpointError
from engine.json_text import is_int, is_number

SLIDING = "sliding_attention"
FULL = "full_attention"
# Architecture names in config.json, by drafter generation. DFlash2 adds a conv around each
# sublayer and a candidate selector (../shared/DFLASH2_NOTES.md); the official MLX runtime also
# knows it under its Muse-Glimmer name.
V1_ARCHITECTURES = ("DFlashDraftModel",)
V2_ARCHITECTURES = ("DFlash2DraftModel", "MuseGlimmerAssistantModel")
# Structural DFlash2 keys: without them the model cannot be built, so none has a default.
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@dataclass
class SelectorConfig:
    """DFlash2's additions: the conv sizes, the candidate selector, and the drafter's logit treatment."""

    conv_kernel_size: int  # K taps of each grouped dynamic causal conv
    conv_group_size: int  # S contiguous channels share one dynamic kernel: G = hidden / S groups
    selector_rank: int  # r of the predecessor/successor codebooks
    selector_top_k: int  # candidates per drafted position
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    input_embedding_scale: float = 1.0


@dataclass
class DrafterConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int | None
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    layer_types: list[str]
    sliding_window: int | None
    is_causal: bool | None
    max_position_embeddings: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    architecture: str = "DFlashDraftModel"
    selector: SelectorConfig | None = None  # DFlash2 only

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def generation(self) -> int:
        return 1 if self.selector is None else 2

    def context_fact(self) -> str:
        """How much context the drafter's layers keep: a sliding layer its trained window, a
        full-attention one what the run's draft window and sink say."""
        sliding = sum(t == SLIDING for t in self.layer_types)
        full = len(self.layer_types) - sliding
        parts = [f"{sliding} sliding layer(s) keep their trained window of {self.sliding_window}"] if sliding else []
        if full:
            parts.append(f"{full} full-attention layer(s) keep the run's draft window and sink")
        return "; ".join(parts)

    def generation_facts(self) -> dict[str, Any]:
        """What doctor, the trace header and the window say about the drafter's generation."""
        if self.selector is None:
            return {"drafter_generation": "DFlash v1", "drafter_context": self.context_fact()}
        sel = self.selector
        return {"drafter_generation": "DFlash2", "drafter_context": self.context_fact(),
                "selector": f"top-{sel.selector_top_k} candidates, rank {sel.selector_rank}",
                "conv": f"kernel {sel.conv_kernel_size}, {self.hidden_size // sel.conv_group_size} groups "
                        f"of {sel.conv_group_size} channels"}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("raw")
        if d["selector"] is None:
            d.pop("selector")
        return d


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Spread tap ids evenly from layer 1 to num_target_layers - 3, as published code does."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def read_config_json(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: config.json is missing; a model folder needs one.")
    try:
        data = json_text.loads(path.read_bytes())
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: config.json is not UTF-8 text.") from None
    except ValueError as exc:
        raise CheckpointError(f"{path}: config.json is not valid JSON ({exc}).") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read config.json ({exc.strerror or exc}).") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: config.json must hold a JSON object.")
    return data


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """A model config with its `text_config` (multimodal wrappers such as qwen3_5) merged on top."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else dict(config)


def _field(raw: dict, path: Path, name: str, kind: type, *sources: dict) -> Any:
    for source in sources or (raw,):
        if name in source and source[name] is not None:
            value = source[name]
            if kind is float and isinstance(value, int):
                value = float(value)
            if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
                raise CheckpointError(
                    f"{path}: field '{name}' should be {kind.__name__}, found {value!r}."
                )
            return value
    raise CheckpointError(f"{path}: required field '{name}' is missing.")


def _agree(path: Path, name: str, inner: Any, outer: Any, where: str = "under 'dflash_config'") -> None:
    """A field a config gives twice (`inner` where `where` says, `outer` at the top level) must say the
    same both times: runtimes read one or the other, so the same file would run as two models."""
    if inner is not None and outer is not None and (inner != outer or isinstance(inner, bool) != isinstance(outer, bool)):
        raise CheckpointError(f"{path}: '{name}' is {inner!r} {where} but {outer!r} at the top level; "
                              "runtimes read one or the other, so they must agree.")


def _positive(path: Path, name: str, value: Any, kind: type = int) -> Any:
    """A number > 0 of the given kind (int, or float accepting ints); else one sentence naming it."""
    ok = is_number(value) if kind is float else is_int(value)
    if not ok or not value > 0 or (kind is float and not math.isfinite(value)):
        raise CheckpointError(f"{path}: field '{name}' should be a positive {kind.__name__}, found {value!r}.")
    return float(value) if kind is float else value


def parse_drafter_config(raw: dict[str, Any], path: Path) -> DrafterConfig:
    """Validate a drafter config dict; `path` names the file in error messages."""
    dflash = raw.get("dflash_config")
    if not isinstance(dflash, dict):
        plain = isinstance(raw.get("model_type"), str) and "dflash" not in raw["model_type"].lower()
        raise CheckpointError(
            f"{path}: field 'dflash_config' is missing, so this is not a DFlash drafter config"
            + (f" (a '{raw['model_type']}' model: a small model with the target's tokenizer drafts with "
               "--mode draft-model --draft-model it, the window's Race tab or bench --methods draft-model)."
               if plain else ".")
        )
    hidden = _positive(path, "hidden_size", _field(raw, path, "hidden_size", int))
    layers = _positive(path, "num_hidden_layers", _field(raw, path, "num_hidden_layers", int))
    heads = _positive(path, "num_attention_heads", _field(raw, path, "num_attention_heads", int))
    kv_heads = _positive(path, "num_key_value_heads", raw.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise CheckpointError(f"{path}: 'num_attention_heads' {heads} is not a multiple of "
                              f"'num_key_value_heads' {kv_heads}.")
    head_dim = _positive(path, "head_dim", raw.get("head_dim") or hidden // heads)
    _agree(path, "block_size", dflash.get("block_size"), raw.get("block_size"))
    block_size = _field(raw, path, "block_size", int, dflash, raw)
    mask_id = _field(raw, path, "mask_token_id", int, dflash)
    if layers > 1024 or hidden > 1 << 20 or heads * head_dim > 1 << 20:
        raise CheckpointError(f"{path}: sizes {layers} layers x hidden {hidden} are beyond any real drafter.")

    rope_params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    _agree(path, "rope_theta", rope_params.get("rope_theta"), raw.get("rope_theta"), "under 'rope_parameters'")
    rope_theta = raw.get("rope_theta", rope_params.get("rope_theta"))
    if rope_theta is None:
        raise CheckpointError(
            f"{path}: 'rope_theta' is absent both at top level and under 'rope_parameters'; "
            "it must be given (a guessed value silently ruins long-context acceptance)."
        )
    rope_theta = _positive(path, "rope_theta", rope_theta, float)
    rope_scaling = raw.get("rope_scaling")
    if rope_scaling is not None and not isinstance(rope_scaling, dict):
        raise CheckpointError(f"{path}: 'rope_scaling' must be an object or null, found {rope_scaling!r}.")
    if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
        rope_scaling = rope_params

    num_target_layers = raw.get("num_target_layers")
    tap_ids = dflash.get("target_layer_ids")
    if tap_ids is None:
        if not isinstance(num_target_layers, int):
            raise CheckpointError(
                f"{path}: neither 'dflash_config.target_layer_ids' nor 'num_target_layers' is given, "
                "so the target layers to tap are unknown."
            )
        tap_ids = default_target_layer_ids(_positive(path, "num_target_layers", num_target_layers), layers)
    if not (isinstance(tap_ids, list) and tap_ids and all(isinstance(i, int) for i in tap_ids)):
        raise CheckpointError(f"{path}: 'dflash_config.target_layer_ids' must be a list of layer ids.")

    layer_types = raw.get("layer_types") or [FULL] * layers
    if not isinstance(layer_types, list) or len(layer_types) != layers \
            or any(t not in (FULL, SLIDING) for t in layer_types):
        raise CheckpointError(
            f"{path}: 'layer_types' must list {layers} entries of '{FULL}' or '{SLIDING}'."
        )
    window = raw.get("sliding_window")
    if SLIDING in layer_types and not (isinstance(window, int) and window > 1):
        raise CheckpointError(
            f"{path}: 'layer_types' has sliding layers but 'sliding_window' is missing or < 2."
        )
    vocab_size = _positive(path, "vocab_size", _field(raw, path, "vocab_size", int))
    architecture, selector = drafter_generation(raw, dflash, path, hidden, vocab_size)
    is_causal = raw.get("is_causal")
    if is_causal is not None and not isinstance(is_causal, bool):
        raise CheckpointError(f"{path}: 'is_causal' must be true or false.")
    if not 1 <= block_size <= 64:
        raise CheckpointError(f"{path}: 'block_size' {block_size} is outside 1..64.")

    return DrafterConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_positive(path, "intermediate_size", _field(raw, path, "intermediate_size", int)),
        rms_norm_eps=_positive(path, "rms_norm_eps", raw.get("rms_norm_eps", 1e-6), float),
        vocab_size=vocab_size,
        block_size=block_size,
        mask_token_id=mask_id,
        target_layer_ids=list(tap_ids),
        num_target_layers=num_target_layers,
        rope_theta=float(rope_theta),
        rope_scaling=rope_scaling,
        layer_types=list(layer_types),
        sliding_window=window,
        is_causal=is_causal,
        max_position_embeddings=_positive(path, "max_position_embeddings", raw.get("max_position_embeddings", 32768)),
        raw=raw,
        architecture=architecture,
        selector=selector,
    )


def drafter_generation(raw: dict[str, Any], dflash: dict[str, Any], path: Path, hidden: int,
                       vocab_size: int) -> tuple[str, SelectorConfig | None]:
    """The architecture config.json names, and for DFlash2 its selector config. The name decides;
    a config naming none is read as v1 (as early v1 checkpoints are), and the weights check refuses
    it if its tensors are DFlash2's."""
    names = raw.get("architectures") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{path}: 'architectures' must be a list of names, found {names!r}.")
    v2 = [n for n in names if n in V2_ARCHITECTURES]
    if not v2:
        v1 = [n for n in names if n in V1_ARCHITECTURES]
        if names and not v1:
            raise CheckpointError(
                f"{path}: 'architectures' is {names}, not a DFlash drafter "
                f"({', '.join(V1_ARCHITECTURES + V2_ARCHITECTURES)}).")
        return (v1[0] if v1 else V1_ARCHITECTURES[0]), None

    def key(name: str) -> Any:  # dflash_config first, then the top level, as the torch runtime reads it
        _agree(path, name, dflash.get(name), raw.get(name))
        return dflash[name] if dflash.get(name) is not None else raw.get(name)

    for name in DFLASH2_KEYS:
        if key(name) is None:
            raise CheckpointError(f"{path}: DFlash2 key 'dflash_config.{name}' is missing; "
                                  "a DFlash2 drafter cannot be built without it.")
    kernel, group, rank, top_k = (_positive(path, f"dflash_config.{n}", key(n)) for n in DFLASH2_KEYS)
    if hidden % group:
        raise CheckpointError(f"{path}: 'dflash_config.conv_group_size' {group} does not divide "
                              f"'hidden_size' {hidden}.")
    if top_k > vocab_size:
        raise CheckpointError(f"{path}: 'dflash_config.selector_top_k' {top_k} is larger than the "
                              f"vocabulary ({vocab_size}).")
    cap = key("final_logit_softcapping")
    if cap is not None:
        cap = _positive(path, "final_logit_softcapping", cap, float) if cap != 0 else None
    multiplier, scale = key("output_multiplier"), key("input_embedding_scale")
    return v2[0], SelectorConfig(
        conv_kernel_size=kernel, conv_group_size=group, selector_rank=rank, selector_top_k=top_k,
        output_multiplier=1.0 if multiplier is None else _positive(path, "output_multiplier", multiplier, float),
        final_logit_softcapping=cap,
        input_embedding_scale=1.0 if scale is None else _positive(path, "input_embedding_scale", scale, float),
    )


def load_drafter_config(folder: Path) -> DrafterConfig:
    return parse_drafter_config(read_config_json(folder), folder / "config.json")
