"""The peer comparison's figures and table: each peer runtime's lines (engine/tools/peer_driver.py)
beside our own `bench --json` result, per prompt and overall, as ratios of ours to theirs."""

from __future__ import annotations

from typing import Any, Optional


def run_figures(result: dict, ar: dict, max_tokens: int) -> dict:
    """One run's counts: tokens past max_tokens (a peer's last round may overshoot) are neither
    counted nor compared, over the run's whole decode time."""
    tokens = result["tokens"][:max_tokens]
    return {"runs": 1, "tokens": len(tokens), "decode_s": result["decode_s"], "rounds": result.get("rounds") or 0,
            "identical": int(tokens == ar["tokens"][:max_tokens]),
            "fallback_ar": int(bool(result.get("fallback_ar"))),  # dflash-mlx gave up speculating
            "ar_tokens": len(ar["tokens"]), "ar_decode_s": ar["decode_s"]}


def pooled(runs: list[dict]) -> dict:
    """Runs pooled as bench pools ours: tokens over decode time; tau the tokens after each run's
    first (from prefill) over every round, as ours counts a round's committed tokens."""
    total = {key: sum(r[key] for r in runs) for key in runs[0]}
    tok_s = total["tokens"] / total["decode_s"] if total["decode_s"] > 0 else 0.0
    ar_tok_s = total["ar_tokens"] / total["ar_decode_s"] if total["ar_decode_s"] > 0 else 0.0
    return {**total, "tok_s": tok_s, "ar_tok_s": ar_tok_s, "speedup": tok_s / ar_tok_s if ar_tok_s else None,
            "tau": (total["tokens"] - total["runs"]) / total["rounds"] if total["rounds"] else None}


def peer_figures(lines: list[dict], max_tokens: int) -> dict:
    """A peer's JSON lines as {"facts", "per_prompt", "overall", "error"}: each prompt's repeats
    pooled, and every run pooled overall; a prompt with a failed run is {"error"}."""
    facts = next((line for line in lines if "loaded" in line), {})
    error = next((line["error"] for line in lines if "error" in line and "prompt" not in line), None)
    runs: dict[int, list[dict]] = {}
    failed: dict[int, str] = {}
    for line in lines:
        if "prompt" in line and "peer" in line:
            runs.setdefault(line["prompt"], []).append(run_figures(line["peer"], line["ar"], max_tokens))
        elif "prompt" in line:
            failed[line["prompt"]] = line["error"]
    count = max([*runs, *failed], default=-1) + 1
    per_prompt: list[Optional[dict]] = [{"error": failed[i]} if i in failed else pooled(runs[i]) if i in runs
                                        else None for i in range(count)]
    good = [run for i, rs in runs.items() if i not in failed for run in rs]
    return {"facts": facts, "per_prompt": per_prompt, "overall": pooled(good) if good else None, "error": error}


def fastest(peers: dict[str, dict]) -> Optional[tuple[str, float]]:
    """The peer with the highest pooled tok/s, and that speed; None where none ran."""
    ran = [(name, p["overall"]["tok_s"]) for name, p in peers.items() if p["overall"]]
    return max(ran, key=lambda item: item[1]) if ran else None


def _ratio(ours: Optional[float], theirs: Optional[float]) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def _num(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(ours: dict, peers: dict[str, dict], prompts: list[str]) -> str:
    """Per prompt and overall: our DFlash tok/s, each peer's, and ours over theirs; then a line
    per runtime: tau, its speedup over AR in its own process, and whether its output was AR's."""
    names = list(peers)
    head = f"{'prompt':<28} {'ours':>7}" + "".join(f" {n[:17]:>17}" for n in names)
    lines = ["decode tok/s, prefill excluded (ours/peer as x; ! where a peer's output was not AR's)", head]
    mine = ours.get("per_prompt", [])
    for i, text in enumerate(prompts):
        ours_tok_s = mine[i]["dflash_tok_s"] if i < len(mine) else None
        label = " ".join(text.split())[:28]
        runs_here = [peers[n]["per_prompt"][i] for n in names if i < len(peers[n]["per_prompt"])]
        if any(run and "error" not in run and run["tokens"] <= run["runs"] for run in runs_here):
            lines.append(f"{label:<28} ended at its first token: nothing to time")  # (ours read 66,666 tok/s)
            continue
        cells = []
        for n in names:
            runs = peers[n]["per_prompt"]
            run = runs[i] if i < len(runs) else None
            if run is None or "error" in run:
                cells.append(f" {'failed' if run else '-':>17}")
            else:
                mark = " " if run["identical"] == run["runs"] else "!"  # an output was not AR's
                cells.append(f" {_num(run['tok_s']):>8} {_ratio(ours_tok_s, run['tok_s']):>7}{mark}")
        lines.append(f"{label:<28} {_num(ours_tok_s):>7}" + "".join(cells))
    cells = [f" {_num(p['overall'] and p['overall']['tok_s']):>8} "
             f"{_ratio(ours.get('dflash_tok_s'), p['overall'] and p['overall']['tok_s']):>7} " for p in peers.values()]
    lines.append(f"{'overall':<28} {_num(ours.get('dflash_tok_s')):>7}" + "".join(cells))
    best = fastest(peers)
    if best:
        lines.append(f"fastest peer: {best[0]} at {best[1]:.1f} tok/s; ours {_ratio(ours.get('dflash_tok_s'), best[1])}")
    lines += ["", f"{'runtime':<20} {'tok/s':>7} {'tau':>5} {'vs AR':>6} {'AR tok/s':>8} {'same as AR':>10}  note"]
    same = f"{sum(bool(p.get('identical')) for p in mine)}/{len(mine)}"
    lines.append(f"{'ours (bench)':<20} {_num(ours.get('dflash_tok_s')):>7} "
                 f"{_num(ours.get('mean_acceptance_length'), 2):>5} {_num(ours.get('speedup'), 2):>5}x "
                 f"{_num(ours.get('ar_tok_s')):>8} {same:>10}  AR: ours, same process")
    for name, p in peers.items():
        o = p["overall"]
        if o is None:
            lines.append(f"{name:<20} {'failed':>7}  {p['error'] or 'no prompt ran'}")
            continue
        failed = sum(1 for r in p["per_prompt"] if r and "error" in r)
        fell = o["fallback_ar"]
        note = ("AR: mlx-lm, same process" + (f"; {failed} prompt(s) failed" if failed else "")
                + (f"; {fell} run(s) fell back to AR" if fell else ""))
        done = [r for r in p["per_prompt"] if r and "error" not in r]
        same = f"{sum(r['identical'] == r['runs'] for r in done)}/{len(done)}"  # prompts, as ours counts
        lines.append(f"{name:<20} {_num(o['tok_s']):>7} {_num(o['tau'], 2):>5} {_num(o['speedup'], 2):>5}x "
                     f"{_num(o['ar_tok_s']):>8} {same:>10}  {note}")
    return "\n".join(lines)
