"""Float K3 layer of :mod:`golden.k3`: SiTU-GLU, norms, LatentMoE, Attention Residuals, MLA,
KDA, the layer and the memory guard (the router and Quantile Balancing are in
``test_k3_router.py``). Every test names its k3-spec invariant; seeds are fixed.
"""

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from golden import k3
from golden.k3 import (
    attn_res,
    attn_res_weights,
    init_kda,
    init_latent_moe,
    init_layer,
    init_mla,
    kda,
    kda_chunked,
    kda_prepare,
    kda_recurrent,
    l2norm,
    latent_moe,
    layer,
    mla,
    rmsnorm,
    router,
    short_conv,
    situ_ffn,
    situ_gate,
    situ_glu,
    situ_up,
)
from nanokpu.config import profile

TINY = profile("tiny")
FAST = settings(max_examples=40, deadline=None)
finite = st.floats(-1e6, 1e6, allow_nan=False)


def silu_ref(x):
    return x / (1.0 + np.exp(-x))


# ----------------------------------------------------------------------------------------
# SiTU-GLU
# ----------------------------------------------------------------------------------------
@FAST
@given(g=finite, u=finite)
def test_situ_output_is_bounded_by_beta1_beta2(g, u):
    assert abs(situ_glu(g, u, TINY)) <= TINY.beta1 * TINY.beta2 == 100


def test_situ_reaches_exactly_100_at_large_inputs():
    # float64: the gate rounds to 4 once g > ~76, the up factor to 25 once u > ~476
    assert situ_gate(77.0, 4.0) == 4.0 and situ_up(477.0, 25.0) == 25.0
    assert situ_glu(80.0, 480.0, TINY) == 100.0
    assert situ_glu(1e6, -1e6, TINY) == -100.0
    assert situ_glu(-1e6, 1e6, TINY) == 0.0         # the gate dies at -inf, as SiLU does
    assert abs(situ_glu(10.0, 10.0, TINY)) < 100.0


def test_situ_gate_range_and_minimum():
    g = np.concatenate([np.arange(-100.0, 100.0, 1e-3), np.arange(-1.3, -1.1, 1e-6)])
    gate = situ_gate(g, TINY.beta1)
    i = gate.argmin()
    assert abs(g[i] - (-1.219)) < 1e-3
    assert -0.2698 < gate[i] < -0.2697
    assert gate.max() == 4.0
    # so |h| < 6.75 whenever g < 0
    assert np.abs(situ_glu(g[g < 0], 1e6, TINY)).max() < 6.75


@FAST
@given(g=st.floats(1e-6, 30) | st.floats(-30, -1e-6), u=st.floats(1e-6, 1e4) | st.floats(-1e4, -1e-6))
def test_situ_sign_rule(g, u):
    assert np.sign(situ_glu(g, u, TINY)) == np.sign(g) * np.sign(u)


@FAST
@given(u=finite)
def test_situ_is_zero_at_zero_gate(u):
    assert situ_glu(0.0, u, TINY) == 0.0


def test_situ_becomes_swiglu_as_beta_grows():
    g, u = np.meshgrid(np.linspace(-8, 8, 81), np.linspace(-8, 8, 81))
    swiglu = silu_ref(g) * u
    errors = []
    for beta in (1e1, 1e2, 1e3, 1e4, 1e6):
        h = situ_gate(g, beta) * situ_up(u, beta)
        errors.append(np.abs(h - swiglu).max())
        assert errors[-1] <= 1.01 * np.abs(swiglu * (g ** 2 + u ** 2)).max() / (3 * beta ** 2)
    assert errors[-1] < 1e-8
    assert all(a > 50 * b for a, b in zip(errors, errors[1:], strict=False))  # ~ 1/beta^2


@FAST
@given(g=st.floats(0.01, 0.8) | st.floats(-0.8, -0.01), u=st.floats(0.01, 5) | st.floats(-5, -0.01))
def test_situ_small_input_deviation_from_swiglu(g, u):
    a, b = (g / TINY.beta1) ** 2, (u / TINY.beta2) ** 2
    rel = situ_glu(g, u, TINY) / (silu_ref(g) * u) - 1.0
    predicted = -(a + b) / 3
    assert abs(rel - predicted) <= (a + b) ** 2 / 4 + 1e-14


def test_situ_ffn_composes_the_projections():
    rng = np.random.default_rng(10)
    x, Wg, Wu, Wd = (rng.standard_normal(s) for s in ((5, 6), (7, 6), (7, 6), (4, 7)))
    y = situ_ffn(x, Wg, Wu, Wd, TINY)
    np.testing.assert_allclose(y, situ_glu(x @ Wg.T, x @ Wu.T, TINY) @ Wd.T, rtol=1e-14)


# ----------------------------------------------------------------------------------------
# Norms
# ----------------------------------------------------------------------------------------
def test_rmsnorm_and_l2norm_eps_placement():
    x = np.array([[3.0, 4.0]])
    np.testing.assert_allclose(rmsnorm(x, np.array([1.0, 2.0]), eps=0.0), [[3 / 12.5 ** 0.5, 8 / 12.5 ** 0.5]])
    np.testing.assert_allclose(rmsnorm(x, eps=2.5), x / np.sqrt(15.0))
    # l2norm: the eps sits inside the square root
    np.testing.assert_allclose(l2norm(np.array([1e-3, 0.0]), 1e-6), [1e-3 / np.sqrt(2e-6), 0.0])
    np.testing.assert_array_equal(l2norm(np.zeros(3), 1e-6), 0.0)


# ----------------------------------------------------------------------------------------
# LatentMoE
# ----------------------------------------------------------------------------------------
def _moe(seed, cfg=TINY, T=24):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((T, cfg.d_model)), init_latent_moe(cfg, rng)


def test_latent_moe_matches_the_k3_form_token_by_token():
    cfg = TINY
    x, P = _moe(seed=11)
    y, idx, w = latent_moe(x, P, cfg)
    for t in range(len(x)):
        s = 1.0 / (1.0 + np.exp(-(P.W_r @ x[t])))
        order = sorted(range(cfg.n_experts), key=lambda j: (-(s[j] + P.bias[j]), j))[:cfg.top_k]
        assert idx[t].tolist() == order
        z = P.W_down_lat @ x[t]
        u = sum(s[j] / sum(s[order]) * (P.W_down[j] @ situ_glu(P.W_gate[j] @ z, P.W_up[j] @ z, cfg))
                for j in order)
        normed = u / np.sqrt(np.mean(u ** 2) + cfg.rms_eps) * P.norm
        shared = P.Ws_down @ situ_glu(P.Ws_gate @ x[t], P.Ws_up @ x[t], cfg)
        np.testing.assert_allclose(y[t], P.W_up_lat @ normed + shared, rtol=1e-11, atol=1e-12)


@FAST
@given(c=st.floats(1e-3, 1e3), seed=st.integers(0, 1000))
def test_latent_moe_routing_weight_scale_invariance_with_eps_0(c, seed):
    x, P = _moe(seed)
    y1, idx1, _ = latent_moe(x, P, TINY, eps=0.0)
    yc, idxc, wc = latent_moe(x, P, TINY.replace(routed_scaling=c), eps=0.0)
    np.testing.assert_allclose(wc.sum(axis=1), c, rtol=1e-12)
    np.testing.assert_array_equal(idx1, idxc)
    np.testing.assert_allclose(yc, y1, rtol=1e-10, atol=1e-12)


def test_latent_moe_eps_breaks_scale_invariance_when_u_is_small():
    # with eps = 1e-5 the change is about eps / (c^2 mean(u^2)): large when u is small
    x, P = _moe(seed=12)
    tiny_experts = dataclasses.replace(P, W_down=1e-4 * P.W_down)
    y1, _, _ = latent_moe(x, tiny_experts, TINY)
    yc, _, _ = latent_moe(x, tiny_experts, TINY.replace(routed_scaling=0.1))
    assert np.abs(yc - y1).max() > 1e-2


def test_latent_moe_evaluates_only_selected_experts():
    x, P = _moe(seed=13, T=3)
    y, idx, _ = latent_moe(x, P, TINY)
    unused = np.setdiff1d(np.arange(TINY.n_experts), idx)
    assert len(unused) > 0
    poisoned = {name: getattr(P, name).copy() for name in ("W_gate", "W_up", "W_down")}
    for arr in poisoned.values():
        arr[unused] = np.nan
    y_poisoned, _, _ = latent_moe(x, dataclasses.replace(P, **poisoned), TINY)
    np.testing.assert_array_equal(y_poisoned, y)


def test_latent_moe_rejects_params_of_another_profile():
    x, P = _moe(seed=14)
    with pytest.raises(ValueError, match=r"LatentMoEParams\.W_down_lat has shape"):
        latent_moe(x, P, TINY.replace(d_latent=8))


# ----------------------------------------------------------------------------------------
# Attention Residuals
# ----------------------------------------------------------------------------------------
@FAST
@given(seed=st.integers(0, 2 ** 16), n=st.integers(1, 5), q_scale=st.floats(0, 30))
def test_attn_res_is_a_convex_combination(seed, n, q_scale):
    rng = np.random.default_rng(seed)
    scales = np.exp(rng.uniform(-3, 3, (n, 1, 1)))
    V = scales * rng.standard_normal((n, 6, 8))
    q = q_scale * rng.standard_normal(8)
    a = attn_res_weights(V[-1], list(V[:-1]), q, 1e-5)
    assert a.shape == (n, 6) and np.all(a >= 0)
    np.testing.assert_allclose(a.sum(axis=0), 1.0, rtol=1e-14)
    h = attn_res(V[-1], list(V[:-1]), q, 1e-5)
    tol = 1e-12 * np.abs(V).max()
    assert np.all(h >= V.min(axis=0) - tol) and np.all(h <= V.max(axis=0) + tol)


def test_attn_res_one_candidate_is_the_identity():
    rng = np.random.default_rng(15)
    P = rng.standard_normal((4, 8))
    np.testing.assert_array_equal(attn_res(P, [], rng.standard_normal(8), 1e-5), P)


def test_attn_res_zero_query_is_the_plain_mean():
    rng = np.random.default_rng(16)
    V = rng.standard_normal((3, 4, 8)) * np.array([0.1, 1.0, 10.0])[:, None, None]
    np.testing.assert_allclose(attn_res(V[2], [V[0], V[1]], np.zeros(8), 1e-5), V.mean(axis=0), rtol=1e-13)


def test_attn_res_scores_use_rms_normalised_keys_and_raw_values():
    rng = np.random.default_rng(17)
    B0, P, q = rng.standard_normal((4, 8)), rng.standard_normal((4, 8)), rng.standard_normal(8)
    eps = 1e-5
    key = [v / np.sqrt((v ** 2).mean(axis=1, keepdims=True) + eps) @ q for v in (B0, P)]
    a_P = 1.0 / (1.0 + np.exp(key[0] - key[1]))      # two candidates: softmax = sigmoid
    np.testing.assert_allclose(attn_res(P, [B0], q, eps), (1 - a_P)[:, None] * B0 + a_P[:, None] * P,
                               rtol=1e-12)
    # scaling a candidate leaves its weight unchanged (eps = 0): keys are normalised
    np.testing.assert_allclose(attn_res_weights(7.0 * P, [B0], q, 0.0), attn_res_weights(P, [B0], q, 0.0),
                               rtol=1e-12)


# ----------------------------------------------------------------------------------------
# MLA without positions
# ----------------------------------------------------------------------------------------
def _mla(seed, cfg=TINY, T=10):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((T, cfg.d_model)), init_mla(cfg, rng)


def _mla_loop_reference(x, p, cfg):
    """Per token and head, straight from the spec's MLA formulas."""
    H, dn, dr, dv, r = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim, cfg.kv_lora_rank

    def norm(v, w):
        return v / np.sqrt(np.mean(v ** 2) + cfg.rms_eps) * w

    y = []
    for t in range(len(x)):
        q = (p.W_qb @ norm(p.W_qa @ x[t], p.q_norm)).reshape(H, dn + dr)
        o = []
        for h in range(H):
            scores, values = [], []
            for s in range(t + 1):
                ckv = p.W_kva @ x[s]
                kv = (p.W_kvb @ norm(ckv[:r], p.kv_norm)).reshape(H, dn + dv)[h]
                scores.append((q[h, :dn] @ kv[:dn] + q[h, dn:] @ ckv[r:]) / np.sqrt(dn + dr))
                values.append(kv[dn:])
            e = np.exp(np.array(scores) - max(scores))
            o.append(e @ np.array(values) / e.sum())
        gate = 1.0 / (1.0 + np.exp(-(p.W_g @ x[t])))
        y.append(p.W_o @ (np.concatenate(o) * gate))
    return np.array(y)


@pytest.mark.parametrize("rope", [4, 0])
def test_mla_matches_the_per_head_loop_with_shared_unrotated_rope_key(rope):
    cfg = TINY.replace(qk_rope_dim=rope)   # rope = 0: pure NoPE (no shared key part at all)
    x, p = _mla(seed=18, cfg=cfg, T=6)
    assert p.W_kva.shape == (cfg.kv_lora_rank + rope, cfg.d_model)
    np.testing.assert_allclose(mla(x, p, cfg), _mla_loop_reference(x, p, cfg), rtol=1e-11, atol=1e-12)


def test_mla_is_causal():
    x, p = _mla(seed=19)
    y = mla(x, p, TINY)
    x2 = x.copy()
    x2[6:] = np.random.default_rng(20).standard_normal(x2[6:].shape)
    y2 = mla(x2, p, TINY)
    np.testing.assert_allclose(y2[:6], y[:6], rtol=1e-12, atol=1e-14)
    assert np.abs(y2[6:] - y[6:]).max() > 1e-3


@FAST
@given(perm_seed=st.integers(0, 2 ** 16))
def test_mla_output_ignores_the_order_of_earlier_tokens(perm_seed):
    x, p = _mla(seed=21)
    t = len(x) - 1
    perm = np.random.default_rng(perm_seed).permutation(t)
    y, y_perm = mla(x, p, TINY), mla(np.concatenate([x[perm], x[t:]]), p, TINY)
    np.testing.assert_allclose(y_perm[t], y[t], rtol=1e-11, atol=1e-13)


# ----------------------------------------------------------------------------------------
# KDA
# ----------------------------------------------------------------------------------------
def _kda_inputs(seed, T=13, H=2, K=4, V=3, g_min=-5.0):
    rng = np.random.default_rng(seed)
    q = l2norm(rng.standard_normal((T, H, K)))
    k = l2norm(rng.standard_normal((T, H, K)))
    v = rng.standard_normal((T, H, V))
    g = g_min * rng.random((T, H, K))
    beta = rng.random((T, H))
    return q, k, v, g, beta


BOTH = [kda_recurrent, lambda *a, **kw: kda_chunked(*a, **kw, chunk=4)]


@pytest.mark.parametrize("impl", BOTH, ids=["recurrent", "chunked"])
def test_kda_beta_zero_gives_zero_output(impl):
    q, k, v, g, beta = _kda_inputs(seed=22)
    o, S = impl(q, k, v, g, np.zeros_like(beta))
    np.testing.assert_array_equal(o, 0.0)
    np.testing.assert_array_equal(S, 0.0)


@pytest.mark.parametrize("impl", BOTH, ids=["recurrent", "chunked"])
def test_kda_beta_one_and_unit_query_equal_to_key_reads_back_v(impl):
    q, k, v, g, beta = _kda_inputs(seed=23)
    K = k.shape[2]
    k = l2norm(k * 3.0, 1e-6)   # |k| = 1 up to the l2norm eps
    o, _ = impl(k, k, v, g, np.ones_like(beta))
    np.testing.assert_allclose(o, v / np.sqrt(K), rtol=0, atol=1e-5 * np.abs(v).max())


def _deltanet(q, k, v, beta):
    """DeltaNet, written independently: S <- (I - beta k k^T) S + beta k v^T, o = S^T q / sqrt(K)."""
    T, H, K = k.shape
    o = np.zeros(v.shape)
    for h in range(H):
        S = np.zeros((K, v.shape[2]))
        for t in range(T):
            kt = k[t, h][:, None]
            S = (np.eye(K) - beta[t, h] * kt @ kt.T) @ S + beta[t, h] * kt @ v[t, h][None, :]
            o[t, h] = S.T @ q[t, h] / np.sqrt(K)
    return o


@pytest.mark.parametrize("impl", BOTH, ids=["recurrent", "chunked"])
def test_kda_zero_gate_reduces_to_deltanet(impl):
    q, k, v, _, beta = _kda_inputs(seed=24)
    o, _ = impl(q, k, v, np.zeros(k.shape), beta)
    np.testing.assert_allclose(o, _deltanet(q, k, v, beta), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("impl", BOTH, ids=["recurrent", "chunked"])
def test_kda_gate_decays_the_state_channel_wise(impl):
    # write k0 v0^T at t = 0 (beta = 1; g_0 decays the empty state), then only decay:
    # o_t = (q_t . (e^{G_t} * k0)) v0 / sqrt(K) with G_t = g_1 + ... + g_t
    q, k, v, g, beta = _kda_inputs(seed=25)
    beta = np.zeros_like(beta)
    beta[0] = 1.0
    o, _ = impl(q, k, v, g, beta)
    G = np.cumsum(g, axis=0) - g[0]
    want = np.einsum("thk,thk->th", q, np.exp(G) * k[0])[:, :, None] * v[0] / np.sqrt(k.shape[2])
    np.testing.assert_allclose(o, want, rtol=1e-12, atol=1e-15)


@FAST
@given(seed=st.integers(0, 2 ** 16), T=st.integers(1, 40), chunk=st.integers(1, 20))
def test_kda_chunked_matches_recurrent(seed, T, chunk):
    q, k, v, g, beta = _kda_inputs(seed, T=T)
    S0 = np.random.default_rng(seed).standard_normal((2, 4, 3))
    o_r, S_r = kda_recurrent(q, k, v, g, beta, S0)
    o_c, S_c = kda_chunked(q, k, v, g, beta, S0, chunk=chunk)
    np.testing.assert_allclose(o_c, o_r, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(S_c, S_r, rtol=1e-9, atol=1e-11)


def test_kda_chunked_rejects_a_bad_chunk():
    with pytest.raises(ValueError, match="chunk"):
        kda_chunked(*_kda_inputs(seed=26), chunk=0)


def test_short_conv_is_causal_with_kernel_kda_conv():
    w = np.arange(1.0, 9.0).reshape(2, 4)
    x = np.zeros((7, 2))
    x[1] = [1.0, -1.0]     # impulse at t = 1
    y = short_conv(x, w)
    np.testing.assert_array_equal(y[:1], 0.0)
    np.testing.assert_array_equal(y[1:5], np.stack([w[0, ::-1], -w[1, ::-1]], axis=1))
    np.testing.assert_array_equal(y[5:], 0.0)


def test_kda_prepare_gate_beta_and_normalisation():
    cfg = TINY
    rng = np.random.default_rng(27)
    x = rng.standard_normal((9, cfg.d_model))
    p = init_kda(cfg, rng)
    q, k, v, g, beta = kda_prepare(x, p, cfg)
    assert q.shape == k.shape == v.shape == g.shape == (9, cfg.n_heads, cfg.kda_head_dim)
    # g in (kda_gate_min, 0) exactly; float64 rounds sigmoid to 1 for large arguments
    assert np.all((g >= cfg.kda_gate_min) & (g < 0)) and np.all((beta > 0) & (beta < 1))
    assert np.mean((g > cfg.kda_gate_min + 1e-3) & (g < -1e-3)) > 0.3
    assert np.all(np.linalg.norm(k, axis=-1) <= 1.0)
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), 1.0, atol=1e-3)
    # W_f = 0: g = kda_gate_min * sigmoid(exp(A_log) * dt_bias), the same for every token
    fixed = dataclasses.replace(p, W_f=np.zeros_like(p.W_f), A_log=np.full(cfg.n_heads, np.log(2.0)),
                                dt_bias=np.full_like(p.dt_bias, 1.0))
    _, _, _, g0, _ = kda_prepare(x, fixed, cfg)
    np.testing.assert_allclose(g0, cfg.kda_gate_min / (1.0 + np.exp(-2.0)), rtol=1e-14)


def test_kda_mixer_output_stage_is_per_head_rmsnorm_and_sigmoid_gate():
    cfg = TINY.replace(n_heads=3)
    rng = np.random.default_rng(34)
    x = rng.standard_normal((5, cfg.d_model))
    p = init_kda(cfg, rng)
    o, _ = kda_recurrent(*kda_prepare(x, p, cfg))                      # [T, H, K]
    normed = o / np.sqrt((o ** 2).mean(axis=2, keepdims=True) + cfg.rms_eps) * p.o_norm
    gate = 1.0 / (1.0 + np.exp(-(x @ p.W_gate.T)))
    np.testing.assert_allclose(kda(x, p, cfg), (normed.reshape(5, -1) * gate) @ p.W_o.T, rtol=1e-12)


def test_kda_mixer_is_causal_and_chunked_form_agrees():
    cfg = TINY
    rng = np.random.default_rng(28)
    x = rng.standard_normal((11, cfg.d_model))
    p = init_kda(cfg, rng)
    y = kda(x, p, cfg)
    np.testing.assert_allclose(kda(x, p, cfg, chunk=3), y, rtol=1e-10, atol=1e-12)
    x2 = x.copy()
    x2[7:] += 1.0
    np.testing.assert_allclose(kda(x2, p, cfg)[:7], y[:7], rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------------------
# The layer
# ----------------------------------------------------------------------------------------
def test_layer_pattern_of_k3():
    cfg = profile("k3")
    mla_layers = [L for L in range(cfg.n_layers) if cfg.is_mla_layer(L)]
    assert mla_layers == [*range(3, 92, 4), 92] and cfg.n_layers - len(mla_layers) == 69


def _reference_layer(L, P, Bl, p, cfg):
    """The spec's "Layer L" pseudo-code, line by line, from the public blocks."""
    eps, Bl = cfg.rms_eps, list(Bl)
    h = attn_res(P, Bl, p.q_attn, eps) if Bl else P
    if L % cfg.attnres_block == 0:
        Bl.append(P)
        P = None
    mixer = mla if cfg.is_mla_layer(L) else kda
    a = mixer(rmsnorm(h, p.attn_norm, eps), p.mixer, cfg)
    P = a if P is None else P + a
    h = rmsnorm(attn_res(P, Bl, p.q_mlp, eps), p.mlp_norm, eps)
    if L < cfg.dense_layers:
        m = situ_ffn(h, p.ffn.W_gate, p.ffn.W_up, p.ffn.W_down, cfg)
    else:
        m = latent_moe(h, p.ffn, cfg)[0]
    return P + m, Bl


def test_layer_stack_follows_the_k3_pattern_and_attnres_bookkeeping():
    cfg = TINY
    rng = np.random.default_rng(29)
    P = rng.standard_normal((6, cfg.d_model))
    Bl = []
    for L in range(cfg.n_layers):
        p = init_layer(L, cfg, rng)
        assert isinstance(p.mixer, k3.MLAParams) == cfg.is_mla_layer(L)
        assert isinstance(p.ffn, k3.DenseFFNParams) == (L < cfg.dense_layers)
        P_new, Bl_new = layer(L, P, Bl, p, cfg)
        P_ref, Bl_ref = _reference_layer(L, P, Bl, p, cfg)
        assert len(Bl_new) == L // cfg.attnres_block + 1
        if L % cfg.attnres_block == 0:
            np.testing.assert_array_equal(Bl_new[-1], P)     # the finished block's sum
        assert len(Bl) == len(Bl_new) - (L % cfg.attnres_block == 0)  # input list untouched
        np.testing.assert_allclose(P_new, P_ref, rtol=1e-12, atol=1e-12)
        for a, b in zip(Bl_new, Bl_ref, strict=True):
            np.testing.assert_array_equal(a, b)
        P, Bl = P_new, Bl_new
        assert np.all(np.isfinite(P))


def test_layer_rejects_parameters_of_the_wrong_kind():
    rng = np.random.default_rng(30)
    p = init_layer(1, TINY, rng)                            # KDA + LatentMoE
    P = rng.standard_normal((4, TINY.d_model))
    with pytest.raises(ValueError, match="layer 3 .* needs MLAParams, got KDAParams"):
        layer(3, P, [P], p, TINY)
    with pytest.raises(ValueError, match="needs DenseFFNParams"):
        layer(0, P, [], p, TINY)
    with pytest.raises(ValueError, match="n_layers"):
        init_layer(TINY.n_layers, TINY, rng)


# ----------------------------------------------------------------------------------------
# K3 widths: one expert works, whole blocks and layers are refused
# ----------------------------------------------------------------------------------------
def test_one_expert_at_k3_widths():
    cfg = profile("k3")
    rng = np.random.default_rng(31)
    lat, f = cfg.d_latent, cfg.d_expert
    W_gate = rng.standard_normal((f, lat), dtype=np.float32) * np.float32(1 / np.sqrt(lat))
    W_up = rng.standard_normal((f, lat), dtype=np.float32) * np.float32(1 / np.sqrt(lat))
    W_down = rng.standard_normal((lat, f), dtype=np.float32) * np.float32(1 / np.sqrt(f))
    z = rng.standard_normal((4, lat))
    z[0] *= 1e3                                              # saturating token: |h| reaches 100
    y = situ_ffn(z, W_gate, W_up, W_down, cfg)
    assert y.shape == (4, lat) and y.dtype == np.float64 and np.all(np.isfinite(y))
    h = situ_glu(z @ W_gate.T.astype(np.float64), z @ W_up.T.astype(np.float64), cfg)
    assert np.abs(h).max() == 100.0
    np.testing.assert_allclose(y, h @ W_down.T.astype(np.float64), rtol=1e-12, atol=1e-9)


def test_k3_layers_and_blocks_are_refused_with_a_clear_error():
    cfg = profile("k3")
    rng = np.random.default_rng(32)
    count = k3.LatentMoEParams.n_params(cfg)
    with pytest.raises(ValueError) as info:
        init_latent_moe(cfg, rng)
    msg = str(info.value)
    assert "'k3'" in msg and f"{count:,}" in msg and "router" in msg and "situ_ffn" in msg
    for L in (0, 1, 3):
        with pytest.raises(ValueError, match=re.escape("profile 'k3'")):
            init_layer(L, cfg, rng)
    # just over the limit is refused, the small profiles are far below it
    over = profile("small", n_experts=k3.MAX_PARAMS // (3 * 128 * 128) + 1)
    with pytest.raises(ValueError, match="MAX_PARAMS"):
        init_latent_moe(over, rng)
    assert k3.LatentMoEParams.n_params(profile("small")) < k3.MAX_PARAMS


def test_small_profile_block_runs():
    cfg = profile("small")
    x, P = _moe(seed=33, cfg=cfg, T=16)
    y, idx, w = latent_moe(x, P, cfg)
    assert y.shape == x.shape and np.all(np.isfinite(y))
    np.testing.assert_array_equal(idx, router(x, P.W_r, P.bias, cfg)[0])
