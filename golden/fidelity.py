"""Routing fidelity: how often the integer path routes a token like the float model, and what a
block's output loses when it does not (issue 26; ``nanokpu report-fidelity``, docs/fidelity.md).

Two measurements, each over seeds of random weights and tokens, with the float model of
:mod:`golden.k3` as the reference and any number of integer configs on the same draws:

- :func:`router_fidelity`: the router alone (:func:`golden.block.router_int` against
  :func:`golden.k3.router`), e.g. at the K3 shape (d 7168, 896 experts, top-16): ``W_r`` ~
  N(0, 1/d), tokens ~ N(0, 1), bias ~ 0.05 N(0, 1), one calibration (input scale) per seed.
- :func:`block_fidelity`: whole LatentMoE blocks (:func:`golden.block.latent_moe_int` against
  :func:`golden.k3.latent_moe`): weights from :func:`golden.k3.init_latent_moe` per seed, then
  several blocks of tokens ~ N(0, 1), each quantised (calibrated) on its own batch.

:data:`BEFORE` and :data:`AFTER` are the two schemes the report compares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from golden import block, k3
from nanokpu.config import KpuConfig

__all__ = ["BEFORE", "AFTER", "scheme", "Fidelity", "router_draws", "router_fidelity", "block_fidelity"]

#: Today's scheme: per-tensor weight scales, the router GEMM at ``in_width`` (int8), logits in
#: the act format, the profile's score format.
BEFORE: dict = {}

#: Issue 26's scheme: per-channel weight scales, a 16 x 16-bit router GEMM, logits in Q20.16
#: (range +-8: sigmoid(8) = 1 - 3.4e-4), scores and bias with 16 fraction bits.
AFTER: dict = {"weight_scales": "channel", "router_width": 16, "logit_width": 20, "logit_frac": 16,
               "score_frac": 16, "bias_width": 20}


def scheme(cfg: KpuConfig, changes: dict) -> KpuConfig:
    """``cfg`` with a scheme's ``changes`` (:data:`BEFORE`, :data:`AFTER`) applied."""
    return cfg.replace(**changes) if changes else cfg


@dataclass
class Fidelity:
    """Per-token and per-seed results of one integer config against the float model.

    Members
    -------
    seeds : list of int
    same : bool array ``[tokens]``
        Whether the token's integer expert set is the float one.
    swapped : int array ``[tokens]``
        Experts of the float set missing from the integer set (``top_k - |overlap|``).
    weight_err : float array ``[same-set tokens * top_k]``
        ``|w_int - w_float|`` per selected expert, on same-set tokens (real units).
    seed_same : list of float
        Same-set rate per seed.
    cosine, cosine_same : list of float
        Per seed (blocks only): cosine of the integer block output with the float one, on all
        the seed's tokens and on its same-set tokens (nan if it has none).
    flip_gap : list of float
        Router only: for each token routed differently, the float model's margin between its
        ``top_k``-th and ``top_k + 1``-th biased score (how near a tie the float choice was).
    """

    seeds: list = field(default_factory=list)
    same: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    swapped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    weight_err: np.ndarray = field(default_factory=lambda: np.zeros(0))
    seed_same: list = field(default_factory=list)
    cosine: list = field(default_factory=list)
    cosine_same: list = field(default_factory=list)
    flip_gap: list = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return int(self.same.size)

    @property
    def same_rate(self) -> float:
        return float(np.mean(self.same))

    @property
    def swapped_mean(self) -> float:
        return float(np.mean(self.swapped))

    def summary(self) -> dict:
        """The report's numbers: rates, weight error, cosine min/median (nan without blocks)."""
        def stat(values, fn):
            v = np.asarray(values, dtype=np.float64)
            v = v[np.isfinite(v)]
            return float(fn(v)) if v.size else float("nan")

        return {"seeds": len(self.seeds), "tokens": self.tokens, "same_rate": self.same_rate,
                "swapped_mean": self.swapped_mean,
                "weight_err_max": stat(self.weight_err, np.max),
                "weight_err_mean": stat(self.weight_err, np.mean),
                "seed_same_min": stat(self.seed_same, np.min),
                "cos_min": stat(self.cosine, np.min), "cos_median": stat(self.cosine, np.median),
                "cos_same_min": stat(self.cosine_same, np.min),
                "cos_same_median": stat(self.cosine_same, np.median),
                "flip_gap_max": stat(self.flip_gap, np.max)}

    def _add(self, idx_i, w_i, idx_f, w_f, cfg: KpuConfig) -> np.ndarray:
        same = block.same_routing(idx_i, idx_f)
        overlap = np.array([len(set(a) & set(b)) for a, b in zip(idx_i.tolist(), idx_f.tolist(), strict=True)])
        order_i, order_f = np.argsort(idx_i, axis=1), np.argsort(idx_f, axis=1)
        wi = np.take_along_axis(w_i, order_i, 1) * 2.0 ** -cfg.weight_frac * cfg.routed_scaling
        wf = np.take_along_axis(w_f, order_f, 1)
        self.same = np.concatenate([self.same, same])
        self.swapped = np.concatenate([self.swapped, cfg.top_k - overlap])
        self.weight_err = np.concatenate([self.weight_err, np.abs(wi - wf)[same].ravel()])
        return same


def _cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if not a.size:
        return float("nan")
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def router_draws(cfg: KpuConfig, rng: np.random.Generator, tokens: int):
    """A random router at the shape of ``cfg``, drawn from ``rng`` in this order: ``W_r [E, d]`` ~
    N(0, 1/d), bias ``[E]`` ~ 0.05 N(0, 1), ``x [tokens, d]`` ~ N(0, 1); returns ``(W_r, bias, x)``."""
    d, E = cfg.d_model, cfg.n_experts
    W_r = rng.standard_normal((E, d)) / np.sqrt(d)
    bias = 0.05 * rng.standard_normal(E)
    x = rng.standard_normal((tokens, d))
    return W_r, bias, x


def router_fidelity(cfgs: list[KpuConfig], seeds, tokens: int,
                    progress: Callable[[int], None] | None = None) -> list[Fidelity]:
    """The integer router of each config against the float router, on the same draws.

    Per seed: :func:`router_draws` from ``np.random.default_rng(seed)``. The shapes, ``top_k`` and
    ``routed_scaling`` are the first config's; ``progress(seed)`` is called after each seed.
    """
    base = cfgs[0]
    E = base.n_experts
    out = [Fidelity() for _ in cfgs]
    for seed in seeds:
        W_r, bias, x = router_draws(base, np.random.default_rng(seed), tokens)
        idx_f, w_f, s_f = k3.router(x, W_r, bias, base)
        keys = -np.sort(-(s_f + bias), axis=1)
        gap = keys[:, base.top_k - 1] - keys[:, base.top_k] if base.top_k < E else np.full(tokens, np.inf)
        for cfg, fid in zip(cfgs, out, strict=True):
            x_r, x_scale = block.quantize_input(x, cfg)
            R = block.quantize_router(W_r, bias, x_scale, cfg)
            _, idx_i, w_i, _ = block.router_int(x_r, R, cfg)
            same = fid._add(idx_i, w_i, idx_f, w_f, cfg)
            fid.flip_gap.extend(float(g) for g in gap[~same])
            fid.seeds.append(seed)
            fid.seed_same.append(float(np.mean(same)))
        if progress is not None:
            progress(seed)
    return out


def block_fidelity(cfgs: list[KpuConfig], seeds, blocks: int, block_tokens: int,
                   progress: Callable[[int], None] | None = None) -> list[Fidelity]:
    """Whole integer LatentMoE blocks of each config against the float block, on the same draws.

    Per seed (``np.random.default_rng(seed)``): weights by :func:`golden.k3.init_latent_moe`,
    then ``blocks`` batches ``x [block_tokens, d]`` ~ N(0, 1), each quantised on its own
    (:func:`golden.block.quantize_latent_moe`). The per-seed cosine is taken over all the
    seed's tokens (outputs in real units); ``progress(seed)`` is called after each seed.
    """
    base = cfgs[0]
    out = [Fidelity() for _ in cfgs]
    for seed in seeds:
        rng = np.random.default_rng(seed)
        P = k3.init_latent_moe(base, rng)
        xs = [rng.standard_normal((block_tokens, base.d_model)) for _ in range(blocks)]
        ref = [k3.latent_moe(x, P, base) for x in xs]
        for cfg, fid in zip(cfgs, out, strict=True):
            ys, yf, same_all = [], [], []
            for x, (y_f, idx_f, w_f) in zip(xs, ref, strict=True):
                Q, x_r = block.quantize_latent_moe(P, x, cfg)
                res = block.latent_moe_int(x_r, Q, cfg)
                same_all.append(fid._add(res["idx"], res["weights"], idx_f, w_f, cfg))
                ys.append(res["y"] * 2.0 ** -cfg.act_frac)
                yf.append(y_f)
            y_i, y_f, same = np.concatenate(ys), np.concatenate(yf), np.concatenate(same_all)
            fid.seeds.append(seed)
            fid.seed_same.append(float(np.mean(same)))
            fid.cosine.append(_cosine(y_i, y_f))
            fid.cosine_same.append(_cosine(y_i[same], y_f[same]))
        if progress is not None:
            progress(seed)
    return out
