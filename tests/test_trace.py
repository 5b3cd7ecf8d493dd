"""Traces: schema dflash-trace/1, flushed per round, and the Chrome export Perfetto opens."""

import json

import pytest

from app.cli import main as cli
from engine.errors import DFlashError
from engine.decode.events import RoundEvent
from engine.decode.generate import generate
from engine.decode.settings import LOOKUP_MAX_DRAFT, GenerationSettings
from engine.decode.prompts import encode_prompt
from engine.tools.trace import SCHEMA, TraceWriter, read_trace

from helpers import PROMPTS


def test_trace_schema_via_cli(qwen3_tied_dirs, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    argv = ["generate", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1]),
            "--prompt", PROMPTS[0], "--raw", "--max-tokens", "30", "--trace", str(trace), "--json"]
    assert cli(argv) == 0
    out = json.loads(capsys.readouterr().out)
    header, records = read_trace(trace)
    assert header["schema"] == SCHEMA
    for key in ("app_version", "mlx_version", "mlx_lm_version", "device", "target", "drafter", "target_config",
                "drafter_config", "settings", "prompt_ids"):
        assert header[key] is not None, key
    assert header["prompt_ids"] == out["prompt_token_ids"]
    assert header["prompt"] == {"text": PROMPTS[0], "format": "raw"}
    assert header["device"].split(" (")[0] in ("cpu", "gpu")  # as people name it, not MLX's 'Device(cpu, 0)'
    rounds = [r for r in records if r["type"] == "round"]
    assert len(rounds) == out["num_rounds"] + out["num_plain_steps"]  # auto's plain steps are recorded too
    for r in rounds:
        for key in ("index", "position", "anchor", "drafted", "accepted", "bonus", "committed", "draft_ms",
                    "verify_ms", "rollback_ms"):
            assert key in r
        assert len(r["drafted"]) <= (LOOKUP_MAX_DRAFT if r["source"] == "lookup" else 15)  # copies: the default
    summary = records[-1]
    assert summary["type"] == "summary" and summary["token_ids"] == out["token_ids"]
    committed = [t for r in rounds for t in r["committed"]]
    assert [out["token_ids"][0]] + committed == out["token_ids"]


def test_trace_is_valid_after_every_round(qwen3_pair, tmp_path):
    """Each round is on disk (in FILE.partial) before the next starts: a crash leaves a readable
    prefix there, and an earlier FILE stays whole until the new trace replaces it at the end."""
    path = tmp_path / "live.jsonl"
    path.write_text("the previous trace\n")
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[1], chat=False)
    seen = 0
    with TraceWriter(path) as writer:
        for event in generate(qwen3_pair, ids, GenerationSettings(max_tokens=20)):
            writer.write(event)
            if isinstance(event, RoundEvent):
                _, records = read_trace(writer.partial)
                assert [r for r in records if r["type"] == "round"][-1]["index"] == event.index
                assert path.read_text() == "the previous trace\n"
                seen += 1
    assert seen > 3
    assert read_trace(path)[1][-1]["type"] == "summary" and not writer.partial.exists()


def test_torn_last_line_is_dropped(qwen3_pair, tmp_path):
    path = tmp_path / "torn.jsonl"
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[1], chat=False)
    with TraceWriter(path) as writer:
        for event in generate(qwen3_pair, ids, GenerationSettings(max_tokens=10)):
            writer.write(event)
    text = path.read_text()
    path.write_text(text[: len(text) - 20])  # the crash hit mid-write of the summary
    header, records = read_trace(path)
    assert records and records[-1]["type"] != "summary"


def test_not_a_trace(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    with pytest.raises(DFlashError, match="dflash-trace/1"):
        read_trace(bad)


def test_chrome_export(qwen3_tied_dirs, tmp_path, capsys):
    trace, chrome = tmp_path / "run.jsonl", tmp_path / "run.chrome.json"
    assert cli(["generate", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1]),
                "--prompt", PROMPTS[0], "--raw", "--max-tokens", "30", "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    n_rounds = out["num_rounds"] + out["num_plain_steps"]  # a plain step is a verify of one position
    assert cli(["export", str(trace), "--chrome", str(chrome)]) == 0
    events = json.loads(chrome.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    tids = {name: {e["tid"] for e in slices if e["name"] == name} for name in ("draft", "verify", "rollback")}
    assert all(len(t) == 1 for t in tids.values()) and len(set.union(*tids.values())) == 3
    assert sum(e["name"] == "verify" for e in slices) == n_rounds
    for e in slices:
        assert e["dur"] >= 0 and e["ts"] >= 0
    # the prefill first (the most of a long prompt's run), every round after it
    prefill = [e for e in slices if e["name"] == "prefill"]
    assert len(prefill) == 1 and prefill[0]["dur"] == pytest.approx(out["prefill_s"] * 1e6)
    assert prefill[0]["args"]["prompt_tokens"] == len(out["prompt_token_ids"])
    assert min(e["ts"] for e in slices if e["name"] != "prefill") >= prefill[0]["dur"] - 1
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"tok/s", "acceptance length"} <= counters
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"draft", "verify", "rollback"} <= names
    process = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert process == [f"DFlash run: {qwen3_tied_dirs[0].name}"]
    assert "note:" not in capsys.readouterr().err
    # A trace cut short (its summary missing) exports what it holds and says so (it said nothing)
    lines = trace.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(line for line in lines if '"type": "summary"' not in line and '"type":"summary"' not in line))
    assert cli(["export", str(cut), "--chrome", str(tmp_path / "cut.json")]) == 0
    assert "note: the trace ends before its dflash run's summary" in capsys.readouterr().err


def test_traces_from_before_auto_verify_still_open(qwen3_tied_dirs, tmp_path, capsys):
    """Round records written before `verified`/`unverified` existed read back with their defaults."""
    trace = tmp_path / "run.jsonl"
    assert cli(["generate", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1]),
                "--prompt", PROMPTS[0], "--raw", "--max-tokens", "12", "--trace", str(trace), "--json"]) == 0
    capsys.readouterr()
    old = []
    for line in trace.read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "round":
            record.pop("verified"), record.pop("unverified")
        old.append(json.dumps(record))
    trace.write_text("\n".join(old) + "\n")
    from engine.decode.events import from_dict

    _, records = read_trace(trace)
    rounds = [from_dict(r) for r in records if r["type"] == "round"]
    assert rounds and all(r.verified is None and r.unverified == [] for r in rounds)


def test_parity_trace_holds_both_runs_and_the_verdict(qwen3_tied_dirs, tmp_path, capsys):
    """`parity --trace`: AR's run, DFlash's run, then the verdict `--json` printed (dflash-trace/2); a
    one-run reader sees the DFlash run, and Perfetto gets each run as its own process."""
    from engine.tools.trace import RUNS_SCHEMA, read_runs

    trace, chrome = tmp_path / "check.jsonl", tmp_path / "check.chrome.json"
    assert cli(["parity", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1]),
                "--prompt", PROMPTS[0], "--raw", "--max-tokens", "20", "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    saved = read_runs(trace)
    assert [r.header["mode"] for r in saved.runs] == ["ar", "dflash"]
    assert {r.header["schema"] for r in saved.runs} == {RUNS_SCHEMA}
    assert saved.runs[0].header["prompt"] == {"text": PROMPTS[0], "format": "raw"}
    summaries = [r.records[-1] for r in saved.runs]
    assert [s["type"] for s in summaries] == ["summary", "summary"]
    assert [len(s["token_ids"]) for s in summaries] == [out["ar_tokens"], out["dflash_tokens"]]
    assert out["identical"] and summaries[0]["token_ids"] == summaries[1]["token_ids"]
    assert {k: v for k, v in saved.parity.items() if k != "type"} == {k: out[k] for k in saved.parity if k != "type"}
    assert read_trace(trace)[0]["mode"] == "dflash"
    assert cli(["export", str(trace), "--chrome", str(chrome)]) == 0
    events = json.loads(chrome.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {1: f"AR run: {qwen3_tied_dirs[0].name}", 2: f"DFlash run: {qwen3_tied_dirs[0].name}"}
    assert {e["pid"] for e in events if e["ph"] == "X" and e["name"] != "prefill"} == {2}  # AR has no rounds
    assert {e["pid"] for e in events if e["name"] == "prefill"} == {1, 2}  # each run prefilled
    assert {e["pid"] for e in events if e["ph"] == "C" and e["name"] == "tok/s"} == {1, 2}

    # Damage is named: a bad verdict field, a record after the verdict, a second run in a one-run trace.
    lines = trace.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:-1] + [lines[-1].replace('"identical": true', '"identical": "yes"')]) + "\n")
    with pytest.raises(DFlashError, match="parity record's 'identical'"):
        read_runs(bad)
    bad.write_text("\n".join(lines + [lines[1]]) + "\n")
    with pytest.raises(DFlashError, match="after the parity record"):
        read_runs(bad)
    one_run = [line.replace(RUNS_SCHEMA, SCHEMA) for line in lines[:-1]]
    bad.write_text("\n".join(one_run) + "\n")
    with pytest.raises(DFlashError, match="a second run in a dflash-trace/1 trace"):
        read_runs(bad)


def test_parity_trace_is_not_begun_for_refused_settings(qwen3_tied_dirs, tmp_path, capsys):
    trace = tmp_path / "check.jsonl"
    assert cli(["parity", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1]),
                "--prompt", PROMPTS[0], "--raw", "--block-size", "1000", "--trace", str(trace)]) != 0
    assert "block size 1000" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_parity_check_stopped_midway_keeps_its_trace_so_far(qwen3_tied_dirs, tmp_path, capsys, monkeypatch):
    """Ctrl-C during the DFlash run: AR's whole run and DFlash's rounds so far stay in FILE.<pid>.partial,
    named on stderr; the trace is not put in place (it has no verdict)."""
    import engine.tools.parity as parity
    from engine.tools.trace import read_runs

    real = parity.generate

    def stopped_in_dflash(pair, ids, settings, *args, **kwargs):
        for n, event in enumerate(real(pair, ids, settings, *args, **kwargs)):
            if settings.mode == "dflash" and n == 4:
                raise KeyboardInterrupt
            yield event

    monkeypatch.setattr(parity, "generate", stopped_in_dflash)
    trace = tmp_path / "check.jsonl"
    code = cli(["parity", "--target", str(qwen3_tied_dirs[0]), "--drafter", str(qwen3_tied_dirs[1]),
                "--prompt", PROMPTS[0], "--raw", "--max-tokens", "16", "--block-size", "4", "--trace", str(trace)])
    assert code == 130 and not trace.exists()
    err = capsys.readouterr().err
    partial = next(tmp_path.glob("check.jsonl.*.partial"))
    assert f"the check did not finish; its trace so far is in {partial}" in err
    saved = read_runs(partial)
    assert [r.header["mode"] for r in saved.runs] == ["ar", "dflash"] and saved.parity is None
    assert saved.runs[0].records[-1]["type"] == "summary"
    kinds = [r["type"] for r in saved.runs[1].records]
    assert "round" in kinds and "summary" not in kinds
