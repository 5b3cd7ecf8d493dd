"""The race: every way to speed up the same target, on every prompt, in one process.

`bench --methods ar,dflash,dflash-auto,lookup,dflash+lookup,dflash-tree,draft-model`: per prompt AR runs once
and every other method after it (each repeat in that order), with the same sampling settings; per
method and prompt the tok/s, speedup against those AR runs, tau and whether the greedy output is
AR's. With `with_mlx_lm`, mlx-lm's own speculative generation with the same draft model and draft
count runs too, as a reference for our draft-model loop (the process's kernels are installed in the
model files for both: the comparison is of the loops).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterator, Optional

from engine.decode.cancel import CancelToken
from engine.decode.generate import generate
from engine.decode.events import Event, RoundEvent, SummaryEvent
from engine.decode.prefix_cache import PrefixCache
from engine.decode.settings import GenerationSettings
from engine.errors import DFlashError
from engine.models.pair import LoadedPair
from engine.runtime import blas
from engine.tools.bench import check_prompts, figures, mlx_lm_responses, ratio_range, speedup_range, warm_up
from engine.tools.bench_report import ar_cell, below_ar, decoded, prompt_label, ratio_text, say_no_rounds
from engine.tools.parity import DIVERGENCE, IDENTICAL, LENGTH, NEAR_TIE, SAMPLES, output_verdict

METHODS = ("ar", "dflash", "dflash-auto", "lookup", "dflash+lookup", "dflash-tree", "draft-model")


def parse_methods(text: str) -> list[str]:
    """'ar,dflash,...' -> the methods, AR always first; a clear line for a typo."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown or not names:
        raise DFlashError(f"unknown method(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(METHODS)}.")
    others = [m for m in dict.fromkeys(names) if m != "ar"]
    if not others:
        raise DFlashError("a race needs a method besides ar (AR runs in every race, as the reference); "
                          f"choose from {', '.join(METHODS[1:])}.")
    return ["ar"] + others


def method_settings(settings: GenerationSettings, method: str) -> GenerationSettings:
    """A method's settings from the run's (sampling, max tokens, window and the draft model shared)."""
    base = replace(settings, lookup=False, auto=False, tree=0, tree_auto=False)
    return {
        "ar": replace(base, mode="ar"),
        "dflash": replace(base, mode="dflash"),
        "dflash-auto": replace(base, mode="dflash", auto=True),
        "lookup": replace(base, mode="lookup"),
        # the cost curve and recent acceptance pick each round's source and length (auto), as the
        # issue asks: a copy, the drafter's block, or a plain step where neither pays
        "dflash+lookup": replace(base, mode="dflash", lookup=True, auto=True),
        # dflash+lookup verifying draft trees: --tree N's budget, or (without one) trees sized by the curve
        "dflash-tree": replace(base, mode="dflash", lookup=True, auto=True, tree=settings.tree,
                               tree_auto=settings.tree_auto or not settings.tree),
        "draft-model": replace(base, mode="draft-model"),
    }[method]


def checked_methods(pair: LoadedPair, settings: GenerationSettings, methods: list[str]) -> dict[str, GenerationSettings]:
    """Each method's settings, every one checked against the pair (and a draft model loaded) before
    anything runs: a wrong setting or path fails at once."""
    per_method = {m: method_settings(settings, m) for m in methods}
    for s in per_method.values():
        s.resolved(pair)
    if "draft-model" in per_method:
        from engine.models.draft_model import draft_model_for

        draft_model_for(pair, settings.draft_model)
    return per_method


@dataclass
class MethodRun:
    """One method's run of a prompt in a race."""
    method: str
    summary: Optional[SummaryEvent] = None
    rounds: list[RoundEvent] = field(default_factory=list)


def race_prompt(pair: LoadedPair, ids: list[int], per_method: dict[str, GenerationSettings],
                cancel: Optional[CancelToken] = None, prefix: Optional[PrefixCache] = None,
                runs: Optional[list[MethodRun]] = None) -> Iterator[tuple[str, Event]]:
    """Every method on one prompt, in order (AR first): yields (method, event) as they run and fills
    `runs` with each method's summary and rounds. Stops after a method that was cancelled."""
    runs = runs if runs is not None else []
    for method, settings in per_method.items():
        run = MethodRun(method)
        runs.append(run)
        for event in generate(pair, ids, settings, cancel, prefix=prefix):
            if isinstance(event, RoundEvent):
                run.rounds.append(event)
            elif isinstance(event, SummaryEvent):
                run.summary = event
            yield method, event
        if run.summary is None or run.summary.stop_reason == "cancelled":
            return


def after_first_round(ends: list[float], counts: list[int]) -> tuple[int, float]:
    """(tokens, seconds) after a run's first round, from each round's end time and token count.

    The one clock both loops are read by: mlx-lm's own generation_tps restarts its timer at the
    first token, which its speculative loop yields only after a whole round, and counts that round's
    other tokens as free; ours starts after the prefill. Past the first round both count alike."""
    if len(ends) < 2:
        return 0, 0.0
    return sum(counts[1:]), ends[-1] - ends[0]


def paired_range(ours: list[tuple[int, float]], theirs: list[tuple[int, float, float]]) -> Optional[list[float]]:
    """The lowest and highest ratio of our loop's tok/s to mlx-lm's, over every prompt and repeat
    (each ran both loops), or None under two such runs: prompts differ as well as runs, so a
    pooled ratio near 1 whose range straddles 1 is no loss shown."""
    if len(ours) != len(theirs):
        return None
    return ratio_range([(o_tokens / o_s) / (t_tokens / t_s) for (o_tokens, o_s), (t_tokens, t_s, _)
                        in zip(ours, theirs) if o_s > 0 and t_s > 0 and o_tokens and t_tokens])


def mlx_lm_speculative(pair: LoadedPair, ids: list[int], settings: GenerationSettings) -> tuple[int, float, float]:
    """mlx-lm's own speculative generation with the same draft model, draft count and sampling:
    (tokens, seconds) after its first round (a round ends at a token that is not a draft), and its
    own generation_tps."""
    import time

    from engine.models.draft_model import draft_model_for

    draft = draft_model_for(pair, settings.draft_model)
    ends, counts, last, n = [], [], None, 0
    for last in mlx_lm_responses(pair, ids, settings.max_tokens, settings.sampling, draft_model=draft.model,
                                 num_draft_tokens=settings.num_draft):
        n += 1
        if not last.from_draft:  # the round's own token: its last
            ends.append(time.perf_counter())
            counts.append(n)
            n = 0
    tokens, seconds = after_first_round(ends, counts)
    return tokens, seconds, float(last.generation_tps) if last is not None else 0.0


def run_race(
    pair: LoadedPair,
    prompts: list[tuple[str, list[int]]],
    settings: GenerationSettings,
    methods: list[str],
    repeats: int = 1,
    progress: Callable[[str], None] = lambda msg: None,
    cancel: Optional[CancelToken] = None,
    with_mlx_lm: bool = False,
) -> dict:
    if repeats < 1:
        raise DFlashError(f"repeats {repeats} must be at least 1.")
    if "draft-model" in methods and not settings.draft_model:
        raise DFlashError("the draft-model method needs --draft-model (a small model with the target's tokenizer).")
    if with_mlx_lm and not settings.draft_model:
        raise DFlashError("--with-mlx-lm races mlx-lm's speculative generation: it needs --draft-model too.")
    if with_mlx_lm and "draft-model" not in methods:
        raise DFlashError("--with-mlx-lm in a race times mlx-lm's speculative generation beside our draft-model "
                          "method: add draft-model to --methods.")
    per_method = checked_methods(pair, settings, methods)
    check_prompts(pair, prompts, settings.max_tokens)
    progress("warm-up")
    all_ids = [ids for _, ids in prompts]
    for m in methods[1:]:
        warm_up(pair, all_ids, per_method["ar"], per_method[m], cancel)
    runs = {m: {"summaries": [], "rounds": [], "per_prompt": []} for m in methods}
    reference: list[tuple[int, float, float]] = []  # mlx-lm: tokens and seconds after round 1, its tps
    ours_after_first: list[tuple[int, float]] = []
    interrupted = False  # Ctrl-C: the prompts raced so far are reported, the one cut short is not
    try:
        for n, (text, ids) in enumerate(prompts, 1):
            mine = {m: ([], []) for m in methods}
            theirs, ours = [], []  # this prompt's mlx-lm runs and our draft-model runs, kept once it finished
            for r in range(repeats):
                progress(f"prompt {n}/{len(prompts)}, repeat {r + 1}/{repeats}")
                done: list[MethodRun] = []
                # mlx-lm's loop and ours take turns going first, so neither always runs on a machine the
                # other has just warmed (or heated): their ratio is ~1, and an order bias would be its size
                mlx_lm_first = with_mlx_lm and (n + r) % 2 == 0
                if mlx_lm_first:
                    theirs.append(mlx_lm_speculative(pair, ids, settings))
                for _ in race_prompt(pair, ids, per_method, cancel, runs=done):
                    pass
                for run in done:
                    mine[run.method][0].append(run.summary)
                    mine[run.method][1].extend(run.rounds)
                if with_mlx_lm:
                    if not mlx_lm_first:
                        theirs.append(mlx_lm_speculative(pair, ids, settings))
                    mine_run = next((run for run in done if run.method == "draft-model"), None)
                    if mine_run is not None:
                        ours.append(after_first_round([r.t for r in mine_run.rounds],
                                                      [len(r.committed) for r in mine_run.rounds]))
            ar_runs, rows = mine["ar"][0], {}
            for m in methods:
                summaries, rounds = mine[m]
                verdict = output_verdict(pair, ids, ar_runs[0], summaries[0], settings.sampling.temperature, m)
                rows[m] = {"prompt": text, "prompt_tokens": len(ids), **figures(ar_runs, summaries, rounds),
                           "speedup_range": speedup_range(ar_runs, summaries) if m != "ar" else None,
                           "verdict": verdict.kind, "verdict_text": verdict.text}
            for m in methods:  # the prompt's runs join the totals together, once all are in
                runs[m]["summaries"] += mine[m][0]
                runs[m]["rounds"] += mine[m][1]
                runs[m]["per_prompt"].append(rows[m])
            reference += theirs
            ours_after_first += ours
    except KeyboardInterrupt:
        if not runs["ar"]["per_prompt"]:
            raise
        interrupted = True
    ar_all = runs["ar"]["summaries"]
    result = {
        "methods": {m: {**figures(ar_all, r["summaries"], r["rounds"]), "verdict": method_verdict(r["per_prompt"]),
                        "per_prompt": r["per_prompt"]}
                    for m, r in runs.items()},
        "prompts": len(runs["ar"]["per_prompt"]), "interrupted": interrupted, "prompts_given": len(prompts),
        "repeats": repeats, "max_tokens": settings.max_tokens,
        "temperature": settings.sampling.temperature, "sampling": asdict(settings.sampling), "blas": blas.status,
        "draft_model": settings.draft_model, "num_draft": settings.num_draft,
        # which models and rollback ran: two results compared later must say (a QA pass could not tell them apart)
        "target": str(pair.target_path), "drafter": str(pair.drafter_path) if pair.drafter is not None else None,
        "rollback": settings.rollback,
    }
    if "dflash-tree" in methods and "dflash+lookup" in methods:
        result["tree_vs_chain"] = tree_vs_chain(result["methods"]["dflash-tree"], result["methods"]["dflash+lookup"])
    if with_mlx_lm:
        ref_tokens, ref_s = sum(r[0] for r in reference), sum(r[1] for r in reference)
        our_tokens, our_s = sum(r[0] for r in ours_after_first), sum(r[1] for r in ours_after_first)
        result["mlx_lm_generation_tps"] = round(sum(r[2] for r in reference) / len(reference), 3)
        result["mlx_lm_speculative_tok_s"] = round(ref_tokens / ref_s, 3) if ref_s else None
        result["draft_model_after_first_round_tok_s"] = round(our_tokens / our_s, 3) if our_s else None
        result["draft_model_vs_mlx_lm"] = (round(result["draft_model_after_first_round_tok_s"]
                                                 / result["mlx_lm_speculative_tok_s"], 4)
                                           if our_s and ref_s else None)
        result["draft_model_vs_mlx_lm_range"] = paired_range(ours_after_first, reference)
    return result


def tree_vs_chain(tree: dict, chain: dict) -> dict:
    """The tree against the chain it branches (dflash+lookup: the same auto length and lookup): tau,
    a round's mean time, tok/s and the worst prompt's tok/s ratio, over the prompts where both
    drafted (one that ended at its first token ran the same work both ways: its ratio is only
    noise). tok/s goes about as tau over round time: a tree pays where it gains more tau than time."""
    def ratio(a, b):
        return round(a / b, 4) if a and b else None

    per_prompt = [ratio(t["dflash_tok_s"], c["dflash_tok_s"]) for t, c in zip(tree["per_prompt"], chain["per_prompt"])
                  if t["speedup"] is not None and c["speedup"] is not None]
    per_prompt = [r for r in per_prompt if r is not None]
    return {"tau": ratio(tree["mean_acceptance_length"], chain["mean_acceptance_length"]),
            "round_time": ratio(tree["round_ms"], chain["round_ms"]),
            "speed": ratio(tree["dflash_tok_s"], chain["dflash_tok_s"]),
            "worst_prompt_speed": min(per_prompt) if per_prompt else None}


def method_verdict(per_prompt: list[dict]) -> str:
    """A method's verdict over its prompts: the worst of theirs (a divergence at a clear margin
    outweighs near-ties, which outweigh identical outputs; at T > 0 outputs are samples)."""
    kinds = {p["verdict"] for p in per_prompt}
    for kind in (DIVERGENCE, LENGTH, SAMPLES, NEAR_TIE):
        if kind in kinds:
            return kind
    return IDENTICAL


def print_race(result: dict) -> None:
    """Per prompt and overall: each method's speedup against AR (tau), and whether it was AR's output."""
    methods = list(result["methods"])
    print("each method's speedup against AR, and its tau (mean tokens a round, the bonus counted) in brackets")
    print("prompt".ljust(32) + "AR tok/s".rjust(10) + "".join(m.rjust(20) for m in methods[1:]))
    ar_rows, repeats = result["methods"]["ar"]["per_prompt"], result["repeats"]
    rows = list(zip(*[result["methods"][m]["per_prompt"] for m in methods]))  # per prompt: each method's row
    for cells in rows + [[result["methods"][m] for m in methods]]:
        label = prompt_label(cells[0].get("prompt", "OVERALL"))
        runs = repeats * (1 if "prompt" in cells[0] else len(ar_rows))
        figures = "".join(
            (f"{c['speedup']:.2f}x" + (f" ({c['mean_acceptance_length']:.2f})" if c["mean_acceptance_length"] else "")
             if c["speedup"] is not None else "-").rjust(20) for c in cells[1:])
        print(label.ljust(32) + ar_cell(cells[0], runs, 10) + figures)
    # as bench says it: the prompts where every method's output ended at its first token
    say_no_rounds([cells[1] for cells in rows if not any(decoded(c) for c in cells[1:])], never="no method drafted")
    print("overall tok/s: " + ", ".join(f"{m} {result['methods'][m]['dflash_tok_s']:.1f}" for m in methods[1:])
          + f" (AR {result['methods']['ar']['ar_tok_s']:.1f})")
    temperature = result.get("temperature") or 0.0
    if temperature > 0:  # samples: one line, not a verdict per prompt that says the same each time
        differ = [f"{m} {sum(not r['identical'] for r in result['methods'][m]['per_prompt'])}"
                  f"/{len(result['methods'][m]['per_prompt'])}" for m in methods[1:]]
        print(f"at temperature {temperature:g} every output is a sample, AR's and each method's drawn with different "
              "random numbers: they are compared in distribution (tests/test_sampling.py), not token by token; "
              "prompts whose samples differ from AR's: " + ", ".join(differ))
    else:
        print("identical to AR: " + ", ".join(f"{m} {result['methods'][m]['identical']}" for m in methods[1:]))
    for m in methods[1:]:  # where a greedy output was not AR's, the parity verdict and its margin
        for row in result["methods"][m]["per_prompt"]:
            if row["verdict"] not in (IDENTICAL, SAMPLES):
                print(f"  {m} on {row['prompt'][:30]!r}: {row['verdict_text']}")
    print("verify per round: " + ", ".join(
        f"{m} {result['methods'][m]['verify_ms']:.1f} ms over {result['methods'][m]['mean_verified']:.1f} rows"
        for m in methods[1:] if result["methods"][m].get("mean_verified")))
    if "tree_vs_chain" in result:
        t = result["tree_vs_chain"]
        print("dflash-tree against dflash+lookup: " + ", ".join(
            f"{name} {t[key]:.2f}x" for key, name in (("tau", "tau"), ("round_time", "a round's time"),
                                                      ("speed", "tok/s"), ("worst_prompt_speed", "worst prompt"))
            if t.get(key) is not None) + " (a tree pays where it gains more tau than round time)")
    for m in methods[1:]:
        drafted = [r for r in result["methods"][m]["per_prompt"] if r["speedup"] is not None]
        if drafted:
            worst = min(drafted, key=lambda r: r["speedup"])
            print(f"worst prompt for {m}: {ratio_text(worst['speedup'])} {worst['prompt'][:40]!r}; {below_ar(drafted)}")
    if "mlx_lm_speculative_tok_s" in result:
        ratio = result["draft_model_vs_mlx_lm"]
        print(f"mlx-lm speculative generation with the same draft model: {result['mlx_lm_speculative_tok_s'] or 0:.1f} "
              f"tok/s after its first round (its own generation_tps {result['mlx_lm_generation_tps']:.1f}), ours "
              f"{result['draft_model_after_first_round_tok_s'] or 0:.1f}"
              + (f"; our draft-model mode {ratio:.2f}x of it" if ratio else "")
              + (" (runs {:.2f}-{:.2f}x)".format(*result["draft_model_vs_mlx_lm_range"])
                 if result.get("draft_model_vs_mlx_lm_range") else ""))
        if temperature > 0:
            print("  at T > 0 mlx-lm samples at the same settings but keeps a draft only when the target's own "
                  "sample equals it (ours accepts by the ratio of the two models' probabilities, exact in "
                  "distribution), so the two loops accept differently as well as run differently.")
