"""`dflash-playground serve` on the demo pair, over a real socket, through the real `openai` and
`anthropic` packages: the served text is generate()'s, token for token at T=0, whatever the client,
the endpoint, streaming or not, and however many clients at once; a client that leaves mid-stream
stops its run; bad input is one 4xx line and the server goes on; the key is checked; a
conversation's next turn reuses its prefix.

One server for the whole session (the `serve` fixture), started as the command starts it, with a
fixed block size so no test waits for the cost curve that auto would measure.
"""

from __future__ import annotations

import json
import re
import socket
import threading

import httpx
import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from app.cli import main as cli  # noqa: E402
from engine.decode.generate import generate  # noqa: E402
from engine.decode.prompts import encode_messages, encode_prompt  # noqa: E402
from engine.decode.settings import GenerationSettings  # noqa: E402
from engine.models.demo import demo_pair  # noqa: E402
from engine.models.pair import load_pair  # noqa: E402
from engine.serve.cli import start_serving  # noqa: E402
from engine.tools.cli_parser import build_parser  # noqa: E402
from engine.serve.cli import add_parser  # noqa: E402

KEY = "test-key-123"
BLOCK = 16
CHAT = [{"role": "system", "content": "Small Python helpers."},
        {"role": "user", "content": "Return the n-th Fibonacci number."}]
CODE = "def fibonacci(n):\n"

pytestmark = pytest.mark.skipif(demo_pair() is None, reason="the demo pair is not installed")


@pytest.fixture(scope="session")
def serve():
    """The server, as `dflash-playground serve --port 0 --block-size 16 --api-key KEY` starts it (on a thread:
    the command then waits on it; its socket listens before it returns, so no test waits for it to start)."""
    args = build_parser(add_parser).parse_args(["serve", "--port", "0", "--block-size", str(BLOCK), "--api-key", KEY])
    serving = start_serving(args)
    yield serving.url, serving.server
    serving.stop()


@pytest.fixture(scope="session")
def pair():
    """The demo pair loaded again, apart from the server's, for generate()'s own output."""
    return load_pair(*demo_pair())


@pytest.fixture
def oai(serve):
    return openai.OpenAI(base_url=serve[0] + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture
def claude(serve):
    return anthropic.Anthropic(base_url=serve[0], api_key=KEY, max_retries=0)


def expected(pair, ids: list[int], max_tokens: int, stop=()) -> str:
    """generate()'s text for these prompt ids, with the server's settings (greedy, block 16, lookup)."""
    settings = GenerationSettings(block_size=BLOCK, lookup=True, max_tokens=max_tokens, stop_strings=tuple(stop),
                                  diagnostics=False)
    return list(generate(pair, ids, settings))[-1].text


def _streamed(chunks) -> tuple[str, list]:
    chunks = list(chunks)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def test_chat_streamed_and_whole_are_generates_text(oai, pair):
    want = expected(pair, encode_messages(pair.tokenizer, CHAT), 40)
    whole = oai.chat.completions.create(model="anything", messages=CHAT, max_tokens=40, temperature=0)
    assert whole.choices[0].message.content == want and whole.choices[0].finish_reason == "length"
    assert whole.model == "anything" and whole.object == "chat.completion"
    assert whole.usage.completion_tokens == 40
    assert whole.usage.prompt_tokens == len(encode_messages(pair.tokenizer, CHAT))
    figures = whole.model_extra["dflash"]
    assert figures["mode"] == "dflash" and figures["rounds"] + figures["plain_steps"] >= 1
    text, chunks = _streamed(oai.chat.completions.create(model="m", messages=CHAT, max_tokens=40, temperature=0,
                                                        stream=True, stream_options={"include_usage": True}))
    assert text == want
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert all(c.usage is None for c in chunks[:-1])


def test_the_cli_generate_of_the_same_messages_writes_the_same_text(oai, tmp_path, capsys):
    """As a new user checks it: `generate --prompt-file` with the messages, and the served stream."""
    conversation = tmp_path / "chat.json"
    conversation.write_text(json.dumps(CHAT))
    assert cli(["generate", "--prompt-file", str(conversation), "--max-tokens", "24", "--block-size", str(BLOCK),
                "--json"]) == 0
    generated = json.loads(capsys.readouterr().out)["text"]
    text, _ = _streamed(oai.chat.completions.create(model="m", messages=CHAT, max_tokens=24, stream=True))
    assert text == generated


def test_text_completions_continue_the_raw_prompt(oai, pair):
    want = expected(pair, encode_prompt(pair.tokenizer, CODE, chat=False), 32, stop=["\n\n"])
    whole = oai.completions.create(model="m", prompt=CODE, max_tokens=32, stop=["\n\n"])
    assert whole.choices[0].text == want and "\n\n" not in want
    assert whole.choices[0].finish_reason == ("stop" if len(want) and whole.usage.completion_tokens < 32 else "length")
    streamed = list(oai.completions.create(model="m", prompt=CODE, max_tokens=32, stop=["\n\n"], stream=True))
    assert "".join(c.choices[0].text for c in streamed) == want
    assert streamed[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_anthropic_messages_streamed_and_whole_are_generates_text(claude, pair):
    system, messages = CHAT[0]["content"], CHAT[1:]
    want = expected(pair, encode_messages(pair.tokenizer, CHAT), 30)
    whole = claude.messages.create(model="claude-anything", max_tokens=30, system=system, messages=messages)
    assert whole.content[0].text == want and whole.stop_reason == "max_tokens" and whole.model == "claude-anything"
    assert whole.usage.output_tokens == 30
    with claude.messages.stream(model="m", max_tokens=30, system=system, messages=messages) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == want and final.stop_reason == "max_tokens"


def test_three_clients_at_once_each_get_their_serial_text(oai, pair):
    prompts = [CODE, "import json\n\nclass Decoder:\n", "def add(a, b):\n"]
    want = [expected(pair, encode_prompt(pair.tokenizer, p, chat=False), 48) for p in prompts]
    got: dict[int, str] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            chunks = oai.completions.create(model="m", prompt=prompts[i], max_tokens=48, stream=True)
            got[i] = "".join(c.choices[0].text for c in chunks)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and [got.get(i) for i in range(3)] == want


def _cancelled(url: str) -> float:
    found = re.search(r'^dflash:request_success_total\{finished_reason="cancelled"\} (\S+)$',
                      httpx.get(url + "/metrics", headers={"x-api-key": KEY}).text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_client_that_leaves_mid_stream_stops_its_run_and_the_next_is_served(serve, oai, pair):
    url = serve[0]
    before = _cancelled(url)
    # comments to continue: the drafter's weakest text (a plain step a token), ~30 s to its 2000 tokens
    body = {"model": "m", "messages": CHAT, "max_tokens": 2000, "stream": True}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status_code == 200
            lines = (line for line in r.iter_lines() if line.startswith("data: {"))
            next(lines), next(lines)  # the role chunk, then the run's first text: it has begun
    # the next request queues behind the left one: by its answer, that run has ended, cancelled
    whole = oai.completions.create(model="m", prompt=CODE, max_tokens=16)
    assert whole.choices[0].text == expected(pair, encode_prompt(pair.tokenizer, CODE, chat=False), 16)
    assert _cancelled(url) == before + 1


def test_a_client_that_leaves_before_a_whole_answer_stops_its_run(serve, oai):
    """Not streamed: the client sends its request and hangs up at once; its run is cancelled too."""
    url = serve[0]
    before = _cancelled(url)
    body = json.dumps({"messages": CHAT, "max_tokens": 2000}).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"x-api-key: {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    assert oai.completions.create(model="m", prompt=CODE, max_tokens=4).usage.completion_tokens >= 1
    assert _cancelled(url) == before + 1


def test_the_next_turn_of_a_conversation_reuses_its_prefix(oai):
    first_turn = [{"role": "user", "content": "Write a class for a stack."}]
    first = oai.chat.completions.create(model="m", messages=first_turn, max_tokens=24)
    second_turn = first_turn + [{"role": "assistant", "content": first.choices[0].message.content},
                                {"role": "user", "content": "Now a queue."}]
    second = oai.chat.completions.create(model="m", messages=second_turn, max_tokens=24)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert second.model_extra["dflash"]["cached_tokens"] == second.usage.prompt_tokens_details.cached_tokens


def test_the_api_key_is_checked(serve):
    url = serve[0]
    for bad in ("wrong", ""):
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key=bad or "x", max_retries=0).models.list()
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key=bad or "x", max_retries=0).messages.create(
                model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    refused = httpx.get(url + "/v1/models")
    assert refused.status_code == 401 and "--api-key" in refused.json()["error"]["message"]
    assert httpx.get(url + "/health").status_code == 200  # a probe needs no key
    assert httpx.get(url + "/v1/models", headers={"x-api-key": KEY}).json()["data"][0]["id"] == "demo-target"


def _post(path: str, body, raw: bool = False):
    content = body if raw else json.dumps(body, ensure_ascii=True).encode()
    return path, content


MSG = [{"role": "user", "content": "hi"}]
BAD = [
    _post("/v1/chat/completions", b'{"messages": [', raw=True),  # malformed JSON
    _post("/v1/chat/completions", b'\xff\xfe{}', raw=True),  # not UTF-8
    _post("/v1/chat/completions", b'[1, 2]', raw=True),  # not an object
    _post("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800 x"}]}', raw=True),  # lone surrogate
    _post("/v1/chat/completions", {"messages": []}),
    _post("/v1/chat/completions", {"messages": MSG, "max_tokens": -5}),
    _post("/v1/chat/completions", {"messages": MSG, "max_tokens": 10**9}),
    _post("/v1/chat/completions", {"messages": MSG, "max_tokens": 5000}),  # past the context of 2048
    _post("/v1/completions", {"prompt": "x = 1\n" * 2000, "max_tokens": 4}),  # the prompt alone passes it
    _post("/v1/chat/completions", {"messages": MSG, "n": 2}),
    _post("/v1/chat/completions", {"messages": MSG, "logprobs": True}),
    _post("/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]}),
    _post("/v1/chat/completions", {"messages": MSG, "frobnicate": 1}),
    _post("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}),
    _post("/v1/chat/completions", {"messages": MSG, "temperature": -1}),
    _post("/v1/chat/completions", {"messages": MSG, "stop": [""]}),
    _post("/v1/completions", {"prompt": ["a", "b"]}),
    _post("/v1/messages", {"model": "m", "messages": MSG}),  # no max_tokens
    _post("/v1/messages", {"model": "m", "max_tokens": 4, "messages": []}),
    _post("/v1/messages", {"model": "m", "max_tokens": 4, "messages": MSG, "tools": [{"name": "f"}]}),
    _post("/v1/chat/completions", {"messages": MSG, "model": "../../etc/passwd", "top_k": 999999}),
]


def test_bad_requests_get_one_line_4xx_and_the_server_goes_on(serve, oai):
    url, headers = serve[0], {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    with httpx.Client(timeout=60) as client:
        for path, content in BAD:
            r = client.post(url + path, content=content, headers=headers)
            assert r.status_code == 400, (content[:80], r.text)
            body = r.json()
            message = body["error"]["message"]
            assert "\n" not in message and "unexpected" not in message and len(message) < 400, message
            if path == "/v1/messages":
                assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
            else:
                assert set(body["error"]) == {"message", "type", "param", "code"}
        huge = b'{"prompt": "' + b"x" * (5 * 1024 * 1024) + b'"}'
        r = client.post(url + "/v1/completions", content=huge, headers=headers)
        assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
        assert client.get(url + "/v1/nothing", headers=headers).status_code == 404
        assert client.get(url + "/v1/chat/completions", headers=headers).status_code == 405
    ok = oai.chat.completions.create(model="m", messages=MSG, max_tokens=4)
    assert ok.usage.completion_tokens >= 1
