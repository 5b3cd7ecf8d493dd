"""The peer comparison's checks and table (engine/tools/peer_bench.py): the peers themselves run in
their own venv and are not part of the suite (docs/peers.md)."""

import json
import sys

import pytest

from engine.errors import DFlashError
from engine.tools import peer_bench
from engine.tools.peer_report import fastest, format_table, peer_figures


def test_unknown_or_no_peer_is_one_clear_line():
    with pytest.raises(DFlashError, match="unknown peer 'dflsh'; choose from zlab, dflash-mlx"):
        peer_bench.parse_peers("zlab,dflsh")
    with pytest.raises(DFlashError, match="name at least one"):
        peer_bench.parse_peers(" , ")
    assert peer_bench.parse_peers("dspark, zlab,dspark") == ["dspark", "zlab"]


def test_missing_peer_python_is_said_before_anything_runs(tmp_path, capsys):
    code = peer_bench.main(["--peer-python", str(tmp_path / "nope" / "python"), "--prompts", str(tmp_path / "p.jsonl")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert "no such executable; make the peer venv first (docs/peers.md)" in err


def test_missing_peer_package_names_it_and_how_to_install(monkeypatch):
    # A real probe of a real python (this one), for a module it cannot have.
    monkeypatch.setitem(peer_bench.PEERS, "dspark", "no_such_peer_module")
    monkeypatch.setitem(peer_bench.INSTALL, "no_such_peer_module", "no-such-peer==1.0")
    with pytest.raises(DFlashError, match=r"no_such_peer_module is not installed in .*: .*pip install no-such-peer==1.0"):
        peer_bench.check_peer_python(sys.executable, ["dspark"])
    peer_bench.check_peer_python(sys.executable, [])  # mlx_lm is here: nothing missing, nothing said


def _line(i, tokens, seconds, ar_tokens, rounds):
    peer = {"tokens": tokens, "decode_s": seconds, "own_tok_s": 1.0, "rounds": rounds}
    return {"prompt": i, "peer": {**peer, **({} if rounds else {"fallback_ar": "no drafter"})},
            "ar": {"tokens": ar_tokens, "decode_s": 1.0}}


def test_figures_pool_truncate_overshoot_and_flag_output_that_is_not_ars():
    ar = list(range(8))
    lines = [{"loaded": "x"},
             _line(0, ar + [8, 9], 0.5, ar, 3),  # overshoots max_tokens: the extra two neither count nor differ
             _line(1, ar[:4] + [99] + ar[5:], 1.5, ar, 4)]
    p = peer_figures(lines, max_tokens=8)
    first, second = p["per_prompt"]
    assert first["tokens"] == 8 and first["tok_s"] == 16.0 and first["identical"] == 1 and first["tau"] == 7 / 3
    assert second["identical"] == 0
    assert p["overall"]["tok_s"] == 16 / 2.0 and p["overall"]["ar_tok_s"] == 8.0 and p["overall"]["identical"] == 1
    assert p["overall"]["speedup"] == 1.0 and p["error"] is None


def test_repeats_pool_per_prompt_and_a_failed_run_fails_its_prompt():
    ar = list(range(8))
    lines = [_line(0, ar, 1.0, ar, 4), _line(0, ar, 0.6, ar, 2),  # two repeats of prompt 0
             _line(1, ar, 1.0, ar, 4), {"prompt": 1, "repeat": 1, "error": "IndexError: out of range"}]
    p = peer_figures(lines, max_tokens=8)
    first, second = p["per_prompt"]
    assert first["runs"] == 2 and first["tok_s"] == 16 / 1.6 and first["tau"] == 14 / 6
    assert second == {"error": "IndexError: out of range"}
    assert p["overall"]["runs"] == 2 and p["overall"]["tok_s"] == first["tok_s"]  # the failed prompt left out
    table = format_table({"per_prompt": [{"dflash_tok_s": 20.0}]}, {"peer": p}, ["a", "b"])
    assert "1 prompt(s) failed" in table and table.splitlines()[3].split()[-1] == "failed"


def test_table_gives_ours_over_each_peer_and_names_the_fastest_and_the_failed():
    ar = list(range(10))
    peers = {"slow": peer_figures([_line(0, ar, 1.0, ar, 5), _line(1, ar, 1.0, ar, 5)], 10),
             "fast": peer_figures([_line(0, ar, 0.5, ar, 5), _line(1, ar[:9] + [7], 0.25, ar, 5)], 10),
             "gave-up": peer_figures([_line(0, ar, 2.0, ar, 0)], 10),
             "broken": peer_figures([{"error": "dspark could not load the pair: KeyError: 'fc.weight'"}], 10)}
    ours = {"dflash_tok_s": 30.0, "ar_tok_s": 10.0, "speedup": 3.0, "mean_acceptance_length": 2.5,
            "per_prompt": [{"dflash_tok_s": 20.0, "identical": True}, {"dflash_tok_s": 40.0, "identical": True}]}
    assert fastest(peers) == ("fast", 20 / 0.75)
    table = format_table(ours, peers, ["def f():\n    return 1\n", "class A:\n"])
    rows = table.splitlines()
    assert rows[2].startswith("def f(): return 1") and "10.0   2.00x" in rows[2] and "20.0   1.00x" in rows[2]
    assert "40.0   1.00x!" in rows[3]  # its second output was not AR's
    assert rows[4].startswith("overall") and "3.00x" in rows[4] and "1.12x" in rows[4]
    assert "fastest peer: fast at 26.7 tok/s; ours 1.12x" in table
    gave_up = next(row for row in rows if row.startswith("gave-up"))
    assert gave_up.split()[1:3] == ["5.0", "-"] and "1 run(s) fell back to AR" in gave_up  # no rounds: no tau
    assert "broken" in table and "failed  dspark could not load the pair: KeyError: 'fc.weight'" in table


def test_a_saved_result_of_another_pair_prompts_or_length_is_refused(tmp_path):
    target, drafter = str(tmp_path / "t"), str(tmp_path / "d")
    ours = {"target": target, "drafter": drafter, "prompts_given": 3, "max_tokens": 32, "per_prompt": []}
    bench, peers = tmp_path / "bench.json", tmp_path / "peers.json"
    bench.write_text(json.dumps(ours))
    peers.write_text(json.dumps({"ours": ours, "peers": {}}))
    for saved in (bench, peers):  # either kind of saved run gives ours back
        assert peer_bench.saved_ours(str(saved), (target, drafter), 3, 32) == ours
    with pytest.raises(DFlashError, match="measured the drafter .*/d, not .*/v1"):
        peer_bench.saved_ours(str(bench), (target, str(tmp_path / "v1")), 3, 32)
    with pytest.raises(DFlashError, match="measured 3 prompts at 32 tokens, not these 3 at 128"):
        peer_bench.saved_ours(str(peers), (target, drafter), 3, 128)
    bench.write_text("[1]")
    with pytest.raises(DFlashError, match="not the JSON of `bench --json`"):
        peer_bench.saved_ours(str(bench), (target, drafter), 3, 32)
