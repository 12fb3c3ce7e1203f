"""Lower the FFN half of a K3 layer (:func:`golden.layer.ffn_sublayer_int`) to a nano-KPU program
(needs ``layer_ops``): three programs linked into one (:func:`nanokpu.host.link.link`), each
handing its result to the next through host memory (``T * d`` words)::

    norm: Attention Residuals of P over Bl with q_mlp -> h      (nanokpu.host.attn_res.attn_res_steps)
          LOAD mlp_norm [d]; NORM h -> x; MUL x by mlp_norm     (rmsnorm_weight_int: the FFN's int8 input)
          (LatentMoE with a wide router: REQUANT x -> x << (router_operand_width - in_width))
          STORE x
    ffn:  the dense SiTU-GLU FFN (LOAD x; GEMM gate, GEMM up, SITU, REQUANT, GEMM down; STORE y)
          or the LatentMoE block (nanokpu.host.compiler.compile_block, its x loaded as int32 words)
    add:  LOAD P; LOAD y; ADD; STORE out

Host image: the parts' buffers, named ``"<part>.<buffer>"`` in ``symbols``: ``norm.V``,
``norm.q``, ``norm.mlp_norm`` (int32), ``norm.x``; the dense FFN's ``ffn.w_gate``, ``ffn.w_up``,
``ffn.w_down`` (:func:`~nanokpu.isa.weight_panels`), ``ffn.rq`` (with ``weight_scales =
"channel"``: the three GEMMs' per-column tables), ``ffn.y``, or the block's buffers
(:mod:`nanokpu.host.compiler`); ``add.P`` (int16) and the output ``add.out`` (int32 ``[T, d]``).
"""

from __future__ import annotations

import numpy as np

from golden.block import QuantExpert
from golden.layer import QuantLayer
from nanokpu.config import KpuConfig
from nanokpu.host.attn_res import attn_res_steps, check_candidates, check_room
from nanokpu.host.compiler import (
    HostImage,
    RowsProgram,
    SpadMap,
    compile_block,
    gemm_over_limit,
    glu_steps,
    rq_words,
)
from nanokpu.host.link import Part, link
from nanokpu.isa import Instr, Op, bus_bytes, weight_panels

__all__ = ["compile_ffn_sublayer"]

#: The dense FFN's GEMMs: name -> (its Requant in QuantExpert, weight member).
_GEMMS = {"gate": ("rq_gate", "W_gate"), "up": ("rq_up", "W_up"), "down": ("rq_out", "W_down")}


def _part(name, instrs, host: HostImage, spad: SpadMap, T: int, cfg: KpuConfig) -> Part:
    check_room(spad, T, cfg)
    return Part(name, instrs + [Instr(Op.HALT)], host.image, host.symbols)


def _norm(V, Q: QuantLayer, widen: int, cfg: KpuConfig) -> Part:
    """Attention Residuals, the weighted RMSNorm (shifted left by ``widen``), ``x`` stored."""
    T, d = V.shape[1:]
    weight = np.asarray(Q.mlp_norm, dtype=np.int64)
    if weight.shape != (d,) or np.abs(weight).max() >= 1 << (cfg.mult_width - 1) or not 0 <= Q.mlp_norm_shift < 64:
        raise ValueError(f"Q.mlp_norm: must be [{d}] signed mult_width = {cfg.mult_width} bits, shift in [0, 63]")
    host, spad = HostImage(bus_bytes(cfg)), SpadMap(cfg.dmem_depth)
    instrs = attn_res_steps(V, Q.q_mlp, host, spad, cfg)
    h_w, h_x = host.int32("mlp_norm", weight), host.int32("x", np.zeros(T * d))
    s_h, s_w, s_x = spad.map["h"], spad.alloc("w", d), spad.alloc("x", T * d)
    instrs += [Instr(Op.LOAD, m=1, n=d, c=s_w, host=h_w, width=4),
               Instr(Op.NORM, m=T, n=d, a=s_h, c=s_x),
               Instr(Op.MUL, m=T, n=d, a=s_x, b=s_w, c=s_x, shift=Q.mlp_norm_shift)]
    if widen:
        instrs.append(Instr(Op.REQUANT, m=T, n=d, a=s_x, c=s_x, mult=1 << widen, width=cfg.router_operand_width))
    instrs.append(Instr(Op.STORE, m=T, n=d, a=s_x, host=h_x, width=4))
    return _part("norm", instrs, host, spad, T, cfg)


def _dense_ffn(ex: QuantExpert, T: int, cfg: KpuConfig) -> Part:
    """The SiTU-GLU FFN on ``x`` (int32 words in host memory) -> ``y`` (act format)."""
    d, f = cfg.d_model, ex.W_gate.shape[0]
    shapes = {"gate": (d, f), "up": (d, f), "down": (f, d)}
    for name, (k, n) in shapes.items():
        why = gemm_over_limit(cfg, f"FFN {name}", T, k, n)
        if why:
            raise ValueError(f"P: {T} tokens: {why}")
    per_col = cfg.weight_scales == "channel"
    host, spad = HostImage(bus_bytes(cfg)), SpadMap(cfg.dmem_depth)
    h_x = host.int32("x", np.zeros(T * d))
    h_w = {name: host.int8(f"w_{name}", weight_panels(getattr(ex, W), cfg)) for name, (_, W) in _GEMMS.items()}
    tables = {name: rq_words([getattr(ex, rq)]) for name, (rq, _) in _GEMMS.items()} if per_col else {}
    h_rq = host.int32("rq", np.concatenate(list(tables.values()))) if per_col else 0
    h_y = host.int32("y", np.zeros(T * d))
    s_x, s_g, s_u, s_h, s_h8, s_y = (spad.alloc(name, words) for name, words in (
        ("x", T * d), ("g", T * f), ("u", T * f), ("h", T * f), ("h8", T * f), ("y", T * d)))
    s_tab, at = {}, spad.alloc("rq", sum(t.size for t in tables.values()))
    for name, t in tables.items():
        s_tab[name], at = at, at + t.size

    instrs = [
        Instr(Op.LOAD, m=T, n=d, c=s_x, host=h_x, width=4),
        *([Instr(Op.LOAD, m=1, n=at - s_tab["gate"], c=s_tab["gate"], host=h_rq, width=4)] if per_col else []),
        *glu_steps(ex, T, s_x, (s_g, s_u, s_h, s_h8), s_y, tuple(h_w.values()),
                   tuple(s_tab.values()) if per_col else None, cfg),
        Instr(Op.STORE, m=T, n=d, a=s_y, host=h_y, width=4),
    ]
    return _part("ffn", instrs, host, spad, T, cfg)


def _add(P, cfg: KpuConfig) -> Part:
    """``out = add_sat(P, y)``, ``y`` (int32 words in host memory) the FFN's."""
    T, d = P.shape
    host, spad = HostImage(bus_bytes(cfg)), SpadMap(cfg.dmem_depth)
    h_p, h_y, h_out = host.put("P", P.astype("<i2").tobytes()), host.int32("y", np.zeros(T * d)), \
        host.int32("out", np.zeros(T * d))
    s_p, s_y, s_out = (spad.alloc(name, T * d) for name in ("P", "y", "out"))
    instrs = [Instr(Op.LOAD, m=T, n=d, c=s_p, host=h_p, width=2),
              Instr(Op.LOAD, m=T, n=d, c=s_y, host=h_y, width=4),
              Instr(Op.ADD, m=T, n=d, a=s_p, b=s_y, c=s_out),
              Instr(Op.STORE, m=T, n=d, a=s_out, host=h_out, width=4)]
    return _part("add", instrs, host, spad, T, cfg)


def compile_ffn_sublayer(P, Bl, Q: QuantLayer, cfg: KpuConfig) -> RowsProgram:
    """The program of :func:`golden.layer.ffn_sublayer_int` for ``P [T, d]`` and ``Bl`` (non-empty
    list of ``[T, d]``), act format, and a layer ``Q`` with a dense FFN
    (:class:`golden.block.QuantExpert`) or a LatentMoE block: a
    :class:`~nanokpu.host.compiler.RowsProgram` whose output is at the symbol ``add.out``.

    ``ValueError`` naming the argument when a shape or value does not fit, or the config lacks
    ``layer_ops``, room or instruction memory.
    """
    if not len(Bl):
        raise ValueError("Bl: empty; the FFN half of a layer has at least one finished block")
    V = check_candidates(P, Bl, cfg)
    T, d = V.shape[1:]
    dense = isinstance(Q.ffn, QuantExpert)
    widen = 0 if dense else cfg.router_operand_width - cfg.in_width
    if dense:
        ffn = _dense_ffn(Q.ffn, T, cfg)
    else:
        block = compile_block(Q.ffn, np.zeros((T, d), dtype=np.int64), cfg, x_words=True)
        ffn = Part("ffn", block.instrs, block.image, block.symbols)
    linked = link([_norm(V, Q, widen, cfg), ffn, _add(V[-1], cfg)], {"ffn.x": "norm.x", "add.y": "ffn.y"},
                  bus_bytes(cfg))
    if len(linked.instrs) > cfg.imem_depth:
        raise ValueError(f"imem_depth = {cfg.imem_depth}: the program needs {len(linked.instrs)} instructions")
    return RowsProgram(linked.instrs, linked.image, linked.symbols, T, cfg, out="add.out")
