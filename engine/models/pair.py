"""Load a target/drafter pair after the doctor has passed it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

import mlx.core as mx
import mlx.nn as nn

from engine.decode.cost_curve_data import CurveStore
from engine.models.kernel_dispatch import install_drafter_kernels, install_kernels
from engine.models.doctor import check_pair
from engine.models.drafter import DFlashDrafter
from engine.models.drafter_load import load_drafter
from engine.errors import DFlashError, IncompatiblePairError, LoadCancelled
from engine.runtime.distributed import SINGLE, Ranks, collective_ms
from engine.runtime.streams import STREAM
from engine.models.taps import TapRecorder, install_taps, remove_taps
from engine.models.sharding import PIPELINE, load_sharded
from engine.models.target import TargetHead, load_target, rollback_kind

ProgressFn = Callable[[str, float], None]


@dataclass
class LoadedPair:
    target: nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper
    target_path: Path
    target_config: dict[str, Any]
    head: TargetHead
    drafter: Optional[DFlashDrafter] = None
    drafter_path: Optional[Path] = None
    taps: Optional[TapRecorder] = None
    ranks: Ranks = SINGLE
    sharding: Optional[str] = None  # "tensor" or "pipeline" when the target is split across ranks
    collective_ms: float = 0.0  # one all_sum of a block's hidden states across the ranks
    cpu_kernels: tuple[str, ...] = ()  # mlx-lm functions dispatched to kernels/ (engine/models/kernel_dispatch.py)
    draft_models: dict[str, Any] = field(default_factory=dict)  # path -> engine.models.draft_model.DraftModel
    curves: CurveStore = field(default_factory=CurveStore)  # cost curves measured but not (yet) on disk
    warnings: list[str] = field(default_factory=list)  # the doctor's (a drafter trained for another target)

    def collectives_per_round(self) -> int:
        """Collectives in one verify forward and its agreement: tensor parallel sums the attention (or
        linear attention) and MLP outputs of every layer (and gathers an untied head); a pipeline
        passes the hidden state once per stage and gathers it, and sums the taps. Plus one broadcast
        of rank 0's decision."""
        if self.sharding == PIPELINE:
            return (self.ranks.size - 1) + 1 + (1 if self.taps is not None else 0) + 1
        return 2 * self.head.num_layers + (1 if self.head.sharding_group is not None else 0) + 1

    def distributed_facts(self) -> dict[str, Any]:
        """How the target is split across the ranks of an mlx.launch job (facts()' "distributed")."""
        return {"ranks": self.ranks.size, "backend": self.ranks.backend, "sharding": self.sharding,
                "collective_ms": round(self.collective_ms, 4), "collectives_per_round": self.collectives_per_round()}

    def facts(self) -> dict[str, Any]:
        facts = {
            "target": str(self.target_path),
            "target_type": self.head.model_type,
            "target_layers": self.head.num_layers,
            "hidden_size": self.head.hidden_size,
            "vocab_size": self.head.vocab_size,
            "dtype": str(self.head.dtype).replace("mlx.core.", ""),
            "rollback": rollback_kind(self.target),
            "cpu_kernels": bool(self.cpu_kernels),
        }
        if self.ranks.sharded:
            facts["distributed"] = self.distributed_facts()
        if self.drafter is not None:
            cfg = self.drafter.cfg
            facts.update(
                drafter=str(self.drafter_path),
                drafter_layers=cfg.num_hidden_layers,
                **cfg.generation_facts(),
                target_layer_ids=cfg.target_layer_ids,
                block_size=cfg.block_size,
                mask_token_id=cfg.mask_token_id,
            )
        return facts


def load_pair(
    target: str | Path,
    drafter: str | Path | None,
    progress: Optional[ProgressFn] = None,
    should_cancel: Callable[[], bool] = lambda: False,
    ranks: Ranks = SINGLE,
) -> LoadedPair:
    """Check, then load. Raises DFlashError with the doctor's sentence when the pair cannot run.
    With `ranks` of an `mlx.launch` job, the target is sharded across them and the drafter
    replicated on each."""
    with mx.stream(STREAM):
        return _load_pair(target, drafter, progress, should_cancel, ranks)


def _load_pair(target, drafter, progress, should_cancel, ranks: Ranks) -> LoadedPair:
    say = progress or (lambda stage, frac: None)

    def stage(name: str, frac: float) -> None:
        if should_cancel():
            raise LoadCancelled("loading was cancelled.")
        say(name, frac)

    stage("checking the pair", 0.0)
    report = check_pair(target, drafter, progress=lambda what, frac: say(what, 0.1 * frac),
                        should_cancel=should_cancel)
    if not report.ok:
        raise IncompatiblePairError(report.problems[0])
    target_path = Path(report.facts["target"])
    stage("loading target", 0.1)
    sharding = None
    if ranks.sharded:
        model, tokenizer, config, sharding = load_sharded(target_path, ranks)
    else:
        model, tokenizer, config = load_target(target_path)
    head = TargetHead(model)
    cpu_kernels = tuple(install_kernels(model, STREAM.device))
    pair = LoadedPair(model, tokenizer, target_path, config, head, ranks=ranks, sharding=sharding,
                      cpu_kernels=cpu_kernels, warnings=list(report.warnings))
    if drafter is not None:
        stage("loading drafter", 0.8)
        pair.drafter_path = Path(report.facts["drafter"])
        pair.drafter = load_drafter(pair.drafter_path, head.dtype)
        install_drafter_kernels(pair.drafter, STREAM.device)
        pair.taps = install_taps(model, pair.drafter.cfg.target_layer_ids,
                                 ranks.group if sharding == PIPELINE else None)
    if ranks.sharded:
        block = pair.drafter.cfg.block_size if pair.drafter is not None else 1
        pair.collective_ms = collective_ms(ranks, (1, block, head.hidden_size), head.dtype)
    stage("ready", 1.0)
    return pair


def attach_drafter(pair: LoadedPair, drafter: str | Path) -> LoadedPair:
    """Another drafter on the same loaded target, checked as `doctor` checks a pair (bench compares
    drafters in one run this way without loading the target twice). Call `activate` before
    running either: the target's taps follow one drafter at a time."""
    if pair.ranks.sharded:
        raise DFlashError("comparing drafters is not available in a sharded (mlx.launch) run; bench each.")
    report = check_pair(pair.target_path, drafter)
    if not report.ok:
        raise IncompatiblePairError(report.problems[0])
    path = Path(report.facts["drafter"])
    with mx.stream(STREAM):
        other = load_drafter(path, pair.head.dtype)
    install_drafter_kernels(other, STREAM.device)
    return replace(pair, drafter=other, drafter_path=path, taps=None)


def activate(pair: LoadedPair) -> LoadedPair:
    """Tap the target's layers for this pair's drafter (a no-op when they already are)."""
    if pair.drafter is None or (pair.taps is not None and _installed(pair)):
        return pair
    remove_taps(pair.target)
    pair.taps = install_taps(pair.target, pair.drafter.cfg.target_layer_ids,
                             pair.ranks.group if pair.sharding == PIPELINE else None)
    return pair


def _installed(pair: LoadedPair) -> bool:
    from engine.models.target import decoder_layers

    layers = decoder_layers(pair.target)
    ids = pair.taps.layer_ids
    return all(layers[i].__dict__.get("_dflash_tap", (None,))[0] is pair.taps for i in ids)
