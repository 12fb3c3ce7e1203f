"""The integer MLA of a K3 layer without positions (:func:`golden.k3.mla`), op by op in
:mod:`golden.intops`.

:func:`quantize_mla` turns float :class:`golden.k3.MLAParams` and a calibration batch into int8
weights and requantiser constants (:class:`QuantMLA`); :func:`mla_int` runs MLA with integers only,
carrying the latent KV cache (:class:`MLACache`) so that decode steps equal one causal call. The
dataflow for ``T`` new tokens after ``S0`` cached ones (``S = S0 + T``), every tensor's format::

    x_q   int8 [T, d]                                   (scale x_scale)
    q_a   = rq_qa(x_q @ W_qa^T)                         act format  Q<act_width>.<act_frac>   [T, q_lora_rank]
    q     = rq_qb(rmsnorm_weight_int(q_a) @ W_qb^T)     int8, scale q_scale                  [T, H, dn + dr]
    ckv   = x_q @ W_kva^T:  c_kv = rq_ckv(ckv[:, :kv_lora_rank])   act format
                            k_r  = rq_kr(ckv[:, kv_lora_rank:])    int8, scale k_scale        [T, dr]
    n_kv  = rmsnorm_weight_int(c_kv)                    Q<out_width>.<norm_frac>             [T, kv_lora_rank]
    cache = cache + (n_kv, k_r)                         the latent KV cache                 [S, kv_lora_rank + dr]
    [k_n, v] = rq_kvb(n_kv @ W_kvb^T)                   int8; k_n scale k_scale, v scale v_scale  [S, H, dn + dv]
    score = rq_score(q . [k_n, k_r])                    act format, 1/sqrt(dn + dr) folded in  [H, T, S]
    o     = online softmax of score over keys 0..S0+t, times v   v units, score_frac bits   [T, H, dv]
    g     = sigmoid_q(rq_g(x_q @ W_g^T))                unsigned, score_frac                 [T, H dv]
    og    = saturate(round_shift(o * g, 2 score_frac), in_width)   int8, scale v_scale       [T, H dv]
    y     = rq_o(og @ W_o^T)                            act format                           [T, d]

The key halves share one scale so that ``q . [k_n, k_r]`` is one dot product of length ``dn + dr``
in an ``acc_width``-bit accumulator. ``og`` keeps ``v``'s scale: ``|o g| <= max |v|`` (a convex
combination of ``v`` times a gate in ``[0, 1]``), so it saturates only by rounding.

Online softmax (:func:`online_softmax_int`), per query and head, keys in sequence order (the
order the hardware reads the cache), from ``m = -2**(act_width-1)``, ``l = 0``, ``acc = 0``::

    m'    = max(m, s_j)
    alpha = exp_q(saturate(m - m', act_width))          score format, exactly 1.0 when m' = m
    p     = exp_q(saturate(s_j - m', act_width))        score format
    l     = round_shift(l * alpha, score_frac) + p      unsigned, score_frac bits
    acc   = round_shift(acc * alpha, score_frac) + p v_j   signed, v units with score_frac bits
    o     = round_shift(acc * recip, b + RECIP_BITS - score_frac),  recip = floor(2**(b + RECIP_BITS) / l),
            b = bit_length(l) - 1                       one reciprocal per row, at the end

The last key that raised ``m`` added ``p = 2**score_frac`` and no later rescale shrinks ``l``, so
``l >= 2**score_frac`` (no division by zero). Rescaling never grows ``l`` or ``|acc|`` and each key
adds at most ``2**score_frac`` to ``l`` and ``2**(score_frac + in_width - 1)`` to ``|acc|``: after
``S`` keys ``l <= S 2**score_frac`` and ``|acc| <= S 2**(score_frac + in_width - 1)``, both in
:data:`~nanokpu.config.ONLINE_WIDTH`-bit registers for ``S <=``
:attr:`~nanokpu.config.KpuConfig.mla_max_tokens` (4095 with the defaults;
the latent cache of tiny fills the data scratchpad at 682 tokens, of small at 1638).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from golden import block, k3
from golden import intops as I
from nanokpu.config import ONLINE_WIDTH, KpuConfig

__all__ = ["RECIP_BITS", "QuantMLA", "MLACache", "quantize_mla", "online_softmax_int", "gate_int",
           "attend_int", "mla_int"]

#: The final reciprocal ``floor(2**(b + RECIP_BITS) / l)``, ``2**b <= l < 2**(b+1)``, lies in
#: ``(2**(RECIP_BITS-1), 2**RECIP_BITS]``: ``1 / l`` truncated to ``RECIP_BITS`` significant bits, low by a
#: relative ``< 2**-(RECIP_BITS-1)``; it moves ``o`` by less than ``2**(in_width + score_frac - RECIP_BITS)``
#: units (``|acc| <= 2**(in_width-1) l``).
RECIP_BITS = 16


@dataclass(frozen=True)
class QuantMLA:
    """A quantised MLA (see the module docstring for the dataflow). Weights int8 by
    ``weight_scales``; norm weights signed ``mult_width`` bits (:func:`golden.intops.quantize_norm_weight`)."""

    x_scale: float
    W_qa: np.ndarray            # [q_lora_rank, d]
    rq_qa: block.Requant        # -> act format
    q_norm: np.ndarray          # [q_lora_rank], worth q_norm / 2**q_norm_shift
    q_norm_shift: int
    W_qb: np.ndarray            # [H (dn + dr), q_lora_rank]
    rq_qb: block.Requant        # -> int8 q
    W_kva: np.ndarray           # [kv_lora_rank + dr, d]
    rq_ckv: block.Requant       # columns :kv_lora_rank -> act format
    rq_kr: block.Requant        # columns kv_lora_rank: -> int8 k_r
    kv_norm: np.ndarray         # [kv_lora_rank], worth kv_norm / 2**kv_norm_shift
    kv_norm_shift: int
    W_kvb: np.ndarray           # [H (dn + dv), kv_lora_rank]
    rq_kvb: block.Requant       # per column -> int8 k_n (k_scale) and v (v_scale)
    rq_score: block.Requant     # q . k -> act format
    W_g: np.ndarray             # [H dv, d]
    rq_g: block.Requant         # -> router logit format (the sigmoid table's input)
    W_o: np.ndarray             # [d, H dv]
    rq_o: block.Requant         # -> act format


class MLACache(NamedTuple):
    """The latent KV cache of ``S`` tokens: what MLA keeps per token instead of keys and values."""

    n_kv: np.ndarray   #: ``[S, kv_lora_rank]`` RMSNorm'd latent, ``Q<out_width>.<norm_frac>``
    k_r: np.ndarray    #: ``[S, qk_rope_dim]`` shared key part, int8 (scale ``k_scale``)


def _absmax_scale(a, cfg: KpuConfig) -> float:
    return float(np.max(np.abs(a), initial=0.0)) / ((1 << (cfg.in_width - 1)) - 1) or 1.0


def _rows(s, lo: int, hi: int):
    """The weight scales of rows ``lo:hi`` (one float per tensor, or a per-channel array)."""
    return s if np.ndim(s) == 0 else s[lo:hi]


def quantize_mla(P: k3.MLAParams, x, cfg: KpuConfig, x_scale: float | None = None):
    """Quantise float MLA weights, calibrating activation scales on the float batch ``x [T, d]``.

    Returns ``(Q, x_q)``: the :class:`QuantMLA` and ``x`` as int8 (:func:`golden.block.quantize_tensor`,
    one scale ``Q.x_scale``, ``max |x| / 127`` unless ``x_scale`` is given; later tokens take the same
    scale). ``q_scale``, ``k_scale`` (``k_n`` and
    ``k_r`` together) and ``v_scale`` are ``max |.| / 127`` of the float tensors on ``x``.
    """
    P.check(cfg)
    x = np.asarray(x, dtype=np.float64)
    x_q, x_scale = block.quantize_tensor(x, cfg.in_width, scale=x_scale)
    H, dn, dr, dv, rkv = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim, cfg.kv_lora_rank
    act = 2.0 ** cfg.act_frac
    q = k3.rmsnorm(x @ P.W_qa.T, P.q_norm, cfg.rms_eps) @ P.W_qb.T
    ckv = x @ P.W_kva.T
    kv = (k3.rmsnorm(ckv[:, :rkv], P.kv_norm, cfg.rms_eps) @ P.W_kvb.T).reshape(-1, H, dn + dv)
    q_scale = _absmax_scale(q, cfg)
    k_scale = _absmax_scale(np.concatenate([kv[..., :dn].ravel(), ckv[:, rkv:].ravel()]), cfg)
    v_scale = _absmax_scale(kv[..., dn:], cfg)

    w_qa, s_qa = block.quantize_weights(P.W_qa, cfg)
    q_norm, q_norm_shift = I.quantize_norm_weight(P.q_norm, cfg)
    w_qb, s_qb = block.quantize_weights(P.W_qb, cfg)
    w_kva, s_kva = block.quantize_weights(P.W_kva, cfg)
    kv_norm, kv_norm_shift = I.quantize_norm_weight(P.kv_norm, cfg)
    w_kvb, s_kvb = block.quantize_weights(P.W_kvb, cfg)
    w_g, s_g = block.quantize_weights(P.W_g, cfg)
    w_o, s_o = block.quantize_weights(P.W_o, cfg)
    n_lsb = 2.0 ** -cfg.norm_frac
    kv_out = np.tile(np.concatenate([np.full(dn, 1 / k_scale), np.full(dv, 1 / v_scale)]), H)
    rq = block.quant_multiplier
    Q = QuantMLA(
        x_scale=x_scale,
        W_qa=w_qa, rq_qa=rq(x_scale * s_qa * act, cfg.act_width, cfg),
        q_norm=q_norm, q_norm_shift=q_norm_shift,
        W_qb=w_qb, rq_qb=rq(n_lsb * s_qb / q_scale, cfg.in_width, cfg),
        W_kva=w_kva,
        rq_ckv=rq(x_scale * _rows(s_kva, 0, rkv) * act, cfg.act_width, cfg),
        rq_kr=rq(x_scale * _rows(s_kva, rkv, rkv + dr) / k_scale, cfg.in_width, cfg),
        kv_norm=kv_norm, kv_norm_shift=kv_norm_shift,
        W_kvb=w_kvb, rq_kvb=rq(n_lsb * s_kvb * kv_out, cfg.in_width, cfg),
        rq_score=rq(q_scale * k_scale / math.sqrt(dn + dr) * act, cfg.act_width, cfg),
        W_g=w_g, rq_g=rq(x_scale * s_g * 2.0 ** cfg.router_logit_frac, cfg.router_logit_width, cfg),
        W_o=w_o, rq_o=rq(v_scale * s_o * act, cfg.act_width, cfg),
    )
    return Q, x_q


def online_softmax_int(s, v, pos, cfg: KpuConfig) -> np.ndarray:
    """Causal softmax attention by online softmax (the module docstring's recurrence).

    ``s [H, T, S]`` act-format scores, ``v [S, H, dv]`` int8 values, ``pos [T]`` each query's
    position (it attends to keys ``0 .. pos``; ``pos < S``). Keys are taken in sequence order.
    Returns ``o [T, H, dv]``: ``sum_j softmax_j v_j`` in v units with ``score_frac`` fractional bits.
    """
    s, v, pos = np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.int64), np.asarray(pos)
    H, T, S = s.shape
    if S > cfg.mla_max_tokens:
        raise ValueError(f"{S} keys: the online softmax registers ({ONLINE_WIDTH} bits) hold at most "
                         f"mla_max_tokens = {cfg.mla_max_tokens}")
    sf, width = cfg.score_frac, cfg.act_width
    m = np.full((H, T), -(1 << (width - 1)), dtype=np.int64)
    total = np.zeros((H, T), dtype=np.int64)
    acc = np.zeros((H, T, v.shape[-1]), dtype=np.int64)
    for j in range(S):
        live = j <= pos[None, :]
        m_new = np.where(live, np.maximum(m, s[:, :, j]), m)
        alpha = I.exp_q(I.saturate(m - m_new, width), cfg)
        p = np.where(live, I.exp_q(I.saturate(s[:, :, j] - m_new, width), cfg), 0)
        total = I.round_shift(total * alpha, sf, cfg.rounding) + p
        acc = I.round_shift(acc * alpha[..., None], sf, cfg.rounding) + p[..., None] * v[j][:, None, :]
        m = m_new
    b = np.vectorize(lambda n: int(n).bit_length() - 1, otypes=[np.int64])(total)
    recip = (np.int64(1) << (b + RECIP_BITS)) // total
    o = I.round_shift(acc * recip[..., None], (b + RECIP_BITS - sf)[..., None], cfg.rounding)
    return o.transpose(1, 0, 2)


def gate_int(o, g, cfg: KpuConfig) -> np.ndarray:
    """MLA's output gate: ``saturate(round_shift(o * g, 2 score_frac), in_width)`` of ``o`` (v units,
    ``score_frac`` bits) and the sigmoid gate ``g`` (unsigned, ``score_frac`` bits): int8, ``v``'s scale."""
    prod = np.asarray(o, dtype=np.int64) * np.asarray(g, dtype=np.int64)
    return I.saturate(I.round_shift(prod, 2 * cfg.score_frac, cfg.rounding), cfg.in_width)


def attend_int(s, v, g, cfg: KpuConfig) -> np.ndarray:
    """One head's gated causal read-out, as ``ATTEND`` computes it: ``s [T, S]`` act-format scores of
    the last ``T`` of ``S`` positions (query ``t`` attends keys ``0 .. S - T + t``), ``v [S, dv]``
    int8 values, ``g [T, dv]`` the gate; returns ``gate_int(online_softmax_int(...), g)`` ``[T, dv]``."""
    s = np.asarray(s, dtype=np.int64)
    T, S = s.shape
    o = online_softmax_int(s[None], np.asarray(v)[:, None, :], np.arange(S - T, S), cfg)[:, 0]
    return gate_int(o, g, cfg)


def mla_int(x_q, Q: QuantMLA, cfg: KpuConfig, cache: MLACache | None = None):
    """Causal MLA on ``x_q [T, d]`` (int8, scale ``Q.x_scale``) after the tokens of ``cache``.

    Returns ``(y, cache)``: ``y [T, d]`` in the act format and the cache with the ``T`` new tokens
    appended. One call on ``T`` tokens gives the same integers as any split of them into
    consecutive calls with the cache carried (each query sees the same keys in the same order).
    """
    x_q = np.asarray(x_q, dtype=np.int64)
    T, H = x_q.shape[0], cfg.n_heads
    dn, dr, dv, rkv = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim, cfg.kv_lora_rank
    acc_w = cfg.acc_width
    q_n = I.rmsnorm_weight_int(Q.rq_qa(I.matmul_int(x_q, Q.W_qa.T, acc_w), cfg), Q.q_norm, Q.q_norm_shift, cfg)
    q = Q.rq_qb(I.matmul_int(q_n, Q.W_qb.T, acc_w), cfg).reshape(T, H, dn + dr)
    ckv = I.matmul_int(x_q, Q.W_kva.T, acc_w)
    n_kv = I.rmsnorm_weight_int(Q.rq_ckv(ckv[:, :rkv], cfg), Q.kv_norm, Q.kv_norm_shift, cfg)
    k_r = Q.rq_kr(ckv[:, rkv:], cfg)
    if cache is not None:
        n_kv, k_r = np.concatenate([cache.n_kv, n_kv]), np.concatenate([cache.k_r, k_r])
    S = n_kv.shape[0]
    kv = Q.rq_kvb(I.matmul_int(n_kv, Q.W_kvb.T, acc_w), cfg).reshape(S, H, dn + dv)
    keys = np.concatenate([kv[..., :dn], np.broadcast_to(k_r[:, None, :], (S, H, dr))], axis=-1)
    score = np.stack([Q.rq_score(I.matmul_int(q[:, h], keys[:, h].T, acc_w), cfg) for h in range(H)])
    o = online_softmax_int(score, kv[..., dn:], np.arange(S - T, S), cfg).reshape(T, H * dv)
    g = I.sigmoid_q(Q.rq_g(I.matmul_int(x_q, Q.W_g.T, acc_w), cfg), cfg)
    og = gate_int(o, g, cfg)
    y = Q.rq_o(I.matmul_int(og, Q.W_o.T, acc_w), cfg)
    return y, MLACache(n_kv, k_r)
