"""The integer MLA: causality, the online softmax's edge cases, cache carry and an integer reference
of a small case (the float comparison is in test_errors.py)."""

import dataclasses

import numpy as np
import pytest
from int_reference import exact_round

from golden import intops as I
from golden import k3
from golden import mla as M
from nanokpu.config import ONLINE_WIDTH, ROUNDING_MODES, profile

TINY = profile("tiny")
SF = TINY.score_frac
LO, HI = -(1 << (TINY.act_width - 1)), (1 << (TINY.act_width - 1)) - 1


def _mla(cfg, tokens, seed):
    rng = np.random.default_rng(seed)
    P = k3.init_mla(cfg, rng)
    x = rng.standard_normal((tokens, cfg.d_model))
    Q, x_q = M.quantize_mla(P, x, cfg)
    return Q, x_q


def test_quantize_mla_formats():
    Q, x_q = _mla(TINY, 8, 0)
    assert x_q.shape == (8, TINY.d_model) and np.max(np.abs(x_q)) == 127
    for name in ("W_qa", "W_qb", "W_kva", "W_kvb", "W_g", "W_o"):
        w = getattr(Q, name)
        assert w.dtype == np.int64 and np.max(np.abs(w)) == 127, name
    assert Q.rq_kvb.per_column and len(Q.rq_kvb.mult) == TINY.n_heads * (TINY.qk_nope_dim + TINY.v_head_dim)
    assert Q.rq_qa.width == Q.rq_ckv.width == Q.rq_score.width == Q.rq_o.width == TINY.act_width
    assert Q.rq_qb.width == Q.rq_kr.width == Q.rq_kvb.width == TINY.in_width
    assert Q.rq_g.width == TINY.router_logit_width
    y, cache = M.mla_int(x_q, Q, TINY)
    assert y.shape == (8, TINY.d_model)
    assert cache.n_kv.shape == (8, TINY.kv_lora_rank) and cache.k_r.shape == (8, TINY.qk_rope_dim)


def test_register_widths_hold_the_profiles_caches():
    """mla_max_tokens keeps l and acc inside ONLINE_WIDTH bits, and exceeds the tokens whose latent
    cache fills the data scratchpad of tiny (682) and small (1638); one key more is refused."""
    for name in ("tiny", "small"):
        cfg = profile(name)
        n = cfg.mla_max_tokens
        assert n == 4095
        assert n << (cfg.score_frac + cfg.in_width - 1) < 1 << (ONLINE_WIDTH - 1)
        assert (n + 1) << (cfg.score_frac + cfg.in_width - 1) >= 1 << (ONLINE_WIDTH - 1)
        assert cfg.dmem_depth // (cfg.kv_lora_rank + cfg.qk_rope_dim) <= n
    with pytest.raises(ValueError, match="mla_max_tokens"):
        M.online_softmax_int(np.zeros((1, 1, 4096), np.int64), np.zeros((4096, 1, 1), np.int64), [0], TINY)


def test_longest_row_stays_in_the_registers():
    """4095 equal keys of value -128 (the largest l and |acc|: 4095 * 2**12 and 4095 * 2**19, no
    rounding while the max never changes): o is exactly -128."""
    n = TINY.mla_max_tokens
    v = np.full((n, 1, 1), -128, np.int64)
    o = M.online_softmax_int(np.full((1, 1, n), 77, np.int64), v, [n - 1], TINY)
    assert o.tolist() == [[[-128 << SF]]]


def test_causal_mask():
    """Changing future tokens (to int8 extremes) changes nothing before them."""
    Q, x_q = _mla(TINY, 8, 1)
    y, _ = M.mla_int(x_q, Q, TINY)
    x2 = x_q.copy()
    x2[5:] = np.where(np.arange(TINY.d_model) % 2, 127, -128)
    y2, _ = M.mla_int(x2, Q, TINY)
    assert np.array_equal(y2[:5], y[:5])
    assert not np.array_equal(y2[5:], y[5:])


def test_single_key_weight_is_one():
    """One key: o = v exactly (score_frac fractional bits), whatever the score."""
    rng = np.random.default_rng(2)
    v = rng.integers(-128, 128, (1, 3, 8))
    for s in (LO, -1, 0, HI):
        o = M.online_softmax_int(np.full((3, 1, 1), s), v, [0], TINY)
        assert np.array_equal(o, v << SF)


def test_first_token_output_is_its_own_value():
    """In mla_int the first query sees one key: its attention output is its own v, so y[0] does not
    depend on the query projection (zeroing W_qb changes nothing)."""
    Q, x_q = _mla(TINY, 4, 3)
    y, _ = M.mla_int(x_q, Q, TINY)
    Q0 = dataclasses.replace(Q, W_qb=np.zeros_like(Q.W_qb))
    y0, _ = M.mla_int(x_q, Q0, TINY)
    assert np.array_equal(y0[0], y[0])
    assert not np.array_equal(y0[1:], y[1:])


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_equal_keys_give_the_mean(mode):
    """Equal scores: l = S 2**12 and acc = 2**12 sum v exactly, so o is the mean of v within the
    reciprocal's truncation (< 2**(8 + 12 - 16) = 16 units, RECIP_BITS) and one rounding:
    |o - 2**12 mean(v)| <= 16.5."""
    cfg = TINY.replace(rounding=mode)
    rng = np.random.default_rng(4)
    S = 24
    v = rng.integers(-128, 128, (S, 2, 8))
    v[:, 0] = 127
    o = M.online_softmax_int(np.full((2, S, S), -300), v, np.arange(S), cfg)
    for t in range(S):
        mean = v[:t + 1].sum(axis=0) * 2.0 ** SF / (t + 1)
        assert np.max(np.abs(o[t] - mean)) <= 16.5, (mode, t)
    assert np.all(o[:, 0] <= 127 << SF)


@pytest.mark.parametrize("where", [0, 5, 11])
def test_one_dominant_key(where):
    """One key 40 above the others (their exp rounds to 0): o = v of that key exactly, wherever it
    sits (first: the others add p = 0; later: the rescale alpha = 0 erases what came before)."""
    rng = np.random.default_rng(5)
    S = 12
    s = rng.integers(-2000, 2000, (2, 1, S))
    s[:, 0, where] = 2000 + 40 * 256
    v = rng.integers(-128, 128, (S, 2, 8))
    o = M.online_softmax_int(s, v, [S - 1], TINY)
    assert np.array_equal(o[0], v[where] << SF)


def test_extreme_values():
    """Scores at the act format's ends and values at int8's: no overflow, o within the values' range."""
    rng = np.random.default_rng(6)
    S = 32
    s = rng.choice([LO, HI], (2, S, S))
    v = rng.choice([-128, 127], (S, 2, 8))
    o = M.online_softmax_int(s, v, np.arange(S), TINY)
    assert o.min() >= -128 << SF and o.max() <= 127 << SF
    Q, _ = _mla(TINY, 4, 7)
    x_q = rng.choice([-128, 127], (16, TINY.d_model))
    y, cache = M.mla_int(x_q, Q, TINY)
    assert y.min() >= LO and y.max() <= HI
    assert np.abs(cache.n_kv).max() <= 128 and np.abs(cache.k_r).max() <= 128


#: Largest |online - two-pass| over the rows below, in v LSB (measured 0.137 on 20 seeds, S = 64).
ONLINE_VS_TWO_PASS = 0.2


@pytest.mark.parametrize("seed, sigma", [(0, 0.5), (6, 4.0), (14, 4.0), (15, 8.0)])
def test_online_agrees_with_two_pass(seed, sigma):
    """Against softmax_int (row max first, then one pass of exp) on the same scores: weights times v.
    The online path's exp of a difference is a product of two table values (rescale), each within 1.5
    score LSB, and each max change rounds l and acc once; both sides are within the exp table's error
    of the exact softmax. Measured 0.137 v LSB; asserted <= 0.2."""
    rng = np.random.default_rng(seed)
    H, S, dv = 2, 64, 8
    s = I.saturate(np.round(rng.standard_normal((H, S, S)) * sigma * 256).astype(np.int64), TINY.act_width)
    v = rng.integers(-128, 128, (S, H, dv))
    o = M.online_softmax_int(s, v, np.arange(S), TINY) / 2.0 ** SF
    worst = 0.0
    for t in range(S):
        for h in range(H):
            w = I.softmax_int(s[h, t, :t + 1], TINY)
            two_pass = (w[:, None] * v[:t + 1, h]).sum(axis=0) / 2.0 ** TINY.weight_frac
            worst = max(worst, float(np.max(np.abs(o[t, h] - two_pass))))
    assert worst <= ONLINE_VS_TWO_PASS, (seed, sigma, worst)


def test_permuting_earlier_keys_moves_o_by_rounding_only():
    """The spec's invariant (permuting tokens 0..t-1 leaves o_t unchanged) holds up to the order of
    the rescale roundings: 20 rows of 32 keys, 10 permutations each, move o by at most 0.059 v LSB
    (measured); asserted <= 0.1 (the two-pass softmax, which has no order, is within
    ONLINE_VS_TWO_PASS of either)."""
    worst = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        S, sigma = 32, (0.5, 2.0, 4.0, 8.0)[seed % 4]
        s = I.saturate(np.round(rng.standard_normal((2, 1, S)) * sigma * 256).astype(np.int64), TINY.act_width)
        v = rng.integers(-128, 128, (S, 2, 8))
        o = M.online_softmax_int(s, v, [S - 1], TINY)
        for _ in range(10):
            perm = np.r_[rng.permutation(S - 1), S - 1]
            worst = max(worst, int(np.max(np.abs(M.online_softmax_int(s[:, :, perm], v[perm], [S - 1], TINY) - o))))
    assert 0 < worst <= 0.1 * (1 << SF), worst


@pytest.mark.parametrize("name, scales", [("tiny", "tensor"), ("small", "tensor"), ("tiny", "channel")])
def test_decode_steps_equal_one_call(name, scales):
    """4 decode steps (one token each, cache carried) and a 1 + 3 split equal one causal call on the
    same 4 tokens, bit for bit, cache included (per-channel weights: per-column requantisers)."""
    cfg = profile(name, weight_scales=scales)
    Q, x_q = _mla(cfg, 4, 8)
    y, cache = M.mla_int(x_q, Q, cfg)
    steps, c = [], None
    for t in range(4):
        y_t, c = M.mla_int(x_q[t:t + 1], Q, cfg, c)
        steps.append(y_t)
    assert np.array_equal(np.concatenate(steps), y)
    assert np.array_equal(c.n_kv, cache.n_kv) and np.array_equal(c.k_r, cache.k_r)
    y1, c1 = M.mla_int(x_q[:1], Q, cfg)
    y3, c3 = M.mla_int(x_q[1:], Q, cfg, c1)
    assert np.array_equal(np.concatenate([y1, y3]), y)


def test_deterministic():
    """Quantising and running twice gives the same integers."""
    Q, x_q = _mla(TINY, 6, 9)
    Q2, x_q2 = _mla(TINY, 6, 9)
    assert np.array_equal(x_q, x_q2) and Q.rq_score == Q2.rq_score and Q.rq_kvb == Q2.rq_kvb
    assert np.array_equal(M.mla_int(x_q, Q, TINY)[0], M.mla_int(x_q2, Q2, TINY)[0])


def test_pure_nope_tracks_float():
    """qk_rope_dim = 0 (no shared key part): runs, empty k_r cache, cosine against float > 0.999."""
    cfg = TINY.replace(qk_rope_dim=0)
    rng = np.random.default_rng(10)
    P = k3.init_mla(cfg, rng)
    x = rng.standard_normal((16, cfg.d_model))
    Q, x_q = M.quantize_mla(P, x, cfg)
    y, cache = M.mla_int(x_q, Q, cfg)
    assert cache.k_r.shape == (16, 0)
    ref = k3.mla(x, P, cfg)
    got = y / 2.0 ** cfg.act_frac
    assert np.sum(got * ref) / (np.linalg.norm(got) * np.linalg.norm(ref)) > 0.999


def _requant(acc: int, rq, col: int, mode: str, width: int) -> int:
    mult = rq.mult[col] if rq.per_column else rq.mult
    shift = rq.shift[col] if rq.per_column else rq.shift
    lim = 1 << (width - 1)
    return max(-lim, min(lim - 1, exact_round(acc * mult, 1 << shift, mode)))


def _gemm(a, w, rq, mode):
    """Rows ``a`` times ``w^T`` in Python integers, requantised per column."""
    return [[_requant(sum(int(p) * int(q) for p, q in zip(row, wr, strict=True)), rq, j, mode, rq.width)
             for j, wr in enumerate(w.tolist())] for row in a]


def _online_ref(scores: list, values: list, cfg) -> list:
    """The online softmax of one query and head in Python integers, keys in list order: ``o`` (v
    units, score_frac fractional bits)."""
    mode = cfg.rounding

    def exp(d: int) -> int:
        return int(I.exp_q(np.array([max(LO, min(HI, d))]), cfg)[0])

    m, total, acc = LO, 0, [0] * len(values[0])
    for s, v in zip(scores, values, strict=True):
        m_new = max(m, s)
        alpha, p = exp(m - m_new), exp(s - m_new)
        total = exact_round(total * alpha, 1 << SF, mode) + p
        acc = [exact_round(a * alpha, 1 << SF, mode) + p * vc for a, vc in zip(acc, v, strict=True)]
        m = m_new
    b = total.bit_length() - 1
    recip = (1 << (b + M.RECIP_BITS)) // total
    return [exact_round(a * recip, 1 << (b + M.RECIP_BITS - SF), mode) for a in acc]


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_online_recurrence_in_key_order(mode):
    """Rising scores (the max changes at most keys, so l and acc are rounded at each rescale) against
    the recurrence in Python integers with keys in sequence order, every query position."""
    cfg = TINY.replace(rounding=mode)
    rng = np.random.default_rng(12)
    S = 16
    s = (np.arange(S) * 96 + rng.integers(-200, 200, (2, S, S)))
    v = rng.integers(-128, 128, (S, 2, 8))
    o = M.online_softmax_int(s, v, np.arange(S), cfg)
    for t in range(S):
        for h in range(2):
            assert o[t, h].tolist() == _online_ref(s[h, t, :t + 1].tolist(), v[:t + 1, h].tolist(), cfg), (t, h)


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_integer_reference(mode):
    """Six tokens of tiny in Python integers (RMSNorm, exp and sigmoid tables from intops): the
    projections, the per-column key/value requantiser, the scores, the online recurrence in key
    order with its final reciprocal, the gate and the output projection."""
    cfg = TINY.replace(rounding=mode)
    T = 6
    Q, x_q = _mla(cfg, T, 11)
    H, dn, dr, dv, rkv = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim, cfg.kv_lora_rank
    q_a = _gemm(x_q.tolist(), Q.W_qa, Q.rq_qa, mode)
    q = _gemm(I.rmsnorm_weight_int(np.array(q_a), Q.q_norm, Q.q_norm_shift, cfg).tolist(), Q.W_qb, Q.rq_qb, mode)
    c_kv = _gemm(x_q.tolist(), Q.W_kva[:rkv], Q.rq_ckv, mode)
    acc_kr = [[sum(int(p) * int(w) for p, w in zip(row, wr, strict=True)) for wr in Q.W_kva[rkv:].tolist()]
              for row in x_q.tolist()]
    k_r = [[_requant(a, Q.rq_kr, 0, mode, cfg.in_width) for a in row] for row in acc_kr]
    kv = _gemm(I.rmsnorm_weight_int(np.array(c_kv), Q.kv_norm, Q.kv_norm_shift, cfg).tolist(), Q.W_kvb, Q.rq_kvb,
               mode)
    g = I.sigmoid_q(np.array(_gemm(x_q.tolist(), Q.W_g, Q.rq_g, mode)), cfg).tolist()

    og = [[0] * (H * dv) for _ in range(T)]
    for t in range(T):
        for h in range(H):
            qh = q[t][h * (dn + dr):(h + 1) * (dn + dr)]
            keys = [kv[j][h * (dn + dv):h * (dn + dv) + dn] + k_r[j] for j in range(t + 1)]
            scores = [_requant(sum(a * b for a, b in zip(qh, key, strict=True)), Q.rq_score, 0, mode, cfg.act_width)
                      for key in keys]
            o = _online_ref(scores, [kv[j][h * (dn + dv) + dn:(h + 1) * (dn + dv)] for j in range(t + 1)], cfg)
            for c in range(dv):
                og[t][h * dv + c] = max(-128, min(127, exact_round(o[c] * g[t][h * dv + c], 1 << (2 * SF), mode)))
    want = _gemm(og, Q.W_o, Q.rq_o, mode)
    y, _ = M.mla_int(x_q, Q, cfg)
    assert y.tolist() == want


def test_gate_rounds_and_saturates():
    """gate_int: o * g / 2**(2 score_frac) rounded by the config's mode (ties both ways), saturated to
    in_width both ways; attend_int is the online softmax of one head through the gate (a single key:
    o is the key's value exactly)."""
    half, one = 1 << (SF - 1), 1 << SF
    o = np.array([3 << SF, 5 << SF, -(3 << SF), 127 << SF, -(128 << SF), 100 << SF])
    g = np.array([half, half, half, 2 * one - 1, 2 * one - 1, one])
    assert M.gate_int(o, g, TINY).tolist() == [2, 2, -2, 127, -128, 100]      # half_even: 1.5, 2.5, -1.5
    up = dataclasses.replace(TINY, rounding="half_up")
    assert M.gate_int(o, g, up).tolist() == [2, 3, -1, 127, -128, 100]
    v = np.array([[-7, 9]])
    assert M.attend_int([[123]], v, [[one, half]], TINY).tolist() == [[-7, 4]]
