"""Float64 reference of one whole Kimi K3 layer (the semantic golden model).

Every formula follows ``shared/k3-spec.md``; every shape and constant comes from
:class:`nanokpu.config.KpuConfig`. Everything is ``np.float64``. The integer path the
hardware runs lives in :mod:`golden.intops` and is bounded against these functions.

Shapes: ``T`` tokens, ``d = d_model``, ``l = d_latent``, ``E = n_experts``,
``k = top_k``.
"""

from __future__ import annotations

import numpy as np

from nanokpu.config import KpuConfig

__all__ = [
    "sigmoid", "topk_stable", "router", "quantile_balance", "quantile_balance_bhat",
    "expert_loads",
]


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# ----------------------------------------------------------------------------------------
# Router and Quantile Balancing
# ----------------------------------------------------------------------------------------
def sigmoid(x) -> np.ndarray:
    """Logistic function, elementwise, float64, without overflow for any finite input."""
    x = _f64(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def topk_stable(keys, k: int) -> np.ndarray:
    """Indices of the ``k`` largest ``keys`` along the last axis, in rank order.

    Rule (k3-spec): on equal keys the lower index wins, so the answer is unique.

    Parameters
    ----------
    keys : array ``[..., E]``, real, no NaN.
    k : int, ``1 <= k <= E``.

    Returns
    -------
    idx : int64 array ``[..., k]``.
    """
    keys = _f64(keys)
    n = keys.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"top_k = {k}: must be in [1, {n}] (the number of keys)")
    if np.isnan(keys).any():
        raise ValueError("topk_stable: keys contain NaN (no order is defined)")
    # A stable sort of -keys keeps equal keys in index order. (-0.0 == 0.0, so signed
    # zeros are ties, too.)
    return np.argsort(-keys, axis=-1, kind="stable")[..., :k].astype(np.int64)


def router(x, W_r, b, cfg: KpuConfig):
    """DeepSeek-V3 style sigmoid router.

    ``s = sigmoid(x W_r^T)``; ``idx = top_k(s + b)`` (bias for selection only, stable
    ties); ``w = s[idx] / (sum(s[idx]) + 1e-20) * routed_scaling``.

    Parameters
    ----------
    x : ``[T, d]`` full-width tokens.
    W_r : ``[E, d]`` router weights.
    b : ``[E]`` selection bias.
    cfg : uses ``top_k`` and ``routed_scaling``.

    Returns
    -------
    idx : int64 ``[T, k]`` selected experts, in rank order of ``s + b``.
    w : float64 ``[T, k]`` routing weights, each row summing to ``routed_scaling``.
    s : float64 ``[T, E]`` unbiased scores.
    """
    x, W_r, b = _f64(x), _f64(W_r), _f64(b)
    if x.ndim != 2 or W_r.ndim != 2 or x.shape[1] != W_r.shape[1]:
        raise ValueError(f"router: x {x.shape} and W_r {W_r.shape} must be [T, d] and [E, d]")
    if b.shape != (W_r.shape[0],):
        raise ValueError(f"router: bias shape {b.shape}, expected ({W_r.shape[0]},)")
    s = sigmoid(x @ W_r.T)
    idx = topk_stable(s + b, cfg.top_k)
    sel = np.take_along_axis(s, idx, axis=-1)
    w = sel / (sel.sum(axis=-1, keepdims=True) + 1e-20) * cfg.routed_scaling
    return idx, w, s


def expert_loads(s, b, k: int) -> np.ndarray:
    """Tokens per expert when routing ``s + b`` by stable top-``k``: int64 ``[E]``."""
    s = _f64(s)
    idx = topk_stable(s + _f64(b), k)
    return np.bincount(idx.ravel(), minlength=s.shape[-1]).astype(np.int64)


def _kth_largest(a, n: int, axis: int) -> np.ndarray:
    """The ``n``-th largest (1-based) along ``axis``: an exact order statistic by sorting."""
    return np.take(np.sort(a, axis=axis), a.shape[axis] - n, axis=axis)


def quantile_balance_bhat(s, b, k: int):
    """The un-centred Quantile Balancing bias and the cutoffs it was computed against.

    ``alpha_i`` = (k+1)-th largest of ``s_i + b``; ``q = m k / E``;
    ``bhat_j = -((q+1)-th largest over i of (s_ij - alpha_i))``.

    With the cutoffs ``alpha`` held fixed, expert ``j`` wins the tokens whose margin
    ``s_ij - alpha_i`` exceeds ``-bhat_j``: exactly ``q`` of them when its ``q``-th and
    ``(q+1)``-th order statistics differ.

    Parameters
    ----------
    s : ``[m, E]`` unbiased scores of a batch.
    b : ``[E]`` current bias.
    k : int, ``1 <= k < E``.

    Returns
    -------
    bhat : float64 ``[E]``.
    alpha : float64 ``[m]`` per-token cutoffs.
    q : int, the target load per expert.
    """
    s, b = _f64(s), _f64(b)
    if s.ndim != 2 or b.shape != (s.shape[1],):
        raise ValueError(f"quantile_balance: s {s.shape} and b {b.shape} must be [m, E] and [E]")
    m, n_exp = s.shape
    if not 1 <= k < n_exp:
        raise ValueError(f"quantile_balance: k = {k} must be in [1, E-1 = {n_exp - 1}] "
                         "(the cutoff is the (k+1)-th largest score)")
    if (m * k) % n_exp:
        raise ValueError(f"quantile_balance: the target load q = m*k/E = {m}*{k}/{n_exp} "
                         f"= {m * k / n_exp:g} is not an integer; choose the batch size m "
                         f"as a multiple of {n_exp // np.gcd(n_exp, k)}")
    if np.isnan(s).any() or np.isnan(b).any():
        raise ValueError("quantile_balance: s or b contains NaN")
    q = m * k // n_exp
    alpha = _kth_largest(s + b, k + 1, axis=1)
    bhat = -_kth_largest(s - alpha[:, None], q + 1, axis=0)
    return bhat, alpha, q


def quantile_balance(s, b, k: int) -> np.ndarray:
    """One exact Quantile Balancing step: ``b_new = bhat - mean(bhat)`` (float64 ``[E]``).

    See :func:`quantile_balance_bhat` for ``bhat``, the shapes and the errors (ValueError
    when ``m k / E`` is not an integer). Exact order statistics (sorting), never
    interpolated quantiles. A training-time update: at inference ``b`` is frozen.
    """
    bhat, _, _ = quantile_balance_bhat(s, b, k)
    return bhat - bhat.mean()
