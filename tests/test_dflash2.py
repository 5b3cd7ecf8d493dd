"""DFlash2 drafters: published checkpoints load through the user's path, the conv and the selector
follow the notes' formulas, doctor refuses malformed ones in one line, decoding stays lossless
(greedy and in distribution), and rounds carry the selector's candidates into traces."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from app.cli import main as cli
from engine.decode.acceptance import accept
from engine.decode.events import RoundEvent, from_dict
from engine.decode.prompts import encode_prompt
from engine.decode.sampling import Sampler
from engine.decode.settings import GenerationSettings, SamplingSettings
from engine.errors import DFlashError
from engine.models.doctor import check_pair
from engine.models.drafter2 import CandidateSelector, dynamic_conv, select
from engine.models.pair import load_pair
from engine.tools.trace import read_trace

from fixtures.tiny_dflash2 import write_bigram_drafter, write_dflash2_drafter
from fixtures.tiny_hybrid import write_hybrid_target
from distribution import check_exactness, exact_outcomes, verified_unfiltered
from helpers import PROMPTS, edit_config, run

ALPHA = 1e-3


@pytest.fixture(scope="module")
def dflash2_dirs(qwen3_untied_dirs, tmp_path_factory):
    target = qwen3_untied_dirs[0]
    return target, write_dflash2_drafter(tmp_path_factory.mktemp("dflash2") / "drafter", target, seed=5)


@pytest.fixture(scope="module")
def dflash2_pair(dflash2_dirs):
    return load_pair(*dflash2_dirs)


def test_dynamic_conv_matches_the_notes_formula():
    rng = np.random.default_rng(0)
    L, K, H, S = 5, 3, 8, 4
    y, base = rng.normal(size=(L, H)).astype(np.float32), rng.normal(size=(K, H)).astype(np.float32)
    dyn = rng.normal(size=(L, K, H // S)).astype(np.float32)
    expected = np.zeros((L, H), np.float32)
    for t in range(L):
        for c in range(H):
            expected[t, c] = sum((base[j, c] + dyn[t, j, c // S]) * y[t - j, c] for j in range(K) if t - j >= 0)
    got = np.array(dynamic_conv(mx.array(y), mx.array(dyn), mx.array(base), S))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_selector_walk_matches_a_plain_loop():
    """score_t[k] = logit + A[prev] . (P h_t * B[cand]); prev starts at the anchor, then the pick."""
    mx.random.seed(3)
    V, H, r, K, T = 40, 16, 6, 5, 4
    sel = CandidateSelector(H, r, V)
    sel.hidden_projection.weight = mx.random.normal((r, H))
    sel.predecessor_codebook.weight = mx.random.normal((V, r))
    sel.successor_codebook.weight = mx.random.normal((V, r))
    hidden, logits = mx.random.normal((T, H)), mx.random.normal((T, V))
    got = select(sel, hidden, logits, anchor=7, top_k=K, temperature=0.0, key=None)
    A, B = np.array(sel.predecessor_codebook.weight), np.array(sel.successor_codebook.weight)
    P, lg = np.array(sel.hidden_projection(hidden)), np.array(logits)
    prev, picks = 7, []
    for t in range(T):
        cands = np.argsort(-lg[t])[:K]
        scores = lg[t, cands] + (A[prev] * P[t] * B[cands]).sum(-1)
        prev = int(cands[np.argmax(scores)])
        picks.append(prev)
    assert got.drafts.tolist() == picks
    assert sorted(got.candidates[0].tolist()) == sorted(np.argsort(-lg[0])[:K].tolist())


def test_a_tree_scores_every_node_after_its_own_parent():
    """A T = 0 tree from the selector (plan.candidates): each node's log-prob is the selector's
    log-softmax over its depth's candidates with its parent's token as predecessor (a plain loop
    here), off the greedy chain too; rank 0 all the way down is the walk's drafts; and the best-first
    tree holds every node's better-scored siblings."""
    from engine.decode.drafts import Proposal
    from engine.decode.tree.layout import build_tree
    from engine.decode.tree.plan import candidates

    mx.random.seed(5)
    V, H, r, K, T = 40, 16, 6, 4, 5
    sel = CandidateSelector(H, r, V)
    for layer in (sel.hidden_projection, sel.predecessor_codebook, sel.successor_codebook):
        layer.weight = mx.random.normal(layer.weight.shape) * 2  # a strong pair term: predecessors matter
    hidden, logits = mx.random.normal((T, H)), mx.random.normal((T, V))
    s = select(sel, hidden, logits, anchor=7, top_k=K, temperature=0.0, key=None)
    ids, logq, follow = candidates(Proposal(s.drafts, None, logits, s))
    tree = build_tree(7, ids, logq, 30, follow=follow)
    A, B = np.array(sel.predecessor_codebook.weight), np.array(sel.successor_codebook.weight)
    P, lg = np.array(sel.hidden_projection(hidden)), np.array(logits)
    cands = np.array(s.candidates)
    moved = 0
    for node in range(1, len(tree)):
        t, prev = int(tree.depths[node]) - 1, int(tree.tokens[tree.parents[node]])
        scores = lg[t, cands[t]] + (A[prev] * P[t] * B[cands[t]]).sum(-1)
        logp = scores - np.log(np.exp(scores - scores.max()).sum()) - scores.max()
        k = cands[t].tolist().index(int(tree.tokens[node]))
        assert tree.logq[node] == pytest.approx(logp[k], abs=1e-4)
        assert tree.ranks[node] == int((logp > logp[k]).sum())  # its rank among its own parent's candidates
        siblings = [n for n in tree.children(int(tree.parents[node]))]
        assert [int(tree.ranks[n]) for n in siblings] == list(range(len(siblings)))  # better siblings first
        chain_prev = int(s.drafts[t - 1]) if t else 7  # the walk's token at the depth above
        assumed = lg[t, cands[t]] + (A[chain_prev] * P[t] * B[cands[t]]).sum(-1)
        moved += tree.ranks[node] != int((assumed > assumed[k]).sum())
    chain, node = [], 0
    while (kids := tree.children(node)) and tree.ranks[kids[0]] == 0:
        node = kids[0]
        chain.append(int(tree.tokens[node]))
    assert chain == s.drafts.tolist()
    assert moved > 0  # some node ranks otherwise than after the chain's token (what the tree used to assume)


def test_selector_q_gives_the_target_distribution():
    """Drafts sampled from the selector's q over K candidates, verified against p: the first committed
    token is distributed as p, including tokens that were never candidates (the residual's job)."""
    mx.random.seed(4)
    V, K = 6, 3
    sel = CandidateSelector(4, 2, V)
    sel.hidden_projection.weight = mx.random.normal((2, 4))
    sel.predecessor_codebook.weight = mx.random.normal((V, 2))
    sel.successor_codebook.weight = mx.random.normal((V, 2))
    hidden = mx.random.normal((1, 4))
    draft_logits = mx.log(mx.array([[0.3, 0.25, 0.2, 0.1, 0.1, 0.05]]))
    p = [0.1, 0.3, 0.05, 0.25, 0.2, 0.1]
    target_logits = mx.log(mx.array([p, [1 / V] * V]))
    sampler = Sampler(SamplingSettings(temperature=1.0, seed=11))
    n, counts, accepted_any = 4000, Counter(), 0
    for _ in range(n):
        s = select(sel, hidden, draft_logits, anchor=0, top_k=K, temperature=1.0, key=sampler.next_key())
        accepted, nxt = accept(sampler, target_logits, s.drafts, s.logq).tolist()
        counts[s.drafts.tolist()[0] if accepted else nxt] += 1
        accepted_any += accepted
    assert chisquare([counts[i] for i in range(V)], [x * n for x in p]).pvalue > ALPHA, counts
    assert 0 < accepted_any < n


def test_published_layout_loads_and_doctor_names_the_generation(dflash2_dirs, dflash2_pair, capsys):
    target, drafter = dflash2_dirs
    files = sorted(p.name for p in drafter.glob("*.safetensors"))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    report = check_pair(target, drafter)
    assert report.ok, report.problems
    assert report.facts["drafter_generation"] == "DFlash2"
    assert report.facts["selector"] == "top-8 candidates, rank 8"
    assert report.facts["conv"] == "kernel 2, 4 groups of 16 channels"
    facts = dflash2_pair.facts()
    assert facts["drafter_generation"] == "DFlash2"
    assert cli(["doctor", "--target", str(target), "--drafter", str(drafter)]) == 0
    assert "drafter_generation: DFlash2" in capsys.readouterr().out


def test_mlx_runtime_naming_loads_the_same_weights(dflash2_dirs, dflash2_pair, tmp_path):
    """The MLX runtime saves the codebooks with `.weight`: the same drafter, the same drafts."""
    target, drafter = dflash2_dirs
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    merged = {}
    for f in drafter.glob("*.safetensors"):
        merged.update(mx.load(str(f)))
    merged = {k + ".weight" if k.endswith("_codebook") else k: v for k, v in merged.items()}
    mx.save_safetensors(str(renamed / "model.safetensors"), merged)
    shutil.copy(drafter / "config.json", renamed / "config.json")
    other = load_pair(target, renamed)
    a, ra = run(dflash2_pair, PROMPTS[0], max_tokens=12, block_size=8)
    b, rb = run(other, PROMPTS[0], max_tokens=12, block_size=8)
    assert [r.drafted for r in ra] == [r.drafted for r in rb] and a.token_ids == b.token_ids


def _copy(dirs, tmp_path):
    target, drafter = dirs
    shutil.copytree(drafter, tmp_path / "d")
    return target, tmp_path / "d"


def _retensor(folder, change):
    for f in folder.glob("*.safetensors"):
        tensors = mx.load(str(f))
        change(tensors)
        mx.save_safetensors(str(f), tensors)


def _problem(target, drafter):
    report = check_pair(target, drafter)
    assert not report.ok
    with pytest.raises(DFlashError) as err:
        load_pair(target, drafter)
    assert str(err.value) == report.problems[0]
    return report.problems[0]


def test_doctor_refuses_malformed_dflash2(dflash2_dirs, tmp_path):
    cases = []
    t, d = _copy(dflash2_dirs, tmp_path / "missing-tensor")
    _retensor(d, lambda w: w.pop("layers.1.mlp_conv.base_kernel", None))
    cases.append((t, d, "'layers.1.mlp_conv.base_kernel' is missing"))
    t, d = _copy(dflash2_dirs, tmp_path / "shape")
    _retensor(d, lambda w: w.update({k: w[k][:, :3] for k in list(w) if k == "candidate_selector.hidden_projection.weight"}))
    cases.append((t, d, "'candidate_selector.hidden_projection.weight' has shape [8, 3]"))
    t, d = _copy(dflash2_dirs, tmp_path / "key")
    edit_config(d, lambda raw: raw["dflash_config"].pop("selector_rank"))
    cases.append((t, d, "'dflash_config.selector_rank' is missing"))
    t, d = _copy(dflash2_dirs, tmp_path / "theta")
    edit_config(d, lambda raw: raw.pop("rope_parameters"))
    cases.append((t, d, "'rope_theta' is absent"))
    t, d = _copy(dflash2_dirs, tmp_path / "vocab")
    _retensor(d, lambda w: w.update({k: w[k][:100] for k in list(w) if k.endswith("_codebook")}))
    cases.append((t, d, "has 100 rows but the target's vocabulary has 512 ids"))
    t, d = _copy(dflash2_dirs, tmp_path / "vocab-config")  # named as the file holds it (it said '...codebook.weight')
    edit_config(d, lambda raw: raw.update(vocab_size=400))
    cases.append((t, d, "tensor 'candidate_selector.predecessor_codebook' has shape [512, "))
    t, d = _copy(dflash2_dirs, tmp_path / "v1-name")
    edit_config(d, lambda raw: raw.update(architectures=["DFlashDraftModel"]))
    cases.append((t, d, "says DFlashDraftModel (DFlash v1) but the weights hold DFlash2 tensor"))
    t, d = _copy(dflash2_dirs, tmp_path / "group")
    edit_config(d, lambda raw: raw["dflash_config"].update(conv_group_size=24))
    cases.append((t, d, "'dflash_config.conv_group_size' 24 does not divide 'hidden_size' 64"))
    t, d = _copy(dflash2_dirs, tmp_path / "overlap")
    first = sorted(d.glob("*.safetensors"))[0]
    shutil.copy(first, d / "model-extra.safetensors")
    cases.append((t, d, "is also in model-00001-of-00002.safetensors"))
    for target, drafter, expected in cases:
        assert expected in _problem(target, drafter), drafter


def test_codebooks_must_cover_the_targets_vocabulary(dflash2_dirs, tmp_path):
    """A drafter whose config and codebooks agree with each other but stop short of the target's ids."""
    t, d = _copy(dflash2_dirs, tmp_path / "short")
    edit_config(d, lambda raw: raw.update(vocab_size=400))
    _retensor(d, lambda w: w.update({k: w[k][:400] for k in list(w) if k.endswith("_codebook")}))
    msg = _problem(t, d)
    assert "candidate_selector.predecessor_codebook' has 400 rows but the target's vocabulary" in msg


@pytest.mark.parametrize("block", [2, 5, 8])
def test_greedy_parity_random_dflash2(dflash2_pair, block):
    for prompt in PROMPTS[:2]:
        ar, _ = run(dflash2_pair, prompt, mode="ar", max_tokens=40)
        df, rounds = run(dflash2_pair, prompt, mode="dflash", max_tokens=40, block_size=block)
        assert df.token_ids == ar.token_ids
        assert all(len(r.drafted) <= block - 1 for r in rounds)


def test_auto_verify_length_runs_the_selector_losslessly(qwen3_untied_dirs, tmp_path):
    pair = _bigram_pair(qwen3_untied_dirs[0], tmp_path)
    for prompt in PROMPTS[:2]:
        ar, _ = run(pair, prompt, mode="ar", max_tokens=48)
        df, rounds = run(pair, prompt, max_tokens=48, auto=True)
        assert df.token_ids == ar.token_ids
        drafted = [r for r in rounds if r.drafted]
        assert drafted and all(len(r.candidates) == len(r.drafted) == r.verified - 1 for r in drafted)


def _bigram_pair(target, tmp_path, block=8):
    """A bigram DFlash2 drafter for the chains of two prompts' AR outputs (module doc of tiny_dflash2)."""
    plain = load_pair(target, None)
    sequence = []
    for prompt in PROMPTS[:2]:
        ids = encode_prompt(plain.tokenizer, prompt, chat=False)
        ar, _ = run(plain, ids, mode="ar", max_tokens=48)
        sequence += ids + ar.token_ids
    return load_pair(target, write_bigram_drafter(tmp_path / "bigram", target, sequence, block_size=block))


def _selector_parity(pair):
    seen_partial = seen_full = rescored = 0
    for prompt in PROMPTS[:3]:
        ar, _ = run(pair, prompt, mode="ar", max_tokens=48)
        df, rounds = run(pair, prompt, mode="dflash", max_tokens=48, block_size=8)
        assert df.token_ids == ar.token_ids, prompt
        for r in rounds:
            n = len(r.drafted)
            assert len(r.candidates) == len(r.candidate_scores) == len(r.target_candidate_rank) == n
            seen_full += r.accepted == n > 0
            seen_partial += 0 < r.accepted < n
            rescored += sum(p != d for p, d in zip(r.plain_top, r.drafted))
            for i in range(min(r.accepted, n)):  # an accepted draft was the target's choice: a candidate
                assert r.target_candidate_rank[i] == 0
    assert seen_full and rescored  # the selector, not the head's argmax, drafted what was accepted
    return seen_partial


def test_greedy_parity_through_the_selector_on_a_dense_target(qwen3_untied_dirs, tmp_path):
    assert _selector_parity(_bigram_pair(qwen3_untied_dirs[0], tmp_path)) >= 0


def test_greedy_parity_through_the_selector_on_a_hybrid_target(models_root, tokenizer_dir, tmp_path):
    target = models_root / "dflash2-hybrid-target"
    if not target.exists():
        write_hybrid_target(target, tokenizer_dir, "qwen3_5", seed=60)
    assert load_pair(target, None).facts()["rollback"] == "tape-replay"
    _selector_parity(_bigram_pair(target, tmp_path))


def test_sliding_window_by_position(qwen3_untied_dirs, tmp_path):
    """A window of 8 over 60 tokens: context rows leave the window by position; still lossless."""
    target = qwen3_untied_dirs[0]
    pair = load_pair(target, write_dflash2_drafter(tmp_path / "w8", target, seed=9, window=8))
    ar, _ = run(pair, PROMPTS[1], mode="ar", max_tokens=60)
    df, _ = run(pair, PROMPTS[1], mode="dflash", max_tokens=60, block_size=8)
    assert df.token_ids == ar.token_ids


@pytest.mark.parametrize("mutation", [None, verified_unfiltered], ids=["exact", "mutated"])
def test_dflash2_and_ar_sample_the_same_distribution(qwen3_untied_dirs, untied_target, tmp_path, monkeypatch,
                                                      mutation):
    """The first three tokens over many seeds are distributed as AR's with DFlash2 (the bigram drafter
    with a mild gamma, so its q is spread and both acceptance paths run)."""
    target, plain = qwen3_untied_dirs[0], untied_target
    ids = encode_prompt(plain.tokenizer, PROMPTS[2], chat=False)
    ar, _ = run(plain, ids, mode="ar", max_tokens=16)
    pair = load_pair(target, write_bigram_drafter(tmp_path / "mild", target, ids + ar.token_ids, gamma=3.0,
                                                  block_size=4))
    exact = exact_outcomes(pair, ids, SamplingSettings(temperature=1.0, top_k=2), tokens=3)
    accepted = Counter()

    def outcome(seed):
        summary, rounds = run(pair, ids, mode="dflash", max_tokens=3, block_size=4,
                              sampling=SamplingSettings(temperature=1.0, top_k=2, seed=seed))
        accepted["drafts"] += sum(r.accepted for r in rounds)
        return tuple(summary.token_ids)

    check_exactness(monkeypatch, mutation, exact, outcome)
    assert accepted["drafts"] > 0 or mutation  # drafts were accepted, not only resampled


def test_trace_round_trip_keeps_the_selector(dflash2_dirs, tmp_path, capsys):
    target, drafter = dflash2_dirs
    trace = tmp_path / "run.jsonl"
    assert cli(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", PROMPTS[0], "--raw",
                "--max-tokens", "20", "--block-size", "6", "--trace", str(trace), "--json"]) == 0
    header, records = read_trace(trace)
    assert header["model"]["drafter_generation"] == "DFlash2"
    rounds = [from_dict(r) for r in records if r["type"] == "round"]
    assert rounds and all(isinstance(r, RoundEvent) for r in rounds)
    for r in rounds:
        assert len(r.candidates) == len(r.drafted) and all(len(c) == 8 for c in r.candidates)
        assert all(s == sorted(s, reverse=True) for s in r.candidate_scores)
        assert all(-1 <= k < 8 for k in r.target_candidate_rank)
        assert r.drafted == [c[0] for c in r.candidates]  # greedy: the path is each position's best score


def test_bench_compares_v1_and_dflash2_on_the_same_ar_runs(qwen3_untied_dirs, dflash2_dirs, tmp_path, capsys):
    target, v1 = qwen3_untied_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS[:2]) + "\n")
    argv = ["bench", "--target", str(target), "--drafter", str(v1), "--compare-drafter", str(dflash2_dirs[1]),
            "--prompts", str(prompts), "--raw", "--max-tokens", "24"]
    assert cli(argv + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["drafter_generation"] == "DFlash v1"
    (other,) = result["compared"]
    assert other["drafter_generation"] == "DFlash2" and other["drafter"] == str(dflash2_dirs[1])
    assert other["ar_tok_s"] == result["ar_tok_s"]  # one set of AR runs for both drafters
    assert len(other["per_prompt"]) == len(result["per_prompt"]) == 2
    assert result["identical"] and other["identical"]
    assert cli(argv) == 0
    out = capsys.readouterr().out
    assert "drafters on the same AR runs" in out and "DFlash2 drafter" in out and "worst prompt" in out
    assert cli(argv[:-2] + ["--max-tokens", "24", "--compare-drafter", str(tmp_path / "nowhere")]) == 2


@pytest.mark.parametrize("which", ["dflash", "dflash2"])
def test_rounds_without_diagnostics_decode_the_same(which, request):
    """diagnostics=False (the command line without a trace, bench) skips only the tables: the same tokens,
    the same rounds and acceptances, and no table fields; the command line asks for them with --trace."""
    from engine.decode.generate import generate

    pair = request.getfixturevalue("qwen3_pair" if which == "dflash" else "dflash2_pair")
    ids = encode_prompt(pair.tokenizer, "def add(a, b):", chat=False)

    def rounds(diagnostics: bool) -> list[RoundEvent]:
        settings = GenerationSettings(max_tokens=40, block_size=8, diagnostics=diagnostics)
        return [e for e in generate(pair, ids, settings) if isinstance(e, RoundEvent)]

    on, off = rounds(True), rounds(False)
    assert [(r.drafted, r.accepted, r.bonus) for r in on] == [(r.drafted, r.accepted, r.bonus) for r in off]
    assert any(r.draft_p for r in on) and not any(r.draft_p or r.target_p or r.target_rank for r in off)
    if which == "dflash2":
        assert any(r.candidates for r in on) and not any(r.candidates for r in off)
