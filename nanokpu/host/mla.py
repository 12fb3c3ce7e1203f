"""Lower MLA (:func:`golden.mla.mla_int`) to a nano-KPU program (needs ``layer_ops``), its latent KV
cache in host memory, so that the program of the next call, compiled with the cache this one left
(:func:`read_cache`), continues the sequence::

    LOAD x; LOAD the tables; q_a: GEMM W_qa (rq_qa), NORM, MUL q_norm
    c_kv: GEMM W_kva[:kv_lora_rank] (rq_ckv), NORM, MUL kv_norm -> the cache rows S0.. of n_kv
    k_r:  GEMM W_kva[kv_lora_rank:] (rq_kr) -> the cache rows S0.. of k_r
    LOAD the S0 cached rows of n_kv and k_r in front; STORE the T new rows to the cache
    per head h:
        q_nope, q_rope: GEMM W_qb's rows of the head (rq_qb's columns)         [T, dn], [T, dr]
        k_n, v:         GEMM n_kv by W_kvb's rows of the head (rq_kvb's)        [S, dn], [S, dv]
        score = REQUANT rq_score (GEMM F_B_SPAD q_nope k_n^T + GEMM F_B_SPAD q_rope k_r^T, ADD F_ACC)
        g:              GEMM W_g's rows of the head (rq_g), SIGMOID             [T, dv]
        og = ATTEND(score, g, v)                                                 [T, dv] int8
        y_acc (+)= GEMM og by W_o's columns of the head (raw, ADD F_ACC)         [T, d]
    REQUANT rq_o (per tensor or F_RQ_CHANNEL); STORE y

Splitting the score's dot product (``dn + dr`` terms) and ``W_o``'s (``H dv``) into raw partial
sums is exact while no partial sum wraps: :func:`compile_mla` checks ``terms * 2**(2 in_width - 2)
< 2**(acc_width - 1)`` for both.

Host image (``symbols``): ``x`` (int8 ``[T, d]``, or int32 words), the weight panels ``w_qa``,
``w_ckv``, ``w_kr``, ``w_g``, per head ``w_qn<h>``, ``w_qr<h>``, ``w_kn<h>``, ``w_v<h>``,
``w_o<h>``; ``tables`` (int32: the per-column requantiser tables, the two norm weights), the cache
``n_kv`` (int32 ``[S, kv_lora_rank]``) and ``k_r`` (int32 ``[S, qk_rope_dim]``), ``S = S0 + T``,
the first ``S0`` rows the cache given, the rest written by the program; the output ``y`` (int32
``[T, d]``).
"""

from __future__ import annotations

import numpy as np

from golden.block import Requant
from golden.mla import MLACache, QuantMLA
from nanokpu.config import KpuConfig
from nanokpu.host.compiler import HostImage, RowsProgram, SpadMap, gemm_over_limit, load_tables, rq_fields, rq_words
from nanokpu.isa import F_ACC, F_B_SPAD, Instr, Op, bus_bytes, weight_panels

__all__ = ["compile_mla", "read_cache"]


def _cols(rq: Requant, lo: int, hi: int) -> Requant:
    """The requantiser of output columns ``lo:hi`` (the same one when it is per tensor)."""
    return Requant(rq.mult[lo:hi], rq.shift[lo:hi], rq.width) if rq.per_column else rq


def compile_mla(x_q, Q: QuantMLA, cfg: KpuConfig, cache: MLACache | None = None,
                x_words: bool = False) -> RowsProgram:
    """The program of :func:`golden.mla.mla_int` for int8 ``x_q [T, d]`` after the tokens of
    ``cache`` (none when None): a :class:`~nanokpu.host.compiler.RowsProgram` whose output ``y`` is
    at the symbol ``y``; the cache after the call (``S0 + T`` rows) at ``n_kv`` and ``k_r``
    (:func:`read_cache`). ``x_words``: ``x`` in host memory as int32 words (a buffer another program
    stores, :mod:`nanokpu.host.link`), else int8.

    ``ValueError`` naming the argument when a shape or value does not fit (a partial sum that could
    wrap, more keys than :attr:`~nanokpu.config.KpuConfig.mla_max_tokens`, a GEMM beyond the
    engine), or the config lacks ``layer_ops``, room or instruction memory.
    """
    if not cfg.layer_ops:
        raise ValueError("cfg.layer_ops: MLA needs the layer's ops (layer_ops = True)")
    x_q = np.asarray(x_q, dtype=np.int64)
    T, d = x_q.shape
    H, dn, dr, dv = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
    rq_rank, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
    if d != cfg.d_model:
        raise ValueError(f"x_q: [T, {d}], must be [T, d_model = {cfg.d_model}]")
    if cache is None:
        cache = MLACache(np.zeros((0, rkv), dtype=np.int64), np.zeros((0, dr), dtype=np.int64))
    S0 = len(cache.n_kv)
    if np.shape(cache.n_kv) != (S0, rkv) or np.shape(cache.k_r) != (S0, dr):
        raise ValueError(f"cache: n_kv {np.shape(cache.n_kv)} and k_r {np.shape(cache.k_r)} must be "
                         f"[S0, kv_lora_rank = {rkv}] and [S0, qk_rope_dim = {dr}]")
    S = S0 + T
    if S > cfg.mla_max_tokens:
        raise ValueError(f"cache: {S0} tokens + {T} new exceed mla_max_tokens = {cfg.mla_max_tokens}")
    for what, terms in (("the score's q . k", dn + dr), ("W_o's og . w", H * dv)):
        if terms << (2 * cfg.in_width - 2) >= 1 << (cfg.acc_width - 1):
            raise ValueError(f"acc_width = {cfg.acc_width}: {what} of {terms} terms could wrap as partial sums")
    # name -> (weight rows, its requantiser (None: raw), A rows, inner dim)
    qb, kvb = dn + dr, dn + dv
    gemms = {"qa": (Q.W_qa, Q.rq_qa, T, d), "ckv": (Q.W_kva[:rkv], Q.rq_ckv, T, d),
             "kr": (Q.W_kva[rkv:], Q.rq_kr, T, d)}
    for h in range(H):
        gemms |= {f"qn{h}": (Q.W_qb[h * qb:h * qb + dn], _cols(Q.rq_qb, h * qb, h * qb + dn), T, rq_rank),
                  f"qr{h}": (Q.W_qb[h * qb + dn:(h + 1) * qb], _cols(Q.rq_qb, h * qb + dn, (h + 1) * qb), T, rq_rank),
                  f"kn{h}": (Q.W_kvb[h * kvb:h * kvb + dn], _cols(Q.rq_kvb, h * kvb, h * kvb + dn), S, rkv),
                  f"v{h}": (Q.W_kvb[h * kvb + dn:(h + 1) * kvb], _cols(Q.rq_kvb, h * kvb + dn, (h + 1) * kvb), S, rkv),
                  f"g{h}": (Q.W_g[h * dv:(h + 1) * dv], _cols(Q.rq_g, h * dv, (h + 1) * dv), T, d),
                  f"o{h}": (Q.W_o[:, h * dv:(h + 1) * dv], None, T, dv)}
    for name, (W, _, m, k) in gemms.items():
        why = gemm_over_limit(cfg, f"W_{name}", m, k, len(W))
        if why:
            raise ValueError(f"x_q: {T} tokens after {S0} cached: {why}")
    for name, (m, k, n) in (("q_nope k_n^T", (T, dn, S)), ("q_rope k_r^T", (T, dr, S))):
        why = gemm_over_limit(cfg, name, m, k, n)
        if why:
            raise ValueError(f"x_q: {T} tokens after {S0} cached: {why}")

    host, spad = HostImage(bus_bytes(cfg)), SpadMap(cfg.dmem_depth)
    h_x = host.int32("x", x_q) if x_words else host.int8("x", x_q)
    h_w = {name: host.int8(f"w_{name}", weight_panels(W, cfg)) for name, (W, *_) in gemms.items()}
    tables = {name: rq_words([rq]) for name, (_, rq, _, _) in gemms.items() if rq is not None and rq.per_column}
    tables |= {"o": rq_words([Q.rq_o])} if Q.rq_o.per_column else {}
    tables |= {"q_norm": np.asarray(Q.q_norm, dtype=np.int64), "kv_norm": np.asarray(Q.kv_norm, dtype=np.int64)}
    h_tab = host.int32("tables", np.concatenate(list(tables.values())))
    h_nkv = host.int32("n_kv", np.concatenate([cache.n_kv, np.zeros((T, rkv), dtype=np.int64)]))
    h_kr = host.int32("k_r", np.concatenate([cache.k_r, np.zeros((T, dr), dtype=np.int64)]))
    h_y = host.int32("y", np.zeros(T * d))

    s_x = spad.alloc("x", T * d)
    s_tab, load_tab = load_tables(tables, h_tab, spad)
    s_qa, s_ckv = spad.alloc("q_a", T * rq_rank), spad.alloc("c_kv", T * rkv)
    s_nkv, s_kr = spad.alloc("n_kv", S * rkv), spad.alloc("k_r", S * dr)
    s_qn, s_qr, s_kn = spad.alloc("q_nope", T * dn), spad.alloc("q_rope", T * dr), spad.alloc("k_n", S * dn)
    s_gv = spad.alloc("g_v", (T + S) * dv)       # ATTEND's b: the gate [T, dv], then the values [S, dv]
    s_sc, s_sr, s_og = spad.alloc("score", T * S), spad.alloc("score_rope", T * S), spad.alloc("og", T * dv)
    s_yh, s_y = spad.alloc("y_head", T * d), spad.alloc("y", T * d)
    if spad.top > cfg.dmem_depth:
        raise ValueError(f"x_q: {T} tokens after {S0} cached need {spad.top:,} scratchpad words, "
                         f"dmem_depth = {cfg.dmem_depth:,}")

    def gemm(name: str, a: int, c: int) -> Instr:
        W, rq, m, k = gemms[name]
        fields = dict(width=0) if rq is None else rq_fields(rq, s_tab.get(name), cfg, f"Q's {name} requantiser")
        return Instr(Op.GEMM, m=m, k=k, n=len(W), a=a, c=c, host=h_w[name], **fields)

    def norm(a: int, c: int, n: int, weight: str, shift: int) -> list:
        """rmsnorm_weight_int of the T rows of n at a, into c."""
        return [Instr(Op.NORM, m=T, n=n, a=a, c=c), Instr(Op.MUL, m=T, n=n, a=c, b=s_tab[weight], c=c, shift=shift)]

    new_nkv, new_kr = s_nkv + S0 * rkv, s_kr + S0 * dr
    instrs = [Instr(Op.LOAD, m=T, n=d, c=s_x, host=h_x, width=4 if x_words else 1),
              load_tab,
              gemm("qa", s_x, s_qa), *norm(s_qa, s_qa, rq_rank, "q_norm", Q.q_norm_shift),
              gemm("ckv", s_x, s_ckv), *norm(s_ckv, new_nkv, rkv, "kv_norm", Q.kv_norm_shift),
              gemm("kr", s_x, new_kr)]
    if S0:
        instrs += [Instr(Op.LOAD, m=S0, n=rkv, c=s_nkv, host=h_nkv, width=4),
                   Instr(Op.LOAD, m=S0, n=dr, c=s_kr, host=h_kr, width=4)]
    instrs += [Instr(Op.STORE, m=T, n=rkv, a=new_nkv, host=h_nkv + 4 * S0 * rkv, width=4),
               Instr(Op.STORE, m=T, n=dr, a=new_kr, host=h_kr + 4 * S0 * dr, width=4)]
    rq_score = rq_fields(Q.rq_score, None, cfg, "Q.rq_score")
    for h in range(H):
        instrs += [gemm(f"qn{h}", s_qa, s_qn), gemm(f"qr{h}", s_qa, s_qr), gemm(f"kn{h}", s_nkv, s_kn),
                   gemm(f"v{h}", s_nkv, s_gv + T * dv),
                   Instr(Op.GEMM, flags=F_B_SPAD, m=T, k=dn, n=S, a=s_qn, b=s_kn, c=s_sc),
                   Instr(Op.GEMM, flags=F_B_SPAD, m=T, k=dr, n=S, a=s_qr, b=s_kr, c=s_sr),
                   Instr(Op.ADD, flags=F_ACC, m=T, n=S, a=s_sc, b=s_sr, c=s_sc),
                   Instr(Op.REQUANT, m=T, n=S, a=s_sc, c=s_sc, **rq_score),
                   gemm(f"g{h}", s_x, s_gv),
                   Instr(Op.SIGMOID, m=T, n=dv, a=s_gv, c=s_gv),
                   Instr(Op.ATTEND, m=T, k=S, n=dv, a=s_sc, b=s_gv, c=s_og),
                   gemm(f"o{h}", s_og, s_y if h == 0 else s_yh)]
        if h:
            instrs.append(Instr(Op.ADD, flags=F_ACC, m=T, n=d, a=s_y, b=s_yh, c=s_y))
    instrs += [Instr(Op.REQUANT, m=T, n=d, a=s_y, c=s_y, **rq_fields(Q.rq_o, s_tab.get("o"), cfg, "Q.rq_o")),
               Instr(Op.STORE, m=T, n=d, a=s_y, host=h_y, width=4),
               Instr(Op.HALT)]
    if len(instrs) > cfg.imem_depth:
        raise ValueError(f"imem_depth = {cfg.imem_depth}: MLA needs {len(instrs)} instructions")
    return RowsProgram(instrs, host.image, host.symbols, T, cfg, out="y", spad=dict(spad.map))


def read_cache(prog: RowsProgram, host, part: str = "") -> MLACache:
    """The :class:`~golden.mla.MLACache` a run of ``prog`` (:func:`compile_mla`, or a linked program
    with it as the part named ``part``) left in ``host``: the cache given and the call's tokens."""
    cfg, prefix = prog.cfg, f"{part}." if part else ""
    words = np.frombuffer(bytes(host), dtype="<i4").astype(np.int64)
    # k_r follows n_kv, after less than a row of padding (to bus_bytes)
    rows = (prog.symbols[f"{prefix}k_r"] - prog.symbols[f"{prefix}n_kv"]) // (4 * cfg.kv_lora_rank)
    n_kv = words[prog.symbols[f"{prefix}n_kv"] // 4:][:rows * cfg.kv_lora_rank].reshape(rows, cfg.kv_lora_rank)
    k_r = words[prog.symbols[f"{prefix}k_r"] // 4:][:rows * cfg.qk_rope_dim].reshape(rows, cfg.qk_rope_dim)
    return MLACache(n_kv, k_r)
