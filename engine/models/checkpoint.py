"""Check a drafter's safetensors against what its config implies, without loading data.

A drafter's weights are every `*.safetensors` in its folder, merged (published DFlash2 drafters
may come in several files). DFlash2's codebooks are published without a `.weight` suffix; the
MLX runtime saves them with one. Both are accepted and named the second way once loaded.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from engine.models.drafter_config import DrafterConfig
from engine.errors import CheckpointError

WEIGHTS_FILE = "model.safetensors"  # what our trainer writes
DFLASH2_MARKERS = ("candidate_selector.", "attention_conv.", "mlp_conv.")
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


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
    if cfg.selector is not None:
        shapes.update(dflash2_shapes(cfg))
    return shapes


def dflash2_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """DFlash2's tensors beyond v1's: two convs per layer and the candidate selector."""
    sel, h = cfg.selector, cfg.hidden_size
    k, groups = sel.conv_kernel_size, h // sel.conv_group_size
    shapes: dict[str, tuple[int, ...]] = {}
    for n in range(cfg.num_hidden_layers):
        for conv in ("attention_conv", "mlp_conv"):
            shapes[f"layers.{n}.{conv}.base_kernel"] = (2, k, h)
            shapes[f"layers.{n}.{conv}.kernel_projection.weight"] = (2 * k * groups, h)
    shapes["candidate_selector.hidden_projection.weight"] = (sel.selector_rank, h)
    for name in CODEBOOKS:
        shapes[name + ".weight"] = (cfg.vocab_size, sel.selector_rank)
    return shapes


def canonical_name(name: str) -> str:
    """The name a tensor has in our model: published codebooks gain the `.weight` suffix."""
    return name + ".weight" if name in CODEBOOKS else name


def published_name(name: str) -> str:
    """The name a tensor is saved under: the codebooks as z-lab publishes them (no `.weight`), which
    the official runtimes rename on load."""
    bare = name[: -len(".weight")]
    return bare if bare in CODEBOOKS else name


def weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors weights in the drafter folder.")
    return files


def read_drafter_shapes(folder: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Every tensor of the drafter's weight files (names made canonical), and each one's name as the
    file holds it (for errors); a tensor in two files is refused."""
    found: dict[str, tuple[int, ...]] = {}
    saved: dict[str, str] = {}
    where: dict[str, Path] = {}
    for path in weight_files(folder):
        for name, shape in read_tensor_shapes(path).items():
            key = canonical_name(name)
            if key in found:
                raise CheckpointError(f"{path}: tensor '{name}' is also in {where[key].name}; "
                                      "a drafter's weight files must not overlap.")
            found[key], saved[key], where[key] = shape, name, path
    return found, saved


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


def tensor_dtype(path: Path, name: str) -> str:
    """One tensor's dtype as its safetensors header names it (BF16, F16, F32; U32 for packed quantized weights)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return str(f.get_slice(name).get_dtype())


def check_drafter_weights(folder: Path, cfg: DrafterConfig, target_vocab: int | None = None) -> None:
    """The weights hold exactly the tensors config.json implies, in their shapes; a DFlash2 drafter's
    codebooks also cover the target's vocabulary (`target_vocab`, when known)."""
    found, saved = read_drafter_shapes(folder)
    if cfg.selector is None:
        v2 = sorted(name for name in found if any(marker in name for marker in DFLASH2_MARKERS))
        if v2:
            raise CheckpointError(
                f"{folder / 'config.json'}: 'architectures' says {cfg.architecture} (DFlash v1) but the "
                f"weights hold DFlash2 tensor '{v2[0]}'; a DFlash2 config names DFlash2DraftModel and "
                "gives dflash_config's conv and selector sizes.")
    expected = expected_drafter_shapes(cfg)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    kind = "DFlash2" if cfg.selector is not None else "DFlash v1"
    if missing:
        raise CheckpointError(
            f"{folder}: tensor '{missing[0]}' is missing ({len(missing)} missing in all) "
            f"for the {cfg.num_hidden_layers}-layer {kind} drafter that config.json declares."
        )
    if extra:
        raise CheckpointError(
            f"{folder}: unexpected tensor '{saved[extra[0]]}' ({len(extra)} extra in all) "
            f"for the {cfg.num_hidden_layers}-layer {kind} drafter that config.json declares."
        )
    if cfg.selector is not None:
        vocab = max(cfg.vocab_size, target_vocab or 0)
        for key in (canonical_name(name) for name in CODEBOOKS):
            rows = found[key][0]
            if rows < vocab:
                whose = "the target's vocabulary" if target_vocab and target_vocab >= cfg.vocab_size else "'vocab_size'"
                raise CheckpointError(
                    f"{folder}: tensor '{saved[key]}' has {rows} rows but {whose} has {vocab} ids; the candidate "
                    "selector cannot score every token the drafter may propose.")
    for name, shape in expected.items():
        if found[name] != shape:
            raise CheckpointError(
                f"{folder}: tensor '{saved[name]}' has shape {list(found[name])}, "
                f"but config.json implies {list(shape)}."
            )


MADE_BY_FILE = "train_drafter.json"  # marks a folder whose drafter train-drafter wrote, and for which target


def target_fingerprint(target_path: Path, samples: int = 64, sample_bytes: int = 1 << 16) -> str:
    """Which target this is: its weight files' names, sizes and `samples` blocks spread evenly over
    each (the whole file when it is smaller): enough to tell two trainings apart, a fine-tune of
    middle layers included, without reading gigabytes. A distillation cache made with another
    target is made again; a drafter trained for another target is named as such (the doctor)."""
    files = sorted(Path(target_path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{target_path}: no .safetensors weights to fingerprint the target by.")
    stats = tuple((str(f), str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _fingerprint(stats, samples, sample_bytes)


# The doctor asks on every check of a pair (the window's included): the last few targets' digests
# are kept, by their files' names, sizes and times, so a check does not read the samples again.
@functools.lru_cache(maxsize=8)
def _fingerprint(stats: tuple, samples: int, sample_bytes: int) -> str:
    return _sampled_digest([Path(name) for name, *_ in stats], samples, sample_bytes)


def model_name(path: Path) -> str:
    """What people call the model in a folder: a Hugging Face cache snapshot's repository id
    (.../models--org--name/snapshots/<sha> -> org/name), else the folder's name."""
    path = Path(path)
    repo = path.parent.parent.name
    if path.parent.name == "snapshots" and repo.startswith("models--"):
        return repo[len("models--"):].replace("--", "/")
    return path.name


def _sampled_digest(files: list[Path], samples: int, sample_bytes: int) -> str:
    digest = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as f:
            if size <= samples * sample_bytes:
                digest.update(f.read())
                continue
            for i in range(samples):
                f.seek((size - sample_bytes) * i // (samples - 1))
                digest.update(f.read(sample_bytes))
    return digest.hexdigest()
