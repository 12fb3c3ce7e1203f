"""The integer Attention Residuals: the spec's invariants, directed edge cases and an integer
reference of the whole dataflow (the float comparison is in test_errors.py)."""

import numpy as np
import pytest
from int_reference import exact_round

from golden import attn_res as A
from golden import intops as I
from nanokpu.config import ROUNDING_MODES, profile

TINY = profile("tiny")


LO, HI = -(1 << (TINY.act_width - 1)), (1 << (TINY.act_width - 1)) - 1


def _random(cfg, n_cand, tokens, seed, scale=512):
    rng = np.random.default_rng(seed)
    V = rng.integers(-scale, scale, (n_cand, tokens, cfg.d_model))
    q = 2.0 * rng.standard_normal(cfg.d_model) / np.sqrt(cfg.d_model)
    return list(V[:-1]), V[-1], A.quantize_attn_res(q, cfg)


def test_quantize_attn_res_formats():
    Bl, P, Q = _random(TINY, 2, 1, 0)
    assert Q.q.shape == (TINY.d_model,) and np.max(np.abs(Q.q)) == 127
    assert 1 << (TINY.mult_width - 1) <= Q.rq_score.mult < 1 << TINY.mult_width
    assert Q.rq_score.width == TINY.act_width


def test_one_candidate_is_identity():
    """Bl empty: the weight is exactly 1.0 and h = P, act-format extremes included."""
    _, P, Q = _random(TINY, 1, 8, 1, scale=1 << 15)
    P[0] = LO
    P[1] = HI
    P[2, ::2] = LO
    assert np.array_equal(A.attn_res_weights_int(P, [], Q, TINY), np.full((1, 8), 1 << TINY.weight_frac))
    assert np.array_equal(A.attn_res_int(P, [], Q, TINY), P)


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_equal_candidates(mode):
    """Three equal candidates: equal scores, each weight the 10922.5 tie rounded by the mode, and
    h = V * sum(w) / 2**weight_frac rounded once and saturated: within 2 LSB of V (half_up's weights
    sum to 32769, past 1.0: the largest V saturates)."""
    cfg = TINY.replace(rounding=mode)
    _, V, Q = _random(cfg, 1, 6, 2, scale=1 << 15)
    V[0] = HI
    V[1] = LO
    a = A.attn_res_weights_int(V, [V, V], Q, cfg)
    third = exact_round(21845 << 12, 1 << 13, mode)
    assert np.array_equal(a, np.full((3, 6), third))
    h = A.attn_res_int(V, [V, V], Q, cfg)
    want = [[max(LO, min(HI, exact_round(v * 3 * third, 1 << cfg.weight_frac, mode))) for v in row]
            for row in V.tolist()]
    assert h.tolist() == want
    assert np.max(np.abs(h - V)) <= 2


def test_zero_query_is_the_mean():
    """q = 0: every score is 0, the weights equal, h the plain mean within 1 weight LSB per candidate."""
    Bl, P, _ = _random(TINY, 4, 16, 3, scale=1 << 13)
    Q = A.quantize_attn_res(np.zeros(TINY.d_model), TINY)
    a = A.attn_res_weights_int(P, Bl, Q, TINY)
    assert np.all(a == a[0, 0])
    V = np.stack([*Bl, P])
    h = A.attn_res_int(P, Bl, Q, TINY)
    assert np.max(np.abs(h - V.mean(axis=0))) <= 0.5 + np.abs(V).sum(axis=0).max() / (1 << TINY.weight_frac)


def test_one_dominant_candidate():
    """A query along candidate 0 (score d/2), its negation (-d/2) and a zero candidate (score 0):
    the others' exp rounds to 0, so candidate 0's weight is exactly 1.0 and h = V_0."""
    u = np.random.default_rng(4).choice([-1, 1], TINY.d_model)
    Q = A.quantize_attn_res(0.5 * u, TINY)
    V0 = np.tile(3 * 256 * u, (5, 1))
    V0[1] = HI * u
    zero = np.zeros_like(V0)
    a = A.attn_res_weights_int(zero, [V0, -V0], Q, TINY)
    assert np.array_equal(a, np.stack([np.full(5, 1 << TINY.weight_frac), np.zeros(5), np.zeros(5)]))
    assert np.array_equal(A.attn_res_int(zero, [V0, -V0], Q, TINY), V0)


def test_extreme_candidates_stay_between_min_and_max():
    """Saturated streams (every value an act extreme): no overflow, the weights sum to 1.0 within
    N LSB, and each output lies between the candidates' min and max within the weight sum's excess."""
    rng = np.random.default_rng(5)
    V = rng.choice([LO, HI], (4, 32, TINY.d_model))
    Q = A.quantize_attn_res(rng.standard_normal(TINY.d_model), TINY)
    a = A.attn_res_weights_int(V[-1], list(V[:-1]), Q, TINY)
    assert np.all(np.abs(a.sum(axis=0) - (1 << TINY.weight_frac)) <= 4)
    h = A.attn_res_int(V[-1], list(V[:-1]), Q, TINY)
    excess = 0.5 + 4 * (1 << 15) / (1 << TINY.weight_frac)
    assert np.all(h >= V.min(axis=0) - excess) and np.all(h <= V.max(axis=0) + excess)
    assert h.min() >= LO and h.max() <= HI


def test_tokens_are_independent():
    """A token's result does not depend on the others (a transposed axis would mix them), and a
    second run gives the same integers."""
    Bl, P, Q = _random(TINY, 3, 12, 6)
    h = A.attn_res_int(P, Bl, Q, TINY)
    assert np.array_equal(A.attn_res_int(P, Bl, Q, TINY), h)
    for t in range(12):
        assert np.array_equal(A.attn_res_int(P[t:t + 1], [b[t:t + 1] for b in Bl], Q, TINY)[0], h[t])


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_integer_reference(mode):
    """Token by token with Python integers after the keys: score = requantised K . q, softmax
    (running max, exp table, one floor reciprocal), h = sum a_n V_n rounded once and saturated."""
    cfg = TINY.replace(rounding=mode)
    Bl, P, Q = _random(cfg, 3, 8, 7, scale=1 << 12)
    V = np.stack([*Bl, P])
    K = I.rmsnorm_int(V, cfg)
    r_bits = cfg.weight_frac + cfg.score_frac + 1
    h = A.attn_res_int(P, Bl, Q, cfg)
    for t in range(8):
        s = []
        for n in range(3):
            acc = sum(int(k) * int(q) for k, q in zip(K[n, t], Q.q, strict=True))
            s.append(max(LO, min(HI, exact_round(acc * Q.rq_score.mult, 1 << Q.rq_score.shift, mode))))
        m = max(s)
        e = [int(I.exp_q(np.array([v - m]), cfg)[0]) for v in s]
        recip = (1 << r_bits) // sum(e)
        a = [exact_round(v * recip, 1 << (r_bits - cfg.weight_frac), mode) for v in e]
        want = [max(LO, min(HI, exact_round(sum(a[n] * int(V[n, t, j]) for n in range(3)), 1 << cfg.weight_frac,
                                             mode))) for j in range(cfg.d_model)]
        assert h[t].tolist() == want, (mode, t)
