"""Check a drafter's model.safetensors against what its config implies, without loading data."""

from __future__ import annotations

from pathlib import Path

from engine.models.drafter_config import DrafterConfig
from engine.errors import CheckpointError

WEIGHTS_FILE = "model.safetensors"
DFLASH2_MARKERS = ("candidate_selector.", "attention_conv.", "mlp_conv.")


def expected_drafter_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """The 11 * L + 3 tensors of a DFlash v1 drafter and their shapes."""
    h, hd, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, cfg.num_taps * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for n in range(cfg.num_hidden_layers):
        p = f"layers.{n}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        )
    return shapes


def read_tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes from a safetensors header; refuses truncated or corrupt files."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise CheckpointError(f"{path}: the weights file is missing.")
    try:
        with safe_open(str(path), framework="numpy") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except SafetensorError as exc:
        raise CheckpointError(
            f"{path}: the safetensors file is truncated or corrupt ({exc}); download or save it again."
        ) from None


def check_drafter_weights(folder: Path, cfg: DrafterConfig) -> None:
    path = folder / WEIGHTS_FILE
    found = read_tensor_shapes(path)
    if any(marker in name for name in found for marker in DFLASH2_MARKERS):
        raise CheckpointError(
            f"{path}: this is a DFlash2 checkpoint (it has candidate_selector / conv tensors); "
            "this engine runs DFlash v1 drafters only."
        )
    expected = expected_drafter_shapes(cfg)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing:
        raise CheckpointError(
            f"{path}: tensor '{missing[0]}' is missing ({len(missing)} missing in all) "
            f"for the {cfg.num_hidden_layers} layers that config.json declares."
        )
    if extra:
        raise CheckpointError(
            f"{path}: unexpected tensor '{extra[0]}' ({len(extra)} extra in all); "
            "a DFlash drafter has exactly 11 * layers + 3 tensors."
        )
    for name, shape in expected.items():
        if found[name] != shape:
            raise CheckpointError(
                f"{path}: tensor '{name}' has shape {list(found[name])}, "
                f"but config.json implies {list(shape)}."
            )
