"""The benchmark: AR and DFlash interleaved per prompt, in one process, reported as ratios."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from engine.runtime import blas
from engine.errors import DFlashError
from engine.decode.depth_stats import DepthStats, step_times
from engine.decode.events import RoundEvent, SummaryEvent, TextEvent
from engine.decode.stats import RoundStats
from engine.decode.cancel import CancelToken
from engine.decode.generate import generate
from engine.decode.prefill import check_prompt
from engine.decode.prompts import message_problem
from engine.decode.settings import GenerationSettings, SamplingSettings
from engine.tools.parity import round_in_ar_steps
from engine.models.pair import LoadedPair, activate
from engine.tools.textfiles import jsonl_strings


def load_prompts(path: str | Path, raw: bool = False) -> list[str]:
    """Prompts from JSONL: one {"prompt": "..."} object per line, or {"messages": [...]} for a conversation
    (kept as its JSON text, which the chat template reads as the conversation: engine/decode/prompts.py).
    `raw` (--raw: each prompt sent as it is) refuses conversations: raw, one would be its JSON text."""
    prompts = []
    for n, text in enumerate(jsonl_strings(path, "prompt", "the prompts file", or_list="messages"), 1):
        if not isinstance(text, str):
            if raw:
                raise DFlashError(f"{path}: prompt {n} is a conversation (\"messages\"), which goes through the "
                                  "chat template; run without --raw.")
            problem = message_problem(text)  # ShareGPT's "from"/"value" would go in as one message of JSON
            if problem is not None:
                raise DFlashError(f"{path}: prompt {n}: {problem}.")
            text = json.dumps(text, ensure_ascii=False)
        prompts.append(text)
    if not prompts:
        raise DFlashError(f"{path}: no prompts in the file.")
    return prompts


def run_once(pair, ids, settings, cancel) -> tuple[SummaryEvent, list[RoundEvent], list[TextEvent]]:
    """One generation: its summary, its rounds and its text events."""
    rounds, texts, summary = [], [], None
    for event in generate(pair, ids, settings, cancel):
        if isinstance(event, RoundEvent):
            rounds.append(event)
        elif isinstance(event, TextEvent):
            texts.append(event)
        elif isinstance(event, SummaryEvent):
            summary = event
    return summary, rounds, texts


def warm_up(pair, prompt_ids: Sequence[list[int]], ar_settings, df_settings, cancel) -> None:
    """A short AR and DFlash run first, so kernels, caches (and the cost curve) are ready. It runs
    the prompts in order until the target writes more than one token: where it ends at its first,
    no round runs, and the first measured prompt would pay for compiling the round's kernels."""
    run_once(pair, prompt_ids[0], replace(ar_settings, max_tokens=min(16, ar_settings.max_tokens)), cancel)
    warm = replace(df_settings, max_tokens=min(32, df_settings.max_tokens))
    for ids in prompt_ids:
        summary = run_once(pair, ids, warm, cancel)[0]
        if warm.max_tokens == 1 or summary is None or summary.num_generated > 1:
            return


def tok_per_s(summaries: list[SummaryEvent]) -> float:
    """Generated tokens over decode time, pooled over runs."""
    return sum(s.num_generated for s in summaries) / max(sum(s.decode_s for s in summaries), 1e-9)


def check_prompts(pair: LoadedPair, prompts: list[tuple[str, list[int]]], max_tokens: int) -> None:
    """Every prompt checked before any is measured."""
    for n, (text, ids) in enumerate(prompts, 1):
        try:
            check_prompt(pair, ids, max_tokens)
        except DFlashError as exc:
            raise DFlashError(f"prompt {n} ({text[:40]!r}): {exc}") from None


def mlx_lm_responses(pair: LoadedPair, ids: list[int], max_tokens: int, sampling: Optional[SamplingSettings] = None,
                     **kwargs) -> Iterator[Any]:
    """mlx-lm's own stream_generate on the target and prompt, response by response, our taps not
    recording: the reference loops (`kwargs`: e.g. its draft_model and num_draft_tokens). Greedy, or
    at T > 0 mlx-lm's sampler at the run's settings and seed, so both loops do the same kind of work."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    from engine.runtime.streams import STREAM

    if pair.taps is not None:
        pair.taps.recording = False
    if sampling is not None and sampling.temperature > 0:
        from mlx_lm.sample_utils import make_sampler

        mx.random.seed(sampling.seed)
        kwargs["sampler"] = make_sampler(sampling.temperature, top_p=sampling.top_p, min_p=sampling.min_p,
                                         top_k=sampling.top_k)
    with mx.stream(STREAM):
        yield from stream_generate(pair.target, pair.tokenizer, mx.array(ids), max_tokens=max_tokens, **kwargs)


def mlx_lm_tok_s(pair: LoadedPair, ids: list[int], max_tokens: int, sampling: Optional[SamplingSettings] = None) -> float:
    """mlx-lm's own generation on the same model and prompt: its generation tok/s."""
    last = None
    for last in mlx_lm_responses(pair, ids, max_tokens, sampling):
        pass
    return float(last.generation_tps)


def speedup_range(ar: list[SummaryEvent], df: list[SummaryEvent]) -> Optional[list[float]]:
    """The lowest and highest ratio of a repeat's DFlash run to its AR run, or None under two
    repeats that decoded: how far one run strays from the pooled figure on this machine."""
    def counts(s: SummaryEvent) -> bool:
        return s.num_generated > 1 and s.tok_per_s > 0 and s.stop_reason != "cancelled"

    return ratio_range([d.tok_per_s / a.tok_per_s for a, d in zip(ar, df) if counts(a) and counts(d)])


def ratio_range(ratios: list[float]) -> Optional[list[float]]:
    """[lowest, highest] of paired speed ratios, or None under two: one pair has no spread."""
    return [round(min(ratios), 4), round(max(ratios), 4)] if len(ratios) > 1 else None


def mean_verified(rounds: list[RoundEvent]) -> Optional[float]:
    """The rows a drafting round verified, on average (None without one)."""
    rows = [r.verified for r in rounds if r.drafted and r.verified]
    return round(sum(rows) / len(rows), 3) if rows else None


def figures(ar: list[SummaryEvent], df: list[SummaryEvent], rounds: list[RoundEvent]) -> dict:
    ar_tok_s, df_tok_s = tok_per_s(ar), tok_per_s(df)
    stats = RoundStats.of(rounds)
    return {
        "ar_tok_s": round(ar_tok_s, 3),
        "dflash_tok_s": round(df_tok_s, 3),
        # No rounds (the output ended at its first token): both runs were one prefill, so a ratio
        # would be noise, not a speedup.
        "speedup": round(df_tok_s / ar_tok_s, 4) if ar_tok_s and rounds else None,
        "rounds": stats.rounds,  # rounds that verified; auto's plain steps are plain_steps
        "mean_acceptance_length": stats.tau,
        "draft_ms": stats.mean_draft_ms,
        "verify_ms": stats.mean_verify_ms,
        "mean_verified": mean_verified(rounds),  # rows a round's verify ran (a tree's nodes, or anchor + drafts)
        "rollback_ms": stats.mean_rollback_ms,
        "plain_steps": stats.plain_steps,  # auto's plain steps: no rounds, left out of the round figures
        "round_ms": stats.mean_round_ms,
        "round_in_ar_steps": round_in_ar_steps(sum(stats.round_wall_ms) / 1000, stats.rounds, ar_tok_s),
        "acceptance_by_position": stats.per_position_acceptance,
        "identical": all(a.token_ids == d.token_ids for a, d in zip(ar, df)),
        "ar_tokens": sum(s.num_generated for s in ar),
        "dflash_tokens": sum(s.num_generated for s in df),
    }


def run_bench(
    pair: LoadedPair,
    prompts: list[tuple[str, list[int]]],
    settings: GenerationSettings,
    repeats: int = 1,
    progress: Callable[[str], None] = lambda msg: None,
    cancel: Optional[CancelToken] = None,
    with_mlx_lm: bool = False,
    others: Sequence[LoadedPair] = (),
) -> dict:
    """Warm up, then per prompt and repeat run AR then DFlash; overall and per-prompt figures.
    `others` (pairs from attach_drafter): each other drafter also runs after every AR run, and is
    reported under "compared" against the same AR runs."""
    if repeats < 1:
        raise DFlashError(f"repeats {repeats} must be at least 1.")
    settings.resolved(pair)
    check_prompts(pair, prompts, settings.max_tokens)
    ar_settings, df_settings = replace(settings, mode="ar"), replace(settings, mode="dflash")
    all_ids = [ids for _, ids in prompts]
    progress("warm-up")
    warm_up(activate(pair), all_ids, ar_settings, df_settings, cancel)
    for other in others:
        warm_up(activate(other), all_ids, ar_settings, df_settings, cancel)
    if with_mlx_lm:
        mlx_lm_tok_s(pair, all_ids[0], min(16, settings.max_tokens))
    per_prompt, all_ar, all_df, all_rounds, ratios = [], [], [], [], []
    depth = DepthStats()
    compared = [{"per_prompt": [], "df": [], "rounds": []} for _ in others]
    interrupted = False  # Ctrl-C: the prompts measured so far are reported, the one cut short is not
    try:
        for n, (text, ids) in enumerate(prompts, 1):
            ar_runs, df_runs, rounds, reference, steps, runs_rounds = [], [], [], [], [], []
            other_runs = [([], []) for _ in others]
            for r in range(repeats):
                progress(f"prompt {n}/{len(prompts)}, repeat {r + 1}/{repeats}")
                summary, _, texts = run_once(pair, ids, ar_settings, cancel)
                ar_runs.append(summary)
                steps += step_times(texts, len(ids))
                summary, rs, _ = run_once(activate(pair), ids, df_settings, cancel)
                df_runs.append(summary)
                rounds += rs
                runs_rounds.append(rs)  # by depth: each run's rounds on their own clock
                for other, (summaries, other_rounds) in zip(others, other_runs):
                    summary, rs, _ = run_once(activate(other), ids, df_settings, cancel)
                    summaries.append(summary)
                    other_rounds += rs
                if with_mlx_lm:
                    reference.append(mlx_lm_tok_s(pair, ids, settings.max_tokens, settings.sampling))
            row = {"prompt": text, "prompt_tokens": len(ids), **figures(ar_runs, df_runs, rounds),
                   "speedup_range": speedup_range(ar_runs, df_runs)}
            if with_mlx_lm:
                # Medians over repeats; the ratio says whether our AR baseline is as fast as mlx-lm's.
                row["mlx_lm_tok_s"] = round(statistics.median(reference), 3)
                row["ar_vs_mlx_lm"] = round(statistics.median(s.tok_per_s for s in ar_runs) / row["mlx_lm_tok_s"], 4)
                ratios.append(row["ar_vs_mlx_lm"])
            per_prompt.append(row)
            for c, (summaries, other_rounds) in zip(compared, other_runs):
                c["per_prompt"].append({"prompt": text, "prompt_tokens": len(ids),
                                        **figures(ar_runs, summaries, other_rounds),
                                        "speedup_range": speedup_range(ar_runs, summaries)})
                c["df"] += summaries
                c["rounds"] += other_rounds
            all_ar += ar_runs
            all_df += df_runs
            all_rounds += rounds
            depth.add_steps(steps)
            for rs in runs_rounds:
                depth.add_rounds(rs)
    except KeyboardInterrupt:
        if not per_prompt:
            raise
        interrupted = True
    overall = figures(all_ar, all_df, all_rounds)
    if with_mlx_lm:
        overall["ar_vs_mlx_lm"] = round(statistics.median(ratios), 4)
    if others:  # the same AR runs against each other drafter
        overall["compared"] = [
            {"drafter": str(o.drafter_path), **o.drafter.cfg.generation_facts(),
             **figures(all_ar, c["df"], c["rounds"]), "per_prompt": c["per_prompt"]}
            for o, c in zip(others, compared)]
        overall["drafter"] = str(pair.drafter_path)
        overall.update(pair.drafter.cfg.generation_facts())
    resolved = df_settings.resolved(pair)
    return {
        **overall,
        "prompts": len(per_prompt),
        "interrupted": interrupted,  # then "prompts" counts those measured, of "prompts_given"
        "prompts_given": len(prompts),
        "repeats": repeats,
        "max_tokens": settings.max_tokens,
        "block_size": resolved.block_size,
        "auto": resolved.auto,  # block_size then caps each round's verify length
        "lookup": resolved.lookup,  # rounds verify a copy of the context instead where the text repeats it
        "temperature": settings.sampling.temperature,
        "sampling": asdict(settings.sampling),  # top-p, top-k, min-p, seed too
        "blas": blas.status,
        "target": str(pair.target_path),  # which models and rollback ran, for results compared later
        "drafter": str(pair.drafter_path),
        "rollback": settings.rollback,
        "per_prompt": per_prompt,
        "by_depth": [b.to_dict() for b in depth.rows()],
        **({"distributed": pair.distributed_facts()} if pair.ranks.sharded else {}),
    }
