"""Lower the KDA mixer (:func:`golden.kda.kda_int`) to a nano-KPU program (needs ``layer_ops``),
its carried state (the conv tails and ``S``) in host memory, so that a call's program run again on
the next tokens continues the recurrence::

    LOAD x; for c in q, k, v: LOAD its tail rows before GEMM c's result (xp_c = [tail; p_c]),
          CONV, REQUANT (per tensor or F_RQ_CHANNEL), SILU; q, k: NORM F_L2 per head
          STORE the last kda_conv - 1 rows of xp_c as the new tail
    decay: GEMM raw, ADD F_ACC (dt_bias rows), REQUANT F_RQ_CHANNEL (exp(A_log) per head), DECAY
    beta:  GEMM (logit format), SIGMOID
    LOAD S; KDA_STEP (q, k, v, decay, beta planes); STORE S
    NORM F_EPS (o's epsilon), MUL o_norm; gate: GEMM, SIGMOID, MUL (element by element, shift
    score_frac); GEMM W_o; STORE y

Host image (``symbols``): ``x`` (int8 ``[T, d]``), the weight panels ``w_q``, ``w_k``, ``w_v``,
``w_f``, ``w_b``, ``w_gate``, ``w_o``, ``conv`` (int32: the three ``[C, kda_conv]`` kernels),
``tables`` (int32: the requantiser tables, the W_f bias rows, o's epsilon word and the o_norm
weight), ``tails`` (int32 ``[3, kda_conv - 1, C]``, read and written), ``S`` (int32 ``[H, K, K]``,
read and written) and the output ``y`` (int32 ``[T, d]``).
"""

from __future__ import annotations

import numpy as np

from golden import intops as I
from golden.kda import KDAState, QuantKDA
from nanokpu.config import KpuConfig
from nanokpu.host.compiler import (
    HostImage,
    RowsProgram,
    SpadMap,
    check_requant,
    gemm_over_limit,
    load_tables,
    rq_fields,
    rq_words,
)
from nanokpu.isa import F_ACC, F_EPS, F_L2, Instr, Op, bus_bytes, weight_panels

__all__ = ["compile_kda", "read_state"]


def compile_kda(x_q, Q: QuantKDA, cfg: KpuConfig, state: KDAState | None = None,
                x_words: bool = False) -> RowsProgram:
    """The program of :func:`golden.kda.kda_int` for int8 ``x_q [T, d]`` from ``state`` (zeros when
    None): a :class:`~nanokpu.host.compiler.RowsProgram` whose output ``y`` is at the symbol ``y``;
    the state after the call is at the symbols ``tails`` and ``S`` (:func:`read_state`).
    ``x_words``: ``x`` in host memory as int32 words (a buffer another program stores,
    :mod:`nanokpu.host.link`), else int8.

    ``ValueError`` naming the argument when a shape or value does not fit, or the config lacks
    ``layer_ops``, room or instruction memory.
    """
    if not cfg.layer_ops:
        raise ValueError("cfg.layer_ops: the KDA mixer needs the layer's ops (layer_ops = True)")
    x_q = np.asarray(x_q, dtype=np.int64)
    T, d = x_q.shape
    H, K, n = cfg.n_heads, cfg.kda_head_dim, cfg.kda_conv
    C = H * K
    if d != cfg.d_model:
        raise ValueError(f"x_q: [T, {d}], must be [T, d_model = {cfg.d_model}]")
    if state is None:
        state = KDAState(np.zeros((H, K, K), dtype=np.int64), np.zeros((3, n - 1, C), dtype=np.int64))
    gemms = {"q": (Q.proj_q, d, C), "k": (Q.proj_k, d, C), "v": (Q.proj_v, d, C), "f": (Q.proj_f, d, C),
             "b": (Q.proj_b, d, H), "gate": (Q.proj_gate, d, C), "o": (Q.proj_o, C, d)}
    for name, (_, k, m_out) in gemms.items():
        why = gemm_over_limit(cfg, f"W_{name}", T, k, m_out)
        if why:
            raise ValueError(f"x_q: {T} tokens: {why}")

    host, spad = HostImage(bus_bytes(cfg)), SpadMap(cfg.dmem_depth)
    h_x = host.int32("x", x_q) if x_words else host.int8("x", x_q)
    h_w = {name: host.int8(f"w_{name}", weight_panels(p.W, cfg)) for name, (p, _, _) in gemms.items()}
    h_conv = host.int32("conv", np.concatenate([c.W.ravel() for c in (Q.conv_q, Q.conv_k, Q.conv_v)]))
    # the tables' words, in one LOAD: per-column requantiser tables, the bias rows, eps, o_norm
    tables = {name: rq_words([p.rq]) for name, (p, _, _) in gemms.items() if p.rq.per_column}
    tables |= {f"conv_{c}": rq_words([cv.rq]) for c, cv in zip("qkv", (Q.conv_q, Q.conv_k, Q.conv_v), strict=True)
               if cv.rq.per_column}
    tables |= {"bias": np.tile(Q.f_bias, T), "eps": np.array([I.rms_eps_q(cfg, Q.o_frac)]),
               "o_norm": np.asarray(Q.o_norm, dtype=np.int64)}
    h_tab = host.int32("tables", np.concatenate(list(tables.values())))
    h_tails = host.int32("tails", state.conv)
    h_S = host.int32("S", state.S)
    h_y = host.int32("y", np.zeros(T * d))

    s_x = spad.alloc("x", T * d)
    s_xp = {c: spad.alloc(f"xp_{c}", (n - 1 + T) * C) for c in "qkv"}
    s_conv = spad.alloc("conv", 3 * C * n)
    s_tab, load_tab = load_tables(tables, h_tab, spad)
    s_a = spad.alloc("a", T * C)
    s_planes = spad.alloc("planes", T * (4 * C + H))
    plane = {name: s_planes + i * T * C for i, name in enumerate(("q", "k", "v", "decay", "beta"))}
    s_f, s_S, s_o, s_y = (spad.alloc(name, words) for name, words in
                          (("f", T * C), ("S", H * K * K), ("o", T * C), ("y", T * d)))
    if spad.top > cfg.dmem_depth:
        raise ValueError(f"x_q: {T} tokens need {spad.top:,} scratchpad words, dmem_depth = {cfg.dmem_depth:,}")

    def gemm(name: str, a: int, c: int, raw: bool = False) -> Instr:
        p, k, n_out = gemms[name]
        fields = dict(width=0) if raw else rq_fields(p.rq, s_tab.get(name), cfg, f"Q.proj_{name}")
        return Instr(Op.GEMM, m=T, k=k, n=n_out, a=a, c=c, host=h_w[name], **fields)

    instrs = [Instr(Op.LOAD, m=T, n=d, c=s_x, host=h_x, width=4 if x_words else 1),
              Instr(Op.LOAD, m=1, n=3 * C * n, c=s_conv, host=h_conv, width=4),
              load_tab]
    for i, (c, conv) in enumerate(zip("qkv", (Q.conv_q, Q.conv_k, Q.conv_v), strict=True)):
        tail, p = s_xp[c], s_xp[c] + (n - 1) * C
        instrs += [Instr(Op.LOAD, m=n - 1, n=C, c=tail, host=h_tails + 4 * i * (n - 1) * C, width=4),
                   gemm(c, s_x, p),
                   Instr(Op.CONV, m=n - 1 + T, n=C, k=n, a=tail, b=s_conv + i * C * n, c=s_a),
                   Instr(Op.REQUANT, m=T, n=C, a=s_a, c=s_a,
                         **rq_fields(conv.rq, s_tab.get(f"conv_{c}"), cfg, f"Q.conv_{c}")),
                   Instr(Op.STORE, m=n - 1, n=C, a=s_xp[c] + T * C, host=h_tails + 4 * i * (n - 1) * C, width=4)]
        if c == "v":
            instrs.append(Instr(Op.SILU, m=T, n=C, a=s_a, c=plane["v"]))
        else:
            instrs += [Instr(Op.SILU, m=T, n=C, a=s_a, c=s_a),
                       Instr(Op.NORM, flags=F_L2, m=T * H, n=K, a=s_a, c=plane[c])]
    instrs += [gemm("f", s_x, s_f, raw=True),
               Instr(Op.ADD, flags=F_ACC, m=T, n=C, a=s_f, b=s_tab["bias"], c=s_f),
               Instr(Op.REQUANT, m=T, n=C, a=s_f, c=s_f, **rq_fields(Q.proj_f.rq, s_tab.get("f"), cfg, "Q.proj_f")),
               Instr(Op.DECAY, m=T, n=C, a=s_f, c=plane["decay"]),
               gemm("b", s_x, s_f),
               Instr(Op.SIGMOID, m=T, n=H, a=s_f, c=plane["beta"]),
               Instr(Op.LOAD, m=1, n=H * K * K, c=s_S, host=h_S, width=4)]
    check_requant(Q.rq_read, cfg, "Q.rq_read")
    instrs += [Instr(Op.KDA_STEP, m=T, n=H, k=K, a=s_S, b=s_planes, c=s_o, mult=Q.rq_read.mult,
                     shift=Q.rq_read.shift, width=Q.rq_read.width),
               Instr(Op.STORE, m=1, n=H * K * K, a=s_S, host=h_S, width=4),
               Instr(Op.NORM, flags=F_EPS, m=T * H, n=K, a=s_o, b=s_tab["eps"], c=s_o),
               Instr(Op.MUL, m=T * H, n=K, a=s_o, b=s_tab["o_norm"], c=s_o, shift=Q.o_norm_shift),
               gemm("gate", s_x, s_f),
               Instr(Op.SIGMOID, m=T, n=C, a=s_f, c=s_f),
               Instr(Op.MUL, m=1, n=T * C, a=s_o, b=s_f, c=s_o, shift=cfg.score_frac),
               gemm("o", s_o, s_y),
               Instr(Op.STORE, m=T, n=d, a=s_y, host=h_y, width=4),
               Instr(Op.HALT)]
    if len(instrs) > cfg.imem_depth:
        raise ValueError(f"imem_depth = {cfg.imem_depth}: the KDA mixer needs {len(instrs)} instructions")
    return RowsProgram(instrs, host.image, host.symbols, T, cfg, out="y", spad=dict(spad.map))


def read_state(prog: RowsProgram, host, part: str = "") -> KDAState:
    """The :class:`~golden.kda.KDAState` a run of ``prog`` (:func:`compile_kda`, or a linked program
    with it as the part named ``part``) left in ``host``."""
    cfg, prefix = prog.cfg, f"{part}." if part else ""
    H, K, n, C = cfg.n_heads, cfg.kda_head_dim, cfg.kda_conv, cfg.n_heads * cfg.kda_head_dim
    words = np.frombuffer(bytes(host), dtype="<i4").astype(np.int64)
    tails = words[prog.symbols[f"{prefix}tails"] // 4:][:3 * (n - 1) * C].reshape(3, n - 1, C)
    S = words[prog.symbols[f"{prefix}S"] // 4:][:H * K * K].reshape(H, K, K)
    return KDAState(S, tails)
