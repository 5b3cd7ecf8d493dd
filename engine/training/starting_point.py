"""What a training run starts from: its settings, the mask token, a new drafter's config, or the
drafter given to --init (v1 grown into DFlash2 when asked)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from mlx.utils import tree_flatten

from engine.errors import DFlashError
from engine.models.drafter import DFlashDrafter
from engine.models.drafter_config import default_target_layer_ids, flat_config, parse_drafter_config
from engine.models.drafter_load import new_drafter
from engine.models.pair import LoadedPair

MASK_TOKEN_NAMES = ("<|mask|>", "<mask>", "<|MASK|>", "[MASK]")


@dataclass
class TrainSettings:
    layers: int = 1
    block_size: int = 16
    taps: Optional[list[int]] = None  # None: spread evenly, as published drafters do
    steps: int = 1000
    batch: int = 8
    seq_len: int = 256
    anchors: int = 8
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.01
    gamma: float = 7.0
    seed: int = 0
    intermediate_size: Optional[int] = None
    eval_every: int = 100
    eval_fraction: float = 0.05
    init: Optional[str] = None  # a drafter (folder or id) to fine-tune; its config fixes the architecture
    arch: str = "dflash"  # or "dflash2": convs around each sublayer and a candidate selector
    selector_rank: int = 64  # DFlash2 only
    selector_top_k: int = 8
    conv_kernel: int = 2
    conv_group: int = 16


SELECTOR_SETTINGS = ("selector_rank", "selector_top_k", "conv_kernel", "conv_group")


def find_mask_token(tokenizer) -> int:
    vocab = tokenizer.get_vocab()
    for name in MASK_TOKEN_NAMES:
        if name in vocab:
            return vocab[name]
    raise DFlashError(
        "the target's tokenizer has no mask token (looked for " + ", ".join(MASK_TOKEN_NAMES) + "); "
        "add one to the tokenizer before training a drafter."
    )


def drafter_config_for(pair: LoadedPair, s: TrainSettings, mask_id: int) -> dict:
    t = flat_config(pair.target_config)
    layers = pair.head.num_layers
    taps = s.taps or default_target_layer_ids(layers, s.layers)
    bad = [i for i in taps if not 0 <= i < layers]
    if bad:
        raise DFlashError(f"--taps {bad[0]} is outside the target's {layers} layers (0..{layers - 1}).")
    rope_theta = t.get("rope_theta") or (t.get("rope_parameters") or {}).get("rope_theta")
    if rope_theta is None:
        raise DFlashError(f"{pair.target_path / 'config.json'}: the target has no rope_theta to give the drafter.")
    heads = t["num_attention_heads"]
    raw = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": t["hidden_size"],
        "num_hidden_layers": s.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": t.get("num_key_value_heads", heads),
        "head_dim": t.get("head_dim") or t["hidden_size"] // heads,
        "intermediate_size": s.intermediate_size or t["intermediate_size"],
        "rms_norm_eps": t.get("rms_norm_eps", 1e-6),
        "vocab_size": t["vocab_size"],
        "max_position_embeddings": t.get("max_position_embeddings", 32768),
        "rope_theta": rope_theta,
        "tie_word_embeddings": t.get("tie_word_embeddings", False),
        "num_target_layers": layers,
        "block_size": s.block_size,
        "layer_types": ["full_attention"] * s.layers,
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": taps, "block_size": s.block_size},
    }
    return as_dflash2(raw, s) if s.arch == "dflash2" else raw


def as_dflash2(raw: dict, s: TrainSettings) -> dict:
    """A drafter config made DFlash2's, with the settings' conv and selector sizes."""
    if s.arch != "dflash2":
        return raw
    if raw["hidden_size"] % s.conv_group:
        raise DFlashError(f"--conv-group {s.conv_group} does not divide the hidden size {raw['hidden_size']}.")
    if not (1 <= s.selector_top_k <= raw["vocab_size"] and s.selector_rank >= 1 and s.conv_kernel >= 1):
        raise DFlashError("--selector-top-k must be 1..vocabulary, --selector-rank and --conv-kernel >= 1.")
    dflash = {**raw["dflash_config"], "conv_kernel_size": s.conv_kernel, "conv_group_size": s.conv_group,
              "selector_rank": s.selector_rank, "selector_top_k": s.selector_top_k}
    return {**raw, "architectures": ["DFlash2DraftModel"], "is_causal": False, "dflash_config": dflash}


def initial_drafter(pair: LoadedPair, s: TrainSettings, mask_id: int) -> tuple[TrainSettings, dict, DFlashDrafter]:
    """The --init drafter, checked against the target as `doctor` checks a pair; the settings
    take its architecture (layers, taps, block size, MLP width)."""
    from engine.models.doctor import check_pair
    from engine.models.drafter_load import load_drafter

    report = check_pair(pair.target_path, s.init)
    if not report.ok:
        raise DFlashError(f"--init {s.init}: {report.problems[0]}")
    folder = Path(report.facts["drafter"])
    raw = json.loads((folder / "config.json").read_text())
    drafter = load_drafter(folder, pair.head.dtype)
    cfg = drafter.cfg
    if cfg.mask_token_id != mask_id:
        raise DFlashError(f"--init {s.init}: its mask token {cfg.mask_token_id} is not the tokenizer's {mask_id}.")
    s = replace(s, layers=cfg.num_hidden_layers, block_size=cfg.block_size, taps=list(cfg.target_layer_ids),
                intermediate_size=raw.get("intermediate_size"))
    if cfg.selector is not None:  # a DFlash2 drafter fixes its own selector and conv sizes
        sel = cfg.selector
        asked = (s.selector_rank, s.selector_top_k, s.conv_kernel, s.conv_group)
        has = (sel.selector_rank, sel.selector_top_k, sel.conv_kernel_size, sel.conv_group_size)
        if asked not in (has, tuple(getattr(TrainSettings, k) for k in SELECTOR_SETTINGS)):
            raise DFlashError(f"--init {s.init} is a DFlash2 drafter with selector rank {has[0]}, top-k {has[1]}, "
                              f"conv kernel {has[2]} and group {has[3]}; it keeps them (leave those flags out).")
        s = replace(s, arch="dflash2", selector_rank=sel.selector_rank, selector_top_k=sel.selector_top_k,
                    conv_kernel=sel.conv_kernel_size, conv_group=sel.conv_group_size)
    elif s.arch == "dflash2":  # v1 -> DFlash2: v1's weights, identity convs, a new selector
        raw = as_dflash2(raw, s)
        grown = new_drafter(parse_drafter_config(raw, folder / "config.json"))
        grown.load_weights(list(tree_flatten(drafter.parameters())), strict=False)
        drafter = grown
    return s, raw, drafter
