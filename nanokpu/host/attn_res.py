"""Lower Attention Residuals (:func:`golden.attn_res.attn_res_int`) to a nano-KPU program.

The ``N = len(Bl) + 1`` candidates are laid out token-major, ``V [T, N, d]`` (candidate ``n`` of
token ``t`` at row ``t*N + n``), so that each step is one instruction over contiguous rows::

    LOAD V (2 bytes an element)
    NORM   V [T*N, d]                 -> K   Q<out_width>.<norm_frac>  (the GEMM's int8 A)
    GEMM   K @ q (n = 1, rq_score)    -> s   act format [T, N]
    SOFTMAX s, rows of N              -> a   weight_frac bits [T, N]
    COMBINE V [T, N, d] with a        -> h   act format [T, d]
    STORE h

It needs ``layer_ops`` (``SOFTMAX``) and ``N <= attnres_candidates``.
"""

from __future__ import annotations

import numpy as np

from golden.attn_res import QuantAttnRes
from nanokpu.config import KpuConfig
from nanokpu.host.compiler import HostImage, RowsProgram, SpadMap
from nanokpu.isa import Instr, Op, bus_bytes, weight_panels

__all__ = ["attn_res_steps", "check_candidates", "check_room", "compile_attn_res"]


def check_candidates(P, Bl, cfg: KpuConfig) -> np.ndarray:
    """``V [N, T, d]``: ``Bl``'s arrays then ``P``, checked (``ValueError`` naming the argument when a
    shape or value does not fit, or the config lacks ``layer_ops``)."""
    if not cfg.layer_ops:
        raise ValueError("cfg.layer_ops = False: Attention Residuals need SOFTMAX (layer_ops = True)")
    V = np.stack([np.asarray(v, dtype=np.int64) for v in [*Bl, P]])
    N, T, d = V.shape
    if d != cfg.d_model or T < 1:
        raise ValueError(f"P: shape {V.shape[1:]} must be [T, d_model={d}] with T >= 1, as each Bl[i]")
    if N > cfg.attnres_candidates:
        raise ValueError(f"Bl: {N} candidates with P, attnres_candidates = {cfg.attnres_candidates}")
    lo, hi = -(1 << (cfg.act_width - 1)), (1 << (cfg.act_width - 1)) - 1
    if V.min() < lo or V.max() > hi or cfg.act_width > 16:
        raise ValueError(f"P, Bl: values must fit the act format (act_width = {cfg.act_width} <= 16 bits)")
    rows = T * N
    if rows >= 1 << 16 or -(-rows // cfg.rows) * d > cfg.spad_a_depth or d > cfg.spad_b_depth // 2:
        raise ValueError(f"P: {T} tokens x {N} candidates x d_model {d}: the score GEMM exceeds the GEMM engine")
    return V


def attn_res_steps(V, Q: QuantAttnRes, host: HostImage, spad: SpadMap, cfg: KpuConfig,
                   v_words: bool = False) -> list:
    """The instructions of :func:`golden.attn_res.attn_res_int` on the candidates ``V [N, T, d]``
    (:func:`check_candidates`): ``V`` (token-major; int16, or int32 words with ``v_words``: a buffer
    another program stores, :mod:`nanokpu.host.link`) and the query's panel put in ``host``, the
    buffers ``V``, ``K``, ``s``, ``a``, ``h`` allocated in ``spad``; ``h [T, d]`` (act format) is at
    ``spad.map["h"]`` after them."""
    N, T, d = V.shape
    rows = T * N
    h_v = host.act("V", V.transpose(1, 0, 2), v_words)
    h_q = host.int8("q", weight_panels(np.asarray(Q.q)[None, :], cfg))
    s_v, s_k, s_s, s_a, s_h = (spad.alloc(name, words) for name, words in
                               (("V", rows * d), ("K", rows * d), ("s", rows), ("a", rows), ("h", T * d)))
    rq = Q.rq_score
    return [
        Instr(Op.LOAD, m=rows, n=d, c=s_v, host=h_v, width=4 if v_words else 2),
        Instr(Op.NORM, m=rows, n=d, a=s_v, c=s_k),
        Instr(Op.GEMM, m=rows, k=d, n=1, a=s_k, c=s_s, host=h_q, mult=rq.mult, shift=rq.shift, width=rq.width),
        Instr(Op.SOFTMAX, m=T, n=N, a=s_s, c=s_a),
        Instr(Op.COMBINE, m=T, k=N, n=d, a=s_v, b=s_a, c=s_h),
    ]


def check_room(spad: SpadMap, T: int, cfg: KpuConfig):
    """``ValueError`` when the buffers of ``spad`` exceed the scratchpad (``T`` tokens)."""
    if spad.top > cfg.dmem_depth:
        raise ValueError(f"P: {T} tokens need {spad.top:,} scratchpad words, dmem_depth = {cfg.dmem_depth:,}")


def compile_attn_res(P, Bl, Q: QuantAttnRes, cfg: KpuConfig) -> RowsProgram:
    """The program of :func:`golden.attn_res.attn_res_int` for ``P [T, d]`` and each ``Bl[i] [T,
    d]`` (act format): a :class:`~nanokpu.host.compiler.RowsProgram` whose output ``h`` is at the
    symbol ``h``. ``ValueError`` naming the argument when a shape or value does not fit, or
    the config lacks ``layer_ops`` or room."""
    V = check_candidates(P, Bl, cfg)
    T, d = V.shape[1:]
    host, spad = HostImage(bus_bytes(cfg)), SpadMap(cfg.dmem_depth)
    steps = attn_res_steps(V, Q, host, spad, cfg)
    h_h = host.int32("h", np.zeros(T * d))
    spad.map["end"] = spad.top
    check_room(spad, T, cfg)
    instrs = [*steps, Instr(Op.STORE, m=T, n=d, a=spad.map["h"], host=h_h, width=4), Instr(Op.HALT)]
    return RowsProgram(instrs, host.image, host.symbols, T, cfg, out="h", spad=spad.map)
