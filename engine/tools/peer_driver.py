"""One peer runtime over token-id prompts, run by the peer venv's python as a script
(engine/tools/peer_bench.py starts it, and reads its PEERS table): nothing but the standard library at
the top, and the peer's package only inside its runner, so our process never imports a peer.

Reads a JSON spec on stdin ({"peer", "target", "drafter", "prompts": [[ids]], "max_tokens", "repeats"})
and writes JSON lines: {"loaded": ...} once, then per prompt and repeat {"prompt": i, "repeat": r,
"peer": {...}, "ar": {...}},
or one {"error": "..."} line and exit status 3. Each run is timed as ours is: generated tokens over
the time from the first token (sampled from prefill) to the end, prefill excluded; "own_tok_s" is
what the peer itself reports beside it. AR is mlx-lm's greedy stream_generate on a second copy of
the target in the same process: the speed the peer is a speedup over, and the output it must equal.
"""

import json
import sys
import time


def emit(obj):
    print(json.dumps(obj), flush=True)


def one_line(exc, limit=240):
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."


def timed(responses, tokens_of):
    """Run a stream: (tokens, seconds from its first response to its end, its last response)."""
    tokens, first, last = [], None, None
    for last in responses:
        if first is None:
            first = time.perf_counter()
        tokens += tokens_of(last)
    return tokens, time.perf_counter() - (first or time.perf_counter()), last


def mlx_lm_ar(spec):
    import mlx.core as mx
    from mlx_lm import load, stream_generate

    model, tokenizer = load(spec["target"])

    def run(ids, max_tokens):
        tokens, seconds, last = timed(stream_generate(model, tokenizer, mx.array(ids), max_tokens=max_tokens),
                                      lambda r: [r.token] if r.finish_reason != "stop" else [])
        return {"tokens": tokens, "decode_s": seconds, "own_tok_s": last.generation_tps}
    return run, set(tokenizer.eos_token_ids)


def zlab(spec):
    """z-lab's `dflash` (PyPI dflash), its MLX backend at its defaults: the drafter's block, greedy."""
    from dflash import model_mlx

    model, tokenizer = model_mlx.load(spec["target"])
    # load_draft fetches a Hub id with snapshot_download; a local folder is its own snapshot.
    model_mlx.snapshot_download = lambda repo, **_: repo
    draft = model_mlx.load_draft(spec["drafter"])

    def run(ids, max_tokens):
        rounds = []
        def of(r):
            if r.accepted is not None:
                rounds.append(r.accepted)
            return list(r.tokens)
        tokens, seconds, last = timed(model_mlx.stream_generate(model, draft, tokenizer, ids, max_tokens=max_tokens),
                                      of)
        return {"tokens": tokens, "decode_s": seconds, "own_tok_s": last.generation_tps, "rounds": len(rounds)}
    return run, {"block_size": int(draft.config.block_size), "drafter_class": type(draft).__name__}


def dflash_mlx(spec, verify_mode=None):
    """bstnxbt's dflash-mlx through its offline generate path (prefix cache off), `verify_mode`
    None for its default (adaptive)."""
    from dflash_mlx.engine.events import SummaryEvent, TokenEvent
    from dflash_mlx.runtime import get_stop_token_ids, stream_dflash_generate
    from dflash_mlx.runtime.bundle import load_runtime_bundle
    from dflash_mlx.runtime.context import build_offline_runtime_context

    context = build_offline_runtime_context(verify_mode=verify_mode)
    bundle = load_runtime_bundle(model_ref=spec["target"], draft_ref=spec["drafter"],
                                 verify_config=context.verify)
    stops = get_stop_token_ids(bundle.tokenizer)

    def run(ids, max_tokens):
        summary = []
        def of(event):
            if isinstance(event, SummaryEvent):
                summary.append(event)
            return [int(event.token_id)] if isinstance(event, TokenEvent) else []
        events = (e for e in stream_dflash_generate(
            target_model=bundle.target_model, target_ops=bundle.target_ops, tokenizer=bundle.tokenizer,
            draft_model=bundle.draft_model, draft_backend=bundle.draft_backend, prompt="",
            prompt_tokens_override=list(ids), max_new_tokens=max_tokens, use_chat_template=False,
            stop_token_ids=stops, runtime_context=context) if isinstance(e, (TokenEvent, SummaryEvent)))
        tokens, seconds, _ = timed(events, of)
        s = summary[-1]
        prefill = float(s.phase_timings_us.get("prefill", 0.0))
        own = s.generation_tokens / max((s.elapsed_us - prefill) / 1e6, 1e-9)
        return {"tokens": tokens, "decode_s": seconds, "own_tok_s": own, "rounds": int(s.cycles_completed),
                **({"fallback_ar": s.fallback_reason or True} if s.fallback_ar else {})}
    return run, {"verify_mode": context.verify.mode, "draft_class": type(bundle.draft_model).__name__}


def dspark(spec, bits=4):
    """ARahim3's mlx-dspark, `generate --mode dflash` at its defaults: the drafter quantized to 4
    bits (`bits` 0: as it is, its --drafter-bits 0), the verify cap its static_cap measures on this
    machine, no lookup drafts."""
    from mlx_dspark.calibrate import static_cap
    from mlx_dspark.generate import dflash_generate
    from mlx_dspark.load import load_dflash, load_target

    target, tokenizer = load_target(spec["target"], require_tap=True)
    drafter, _ = load_dflash(spec["drafter"], quantize=bits > 0, bits=max(bits, 2))
    drafter.bind(target.model)
    fallback = max(1, int(getattr(drafter.config, "block_size", 8)) - 1)
    cap = static_cap(target, drafter, mode="dflash", target_repo=spec["target"], drafter_repo=spec["drafter"],
                     fallback=fallback)

    def run(ids, max_tokens):
        res = dflash_generate(target, tokenizer, drafter, prompt_ids=list(ids), max_new_tokens=max_tokens,
                              max_draft_tokens=cap)
        # Its own split: decode from the end of prefill (before the first token is read) to the end.
        return {"tokens": list(res.token_ids), "decode_s": res.decode_seconds,
                "own_tok_s": res.decode_tokens_per_sec, "rounds": int(res.num_rounds)}
    return run, {"cap": cap, "drafter_bits": bits}


PEERS = {
    "zlab": (zlab, "dflash"),
    "dflash-mlx": (dflash_mlx, "dflash_mlx"),
    "dflash-mlx-ddtree": (lambda spec: dflash_mlx(spec, "ddtree"), "dflash_mlx"),
    "dspark": (dspark, "mlx_dspark"),
    "dspark-fp": (lambda spec: dspark(spec, 0), "mlx_dspark"),
}


def main():
    spec = json.load(sys.stdin)
    start, package = PEERS[spec["peer"]]
    try:
        run, facts = start(spec)
        ar, eos = mlx_lm_ar(spec)
    except ModuleNotFoundError as exc:
        emit({"error": f"{exc.name} is not installed in {sys.executable} (peer {spec['peer']} needs {package})"})
        return 3
    except Exception as exc:  # the peer refused our checkpoint: say which and why, in one line
        emit({"error": f"{spec['peer']} could not load the pair: {type(exc).__name__}: {one_line(exc)}"})
        return 3
    prompts, max_tokens = spec["prompts"], spec["max_tokens"]
    warm = min(32, max_tokens)
    for ids in prompts[:2]:  # kernels compiled, caches sized, before any run is measured
        run(ids, warm)
        ar(ids, min(16, max_tokens))
    emit({"loaded": spec["peer"], **facts, "python": sys.executable})
    for i, ids in enumerate(prompts):
        for repeat in range(spec.get("repeats", 1)):  # AR then the peer, as bench runs AR then ours
            reference = ar(ids, max_tokens)
            try:
                result = run(ids, max_tokens)
            except Exception as exc:
                emit({"prompt": i, "repeat": repeat, "error": f"{type(exc).__name__}: {one_line(exc)}"})
                break
            # EOS: mlx-lm leaves it out of its tokens, some peers keep it; compare what was written.
            result["tokens"] = [t for t in result["tokens"] if t not in eos]
            emit({"prompt": i, "repeat": repeat, "peer": result, "ar": reference})
    return 0


if __name__ == "__main__":
    sys.exit(main())
