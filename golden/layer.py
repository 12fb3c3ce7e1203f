"""The integer K3 layer (:func:`golden.k3.layer`): the integer Attention Residuals, RMSNorms, mixer
and FFN composed as the float layer composes the float ones.

:func:`quantize_layer` turns a float layer (:class:`golden.k3.LayerParams`) and a calibration batch
(``P``, ``Bl`` in floats) into a :class:`QuantLayer`; :func:`layer_int` runs layer ``L`` with integers
only, carrying the mixer's state (:class:`golden.kda.KDAState` or :class:`golden.mla.MLACache`) so that
decode steps chain. The dataflow, with every tensor's format (``act`` = ``Q<act_width>.<act_frac>``,
``norm`` = ``Q<out_width>.<norm_frac>``)::

    P, Bl[n]  residual stream                                 act   [T, d]  (Bl[0] the embedding)
    h  = attn_res_int(P, Bl, q_attn) if Bl else P              act
    if L % attnres_block == 0: Bl.append(P); P = None          (the finished block's sum, kept in act)
    x  = rmsnorm_weight_int(h, attn_norm)                      norm: the mixer's int8 input, x_scale 2**-norm_frac
    a, state = kda_int(x, state) or mla_int(x, cache)          act  (mixer by the layer index, as k3)
    P  = a if P is None else add_sat(P, a, act_width)          act
    h  = rmsnorm_weight_int(attn_res_int(P, Bl, q_mlp), mlp_norm)   norm: the FFN's int8 input
    m  = expert_int(h)            (dense SiTU-GLU FFN, L < dense_layers)                 act
       | latent_moe_int(h << (router_operand_width - in_width))["y"]   (LatentMoE)       act
    P  = add_sat(P, m, act_width)                              act

So the residual stream (``P`` and every block representative) has one format, the act format, with
saturating adds; the only conversions are the two RMSNorms, whose ``norm``-format outputs are the
mixer's and the FFN's GEMM operands as they are: each is quantised with the input scale
``2**-norm_frac`` (no requantiser between the norm and the first GEMM). The LatentMoE router takes
the same values widened to ``router_operand_width`` bits by a left shift (exact; a wider router
operand gets no extra precision here). Every op is per token except the mixer, so one call on ``T``
tokens equals any split into consecutive calls with the state carried.

Calibration: :func:`quantize_layer` runs :func:`golden.k3.layer_trace` on the float batch and
calibrates each part on its float input there (the mixer's ``o_frac`` or ``q``/``k``/``v`` scales,
the FFN's ``h`` and latent scales); the norm weights are signed ``mult_width`` bits
(:func:`golden.intops.quantize_norm_weight`), the Attention Residuals queries int8
(:func:`golden.attn_res.quantize_attn_res`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from golden import attn_res, block, k3, kda, mla
from golden import intops as I
from nanokpu.config import KpuConfig

__all__ = ["QuantLayer", "quantize_act", "quantize_dense_ffn", "quantize_layer", "layer_int", "ffn_sublayer_int",
           "random_ffn_case", "random_layer_case"]


@dataclass(frozen=True)
class QuantLayer:
    """A quantised layer (see the module docstring for the dataflow)."""

    attn_norm: np.ndarray             # [d] mixer pre-norm weight, worth attn_norm / 2**attn_norm_shift
    attn_norm_shift: int
    mlp_norm: np.ndarray              # [d] FFN pre-norm weight, worth mlp_norm / 2**mlp_norm_shift
    mlp_norm_shift: int
    q_attn: attn_res.QuantAttnRes     # the mixer sublayer's Attention Residuals query
    q_mlp: attn_res.QuantAttnRes      # the FFN sublayer's
    mixer: kda.QuantKDA | mla.QuantMLA
    ffn: block.QuantExpert | block.QuantLatentMoE


def quantize_act(x, cfg: KpuConfig) -> np.ndarray:
    """Floats ``x`` in the act format: ``saturate(round(x 2**act_frac), act_width)`` (half-even, the
    host-side conversion), int64."""
    x = np.asarray(x, dtype=np.float64)
    return I.saturate(np.round(x * 2.0 ** cfg.act_frac).astype(np.int64), cfg.act_width)


def quantize_dense_ffn(p: k3.DenseFFNParams, x, x_scale: float, cfg: KpuConfig) -> block.QuantExpert:
    """The dense SiTU-GLU FFN (:func:`golden.k3.dense_ffn`) as one expert (:func:`golden.block.quant_expert`)
    on int8 inputs of scale ``x_scale``, ``h`` calibrated on the float batch ``x [T, d]``; run it with
    :func:`golden.block.expert_int` (act-format output)."""
    p.check(cfg)
    x = np.asarray(x, dtype=np.float64)
    h = k3.situ_glu(x @ p.W_gate.T, x @ p.W_up.T, cfg)
    return block.quant_expert(p.W_gate, p.W_up, p.W_down, x_scale, float(np.max(np.abs(h))), 1.0, cfg)


def _kinds(L: int, cfg: KpuConfig) -> tuple[bool, bool]:
    """``(MLA mixer, dense FFN)`` of layer ``L``, by :func:`golden.k3._layer_parts`."""
    (mixer_cls, _), (ffn_cls, _) = k3._layer_parts(L, cfg)
    return mixer_cls is k3.MLAParams, ffn_cls is k3.DenseFFNParams


def quantize_layer(L: int, params: k3.LayerParams, P, Bl, cfg: KpuConfig):
    """Quantise float layer ``L``, calibrating on the float batch ``P [T, d]``, ``Bl`` (list of ``[T, d]``).

    Returns ``(Q, P_q, Bl_q)``: the :class:`QuantLayer` and the batch in the act format
    (:func:`quantize_act`). ValueError when ``params`` are not of layer ``L``'s kinds.
    """
    trace = k3.layer_trace(L, P, Bl, params, cfg)
    is_mla, dense = _kinds(L, cfg)
    x_scale = 2.0 ** -cfg.norm_frac
    quantize_mixer = mla.quantize_mla if is_mla else kda.quantize_kda
    if dense:
        ffn = quantize_dense_ffn(params.ffn, trace["ffn_in"], x_scale, cfg)
    else:
        ffn, _ = block.quantize_latent_moe(params.ffn, trace["ffn_in"], cfg, x_scale)
    Q = QuantLayer(
        *I.quantize_norm_weight(params.attn_norm, cfg), *I.quantize_norm_weight(params.mlp_norm, cfg),
        q_attn=attn_res.quantize_attn_res(params.q_attn, cfg), q_mlp=attn_res.quantize_attn_res(params.q_mlp, cfg),
        mixer=quantize_mixer(params.mixer, trace["mixer_in"], cfg, x_scale)[0], ffn=ffn)
    return Q, quantize_act(P, cfg), [quantize_act(b, cfg) for b in Bl]


def layer_int(L: int, P, Bl, Q: QuantLayer, cfg: KpuConfig, state=None):
    """Layer ``L`` (0-based) in integers: ``P [T, d]`` and ``Bl`` (list of ``[T, d]``, not modified) in
    the act format, integer arrays (floats raise TypeError); ``state`` the mixer's after the previous
    tokens (``None``: none), a :class:`golden.kda.KDAState` for a KDA layer, a
    :class:`golden.mla.MLACache` for an MLA layer.

    Returns ``(P, Bl, state)``: ``P [T, d]`` act format, ``Bl`` a new list (``P`` appended when ``L``
    starts a block), and the mixer's state after the last token. ValueError when ``Q`` is not of layer
    ``L``'s kinds.
    """
    is_mla, dense = _kinds(L, cfg)
    for part, cls in ((Q.mixer, mla.QuantMLA if is_mla else kda.QuantKDA),
                      (Q.ffn, block.QuantExpert if dense else block.QuantLatentMoE)):
        if not isinstance(part, cls):
            raise ValueError(f"layer {L} of profile {cfg.name!r} needs {cls.__name__}, got {type(part).__name__}")
    if any(np.asarray(v).dtype.kind not in "iu" for v in [P, *Bl]):
        raise TypeError("layer_int takes P and Bl in the act format (integer arrays), not floats")
    Bl = list(Bl)
    h = attn_res.attn_res_int(P, Bl, Q.q_attn, cfg) if Bl else P
    if L % cfg.attnres_block == 0:
        Bl.append(P)
        P = None
    mixer_int = mla.mla_int if is_mla else kda.kda_int
    a, state = mixer_int(I.rmsnorm_weight_int(h, Q.attn_norm, Q.attn_norm_shift, cfg), Q.mixer, cfg, state)
    P = a if P is None else I.add_sat(P, a, cfg.act_width)
    return ffn_sublayer_int(P, Bl, Q, cfg), Bl, state


def ffn_sublayer_int(P, Bl, Q: QuantLayer, cfg: KpuConfig) -> np.ndarray:
    """The FFN half of a layer (the last three lines of the dataflow): ``P [T, d]`` (after the
    mixer) and ``Bl`` (non-empty) act format -> ``P + ffn(rmsnorm_weight(attn_res(P, Bl, q_mlp),
    mlp_norm))`` ``[T, d]`` act format, the FFN dense or LatentMoE by the type of ``Q.ffn``."""
    h = I.rmsnorm_weight_int(attn_res.attn_res_int(P, Bl, Q.q_mlp, cfg), Q.mlp_norm, Q.mlp_norm_shift, cfg)
    if isinstance(Q.ffn, block.QuantExpert):
        m = block.expert_int(h, Q.ffn, cfg)
    else:
        m = block.latent_moe_int(h << (cfg.router_operand_width - cfg.in_width), Q.ffn, cfg)["y"]
    return I.add_sat(P, m, cfg.act_width)


def random_ffn_case(cfg: KpuConfig, L: int, tokens: int, n_blocks: int, rng: np.random.Generator):
    """``(Q, P, Bl)`` for :func:`ffn_sublayer_int`: layer ``L`` of ``cfg`` (:func:`golden.k3.init_layer`;
    dense FFN for ``L < dense_layers``) quantised on N(0, 1) inputs, its ``mlp_norm`` replaced by
    N(0, 1) weights (both signs); act-format ``P [tokens, d]`` and ``n_blocks`` arrays ``Bl`` of N(0, 1)
    values, ``P``'s first token at the act format's ends (alternately)."""
    calib = rng.standard_normal((-(-L // cfg.attnres_block) + 1, tokens, cfg.d_model))
    Q, _, _ = quantize_layer(L, k3.init_layer(L, cfg, rng), calib[-1], list(calib[:-1]), cfg)
    w, shift = I.quantize_norm_weight(rng.standard_normal(cfg.d_model), cfg)
    Q = replace(Q, mlp_norm=w, mlp_norm_shift=shift)
    V = quantize_act(rng.standard_normal((n_blocks + 1, tokens, cfg.d_model)), cfg)
    V[-1, 0, ::2] = -(1 << (cfg.act_width - 1))
    V[-1, 0, 1::2] = (1 << (cfg.act_width - 1)) - 1
    return Q, V[-1], list(V[:-1])


def random_layer_case(cfg: KpuConfig, L: int, tokens: int, rng: np.random.Generator):
    """``(Q, P, Bl, state, params)`` for :func:`layer_int`: layer ``L`` of ``cfg`` (its float
    parameters ``params``, :func:`golden.k3.init_layer`) quantised on N(0, 1) inputs; act-format
    ``P [tokens, d]`` and ``Bl`` (the blocks finished before ``L``) of N(0, 1) values, ``P``'s first
    token at the act format's ends (alternately); for a KDA layer a random
    :func:`golden.kda.random_state`, for an MLA layer None."""
    V = quantize_act(rng.standard_normal((-(-L // cfg.attnres_block) + 1, tokens, cfg.d_model)), cfg)
    act = 2.0 ** -cfg.act_frac
    params = k3.init_layer(L, cfg, rng)
    Q, _, _ = quantize_layer(L, params, V[-1] * act, [b * act for b in V[:-1]], cfg)
    V[-1, 0, ::2], V[-1, 0, 1::2] = -(1 << (cfg.act_width - 1)), (1 << (cfg.act_width - 1)) - 1
    state = kda.random_state(cfg, rng) if isinstance(Q.mixer, kda.QuantKDA) else None
    return Q, V[-1], list(V[:-1]), state, params
