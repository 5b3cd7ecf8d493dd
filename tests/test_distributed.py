"""DFlash over a target sharded with MLX's distributed engine: two local ranks over loopback (ring).

Each test starts a real `mlx.launch -n 2 --backend ring` job running the same CLI users run,
on tiny checkpoints written to disk, and compares with the unsharded model in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.decode.generate import generate
from engine.decode.events import SummaryEvent
from engine.decode.prompts import encode_prompt
from engine.decode.settings import GenerationSettings
from engine.models.pair import load_pair
from engine.tools.parity import first_divergence, logit_margin, near_tie_threshold
from engine.tools.trace import read_trace
from fixtures.tiny_hybrid import write_hybrid_drafter, write_hybrid_target

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "def add(a, b):"
TOKENS = 24
NEAR_TIE = near_tie_threshold("float32")  # the tiny fixtures are float32


def _free_ports(count: int) -> int:
    """The first of `count` consecutive loopback ports free now (mlx.launch's ring takes one a rank,
    from --starting-port up), below the ephemeral range where the OS hands out ports unasked."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(20000, 30000)
        try:
            with contextlib.ExitStack() as stack:
                for port in range(first, first + count):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError("no free loopback ports for the ring backend")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_RANK", "MLX_HOSTFILE"))}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")]),
            **extra}


def launch(argv: list[str], ranks: int = 2, timeout: float = 240, script: str | None = None,
           script_dir: Path | None = None, measured: bool = False, **env: str) -> subprocess.CompletedProcess:
    """`mlx.launch -n ranks --backend ring` on our CLI (or on `script`, written to script_dir),
    on free loopback ports. The CLI reads the fixed cost curve (fixtures/fixed_cost_curve.py) unless
    `measured`: every rank still agrees on rank 0's curve, without timing three depths first (measured, each
    depth is timed `repeats` sweeps and no more)."""
    if script is not None:
        path = script_dir / "rank_script.py"
        path.write_text(script)
        program = [str(path)]
    else:
        program = ["-m", "fixtures.fixed_cost_curve"]
        if measured:
            env = {**env, "FIXTURE_MEASURE_CURVE": "1"}
    for _ in range(3):
        cmd = [sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()",
               "-n", str(ranks), "--backend", "ring", "--starting-port", str(_free_ports(ranks)),
               "--python", sys.executable, *program, *argv]
        proc = subprocess.run(cmd, env=_env(**env), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        if "Couldn't bind socket" not in proc.stderr:  # another process took a port between probe and bind
            return proc
    return proc


def _json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def sharded_pairs(models_root, tokenizer_dir, qwen3_tied_dirs, oracle_dirs):
    """{name: (target, drafter)}: dense (tensor parallel), hybrid qwen3_5 (tensor parallel, tape
    replay) and hybrid qwen3_next (mlx-lm pipelines it but has no tensor parallel)."""
    pairs = {"dense": qwen3_tied_dirs, "oracle": oracle_dirs}
    for n, kind in enumerate(("qwen3_5", "qwen3_next")):
        target, drafter = models_root / f"sharded-{kind}-target", models_root / f"sharded-{kind}-drafter"
        if not target.exists():
            write_hybrid_target(target, tokenizer_dir, kind, seed=70 + n)
            write_hybrid_drafter(drafter, target, seed=80 + n, block_size=8)
        pairs[kind] = (target, drafter)
    return pairs


def _unsharded_ar(target: Path) -> tuple[list[int], list[int], object]:
    pair = load_pair(target, None)
    ids = encode_prompt(pair.tokenizer, PROMPT, None)
    summary = [e for e in generate(pair, ids, GenerationSettings(mode="ar", max_tokens=TOKENS))
               if isinstance(e, SummaryEvent)][0]
    return ids, summary.token_ids, pair


@pytest.fixture(scope="module")
def sharded_run(sharded_pairs, tmp_path_factory, worker_id):
    """run(name) -> (process, trace): `generate` of that pair on two ranks with a trace, launched once
    per test session (the window opens the same run's trace): pytest-xdist's workers share each
    launch's result through the session's temporary folder, under a lock. A pair is written from
    the same seeds on every worker, so another worker's run is this one's."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker_id != "master" else base

    def run(name: str):
        done = shared / f"sharded-{name}.json"
        with FileLock(str(shared / f"sharded-{name}.lock")):
            if not done.exists():
                target, drafter = sharded_pairs[name]
                trace = tmp_path_factory.mktemp(f"sharded-{name}") / "run.jsonl"
                proc = launch(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", PROMPT,
                               "--max-tokens", str(TOKENS), "--json", "--trace", str(trace)])
                done.write_text(json.dumps({"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout,
                                            "stderr": proc.stderr, "trace": str(trace)}))
        kept = json.loads(done.read_text())
        return (subprocess.CompletedProcess(kept["args"], kept["returncode"], kept["stdout"], kept["stderr"]),
                Path(kept["trace"]))

    return run


@pytest.mark.parametrize("name,sharding", [("dense", "tensor"), ("oracle", "tensor"), ("qwen3_5", "tensor"),
                                           ("qwen3_next", "pipeline")])
@pytest.mark.slow  # starts ranks with mlx.launch
def test_two_ranks_give_the_unsharded_ar_tokens(sharded_pairs, sharded_run, name, sharding):
    target, drafter = sharded_pairs[name]
    ids, reference, pair = _unsharded_ar(target)
    proc, trace = sharded_run(name)
    outputs = _json_lines(proc.stdout)
    assert len(outputs) == 1, f"only rank 0 prints: {proc.stdout!r} {proc.stderr[-2000:]}"
    got = outputs[0]
    assert got["prompt_token_ids"] == ids
    k = first_divergence(reference, got["token_ids"])
    if k is not None:  # allowed only at a floating-point near-tie of the unsharded target
        margin = logit_margin(pair, ids, reference[:k])
        assert margin < NEAR_TIE, f"{name}: token {k} differs at a clear margin {margin:.4f}"
    header, records = read_trace(trace)
    assert header["model"]["distributed"]["ranks"] == 2
    assert header["model"]["distributed"]["backend"] == "ring"
    assert header["model"]["distributed"]["sharding"] == sharding
    assert header["model"]["distributed"]["collective_ms"] > 0
    assert [r for r in records if r["type"] == "summary"][0]["token_ids"] == got["token_ids"]
    if name == "oracle":  # every draft right: rounds accept whole blocks on the sharded target too
        assert all(r["accepted"] == len(r["drafted"]) for r in records if r["type"] == "round")
    assert not list(trace.parent.glob("*.partial")), "no partial trace left behind"


@pytest.mark.slow  # starts ranks with mlx.launch
def test_bench_under_launch_prints_ar_and_dflash_once(sharded_pairs, tmp_path):
    target, drafter = sharded_pairs["dense"]  # a hybrid target under launch: test_two_ranks_give_the_unsharded_ar_tokens
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"prompt": "class Stack:"}\n')
    proc = launch(["bench", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
                   "--max-tokens", "8", "--repeats", "1", "--json"])
    outputs = _json_lines(proc.stdout)
    assert len(outputs) == 1, proc.stderr[-2000:]
    result = outputs[0]
    assert len(result["per_prompt"]) == 2
    assert result["identical"] is True
    assert result["ar_tok_s"] > 0 and result["dflash_tok_s"] > 0


@pytest.mark.slow  # starts ranks with mlx.launch
def test_calibrate_under_launch_gives_every_rank_rank_0s_curve(sharded_pairs):
    target, drafter = sharded_pairs["dense"]
    proc = launch(["calibrate", "--target", str(target), "--drafter", str(drafter), "--block-size", "4",
                   "--repeats", "1", "--json"], measured=True)
    outputs = _json_lines(proc.stdout)
    assert len(outputs) == 1, proc.stderr[-2000:]
    curve = outputs[0]
    assert len(curve["verify_ms"]) == 4 and len(curve["draft_by_length_ms"]) == 4
    assert curve["draft_by_length_ms"][0] == 0 and all(d > 0 for d in curve["draft_by_length_ms"][1:])
    assert curve["cached"] is False  # ranks never read a per-host cache


@pytest.mark.slow  # starts ranks with mlx.launch
def test_rank_0s_clock_decides_every_ranks_calibration_sweeps(sharded_pairs, tmp_path):
    """How many timing sweeps a depth takes hangs on the clock, and each rank reads its own: here rank
    1's would always allow another and rank 0's never. Every rank takes rank 0's count; a rank that
    took a sweep more ran its verifies' collectives alone (`generate` with auto hung in 2 runs of 15)."""
    target, drafter = sharded_pairs["dense"]
    script = _rank_job(f"""
        from engine.decode.cost_curve import measure
        from engine.models.pair import load_pair
        pair = load_pair({str(target)!r}, {str(drafter)!r}, ranks=args.ranks)
        curve = measure(pair, block=4, repeats=1, budget_s=0.0 if args.ranks.rank == 0 else 1e9)
        with open({str(tmp_path)!r} + f"/rank{{args.ranks.rank}}.txt", "w") as out:  # only rank 0 prints
            out.write(str(curve.sweeps))
        return 0
    """)
    proc = launch([], script=script, script_dir=tmp_path, DFLASH_RANK_TIMEOUT="60", timeout=240)
    sweeps = [(tmp_path / f"rank{r}.txt").read_text() if (tmp_path / f"rank{r}.txt").exists() else None
              for r in (0, 1)]
    assert sweeps == ["1", "1"], (sweeps, proc.stdout, proc.stderr[-2000:])


@pytest.mark.slow  # starts ranks with mlx.launch
def test_parity_under_launch_reports_from_rank_0(sharded_pairs):
    target, drafter = sharded_pairs["qwen3_next"]  # pipeline
    proc = launch(["parity", "--target", str(target), "--drafter", str(drafter), "--prompt", PROMPT,
                   "--max-tokens", "16", "--json"])
    outputs = _json_lines(proc.stdout)
    assert len(outputs) == 1, proc.stderr[-2000:]
    assert outputs[0]["identical"] is True


@pytest.mark.slow  # starts ranks with mlx.launch
def test_a_model_mlx_lm_cannot_shard_is_named_in_one_line(models_root, tokenizer_dir):
    from fixtures import tiny_models as tm

    target = models_root / "unshardable-gemma3-target"
    if not target.exists():
        tm.write_target(target, tokenizer_dir, model_type="gemma3_text")
    proc = launch(["generate", "--target", str(target), "--mode", "ar", "--prompt", PROMPT, "--max-tokens", "4"])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "'gemma3_text'" in lines[0] and "neither tensor nor pipeline sharding" in lines[0]


@pytest.mark.slow  # starts ranks with mlx.launch
def test_heads_that_do_not_divide_are_refused_in_one_line(sharded_pairs):
    target, drafter = sharded_pairs["dense"]  # 4 attention heads, 2 key/value heads
    proc = launch(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", PROMPT,
                   "--max-tokens", "4"], ranks=3)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "3 ranks do not divide" in lines[0], proc.stderr[-2000:]
    assert "key/value heads" in lines[0] or "attention heads" in lines[0]
    assert "Traceback" not in proc.stderr
    assert "exited with code 2" in proc.stderr  # mlx.launch reports each rank's exit status


def _rank_job(handler_body: str) -> str:
    """A script for every rank: our run_command around a handler with this body."""
    head = textwrap.dedent("""
        import os, sys, time
        import mlx.core as mx
        from engine.runtime import distributed
        from engine.tools.cli_run import run_command

        class Args:
            command = "generate"
            debug = False

        def handler(args):
    """)
    tail = textwrap.dedent("""
        code = run_command(None, Args(), {"generate": handler})
        print(f"rank {os.environ['MLX_RANK']} exit {code}", flush=True)
        sys.exit(code)
    """)
    return head + textwrap.indent(textwrap.dedent(handler_body), "    ") + tail


@pytest.mark.slow  # starts ranks with mlx.launch
def test_a_rank_that_dies_gives_one_line_from_rank_0(tmp_path):
    """Rank 1 exits mid-job; rank 0, blocked in a collective, says so in one line and exits 2."""
    script = _rank_job("""
        if args.ranks.rank == 1:
            os._exit(3)
        x = mx.ones(4)
        for _ in range(100):
            x = distributed.from_root(x, args.ranks)
            mx.eval(x)
        return 0
    """)
    proc = launch([], script=script, script_dir=tmp_path)
    # rank 0 returns 2, or mlx.launch ends it first (its SIGTERM handler then exits 2); the launcher
    # may also report the kill of a rank that already finished
    said = [m for m in ("lost the connection to another rank", "because another rank failed") for _ in
            range(proc.stderr.count(m))]
    # whichever comes first: MLX's lost connection, or mlx.launch ending rank 0 because rank 1 failed
    assert len(said) == 1, [ln for ln in proc.stderr.splitlines() if "ring] Socket" not in ln]
    assert "rank 0 exit 2" in proc.stdout or "rank 0 exited with code 2" in proc.stderr


@pytest.mark.parametrize("code", [0, 2])
def test_sigterm_says_why_from_before_joining_until_a_failed_rank_exits(monkeypatch, code):
    """mlx.launch ends every rank once one fails, at any moment: while this one still leaves join()
    (seen: rank 0 silent, exit -15, 3 runs in 40), or after a failed command returned but before the
    process exited (exit -15 again). So the handler is in place as the group stands (not before:
    MLX's init holds the GIL, a Python handler could not run and mlx.launch would wait on the rank),
    and a failed command keeps it; a command that succeeded hands SIGTERM back as it found it."""
    import signal

    from engine.runtime import distributed
    from engine.tools import cli_run

    before = signal.getsignal(signal.SIGTERM)
    during_join = []

    def join(joined):
        during_join.append(signal.getsignal(signal.SIGTERM))  # while MLX's init waits: untouched
        joined()
        during_join.append(signal.getsignal(signal.SIGTERM))  # the group stands: in place
        return distributed.SINGLE  # one rank: nothing to shard, the handler runs as for any command

    monkeypatch.setattr(distributed, "launched_backend", lambda: "ring")
    monkeypatch.setattr(distributed, "join", join)

    class Args:
        command, debug = "generate", False

    try:
        assert cli_run.run_command(None, Args(), {"generate": lambda args: code}) == code
        assert during_join == [before, cli_run._terminated]
        assert signal.getsignal(signal.SIGTERM) is (before if code == 0 else cli_run._terminated)
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_error_line_is_written_with_sigterm_held_back(monkeypatch):
    """A SIGTERM landing mid-line ran the handler, which saw the line as said and exited: the job
    ended with no line (1 run in 45). While the line is written, SIGTERM waits."""
    import io
    import signal

    from engine.tools import cli_run

    held = []

    class Stderr(io.StringIO):
        def write(self, text):
            held.append(signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, set()))
            return super().write(text)

    monkeypatch.setattr(sys, "stderr", Stderr())
    monkeypatch.setattr(cli_run, "_SPOKE", False)
    cli_run._say("error: one line")
    cli_run._say("error: a second line is never written")
    assert sys.stderr.getvalue() == "error: one line\n" and held and all(held)
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # and is let through after


@pytest.mark.slow  # starts ranks with mlx.launch
def test_a_hung_rank_is_noticed_by_the_watchdog(tmp_path):
    """Rank 1 stops answering (but stays alive): rank 0's watchdog ends the job with one line."""
    script = _rank_job("""
        distributed.heartbeat()
        if args.ranks.rank == 1:  # hangs, and its own watchdog with it
            distributed._ARMED.stop()
            time.sleep(60)
        mx.eval(distributed.from_root(mx.ones(4), args.ranks))
        return 0
    """)
    proc = launch([], script=script, script_dir=tmp_path, DFLASH_RANK_TIMEOUT="2", timeout=90)
    # mlx.launch forwards each rank's stderr as it comes, so its own warnings may share our line
    assert proc.stderr.count("error: no progress for 2 s while running a round") == 1, proc.stderr[-2000:]
    assert "rank 0 exited with code 2" in proc.stderr


def _as_rank_0(argv: list[str], hostfile: Path, **env: str) -> subprocess.CompletedProcess:
    """Our CLI as rank 0 of a ring job described by `hostfile`, with no other rank started."""
    return subprocess.run([sys.executable, "-m", "engine.tools.cli", *argv],
                          env=_env(MLX_RANK="0", MLX_HOSTFILE=str(hostfile), **env), capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def test_a_wrong_hostfile_is_one_line_and_exit_2(qwen3_tied_dirs, tmp_path):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text("not json")
    target, drafter = qwen3_tied_dirs
    proc = _as_rank_0(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "x",
                       "--max-tokens", "2"], hostfile)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: the ring backend could not start")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_rank_whose_peers_never_come_is_ended(qwen3_tied_dirs, tmp_path):
    hostfile = tmp_path / "hosts.json"
    first = _free_ports(2)
    hostfile.write_text(json.dumps([[f"127.0.0.1:{first}"], [f"127.0.0.1:{first + 1}"]]))
    target, drafter = qwen3_tied_dirs
    proc = _as_rank_0(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "x",
                       "--max-tokens", "2"], hostfile, DFLASH_JOIN_TIMEOUT="2")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "error: waited 2 s for the other ranks to join the ring group: check that every rank was started, "
        "the hostfile's addresses and ports, and the firewall."]


def test_demo_refuses_to_run_under_launch(tmp_path):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([["127.0.0.1:1"], ["127.0.0.1:2"]]))
    proc = _as_rank_0(["demo"], hostfile)
    assert proc.returncode == 2
    assert "`demo` runs in one process" in proc.stderr


@pytest.mark.slow  # starts ranks with mlx.launch
def test_the_window_opens_a_sharded_runs_trace(qtbot, make_window, sharded_run):
    proc, trace = sharded_run("dense")
    assert trace.is_file(), proc.stderr[-2000:]
    w = make_window()
    assert w.open_trace(trace)
    assert "2 ranks (ring, tensor parallel" in w.status_line.labels["device"].toolTip()
    assert w.prompt.editor.toPlainText() == PROMPT
