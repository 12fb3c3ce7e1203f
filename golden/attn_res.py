"""The integer Attention Residuals of a K3 layer (:func:`golden.k3.attn_res`), op by op in
:mod:`golden.intops`.

:func:`quantize_attn_res` turns a sublayer's float query ``q [d]`` into an int8 query and the
requantiser of its scores (:class:`QuantAttnRes`); :func:`attn_res_int` runs Attention Residuals
with integers only. The ``N = len(Bl) + 1`` candidates ``V = Bl + [P]`` are the residual stream in
the act format; the dataflow, with every tensor's format::

    V_n = Bl[n] or P                 act format  Q<act_width>.<act_frac>       [N, T, d]
    K_n = rmsnorm_int(V_n)           Q<out_width>.<norm_frac>                  [N, T, d]
    s_n = rq_score(K_n @ q)          act format (acc_width-bit accumulator)    [N, T]
    a   = softmax_int(s) over n      unsigned, weight_frac                     [N, T]
    h   = combine_int(V, a)          act format, one rounding of sum_n a_n V_n [T, d]

The query is symmetric int8 with one scale ``q_scale`` (zero point 0); ``rq_score`` is the
:class:`~golden.block.Requant` of the scale ``2**-norm_frac * q_scale * 2**act_frac``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from golden import block
from golden import intops as I
from nanokpu.config import KpuConfig

__all__ = ["QuantAttnRes", "quantize_attn_res", "attn_res_weights_int", "attn_res_int"]


@dataclass(frozen=True)
class QuantAttnRes:
    """A sublayer's Attention Residuals query in integers: ``q [d]`` int8 and the requantiser
    of the scores ``K_n . q`` to the act format."""

    q: np.ndarray
    rq_score: block.Requant


def quantize_attn_res(q, cfg: KpuConfig) -> QuantAttnRes:
    """The learned query ``q [d]`` (float) at ``in_width`` bits, one scale, and its score requantiser."""
    q_q, q_scale = block.quantize_tensor(q, cfg.in_width)
    scale = 2.0 ** -cfg.norm_frac * q_scale * 2.0 ** cfg.act_frac
    return QuantAttnRes(q_q, block.quant_multiplier(scale, cfg.act_width, cfg))


def _candidates(P, Bl) -> np.ndarray:
    return np.stack([np.asarray(v, dtype=np.int64) for v in [*Bl, P]])


def attn_res_weights_int(P, Bl, Q: QuantAttnRes, cfg: KpuConfig) -> np.ndarray:
    """Softmax weights over depth, unsigned ``weight_frac`` bits ``[N, T]`` (as
    :func:`golden.k3.attn_res_weights`): ``P [T, d]`` and each ``Bl[i] [T, d]`` in the act format.

    Keys by :func:`golden.intops.rmsnorm_int` (no weight, ``rms_eps``), scores by one GEMM
    column and ``Q.rq_score``, weights by :func:`golden.intops.softmax_int` per token.
    """
    V = _candidates(P, Bl)
    n_cand, tokens, d = V.shape
    K = I.rmsnorm_int(V, cfg).reshape(n_cand * tokens, d)
    s = Q.rq_score(I.matmul_int(K, Q.q[:, None], cfg.acc_width), cfg).reshape(n_cand, tokens)
    return I.softmax_int(s.T, cfg).T


def attn_res_int(P, Bl, Q: QuantAttnRes, cfg: KpuConfig) -> np.ndarray:
    """Attention Residuals (block form) in integers: ``h [T, d]`` in the act format, ``h =
    saturate(round_shift(sum_n a_n V_n, weight_frac), act_width)`` over the raw candidates
    ``V = Bl + [P]`` (act format) with the weights ``a`` of :func:`attn_res_weights_int`
    (:func:`golden.intops.combine_int`). One candidate gives ``h = P`` exactly.
    """
    a = attn_res_weights_int(P, Bl, Q, cfg)
    return I.combine_int(_candidates(P, Bl).transpose(1, 0, 2), a.T, cfg)
