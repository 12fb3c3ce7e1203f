"""Router, stable top-k and Quantile Balancing of :mod:`golden.k3` (k3-spec invariants).

Random data come from fixed seeds (named in each test); hypothesis prints its own
falsifying examples.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from golden.k3 import expert_loads, quantile_balance, quantile_balance_bhat, router, sigmoid, topk_stable
from nanokpu.config import profile

TINY = profile("tiny")
FAST = settings(max_examples=40, deadline=None)


def _router_inputs(seed, cfg=TINY, T=32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, cfg.d_model))
    W_r = rng.standard_normal((cfg.n_experts, cfg.d_model)) / np.sqrt(cfg.d_model)
    b = 0.1 * rng.standard_normal(cfg.n_experts)
    return x, W_r, b


def _skewed_scores(seed, m=1024, E=64, skew=1.0):
    """Scores with a per-expert offset of spread ``skew``: a few experts win most tokens."""
    rng = np.random.default_rng(seed)
    return sigmoid(rng.standard_normal((m, E)) + skew * rng.standard_normal(E))


# ----------------------------------------------------------------------------------------
# top-k
# ----------------------------------------------------------------------------------------
@FAST
@given(keys=hnp.arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 12)),
                       elements=st.integers(-3, 3).map(float)),
       data=st.data())
def test_topk_stable_is_the_lower_index_tie_rule(keys, data):
    # Few distinct values: ties everywhere. Reference: sort by (-key, index).
    k = data.draw(st.integers(1, keys.shape[1]))
    idx = topk_stable(keys, k)
    for row, got in zip(keys, idx, strict=True):
        want = sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
        assert got.tolist() == want


def test_topk_all_equal_keys_pick_the_first_experts():
    assert topk_stable(np.full((3, 10), 0.25), 4).tolist() == [[0, 1, 2, 3]] * 3


def test_topk_rejects_bad_k_and_nan():
    with pytest.raises(ValueError, match="top_k"):
        topk_stable(np.zeros((2, 5)), 6)
    with pytest.raises(ValueError, match="top_k"):
        topk_stable(np.zeros((2, 5)), 0)
    with pytest.raises(ValueError, match="NaN"):
        topk_stable(np.array([[0.0, np.nan]]), 1)


# ----------------------------------------------------------------------------------------
# Router
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("scaling", [1.0, 2.5])
def test_router_weights_sum_to_routed_scaling(scaling):
    cfg = TINY.replace(routed_scaling=scaling)
    idx, w, s = router(*_router_inputs(seed=1), cfg)
    assert idx.shape == w.shape == (32, cfg.top_k)
    np.testing.assert_allclose(w.sum(axis=1), scaling, rtol=1e-12)
    assert np.all(w > 0)


def test_router_scores_are_sigmoid_of_full_width_logits_and_weights_renormalise_them():
    x, W_r, b = _router_inputs(seed=2)
    idx, w, s = router(x, W_r, b, TINY)
    np.testing.assert_allclose(s, 1.0 / (1.0 + np.exp(-(x @ W_r.T))), rtol=1e-13)
    sel = np.take_along_axis(s, idx, axis=1)  # unbiased scores
    np.testing.assert_allclose(w, sel / sel.sum(axis=1, keepdims=True), rtol=1e-13)
    # selection on s + b, in rank order
    keys = np.take_along_axis(s + b, idx, axis=1)
    assert np.all(np.diff(keys, axis=1) <= 0)
    others = np.ones_like(s, dtype=bool)
    np.put_along_axis(others, idx, False, axis=1)
    assert np.all(keys[:, -1] >= np.where(others, s + b, -np.inf).max(axis=1))


@FAST
@given(c=st.floats(-5, 5), seed=st.integers(0, 2 ** 16))
def test_router_bias_shift_changes_nothing(c, seed):
    x, W_r, b = _router_inputs(seed)
    idx0, w0, _ = router(x, W_r, b, TINY)
    idx1, w1, _ = router(x, W_r, b + c, TINY)
    np.testing.assert_array_equal(idx0, idx1)
    np.testing.assert_array_equal(w0, w1)


def test_router_weights_do_not_depend_on_bias_given_the_selection():
    # Two biases that force the same expert set {0..k-1} in different rank orders.
    cfg = TINY.replace(top_k=3)
    x, W_r, _ = _router_inputs(seed=3, cfg=cfg)
    b1 = np.zeros(cfg.n_experts)
    b1[:3] = [10.0, 20.0, 30.0]
    b2 = np.zeros(cfg.n_experts)
    b2[:3] = [31.0, 11.0, 12.0]
    weights = []
    for b in (b1, b2):
        idx, w, _ = router(x, W_r, b, cfg)
        assert set(idx.ravel().tolist()) == {0, 1, 2}
        per_expert = np.zeros((len(x), 3))
        np.put_along_axis(per_expert, idx, w, axis=1)
        weights.append(per_expert)
    np.testing.assert_allclose(weights[0], weights[1], rtol=1e-15)


def test_router_equal_scores_choose_the_lower_expert():
    x, W_r, b = _router_inputs(seed=4)
    b[:] = 0.0
    W_r[3] = W_r[5] = 10.0 * np.abs(W_r[0])  # experts 3 and 5: identical, dominant
    x = np.abs(x)
    for k, want in ((1, [3]), (2, [3, 5])):
        idx, _, s = router(x, W_r, b, TINY.replace(top_k=k))
        np.testing.assert_array_equal(s[:, 3], s[:, 5])
        assert idx.tolist() == [want] * len(x)


# ----------------------------------------------------------------------------------------
# Quantile Balancing
# ----------------------------------------------------------------------------------------
qb_cases = st.tuples(st.integers(0, 2 ** 16), st.sampled_from([(64, 8, 2), (96, 12, 3), (40, 10, 5)]))


@FAST
@given(case=qb_cases, bias_scale=st.floats(0, 2))
def test_qb_new_bias_has_zero_mean(case, bias_scale):
    seed, (m, E, k) = case
    rng = np.random.default_rng(seed)
    b_new = quantile_balance(rng.random((m, E)), bias_scale * rng.standard_normal(E), k)
    assert b_new.shape == (E,)
    assert abs(b_new.mean()) <= 1e-15 * max(1.0, np.abs(b_new).max())
    assert np.ptp(b_new) > 0  # not trivially zero


@FAST
@given(case=qb_cases, c=st.floats(-3, 3))
def test_qb_is_invariant_to_a_bias_shift(case, c):
    seed, (m, E, k) = case
    rng = np.random.default_rng(seed)
    s, b = rng.random((m, E)), 0.3 * rng.standard_normal(E)
    np.testing.assert_allclose(quantile_balance(s, b + c, k), quantile_balance(s, b, k), atol=1e-14)


def test_qb_cutoff_is_the_k_plus_1th_biased_score():
    rng = np.random.default_rng(5)
    m, E, k = 48, 12, 3
    s, b = rng.random((m, E)), 0.2 * rng.standard_normal(E)
    _, alpha, q = quantile_balance_bhat(s, b, k)
    assert q == m * k // E
    np.testing.assert_array_equal(alpha, [sorted(row, reverse=True)[k] for row in s + b])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_qb_fixed_cutoff_count_is_q_for_untied_experts(seed):
    s = _skewed_scores(seed, m=512, E=32)
    k, b = 4, np.zeros(32)
    bhat, alpha, q = quantile_balance_bhat(s, b, k)
    margin = s - alpha[:, None]                      # [m, E]
    ordered = -np.sort(-margin, axis=0)              # descending per expert
    untied = ordered[q - 1] > ordered[q]             # q-th and (q+1)-th order statistics differ
    wins = (margin > -bhat[None, :]).sum(axis=0)     # s_ij + bhat_j > alpha_i, cutoffs fixed
    assert untied.sum() >= 0.8 * len(untied)         # continuous data: most are untied
    np.testing.assert_array_equal(wins[untied], q)
    assert np.all(wins[~untied] < q)                 # a tied expert stays below q


def test_qb_reproduces_the_spec_example():
    # 1024 tokens, 64 experts, top-4 (q = 64); spec: [0, 462] -> [45, 103] -> [51, 80] -> [55, 75].
    m, E, k = 1024, 64, 4
    s, b, q = _skewed_scores(seed=0, m=m, E=E, skew=1.0), np.zeros(E), m * k // E
    history = []
    for _ in range(4):
        loads = expert_loads(s, b, k)
        assert loads.sum() == m * k
        history.append((loads.min(), loads.max()))
        b = quantile_balance(s, b, k)
    print("loads (min, max) per step:", history)
    (min0, max0), (min1, max1), _, (min3, max3) = history
    assert min0 == 0 and max0 > 5 * q                # skewed start
    assert max1 < 1.6 * q and min1 > 0.6 * q         # one step does most of the work
    assert [mx for _, mx in history] == sorted((mx for _, mx in history), reverse=True)
    assert max3 <= 1.25 * q and min3 >= 0.8 * q


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("skew", [0.5, 1.5, 3.0])
def test_qb_imbalance_does_not_grow_on_skewed_data(seed, skew):
    m, E, k = 512, 32, 4
    s, b, q = _skewed_scores(seed, m, E, skew), np.zeros(E), m * k // E
    imbalance = [expert_loads(s, b, k).max() / q]
    for _ in range(4):
        b = quantile_balance(s, b, k)
        imbalance.append(expert_loads(s, b, k).max() / q)
    assert imbalance[1] <= imbalance[0]
    assert imbalance[-1] < 1.5 < imbalance[0]


def test_qb_on_tied_scores():
    m, E, k = 256, 16, 2
    # all scores equal: every margin is 0, so bhat = 0 (the structural tie: no information)
    np.testing.assert_array_equal(quantile_balance(np.full((m, E), 0.5), np.zeros(E), k), 0.0)
    # scores on a coarse grid with a skew: ties everywhere, still finite, centred, improving
    s = np.round(_skewed_scores(seed=7, m=m, E=E, skew=1.0), 1)
    b, q = np.zeros(E), m * k // E
    first = expert_loads(s, b, k).max()
    for _ in range(3):
        b = quantile_balance(s, b, k)
        assert np.all(np.isfinite(b)) and abs(b.mean()) < 1e-15
    assert expert_loads(s, b, k).max() < first
    assert first > 2 * q


def test_qb_rejects_a_non_integer_target_load():
    with pytest.raises(ValueError, match="not an integer"):
        quantile_balance(np.zeros((100, 64)), np.zeros(64), 4)   # q = 6.25
    with pytest.raises(ValueError, match="k = 8"):
        quantile_balance(np.zeros((16, 8)), np.zeros(8), 8)      # no (k+1)-th score
    with pytest.raises(ValueError, match="must be"):
        quantile_balance(np.zeros((16, 8)), np.zeros(7), 2)


def test_k3_shapes_router_topk_and_quantile_balancing():
    cfg = profile("k3")
    rng = np.random.default_rng(6)
    m = 112                                           # q = 112 * 16 / 896 = 2
    x = rng.standard_normal((m, cfg.d_model))
    W_r = rng.standard_normal((cfg.n_experts, cfg.d_model)) / np.sqrt(cfg.d_model)
    b = 0.01 * rng.standard_normal(cfg.n_experts)
    idx, w, s = router(x, W_r, b, cfg)
    assert idx.shape == (m, 16) and s.shape == (m, 896)
    assert all(len(set(row)) == 16 for row in idx.tolist())
    np.testing.assert_allclose(w.sum(axis=1), cfg.routed_scaling, rtol=1e-12)
    bhat, alpha, q = quantile_balance_bhat(s, b, cfg.top_k)
    assert q == 2
    b_new = quantile_balance(s, b, cfg.top_k)
    assert abs(b_new.mean()) < 1e-15
    margin = s - alpha[:, None]
    ordered = -np.sort(-margin, axis=0)
    untied = ordered[q - 1] > ordered[q]
    np.testing.assert_array_equal((margin > -bhat).sum(axis=0)[untied], q)
