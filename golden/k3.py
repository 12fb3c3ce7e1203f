"""Float64 reference of one whole Kimi K3 layer (the semantic golden model).

Every formula follows ``shared/k3-spec.md``; every shape and constant comes from
:class:`nanokpu.config.KpuConfig`. Everything is ``np.float64``. The integer path the
hardware runs lives in :mod:`golden.intops` and is bounded against these functions.

Shapes: ``T`` tokens, ``d = d_model``, ``l = d_latent``, ``E = n_experts``,
``k = top_k``, ``H = n_heads``, ``K = kda_head_dim``.

Rules fixed here (k3-spec "Rule" items and choices the spec leaves open):

- top-k is stable: on equal keys the lower index wins (:func:`topk_stable`).
- Quantile Balancing uses exact order statistics (sorting) and the spec's Eq. 14 cutoff.
- The KDA forget-gate projection ``W_f`` is full rank; KDA value heads have width ``K``;
  the per-head output RMSNorm weight ``[K]`` is shared by the heads.
- The Attention Residuals key RMSNorm uses ``rms_eps``.
- Memory guard: the ``init_*`` functions refuse (ValueError) more than :data:`MAX_PARAMS`
  float64 values, so a full ``k3`` layer is refused while the router, top-k, Quantile
  Balancing and one expert run at ``k3`` widths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nanokpu.config import KpuConfig

__all__ = [
    "MAX_PARAMS", "sigmoid", "silu", "topk_stable", "router", "expert_loads",
    "quantile_balance", "quantile_balance_bhat",
    "situ_gate", "situ_up", "situ_glu", "situ_ffn", "rmsnorm", "l2norm",
    "DenseFFNParams", "LatentMoEParams", "MLAParams", "KDAParams", "LayerParams",
    "init_dense_ffn", "init_latent_moe", "init_mla", "init_kda", "init_layer",
    "dense_ffn", "latent_moe", "attn_res_weights", "attn_res", "mla",
    "short_conv", "kda_prepare", "kda_recurrent", "kda_chunked", "kda", "layer", "layer_trace",
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


def silu(x) -> np.ndarray:
    """``x * sigmoid(x)``, elementwise."""
    x = _f64(x)
    return x * sigmoid(x)


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


# ----------------------------------------------------------------------------------------
# SiTU-GLU and norms
# ----------------------------------------------------------------------------------------
def situ_gate(g, beta1: float) -> np.ndarray:
    """SiTU gate ``beta1 tanh(g / beta1) sigmoid(g)``: SiLU with its linear factor capped.

    Elementwise; the range is ``[-0.2698, beta1]`` for ``beta1 = 4`` (minimum near
    ``g = -1.219``).
    """
    g = _f64(g)
    return beta1 * np.tanh(g / beta1) * sigmoid(g)


def situ_up(u, beta2: float) -> np.ndarray:
    """SiTU up factor ``beta2 tanh(u / beta2)``, elementwise, in ``(-beta2, beta2)``."""
    u = _f64(u)
    return beta2 * np.tanh(u / beta2)


def situ_glu(g, u, cfg: KpuConfig) -> np.ndarray:
    """``h = situ_gate(g, beta1) * situ_up(u, beta2)``, elementwise; ``|h| <= beta1 beta2``."""
    return situ_gate(g, cfg.beta1) * situ_up(u, cfg.beta2)


def situ_ffn(x, W_gate, W_up, W_down, cfg: KpuConfig) -> np.ndarray:
    """SiTU-GLU FFN ``W_down situ_glu(W_gate x, W_up x)``.

    Parameters
    ----------
    x : ``[T, n]``.
    W_gate, W_up : ``[f, n]``.
    W_down : ``[n_out, f]``.

    Returns
    -------
    ``[T, n_out]``.
    """
    x = _f64(x)
    return situ_glu(x @ _f64(W_gate).T, x @ _f64(W_up).T, cfg) @ _f64(W_down).T


def rmsnorm(x, weight=None, eps: float = 1e-5) -> np.ndarray:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis.

    ``x``: ``[..., n]``; ``weight``: ``[n]`` or ``None`` (no weight).
    """
    x = _f64(x)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * _f64(weight)


def l2norm(x, eps: float = 1e-6) -> np.ndarray:
    """``x / sqrt(sum(x**2) + eps)`` over the last axis (the eps sits inside the root)."""
    x = _f64(x)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


# ----------------------------------------------------------------------------------------
# Parameters and the memory guard
# ----------------------------------------------------------------------------------------
#: Largest parameter count (float64 values, 2 GiB) the ``init_*`` functions allocate. A
#: full K3 layer is far above it (896 experts alone hold ~3e10 values); at K3 widths use
#: :func:`router`, :func:`quantile_balance` and one expert (:func:`situ_ffn`) directly.
MAX_PARAMS = 2 ** 28


def _check_budget(cfg: KpuConfig, what: str, count: int):
    if count > MAX_PARAMS:
        raise ValueError(
            f"{what} of profile {cfg.name!r} has {count:,} float64 parameters "
            f"({count * 8 / 2 ** 30:.1f} GiB), over the golden model's limit MAX_PARAMS = "
            f"{MAX_PARAMS:,} (2 GiB). At these widths the router, topk_stable, "
            f"quantile_balance and a single expert (situ_ffn) work; run whole blocks and "
            f"layers on a smaller profile ('tiny', 'small')")


class _Params:
    """Base of the parameter dataclasses: shapes from the config, shape checks, init."""

    @staticmethod
    def shapes(cfg: KpuConfig) -> dict[str, tuple[int, ...]]:
        raise NotImplementedError

    @classmethod
    def n_params(cls, cfg: KpuConfig) -> int:
        """Number of float64 values the parameters of ``cfg`` hold."""
        return sum(math.prod(shape) for shape in cls.shapes(cfg).values())

    def check(self, cfg: KpuConfig):
        """Raise ValueError naming the first array whose shape does not match ``cfg``."""
        for name, shape in self.shapes(cfg).items():
            got = np.shape(getattr(self, name))
            if got != shape:
                raise ValueError(f"{type(self).__name__}.{name} has shape {got}; "
                                 f"profile {cfg.name!r} needs {shape}")

    @classmethod
    def _init(cls, cfg: KpuConfig, rng: np.random.Generator, special=None):
        """Random parameters: ``W*`` ~ N(0, 1/fan_in), ``*norm`` ~ 1 + 0.1 N(0, 1),
        the others from ``special[name](shape)``."""
        _check_budget(cfg, cls.__name__, cls.n_params(cfg))
        special = special or {}
        arrays = {}
        for name, shape in cls.shapes(cfg).items():
            if name in special:
                arrays[name] = _f64(special[name](shape))
            elif name.startswith("W"):
                arrays[name] = rng.standard_normal(shape) / math.sqrt(shape[-1])
            elif name.endswith("norm"):
                arrays[name] = 1.0 + 0.1 * rng.standard_normal(shape)
            else:  # pragma: no cover - a new field without an init rule is a bug here
                raise NotImplementedError(f"no init rule for {cls.__name__}.{name}")
        return cls(**arrays)


@dataclass(frozen=True)
class DenseFFNParams(_Params):
    """Dense SiTU-GLU FFN of the first ``dense_layers`` layers.

    Members: ``W_gate``, ``W_up`` ``[d_dense, d]``; ``W_down`` ``[d, d_dense]``.
    """

    W_gate: np.ndarray
    W_up: np.ndarray
    W_down: np.ndarray

    @staticmethod
    def shapes(cfg):
        d, f = cfg.d_model, cfg.d_dense
        return {"W_gate": (f, d), "W_up": (f, d), "W_down": (d, f)}


@dataclass(frozen=True)
class LatentMoEParams(_Params):
    """LatentMoE block (K3 form).

    Members
    -------
    W_down_lat : ``[l, d]`` latent down-projection.
    W_r : ``[E, d]`` router (on the full-width ``x``).
    bias : ``[E]`` selection bias.
    W_gate, W_up : ``[E, d_expert, l]`` routed experts.
    W_down : ``[E, l, d_expert]``.
    norm : ``[l]`` latent RMSNorm weight.
    W_up_lat : ``[d, l]`` latent up-projection.
    Ws_gate, Ws_up : ``[d_shared, d]`` fused shared expert.
    Ws_down : ``[d, d_shared]``.
    """

    W_down_lat: np.ndarray
    W_r: np.ndarray
    bias: np.ndarray
    W_gate: np.ndarray
    W_up: np.ndarray
    W_down: np.ndarray
    norm: np.ndarray
    W_up_lat: np.ndarray
    Ws_gate: np.ndarray
    Ws_up: np.ndarray
    Ws_down: np.ndarray

    @staticmethod
    def shapes(cfg):
        d, lat, n_exp, f, fs = cfg.d_model, cfg.d_latent, cfg.n_experts, cfg.d_expert, cfg.d_shared
        return {"W_down_lat": (lat, d), "W_r": (n_exp, d), "bias": (n_exp,),
                "W_gate": (n_exp, f, lat), "W_up": (n_exp, f, lat), "W_down": (n_exp, lat, f),
                "norm": (lat,), "W_up_lat": (d, lat),
                "Ws_gate": (fs, d), "Ws_up": (fs, d), "Ws_down": (d, fs)}


@dataclass(frozen=True)
class MLAParams(_Params):
    """MLA without positions (gated). ``H`` heads, ``dn/dr/dv`` = nope/rope/v widths.

    Members
    -------
    W_qa : ``[q_lora_rank, d]``;  q_norm : ``[q_lora_rank]``;
    W_qb : ``[H (dn + dr), q_lora_rank]``;
    W_kva : ``[kv_lora_rank + dr, d]``;  kv_norm : ``[kv_lora_rank]``;
    W_kvb : ``[H (dn + dv), kv_lora_rank]``;
    W_g : ``[H dv, d]`` output gate;  W_o : ``[d, H dv]``.
    """

    W_qa: np.ndarray
    q_norm: np.ndarray
    W_qb: np.ndarray
    W_kva: np.ndarray
    kv_norm: np.ndarray
    W_kvb: np.ndarray
    W_g: np.ndarray
    W_o: np.ndarray

    @staticmethod
    def shapes(cfg):
        d, h = cfg.d_model, cfg.n_heads
        dn, dr, dv = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
        return {"W_qa": (rq, d), "q_norm": (rq,), "W_qb": (h * (dn + dr), rq),
                "W_kva": (rkv + dr, d), "kv_norm": (rkv,), "W_kvb": (h * (dn + dv), rkv),
                "W_g": (h * dv, d), "W_o": (d, h * dv)}


@dataclass(frozen=True)
class KDAParams(_Params):
    """Kimi Delta Attention. ``H`` heads of width ``K = kda_head_dim`` (keys and values).

    Members
    -------
    W_q, W_k, W_v : ``[H K, d]``;  conv_q, conv_k, conv_v : ``[H K, kda_conv]`` depthwise
    causal short-conv kernels (tap ``kda_conv - 1`` is the current token);
    W_f : ``[H K, d]`` forget-gate projection (Rule: full rank); A_log : ``[H]``;
    dt_bias : ``[H K]``; W_b : ``[H, d]`` (beta); o_norm : ``[K]`` per-head output RMSNorm
    weight (shared by the heads); W_gate : ``[H K, d]`` full-rank output gate;
    W_o : ``[d, H K]``.
    """

    W_q: np.ndarray
    W_k: np.ndarray
    W_v: np.ndarray
    conv_q: np.ndarray
    conv_k: np.ndarray
    conv_v: np.ndarray
    W_f: np.ndarray
    A_log: np.ndarray
    dt_bias: np.ndarray
    W_b: np.ndarray
    o_norm: np.ndarray
    W_gate: np.ndarray
    W_o: np.ndarray

    @staticmethod
    def shapes(cfg):
        d, h, kd, n = cfg.d_model, cfg.n_heads, cfg.kda_head_dim, cfg.kda_conv
        hk = h * kd
        return {"W_q": (hk, d), "W_k": (hk, d), "W_v": (hk, d),
                "conv_q": (hk, n), "conv_k": (hk, n), "conv_v": (hk, n),
                "W_f": (hk, d), "A_log": (h,), "dt_bias": (hk,), "W_b": (h, d),
                "o_norm": (kd,), "W_gate": (hk, d), "W_o": (d, hk)}


@dataclass(frozen=True)
class LayerParams:
    """One K3 layer.

    Members
    -------
    attn_norm, mlp_norm : ``[d]`` pre-norm weights of the mixer and FFN sublayers.
    q_attn, q_mlp : ``[d]`` Attention Residuals queries of the two sublayers.
    mixer : :class:`MLAParams` or :class:`KDAParams` (by ``cfg.is_mla_layer(L)``).
    ffn : :class:`DenseFFNParams` (``L < dense_layers``) or :class:`LatentMoEParams`.
    """

    attn_norm: np.ndarray
    mlp_norm: np.ndarray
    q_attn: np.ndarray
    q_mlp: np.ndarray
    mixer: MLAParams | KDAParams
    ffn: DenseFFNParams | LatentMoEParams


def init_dense_ffn(cfg: KpuConfig, rng: np.random.Generator) -> DenseFFNParams:
    """Random :class:`DenseFFNParams` (ValueError above :data:`MAX_PARAMS`)."""
    return DenseFFNParams._init(cfg, rng)


def init_latent_moe(cfg: KpuConfig, rng: np.random.Generator) -> LatentMoEParams:
    """Random :class:`LatentMoEParams`: weights N(0, 1/fan_in) (router logits ~ N(0, 1) for
    unit-RMS ``x``), norm weight ~ 1 + 0.1 N(0, 1), bias ~ 0.05 N(0, 1).

    Raises ValueError (never MemoryError) when the block holds more than
    :data:`MAX_PARAMS` values, e.g. for the ``k3`` profile.
    """
    return LatentMoEParams._init(cfg, rng, {"bias": lambda shape: 0.05 * rng.standard_normal(shape)})


def init_mla(cfg: KpuConfig, rng: np.random.Generator) -> MLAParams:
    """Random :class:`MLAParams` (ValueError above :data:`MAX_PARAMS`)."""
    return MLAParams._init(cfg, rng)


def init_kda(cfg: KpuConfig, rng: np.random.Generator) -> KDAParams:
    """Random :class:`KDAParams`: conv kernels N(0, 1/kda_conv), ``A_log = log U(1, 16)``
    (as Mamba/Kimi Linear), ``dt_bias`` ~ N(0, 1) (ValueError above :data:`MAX_PARAMS`)."""
    conv = {name: (lambda shape: rng.standard_normal(shape) / math.sqrt(shape[-1]))
            for name in ("conv_q", "conv_k", "conv_v")}
    return KDAParams._init(cfg, rng, {
        **conv,
        "A_log": lambda shape: np.log(rng.uniform(1.0, 16.0, shape)),
        "dt_bias": lambda shape: rng.standard_normal(shape),
    })


def _layer_parts(L: int, cfg: KpuConfig):
    if not 0 <= L < cfg.n_layers:
        raise ValueError(f"layer L = {L}: must be in [0, n_layers = {cfg.n_layers})")
    mixer = (MLAParams, init_mla) if cfg.is_mla_layer(L) else (KDAParams, init_kda)
    ffn = (DenseFFNParams, init_dense_ffn) if L < cfg.dense_layers else (LatentMoEParams, init_latent_moe)
    return mixer, ffn


def init_layer(L: int, cfg: KpuConfig, rng: np.random.Generator) -> LayerParams:
    """Random parameters of layer ``L`` (0-based): mixer and FFN by the K3 pattern, pre-norm
    weights ~ 1 + 0.1 N(0, 1), AttnRes queries ~ N(0, 1/d) (scores ~ N(0, 1)).

    Raises ValueError (never MemoryError) when the layer holds more than
    :data:`MAX_PARAMS` values (every ``k3`` layer does).
    """
    (mixer_cls, init_mixer), (ffn_cls, init_ffn) = _layer_parts(L, cfg)
    d = cfg.d_model
    count = mixer_cls.n_params(cfg) + ffn_cls.n_params(cfg) + 4 * d
    _check_budget(cfg, f"layer {L} ({mixer_cls.__name__[:-6]} + {ffn_cls.__name__[:-6]})", count)
    return LayerParams(
        attn_norm=1.0 + 0.1 * rng.standard_normal(d), mlp_norm=1.0 + 0.1 * rng.standard_normal(d),
        q_attn=rng.standard_normal(d) / math.sqrt(d), q_mlp=rng.standard_normal(d) / math.sqrt(d),
        mixer=init_mixer(cfg, rng), ffn=init_ffn(cfg, rng))


# ----------------------------------------------------------------------------------------
# FFNs
# ----------------------------------------------------------------------------------------
def dense_ffn(x, p: DenseFFNParams, cfg: KpuConfig) -> np.ndarray:
    """Dense SiTU-GLU FFN: ``[T, d] -> [T, d]``."""
    p.check(cfg)
    return situ_ffn(x, p.W_gate, p.W_up, p.W_down, cfg)


def latent_moe(x, p: LatentMoEParams, cfg: KpuConfig, eps: float | None = None):
    """LatentMoE block, K3 form::

        z   = x W_down_lat^T                                  # [T, l]
        u_t = sum_{j in idx_t} w_tj E_j(z_t)                  # SiTU-GLU experts in latent space
        y_t = W_up_lat RMSNorm_l(u_t) + E_shared(x_t)         # shared expert on full-width x

    Routing by :func:`router` on the full-width ``x``. Only the selected experts are
    evaluated (each on its own tokens). The latent RMSNorm acts once, on the weighted sum.

    Parameters
    ----------
    x : ``[T, d]``.
    p : :class:`LatentMoEParams` of ``cfg``.
    eps : latent RMSNorm epsilon; ``None`` means ``cfg.rms_eps`` (0 is allowed here).

    Returns
    -------
    y : ``[T, d]``.
    idx : int64 ``[T, k]`` and w : ``[T, k]`` the routing used.
    """
    p.check(cfg)
    x = _f64(x)
    eps = cfg.rms_eps if eps is None else eps
    idx, w, _ = router(x, p.W_r, p.bias, cfg)
    z = x @ p.W_down_lat.T
    u = np.zeros_like(z)
    for j in np.unique(idx):
        tok, slot = np.nonzero(idx == j)  # a token selects expert j at most once
        u[tok] += w[tok, slot, None] * situ_ffn(z[tok], p.W_gate[j], p.W_up[j], p.W_down[j], cfg)
    y = rmsnorm(u, p.norm, eps) @ p.W_up_lat.T + situ_ffn(x, p.Ws_gate, p.Ws_up, p.Ws_down, cfg)
    return y, idx, w


# ----------------------------------------------------------------------------------------
# Attention Residuals
# ----------------------------------------------------------------------------------------
def attn_res_weights(P, Bl, q, eps: float) -> np.ndarray:
    """Softmax weights over depth: ``[N, T]`` for the ``N = len(Bl) + 1`` candidates.

    ``K_n = V_n / sqrt(mean_d(V_n**2) + eps)``, ``s_n = K_n . q``, softmax over ``n``,
    separately for every token.
    """
    V = np.stack([_f64(v) for v in [*Bl, P]])
    K = rmsnorm(V, None, eps)
    s = K @ _f64(q)
    e = np.exp(s - s.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


def attn_res(P, Bl, q, eps: float) -> np.ndarray:
    """Attention Residuals (block form): ``h = sum_n softmax(s)_n V_n`` over the raw
    candidates ``V = Bl + [P]``.

    Parameters
    ----------
    P : ``[T, d]`` partial sum of the current block.
    Bl : list of ``[T, d]`` block representatives (``Bl[0]`` the embedding).
    q : ``[d]`` learned query of the sublayer.
    eps : RMSNorm epsilon of the keys.

    Returns
    -------
    h : ``[T, d]``.
    """
    a = attn_res_weights(P, Bl, q, eps)
    V = np.stack([_f64(v) for v in [*Bl, P]])
    return np.einsum("nt,ntd->td", a, V)


# ----------------------------------------------------------------------------------------
# MLA without positions
# ----------------------------------------------------------------------------------------
def mla(x, p: MLAParams, cfg: KpuConfig) -> np.ndarray:
    """Gated, causal MLA with no rotary embedding (NoPE)::

        q          = RMSNorm(x W_qa^T) W_qb^T            -> [T, H, dn + dr]
        [c_kv, k_r] = x W_kva^T                           (k_r [T, dr], shared, not rotated)
        [k_n, v]   = RMSNorm(c_kv) W_kvb^T               -> [T, H, dn + dv]
        score      = (q_nope . k_n + q_rope . k_r) / sqrt(dn + dr), causal
        y          = (softmax(score) v * sigmoid(x W_g^T)) W_o^T

    ``x``: ``[T, d]`` -> ``y``: ``[T, d]``.
    """
    p.check(cfg)
    x = _f64(x)
    T, H = x.shape[0], cfg.n_heads
    dn, dr, dv = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
    q = (rmsnorm(x @ p.W_qa.T, p.q_norm, cfg.rms_eps) @ p.W_qb.T).reshape(T, H, dn + dr)
    ckv = x @ p.W_kva.T
    c_kv, k_r = ckv[:, :cfg.kv_lora_rank], ckv[:, cfg.kv_lora_rank:]
    kv = (rmsnorm(c_kv, p.kv_norm, cfg.rms_eps) @ p.W_kvb.T).reshape(T, H, dn + dv)
    k_n, v = kv[..., :dn], kv[..., dn:]
    score = (np.einsum("thc,shc->hts", q[..., :dn], k_n)
             + np.einsum("thc,sc->hts", q[..., dn:], k_r)) / math.sqrt(dn + dr)
    score = np.where(np.tril(np.ones((T, T), dtype=bool)), score, -np.inf)
    a = np.exp(score - score.max(axis=-1, keepdims=True))
    a /= a.sum(axis=-1, keepdims=True)
    o = np.einsum("hts,shc->thc", a, v).reshape(T, H * dv)
    return (o * sigmoid(x @ p.W_g.T)) @ p.W_o.T


# ----------------------------------------------------------------------------------------
# KDA
# ----------------------------------------------------------------------------------------
def short_conv(x, w) -> np.ndarray:
    """Causal depthwise convolution: ``y[t, c] = sum_j w[c, j] x[t - (n-1) + j, c]``.

    ``x``: ``[T, C]``, ``w``: ``[C, n]`` (tap ``n - 1`` is the current token; zero padding
    before the first token) -> ``[T, C]``.
    """
    x, w = _f64(x), _f64(w)
    T, n = x.shape[0], w.shape[1]
    xp = np.concatenate([np.zeros((n - 1, x.shape[1])), x])
    return sum(w[:, j] * xp[j:j + T] for j in range(n))


def kda_prepare(x, p: KDAParams, cfg: KpuConfig):
    """The per-token KDA inputs of ``x`` ``[T, d]``::

        q, k, v = SiLU(ShortConv(x W_{q,k,v}^T)), q and k l2-normalised per head (eps l2_eps)
        g       = kda_gate_min * sigmoid(exp(A_log) * (x W_f^T + dt_bias))   # channel-wise
        beta    = sigmoid(x W_b^T)

    Returns ``q, k, v, g`` ``[T, H, K]`` and ``beta`` ``[T, H]``.
    """
    p.check(cfg)
    x = _f64(x)
    T, H, K = x.shape[0], cfg.n_heads, cfg.kda_head_dim

    def branch(W, conv):
        return silu(short_conv(x @ W.T, conv)).reshape(T, H, K)

    q = l2norm(branch(p.W_q, p.conv_q), cfg.l2_eps)
    k = l2norm(branch(p.W_k, p.conv_k), cfg.l2_eps)
    v = branch(p.W_v, p.conv_v)
    f = (x @ p.W_f.T + p.dt_bias).reshape(T, H, K)
    g = cfg.kda_gate_min * sigmoid(np.exp(p.A_log)[:, None] * f)
    beta = sigmoid(x @ p.W_b.T)
    return q, k, v, g, beta


def _kda_args(q, k, v, g, beta, S0):
    q, k, v, g, beta = (_f64(a) for a in (q, k, v, g, beta))
    T, H, K = k.shape
    if q.shape != k.shape or g.shape != k.shape or v.shape[:2] != (T, H) or beta.shape != (T, H):
        raise ValueError(f"kda: q {q.shape}, k {k.shape}, g {g.shape} must be [T, H, K], "
                         f"v {v.shape} [T, H, V], beta {beta.shape} [T, H]")
    S = np.zeros((H, K, v.shape[2])) if S0 is None else _f64(S0).copy()
    return q, k, v, g, beta, S


def kda_recurrent(q, k, v, g, beta, S0=None):
    """KDA by its definition, token by token, per head (state ``S [K, V]``)::

        S'  = Diag(exp(g_t)) S_{t-1}
        S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
        o_t = S_t^T q_t / sqrt(K)                 # read after the write

    Parameters
    ----------
    q, k, g : ``[T, H, K]``; v : ``[T, H, V]``; beta : ``[T, H]``.
    S0 : ``[H, K, V]`` initial state (zeros when ``None``).

    Returns
    -------
    o : ``[T, H, V]`` and the final state ``[H, K, V]``.
    """
    q, k, v, g, beta, S = _kda_args(q, k, v, g, beta, S0)
    o = np.empty_like(v)
    scale = 1.0 / math.sqrt(k.shape[2])
    for t in range(k.shape[0]):
        S = np.exp(g[t])[:, :, None] * S
        err = v[t] - np.einsum("hk,hkv->hv", k[t], S)
        S = S + beta[t][:, None, None] * k[t][:, :, None] * err[:, None, :]
        o[t] = np.einsum("hk,hkv->hv", q[t], S) * scale
    return o, S


def kda_chunked(q, k, v, g, beta, S0=None, chunk: int = 16):
    """KDA in chunks of ``chunk`` tokens (WY form); equal to :func:`kda_recurrent` to
    rounding. Same arguments and results.

    Inside a chunk, with ``G_r = sum_{i<=r} g_i`` (per channel) and pseudo-values
    ``u_r``, the state is ``S_r = Diag(e^{G_r}) S_0 + sum_{i<=r} (e^{G_r - G_i} * k_i) u_i^T``;
    the ``u`` solve the unit lower-triangular system
    ``u_r + beta_r sum_{i<r} A_ri u_i = beta_r (v_r - S_0^T (e^{G_r} * k_r))`` with
    ``A_ri = sum_c k_rc k_ic e^{G_rc - G_ic}``, and
    ``o_r = (S_0^T (e^{G_r} * q_r) + sum_{i<=r} B_ri u_i) / sqrt(K)``,
    ``B_ri = sum_c q_rc k_ic e^{G_rc - G_ic}``. Decays are formed as differences
    ``G_r - G_i <= 0``, never as ratios, so nothing overflows.
    """
    if not (isinstance(chunk, int) and chunk >= 1):
        raise ValueError(f"kda_chunked: chunk = {chunk!r} must be a positive integer")
    q, k, v, g, beta, S = _kda_args(q, k, v, g, beta, S0)
    T, H, K = k.shape
    o = np.empty_like(v)
    scale = 1.0 / math.sqrt(K)
    for start in range(0, T, chunk):
        sl = slice(start, min(start + chunk, T))
        qc, kc, vc, bc = q[sl], k[sl], v[sl], beta[sl]
        n = kc.shape[0]
        G = np.cumsum(g[sl], axis=0)                                    # [n, H, K]
        lower = np.tril(np.ones((n, n), dtype=bool))                      # i <= r
        strict = np.tril(np.ones((n, n), dtype=bool), -1)                 # i < r
        diff = G[:, None] - G[None, :]                                    # [r, i, H, K]
        dec_incl = np.exp(np.where(lower[:, :, None, None], diff, -np.inf))
        dec_strict = np.where(strict[:, :, None, None], dec_incl, 0.0)
        A = np.einsum("rhc,ihc,rihc->hri", kc, kc, dec_strict)
        B = np.einsum("rhc,ihc,rihc->hri", qc, kc, dec_incl)
        eG = np.exp(G)
        rhs = bc[:, :, None] * (vc - np.einsum("rhk,hkv->rhv", eG * kc, S))
        M = np.eye(n)[None] + bc.T[:, :, None] * A                       # [H, n, n]
        U = np.linalg.solve(M, rhs.transpose(1, 0, 2))                   # [H, n, V]
        o[sl] = ((np.einsum("rhk,hkv->hrv", eG * qc, S) + B @ U) * scale).transpose(1, 0, 2)
        S = (np.exp(G[-1])[:, :, None] * S
             + np.einsum("ihk,hiv->hkv", np.exp(G[-1][None] - G) * kc, U))
    return o, S


def kda(x, p: KDAParams, cfg: KpuConfig, chunk: int | None = None) -> np.ndarray:
    """KDA mixer ``[T, d] -> [T, d]``: :func:`kda_prepare`, the recurrence
    (:func:`kda_recurrent`, or :func:`kda_chunked` when ``chunk`` is given), then
    ``y = (RMSNorm_head(o) * sigmoid(x W_gate^T)) W_o^T``."""
    q, k, v, g, beta = kda_prepare(x, p, cfg)
    if chunk is None:
        o, _ = kda_recurrent(q, k, v, g, beta)
    else:
        o, _ = kda_chunked(q, k, v, g, beta, chunk=chunk)
    T = o.shape[0]
    o = rmsnorm(o, p.o_norm, cfg.rms_eps).reshape(T, -1)
    return (o * sigmoid(_f64(x) @ p.W_gate.T)) @ p.W_o.T


# ----------------------------------------------------------------------------------------
# The layer
# ----------------------------------------------------------------------------------------
def layer(L: int, P, Bl, params: LayerParams, cfg: KpuConfig):
    """Layer ``L`` (0-based) with the Attention Residuals bookkeeping of k3-spec::

        h = AR(P, Bl; q_attn) if Bl else P
        if L % attnres_block == 0: Bl.append(P); P = None
        a = Mixer_L(RMSNorm(h)); P = a if P is None else P + a
        h = AR(P, Bl; q_mlp)
        m = FFN_L(RMSNorm(h)); P = P + m

    Mixer: MLA when ``cfg.is_mla_layer(L)``, else KDA (recurrent form). FFN: dense for
    ``L < dense_layers``, else LatentMoE. Start the stack with ``P`` = the embedding and
    ``Bl = []``.

    Parameters
    ----------
    P : ``[T, d]`` running partial sum of the current block.
    Bl : list of ``[T, d]`` block representatives (not modified).
    params : :class:`LayerParams` of layer ``L`` (see :func:`init_layer`).

    Returns
    -------
    P : ``[T, d]`` and Bl : a new list.
    """
    t = layer_trace(L, P, Bl, params, cfg)
    return t["P"], t["Bl"]


def layer_trace(L: int, P, Bl, params: LayerParams, cfg: KpuConfig) -> dict:
    """Layer ``L`` as :func:`layer`, with its sublayers' inputs and outputs: a dict of ``mixer_in``
    (the mixer's input ``RMSNorm(h)``), ``a`` (the mixer's output), ``ffn_in`` (the FFN's input),
    ``m`` (the FFN's output), each ``[T, d]``, and ``P``, ``Bl`` (what :func:`layer` returns)."""
    (mixer_cls, _), (ffn_cls, _) = _layer_parts(L, cfg)
    for part, cls in ((params.mixer, mixer_cls), (params.ffn, ffn_cls)):
        if not isinstance(part, cls):
            raise ValueError(f"layer {L} of profile {cfg.name!r} needs {cls.__name__}, "
                             f"got {type(part).__name__}")
    eps = cfg.rms_eps
    P = _f64(P)
    Bl = list(Bl)
    h = attn_res(P, Bl, params.q_attn, eps) if Bl else P
    if L % cfg.attnres_block == 0:
        Bl.append(P)
        P = None
    mixer = mla if mixer_cls is MLAParams else kda
    x = rmsnorm(h, params.attn_norm, eps)
    a = mixer(x, params.mixer, cfg)
    P = a if P is None else P + a
    h = rmsnorm(attn_res(P, Bl, params.q_mlp, eps), params.mlp_norm, eps)
    m = dense_ffn(h, params.ffn, cfg) if ffn_cls is DenseFFNParams else latent_moe(h, params.ffn, cfg)[0]
    return {"mixer_in": x, "a": a, "ffn_in": h, "m": m, "P": P + m, "Bl": Bl}
