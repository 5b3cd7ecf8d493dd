"""The compatibility doctor: can this drafter run with this target? Checked from files only."""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import mlx.core as mx

from engine.models.checkpoint import check_drafter_weights, read_tensor_shapes, tensor_dtype
from engine.decode.settings import DEFAULTS, draft_context_text
from engine.models.drafter_config import SLIDING, DrafterConfig, flat_config, load_drafter_config, read_config_json
from engine.errors import DFlashError, LoadCancelled
from engine.models.paths import Progress, resolve_model_path
from engine.json_text import is_int, is_number


@dataclass
class DoctorReport:
    ok: bool
    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # it runs, exactly, but not as the user may think

    def text(self) -> str:
        lines = [f"{k}: {v}" for k, v in self.facts.items()]
        lines += [f"warning: {w}" for w in self.warnings]
        if self.ok:
            lines.append("verdict: ready")
        else:
            lines += [f"problem: {p}" for p in self.problems]
            lines.append("verdict: cannot run")
        return "\n".join(lines)


REQUIRED_TARGET_FIELDS = ("num_hidden_layers", "hidden_size", "vocab_size")


def target_dims(config: dict[str, Any]) -> dict[str, Any]:
    """The sizes the doctor checks a drafter against, and the quantization where there is one."""
    merged = flat_config(config)
    dims = {k: merged.get(k) for k in ("model_type", *REQUIRED_TARGET_FIELDS)}
    quantized = quantization_line(merged)
    return {**dims, "quantization": quantized} if quantized is not None else dims


# Far past any published model: a size beyond these is a corrupt or hostile config, and building
# the model from it would exhaust memory before any weight is read.
TARGET_LIMITS = {"num_hidden_layers": 1024, "hidden_size": 1 << 17, "vocab_size": 1 << 23,
                 "intermediate_size": 1 << 20, "num_attention_heads": 4096, "num_key_value_heads": 4096,
                 "head_dim": 4096, "max_position_embeddings": 1 << 30}


def check_target_sizes(config_file: Path, config: dict[str, Any]) -> None:
    """The target's sizes are positive integers within TARGET_LIMITS, and its heads divide."""
    for key, limit in TARGET_LIMITS.items():
        value = config.get(key)
        if value is None:
            if key in REQUIRED_TARGET_FIELDS:
                raise DFlashError(f"{config_file}: required field '{key}' is missing.")
            continue
        if not is_int(value) or not 0 < value <= limit:
            raise DFlashError(f"{config_file}: field '{key}' should be a positive integer up to {limit}, "
                              f"found {value!r}.")
    if not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise DFlashError(f"{config_file}: field 'model_type' should name the model family, found "
                          f"{config.get('model_type')!r}.")
    for key, high in (("rope_theta", 1e12), ("rms_norm_eps", 1.0), ("layer_norm_eps", 1.0)):
        value = config.get(key)
        if value is not None and (not is_number(value) or not 0 < value < high):
            raise DFlashError(f"{config_file}: field '{key}' should be a positive number below {high:g}, "
                              f"found {value!r}.")
    if "tie_word_embeddings" in config and not isinstance(config["tie_word_embeddings"], bool):
        raise DFlashError(f"{config_file}: field 'tie_word_embeddings' should be true or false, found "
                          f"{config['tie_word_embeddings']!r}.")
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise DFlashError(f"{config_file}: 'num_attention_heads' {heads} is not a multiple of "
                          f"'num_key_value_heads' {kv}.")
    if heads and not config.get("head_dim") and config["hidden_size"] % heads:
        raise DFlashError(f"{config_file}: 'hidden_size' {config['hidden_size']} is not a multiple of "
                          f"'num_attention_heads' {heads} (and no 'head_dim' is given).")


def check_target_files(path: Path, role: str = "target") -> dict[str, Any]:
    """A model folder's files (`role` names it in the messages: the target, or a draft model)."""
    config = read_config_json(path)
    check_target_sizes(path / "config.json", flat_config(config))  # the required sizes among them
    dims = target_dims(config)
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise DFlashError(f"{path}: no *.safetensors weights in the {role} folder.")
    check_shards_present(path)
    check_tokenizer_present(path, role)
    shapes = {}
    for w in weights:
        shapes.update({name: (shape, w.name) for name, shape in read_tensor_shapes(w).items()})
    check_config_against_weights(path / "config.json", dims, shapes)
    check_quantization_declared(path / "config.json", config, shapes)
    largest, (_, file) = max(shapes.items(), key=lambda item: math.prod(item[1][0]))
    return {**dims, "weights_dtype": tensor_dtype(path / file, largest)}  # the dtype most of the weights have


def check_quantization_declared(config_file: Path, config: dict[str, Any],
                                shapes: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """Quantized weights (a layer's `.scales` beside its packed weight) need the config's
    'quantization' entry, which tells mlx-lm to build quantized layers: without it, loading fails with
    a list of hundreds of unexpected parameters (a 4-bit download given its original config.json)."""
    if any(k in config for k in ("quantization", "quantization_config")) or any(
            isinstance(v, dict) and ("quantization" in v or "quantization_config" in v) for v in config.values()):
        return
    scaled = next((n for n in shapes if n.endswith(".scales") and n[: -len(".scales")] + ".weight" in shapes), None)
    if scaled is not None:
        raise DFlashError(f"{config_file}: the weights are quantized ({scaled} in {shapes[scaled][1]}) but the "
                          "config has no 'quantization' entry; use the config.json that came with these weights.")


# Files a tokenizer is read from (one is enough): Hugging Face's fast and slow tokenizers, SentencePiece,
# tiktoken. A model folder with none of them loads its weights and then fails in the tokenizer.
# tiktoken (Qwen-1's qwen.tiktoken, Kimi's tiktoken.model) and Mistral's tekken.json too; a tokenizer
# built by the repo's own code (tokenizer_config.json's auto_map) may need no file of these.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tekken.json")


def check_tokenizer_present(path: Path, role: str = "target") -> None:
    if any((path / name).is_file() for name in TOKENIZER_FILES) or any(path.glob("*tiktoken*")):
        return
    try:
        if "auto_map" in json.loads((path / "tokenizer_config.json").read_text()):
            return
    except (OSError, ValueError, TypeError):
        pass
    raise DFlashError(f"{path}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}); the {role} cannot read a "
                      "prompt. Copy its tokenizer files into the folder, or download the model again.")


def check_shards_present(path: Path) -> None:
    """Every weight file the shard index names is there (an interrupted download leaves some out:
    the layers they hold would otherwise read as a config that does not fit its weights)."""
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return
    try:
        files = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
    except (OSError, ValueError, AttributeError):
        raise DFlashError(f"{index}: not a shard index (JSON with a 'weight_map'); download the model again.") from None
    missing = [f for f in files if not (path / str(f)).is_file()]
    if missing:
        raise DFlashError(f"{path}: weight file {missing[0]} (of {len(files)} in model.safetensors.index.json) is "
                          "missing; the download did not finish or the file was removed: download it again.")


def check_config_against_weights(config_file: Path, dims: dict[str, Any],
                                 shapes: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """The target's config.json against its own weights (names and shapes only): a config that does
    not fit them was once reported as the drafter's fault, its taps or vocabulary checked against
    the config's wrong sizes."""
    embed = next((n for n in shapes if n.endswith("model.embed_tokens.weight")), None)  # not a vision tower's
    if embed is not None:
        (rows, *_), file = shapes[embed]
        if rows != dims["vocab_size"]:
            raise DFlashError(f"{config_file}: 'vocab_size' is {dims['vocab_size']} but the weights' embedding "
                              f"({embed} in {file}) has {rows} rows; the config does not match its weights.")
    found = {int(m.group(1)) for n in shapes if (m := re.search(r"(?:^|\.)layers\.(\d+)\.", n))}
    if found and dims["num_hidden_layers"] > max(found) + 1:
        raise DFlashError(f"{config_file}: 'num_hidden_layers' is {dims['num_hidden_layers']} but the weights "
                          f"hold layers 0..{max(found)}; the config does not match its weights.")


def check_compatibility(target_path: Path, dims: dict[str, Any], drafter_path: Path, cfg: DrafterConfig) -> list[str]:
    cfg_file = drafter_path / "config.json"
    problems = []
    layers = dims["num_hidden_layers"]
    bad_taps = [i for i in cfg.target_layer_ids if not 0 <= i < layers]
    if bad_taps:
        problems.append(
            f"{cfg_file}: 'dflash_config.target_layer_ids' has {bad_taps[0]}, outside the target's "
            f"{layers} layers (0..{layers - 1}); this drafter was made for another target."
        )
    if cfg.hidden_size != dims["hidden_size"]:
        problems.append(
            f"{cfg_file}: 'hidden_size' is {cfg.hidden_size} but the target's is {dims['hidden_size']} "
            f"({target_path / 'config.json'}); this drafter was made for another target."
        )
    if cfg.vocab_size != dims["vocab_size"]:
        problems.append(
            f"{cfg_file}: 'vocab_size' is {cfg.vocab_size} but the target's is {dims['vocab_size']} "
            f"({target_path / 'config.json'}); the two do not share a tokenizer."
        )
    if not 0 <= cfg.mask_token_id < dims["vocab_size"]:
        problems.append(
            f"{cfg_file}: 'mask_token_id' {cfg.mask_token_id} is outside the target's vocabulary "
            f"(0..{dims['vocab_size'] - 1})."
        )
    return problems


def training_record(drafter_path: Path) -> dict:
    """train-drafter's record in a drafter's folder ({} when there is none, or none readable)."""
    from engine.models.checkpoint import MADE_BY_FILE

    try:
        record = json.loads((drafter_path / MADE_BY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def check_not_a_training_run(path: Path) -> None:
    """A train-drafter run that did not finish leaves only its checkpoint (no drafter yet), and the
    checkpoint folder holds the optimizer's state beside the weights: each read as a broken drafter
    ('config.json is missing', '30 extra tensors'), with no word of what they are."""
    if (path / "state.json").is_file() and (path / "optimizer.safetensors").is_file():
        raise DFlashError(f"{path}: a train-drafter checkpoint, not a drafter (the weights with the optimizer's "
                          f"state); its run writes the drafter to {path.parent} when it finishes: train-drafter "
                          f"--out {path.parent} --resume with the run's settings.")
    if not (path / "config.json").is_file() and any((path / name / "state.json").is_file()
                                                       for name in ("checkpoint", "checkpoint.old", "checkpoint.tmp")):
        raise DFlashError(f"{path}: no drafter yet, only the checkpoint of a train-drafter run that did not "
                          f"finish; finish it with train-drafter --out {path} --resume (and the run's settings).")


def trained_for(drafter_path: Path, target_path: Path, record: dict, quantized: Optional[str] = None) -> Optional[str]:
    """A warning when train-drafter's `record` names another target than this one (same shapes, so
    nothing else tells: its drafts are then rarely accepted; the output stays exact). None without a
    record, or for the target it names. `quantized`: the target's quantization_line, if any."""
    from engine.models.checkpoint import MADE_BY_FILE, model_name, target_fingerprint

    try:
        made_for = record.get("target") or {}
        fingerprint = made_for.get("fingerprint")
        if not isinstance(fingerprint, str) or fingerprint == target_fingerprint(target_path):
            return None
    except (OSError, ValueError, AttributeError, DFlashError):
        return None
    said = (f"{model_name(drafter_path)} was trained for other target weights than these "
            f"({made_for.get('name', '?')}, its {MADE_BY_FILE} says)")
    if quantized is not None:  # run 4-bit what was trained on bf16: common, and it drafts as well
        return (f"{said}; these are quantized ({quantized}): if they are a quantized copy of that model its drafts "
                "are accepted about as often (the demo drafter on a 4-bit demo target: tau 9.5 on six prompts at "
                "block 16, as on the unquantized one), otherwise rarely (outputs stay exact).")
    return f"{said}: unless this is the same model saved again, expect its drafts to be rarely accepted (outputs stay exact)."


# About what a round costs in AR steps (docs/performance.md): a drafter whose rounds commit fewer
# tokens than this (its held-out tau estimate, bonus counted) makes decoding slower, whatever its block.
BARELY_TRAINED_TAU = 2.0


def barely_trained(drafter_path: Path, record: dict, block: int) -> Optional[str]:
    """A warning when train-drafter's `record` says the drafter's last held-out tau estimate is too low
    for DFlash to pay (a few steps on little text): so a user does not read its bench noise as its worth."""
    from engine.models.checkpoint import MADE_BY_FILE

    try:
        final = record.get("final") or {}
        tau, step = float(final["tau_estimate"]), int(final["step"])
    except (ValueError, AttributeError, KeyError, TypeError):
        return None
    if tau >= min(BARELY_TRAINED_TAU, 1 + (block - 1) / 2):  # a block of 2 commits 2 at most
        return None
    return (f"{drafter_path.name} is barely trained: after {step:,} steps its held-out tau estimate is {tau:.2f} "
            f"({MADE_BY_FILE}); a round costs 1.4 to 2 AR steps on the demo pairs, so expect few drafts accepted "
            "and a run no faster than AR. Train it longer: train-drafter --init it --out another folder.")


# What a user with a quantized target on the CPU is told: MLX's CPU quantized matmul does not batch
# rows, so a verify there costs several AR steps (docs/performance.md, "Quantized and 16-bit targets").
QUANTIZED_ON_CPU = ("the target is quantized and runs on the CPU, where MLX multiplies quantized weights "
                    "about one row at a time: a 16-token verify of the 4-bit demo target costs 4.0 AR steps "
                    "(1.45 unquantized, at a 32-token depth), more in bfloat16; expect DFlash to gain much less "
                    "here (that pair: 2.1x AR where unquantized 5.6x; auto verify length measures it)")


# What a user with a 16-bit target on the CPU is told, and the float32 copy that runs faster there
# (the figures: docs/performance.md, "Quantized and 16-bit targets").
HALF_DTYPES = {"BF16": "bfloat16", "F16": "float16"}
HALF_ON_CPU = ("the target's weights are {dtype} and run on the CPU, where MLX computes in 16-bit floats slowly: the "
               "demo target in bfloat16 decoded AR at 0.74x its float32 speed and DFlash at 0.43x (a 16-token verify "
               "2.4 AR steps against 1.5, a 16-position draft 13.8 ms against 7.5), so DFlash ran at 3.5x AR where "
               "float32 ran 6.0x; for runs on this machine a float32 copy is faster: python -m mlx_lm convert "
               "--hf-path {target} --mlx-path <new folder> --dtype float32")


def quantization_line(config: dict[str, Any]) -> Optional[str]:
    """'4 bits, group 64, affine' from a config's quantization entry (mlx-lm's), or None."""
    q = config.get("quantization") or config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    parts = [f"{q['bits']} bits" if "bits" in q else None, f"group {q['group_size']}" if "group_size" in q else None,
             str(q.get("mode") or q.get("quant_method") or "affine")]
    return ", ".join(p for p in parts if p)


def check_pair(target: str | Path, drafter: str | Path | None, download: bool = True,
               kernels: bool = True, progress: Optional[Progress] = None,
               should_cancel: Callable[[], bool] = lambda: False) -> DoctorReport:
    """The doctor's report, from files. kernels=False skips the GatedDeltaNet kernel check, which
    may compile and self-check a GPU kernel: the window's GUI thread passes False. A Hugging Face id
    not in the cache is downloaded (with `download`), reported to `progress`; LoadCancelled when
    `should_cancel` stops it."""
    report = DoctorReport(ok=False)
    dims = cfg = None
    try:
        target_path = resolve_model_path(target, download=download, progress=progress, should_cancel=should_cancel)
        report.facts["target"] = str(target_path)
        dims = check_target_files(target_path)
        report.facts.update({f"target_{k}": v for k, v in dims.items()})
    except LoadCancelled:
        raise
    except DFlashError as exc:
        report.problems.append(str(exc))
    if drafter is None:  # "ready" alone read as ready for DFlash, which then refused to start
        report.facts["drafter_given"] = "none: AR only (DFlash, parity and bench need --drafter)"
    if drafter is not None:
        try:
            drafter_path = resolve_model_path(drafter, download=download, progress=progress,
                                              should_cancel=should_cancel)
            report.facts["drafter"] = str(drafter_path)
            check_not_a_training_run(drafter_path)
            cfg = load_drafter_config(drafter_path)
            report.facts.update(cfg.generation_facts())
            check_drafter_weights(drafter_path, cfg, dims["vocab_size"] if dims else None)
            report.facts.update(
                drafter_layers=cfg.num_hidden_layers,
                drafter_layer_types=",".join(sorted(set(cfg.layer_types))),
                target_layer_ids=cfg.target_layer_ids,
                block_size=cfg.block_size,
                mask_token_id=cfg.mask_token_id,
                rope_theta=cfg.rope_theta,
            )
            if any(t != SLIDING for t in cfg.layer_types):
                report.facts["draft_context_default"] = draft_context_text(DEFAULTS.draft_window, DEFAULTS.draft_sink)
        except LoadCancelled:
            raise
        except DFlashError as exc:
            report.problems.append(str(exc))
        if dims is not None and cfg is not None:
            report.problems += check_compatibility(target_path, dims, drafter_path, cfg)
            record = training_record(drafter_path)
            for warning in (trained_for(drafter_path, target_path, record, dims.get("quantization")),
                            barely_trained(drafter_path, record, cfg.block_size)):
                if warning is not None:
                    report.warnings.append(warning)
    if dims is not None:
        from engine.models.gdn_tape import HYBRID_MODEL_TYPES, rollback_fact

        report.facts["rollback"] = rollback_fact(dims["model_type"])
        if kernels and dims["model_type"] in HYBRID_MODEL_TYPES:
            from kernels.gated_delta import kernel_status

            report.facts["gated_delta"] = kernel_status()
    from engine.models.kernel_dispatch import kernels_status
    from engine.runtime import blas
    from engine.runtime.streams import STREAM

    report.facts["kernels"] = kernels_status(STREAM.device)
    report.facts["blas"] = blas.status
    if dims is not None and dims.get("quantization") and STREAM.device == mx.cpu:  # target_quantization: from dims
        report.warnings.append(QUANTIZED_ON_CPU)
    elif dims is not None and dims.get("weights_dtype") in HALF_DTYPES and STREAM.device == mx.cpu:
        report.warnings.append(HALF_ON_CPU.format(dtype=HALF_DTYPES[dims["weights_dtype"]],
                                                   target=shlex.quote(str(target_path))))
    report.ok = not report.problems
    return report
