"""A chat history as the model sees it in a chat: a prompt that is a JSON list of {"role", "content"}
messages goes through the chat template whole (one user message otherwise), in generate, parity and bench."""

from __future__ import annotations

import json

import pytest

from app.cli import main as cli
from engine.decode.prompts import conversation, encode_prompt
from engine.errors import SettingsError
from engine.models.pair import load_pair
from fixtures import tiny_models as tm

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
CHAT = [{"role": "system", "content": "You write Python."},
        {"role": "user", "content": "def add(a, b):"},
        {"role": "assistant", "content": "    return a + b"},
        {"role": "user", "content": "Now subtract."}]


@pytest.fixture(scope="module")
def chat_dirs(models_root, tokenizer_dir, tmp_path_factory):
    """The tiny pair with a chat template in its tokenizer_config.json."""
    tok = tm.tokenizer_with(tokenizer_dir, tmp_path_factory.mktemp("chat-tokenizer"), TEMPLATE)
    target, drafter = models_root / "chat-target", models_root / "chat-drafter"
    if not target.exists():
        tm.write_target(target, tok, seed=21)
        tm.write_drafter(drafter, target, seed=22)
    return target, drafter


def test_a_conversation_goes_through_the_template_whole(chat_dirs):
    tokenizer = load_pair(*chat_dirs).tokenizer
    text = json.dumps(CHAT)
    ids = encode_prompt(tokenizer, text, chat=True)
    rendered = "".join(f"<|{m['role']}|>{m['content']}\n" for m in CHAT) + "<|assistant|>"
    assert ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert ids != encode_prompt(tokenizer, "pasted: " + text, chat=True)  # one user message holding the text
    assert encode_prompt(tokenizer, text, chat=None) == ids  # auto: the template, as the tokenizer has one
    # raw sends the JSON as it is
    assert encode_prompt(tokenizer, text, chat=False) == list(tokenizer.encode(text))
    # ending with the assistant's message: the reply goes on from its text, no new turn
    go_on = encode_prompt(tokenizer, json.dumps(CHAT[:3]), chat=True)
    assert tokenizer.decode(go_on).endswith("<|assistant|>    return a + b")


@pytest.mark.parametrize("text, says", [
    ('[{"role": "user", "content": "hi"},]', "not valid JSON"),
    ('[{"role": "user", "content": "hi"}, {"role": "assistant"}]', 'message 2 of the conversation needs a "role"'),
    ('[{"role": "user", "content": ["a", "b"]}]', 'message 1 of the conversation needs'),
])
def test_text_that_begins_as_a_conversation_but_is_not_one_is_refused(text, says):
    with pytest.raises(SettingsError, match=says) as refused:
        conversation(text)
    assert "--raw" in str(refused.value)
    assert conversation("Explain [this] list") is None and conversation('Say "role" twice') is None


def test_the_commands_take_conversations(chat_dirs, tmp_path, capsys):
    target, drafter = chat_dirs
    pair = ["--target", str(target), "--drafter", str(drafter)]
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT, indent=1))  # as a user saves one: several lines
    ids = encode_prompt(load_pair(*chat_dirs).tokenizer, json.dumps(CHAT), chat=True)
    assert cli(["generate", *pair, "--prompt-file", str(chat), "--max-tokens", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_token_ids"] == ids
    assert cli(["parity", *pair, "--prompt-file", str(chat), "--max-tokens", "12", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identical"] is True

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": CHAT}) + "\n" + json.dumps({"prompt": "def add(a, b):"}) + "\n")
    assert cli(["bench", *pair, "--prompts", str(prompts), "--max-tokens", "8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["per_prompt"]
    assert [r["prompt_tokens"] for r in rows][0] == len(ids) and len(rows) == 2
    assert cli(["bench", *pair, "--prompts", str(prompts), "--max-tokens", "8", "--raw"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith('prompt 1 is a conversation ("messages"), which goes through the chat template; run without '
                        "--raw.") and len(err.splitlines()) == 1
    bad = tmp_path / "bad.json"
    bad.write_text('[{"role": "user", "content": "hi"},]')
    assert cli(["generate", *pair, "--prompt-file", str(bad), "--max-tokens", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not valid JSON" in err and len(err.splitlines()) == 1 and "unexpected" not in err


def test_a_conversation_is_never_sent_as_its_json_without_being_asked(chat_dirs, models_root, tokenizer_dir, tmp_path,
                                                                     capsys):
    """Two ways a conversation went in as JSON text with no word (a review): a tokenizer without a chat
    template (auto fell back to raw), and bench lines whose messages have no roles (ShareGPT's
    "from"/"value", read as one user message). Raw, asked for, still sends the JSON as it is."""
    target = models_root / "no-chat-target"
    if not target.exists():
        (tmp_path / "no-chat-tokenizer").mkdir()
        tm.write_target(target, tm.tokenizer_with(tokenizer_dir, tmp_path / "no-chat-tokenizer", None), seed=23)
    plain = load_pair(target, None).tokenizer
    assert not plain.has_chat_template
    text = json.dumps(CHAT)
    with pytest.raises(SettingsError, match="no chat template") as refused:
        encode_prompt(plain, text)
    assert "--raw" in str(refused.value)
    assert encode_prompt(plain, text, chat=False) == list(plain.encode(text))
    assert encode_prompt(plain, "Explain [this] list") == list(plain.encode("Explain [this] list"))

    target, drafter = chat_dirs
    pair = ["--target", str(target), "--drafter", str(drafter)]
    for messages, says in (([{"from": "human", "value": "hi"}], 'message 1 of the conversation needs a "role"'),
                           ([], "has no string field 'prompt' or a non-empty list 'messages'")):
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n" + json.dumps({"messages": messages}) + "\n")
        assert cli(["bench", *pair, "--prompts", str(prompts), "--max-tokens", "8"]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1 and "unexpected" not in err, err
