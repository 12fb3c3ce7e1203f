"""The integer KDA mixer of a K3 layer (:func:`golden.k3.kda`), decode form, op by op in
:mod:`golden.intops`.

:func:`quantize_kda` turns a float mixer (:class:`golden.k3.KDAParams`) and a calibration batch into
int8 weights and requantiser constants (:class:`QuantKDA`); :func:`kda_int` runs it with integers
only, token by token, carrying a :class:`KDAState` so that decode steps chain: ``kda_int`` over
``T`` tokens equals ``T`` calls of one token each, the state of one passed to the next. The
dataflow, with every tensor's format (``C = H K``; ``U = act_width - 2``: the unit format
``Q<act_width>.<U>`` of the l2-normalised ``q``, ``k``; the state format ``Q<2 act_width>.<2
act_frac>``)::

    x_q      int8 [T, d]                                  (scale x_scale, one per tensor)
    p_c      = rq_c(x_q @ W_c^T)        act format [T, C]   c = q, k, v
    a_c      = rq_conv_c(sum_j conv_c[:, j] p_c[t-n+1+j])   act format (the n-1 previous p_c are the
                                        state's conv tail; zeros before the first token)
    q, k     = l2norm_int(silu_q(a_q)), l2norm_int(silu_q(a_k))   per head, unit format [T, H, K]
    v        = silu_q(a_v)              act format [T, H, K]
    z        = rq_f(add_sat(x_q @ W_f^T, f_bias))   act format [T, C]: exp(A_log) (x W_f^T + dt_bias)
    decay    = decay_q(z)               unsigned, score_frac: exp(g), g = kda_gate_min sigmoid(z)
    beta     = sigmoid_q(rq_b(x_q @ W_b^T))         unsigned, score_frac [T, H]
    per token t and head h (S [K, K] in the state format, width 2 act_width, saturating):
      S     = round_shift(decay_t[:, None] S, score_frac)                    S' = Diag(exp(g)) S
      e     = (v_t << act_frac) - round_shift(S^T k_t, U)                    state format, one bit wider
      bk    = round_shift(beta_t k_t, score_frac)                            unit format
      S     = saturate(S + round_shift(bk e^T, U), 2 act_width)              the delta rule
      o_t   = rq_read(round_shift(S^T q_t, U))                               Q<act_width>.<o_frac>, / sqrt(K)
    n        = rmsnorm_weight_int(o, o_norm)    Q<out_width>.<norm_frac> per head [T, H, K] (eps in o's format)
    og       = round_shift(n * sigmoid_q(rq_gate(x_q @ W_gate^T)), score_frac)   Q<out_width>.<norm_frac>
    y        = rq_o(og @ W_o^T)         act format [T, d]

Every GEMM accumulates in ``acc_width`` bits. ``o_frac`` is calibrated (the largest that holds twice
the float ``max |o|`` of the batch, at most ``act_width - 1``): ``o`` is small (``|S^T q| / sqrt(K)``
with mostly-decayed states), and in the act format its few significant bits would be what the
RMSNorm amplifies.

The state's bound. With ``|k| <= 1``, ``beta`` in ``[0, 1]`` and ``exp(g)`` in ``(0, 1]``, each column
``j`` of ``S`` obeys ``|S_t[:, j]|**2 <= |S_{t-1}[:, j]|**2 + beta_t v_tj**2``: along ``k`` the new
column is ``(1 - beta |k|^2) a + beta |k|^2 (v_j / |k|)`` (``a`` the old column's component), a
convex combination, so its square is at most ``(1 - beta |k|^2) a^2 + beta v_j^2``; across ``k`` the
column is unchanged, and the decay only shrinks rows. So every ``|S_ij| <= sqrt(sum_t beta_t
v_tj^2) <= sqrt(T) max |v|``, and ``|v| <= 2**(act_width - 1 - act_frac)``: the state format (range
``2**(2 act_width - 1 - 2 act_frac)``) holds any ``T < 4**(act_width - act_frac)`` tokens (65,536 in
``Q16.8``) without saturating, whatever the inputs (up to the rounding of each step; the integer
``|k|`` may exceed 1 by its rounding). With a decay ``exp(g) <= c < 1`` on every channel, ``|S_ij| <=
max |v| / sqrt(1 - c^2)`` for any ``T``. The read-out obeys the same bound: ``|(S^T q)_j| <= |S[:,
j]|`` with ``|q| <= 1``.

Why the decode (recurrent) form: a decode step is one token, so the chunked (WY) form has no
chunk to gather; per token and head the recurrence is two matrix-vector products with the state
(``S^T k``, ``S^T q``), one rank-1 update and a row scaling, each ``K x K`` with the state in
``2 act_width`` bits: the int8 systolic array (``rows x cols`` of ``in_width``-bit operands) holds
neither the wide state nor an operand reused across rows (a matrix-vector product keeps one
column of PEs busy), so the state streams once per token through wide vector multipliers, reading
and writing each element once. The projections (``x @ W^T``, batched over tokens in prefill,
``[1, d] @ [d, C]`` in decode) are the GEMMs that go to the array. The chunked form pays off in
prefill only, where its ``[chunk, chunk]`` and ``[chunk, K]`` GEMMs fill the array, at the cost of a
triangular solve and decays formed as ``exp`` of differences per element pair.

Quantisation scheme: as :mod:`golden.block` (symmetric, zero point 0, weights by
``cfg.weight_scales``, activations one scale per tensor). The conv kernels are quantised as
``[C, n]`` matrices; ``dt_bias`` is an accumulator-unit bias added to the ``W_f`` GEMM
(``add_sat`` at ``acc_width``); ``exp(A_log)`` is folded into the per-column ``rq_f``; the
``1/sqrt(K)`` into ``rq_read``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from golden import block, k3
from golden import intops as I
from nanokpu.config import KpuConfig

__all__ = ["random_state", "QuantWeight", "QuantKDA", "KDAState", "unit_frac", "state_width", "state_frac",
           "quantize_kda", "kda_int", "kda_step_int", "kda_head_step_int"]


def unit_frac(cfg: KpuConfig) -> int:
    """Fractional bits of the l2-normalised ``q``, ``k`` (``Q<act_width>.<act_width - 2>``: +-1.0 and a
    sign): :attr:`KpuConfig.kda_unit_frac`."""
    return cfg.kda_unit_frac


def state_width(cfg: KpuConfig) -> int:
    """Width of the state ``S`` and of the delta-rule products' sums: ``2 act_width``
    (:attr:`KpuConfig.kda_state_width`)."""
    return cfg.kda_state_width


def state_frac(cfg: KpuConfig) -> int:
    """Fractional bits of the state ``S``: ``2 act_frac`` (``act_frac`` more than ``v``;
    :attr:`KpuConfig.kda_state_frac`)."""
    return cfg.kda_state_frac


class QuantWeight(NamedTuple):
    """Int8 weights ``W`` and the requantiser ``rq`` of their accumulated products: a projection
    ``W [n_out, n_in]`` (the call: ``rq(matmul_int(x_q, W^T) [+ bias])``) or the depthwise conv
    kernels ``W [C, n]``."""

    W: np.ndarray
    rq: block.Requant

    def __call__(self, x_q, cfg: KpuConfig, bias=None) -> np.ndarray:
        acc = I.matmul_int(x_q, self.W.T, cfg.acc_width)
        return self.rq(acc if bias is None else I.add_sat(acc, bias, cfg.acc_width), cfg)


@dataclass(frozen=True)
class QuantKDA:
    """A quantised KDA mixer (see the module docstring for the dataflow)."""

    x_scale: float          # scale of the int8 input x_q
    proj_q: QuantWeight     # [C, d] -> act format
    proj_k: QuantWeight
    proj_v: QuantWeight
    conv_q: QuantWeight     # [C, n] int8 kernels; rq: act format -> act format
    conv_k: QuantWeight
    conv_v: QuantWeight
    proj_f: QuantWeight     # [C, d], rq per column (exp(A_log) of the head) -> act format z
    f_bias: np.ndarray      # [C] dt_bias in W_f accumulator units
    proj_b: QuantWeight     # [H, d] -> router logit format
    o_frac: int             # o in Q<act_width>.<o_frac>
    rq_read: block.Requant  # S^T q (state format) -> o, times 1/sqrt(K)
    o_norm: np.ndarray      # [K] RMSNorm weight, signed mult_width bits
    o_norm_shift: int       # its fractional bits
    proj_gate: QuantWeight  # [C, d] -> router logit format
    proj_o: QuantWeight     # [d, C] on Q<out_width>.<norm_frac> -> act format


class KDAState(NamedTuple):
    """What a decode step carries to the next: ``S [H, K, K]`` in the state format and ``conv [3, n-1,
    C]``, the act-format ``q``, ``k``, ``v`` projections of the last ``n - 1`` tokens, oldest first."""

    S: np.ndarray
    conv: np.ndarray


def random_state(cfg: KpuConfig, rng: np.random.Generator) -> KDAState:
    """A random :class:`KDAState` for tests: ``S`` within 2**20, the conv tails within 2**12."""
    H, K = cfg.n_heads, cfg.kda_head_dim
    return KDAState(rng.integers(-(1 << 20), 1 << 20, (H, K, K)),
                    rng.integers(-(1 << 12), 1 << 12, (3, cfg.kda_conv - 1, H * K)))


def _projection(W, in_scale: float, out_frac: int, out_width: int, cfg: KpuConfig) -> QuantWeight:
    """``W`` by ``cfg.weight_scales``; ``rq`` from inputs of scale ``in_scale`` to ``Q<out_width>.<out_frac>``."""
    w_q, s_w = block.quantize_weights(W, cfg)
    return QuantWeight(w_q, block.quant_multiplier(in_scale * s_w * 2.0 ** out_frac, out_width, cfg))


def quantize_kda(P: k3.KDAParams, x, cfg: KpuConfig, x_scale: float | None = None):
    """Quantise a float KDA mixer, the input scale calibrated on the float batch ``x [T, d]``.

    Returns ``(Q, x_q)``: the :class:`QuantKDA` and ``x`` in int8 (:func:`golden.block.quantize_tensor`).
    ``x`` sets ``x_scale`` (unless given) and ``o_frac`` (from the float mixer's ``o`` on it); every other
    activation has a fixed format (module docstring).
    """
    P.check(cfg)
    x_q, x_scale = block.quantize_tensor(x, cfg.in_width, scale=x_scale)
    act, logit = (cfg.act_frac, cfg.act_width), (cfg.router_logit_frac, cfg.router_logit_width)
    proj = {c: _projection(getattr(P, f"W_{c}"), x_scale, *act, cfg) for c in "qkv"}
    conv = {c: _projection(getattr(P, f"conv_{c}"), 2.0 ** -cfg.act_frac, *act, cfg) for c in "qkv"}
    w_f, s_f = block.quantize_weights(P.W_f, cfg)
    head_gain = np.repeat(np.exp(P.A_log), cfg.kda_head_dim)          # exp(A_log) of each column's head
    proj_f = QuantWeight(w_f, block.quant_multiplier(x_scale * s_f * 2.0 ** cfg.act_frac * head_gain,
                                                     cfg.act_width, cfg))
    f_bias = I.saturate(np.round(P.dt_bias / (x_scale * s_f)).astype(np.int64), cfg.acc_width)
    o_norm, o_norm_shift = I.quantize_norm_weight(P.o_norm, cfg)
    o, _ = k3.kda_recurrent(*k3.kda_prepare(x, P, cfg))
    o_frac = min(max(cfg.act_width - 2 - math.frexp(float(np.max(np.abs(o))))[1], 0), cfg.act_width - 1)
    read = 2.0 ** (o_frac - state_frac(cfg)) / math.sqrt(cfg.kda_head_dim)
    Q = QuantKDA(
        x_scale=x_scale, proj_q=proj["q"], proj_k=proj["k"], proj_v=proj["v"],
        conv_q=conv["q"], conv_k=conv["k"], conv_v=conv["v"],
        proj_f=proj_f, f_bias=f_bias, proj_b=_projection(P.W_b, x_scale, *logit, cfg),
        o_frac=o_frac, rq_read=block.quant_multiplier(read, cfg.act_width, cfg),
        o_norm=o_norm, o_norm_shift=o_norm_shift,
        proj_gate=_projection(P.W_gate, x_scale, *logit, cfg),
        proj_o=_projection(P.W_o, 2.0 ** -cfg.norm_frac, *act, cfg),
    )
    return Q, x_q


def _short_conv_int(p, tail, conv: QuantWeight, cfg: KpuConfig):
    """Causal depthwise conv of act-format ``p [T, C]`` after ``tail [n-1, C]``: ``(a [T, C], new tail)``.
    The sum of ``n`` products in ``acc_width`` bits (:func:`golden.intops.short_conv_int`), then ``conv.rq``."""
    xp = np.concatenate([tail, p])
    return conv.rq(I.short_conv_int(xp, conv.W, cfg.acc_width), cfg), xp[p.shape[0]:]


def kda_head_step_int(S, decay, k, v, beta, q, cfg: KpuConfig):
    """The recurrence of one token for one head (or for every head along leading axes): ``(S, r)``.

    ``S [..., K, K]`` state format; ``decay [..., K]`` and ``beta [...]`` unsigned, ``score_frac``
    bits; ``k``, ``q`` ``[..., K]`` unit format; ``v [..., K]`` act format. Returns the new state and
    ``r = round_shift(S^T q, U)`` ``[..., K]`` in the state format (the read after the write, before
    ``rq_read``); no saturation but the delta rule's. The products fit int64 while ``K < 2**(63 - 2
    act_width - U)`` (``S^T k``: unit x state format).
    """
    u, mode = unit_frac(cfg), cfg.rounding
    S, decay, k, v, beta, q = (np.asarray(a, dtype=np.int64) for a in (S, decay, k, v, beta, q))
    S = I.round_shift(decay[..., :, None] * S, cfg.score_frac, mode)
    e = (v << (state_frac(cfg) - cfg.act_frac)) - I.round_shift(np.einsum("...k,...kv->...v", k, S), u, mode)
    bk = I.round_shift(beta[..., None] * k, cfg.score_frac, mode)
    S = I.saturate(S + I.round_shift(bk[..., :, None] * e[..., None, :], u, mode), state_width(cfg))
    return S, I.round_shift(np.einsum("...k,...kv->...v", q, S), u, mode)


def kda_step_int(S, q, k, v, decay, beta, Q: QuantKDA, cfg: KpuConfig):
    """One token of the recurrence for every head: ``(S, o)``.

    ``S [H, K, K]`` state format; ``q``, ``k`` ``[H, K]`` unit format; ``v [H, K]`` act format;
    ``decay [H, K]`` and ``beta [H]`` unsigned, ``score_frac`` bits. Returns the new state and
    ``o [H, K]`` in ``Q<act_width>.<Q.o_frac>``: :func:`kda_head_step_int`'s read-out through
    ``rq_read`` (times ``1/sqrt(K)``).
    """
    S, r = kda_head_step_int(S, decay, k, v, beta, q, cfg)
    return S, Q.rq_read(r, cfg)


def kda_int(x_q, Q: QuantKDA, cfg: KpuConfig, state: KDAState | None = None):
    """The integer KDA mixer on int8 ``x_q [T, d]`` from ``state`` (zeros when ``None``).

    Returns ``(y, state)``: ``y [T, d]`` in the act format and the :class:`KDAState` after the last
    token, to pass to the next call.
    """
    x_q = np.asarray(x_q, dtype=np.int64)
    T, H, K, C = x_q.shape[0], cfg.n_heads, cfg.kda_head_dim, cfg.n_heads * cfg.kda_head_dim
    if state is None:
        state = KDAState(np.zeros((H, K, K), dtype=np.int64), np.zeros((3, cfg.kda_conv - 1, C), dtype=np.int64))
    branches, tails = [], []
    for i, (proj, conv) in enumerate(((Q.proj_q, Q.conv_q), (Q.proj_k, Q.conv_k), (Q.proj_v, Q.conv_v))):
        a, tail = _short_conv_int(proj(x_q, cfg), state.conv[i], conv, cfg)
        branches.append(I.silu_q(a, cfg).reshape(T, H, K))
        tails.append(tail)
    q = I.l2norm_int(branches[0], unit_frac(cfg), cfg)
    k = I.l2norm_int(branches[1], unit_frac(cfg), cfg)
    v = branches[2]
    decay = I.decay_q(Q.proj_f(x_q, cfg, Q.f_bias), cfg).reshape(T, H, K)
    beta = I.sigmoid_q(Q.proj_b(x_q, cfg), cfg)
    S = state.S
    o = np.empty((T, H, K), dtype=np.int64)
    for t in range(T):
        S, o[t] = kda_step_int(S, q[t], k[t], v[t], decay[t], beta[t], Q, cfg)
    n = I.rmsnorm_weight_int(o, Q.o_norm, Q.o_norm_shift, cfg.replace(act_frac=Q.o_frac)).reshape(T, C)
    og = I.round_shift(n * I.sigmoid_q(Q.proj_gate(x_q, cfg), cfg), cfg.score_frac, cfg.rounding)
    return Q.proj_o(og, cfg), KDAState(S, np.stack(tails))
