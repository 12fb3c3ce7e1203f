"""Lower a K3 layer to one nano-KPU program (needs ``layer_ops``): the FFN half
(:func:`golden.layer.ffn_sublayer_int`, :func:`compile_ffn_sublayer`) and a whole layer, KDA or MLA
(:func:`golden.layer.layer_int`, :func:`compile_layer`), as programs linked into one
(:func:`nanokpu.host.link.link`), each handing its result to the next through host memory (``T *
d`` words)::

    mixer_norm: Attention Residuals of P over Bl with q_attn (none when Bl is empty) -> h,
                LOAD attn_norm; NORM h -> x; MUL x by attn_norm; STORE x       (compile_layer)
    kda | mla:  the mixer (nanokpu.host.kda.compile_kda, nanokpu.host.mla.compile_mla, x as int32
                words) -> y                                                     (compile_layer)
    mixer_add:  LOAD y; (LOAD P; ADD); STORE out, and a STORE a token into the FFN half's
                candidates V (int32 words)                                      (compile_layer)
    norm: Attention Residuals of P over Bl with q_mlp -> h      (nanokpu.host.attn_res.attn_res_steps)
          LOAD mlp_norm [d]; NORM h -> x; MUL x by mlp_norm     (rmsnorm_weight_int: the FFN's int8 input)
          (LatentMoE with a wide router: REQUANT x -> x << (router_operand_width - in_width))
          STORE x
    ffn:  the dense SiTU-GLU FFN (LOAD x; GEMM gate, GEMM up, SITU, REQUANT, GEMM down; STORE y)
          or the LatentMoE block (nanokpu.host.compiler.compile_block, its x loaded as int32 words)
    add:  LOAD P; LOAD y; ADD; STORE out

Host image: the parts' buffers, named ``"<part>.<buffer>"`` in ``symbols``: ``norm.V`` (the
candidates, token-major), ``norm.q``, ``norm.weight`` (int32: the RMSNorm's), ``norm.x``; the dense
FFN's ``ffn.w_gate``, ``ffn.w_up``, ``ffn.w_down`` (:func:`~nanokpu.isa.weight_panels`), ``ffn.rq``
(with ``weight_scales = "channel"``: the three GEMMs' per-column tables), ``ffn.y``, or the block's
buffers (:mod:`nanokpu.host.compiler`); ``add.P`` and the output ``add.out`` (int32 ``[T, d]``).
The mixer half's parts ``mixer_norm`` (as ``norm``), ``kda`` (:mod:`nanokpu.host.kda`'s buffers:
the state at ``kda.tails`` and ``kda.S``) or ``mla`` (:mod:`nanokpu.host.mla`'s: the cache at
``mla.n_kv`` and ``mla.k_r``) and ``mixer_add`` (``a``, ``P``, ``out``, ``V``). Inputs
another part stores are int32 words; those from the host (``P``, ``Bl``) int16.
"""

from __future__ import annotations

import numpy as np

from golden.block import QuantExpert, QuantLatentMoE
from golden.kda import KDAState, QuantKDA
from golden.layer import QuantLayer
from golden.mla import MLACache, QuantMLA
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
from nanokpu.host.kda import compile_kda, read_state
from nanokpu.host.link import Part, link
from nanokpu.host.mla import compile_mla, read_cache
from nanokpu.isa import Instr, Op, bus_bytes, weight_panels

__all__ = ["LAYER_IMEM_DEPTH", "compile_ffn_sublayer", "compile_layer", "layer_config", "read_mixer_state"]

#: Instruction memory a whole layer's program needs: up to 107 instructions on ``tiny`` at 8 tokens
#: (a LatentMoE layer with the wide router; the mixer_add part takes a ``STORE`` a token).
LAYER_IMEM_DEPTH = 128


def layer_config(cfg: KpuConfig) -> KpuConfig:
    """``cfg`` as built to run whole layers: the layer's ops (``layer_ops``) and an instruction
    memory of at least :data:`LAYER_IMEM_DEPTH`, its weight-scale scheme unchanged."""
    return cfg.replace(layer_ops=True, imem_depth=max(cfg.imem_depth, LAYER_IMEM_DEPTH))

#: The dense FFN's GEMMs: name -> (its Requant in QuantExpert, weight member).
_GEMMS = {"gate": ("rq_gate", "W_gate"), "up": ("rq_up", "W_up"), "down": ("rq_out", "W_down")}


def _part(name, instrs, host: HostImage, spad: SpadMap, T: int, cfg: KpuConfig) -> Part:
    check_room(spad, T, cfg)
    return Part(name, instrs + [Instr(Op.HALT)], host.image, host.symbols)


def _norm(name: str, V, q, weight, shift: int, what: str, widen: int, cfg: KpuConfig,
          v_words: bool = False) -> Part:
    """Attention Residuals of the candidates ``V [N, T, d]`` with the query ``q`` (``N = 1``: ``h =
    V[0]``, none), the weighted RMSNorm (``weight`` of the field ``Q.<what>``, ``shift``; shifted left
    by ``widen``), ``x`` stored as int32 words; ``V`` int32 words with ``v_words``."""
    N, T, d = V.shape
    weight = np.asarray(weight, dtype=np.int64)
    if weight.shape != (d,) or np.abs(weight).max() >= 1 << (cfg.mult_width - 1) or not 0 <= shift < 64:
        raise ValueError(f"Q.{what}: must be [{d}] signed mult_width = {cfg.mult_width} bits, shift in [0, 63]")
    host, spad = HostImage(bus_bytes(cfg)), SpadMap(cfg.dmem_depth)
    if N == 1:
        s_h = spad.alloc("h", T * d)
        instrs = [Instr(Op.LOAD, m=T, n=d, c=s_h, host=host.act("V", V[0], v_words),
                        width=4 if v_words else 2)]
    else:
        instrs = attn_res_steps(V, q, host, spad, cfg, v_words)
        s_h = spad.map["h"]
    h_w, h_x = host.int32("weight", weight), host.int32("x", np.zeros(T * d))
    s_w, s_x = spad.alloc("w", d), spad.alloc("x", T * d)
    instrs += [Instr(Op.LOAD, m=1, n=d, c=s_w, host=h_w, width=4),
               Instr(Op.NORM, m=T, n=d, a=s_h, c=s_x),
               Instr(Op.MUL, m=T, n=d, a=s_x, b=s_w, c=s_x, shift=shift)]
    if widen:
        instrs.append(Instr(Op.REQUANT, m=T, n=d, a=s_x, c=s_x, mult=1 << widen, width=cfg.router_operand_width))
    instrs.append(Instr(Op.STORE, m=T, n=d, a=s_x, host=h_x, width=4))
    return _part(name, instrs, host, spad, T, cfg)


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


def _add(P, cfg: KpuConfig, p_words: bool = False) -> Part:
    """``out = add_sat(P, y)``, ``y`` (int32 words in host memory) the FFN's; ``P`` int32 words with
    ``p_words``."""
    T, d = P.shape
    host, spad = HostImage(bus_bytes(cfg)), SpadMap(cfg.dmem_depth)
    h_p, h_y, h_out = host.act("P", P, p_words), host.int32("y", np.zeros(T * d)), \
        host.int32("out", np.zeros(T * d))
    s_p, s_y, s_out = (spad.alloc(name, T * d) for name in ("P", "y", "out"))
    instrs = [Instr(Op.LOAD, m=T, n=d, c=s_p, host=h_p, width=4 if p_words else 2),
              Instr(Op.LOAD, m=T, n=d, c=s_y, host=h_y, width=4),
              Instr(Op.ADD, m=T, n=d, a=s_p, b=s_y, c=s_out),
              Instr(Op.STORE, m=T, n=d, a=s_out, host=h_out, width=4)]
    return _part("add", instrs, host, spad, T, cfg)


def _ffn_parts(V, Q: QuantLayer, cfg: KpuConfig, words: bool = False) -> tuple[list, dict]:
    """The FFN half's parts ``norm``, ``ffn``, ``add`` on the candidates ``V [N, T, d]`` (``P =
    V[-1]``) and their binds; with ``words`` its inputs ``norm.V`` and ``add.P`` are int32 words."""
    T, d = V.shape[1:]
    dense = isinstance(Q.ffn, QuantExpert)
    widen = 0 if dense else cfg.router_operand_width - cfg.in_width
    if dense:
        ffn = _dense_ffn(Q.ffn, T, cfg)
    else:
        block = compile_block(Q.ffn, np.zeros((T, d), dtype=np.int64), cfg, x_words=True)
        ffn = Part("ffn", block.instrs, block.image, block.symbols)
    norm = _norm("norm", V, Q.q_mlp, Q.mlp_norm, Q.mlp_norm_shift, "mlp_norm", widen, cfg, words)
    return [norm, ffn, _add(V[-1], cfg, words)], {"ffn.x": "norm.x", "add.y": "ffn.y"}


def _program(parts, binds, T: int, cfg: KpuConfig) -> RowsProgram:
    """The linked program of ``parts``, its output at ``add.out``; ``ValueError`` when it exceeds
    the instruction memory."""
    linked = link(parts, binds, bus_bytes(cfg))
    if len(linked.instrs) > cfg.imem_depth:
        raise ValueError(f"imem_depth = {cfg.imem_depth}: the program needs {len(linked.instrs)} instructions")
    return RowsProgram(linked.instrs, linked.image, linked.symbols, T, cfg, out="add.out")


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
    parts, binds = _ffn_parts(V, Q, cfg)
    return _program(parts, binds, V.shape[1], cfg)


def _mixer_add(P, V, cfg: KpuConfig) -> Part:
    """``out = add_sat(P, a)`` (``a`` the mixer's output, int32 words in host memory; ``out = a``
    when ``P`` is None: a layer that starts a block), stored as int32 words twice: at ``out`` and
    as the last candidate of ``V [N, T, d]`` (int32 words, token-major: row ``t*N + N - 1``, a
    ``STORE`` a token), the FFN half's candidates."""
    N, T, d = V.shape
    host, spad = HostImage(bus_bytes(cfg)), SpadMap(cfg.dmem_depth)
    h_a, h_out = host.int32("a", np.zeros(T * d)), host.int32("out", np.zeros(T * d))
    h_v = host.int32("V", V.transpose(1, 0, 2))
    s_a = spad.alloc("a", T * d)
    instrs = [Instr(Op.LOAD, m=T, n=d, c=s_a, host=h_a, width=4)]
    s_out = s_a
    if P is not None:
        h_p, s_p, s_out = host.act("P", P), spad.alloc("P", T * d), spad.alloc("out", T * d)
        instrs += [Instr(Op.LOAD, m=T, n=d, c=s_p, host=h_p, width=2),
                   Instr(Op.ADD, m=T, n=d, a=s_p, b=s_a, c=s_out)]
    instrs.append(Instr(Op.STORE, m=T, n=d, a=s_out, host=h_out, width=4))
    instrs += [Instr(Op.STORE, m=1, n=d, a=s_out + t * d, host=h_v + 4 * (t * N + N - 1) * d, width=4)
               for t in range(T)]
    return _part("mixer_add", instrs, host, spad, T, cfg)


def compile_layer(L: int, P, Bl, Q: QuantLayer, cfg: KpuConfig, state: KDAState | MLACache | None = None
                  ) -> RowsProgram:
    """The program of :func:`golden.layer.layer_int` for layer ``L``: ``P [T, d]`` and ``Bl`` (list of
    ``[T, d]``) act format, the mixer's ``state`` after the previous tokens (None: none), a
    :class:`~golden.kda.KDAState` for a KDA layer, a :class:`~golden.mla.MLACache` for an MLA layer.
    Six parts linked (their symbols prefixed by the part's name)::

        mixer_norm  Attention Residuals of P over Bl with q_attn (none when Bl is empty), the
                    weighted RMSNorm (attn_norm) -> x
        kda | mla   the mixer (nanokpu.host.kda, nanokpu.host.mla) on x -> y; its state at kda.tails,
                    kda.S, or its cache at mla.n_kv, mla.k_r
        mixer_add   P + y (y alone when L starts a block) -> out, and into the FFN half's
                    candidates mixer_add.V (Bl, with P when L starts a block, then out)
        norm, ffn, add   the FFN half (compile_ffn_sublayer) on those candidates -> add.out

    A :class:`~nanokpu.host.compiler.RowsProgram` whose output (the layer's ``P``) is at
    ``add.out``; the state after the call: :func:`read_mixer_state`; ``Bl`` after the layer is ``Bl +
    [P]`` when ``L % attnres_block == 0``, else ``Bl``.

    ``ValueError`` naming the argument when ``Q`` or ``state`` is not of layer ``L``'s kinds, a shape
    or value does not fit, or the config lacks ``layer_ops``, room or instruction memory.
    """
    if not 0 <= L < cfg.n_layers:
        raise ValueError(f"L = {L}: must be in [0, n_layers = {cfg.n_layers})")
    is_mla = cfg.is_mla_layer(L)
    ffn_cls = QuantExpert if L < cfg.dense_layers else QuantLatentMoE
    for part, cls in ((Q.mixer, QuantMLA if is_mla else QuantKDA), (Q.ffn, ffn_cls)):
        if not isinstance(part, cls):
            raise ValueError(f"Q: layer {L} of profile {cfg.name!r} needs {cls.__name__}, got {type(part).__name__}")
    state_cls = MLACache if is_mla else KDAState
    if state is not None and not isinstance(state, state_cls):
        raise ValueError(f"state: layer {L} of profile {cfg.name!r} carries {state_cls.__name__}, "
                         f"got {type(state).__name__}")
    V = check_candidates(P, Bl, cfg)
    T, d = V.shape[1:]
    P = V[-1]
    starts = L % cfg.attnres_block == 0
    Bl_next = [*Bl, P] if starts else list(Bl)
    V_next = check_candidates(np.zeros((T, d), dtype=np.int64), Bl_next, cfg)
    mixer_norm = _norm("mixer_norm", V, Q.q_attn, Q.attn_norm, Q.attn_norm_shift, "attn_norm", 0, cfg)
    name, compile_mixer = ("mla", compile_mla) if is_mla else ("kda", compile_kda)
    mixer = compile_mixer(np.zeros((T, d), dtype=np.int64), Q.mixer, cfg, state, x_words=True)
    ffn_parts, ffn_binds = _ffn_parts(V_next, Q, cfg, words=True)
    parts = [mixer_norm, Part(name, mixer.instrs, mixer.image, mixer.symbols),
             _mixer_add(None if starts else P, V_next, cfg), *ffn_parts]
    binds = {f"{name}.x": "mixer_norm.x", "mixer_add.a": f"{name}.y", "norm.V": "mixer_add.V",
             "add.P": "mixer_add.out", **ffn_binds}
    return _program(parts, binds, T, cfg)


def read_mixer_state(prog: RowsProgram, host) -> KDAState | MLACache:
    """The mixer's state a run of ``prog`` (:func:`compile_layer`) left in ``host``: the KDA state
    (:func:`nanokpu.host.kda.read_state` of the part ``kda``) or the MLA cache
    (:func:`nanokpu.host.mla.read_cache` of the part ``mla``)."""
    return read_cache(prog, host, part="mla") if "mla.n_kv" in prog.symbols else read_state(prog, host, part="kda")
