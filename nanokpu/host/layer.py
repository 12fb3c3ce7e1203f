"""Lower the FFN half of a K3 layer (:func:`golden.layer.ffn_sublayer_int`) with a dense FFN to a
nano-KPU program (needs ``layer_ops``).

One program, every intermediate in the scratchpad::

    Attention Residuals of P over Bl with q_mlp -> h      (nanokpu.host.attn_res.attn_res_steps)
    LOAD mlp_norm [d]; NORM h -> x; MUL x by mlp_norm     (rmsnorm_weight_int: the FFN's int8 input)
    (LOAD rq tables: per-channel weight scales)
    GEMM x @ W_gate^T -> g; GEMM x @ W_up^T -> u; SITU; REQUANT -> h8; GEMM h8 @ W_down^T -> f
    LOAD P; ADD P, f -> y; STORE y; HALT

Host image (byte offsets in ``symbols``): the candidates ``V`` and the query ``q`` (as
:func:`~nanokpu.host.attn_res.compile_attn_res`), ``mlp_norm`` (int32), the weights ``w_gate``,
``w_up``, ``w_down`` (:func:`~nanokpu.isa.weight_panels`), ``rq`` (with ``weight_scales =
"channel"``: the three GEMMs' per-column tables, :func:`~nanokpu.host.compiler.rq_words`), ``P``
(int16), the output ``y`` (int32 ``[T, d]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from golden.block import QuantExpert
from golden.layer import QuantLayer
from nanokpu.config import KpuConfig
from nanokpu.host.attn_res import attn_res_steps, check_candidates, check_room
from nanokpu.host.compiler import HostImage, SpadMap, check_requant, gemm_over_limit, rq_words
from nanokpu.isa import F_RQ_CHANNEL, Instr, Op, bus_bytes, weight_panels

__all__ = ["FfnProgram", "compile_ffn_sublayer"]

#: The dense FFN's GEMMs: (name, its Requant in QuantExpert, weight member).
_GEMMS = (("gate", "rq_gate", "W_gate"), ("up", "rq_up", "W_up"), ("down", "rq_out", "W_down"))


@dataclass
class FfnProgram:
    """A compiled FFN half: ``instrs``, the host ``image``, ``symbols`` (byte offsets), ``spad``
    (word address of each scratchpad buffer, ``end``), ``T`` tokens and ``cfg``."""

    instrs: list
    image: bytearray
    symbols: dict
    spad: dict
    T: int
    cfg: KpuConfig

    def outputs(self, host) -> np.ndarray:
        """The layer's output ``P [T, d]`` (act format) from a host memory after the run."""
        d = self.cfg.d_model
        buf = np.frombuffer(bytes(host), dtype="<i4")
        return buf[self.symbols["y"] // 4:][:self.T * d].astype(np.int64).reshape(self.T, d)


def compile_ffn_sublayer(P, Bl, Q: QuantLayer, cfg: KpuConfig) -> FfnProgram:
    """The program of :func:`golden.layer.ffn_sublayer_int` for ``P [T, d]`` and ``Bl`` (non-empty
    list of ``[T, d]``), act format, and a layer ``Q`` with a dense FFN (:class:`golden.block.QuantExpert`).

    ``ValueError`` naming the argument when a shape or value does not fit, ``Q.ffn`` is a LatentMoE
    block (not lowered here: :func:`~nanokpu.host.compiler.compile_block` runs it on its own input),
    or the config lacks ``layer_ops`` or room.
    """
    if not isinstance(Q.ffn, QuantExpert):
        raise ValueError(f"Q.ffn: {type(Q.ffn).__name__}; compile_ffn_sublayer lowers a dense FFN (QuantExpert)")
    if not len(Bl):
        raise ValueError("Bl: empty; the FFN half of a layer has at least one finished block")
    V = check_candidates(P, Bl, cfg)
    T, d = V.shape[1:]
    f = Q.ffn.W_gate.shape[0]
    shapes = {"gate": (d, f), "up": (d, f), "down": (f, d)}
    for name, (k, n) in shapes.items():
        why = gemm_over_limit(cfg, f"FFN {name}", T, k, n)
        if why:
            raise ValueError(f"P: {T} tokens: {why}")
    weight = np.asarray(Q.mlp_norm, dtype=np.int64)
    if weight.shape != (d,) or np.abs(weight).max() >= 1 << (cfg.mult_width - 1) or not 0 <= Q.mlp_norm_shift < 64:
        raise ValueError(f"Q.mlp_norm: must be [{d}] signed mult_width = {cfg.mult_width} bits, shift in [0, 63]")
    per_col = cfg.weight_scales == "channel"
    ex = Q.ffn
    if not per_col:
        for _, rq, _ in _GEMMS:
            check_requant(getattr(ex, rq), cfg, f"Q.ffn.{rq}")
    check_requant(ex.rq_h, cfg, "Q.ffn.rq_h")

    host, spad = HostImage(bus_bytes(cfg)), SpadMap(cfg.dmem_depth)
    instrs = attn_res_steps(V, Q.q_mlp, host, spad, cfg)
    h_w = host.int32("mlp_norm", weight)
    h_gemm = {name: host.int8(f"w_{name}", weight_panels(getattr(ex, W), cfg)) for name, _, W in _GEMMS}
    tables = {name: rq_words([getattr(ex, rq)]) for name, rq, _ in _GEMMS} if per_col else {}
    h_rq = host.int32("rq", np.concatenate(list(tables.values()))) if per_col else None
    h_p = host.put("P", V[-1].astype("<i2").tobytes())
    h_y = host.int32("y", np.zeros(T * d))
    s_h = spad.map["h"]
    s_w, s_x, s_g, s_u, s_hh, s_h8, s_f, s_p, s_y = (spad.alloc(name, words) for name, words in (
        ("w", d), ("x", T * d), ("g", T * f), ("u", T * f), ("hh", T * f), ("h8", T * f), ("f", T * d),
        ("P", T * d), ("y", T * d)))
    s_tab, at = {}, spad.alloc("rq", sum(t.size for t in tables.values()))
    for name, t in tables.items():
        s_tab[name], at = at, at + t.size
    spad.map["end"] = spad.top
    check_room(spad, T, cfg)

    def gemm(name, a, c):
        k, n = shapes[name]
        rq = getattr(ex, dict((g, r) for g, r, _ in _GEMMS)[name])
        if per_col:
            return Instr(Op.GEMM, flags=F_RQ_CHANNEL, m=T, k=k, n=n, a=a, b=s_tab[name], c=c, host=h_gemm[name],
                         width=rq.width)
        return Instr(Op.GEMM, m=T, k=k, n=n, a=a, c=c, host=h_gemm[name], mult=rq.mult, shift=rq.shift,
                     width=rq.width)

    instrs += [
        Instr(Op.LOAD, m=1, n=d, c=s_w, host=h_w, width=4),
        Instr(Op.NORM, m=T, n=d, a=s_h, c=s_x),
        Instr(Op.MUL, m=T, n=d, a=s_x, b=s_w, c=s_x, shift=Q.mlp_norm_shift),
        *([Instr(Op.LOAD, m=1, n=at - s_tab["gate"], c=s_tab["gate"], host=h_rq, width=4)] if per_col else []),
        gemm("gate", s_x, s_g),
        gemm("up", s_x, s_u),
        Instr(Op.SITU, m=T, n=f, a=s_g, b=s_u, c=s_hh),
        Instr(Op.REQUANT, m=T, n=f, a=s_hh, c=s_h8, mult=ex.rq_h.mult, shift=ex.rq_h.shift, width=ex.rq_h.width),
        gemm("down", s_h8, s_f),
        Instr(Op.LOAD, m=T, n=d, c=s_p, host=h_p, width=2),
        Instr(Op.ADD, m=T, n=d, a=s_p, b=s_f, c=s_y),
        Instr(Op.STORE, m=T, n=d, a=s_y, host=h_y, width=4),
        Instr(Op.HALT),
    ]
    if len(instrs) > cfg.imem_depth:
        raise ValueError(f"imem_depth = {cfg.imem_depth}: the program needs {len(instrs)} instructions")
    return FfnProgram(instrs, host.image, host.symbols, spad.map, T, cfg)
