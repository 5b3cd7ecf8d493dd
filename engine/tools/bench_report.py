"""`bench`'s text output: the AR/DFlash table, and the block-size table of `--block-sizes`; and
`calibrate`'s table of the cost curve."""

from __future__ import annotations


def decoded(r: dict) -> bool:
    """Whether a bench row's DFlash runs went past their first token: rounds, or auto's plain steps."""
    return bool(r["rounds"] or r.get("plain_steps"))


def without_rounds(per_prompt: list[dict]) -> list[dict]:
    """The prompts whose output ended at its first token, before DFlash drafted anything."""
    return [r for r in per_prompt if not decoded(r)]


def say_no_rounds(per_prompt: list[dict], never: str = "DFlash never drafted") -> None:
    """One line naming the prompts whose output ended before anything was drafted (none: nothing);
    `never` says who did not draft (a race: no method)."""
    names = [repr(r["prompt"][:30]) for r in without_rounds(per_prompt)]
    if names:
        print(f"{len(names)} prompt(s) ended at their first token, so {never} and they have "
              f"no speedup: {', '.join(names)}")


def _ar_cell(result: dict, row: dict, width: int, overall: bool = False) -> str:
    return ar_cell(row, result["repeats"] * (len(result["per_prompt"]) if overall else 1), width)


def ar_cell(row: dict, runs: int, width: int) -> str:
    """AR tok/s over `runs` AR runs, "-" where each wrote one token (the output ended at its first):
    one token over a decode of almost no time is no rate (it printed as 20000 tok/s)."""
    return f"{row['ar_tok_s']:{width}.1f}" if row["ar_tokens"] > runs else "-".rjust(width)


def _range_cell(row: dict) -> str:
    """A prompt's lowest-highest speedup over its repeats ("" for OVERALL and single runs)."""
    spread = row.get("speedup_range")
    return f"{spread[0]:.2f}-{spread[1]:.2f}x".rjust(14) if spread else ""


def ratio_text(speedup: float) -> str:
    """A speedup as '1.23x'; one below AR keeps a third digit where two would read 1.00x (a prompt counted
    below AR was printed as 1.00x)."""
    if speedup < 1.0 and round(speedup, 2) >= 1.0:  # 0.995..1; at most 0.999, which 0.9996 would round past
        return f"{min(speedup, 0.999):.3f}x"
    return f"{speedup:.2f}x"


def below_ar(drafted: list[dict]) -> str:
    """How many prompts ran below AR, and how many of those ran above it in some repeat."""
    below = [r for r in drafted if r["speedup"] < 1.0]
    within = sum(1 for r in below if r.get("speedup_range") and r["speedup_range"][1] >= 1.0)
    said = f"{len(below)} of {len(drafted)} prompts below AR"
    return said + (f" ({within} of them at or above AR in a repeat: within the run-to-run spread)" if within else "")


# Mean acceptance length (bonus counted) below which a run's drafts were almost never accepted.
NOTHING_ACCEPTED_TAU = 1.05


ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def prompt_label(text: str, width: int = 30) -> str:
    """A table's prompt cell: line breaks and tabs written as escapes (a raw one breaks the columns),
    cut to `width` between characters, never inside an escape."""
    label = ""
    for ch in text:
        piece = ESCAPES.get(ch, ch)
        if len(label) + len(piece) > width:
            break
        label += piece
    return label


def print_bench(result: dict, with_mlx_lm: bool, greedy: bool) -> None:
    cols = ("ar_tok_s", "dflash_tok_s", "speedup", "mean_acceptance_length", "draft_ms", "verify_ms", "rollback_ms")
    spread = any(r.get("speedup_range") for r in result["per_prompt"])
    print("prompt".ljust(32) + "".join(c.rjust(14) for c in ("AR tok/s", "DFlash tok/s", "speedup", "tau", "draft ms",
                                                            "verify ms", "rollback ms"))
          + ("repeats range".rjust(14) if spread else ""))
    numbered = [(r, False, f"{i}. ") for i, r in enumerate(result["per_prompt"], 1)]
    for row, overall, number in numbered + [(dict(result, prompt="OVERALL"), True, "")]:
        label = number + prompt_label(row["prompt"], 30 - len(number))
        print(label.ljust(32) + _ar_cell(result, row, 14, overall) + "".join(
            f"{row[c]:>14.{1 if c == 'dflash_tok_s' else 3}f}" if row[c] is not None and decoded(row) else "-".rjust(14)
            for c in cols[1:])
            + _range_cell(row))
    say_no_rounds(result["per_prompt"])
    drafted = [r for r in result["per_prompt"] if r["speedup"] is not None]
    if drafted:
        worst = min(drafted, key=lambda r: r["speedup"])
        tau = worst["mean_acceptance_length"]  # None when no round drafted (block size 1, auto gone plain)
        number = result["per_prompt"].index(worst) + 1  # pasted files often start alike: the line says which
        print(f"worst prompt: #{number}, {ratio_text(worst['speedup'])}"
              + (f" (tau {tau:.2f})" if tau is not None else "") + f" {worst['prompt'][:40]!r}; {below_ar(drafted)}")
    tau = result["mean_acceptance_length"]
    if tau is not None and tau < NOTHING_ACCEPTED_TAU:
        print(f"note: almost no drafts were accepted (tau {tau:.2f}): this drafter does not help this target on "
              "these prompts; where DFlash's speed differs from AR's it is the cost of rounds that commit one token "
              "and run-to-run noise, not its drafts (doctor says how long it was trained, where train-drafter "
              "made it).")
    if result["round_in_ar_steps"]:
        steps = result["round_in_ar_steps"]
        print(f"a DFlash round costs {steps:.2f} AR steps: break-even at tau {steps:.2f}, 2x at tau {2 * steps:.2f}")
        shares = result["acceptance_by_position"]
        block = result.get("block_size") or len(shares) + 1
        past = (f"; positions past the drafter's block of {block} ({block}..{len(shares)}) are copies of the context "
                "(lookup) verified longer" if len(shares) >= block else "")
        print(f"accepted by position of a round's drafts (1..): {' '.join(f'{a:.2f}' for a in shares)}{past}")
    if len(result.get("by_depth", [])) > 1:
        print_by_depth(result["by_depth"])
    if "distributed" in result:
        d = result["distributed"]
        comm = d["collectives_per_round"] * d["collective_ms"]
        print(f"{d['ranks']} ranks ({d['backend']}, {d['sharding']} parallel): {d['collectives_per_round']} "
              f"collectives per round x {d['collective_ms']:.3f} ms = ~{comm:.2f} ms of communication per round "
              f"(DFlash verify {result['verify_ms']:.2f} ms)")
    if with_mlx_lm:
        print(f"AR vs mlx-lm generate (median ratio of tok/s): {result['ar_vs_mlx_lm']:.3f}")
    if result.get("compared"):
        print_compared(result)
    if not all(r["identical"] for r in [result] + result.get("compared", [])) and greedy:
        print("note: some greedy outputs differ between AR and DFlash; run `parity` on them for the margin.")


def print_by_depth(rows: list[dict]) -> None:
    """Every prompt's rounds and AR steps pooled by the context depth they ran at."""
    print("\nby context depth (every prompt pooled; a round by its anchor's position, an AR step by its token's):")
    print("depth".rjust(12) + "".join(c.rjust(14) for c in ("rounds", "tau", "round ms", "AR tok/s", "DFlash tok/s",
                                                          "speedup")))

    def cell(v, fmt: str) -> str:
        return (f"{v:{fmt}}" if v is not None else "-").rjust(14)

    for r in rows:
        print(r["depth"].rjust(12) + str(r["rounds"]).rjust(14) + cell(r["tau"], ".2f") + cell(r["round_ms"], ".2f")
              + cell(r["ar_tok_s"], ".1f") + cell(r["dflash_tok_s"], ".1f")
              + (cell(r["speedup"], ".2f") if r["speedup"] is None else f"{r['speedup']:.2f}x".rjust(14)))


def print_compared(result: dict) -> None:
    """Each drafter's speedup and tau per prompt, against the same AR runs."""
    drafters = [result] + result["compared"]
    names = [f"{d['drafter_generation']} {d['drafter'].rstrip('/').split('/')[-1]}"[:24] for d in drafters]
    print("\ndrafters on the same AR runs: speedup (tau)")
    print("prompt".ljust(32) + "AR tok/s".rjust(10) + "".join(n.rjust(26) for n in names))
    rows = zip(*[d["per_prompt"] for d in drafters])
    for cells in list(rows) + [drafters]:
        label = prompt_label("OVERALL" if cells is drafters else cells[0]["prompt"])
        figures = "".join((f"{c['speedup']:.2f}x ({c['mean_acceptance_length']:.2f})" if c["speedup"] and
                           c["mean_acceptance_length"] else "-").rjust(26) for c in cells)
        print(label.ljust(32) + _ar_cell(result, cells[0], 10, overall=cells is drafters) + figures)
    worst = [min((r for r in d["per_prompt"] if r["speedup"] is not None), key=lambda r: r["speedup"], default=None)
             for d in drafters]
    print("worst prompt: " + "; ".join(f"{n}: {ratio_text(w['speedup'])} ({w['prompt'][:24]!r})"
                                       for n, w in zip(names, worst) if w is not None))


def print_block_sizes(result: dict) -> None:
    names = result["sizes"]
    print("prompt".ljust(32) + "AR tok/s".rjust(10) + "".join(f"x @{n}".rjust(10) for n in names))
    for row in result["per_prompt"]:
        label = prompt_label(row["prompt"])
        print(label.ljust(32) + _ar_cell(result, row, 10) + "".join(
            f"{row['speedup'][n]:10.2f}" if row["speedup"][n] is not None else "-".rjust(10) for n in names))
    say_no_rounds(result["per_prompt"])
    sampled = (result.get("temperature") or 0.0) > 0  # outputs are samples: compared in distribution, not here
    print(f"\n{'block size':>12}{'speedup':>10}{'predicted':>11}{'error':>9}{'tau':>8}  "
          + ("(samples at T > 0: not compared token by token)" if sampled else "identical to AR"))
    for n in names:
        o = result["overall"][n]
        pred = f"{o['predicted_speedup']:11.2f}" if o["predicted_speedup"] else "-".rjust(11)
        err = f"{o['error']:+9.1%}" if o["error"] is not None else "-".rjust(9)
        tau = f"{o['tau']:8.2f}" if o["tau"] else "-".rjust(8)
        speedup = f"{o['speedup']:10.2f}" if o["speedup"] is not None else "-".rjust(10)
        print(f"{n:>12}{speedup}{pred}{err}{tau}" + ("" if sampled else f"  {o['identical']}"))
    if result["advice"]:
        best = result["advice"]["best"]
        print(f"predicted from the block-{result['advisor_source']} runs and this machine's cost curve; "
              f"best fixed size: {best}" + (" (plain decoding: no block size pays with this drafter)" if best == 1
                                              else ""))
    print("every size ran the drafter alone (lookup off)")


def print_curve(curve, cached: bool) -> None:
    """`calibrate`'s table: a verify of L tokens and a round (its draft of L and its verify), in ms
    and in AR steps, at each depth measured."""
    from engine.decode.settings import draft_context_text

    points = [curve.at(p.depth) for p in curve.points()]
    when = "cached" if cached else "measured now"
    print(f"{curve.target} on {curve.device} (blas: {curve.blas}), {when}, medians of {curve.repeats}+ sweeps; "
          f"drafter context: {draft_context_text(curve.draft_window, curve.draft_sink)}; draws timed: {curve.sampling}")
    print("A verify of L tokens and a round (its draft of L and its verify) in ms and in AR steps, "
          "at each context depth measured:")
    print("depth".rjust(6) + "".join(f"{p.context:>24d}" for p in points))
    print("AR ms".rjust(6) + "".join(f"{p.ar_step_ms:>24.2f}" for p in points))
    print("sweeps".rjust(6) + "".join(f"{p.sweeps:>24d}" for p in curve.points()))
    print("L".rjust(6) + "   verify ms steps round" * len(points))
    for length in range(1, len(curve.verify_ms) + 1):
        cells = (f"{p.verify_ms[length - 1]:>12.2f}{p.verify_in_ar_steps()[length - 1]:>6.2f}"
                 f"{p.round_ms(length, whole_block=False) / p.ar_step_ms:>6.2f}" for p in points)
        print(f"{length:6d}" + "".join(cells))
