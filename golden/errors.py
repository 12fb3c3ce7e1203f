"""Measured error of each integer op against its float formula, with the documented bound.

:func:`op_errors` is the source of the README's error table (``nanokpu report-errors``)
and of ``tests/test_errors.py``, which asserts ``measured <= bound`` for every row. The
activation factors are measured over *every* representable input; the other ops on
random data from a fixed seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from golden import block, k3
from golden import intops as I
from nanokpu.config import KpuConfig

__all__ = ["OpError", "op_errors", "block_errors", "format_table"]


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
    rows.append(OpError("RMSNorm", "2k random rows", float(np.max(np.abs(norm - ref))), n_lsb,
                        n_lsb / 2 + float(np.max(np.abs(ref))) * 1.01 * rel,
                        "floor mean, floor isqrt, truncated reciprocal, multiply, round"))
    return rows


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
