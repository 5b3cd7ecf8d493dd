"""Round mechanics on a hand-built pair where every draft is right, plus cut, stop and cancel."""

from engine.decode.events import RoundEvent, SummaryEvent, TextEvent
from engine.decode.cancel import CancelToken
from engine.decode.generate import generate
from engine.decode.settings import GenerationSettings
from engine.decode.prompts import encode_prompt
from engine.models.pair import load_pair

from helpers import PROMPTS, in_thread, run


def test_every_draft_accepted_runs_bonus_path(oracle_pair, oracle_ids):
    first, second = oracle_ids
    summary, rounds = run(oracle_pair, "hello world", max_tokens=1 + 16 * 3, block_size=16)
    assert summary.token_ids == [first] + [second] * 48
    assert len(rounds) == 3
    for r in rounds:
        assert r.accepted == 15 and r.bonus_kind == "bonus"
        assert r.drafted == [second] * 15
        assert r.committed == [second] * 16
    assert summary.mean_acceptance_length == 16.0
    assert summary.acceptance_histogram[15] == 3
    assert summary.per_position_acceptance == [1.0] * 15
    ar, _ = run(oracle_pair, "hello world", mode="ar", max_tokens=49)
    assert ar.token_ids == summary.token_ids


def test_positions_advance_by_committed_tokens(oracle_pair):
    summary, rounds = run(oracle_pair, "hello world", max_tokens=40, block_size=8)
    prompt_len = summary.prompt_tokens
    assert rounds[0].position == prompt_len
    for a, b in zip(rounds, rounds[1:]):
        assert b.position == a.position + a.accepted + 1
        assert b.anchor == a.bonus


def test_max_tokens_cuts_inside_accepted_block(oracle_pair):
    summary, rounds = run(oracle_pair, "hello world", max_tokens=20, block_size=16)
    assert summary.num_generated == 20 and summary.stop_reason == "max_tokens"
    # 1 from prefill + 16 in round 0; the last block is only 3 long.
    assert [len(r.committed) for r in rounds] == [16, 3]
    assert len(rounds[-1].drafted) == 2


def test_eos_inside_accepted_block_ends_like_ar(oracle_eos_dirs, oracle_ids):
    pair = load_pair(*oracle_eos_dirs)
    first, second = oracle_ids
    df, rounds = run(pair, "hello world", max_tokens=64)
    ar, _ = run(pair, "hello world", mode="ar", max_tokens=64)
    assert df.token_ids == ar.token_ids == [first, second]
    assert df.stop_reason == ar.stop_reason == "eos"
    assert rounds[0].accepted == 15  # the EOS was the first of 15 accepted drafts
    assert rounds[0].committed == [second]


def test_stop_string_ends_where_ar_ends(qwen3_pair):
    ar, _ = run(qwen3_pair, PROMPTS[0], mode="ar", max_tokens=40)
    stop = ar.text[10:13]
    assert stop
    ar_s, _ = run(qwen3_pair, PROMPTS[0], mode="ar", max_tokens=40, stop_strings=(stop,))
    df_s, _ = run(qwen3_pair, PROMPTS[0], max_tokens=40, stop_strings=(stop,))
    assert df_s.stop_reason == ar_s.stop_reason == "stop_string"
    assert df_s.token_ids == ar_s.token_ids
    assert df_s.text == ar_s.text and stop not in df_s.text


def test_cancel_stops_within_a_round_and_summarises(qwen3_pair):
    """Stop ends the run at the end of the round in progress. With the tables computed on the host (MLX
    on the CPU) a round is given out once the next one is done, so that next one is the round in
    progress when the consumer sees round 2: it comes out too, then the summary."""
    import mlx.core as mx

    from engine.runtime.streams import STREAM

    in_progress = int(STREAM.device == mx.cpu)
    cancel = CancelToken()
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[0], chat=False)
    events = []
    for event in generate(qwen3_pair, ids, GenerationSettings(max_tokens=200), cancel):
        events.append(event)
        if isinstance(event, RoundEvent) and event.index == 2:
            cancel.cancel()
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    summary = events[-1]
    assert isinstance(summary, SummaryEvent)
    assert len(rounds) == 3 + in_progress
    assert summary.stop_reason == "cancelled"
    assert summary.num_generated == rounds[-1].generated < 200


def test_events_hold_plain_python_data(qwen3_pair):
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[1], chat=False)

    def plain(value):
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return all(plain(v) for v in value)
        return value is None or isinstance(value, (bool, int, float, str))

    from engine.decode.events import to_dict

    for event in generate(qwen3_pair, ids, GenerationSettings(max_tokens=20)):
        assert plain(to_dict(event)), event


def test_generation_from_a_worker_thread(qwen3_pair):
    """MLX needs a thread-local stream in a new thread; results must match the main thread's."""
    main, _ = run(qwen3_pair, PROMPTS[2], max_tokens=24)
    summary, _ = in_thread(lambda: run(qwen3_pair, PROMPTS[2], max_tokens=24))
    assert summary.token_ids == main.token_ids


def test_text_events_rebuild_the_output(qwen3_pair):
    ids = encode_prompt(qwen3_pair.tokenizer, PROMPTS[3], chat=False)
    events = list(generate(qwen3_pair, ids, GenerationSettings(max_tokens=30)))
    texts = [e for e in events if isinstance(e, TextEvent)]
    summary = events[-1]
    assert "".join(e.text for e in texts) == summary.text
    assert [t for e in texts for t in e.token_ids] == summary.token_ids


def test_partial_accept_then_correction(alternating_pair, oracle_ids):
    first, second = oracle_ids
    third = 300
    pair = alternating_pair
    df, rounds = run(pair, "hello world", max_tokens=21, block_size=16)
    ar, _ = run(pair, "hello world", mode="ar", max_tokens=21)
    assert df.token_ids == ar.token_ids == [first] + [second, third] * 10
    for r in rounds[:-1]:
        assert r.accepted == 1 and r.bonus_kind == "correction"
        assert r.committed == [second, third]
    # The last block is cut to 2 by max tokens: its one draft is accepted, so a true bonus follows.
    assert len(rounds[-1].drafted) == 1 and rounds[-1].bonus_kind == "bonus"
    assert df.mean_acceptance_length == 2.0
    assert df.acceptance_histogram[1] == len(rounds) == 10
    assert df.per_position_acceptance[:2] == [1.0, 0.0]


def test_loading_from_a_worker_thread(qwen3_tied_dirs):
    """The app loads models on its worker thread; that needs the engine's thread-local stream."""
    summary, _ = in_thread(lambda: run(load_pair(*qwen3_tied_dirs), PROMPTS[2], max_tokens=8))
    assert summary.num_generated == 8


def test_output_that_starts_with_a_space_keeps_it(models_root, tokenizer_dir):
    """The text shown is the tokenizer's decode of the tokens, even where it begins with a space
    (an indented line after a prompt that ends in a newline)."""
    from tokenizers import Tokenizer

    from fixtures import tiny_models as tm

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    spaced = [i for i in tok.encode("x = 1 return value").ids if tok.decode([i]).startswith(" ")]
    first, second = spaced[0], spaced[-1]
    pair = load_pair(*tm.write_oracle_pair(models_root / "spaced", tokenizer_dir, first, second, name="spaced"))
    for mode in ("ar", "dflash"):
        summary, _ = run(pair, "hello world", mode=mode, max_tokens=5)
        assert summary.token_ids == [first] + [second] * 4
        assert summary.text == pair.tokenizer.decode(summary.token_ids)
        assert summary.text.startswith(" ")
