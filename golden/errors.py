"""Measured error of each integer op against its float formula, with the documented bound.

:func:`op_errors` is the source of the README's error table (``nanokpu report-errors``)
and of ``tests/golden/test_errors.py``, which asserts ``measured <= bound`` for every row. The
activation factors are measured over *every* representable input; the other ops on
random data from a fixed seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from golden import attn_res, block, k3, kda, layer, mla
from golden import intops as I
from nanokpu.config import KpuConfig

__all__ = ["OpError", "op_errors", "attn_res_errors", "block_errors", "format_table",
           "kda_op_errors", "kda_errors", "mla_op_errors", "mla_errors", "layer_cases", "layer_errors"]


@dataclass(frozen=True)
class OpError:
    """One row: ``max_abs`` (real units) measured over ``inputs``, against ``bound``."""

    op: str
    inputs: str
    max_abs: float
    lsb: float
    bound: float
    note: str

    @property
    def max_lsb(self) -> float:
        return self.max_abs / self.lsb


def _all_act(cfg: KpuConfig) -> np.ndarray:
    return np.arange(-(1 << (cfg.act_width - 1)), 1 << (cfg.act_width - 1), dtype=np.int64)


def _exp_errors(cfg: KpuConfig) -> np.ndarray:
    """``|exp_q(x) - exp(min(x, 0))|`` (real units) at every act-format ``x``, indexed by ``x + 2**(act_width
    - 1)``: 0 at ``x = 0`` (exp_q(0) is exactly 1.0)."""
    xs = _all_act(cfg)
    return np.abs(I.exp_q(xs, cfg) * 2.0 ** -cfg.score_frac - np.exp(np.minimum(xs / 2.0 ** cfg.act_frac, 0.0)))


def op_errors(cfg: KpuConfig, seed: int = 0) -> list[OpError]:
    """Every hardware op of ``cfg``'s integer path against float64."""
    rng = np.random.default_rng(seed)
    xs = _all_act(cfg)
    xr = xs / 2.0 ** cfg.act_frac
    rows = []
    factor_lsb = 2.0 ** -cfg.situ_frac
    logits = np.arange(-(1 << (cfg.router_logit_width - 1)), 1 << (cfg.router_logit_width - 1), dtype=np.int64)
    for op, fq, f, frac, (ins, real) in (
        ("sigmoid", I.sigmoid_q, k3.sigmoid, cfg.score_frac, (logits, logits / 2.0 ** cfg.router_logit_frac)),
        ("SiTU gate", I.gate_q, lambda x: k3.situ_gate(x, cfg.beta1), cfg.situ_frac, (xs, xr)),
        ("SiTU up", I.up_q, lambda x: k3.situ_up(x, cfg.beta2), cfg.situ_frac, (xs, xr)),
    ):
        lsb = 2.0 ** -frac
        err = np.max(np.abs(fq(ins, cfg) * lsb - f(real)))
        table = {"sigmoid": I.sigmoid_table, "SiTU gate": I.gate_table, "SiTU up": I.up_table}[op](cfg)
        rows.append(OpError(op, f"all {len(ins)}", float(err), lsb, 1.5 * lsb,
                            f"PWL, {table.n_seg} segments of {2 ** table.seg_shift} LSB; "
                            "<= 1 LSB from correctly rounded"))
    g = rng.integers(xs[0], xs[-1] + 1, 500_000)
    u = rng.integers(xs[0], xs[-1] + 1, 500_000)
    h_lsb = 2.0 ** -cfg.h_frac
    e = 1.5 * factor_lsb
    err = np.max(np.abs(I.situ_q(g, u, cfg) * h_lsb - k3.situ_glu(g / 2.0 ** cfg.act_frac,
                                                                  u / 2.0 ** cfg.act_frac, cfg)))
    rows.append(OpError("SiTU-GLU h", "500k random (g, u)", float(err), h_lsb,
                        cfg.beta2 * e + cfg.beta1 * e + e * e + h_lsb / 2,
                        "product of the factors, one rounding"))
    # requantiser: acc * mult / 2**shift against the real product, inside the range
    acc = rng.integers(-(1 << 24), 1 << 24, 200_000)
    mult, shift = 23_456, 24
    real = acc * mult / 2.0 ** shift
    ok = np.abs(real) < 127
    err = np.max(np.abs(I.requantize(acc, mult, shift, cfg.out_width, cfg.rounding) - real)[ok])
    rows.append(OpError("requantiser", "200k random, unsaturated", float(err), 1.0, 0.5,
                        f"round_shift '{cfg.rounding}', then saturate"))
    s = rng.integers(0, (1 << cfg.score_frac) + 1, (20_000, cfg.top_k))
    s[0] = 0
    w = I.route_weights_int(s, cfg)
    total = s.sum(axis=1, keepdims=True)
    exact = np.where(total > 0, s / np.maximum(total, 1), 0.0)
    w_lsb = 2.0 ** -cfg.weight_frac
    rows.append(OpError("routing weights", "20k random tokens", float(np.max(np.abs(w * w_lsb - exact))),
                        w_lsb, w_lsb, "reciprocal floor(2^R/S), multiply, round"))
    ex = rng.integers(-(1 << 14), 1 << 14, (2000, cfg.top_k, 8))
    comb = I.combine_int(ex, w[:2000], cfg)
    act_lsb = 2.0 ** -cfg.act_frac
    exact = np.einsum("tk,tkn->tn", w[:2000] * w_lsb, ex)
    rows.append(OpError("weighted combine", "2k random tokens", float(np.max(np.abs(comb - exact)) * act_lsb),
                        act_lsb, act_lsb / 2, "one rounding of the exact integer sum"))
    uu = rng.integers(-4000, 4000, (2000, cfg.d_latent))
    norm = I.rmsnorm_int(uu, cfg) * 2.0 ** -cfg.norm_frac
    ref = k3.rmsnorm(uu * act_lsb, None, cfg.rms_eps)
    n_lsb = 2.0 ** -cfg.norm_frac
    # floor(mean) and floor(isqrt) make r low by < 1/(2 r_min) + ... relative (r >= ~1000 LSB
    # here); the truncated reciprocal is low by a relative < 2**-(M-1)
    rel = 1.0 / np.min(I.isqrt((uu * uu).sum(axis=1) // uu.shape[1])) + 2.0 ** -(I.norm_recip_bits(cfg) - 1)
    norm_bound = n_lsb / 2 + float(np.max(np.abs(ref))) * 1.01 * rel
    rows.append(OpError("RMSNorm", "2k random rows", float(np.max(np.abs(norm - ref))), n_lsb, norm_bound,
                        "floor mean, floor isqrt, truncated reciprocal, multiply, round"))
    # weight ~ 1 + 0.1 N(0, 1) (as golden.k3.init_layer); the weight's own rounding (half a
    # 2**-weight_shift LSB) scales |n|, the RMSNorm error scales |weight|, then one rounding
    weight = 1.0 + 0.1 * rng.standard_normal(cfg.d_latent)
    weight_q, weight_shift = I.quantize_norm_weight(weight, cfg)
    normw = I.rmsnorm_weight_int(uu, weight_q, weight_shift, cfg) * n_lsb
    refw = k3.rmsnorm(uu * act_lsb, weight, cfg.rms_eps)
    rows.append(OpError("RMSNorm x weight", "2k random rows", float(np.max(np.abs(normw - refw))), n_lsb,
                        n_lsb / 2 + float(np.max(np.abs(norm))) * 2.0 ** -(weight_shift + 1)
                        + float(np.max(np.abs(weight))) * norm_bound,
                        f"RMSNorm, times the weight in Q{cfg.mult_width}.{weight_shift}, round"))
    e_lsb = 2.0 ** -cfg.score_frac
    ex = I.exp_table(cfg)
    exp_err = float(np.max(_exp_errors(cfg)))
    rows.append(OpError("exp", f"all {len(xs)}", exp_err, e_lsb, 1.5 * e_lsb,
                        f"exp(min(x, 0)); PWL, {ex.n_seg} segments of {2 ** ex.seg_shift} LSB; "
                        "<= 1 LSB from correctly rounded"))
    # softmax over the candidates of the deepest Attention Residuals, logits N(0, 2**2): weights
    # from flat to one-hot. Every e_j is within exp_err (the exp row, over every input) of
    # exp(s_j - m), the max term exact, so with S = sum e, a_i = e_i / S exact:
    # |e_i/S - a_i| <= exp_err ((1 - a_i) [i not the max] + a_i (others not the max)) / S; then 1 weight LSB
    n_cand = cfg.attnres_candidates
    logits = I.saturate(np.round(2.0 * rng.standard_normal((20_000, n_cand)) / act_lsb).astype(np.int64),
                        cfg.act_width)
    sm = I.softmax_int(logits, cfg) * w_lsb
    z = np.exp((logits - np.max(logits, axis=1, keepdims=True)) * act_lsb)
    a = z / z.sum(axis=1, keepdims=True)
    is_max = logits == np.max(logits, axis=1, keepdims=True)
    total = I.exp_q(logits - np.max(logits, axis=1, keepdims=True), cfg).sum(axis=1, keepdims=True) * e_lsb
    moved = exp_err * (np.where(is_max, 0.0, 1.0 - a) + a * (n_cand - 1 - ~is_max)) / total
    rows.append(OpError("softmax weights", f"20k random rows of {n_cand} logits", float(np.max(np.abs(sm - a))),
                        w_lsb, float(np.max(moved)) + w_lsb,
                        "running max, exp, one reciprocal per row, multiply, round"))
    return rows


def attn_res_errors(cfg: KpuConfig, seed: int = 0, tokens: int = 256) -> dict:
    """End to end: :func:`golden.attn_res.attn_res_int` against :func:`golden.k3.attn_res` on the
    same act-format candidates (so input quantisation is not counted; the query's is).

    :attr:`~nanokpu.config.KpuConfig.attnres_candidates` candidates ``V_n ~ N(0, 4**n / 4)`` (the
    stream grows with depth) ``[tokens, d_model]``, rounded to the act format, and a query ``q ~
    N(0, 4 / d_model)`` (scores of standard deviation ~2), drawn from ``seed`` in that order.
    Keys: ``cosine``, ``max_abs`` and ``max_rel`` (max abs error / max abs h) of ``h``;
    ``weights_max_abs`` of the softmax weights.
    """
    rng = np.random.default_rng(seed)
    n_cand, d = cfg.attnres_candidates, cfg.d_model
    sigma = 2.0 ** (np.arange(n_cand) - 1)
    act_lsb = 2.0 ** -cfg.act_frac
    V = layer.quantize_act(rng.standard_normal((n_cand, tokens, d)) * sigma[:, None, None], cfg)
    q = 2.0 * rng.standard_normal(d) / np.sqrt(d)
    Q = attn_res.quantize_attn_res(q, cfg)
    Bl, P = list(V[:-1]), V[-1]
    h = attn_res.attn_res_int(P, Bl, Q, cfg) * act_lsb
    a = attn_res.attn_res_weights_int(P, Bl, Q, cfg) * 2.0 ** -cfg.weight_frac
    Bl_real = [v * act_lsb for v in Bl]
    ref = k3.attn_res(P * act_lsb, Bl_real, q, cfg.rms_eps)
    err = block.block_error(h / act_lsb, ref, cfg)
    return {"cosine": err["cosine"], "max_abs": err["max_abs"], "max_rel": err["max_rel"],
            "weights_max_abs": float(np.max(np.abs(a - k3.attn_res_weights(P * act_lsb, Bl_real, q, cfg.rms_eps))))}


def block_errors(cfg: KpuConfig, seed: int = 0, tokens: int = 32) -> dict:
    """End to end: the integer LatentMoE block against the float block (same weights).

    Keys of :func:`golden.block.block_error`, plus ``routing_agreement`` (share of tokens
    whose integer path picked the same expert set as the float path) and
    ``cosine_same_routing`` (the cosine over those tokens only).
    """
    Q, x_q, y, idx = block.random_block(cfg, tokens, np.random.default_rng(seed))
    out = block.latent_moe_int(x_q, Q, cfg)
    err = block.block_error(out["y"], y, cfg)
    same = block.same_routing(out["idx"], idx)
    err["routing_agreement"] = float(np.mean(same))
    err["cosine_same_routing"] = block.block_error(out["y"][same], y[same], cfg)["cosine"]
    return err


def format_table(rows: list[OpError]) -> str:
    lines = ["| op | inputs | max abs error | in LSB | bound | how |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.op} | {r.inputs} | {r.max_abs:.3g} | {r.max_lsb:.2f} | {r.bound:.3g} | {r.note} |")
    return "\n".join(lines)


def kda_op_errors(cfg: KpuConfig, seed: int = 0) -> list[OpError]:
    """The ops the integer KDA adds (:mod:`golden.kda`): SiLU and the decay ``exp(kda_gate_min
    sigmoid(z))`` over every act-format input, l2norm on 20k random rows of ``kda_head_dim`` act-format
    values (each row ``N(0, s**2)`` LSB with ``log2 s`` uniform in ``[4, 12]``) against
    :func:`golden.k3.l2norm`."""
    rng = np.random.default_rng(seed)
    xs = _all_act(cfg)
    xr = xs / 2.0 ** cfg.act_frac
    rows = []
    for op, fq, table, frac, f in (
        ("SiLU", I.silu_q, I.silu_table, cfg.act_frac, k3.silu),
        ("KDA decay", I.decay_q, I.decay_table, cfg.score_frac,
         lambda z: np.exp(cfg.kda_gate_min * k3.sigmoid(z))),
    ):
        lsb = 2.0 ** -frac
        t = table(cfg)
        rows.append(OpError(op, f"all {len(xs)}", float(np.max(np.abs(fq(xs, cfg) * lsb - f(xr)))), lsb, 1.5 * lsb,
                            f"PWL, {t.n_seg} segments of {2 ** t.seg_shift} LSB; <= 1 LSB from correctly rounded"))
    sigma = 2.0 ** rng.uniform(4, 12, (20_000, 1))
    x = I.saturate(np.round(sigma * rng.standard_normal((20_000, cfg.kda_head_dim))).astype(np.int64), cfg.act_width)
    u_lsb = 2.0 ** -kda.unit_frac(cfg)
    ref = k3.l2norm(x * 2.0 ** -cfg.act_frac, cfg.l2_eps)
    # the table's rounding and the relative < 2**-(NORM_GUARD-2) of floor isqrt and the truncated
    # reciprocal (golden.intops.l2norm_int), plus the eps the format cannot hold: x/sqrt(ss) against
    # x/sqrt(ss + eps) differs by up to 1 - sqrt(ss/(ss + eps)) of |y| <= 1
    ss = (x * x).sum(axis=1) * 4.0 ** -cfg.act_frac
    eps_gap = float(np.max(1.0 - np.sqrt(ss / (ss + cfg.l2_eps))))
    rows.append(OpError("l2norm", f"20k random rows of {cfg.kda_head_dim}",
                        float(np.max(np.abs(I.l2norm_int(x, kda.unit_frac(cfg), cfg) * u_lsb - ref))), u_lsb,
                        u_lsb * (0.5 + 2.0 ** -(I.NORM_GUARD - 2)) + eps_gap,
                        f"Q{cfg.act_width}.{kda.unit_frac(cfg)}; even shift, isqrt, one reciprocal per row, "
                        "multiply, round"))
    return rows


def kda_errors(cfg: KpuConfig, seed: int = 0, tokens: int = 64) -> dict:
    """End to end: :func:`golden.kda.kda_int` against :func:`golden.k3.kda` (same weights, from
    :func:`golden.k3.init_kda`, then ``x ~ N(0, 1)`` ``[tokens, d_model]``, both drawn from ``seed``);
    the integer path's input quantisation is counted. Keys of :func:`golden.block.block_error`, plus
    ``state_max`` (the largest ``|S|`` of the integer state after the last token, real units)."""
    rng = np.random.default_rng(seed)
    P = k3.init_kda(cfg, rng)
    x = rng.standard_normal((tokens, cfg.d_model))
    Q, x_q = kda.quantize_kda(P, x, cfg)
    y, state = kda.kda_int(x_q, Q, cfg)
    err = block.block_error(y, k3.kda(x, P, cfg), cfg)
    err["state_max"] = float(np.max(np.abs(state.S))) * 2.0 ** -kda.state_frac(cfg)
    return err

def mla_op_errors(cfg: KpuConfig, seed: int = 0, keys: int = 64) -> list[OpError]:
    """MLA's read-out (``ATTEND``) on 20k random rows (200 heads of 100 queries, each query
    attending a random prefix of ``keys`` keys): scores ``N(0, 2**2)`` in the act format, int8 values
    uniform, the gate uniform in ``[0, 1]``. ``online softmax o``: :func:`golden.mla.online_softmax_int`
    against the exact softmax-weighted sum of the values (v units); ``output gate``:
    :func:`golden.mla.gate_int` of that ``o`` against the exact ``o`` times the same gate (int8 LSB).

    The bound, per row: the max key adds exactly 1.0 and a rescale by an unchanged max is exact, so
    only the other exponentials (each within exp_q's error at its argument, as the exp row measures
    it over every input) and the rescales at a new max (one rounding each, half an LSB, to ``l`` and
    to each ``acc``) err. Key ``j``'s effective weight is its ``p`` times every later ``alpha``: within
    ``D_j = (E_j + e_j) prod (A_k + e_k) - W_j`` of the exact ``W_j = exp(s_j - M)`` (``E``, ``A`` the
    exact factors, ``e`` exp_q's errors at their arguments), and a rounding at step ``k`` reaches the
    end scaled by at most ``G_k = prod_{k' > k} (A_k' + e_k')``. ``l`` and ``acc`` carry the same
    weights, so ``acc / l - o* = (sum D_j (v_j - o*) + E_acc - o* E_l) / l``; then the reciprocal
    (relative ``< 2**-(RECIP_BITS - 1)``) and one rounding.
    """
    rng = np.random.default_rng(seed)
    heads, queries, sf, width = 200, 100, cfg.score_frac, cfg.act_width
    act_lsb, e_lsb, exp_errs = 2.0 ** -cfg.act_frac, 2.0 ** -sf, _exp_errors(cfg)
    s = I.saturate(np.round(2.0 * rng.standard_normal((heads, queries, keys)) / act_lsb).astype(np.int64), width)
    v = rng.integers(-(1 << (cfg.in_width - 1)), 1 << (cfg.in_width - 1), (keys, heads, cfg.v_head_dim))
    pos = rng.integers(0, keys, queries)
    g = rng.integers(0, (1 << sf) + 1, (queries, heads, cfg.v_head_dim))
    o = mla.online_softmax_int(s, v, pos, cfg).transpose(1, 0, 2)        # [H, T, dv]
    live = np.arange(keys)[None, None, :] <= pos[None, :, None]
    m = np.maximum.accumulate(np.where(live, s, s.min()), axis=-1)        # running max (dead keys: a suffix)
    W = np.where(live, np.exp((s - m[..., -1:]) * act_lsb), 0.0)
    Z = W.sum(axis=-1)
    o_ref = np.einsum("hts,shd->htd", W, v) / Z[..., None]
    m_prev = np.concatenate([m[..., :1], m[..., :-1]], axis=-1)
    new_max = live & (m != m_prev)                                        # a rescale that rounds

    def err(x):   # exp_q's error at each argument
        return exp_errs[I.saturate(x, width) + (1 << (width - 1))]

    E = np.exp((s - m) * act_lsb)
    grow = np.where(new_max, np.exp((m_prev - m) * act_lsb) + err(m_prev - m), 1.0)
    G = np.concatenate([np.cumprod(grow[..., :0:-1], axis=-1)[..., ::-1], np.ones_like(Z)[..., None]], axis=-1)
    D = np.where(live, (E + err(s - m)) * G - W, 0.0)
    R = (new_max * G).sum(axis=-1) * e_lsb / 2                             # |E_l|, and |E_acc| of each element
    l_low = Z - D.sum(axis=-1) - R
    dev = np.abs(v.transpose(1, 0, 2)[:, None, :, :] - o_ref[:, :, None, :])   # |v_j - o*| [H, T, S, dv]
    Bq = (np.einsum("hts,htsd->htd", D, dev) + R[..., None] * (1 + np.abs(o_ref))) / l_low[..., None]
    bound_o = Bq + (np.abs(o_ref) + Bq) * 2.0 ** -(mla.RECIP_BITS - 1) + e_lsb / 2
    g_r = g.transpose(1, 0, 2) * e_lsb
    og = mla.gate_int(o.transpose(1, 0, 2), g, cfg).transpose(1, 0, 2)
    note = f"{len(pos) * heads // 1000}k random rows of <= {keys} keys"
    return [OpError("online softmax o", note, float(np.max(np.abs(o * e_lsb - o_ref))), e_lsb, float(np.max(bound_o)),
                    "running max, exp, l and acc rescaled alike, one reciprocal per row, multiply, round"),
            OpError("output gate", note, float(np.max(np.abs(og - o_ref * g_r))), 1.0,
                    float(np.max(g_r * bound_o)) + 0.5, "o times the gate, one rounding, saturate")]


def mla_errors(cfg: KpuConfig, seed: int = 0, tokens: int = 32) -> dict:
    """End to end: :func:`golden.mla.mla_int` against :func:`golden.k3.mla` (same weights, one causal
    call). Weights from :func:`golden.k3.init_mla`, then ``x ~ N(0, 1)`` ``[tokens, d_model]``, both
    drawn from ``seed`` in that order; scales calibrated on that ``x`` (:func:`golden.mla.quantize_mla`,
    so the int8 quantisation of ``x`` is counted). Keys of :func:`golden.block.block_error`."""
    rng = np.random.default_rng(seed)
    P = k3.init_mla(cfg, rng)
    x = rng.standard_normal((tokens, cfg.d_model))
    Q, x_q = mla.quantize_mla(P, x, cfg)
    return block.block_error(mla.mla_int(x_q, Q, cfg)[0], k3.mla(x, P, cfg), cfg)


def layer_cases(cfg: KpuConfig) -> dict[str, int]:
    """The layers whose end-to-end errors are measured, by name: ``dense`` layer 0 (KDA mixer, dense FFN,
    a block start with no representatives yet), ``KDA`` the first KDA + LatentMoE layer that starts a
    block (the Attention Residuals of the FFN see the finished block's sum), ``MLA`` the first MLA layer."""
    block_starts = [L for L in range(cfg.dense_layers, cfg.n_layers)
                    if L % cfg.attnres_block == 0 and not cfg.is_mla_layer(L)]
    return {"dense": 0, "KDA": block_starts[0], "MLA": next(L for L in range(cfg.n_layers) if cfg.is_mla_layer(L))}


def layer_errors(cfg: KpuConfig, L: int, seed: int = 0, tokens: int = 32) -> dict:
    """End to end: :func:`golden.layer.layer_int` against :func:`golden.k3.layer` for layer ``L`` on the same
    act-format inputs. Weights from :func:`golden.k3.init_layer`, then ``P`` and the ``ceil(L /
    attnres_block)`` representatives ``Bl`` (the blocks started before ``L``), each ``N(0, 1)`` ``[tokens,
    d_model]`` rounded to the act format (:func:`golden.layer.quantize_act`), all drawn from ``seed`` in
    that order; calibrated on the same batch (:func:`golden.layer.quantize_layer`).

    Keys of :func:`golden.block.block_error` on the output ``P``, plus ``update_cosine``: the cosine of
    what the layer adds to the ``P`` it carries on (``P`` out less ``P`` in, or all of ``P`` out when ``L``
    starts a block), which the carried part does not inflate.
    """
    rng = np.random.default_rng(seed)
    params = k3.init_layer(L, cfg, rng)
    V = layer.quantize_act(rng.standard_normal((-(-L // cfg.attnres_block) + 1, tokens, cfg.d_model)), cfg)
    act_lsb = 2.0 ** -cfg.act_frac
    P, Bl = V[-1], list(V[:-1])
    Q, _, _ = layer.quantize_layer(L, params, P * act_lsb, [b * act_lsb for b in Bl], cfg)
    P_int, _, _ = layer.layer_int(L, P, Bl, Q, cfg)
    P_ref, _ = k3.layer(L, P * act_lsb, [b * act_lsb for b in Bl], params, cfg)
    err = block.block_error(P_int, P_ref, cfg)
    carried = 0 if L % cfg.attnres_block == 0 else P
    err["update_cosine"] = block.block_error(P_int - carried, P_ref - carried * act_lsb, cfg)["cosine"]
    return err
