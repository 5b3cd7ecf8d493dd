"""Tiny hybrid targets on disk: qwen3_5 (dense, MoE) and qwen3_next, in mlx-lm's format.

Layers alternate GatedDeltaNet (linear attention, recurrent state) and full
attention, like the published models, at sizes that run in milliseconds. The
folders load through `engine.session.load_pair` exactly as users' checkpoints do.
`scripted_pair` swaps a loaded pair's drafts for a known continuation cut at
random points, to drive rounds through every accept length.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx

from engine.drafter import DFlashDrafter
from engine.drafter_config import parse_drafter_config
from engine.tiny_models import TOKENIZER_FILES, _save, _vocab_and_eos, build_target_model, drafter_config_dict

HYBRID_KINDS = ("qwen3_5", "qwen3_5_moe", "qwen3_next")


def _text_config(vocab_size: int, eos_id: int, hidden: int, layers: int, interval: int) -> dict[str, Any]:
    return {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": interval,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "eos_token_id": eos_id,
    }


def _moe_fields(hidden: int) -> dict[str, Any]:
    return {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": hidden,
        "shared_expert_intermediate_size": hidden,
        "norm_topk_prob": True,
    }


def hybrid_config(
    kind: str, vocab_size: int, eos_id: int, hidden: int = 64, layers: int = 6, interval: int = 3, **fields: Any
) -> dict[str, Any]:
    """A config.json for `kind` (one of HYBRID_KINDS), shaped like the published ones.

    qwen3_5 nests the text model under `text_config` (the checkpoints are
    multimodal wrappers); MoE is selected by `num_experts > 0`. qwen3_next is flat
    and always MoE (its `mlp_only_layers` may make some layers dense). `fields`
    override text-model fields (e.g. linear_key_head_dim).
    """
    text = {**_text_config(vocab_size, eos_id, hidden, layers, interval), **fields}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    if kind in ("qwen3_5", "qwen3_5_moe"):
        text.update(model_type="qwen3_5_text", rope_parameters=rope)
        arch = "Qwen3_5ForConditionalGeneration"
        if kind == "qwen3_5_moe":
            text.update(_moe_fields(hidden))
            arch = "Qwen3_5MoeForConditionalGeneration"
        return {
            "model_type": kind,
            "architectures": [arch],
            "tie_word_embeddings": True,
            "eos_token_id": eos_id,
            "torch_dtype": "float32",
            "text_config": text,
        }
    if kind == "qwen3_next":
        text.update(_moe_fields(hidden))
        text.update(
            model_type="qwen3_next",
            architectures=["Qwen3NextForCausalLM"],
            tie_word_embeddings=False,
            mlp_only_layers=[0],
            rope_theta=10000.0,
            partial_rotary_factor=0.25,
            torch_dtype="float32",
        )
        return text
    raise ValueError(f"unknown hybrid kind '{kind}'; expected one of {', '.join(HYBRID_KINDS)}.")


def sharpen(model: Any, memory: tuple[float, float] = (0.05, 1.0), logit_scale: float = 2.0) -> None:
    """Make a random hybrid target a sensitive test subject.

    mlx-lm initialises A_log from U(0, 16), so most heads forget their state within
    a step or two and a wrong recurrent state barely shows. Decay rates from
    `memory` keep the state alive over many tokens (g = exp(-A * softplus(a + dt_bias))
    is then ~0.3..0.9), and a larger final-norm weight spreads the logits, so a
    rollback error moves them by far more than floating-point noise.
    """
    from engine.hybrid_gdn import gdn_layers

    for _, mixer in gdn_layers(model):
        mixer.A_log = mx.log(mx.random.uniform(memory[0], memory[1], mixer.A_log.shape))
    model.model.norm.weight = model.model.norm.weight * logit_scale


def write_hybrid_target(
    out: Path, tokenizer_dir: Path, kind: str, seed: int = 0, dtype: Any = mx.float32, **dims: Any
) -> Path:
    """A random (sharpened) hybrid target of `kind` in mlx-lm's format, sharing `tokenizer_dir`'s tokenizer.

    `dims`: hybrid_config's hidden, layers, interval and text-model field overrides.
    """
    out.mkdir(parents=True, exist_ok=True)
    vocab, eos, _ = _vocab_and_eos(tokenizer_dir)
    config = hybrid_config(kind, vocab, eos, **dims)
    mx.random.seed(seed)
    model = build_target_model(config)
    sharpen(model)
    _save(model, out, dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config at the top level, with rope_theta where drafter configs expect it."""
    flat = {**config, **config.get("text_config", {})}
    if "rope_theta" not in flat:
        flat["rope_theta"] = (flat.get("rope_parameters") or {}).get("rope_theta")
    return flat


def write_hybrid_drafter(out: Path, target_dir: Path, seed: int = 1, dtype: Any = mx.bfloat16, **kwargs: Any) -> Path:
    """A random DFlash drafter for the hybrid target in `target_dir` (kwargs: see drafter_config_dict)."""
    out.mkdir(parents=True, exist_ok=True)
    tcfg = flat_config(json.loads((target_dir / "config.json").read_text()))
    _, _, mask_id = _vocab_and_eos(target_dir)
    raw = drafter_config_dict(tcfg, mask_id, **kwargs)
    cfg = parse_drafter_config(raw, out / "config.json")
    mx.random.seed(seed)
    _save(DFlashDrafter(cfg), out, dtype)
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    return out


class ScriptedDrafter:
    """Wraps a real drafter; drafts come from a known continuation, cut at a seeded random point.

    The wrapped drafter still runs every round, so its context cache (and its
    sliding window) goes through the real loop; only the draft tokens are
    replaced. Per round one position 0..L-1 is drawn: a draft there is made wrong,
    so the target accepts exactly that many (L-1: none wrong, all accepted).
    With the reference being greedy AR's own output, rounds cover every accept
    length, which exercises rollback far more than a briefly trained drafter.
    """

    def __init__(self, drafter: Any, reference: list[int], vocab_size: int, seed: int = 0):
        self.cfg = drafter.cfg
        self.inner = drafter
        self.reference = list(reference)
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)
        self.cuts: list[int] = []

    def make_cache(self) -> list:
        return self.inner.make_cache()

    def __call__(self, block_embeddings: mx.array, context: Any, cache: list, position: int) -> mx.array:
        self.inner(block_embeddings, context, cache, position)
        L = block_embeddings.shape[1]
        ids = [self.reference[p] if p < len(self.reference) else 0 for p in range(position + 1, position + L)]
        cut = self.rng.randrange(L)
        if cut < L - 1:
            ids[cut] = (ids[cut] + 1) % self.vocab_size
        self.cuts.append(cut)
        return mx.array([0] + ids, dtype=mx.float32)[None, :, None]  # token ids, read back by ScriptedHead


class ScriptedHead:
    """The target head, except that drafter logits put all the mass on ScriptedDrafter's ids."""

    def __init__(self, head: Any):
        self.inner = head

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def logits(self, codes: mx.array) -> mx.array:
        ids = codes[..., 0].astype(mx.int32)
        return (mx.arange(self.inner.vocab_size) == ids[..., None]).astype(mx.float32) * 30.0


def scripted_pair(pair: Any, reference: list[int], seed: int = 0) -> Any:
    """A copy of a loaded pair whose drafts follow `reference` (prompt + expected output ids)."""
    from dataclasses import replace

    drafter = ScriptedDrafter(pair.drafter, reference, pair.head.vocab_size, seed)
    return replace(pair, drafter=drafter, head=ScriptedHead(pair.head))
