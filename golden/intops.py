"""Bit-exact integer path of every op the nano-KPU hardware runs.

Integer-only: every array is ``np.int64`` and no Python float enters a result (floats
appear only when a table is *built* from its formula at elaboration time). The RTL must
equal these functions bit for bit; ``tests/test_intops.py`` bounds their error against
the float formulas of :mod:`golden.k3`.

Formats follow :mod:`nanokpu.config`: ``Q<width>.<frac>`` is a ``width``-bit two's
complement integer worth ``int / 2**frac``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from nanokpu.config import ROUNDING_MODES, KpuConfig

__all__ = [
    "wrap", "saturate", "round_shift", "requantize", "matmul_int", "split_digits", "join_partials",
    "PwlTable", "fit_pwl", "sigmoid_table", "gate_table", "up_table", "exp_table",
    "sigmoid_q", "gate_q", "up_q", "situ_q", "exp_q", "topk_int", "route_weights_int", "quantize_bias",
    "route_int", "combine_int", "softmax_int", "NORM_GUARD", "norm_recip_bits", "rms_eps_q", "rmsnorm_int",
    "quantize_norm_weight", "rmsnorm_weight_int", "isqrt", "add_sat",
    "silu_table", "silu_q", "decay_table", "decay_q", "short_conv_int", "l2_eps_q", "l2norm_int",
]


def _i64(x) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"integer path takes integer arrays, not {arr.dtype}")
    return arr.astype(np.int64)


def wrap(x, width: int) -> np.ndarray:
    """Two's complement wrap of ``x`` to ``width`` bits (what a ``width``-bit adder does)."""
    x = _i64(x)
    half = np.int64(1) << (width - 1)
    return ((x + half) & ((np.int64(1) << width) - 1)) - half


def saturate(x, width: int, signed: bool = True) -> np.ndarray:
    """Clamp ``x`` to the range of a ``width``-bit signed (or unsigned) integer."""
    x = _i64(x)
    if signed:
        return np.clip(x, -(1 << (width - 1)), (1 << (width - 1)) - 1)
    return np.clip(x, 0, (1 << width) - 1)


def round_shift(x, shift, mode: str = "half_even") -> np.ndarray:
    """``x / 2**shift`` rounded by ``mode`` (one of ``half_even``, ``half_up``, ``floor``).

    ``half_even`` rounds ties to the even neighbour (Gemmini's rounding right shift),
    ``half_up`` rounds ties toward +infinity, ``floor`` is the arithmetic shift. ``shift`` is
    an integer in ``[0, 63]`` or an integer array of them broadcast against ``x`` (one shift
    per output column of a per-channel requantiser).
    """
    if mode not in ROUNDING_MODES:
        raise ValueError(f"rounding mode {mode!r}: must be one of {ROUNDING_MODES}")
    shifts = _i64(shift)
    if np.any(shifts < 0) or np.any(shifts > 63):
        raise ValueError(f"shift = {shift}: must be in [0, 63]")
    x = _i64(x)
    if shifts.ndim == 0 and int(shifts) == 0:
        return x
    q = x >> shifts
    if mode == "floor":
        return q
    r = x - (q << shifts)
    half = np.int64(1) << np.maximum(shifts - 1, 0)   # shift 0: r = 0 < half, no rounding step
    if mode == "half_up":
        return q + (r >= half)
    return q + ((r > half) | ((r == half) & ((q & 1) == 1)))


def requantize(acc, mult, shift, out_width: int, mode: str = "half_even") -> np.ndarray:
    """The requantiser: ``saturate(round_shift(acc * mult, shift), out_width)``.

    ``acc`` is a signed accumulator, ``mult`` an unsigned integer multiplier and ``shift`` a
    right shift in ``[0, 63]``, each a scalar (per tensor) or one per output column (per
    channel), broadcast on the last axis. The product ``acc * mult`` must fit 64 bits.
    """
    mult = _i64(mult)
    if np.any(mult < 0):
        raise ValueError("requantiser multiplier must be non-negative")
    return saturate(round_shift(_i64(acc) * mult, shift, mode), out_width)


def matmul_int(a, b, acc_width: int = 32) -> np.ndarray:
    """``a @ b`` of integer matrices, accumulated in a ``acc_width``-bit wrapping register.

    Shapes ``[M, K] @ [K, N] -> [M, N]``. The wrap is explicit: the array's adders are
    ``acc_width`` bits and do not saturate; :class:`~nanokpu.config.KpuConfig` keeps
    ``acc_width`` wide enough that real K3 shapes never wrap.
    """
    a, b = _i64(a), _i64(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul_int shapes {a.shape} @ {b.shape} do not chain")
    return wrap(a @ b, acc_width)


def split_digits(v, digit_width: int) -> tuple[np.ndarray, np.ndarray]:
    """``v`` as two balanced digits ``(h, l)``, ``v = h * 2**digit_width + l``:
    ``l = wrap(v, digit_width)`` (in ``[-2**(D-1), 2**(D-1))``, ``D = digit_width``) and ``h = (v - l)
    >> D``. ``h`` fits ``D`` bits when ``|v| <= (2**(D-1) - 1) * 2**D`` (the router operands'
    limit, :func:`golden.block.router_qmax`), so a product of two such ``v`` is four products of
    ``D``-bit digits (:func:`join_partials`)."""
    v = _i64(v)
    low = wrap(v, digit_width)
    return (v - low) >> digit_width, low


def join_partials(p_hh, p_lh, p_hl, p_ll, digit_width: int, acc_width: int) -> np.ndarray:
    """The product sums of two-digit operands from their digits' partial sums (:func:`split_digits`
    of ``x`` and ``w``, ``p_xw = sum x_digit * w_digit``): ``wrap((p_hh << 2D) + ((p_lh + p_hl) << D)
    + p_ll, acc_width)``, ``D = digit_width``."""
    d = digit_width
    return wrap((_i64(p_hh) << 2 * d) + ((_i64(p_lh) + _i64(p_hl)) << d) + _i64(p_ll), acc_width)


def add_sat(a, b, width: int) -> np.ndarray:
    """Saturating ``width``-bit signed add (the vector unit's residual add)."""
    return saturate(_i64(a) + _i64(b), width)


def isqrt(x) -> np.ndarray:
    """Floor square root of non-negative integers, exact (bit-by-bit, as the hardware)."""
    x = _i64(x)
    if np.any(x < 0):
        raise ValueError("isqrt of a negative number")
    return np.array([math.isqrt(int(v)) for v in x.ravel()], dtype=np.int64).reshape(x.shape)


# ----------------------------------------------------------------------------------------
# Piecewise-linear function tables
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PwlTable:
    """A piecewise-linear approximation with uniform segments, evaluated bit-exactly.

    Input: a signed ``in_width``-bit integer ``x`` (any format: the table is built for one).
    Breakpoints sit at ``x0 + i * 2**seg_shift`` for ``i = 0 .. n_seg``; ``values[i]`` is the
    function there in units of ``2**-(out_frac + guard)``. Evaluation::

        t = clip(x - x0, 0, n_seg << seg_shift)
        i = min(t >> seg_shift, n_seg - 1);  f = t - (i << seg_shift)   # 0 <= f <= 2**seg_shift
        y = values[i] + floor((values[i+1] - values[i]) * f / 2**seg_shift)
        out = round_shift(y, guard, rounding)

    so inputs below the first breakpoint give ``values[0]`` and above the last give
    ``values[n_seg]`` (the function's flat tails). Hardware cost: one table of ``n_seg + 1``
    words (or value/slope pairs), one multiplier of ``(slope width) x (seg_shift + 1)``.
    """

    in_width: int
    out_frac: int
    guard: int
    rounding: str
    x0: int
    seg_shift: int
    values: tuple

    @property
    def n_seg(self) -> int:
        return len(self.values) - 1

    @property
    def slopes(self) -> tuple:
        """``values[i+1] - values[i]`` for each segment (a hardware table stores these)."""
        v = self.values
        return tuple(v[i + 1] - v[i] for i in range(self.n_seg))

    def __call__(self, x) -> np.ndarray:
        x = _i64(x)
        table = np.asarray(self.values, dtype=np.int64)
        t = np.clip(x - self.x0, 0, self.n_seg << self.seg_shift)
        i = np.minimum(t >> self.seg_shift, self.n_seg - 1)
        f = t - (i << self.seg_shift)
        y = table[i] + (((table[i + 1] - table[i]) * f) >> self.seg_shift)
        return round_shift(y, self.guard, self.rounding)


def _all_inputs(in_width: int) -> np.ndarray:
    return np.arange(-(1 << (in_width - 1)), 1 << (in_width - 1), dtype=np.int64)


def fit_pwl(func, in_width: int, in_frac: int, out_frac: int, guard: int,
            rounding: str, max_err_lsb: int = 1) -> PwlTable:
    """The smallest :class:`PwlTable` of ``func`` whose every output is within
    ``max_err_lsb`` output LSBs of the correctly rounded value ``round(func(x) * 2**out_frac)``,
    checked exhaustively over all ``2**in_width`` inputs.

    ``func`` maps float64 reals to float64 reals. The search takes the narrowest domain
    ``[-2**a, 2**b)`` (in input LSBs) outside which the correctly rounded function is
    constant and equal to the table's end value (so saturated outputs are exact), then the
    widest segments ``2**s`` that meet the bound inside, the top end ``2**b`` raised to
    ``lo + ceil(span / 2**s) * 2**s`` (inputs there lie in the flat top tail).
    """
    xs = _all_inputs(in_width)
    real = func(xs / 2.0 ** in_frac)
    ref = np.round(real * 2.0 ** out_frac).astype(np.int64)
    top = in_width - 1
    scale = 2.0 ** (out_frac + guard)

    def build(lo: int, hi: int, s: int) -> PwlTable:
        points = np.arange(lo, hi + 1, 1 << s, dtype=np.int64)
        vals = np.round(func(points / 2.0 ** in_frac) * scale).astype(np.int64)
        return PwlTable(in_width, out_frac, guard, rounding, int(lo), s,
                        tuple(int(v) for v in vals))

    def tail_ok(edge: int, side: str) -> bool:
        mask = xs <= edge if side == "lo" else xs >= edge
        edge_val = np.round(func(np.array([edge / 2.0 ** in_frac])) * scale).astype(np.int64)
        value = round_shift(edge_val, guard, rounding)[0]
        return bool(np.all(ref[mask] == value))  # the flat tails are exact

    a = next((e for e in range(top + 1) if e == top or tail_ok(-(1 << e), "lo")), top)
    b = next((e for e in range(top + 1) if e == top or tail_ok((1 << e) - 1, "hi")), top)
    lo, hi = -(1 << a), 1 << b  # hi may lie past the largest input: it is never reached
    span = hi - lo
    for s in range(span.bit_length(), -1, -1):
        table = build(lo, lo + (-(-span >> s) << s), s)   # hi raised to a whole number of segments
        if np.max(np.abs(table(xs) - ref)) <= max_err_lsb:
            return table
    raise ValueError(f"no PWL table of {func} meets {max_err_lsb} LSB")  # s = 0 is exact


@functools.lru_cache(maxsize=64)
def _cached_table(kind: str, in_width: int, in_frac: int, out_frac: int, guard: int,
                  rounding: str, beta: float) -> PwlTable:
    if kind == "sigmoid":
        func = _sigmoid
    elif kind == "exp":
        func = _exp_nonpositive
    elif kind == "silu":
        func = _silu
    elif kind == "decay":
        def func(z):
            return np.exp(beta * _sigmoid(z))
    elif kind == "gate":
        def func(g):
            return beta * np.tanh(g / beta) * _sigmoid(g)
    else:
        def func(u):
            return beta * np.tanh(u / beta)
    return fit_pwl(func, in_width, in_frac, out_frac, guard, rounding)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def _exp_nonpositive(x):
    return np.exp(np.minimum(np.asarray(x, dtype=np.float64), 0.0))


def sigmoid_table(cfg: KpuConfig) -> PwlTable:
    """Sigmoid: router logits ``Q<logit_width>.<logit_frac>`` (the act format unless the config
    gives the router its own, :attr:`~nanokpu.config.KpuConfig.router_logit_width`) -> unsigned
    scores, ``score_frac`` bits."""
    return _cached_table("sigmoid", cfg.router_logit_width, cfg.router_logit_frac, cfg.score_frac,
                         cfg.pwl_guard, cfg.rounding, 0.0)


def gate_table(cfg: KpuConfig) -> PwlTable:
    """SiTU gate ``beta1 tanh(g/beta1) sigmoid(g)``: act format -> ``situ_frac`` bits."""
    return _cached_table("gate", cfg.act_width, cfg.act_frac, cfg.situ_frac,
                         cfg.pwl_guard, cfg.rounding, float(cfg.beta1))


def up_table(cfg: KpuConfig) -> PwlTable:
    """SiTU up ``beta2 tanh(u/beta2)``: act format -> ``situ_frac`` bits."""
    return _cached_table("up", cfg.act_width, cfg.act_frac, cfg.situ_frac,
                         cfg.pwl_guard, cfg.rounding, float(cfg.beta2))


def exp_table(cfg: KpuConfig) -> PwlTable:
    """``exp(min(x, 0))``: act format -> unsigned, ``score_frac`` bits (the score format: values in
    ``[0, 2**score_frac]``, 1.0 included). The softmax feeds it ``x <= 0``; every ``x >= 0`` gives
    exactly ``2**score_frac`` (the table's flat top tail), every ``x`` below ``-(score_frac + 1) ln 2``
    (where the correctly rounded value is 0) gives exactly 0."""
    return _cached_table("exp", cfg.act_width, cfg.act_frac, cfg.score_frac, cfg.pwl_guard, cfg.rounding, 0.0)


def sigmoid_q(x, cfg: KpuConfig) -> np.ndarray:
    """Fixed-point sigmoid of router-format logits; scores in ``[0, 2**score_frac]``."""
    return sigmoid_table(cfg)(x)


def exp_q(x, cfg: KpuConfig) -> np.ndarray:
    """Fixed-point ``exp(min(x, 0))`` of act-format ``x``; unsigned, ``score_frac`` bits."""
    return exp_table(cfg)(x)


def gate_q(g, cfg: KpuConfig) -> np.ndarray:
    return gate_table(cfg)(g)


def up_q(u, cfg: KpuConfig) -> np.ndarray:
    return up_table(cfg)(u)


def situ_q(g, u, cfg: KpuConfig) -> np.ndarray:
    """Fixed-point SiTU-GLU ``h = gate(g) * up(u)``: act-format ``g``, ``u`` -> ``Q<h_width>.<h_frac>``.

    The product of the two ``situ_frac`` factors is rounded by ``2*situ_frac - h_frac`` bits.
    Since ``|gate_q| <= beta1 * 2**situ_frac`` and ``|up_q| <= beta2 * 2**situ_frac``,
    ``|h| <= beta1*beta2 * 2**h_frac``, which the config guarantees fits ``h_width``: no
    saturation logic exists or is needed.
    """
    prod = gate_q(g, cfg) * up_q(u, cfg)
    return round_shift(prod, 2 * cfg.situ_frac - cfg.h_frac, cfg.rounding)


# ----------------------------------------------------------------------------------------
# Routing
# ----------------------------------------------------------------------------------------
def topk_int(keys, top_k: int) -> np.ndarray:
    """Indices of the ``top_k`` largest ``keys`` per row, in rank order; ties: lower index wins.

    ``keys``: ``[T, E]`` integers -> ``[T, top_k]`` int64 indices.
    """
    keys = _i64(keys)
    if not 1 <= top_k <= keys.shape[-1]:
        raise ValueError(f"top_k = {top_k}: must be in [1, {keys.shape[-1]}]")
    return np.argsort(-keys, axis=-1, kind="stable")[..., :top_k].astype(np.int64)


def route_weights_int(sel_scores, cfg: KpuConfig) -> np.ndarray:
    """Renormalised routing weights of the selected (unbiased) scores, ``weight_frac`` bits.

    ``sel_scores``: ``[T, k]`` unsigned scores (``score_frac`` bits). With ``S`` the row sum
    and ``R = weight_frac + score_frac + 1``::

        recip = floor(2**R / S)            (0 when S == 0: all weights are 0)
        w_i   = round_shift(s_i * recip, R - weight_frac, rounding)

    One reciprocal per token (a sequential divider), then one multiply per weight. The
    truncated reciprocal costs less than ``s_i / 2**(score_frac+1) <= 0.5`` LSB, the final
    rounding at most 0.5 LSB: each weight is within 1 LSB of ``s_i / S * 2**weight_frac``.
    ``routed_scaling`` is not applied here; the compiler folds it into the combine scale.
    """
    s = _i64(sel_scores)
    total = s.sum(axis=-1, keepdims=True)
    r_bits = cfg.weight_frac + cfg.score_frac + 1
    recip = np.where(total > 0, (np.int64(1) << r_bits) // np.maximum(total, 1), 0)
    return round_shift(s * recip, r_bits - cfg.weight_frac, cfg.rounding)


def quantize_bias(b, cfg: KpuConfig) -> np.ndarray:
    """A real-valued routing bias ``[E]`` in the score format: ``round(b * 2**score_frac)``
    (half-even, the host-side conversion), saturated to ``bias_width`` bits."""
    scaled = np.round(np.asarray(b, dtype=np.float64) * 2.0 ** cfg.score_frac)
    return saturate(scaled.astype(np.int64), cfg.bias_width)


def route_int(scores, bias, cfg: KpuConfig):
    """The routing engine: ``(idx [T, k], weights [T, k], loads [E])``.

    Selection on ``scores + bias`` (stable ties), weights from the unbiased ``scores``,
    ``loads[j]`` the number of tokens that chose expert ``j``.
    """
    scores = _i64(scores)
    idx = topk_int(scores + _i64(bias)[None, :], cfg.top_k)
    weights = route_weights_int(np.take_along_axis(scores, idx, axis=-1), cfg)
    loads = np.bincount(idx.ravel(), minlength=scores.shape[-1]).astype(np.int64)
    return idx, weights, loads


def combine_int(expert_out, weights, cfg: KpuConfig) -> np.ndarray:
    """Weighted combine ``u = sum_j w_j e_j``: ``[T, k, n]`` expert outputs (act format) and
    ``[T, k]`` weights -> ``[T, n]`` in act format, rounded once and saturated to ``act_width``."""
    acc = np.einsum("tk,tkn->tn", _i64(weights), _i64(expert_out))
    return saturate(round_shift(acc, cfg.weight_frac, cfg.rounding), cfg.act_width)


def softmax_int(s, cfg: KpuConfig) -> np.ndarray:
    """Softmax over the last axis: act-format logits ``s [..., N]`` -> unsigned weights, ``weight_frac``
    bits ``[..., N]``::

        m   = max_n s_n                                  (a running max over the row)
        e_n = exp_q(saturate(s_n - m, act_width))        score format, e = 2**score_frac at the max
        w   = route_weights_int(e)                       one reciprocal floor(2**R / sum e) per row,
                                                         one multiply and rounding per weight

    The largest logit's term is exactly 1.0, so ``sum e >= 2**score_frac`` (no division by zero) and
    each ``e_n <= 2**score_frac`` (the range :func:`route_weights_int` is bounded for). Each ``e_n`` is
    within 1.5 score LSB of ``exp(s_n - m)``; each weight within 1 weight LSB of ``e_n / sum e``.
    Adding a constant to a row changes nothing while ``s`` stays in range.
    """
    s = _i64(s)
    e = exp_q(saturate(s - s.max(axis=-1, keepdims=True), cfg.act_width), cfg)
    return route_weights_int(e, cfg)


#: Guard bits of the RMSNorm reciprocal: it carries ``out_width + NORM_GUARD`` significant
#: bits, so its truncation moves an unsaturated output by less than ``2**-(NORM_GUARD - 1)`` LSB.
NORM_GUARD = 4


def norm_recip_bits(cfg: KpuConfig) -> int:
    """``M``: the RMSNorm reciprocal lies in ``[2**(M-1), 2**M]`` (``M + 1`` bits)."""
    return cfg.out_width + NORM_GUARD


def rms_eps_q(cfg: KpuConfig, frac: int | None = None) -> int:
    """RMSNorm's epsilon for rows with ``frac`` fractional bits (the act format's ``act_frac`` by
    default): ``round(rms_eps * 4**frac)``, a mean of squares in those units."""
    return int(round(cfg.rms_eps * 4 ** (cfg.act_frac if frac is None else frac)))


def rmsnorm_int(u, cfg: KpuConfig, eps_q: int | None = None) -> np.ndarray:
    """Fixed-point RMSNorm without weight (the compiler folds the weight into the next GEMM).

    ``u``: ``[T, n]`` act format -> ``[T, n]`` in ``Q<out_width>.<norm_frac>``; one reciprocal
    square root per row, one multiply per element::

        ms    = floor(sum(u**2) / n);  r = isqrt(ms + eps_q),  eps_q = round(rms_eps * 4**act_frac)
        p     = bit_length(r) - 1;     M = norm_recip_bits(cfg)
        recip = floor(2**(p + M) / r)                     in [2**(M-1), 2**M]
        y     = saturate(round_shift(u * recip, p + M - norm_frac, rounding), out_width)

    (``r == 0`` -> ``y = 0``). ``r`` is the RMS in act format (floor); ``recip / 2**(p+M)``
    is ``1 / r`` truncated to ``M`` significant bits, low by a relative ``< 2**-(M-1)``. ``eps_q``
    (default :func:`rms_eps_q`) is the epsilon in the rows' own units: rows with other fractional
    bits than ``act_frac`` normalise alike (the result does not depend on the scale) but for it.
    """
    u = _i64(u)
    n = u.shape[-1]
    eps_q = rms_eps_q(cfg) if eps_q is None else eps_q
    ms = (u * u).sum(axis=-1, keepdims=True) // n
    r = isqrt(ms + eps_q)
    bits = norm_recip_bits(cfg)
    y = np.zeros_like(u)
    for t in np.ndindex(r.shape[:-1]):
        rt = int(r[t][0])
        if rt:
            p = rt.bit_length() - 1
            recip = (1 << (p + bits)) // rt
            y[t] = round_shift(u[t] * recip, p + bits - cfg.norm_frac, cfg.rounding)
    return saturate(y, cfg.out_width)


def quantize_norm_weight(weight, cfg: KpuConfig) -> tuple[np.ndarray, int]:
    """An RMSNorm weight ``[n]`` (real) as ``(weight_q, weight_shift)``: ``weight_q = round(weight *
    2**weight_shift)`` (half-even, the host-side conversion), signed ``mult_width`` bits, with the
    largest ``weight_shift`` in ``[0, 63]`` that keeps ``max |weight_q| <= 2**(mult_width-1) - 1``.
    Each ``weight_q / 2**weight_shift`` is within ``2**-(weight_shift+1)`` of ``weight``. ValueError
    when ``max |weight|`` needs ``weight_shift < 0``."""
    w = np.asarray(weight, dtype=np.float64)
    top = float(np.max(np.abs(w)))
    qmax = (1 << (cfg.mult_width - 1)) - 1
    shift = min(cfg.mult_width - 1 - math.frexp(top)[1], 63)   # frexp: top < 2**e, so top * 2**shift < qmax + 1
    if round(top * 2.0 ** shift) > qmax:
        shift -= 1
    if shift < 0:
        raise ValueError(f"RMSNorm weight max |w| = {top:g} does not fit mult_width = {cfg.mult_width} bits")
    return np.round(w * 2.0 ** shift).astype(np.int64), shift


def rmsnorm_weight_int(u, weight_q, weight_shift: int, cfg: KpuConfig) -> np.ndarray:
    """Fixed-point RMSNorm with weight: ``u [T, n]`` act format -> ``[T, n]`` in ``Q<out_width>.<norm_frac>``::

        y = saturate(round_shift(rmsnorm_int(u) * weight_q, weight_shift, rounding), out_width)

    ``weight_q [n]`` signed ``mult_width`` bits worth ``weight_q / 2**weight_shift``
    (:func:`quantize_norm_weight`). One multiply per element (``out_width x mult_width`` bits), its
    product rounded once. ``rmsnorm_int`` saturates first: a normalised value beyond the format's
    range is clipped before it is weighted.
    """
    prod = rmsnorm_int(u, cfg) * _i64(weight_q)
    return saturate(round_shift(prod, weight_shift, cfg.rounding), cfg.out_width)


# ----------------------------------------------------------------------------------------
# KDA (Kimi Delta Attention)
# ----------------------------------------------------------------------------------------
def _silu(x):
    x = np.asarray(x, dtype=np.float64)
    return x * _sigmoid(x)


def silu_table(cfg: KpuConfig) -> PwlTable:
    """SiLU ``x sigmoid(x)``: act format -> act format (``silu(x)`` lies in ``[-0.279, x]``, so every
    output fits ``act_width``)."""
    return _cached_table("silu", cfg.act_width, cfg.act_frac, cfg.act_frac, cfg.pwl_guard, cfg.rounding, 0.0)


def silu_q(x, cfg: KpuConfig) -> np.ndarray:
    """Fixed-point SiLU of act-format ``x``; act format."""
    return silu_table(cfg)(x)


def decay_table(cfg: KpuConfig) -> PwlTable:
    """The KDA decay ``exp(g)``, ``g = kda_gate_min * sigmoid(z)``, of the gate logit ``z``: act format ->
    unsigned, ``score_frac`` bits, in ``[exp(kda_gate_min), 1]`` (1.0 included: exactly ``2**score_frac``
    for every ``z`` low enough that the correctly rounded value is 1)."""
    return _cached_table("decay", cfg.act_width, cfg.act_frac, cfg.score_frac, cfg.pwl_guard, cfg.rounding,
                         float(cfg.kda_gate_min))


def decay_q(z, cfg: KpuConfig) -> np.ndarray:
    """Fixed-point ``exp(kda_gate_min * sigmoid(z))`` of act-format ``z``; unsigned, ``score_frac`` bits."""
    return decay_table(cfg)(z)


def short_conv_int(x, W, acc_width: int = 32) -> np.ndarray:
    """Causal depthwise convolution over token rows: ``x [T + k - 1, C]`` (act format; the ``k - 1``
    rows before the first output row are the history, the conv tail) and kernels ``W [C, k]``
    (int8) -> ``[T, C]``, accumulated in a ``acc_width``-bit wrapping register like
    :func:`matmul_int`::

        y[t, c] = wrap(sum_j W[c, j] * x[t + j, c], acc_width)

    No rounding; ``|sum| <= k * 2**(act_width + in_width - 2)`` (it wraps only beyond
    ``acc_width``, e.g. 4 taps of -128 on -32768 at ``acc_width = 24``)."""
    x, W = _i64(x), _i64(W)
    k = W.shape[1]
    T = x.shape[0] - k + 1
    return wrap(sum(W[:, j] * x[j:j + T] for j in range(k)), acc_width)


def l2_eps_q(cfg: KpuConfig) -> int:
    """The l2norm's epsilon in act-format units squared: ``round(l2_eps * 4**act_frac)`` (0 at
    ``act_frac = 8``: ``l2_eps = 1e-6`` is below the format's resolution)."""
    return int(round(cfg.l2_eps * 4 ** cfg.act_frac))


def l2norm_int(x, frac: int, cfg: KpuConfig, eps_q: int | None = None) -> np.ndarray:
    """Fixed-point l2norm ``x / sqrt(sum(x**2) + eps)`` over the last axis: ``x [..., n]`` act format ->
    ``[..., n]`` with ``frac`` fractional bits (signed; ``|y| <= 2**frac`` plus rounding, see below).
    One integer square root and one reciprocal per row, one multiply per element::

        ss    = sum(x**2) + eps_q,   eps_q = l2_eps_q(cfg) by default (0 at act_frac = 8)
        P     = frac + NORM_GUARD + 1
        e     = max(0, 2P - bit_length(ss)) rounded up to even      (a leading-zero count)
        r     = isqrt(ss << e)                    sqrt(ss) 2**(e/2), floor; P bits or more
        p     = bit_length(r) - 1;   M = frac + NORM_GUARD
        recip = floor(2**(p + M) / r)             in [2**(M-1), 2**M]
        y     = round_shift(x * recip, p + M - frac - e/2, rounding)

    (``ss == 0`` -> ``y = 0``, as the float formula with the eps below the format's resolution).
    ``r`` and ``recip`` are each low by a relative ``< 2**-(P-1)``, so every output is within
    ``h + |y| 2**-(NORM_GUARD - 2)`` LSB of ``x / sqrt(ss) * 2**frac`` (``|y|`` real, ``h`` the rounding:
    0.5, 1 for ``floor``); with ``|y| <= 1`` that is 0.75 LSB (1.25), and ``|y| <= 2**frac + 1``.
    """
    x = _i64(x)
    eps_q = l2_eps_q(cfg) if eps_q is None else eps_q
    ss = (x * x).sum(axis=-1) + eps_q
    bits = frac + NORM_GUARD
    y = np.zeros_like(x)
    for t in np.ndindex(ss.shape):
        st = int(ss[t])
        if st:
            e = max(0, 2 * (bits + 1) - st.bit_length())
            e += e & 1
            r = math.isqrt(st << e)
            p = r.bit_length() - 1
            recip = (1 << (p + bits)) // r
            y[t] = round_shift(x[t] * recip, p + bits - frac - e // 2, cfg.rounding)
    return y
