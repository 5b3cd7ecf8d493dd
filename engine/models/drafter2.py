"""The DFlash2 drafter: v1's layers with a grouped dynamic causal conv around each sublayer,
and a candidate selector that rescores the head's top-K tokens left to right.

Facts from ../shared/DFLASH2_NOTES.md (sections 2-4). A conv is block-local and causal: output
row t mixes rows t, t-1, ..., t-K+1 of the same block (zeros before the anchor) with a kernel
made of a learned per-channel base plus a part projected from the normed sublayer input at row
t, shared by each group of S contiguous channels. It keeps no state between rounds, so a
rejected draft needs no drafter rollback, as in v1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.decode.top_k import over_vocabulary, top_k_indices
from engine.models.drafter import MLP, Attention, ContextCache, DFlashDrafter, _is_causal
from engine.models.drafter_config import SLIDING, DrafterConfig, SelectorConfig


def dynamic_conv(y: mx.array, dynamic: mx.array, base: mx.array, group: int) -> mx.array:
    """conv[t, c] = sum_j (base[j, c] + dynamic[t, j, c // group]) * y[t - j, c], y[< 0] = 0.

    y: (..., L, H); dynamic: (..., L, K, G); base: (K, H).
    """
    L, k = y.shape[-2], base.shape[0]
    weights = base.astype(y.dtype) + mx.repeat(dynamic, group, axis=-1)  # (..., L, K, H)
    out = weights[..., 0, :] * y
    for j in range(1, min(k, L)):
        pad = [(0, 0)] * (y.ndim - 2) + [(j, 0), (0, 0)]
        shifted = mx.pad(y, pad)[..., :L, :]  # row t holds y[t - j]
        out = out + weights[..., j, :] * shifted
    return out


class DynamicConv(nn.Module):
    """Both stages of one sublayer's conv: stage 0 on its input, stage 1 on its output. Built as
    the identity (base 1 at tap 0, projection 0), which is also how a new one is trained."""

    def __init__(self, hidden: int, kernel: int, group: int):
        super().__init__()
        self.kernel, self.group, self.groups = kernel, group, hidden // group
        self.base_kernel = mx.zeros((2, kernel, hidden)).at[:, 0, :].add(1.0)
        self.kernel_projection = nn.Linear(hidden, 2 * kernel * self.groups, bias=False)
        self.kernel_projection.weight = mx.zeros_like(self.kernel_projection.weight)

    def kernels(self, x_normed: mx.array) -> mx.array:
        """(..., L, 2, K, G): rows laid out [stage, tap, group], group fastest."""
        return self.kernel_projection(x_normed).reshape(*x_normed.shape[:-1], 2, self.kernel, self.groups)

    def stage(self, y: mx.array, kernels: mx.array, stage: int) -> mx.array:
        return dynamic_conv(y, kernels[..., stage, :, :], self.base_kernel[stage], self.group)


class DecoderLayer2(nn.Module):
    def __init__(self, cfg: DrafterConfig, sliding: bool, causal: bool):
        super().__init__()
        sel: SelectorConfig = cfg.selector
        h = cfg.hidden_size
        self.self_attn = Attention(cfg, sliding, causal)
        self.mlp = MLP(h, cfg.intermediate_size)
        self.input_layernorm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.attention_conv = DynamicConv(h, sel.conv_kernel_size, sel.conv_group_size)
        self.mlp_conv = DynamicConv(h, sel.conv_kernel_size, sel.conv_group_size)

    def _body(self, x: mx.array, attend) -> mx.array:
        xn = self.input_layernorm(x)
        d = self.attention_conv.kernels(xn)
        a = attend(self.attention_conv.stage(xn, d, 0))
        x = x + self.attention_conv.stage(a, d, 1)
        xn2 = self.post_attention_layernorm(x)
        e = self.mlp_conv.kernels(xn2)
        return x + self.mlp_conv.stage(self.mlp(self.mlp_conv.stage(xn2, e, 0)), e, 1)

    def __call__(self, x, ctx, cache: ContextCache, offset):
        return self._body(x, lambda u: self.self_attn(u, ctx, cache, offset))

    def forward_blocks(self, x, ctx_k, ctx_v, offsets, mask):
        """Many independent blocks at once (training): x (N, L, H), offsets (N,)."""
        return self._body(x, lambda u: self.self_attn.attend(u, offsets, ctx_k, ctx_v, mask))


class CandidateSelector(nn.Module):
    """score_t[k] = logit_t[k] + sum_r A[prev, r] * P(h_t)[r] * B[cand_t[k], r]: the head's top-K
    candidates at each position rescored by a low-rank bilinear term in the token before. A new
    one starts with the projection at zero: it adds nothing until trained, so a DFlash2 drafter
    grown from a v1 one first drafts exactly what v1 did."""

    def __init__(self, hidden: int, rank: int, vocab: int):
        super().__init__()
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        self.hidden_projection.weight = mx.zeros_like(self.hidden_projection.weight)
        self.predecessor_codebook = nn.Embedding(vocab, rank)
        self.successor_codebook = nn.Embedding(vocab, rank)

    def pair_terms(self, hidden: mx.array, candidates: mx.array) -> mx.array:
        """P(h_t) * B[cand_t[k]]: (..., T, K, r), for the walk to dot with A[prev]."""
        projected = self.hidden_projection(hidden).astype(mx.float32)
        return projected[..., None, :] * self.successor_codebook(candidates).astype(mx.float32)

    def predecessor(self, ids: mx.array) -> mx.array:
        return self.predecessor_codebook(ids).astype(mx.float32)


@dataclass
class Selection:
    """One block's selector walk (lazy arrays, but the T = 0 walk has evaluated its scores): drafts
    d_1..d_T, the K candidates per position and their scores, the head's own top candidate (to see
    where rescoring changed it) and, at T > 0, the log of q scattered over the vocabulary (-inf
    outside the candidates)."""

    drafts: mx.array  # (T,)
    candidates: mx.array  # (T, K)
    scores: mx.array  # (T, K) float32
    plain_top: mx.array  # (T,): argmax of the head's logits
    logq: Optional[mx.array]  # (T, V) or None at T = 0
    # T = 0, on the host: after[t, j, k] the score of candidate k at t + 1 after candidate j at t (the
    # first position's row repeated for every j: its predecessor is the anchor), for draft trees
    after: Optional[np.ndarray] = None


def select(selector: CandidateSelector, hidden: mx.array, logits: mx.array, anchor: int, top_k: int,
           temperature: float, key: Optional[mx.array]) -> Selection:
    """Walk positions 1..T: the anchor is the first predecessor, then each chosen draft. T = 0 takes
    the best score; T > 0 samples from q_t = softmax(score_t / T) (`key` seeds it)."""
    logits32 = logits.astype(mx.float32)
    candidates = top_k_indices(logits32, top_k)
    unary = mx.take_along_axis(logits32, candidates, axis=-1)
    terms = selector.pair_terms(hidden, candidates)  # (T, K, r)
    if temperature <= 0:
        drafts, scores_all, after = _greedy_walk(selector, terms, unary, candidates, anchor)
        return Selection(drafts, candidates, scores_all, mx.argmax(logits32, axis=-1), None, after)
    keys = mx.random.split(key, terms.shape[0])
    prev = mx.array([anchor])
    picks, scores = [], []
    for t in range(terms.shape[0]):
        score = unary[t] + terms[t] @ selector.predecessor(prev)[0]
        index = mx.random.categorical(score / temperature, key=keys[t])
        prev = candidates[t, index].reshape(1)
        picks.append(prev)
        scores.append(score)
    scores_all = mx.stack(scores)
    q = mx.softmax(scores_all / temperature, axis=-1)
    # log q over the vocabulary: -inf but at the candidates (a log of the whole block would cost a
    # pass of logs over 152k tokens per position)
    logq = over_vocabulary(logits.shape, candidates, mx.log(q))
    return Selection(mx.concatenate(picks), candidates, scores_all, mx.argmax(logits32, axis=-1), logq)


def _greedy_walk(selector: CandidateSelector, terms: mx.array, unary: mx.array, candidates: mx.array,
                 anchor: int) -> tuple[mx.array, mx.array, np.ndarray]:
    """The T = 0 walk with every score it could need computed at once, then walked on the host: a
    step's scores are the K x K transition row of the previous pick. A loop of tiny array ops costs
    about 100 dispatches a block, which is most of the selector's time on a small drafter. Also
    returns every transition (Selection.after)."""
    T = terms.shape[0]
    first = unary[0] + terms[0] @ selector.predecessor(mx.array([anchor]))[0]  # (K,)
    # trans[t - 1, j, k]: the score of candidate k at t after candidate j at t - 1
    trans = unary[1:, None, :] + selector.predecessor(candidates[:-1]) @ terms[1:].swapaxes(-1, -2)
    mx.eval(first, trans, candidates)
    first, trans, ids = (np.array(a) for a in (first, trans, candidates))
    after = np.concatenate([np.broadcast_to(first, (1, *trans.shape[1:])), trans])
    chosen = [0]  # the candidate picked at each position; the first row's predecessor is the anchor (row 0)
    for t in range(T):
        chosen.append(int(np.argmax(after[t, chosen[-1]])))
    steps = np.arange(T)
    return (mx.array(ids[steps, chosen[1:]].astype(np.int32)), mx.array(after[steps, chosen[:-1]]), after)


class DFlash2Drafter(DFlashDrafter):
    def __init__(self, cfg: DrafterConfig):
        nn.Module.__init__(self)
        sel = cfg.selector
        self.cfg = cfg
        self.fc = nn.Linear(cfg.num_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [DecoderLayer2(cfg, sliding=t == SLIDING, causal=_is_causal(cfg, t))
                       for t in cfg.layer_types]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.candidate_selector = CandidateSelector(cfg.hidden_size, sel.selector_rank, cfg.vocab_size)

    def logits(self, head, hidden: mx.array) -> mx.array:
        """The drafter's logits: the target's head times output_multiplier, then the soft cap. A
        drafter that sets neither keeps the target's own logit treatment (as the MLX runtime does)."""
        sel = self.cfg.selector
        if sel.output_multiplier == 1.0 and not sel.final_logit_softcapping:
            return head.logits(hidden)
        out = head.raw_logits(hidden) * sel.output_multiplier
        cap = sel.final_logit_softcapping
        return mx.tanh(out / cap) * cap if cap else out

    def embed(self, head, ids: mx.array) -> mx.array:
        scale = self.cfg.selector.input_embedding_scale
        h = head.embed(ids)
        return h if scale == 1.0 else h * scale
