"""The server's parts on the tiny fixture pairs: the prefix cache kept for several conversations,
the bounded queue (429 with Retry-After), a model without a chat template refused for chat with the
way out named, the demo target's conversation template, and the command's start-up refusals."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from app.cli import main as cli  # noqa: E402
from engine.decode.generate import generate  # noqa: E402
from engine.decode.prefix_cache import PrefixCache  # noqa: E402
from engine.decode.prompts import CONVERSATION_TEMPLATE, encode_messages, encode_prompt  # noqa: E402
from engine.decode.settings import GenerationSettings  # noqa: E402
from engine.models.demo import demo_pair  # noqa: E402
from engine.models.pair import load_pair  # noqa: E402
from engine.serve.app import Server, create_app  # noqa: E402
from engine.decode.events import SummaryEvent  # noqa: E402
from engine.serve.engine_queue import END, EngineQueue, Job, QueueFull  # noqa: E402
from engine.serve.prompting import ServeConfig  # noqa: E402

from helpers import PROMPTS  # noqa: E402

from fixtures import tiny_models as tm  # noqa: E402

SETTINGS = GenerationSettings(max_tokens=12)


def _run(pair, text, prefix):
    ids = encode_prompt(pair.tokenizer, text, chat=False)
    return list(generate(pair, ids, SETTINGS, prefix=prefix))[-1], ids


@pytest.mark.parametrize("capacity, reused", [(2, True), (1, False)])
def test_interleaved_conversations_each_find_their_prefix(qwen3_pair, capacity, reused):
    """Two clients' turns interleave: with room for both, each next turn starts from its own last
    prompt's caches (and writes a cold run's tokens); with one entry, as the window keeps, the other
    client's turn has taken its place."""
    prefix = PrefixCache(capacity)
    a1, a1_ids = _run(qwen3_pair, PROMPTS[0], prefix)
    _run(qwen3_pair, PROMPTS[1], prefix)
    a2, a2_ids = _run(qwen3_pair, PROMPTS[0] + a1.text + PROMPTS[3], prefix)
    assert a2_ids[:len(a1_ids)] == a1_ids
    assert (a2.reused_tokens == len(a1_ids)) is reused and (a2.reused_tokens == 0) is not reused
    cold, _ = _run(qwen3_pair, PROMPTS[0] + a1.text + PROMPTS[3], None)
    assert a2.token_ids == cold.token_ids
    assert len(prefix) <= capacity


def test_the_queue_is_bounded_and_runs_jobs_in_order(qwen3_pair):
    engine = EngineQueue(qwen3_pair, max_waiting=1)
    entered, release, b_done, order = threading.Event(), threading.Event(), threading.Event(), []
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[0], chat=False)

    def blocking(item):
        order.append("a")
        entered.set()
        release.wait(30)

    def done_b(item):
        order.append(item)
        if item is END or isinstance(item, BaseException):
            b_done.set()

    first = Job(ids, SETTINGS, blocking)
    engine.submit(first)
    assert entered.wait(30)  # the decode thread is inside the first job: it no longer waits
    engine.submit(Job(ids, SETTINGS, done_b))  # one waits
    with pytest.raises(QueueFull) as full:
        engine.submit(Job(ids, SETTINGS, done_b))
    assert full.value.retry_after_s >= 1 and "busy" in str(full.value)
    first.cancel.cancel()
    release.set()
    assert b_done.wait(60)
    engine.close()
    assert order[0] == "a" and order[-1] is END and isinstance(order[-2], SummaryEvent) and engine.waiting == 0
    assert order.index(order[-2]) > max(i for i, x in enumerate(order) if x == "a")  # the first job ran first


def test_a_full_queue_is_429_with_retry_after(qwen3_pair):
    engine = EngineQueue(qwen3_pair, max_waiting=0)
    config = ServeConfig(GenerationSettings(diagnostics=False), model_id="tiny")
    with TestClient(create_app(Server(qwen3_pair, config, engine))) as client:
        r = client.post("/v1/completions", json={"prompt": "def f():", "max_tokens": 4})
    engine.close()
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error"


@pytest.fixture(scope="module")
def plain_dirs(models_root, tokenizer_dir, tmp_path_factory):
    """A tiny pair whose tokenizer has no chat template (and no conversation template)."""
    target, drafter = models_root / "serve-plain-target", models_root / "serve-plain-drafter"
    if not target.exists():
        tok = tm.tokenizer_with(tokenizer_dir, tmp_path_factory.mktemp("plain-tokenizer"), None)
        tm.write_target(target, tok, seed=31)
        tm.write_drafter(drafter, target, seed=32)
    return target, drafter


def test_chat_to_a_model_without_a_template_names_the_completions_endpoint(plain_dirs):
    pair = load_pair(*plain_dirs)
    engine = EngineQueue(pair)
    config = ServeConfig(GenerationSettings(diagnostics=False), model_id="plain")
    with TestClient(create_app(Server(pair, config, engine))) as client:
        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        claude = client.post("/v1/messages", json={"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        text = client.post("/v1/completions", json={"prompt": "def f():", "max_tokens": 4})
    engine.close()
    assert chat.status_code == 400 and "/v1/completions" in chat.json()["error"]["message"]
    assert claude.status_code == 400 and "/v1/completions" in claude.json()["error"]["message"]
    assert text.status_code == 200 and text.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.skipif(demo_pair() is None, reason="the demo pair is not installed")
def test_the_demo_target_writes_a_conversation_as_code_and_a_plain_prompt_raw():
    target, _ = demo_pair()
    assert (target / CONVERSATION_TEMPLATE).is_file()
    tokenizer = load_pair(target, None).tokenizer
    assert not tokenizer.has_chat_template  # a plain prompt stays raw (tests/test_demo_pairs.py)
    chat = [{"role": "system", "content": "Helpers."}, {"role": "user", "content": "Sort a list.\n\nIn place."},
            {"role": "assistant", "content": "\n    xs.sort()\n"}, {"role": "user", "content": 'Now """reverse""".'}]
    want = ('# Helpers.\ndef answer():\n    """Sort a list.\n\n    In place."""\n    xs.sort()\n\n\n'
            'def answer():\n    """Now \'\'\'reverse\'\'\'."""\n')
    assert encode_messages(tokenizer, chat) == tokenizer.encode(want, add_special_tokens=False)
    assert encode_prompt(tokenizer, json.dumps(chat)) == encode_messages(tokenizer, chat)  # a conversation prompt
    assert encode_prompt(tokenizer, "def f():\n") == tokenizer.encode("def f():\n")
    bench = [json.loads(line)["prompt"] for line in
             (Path(__file__).resolve().parents[1] / "resources/models/recipe/bench_prompts.jsonl").read_text().splitlines() if line.strip()]
    assert bench and all(encode_prompt(tokenizer, p) == tokenizer.encode(p) for p in bench)  # bench's ids stay raw
    go_on = encode_messages(tokenizer, chat[:3])  # ending with the assistant's message: continued from its text
    assert tokenizer.decode(go_on).endswith('In place."""\n\n    xs.sort()\n')


@pytest.mark.parametrize("argv, says", [
    (["--port", "70000"], "port 70000 is outside 0..65535"),
    (["--host", "no.such.host.invalid"], "is not an address this machine can listen on"),
    (["--max-queue", "-1"], "--max-queue -1 is below 0"),
    (["--mode", "dflash", "--block-size", "40"], "block size 40 is outside"),
])
def test_serve_refuses_bad_options_in_one_line(qwen3_tied_dirs, argv, says, capsys):
    target, drafter = qwen3_tied_dirs
    assert cli(["serve", "--target", str(target), "--drafter", str(drafter), "--port", "0", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "unexpected" not in err[0], err


def test_another_host_than_this_machine_is_warned_of(qwen3_tied_dirs, capsys):
    target, drafter = qwen3_tied_dirs
    argv = ["serve", "--target", str(target), "--drafter", str(drafter), "--host", "0.0.0.0", "--port", "0"]
    assert cli(argv + ["--block-size", "40"]) == 2  # refused after the bind: the warning has been said
    warning, error = capsys.readouterr().err.strip().splitlines()
    assert "other machines on the network can reach this server" in warning and "no --api-key" in warning
    assert error.startswith("error: block size 40")


def test_closing_the_queue_stops_the_running_job_and_refuses_the_waiting(qwen3_pair):
    engine = EngineQueue(qwen3_pair, max_waiting=2)
    entered, release, got = threading.Event(), threading.Event(), {"a": [], "b": []}
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[0], chat=False)

    def first(item):  # held at its first event until the close has cancelled it
        got["a"].append(item)
        entered.set()
        release.wait(30)

    running = Job(ids, GenerationSettings(max_tokens=200), first)
    engine.submit(running)
    engine.submit(Job(ids, SETTINGS, got["b"].append))
    assert entered.wait(30)  # the first job runs
    closer = threading.Thread(target=engine.close, args=(60,))
    closer.start()
    assert running.cancel.wait(30)
    release.set()
    closer.join(60)
    summary = next(e for e in got["a"] if isinstance(e, SummaryEvent))
    assert summary.stop_reason == "cancelled" and summary.num_generated < 200
    assert len(got["b"]) == 1 and "shutting down" in str(got["b"][0])


def test_call_runs_other_work_on_the_decode_thread_in_turn(qwen3_pair):
    """The window's worker, while the window serves its pair, hands its runs to the queue: they run on
    the decode thread, their result or error comes back, and one cancelled before its turn never runs."""
    engine = EngineQueue(qwen3_pair)
    assert engine.call(lambda: threading.current_thread().name) == "dflash-decode"
    with pytest.raises(ValueError, match="bad"):
        engine.call(lambda: (_ for _ in ()).throw(ValueError("bad")))
    from engine.decode.cancel import CancelToken
    from engine.serve.engine_queue import NotRun

    cancelled, ran = CancelToken(), []
    cancelled.cancel()
    with pytest.raises(NotRun):
        engine.call(lambda: ran.append(1), cancelled)
    engine.close()
    assert not ran


def test_metrics_count_drafted_and_accepted_tokens_per_position():
    """vLLM's per-position speculative counters: a round of 3 drafts with 1 accepted, then one of 5 with
    4 accepted; a plain step (nothing drafted) counts nowhere."""
    import re

    from engine.decode.events import RoundEvent
    from engine.serve.metrics import Metrics

    metrics = Metrics(lambda: 0, lambda: 0)
    for drafted, accepted in ((3, 1), (5, 4), (0, 0)):
        metrics.observe(RoundEvent(index=0, position=0, anchor=1, drafted=[7] * drafted, accepted=accepted, bonus=2,
                                   bonus_kind="correction", committed=[2], draft_ms=0.0, verify_ms=0.0,
                                   rollback_ms=0.0, t=0.0, generated=1))
    text = metrics.text().decode()

    def per_position(name: str) -> dict[int, float]:
        return {int(p): float(v) for p, v in re.findall(rf'^dflash:{name}_total\{{position="(\d+)"\}} (\S+)$', text, re.M)}

    assert per_position("spec_decode_num_draft_tokens_per_pos") == {0: 2, 1: 2, 2: 2, 3: 1, 4: 1}
    assert per_position("spec_decode_num_accepted_tokens_per_pos") == {0: 2, 1: 1, 2: 1, 3: 1, 4: 0}
    assert re.search(r"^dflash:spec_decode_num_drafts_total 2\.0$", text, re.M)
