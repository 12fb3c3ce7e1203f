"""The integer LatentMoE block: what the nano-KPU computes, op by op, in :mod:`golden.intops`.

:func:`quantize_latent_moe` turns a float block (:class:`golden.k3.LatentMoEParams`) and a
calibration batch into int weights and requantiser constants (:class:`QuantLatentMoE`);
:func:`latent_moe_int` runs it with integers only. The dataflow, with every tensor's format
(``r = router_operand_width``, ``in_width`` unless ``router_width`` says otherwise)::

    x_r   int<r> [T, d]                    (the block input; scale x_scale / 2**(r - in_width))
    x_q   = saturate(round_shift(x_r, r - in_width), in_width)   int8 [T, d]  (scale x_scale)
    z     = requant(x_q @ W_down_lat^T)    int8  [T, l]
    logit = requant(x_r @ W_r^T)           Q<logit_width>.<logit_frac>   [T, E]  (int<r> W_r,
                                           accumulated in router_acc_width bits)
    s     = sigmoid_q(logit)               unsigned, score_frac      [T, E]
    idx, w, loads = route_int(s, bias)     w: unsigned, weight_frac  [T, k]
    per selected expert j (tokens grouped per expert):
      g, u = requant(z @ W_gate_j^T), requant(z @ W_up_j^T)      act format [., d_expert]
      h    = situ_q(g, u)                                        Q<h_width>.<h_frac>
      e_j  = requant(requant(h -> int8) @ W_down_j^T)            act format [., l]
    u     = combine_int(e, w)              act format [T, l]
    n     = rmsnorm_int(u)                 Q<out_width>.<norm_frac>   [T, l]
    y_r   = requant(n @ (W_up_lat diag(norm_weight))^T)          act format [T, d]
    y_s   = shared expert on x_q, same steps as a routed expert  act format [T, d]
    y     = add_sat(y_r, y_s)              act format [T, d]

With the defaults (``router_width`` = ``in_width``, logits in the act format) ``x_r`` is
``x_q``. ``routed_scaling`` is folded into each expert's output multiplier; the latent RMSNorm's
weight is folded into ``W_up_lat``. Every requantiser constant is ``(mult, shift)`` with
``mult < 2**mult_width`` (see :func:`quant_multiplier`).

Quantisation scheme (in the terms of PyTorch/ONNX quantisation): every tensor is symmetric with
zero point 0. Weights take one scale per tensor (``weight_scales = "tensor"``,
``per_tensor_symmetric``) or one per output channel (``"channel"``, ``per_channel_symmetric``,
the rows of each ``[n_out, n_in]`` matrix); a per-channel GEMM's requantiser holds a multiplier
and a shift per output column (:class:`Requant` with tuples). Activations take one scale per
tensor, calibrated on the batch: per-token scales would need a second, per-row factor in
every requantiser (its constant becomes a ``[T, N]`` table or a second multiply), and the
tensors that are grouped per expert (``z``, ``h``) would carry their tokens' scales through
the expert GEMMs; the router, where precision decides the outcome, gets 16-bit operands
(``router_width``) instead, which is enough (docs/fidelity.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from golden import intops as I
from golden import k3
from nanokpu.config import KpuConfig

__all__ = ["SCORE_SKEW", "skewed_scores",
           "Requant", "QuantExpert", "QuantRouter", "QuantLatentMoE", "quant_multiplier", "quantize_tensor",
           "quant_expert", "quantize_weights",
           "quantize_input", "input_int8", "router_qmax", "quantize_router", "router_int",
           "quantize_latent_moe", "latent_moe_int", "expert_int", "block_error", "RandomBlock", "random_block",
           "same_routing"]


@dataclass(frozen=True)
class Requant:
    """One requantiser setting: ``out = saturate(round_shift(acc * mult, shift), width)``.

    ``mult`` and ``shift`` are ints (one per tensor) or equal-length tuples of ints (one per
    output column: a per-channel GEMM).
    """

    mult: int | tuple
    shift: int | tuple
    width: int

    @property
    def per_column(self) -> bool:
        """Whether the setting holds one ``(mult, shift)`` per output column."""
        return isinstance(self.mult, tuple)

    def __call__(self, acc, cfg: KpuConfig) -> np.ndarray:
        return I.requantize(acc, self.mult, self.shift, self.width, cfg.rounding)


def _quant_multiplier(scale: float, cfg: KpuConfig) -> tuple[int, int]:
    if not scale > 0 or not math.isfinite(scale):
        raise ValueError(f"requantiser scale must be positive and finite, not {scale!r}")
    shift = cfg.mult_width - 1 - math.floor(math.log2(scale))
    shift = min(max(shift, 0), 63)
    mult = round(scale * 2.0 ** shift)
    if mult == 1 << cfg.mult_width and shift > 0:   # scale just below a power of two rounded up to it
        mult, shift = mult >> 1, shift - 1
    if mult >= 1 << cfg.mult_width:
        raise ValueError(f"requantiser scale {scale:g} too large for mult_width={cfg.mult_width}")
    return max(mult, 1), shift


def quant_multiplier(scale, width: int, cfg: KpuConfig) -> Requant:
    """The ``(mult, shift)`` pair closest to a positive real ``scale``, ``mult`` in
    ``[2**(mult_width-1), 2**mult_width)`` (or smaller when ``shift`` would exceed 63).

    ``scale`` is a float (one pair: a per-tensor requantiser) or a 1-D array of them (one pair
    per output column, each chosen alone: the shifts may differ between columns).
    """
    if np.ndim(scale) == 0:
        return Requant(*_quant_multiplier(float(scale), cfg), width)
    scale = np.asarray(scale, dtype=np.float64).ravel()
    if not np.all((scale > 0) & np.isfinite(scale)):
        raise ValueError(f"requantiser scales must be positive and finite, not {scale[~(scale > 0)][:3]!r}...")
    shift = np.clip(cfg.mult_width - np.frexp(scale)[1], 0, 63)   # frexp: scale = m 2**e, m in [0.5, 1)
    mult = np.round(np.ldexp(scale, shift)).astype(np.int64)
    top = (mult == 1 << cfg.mult_width) & (shift > 0)               # rounded up to the next power of two
    mult, shift = np.where(top, mult >> 1, mult), np.where(top, shift - 1, shift)
    if np.any(mult >= 1 << cfg.mult_width):
        raise ValueError(f"requantiser scale {scale.max():g} too large for mult_width={cfg.mult_width}")
    return Requant(tuple(int(m) for m in np.maximum(mult, 1)), tuple(int(v) for v in shift), width)


def quantize_tensor(w, width: int = 8, per_channel: bool = False, qmax: int | None = None,
                    scale: float | None = None):
    """Symmetric quantisation, zero point 0: ``(w_q int64, scale)`` with ``w ~ w_q * scale``.

    One scale per tensor (a float), or with ``per_channel`` one per row of a ``[n_out, n_in]``
    matrix (an array ``[n_out]``, to multiply ``w_q`` by ``scale[:, None]``). The scale is ``max |w| /
    qmax`` (an all-zero tensor or row takes 1), or the given per-tensor ``scale``. ``|w_q| <= qmax``,
    by default ``2**(width-1) - 1``.
    """
    w = np.asarray(w, dtype=np.float64)
    qmax = (1 << (width - 1)) - 1 if qmax is None else qmax
    if scale is not None:
        if per_channel:
            raise ValueError("quantize_tensor: a given scale is one per tensor, not per channel")
        return np.clip(np.round(w / scale), -qmax, qmax).astype(np.int64), float(scale)
    if per_channel:
        if w.ndim != 2:
            raise ValueError(f"per-channel quantisation takes a [n_out, n_in] matrix, not shape {w.shape}")
        scale = np.max(np.abs(w), axis=1) / qmax
        scale = np.where(scale > 0, scale, 1.0)
        return np.clip(np.round(w / scale[:, None]), -qmax, qmax).astype(np.int64), scale
    scale = float(np.max(np.abs(w))) / qmax or 1.0
    return np.clip(np.round(w / scale), -qmax, qmax).astype(np.int64), scale


def quantize_weights(w, cfg: KpuConfig, qmax: int | None = None):
    """``w [n_out, n_in]`` quantised by ``cfg.weight_scales`` at ``in_width`` bits, or up to ``qmax``."""
    return quantize_tensor(w, cfg.in_width, cfg.weight_scales == "channel", qmax)


def router_qmax(cfg: KpuConfig) -> int:
    """The largest magnitude of a router GEMM operand (``x_r`` and ``W_r``): ``(2**(in_width-1) - 1)
    << (router_operand_width - in_width)``, so that each is two ``in_width``-bit balanced digits
    (:func:`golden.intops.split_digits`) when ``router_operand_width <= 2 * in_width``."""
    return ((1 << (cfg.in_width - 1)) - 1) << (cfg.router_operand_width - cfg.in_width)


@dataclass(frozen=True)
class QuantExpert:
    """One SiTU-GLU expert in integers: ``W_gate``, ``W_up`` ``[hidden, n_in]`` and
    ``W_down`` ``[n_out, hidden]`` int8, with their four requantisers."""

    W_gate: np.ndarray
    W_up: np.ndarray
    W_down: np.ndarray
    rq_gate: Requant   # acc -> act format
    rq_up: Requant     # acc -> act format
    rq_h: Requant      # h (Q<h_width>.<h_frac>) -> int8
    rq_out: Requant    # acc -> act format


@dataclass(frozen=True)
class QuantRouter:
    """The router in integers: ``W_r [E, d]`` at ``router_operand_width`` bits, the
    requantiser to router logits and the bias ``[E]`` (signed ``bias_width``, score format)."""

    W_r: np.ndarray
    rq_router: Requant
    bias: np.ndarray


@dataclass(frozen=True)
class QuantLatentMoE:
    """A quantised LatentMoE block (see the module docstring for the dataflow)."""

    x_scale: float             # scale of the in_width x_q (x_r's is x_scale / 2**(r - in_width))
    W_down_lat: np.ndarray     # [l, d] int8
    rq_down_lat: Requant       # -> int8 z
    W_r: np.ndarray            # [E, d] int<router_operand_width>
    rq_router: Requant         # -> router logits Q<logit_width>.<logit_frac>
    bias: np.ndarray           # [E] signed, bias_width, score format
    experts: tuple             # E x QuantExpert on z (n_in = l, n_out = l)
    W_up_lat: np.ndarray       # [d, l] int8, norm weight folded in
    rq_up_lat: Requant         # -> act format
    shared: QuantExpert        # on x (n_in = d, n_out = d)


def _act(cfg: KpuConfig) -> float:
    return 2.0 ** cfg.act_frac


def quant_expert(W_gate, W_up, W_down, in_scale: float, h_absmax: float, out_gain: float,
                 cfg: KpuConfig) -> QuantExpert:
    """One SiTU-GLU FFN ``W_down situ_glu(W_gate a, W_up a)`` (float weights) as a :class:`QuantExpert`:
    inputs of scale ``in_scale``, ``h`` calibrated to ``h_absmax`` (the float ``max |h|``), the output
    times ``out_gain``, in the act format."""
    wg, sg = quantize_weights(W_gate, cfg)
    wu, su = quantize_weights(W_up, cfg)
    wd, sd = quantize_weights(W_down, cfg)
    h_scale = max(h_absmax, 2.0 ** -cfg.h_frac) / ((1 << (cfg.out_width - 1)) - 1)
    return QuantExpert(
        wg, wu, wd,
        quant_multiplier(in_scale * sg * _act(cfg), cfg.act_width, cfg),
        quant_multiplier(in_scale * su * _act(cfg), cfg.act_width, cfg),
        quant_multiplier(2.0 ** -cfg.h_frac / h_scale, cfg.in_width, cfg),
        quant_multiplier(h_scale * sd * _act(cfg) * out_gain, cfg.act_width, cfg),
    )


def quantize_input(x, cfg: KpuConfig, x_scale: float | None = None):
    """The block input ``x [T, d]`` (float) as ``(x_r, x_scale)``: ``x_r`` at
    ``router_operand_width`` bits, symmetric, one scale per tensor.

    ``x_scale``, by default ``max|x| / (2**(in_width-1) - 1)``, is the scale of the ``in_width`` operand
    :func:`input_int8` makes from ``x_r``; ``x_r = round(x / x_scale * 2**e)`` with ``e =
    router_operand_width - in_width`` (half-even, the host-side conversion), so ``|x_r| <=
    (2**(in_width-1) - 1) * 2**e``. With ``e = 0`` this is :func:`quantize_tensor`.
    """
    x = np.asarray(x, dtype=np.float64)
    if x_scale is None:
        x_scale = float(np.max(np.abs(x))) / ((1 << (cfg.in_width - 1)) - 1) or 1.0
    e = cfg.router_operand_width - cfg.in_width
    lim = router_qmax(cfg)
    return np.clip(np.round(x / (x_scale / 2.0 ** e)), -lim, lim).astype(np.int64), x_scale


def input_int8(x_r, cfg: KpuConfig) -> np.ndarray:
    """The ``in_width`` operand of every GEMM but the router's:
    ``saturate(round_shift(x_r, router_operand_width - in_width), in_width)`` (``x_r`` itself
    by default)."""
    return I.saturate(I.round_shift(x_r, cfg.router_operand_width - cfg.in_width, cfg.rounding), cfg.in_width)


def quantize_router(W_r, bias, x_scale: float, cfg: KpuConfig) -> QuantRouter:
    """``W_r [E, d]`` at ``router_operand_width`` bits (``weight_scales``; ``|W_r| <=``
    :func:`router_qmax`, as ``x_r``), its requantiser from
    the input scale ``x_scale`` (of :func:`quantize_input`) to router logits, and the bias in the
    score format (:func:`golden.intops.quantize_bias`)."""
    wr, s_r = quantize_weights(W_r, cfg, router_qmax(cfg))
    x_r_scale = x_scale / 2.0 ** (cfg.router_operand_width - cfg.in_width)
    rq = quant_multiplier(x_r_scale * s_r * 2.0 ** cfg.router_logit_frac, cfg.router_logit_width, cfg)
    return QuantRouter(wr, rq, I.quantize_bias(bias, cfg))


def router_int(x_r, R: QuantRouter, cfg: KpuConfig):
    """The integer router on the block input ``x_r [T, d]``: ``(scores [T, E], idx [T, k],
    weights [T, k], loads [E])``. The GEMM accumulates in ``router_acc_width`` bits (exact:
    each extra operand bit widens the accumulator by one), then requantiser, sigmoid table and
    :func:`golden.intops.route_int`."""
    acc = I.matmul_int(x_r, R.W_r.T, cfg.router_acc_width)
    scores = I.sigmoid_q(R.rq_router(acc, cfg), cfg)
    idx, weights, loads = I.route_int(scores, R.bias, cfg)
    return scores, idx, weights, loads


def quantize_latent_moe(P: k3.LatentMoEParams, x, cfg: KpuConfig, x_scale: float | None = None):
    """Quantise a float block, calibrating activation scales on the float batch ``x [T, d]`` (the
    input's scale too, unless ``x_scale`` fixes it: :func:`quantize_input`).

    Returns ``(Q, x_r)``: the :class:`QuantLatentMoE` and the block input (:func:`quantize_input`:
    the int8 batch by default, ``router_operand_width`` bits with a wider router).
    """
    x = np.asarray(x, dtype=np.float64)
    x_r, x_scale = quantize_input(x, cfg, x_scale)
    qmax = (1 << (cfg.out_width - 1)) - 1
    wdl, s_dl = quantize_weights(P.W_down_lat, cfg)
    z = x @ P.W_down_lat.T
    z_scale = float(np.max(np.abs(z))) / qmax or 1.0
    R = quantize_router(P.W_r, P.bias, x_scale, cfg)

    idx, _, _ = k3.router(x, P.W_r, P.bias, cfg)
    experts = []
    for j in range(cfg.n_experts):
        rows = np.flatnonzero((idx == j).any(axis=1))
        zj = z[rows] if rows.size else z[:1]
        h = k3.situ_glu(zj @ P.W_gate[j].T, zj @ P.W_up[j].T, cfg)
        experts.append(quant_expert(P.W_gate[j], P.W_up[j], P.W_down[j], z_scale,
                                     float(np.max(np.abs(h))), cfg.routed_scaling, cfg))
    h_s = k3.situ_glu(x @ P.Ws_gate.T, x @ P.Ws_up.T, cfg)
    shared = quant_expert(P.Ws_gate, P.Ws_up, P.Ws_down, x_scale,
                           float(np.max(np.abs(h_s))), 1.0, cfg)
    wul, s_ul = quantize_weights(P.W_up_lat * P.norm[None, :], cfg)
    Q = QuantLatentMoE(
        x_scale=x_scale,
        W_down_lat=wdl, rq_down_lat=quant_multiplier(x_scale * s_dl / z_scale, cfg.in_width, cfg),
        W_r=R.W_r, rq_router=R.rq_router,
        bias=R.bias, experts=tuple(experts),
        W_up_lat=wul,
        rq_up_lat=quant_multiplier(2.0 ** -cfg.norm_frac * s_ul * _act(cfg), cfg.act_width, cfg),
        shared=shared,
    )
    return Q, x_r


def expert_int(a_q, E: QuantExpert, cfg: KpuConfig) -> np.ndarray:
    """One SiTU-GLU expert on int8 rows ``a_q [n, n_in]`` -> act format ``[n, n_out]``."""
    g = E.rq_gate(I.matmul_int(a_q, E.W_gate.T, cfg.acc_width), cfg)
    u = E.rq_up(I.matmul_int(a_q, E.W_up.T, cfg.acc_width), cfg)
    h8 = E.rq_h(I.situ_q(g, u, cfg), cfg)
    return E.rq_out(I.matmul_int(h8, E.W_down.T, cfg.acc_width), cfg)


def latent_moe_int(x_r, Q: QuantLatentMoE, cfg: KpuConfig) -> dict:
    """Run the integer block on its input ``x_r [T, d]`` (int8 by default; see
    :func:`quantize_input`).

    Returns a dict: ``y`` act format ``[T, d]``; ``idx``, ``weights`` ``[T, k]``; ``loads``
    ``[E]``; ``scores`` ``[T, E]``; ``z`` ``[T, l]``; ``u`` (combined) and ``n`` (normalised)
    ``[T, l]``.
    """
    x_r = np.asarray(x_r, dtype=np.int64)
    x_q = input_int8(x_r, cfg)
    acc = cfg.acc_width
    z = Q.rq_down_lat(I.matmul_int(x_q, Q.W_down_lat.T, acc), cfg)
    scores, idx, weights, loads = router_int(x_r, QuantRouter(Q.W_r, Q.rq_router, Q.bias), cfg)
    e = np.zeros(idx.shape + (cfg.d_latent,), dtype=np.int64)
    for j in np.unique(idx):
        tok, slot = np.nonzero(idx == j)  # tokens grouped per expert; unselected ones skipped
        e[tok, slot] = expert_int(z[tok], Q.experts[j], cfg)
    u = I.combine_int(e, weights, cfg)
    n = I.rmsnorm_int(u, cfg)
    y_r = Q.rq_up_lat(I.matmul_int(n, Q.W_up_lat.T, acc), cfg)
    y_s = expert_int(x_q, Q.shared, cfg)
    y = I.add_sat(y_r, y_s, cfg.act_width)
    return {"y": y, "idx": idx, "weights": weights, "loads": loads, "scores": scores,
            "z": z, "u": u, "n": n}


def block_error(y_int, y_float, cfg: KpuConfig) -> dict:
    """Error of the integer block's output (act format) against the float block's."""
    y = np.asarray(y_int, dtype=np.float64) / _act(cfg)
    ref = np.asarray(y_float, dtype=np.float64)
    cos = float(np.sum(y * ref) / (np.linalg.norm(y) * np.linalg.norm(ref) + 1e-300))
    err = np.abs(y - ref)
    return {"cosine": cos,
            "max_abs": float(err.max()),
            "max_rel": float(err.max() / (np.abs(ref).max() + 1e-300)),
            "rms_rel": float(np.sqrt(np.mean(err ** 2)) / (np.sqrt(np.mean(ref ** 2)) + 1e-300))}


class RandomBlock(NamedTuple):
    """A random LatentMoE block and batch on both paths (see :func:`random_block`)."""

    Q: QuantLatentMoE   #: the quantised block
    x_q: np.ndarray     #: the block input ``[tokens, d_model]`` (int8 by default, :func:`quantize_input`)
    y: np.ndarray       #: the float block's output ``[tokens, d_model]``
    idx: np.ndarray     #: the float router's experts ``[tokens, top_k]``


def random_block(cfg: KpuConfig, tokens: int, rng: np.random.Generator) -> RandomBlock:
    """Weights from :func:`golden.k3.init_latent_moe`, then ``x ~ N(0, 1)`` of shape
    ``[tokens, d_model]``, both drawn from ``rng`` in that order; quantised by
    :func:`quantize_latent_moe` and run through the float block."""
    if tokens < 1:
        raise ValueError(f"tokens = {tokens}: must be >= 1")
    P = k3.init_latent_moe(cfg, rng)
    x = rng.standard_normal((tokens, cfg.d_model))
    y, idx, _ = k3.latent_moe(x, P, cfg)
    Q, x_q = quantize_latent_moe(P, x, cfg)
    return RandomBlock(Q, x_q, y, idx)


def same_routing(idx_a, idx_b) -> np.ndarray:
    """Per token (bool ``[T]``): whether two ``[T, top_k]`` expert choices pick the same set."""
    return np.all(np.sort(idx_a, 1) == np.sort(idx_b, 1), axis=1)


#: Spread of the per-expert mean logit: expert j's logits are N(mu_j, 1) with mu_j evenly
#: spaced in [-SCORE_SKEW, SCORE_SKEW], so the high experts win far more than their share.
SCORE_SKEW = 1.5


def skewed_scores(cfg: KpuConfig, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """``[tokens, n_experts]`` router scores with a skewed expert popularity.

    Logits ``N(mu_j, 1)`` with ``mu_j = linspace(-SCORE_SKEW, SCORE_SKEW, n_experts)``, quantised to the
    router logit format ``Q<logit_width>.<logit_frac>`` (the act format unless the config gives
    the router its own) and passed through the fixed-point sigmoid :func:`golden.intops.sigmoid_q`:
    the scores the hardware sigmoid would produce.
    """
    mu = np.linspace(-SCORE_SKEW, SCORE_SKEW, cfg.n_experts)
    logits = rng.normal(mu[None, :], 1.0, size=(tokens, cfg.n_experts))
    lim = 1 << (cfg.router_logit_width - 1)
    x = np.clip(np.round(logits * 2.0 ** cfg.router_logit_frac), -lim, lim - 1).astype(np.int64)
    return I.sigmoid_q(x, cfg)
