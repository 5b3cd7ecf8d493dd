"""`dflash-playground serve`: load the pair once, then answer OpenAI and Anthropic clients over HTTP.

Headless. The port is bound before the models load (a port in use costs nothing), on 127.0.0.1
unless --host says otherwise (then a warning: other machines can reach it).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
from dataclasses import replace
from typing import Optional

from engine.decode.settings import AUTO_BY_DEFAULT, LOOKUP_BY_DEFAULT, GenerationSettings
from engine.errors import DFlashError
from engine.tools.run_flags import RunFlags
from engine.tools.unused_flags import resolved_saying
from engine.serve.defaults import DEFAULT_HOST, DEFAULT_MAX_TOKENS, DEFAULT_PORT, DEFAULT_QUEUE, PREFIX_CAPACITY

SERVE_MODES = ("dflash", "ar", "lookup")
KEY_ENV = "DFLASH_API_KEY"


def add_parser(sub) -> None:
    from engine.tools.cli_parser import add_model_args, add_tree_arg, block_size_arg

    s = sub.add_parser("serve", help="serve the pair to OpenAI- and Anthropic-compatible clients over HTTP")
    add_model_args(s)
    s.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST}: this "
                                                        "machine only; another host is reachable by others)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    s.add_argument("--api-key", help=f"require this key ('Authorization: Bearer KEY' or 'x-api-key: KEY'); "
                                     f"also read from ${KEY_ENV}")
    s.add_argument("--mode", choices=SERVE_MODES, default="dflash", help="dflash (default), ar (plain AR, to "
                   "compare), or lookup (copies from the context, no drafter)")
    s.add_argument("--block-size", type=block_size_arg, metavar="N|auto", default="auto" if AUTO_BY_DEFAULT else None,
                   help="as generate's (default auto: each round verifies as many drafts as pay off)")
    s.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=LOOKUP_BY_DEFAULT,
                   help="DFlash rounds verify a copied span of the context where the text repeats (default on)")
    add_tree_arg(s)
    s.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"tokens a request that sets none may generate (default {DEFAULT_MAX_TOKENS}, within the context)")
    s.add_argument("--max-queue", type=int, default=DEFAULT_QUEUE,
                   help=f"requests that may wait for the engine; more get 429 (default {DEFAULT_QUEUE})")
    s.add_argument("--prefix-cache", type=int, default=PREFIX_CAPACITY, metavar="N",
                   help=f"recent prompts whose caches are kept for a conversation's next turn (default {PREFIX_CAPACITY})")


def is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def base_settings(args, pair) -> GenerationSettings:
    """Every request's settings before its own fields: the command's mode, block size and lookup."""
    base = RunFlags(block_size=args.block_size, lookup=args.lookup, tree=args.tree).settings(args.mode)
    resolved_saying(base, pair, args.tree is not None)  # refused at the start, not at the first request
    return base


def check_limits(args) -> None:
    for name, value, low in (("--max-tokens", args.max_tokens, 1), ("--max-queue", args.max_queue, 0),
                             ("--prefix-cache", args.prefix_cache, 1)):
        if value < low:
            raise DFlashError(f"{name} {value} is below {low}.")


def start_serving(args):
    """The server on a thread of this process (engine/serve/background.py), as the command's flags
    say. The port is bound first; then the pair loads and the cost curve auto runs need is measured
    (or read from the cache)."""
    from engine.serve.background import Serving, bind
    from engine.tools.cli import pair_from_args
    from engine.tools.curve_progress import measure_cost_curves

    check_limits(args)
    api_key = args.api_key or os.environ.get(KEY_ENV) or None
    sock = bind(args.host, args.port)
    try:
        if not is_local(args.host):
            print(f"warning: listening on {args.host}: other machines on the network can reach this server"
                  + ("" if api_key else ", and no --api-key is set") + ".", file=sys.stderr)
        pair = pair_from_args(args, with_drafter=args.mode == "dflash")
        base = base_settings(args, pair)
        measure_cost_curves(pair, [base, replace(base, sampling=replace(base.sampling, temperature=1.0))])
        return Serving(pair, sock, base, api_key=api_key, max_queue=args.max_queue, prefix_capacity=args.prefix_cache,
                       default_max_tokens=args.max_tokens)
    except BaseException:
        sock.close()
        raise


def cmd_serve(args) -> int:
    serving = start_serving(args)
    print(f"serving {serving.server.config.model_id} ({args.mode}) at {serving.url}/v1 (OpenAI) and {serving.url} "
          "(Anthropic); Ctrl-C stops.", file=sys.stderr, flush=True)
    def stop_on_term(signum, frame):
        raise KeyboardInterrupt  # as Ctrl-C: a service manager's stop lets the running run end its round

    signal.signal(signal.SIGTERM, stop_on_term)
    try:
        serving.wait()
    except KeyboardInterrupt:
        print("stopping: the running request ends at its round's end.", file=sys.stderr, flush=True)
    finally:
        serving.stop()
    return 0
