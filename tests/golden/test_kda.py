"""The integer KDA (golden/kda.py): its tables over every input, l2norm edge cases, the recurrence
against a Python-integer reference and its special cases, decode steps chaining, the state bound, and
the error against the float mixer."""

import dataclasses
import math

import numpy as np
import pytest
from int_reference import exact_round

from golden import errors, k3
from golden import intops as I
from golden import kda as KD
from nanokpu.config import ROUNDING_MODES, profile

TINY = profile("tiny")
U = KD.unit_frac(TINY)
ONE = 1 << TINY.score_frac
XS = np.arange(-(1 << (TINY.act_width - 1)), 1 << (TINY.act_width - 1))


def clamp(v: int, width: int) -> int:
    return max(-(1 << (width - 1)), min((1 << (width - 1)) - 1, v))


# ---------------------------------------------------------------------------------------
# Tables, every input
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [TINY, profile("tiny", act_width=12, act_frac=6)], ids=["tiny", "act12"])
def test_silu_table_every_input(cfg):
    """Within 1 LSB of the correctly rounded SiLU and 1.5 LSB of the real value; 0 at 0, never below
    the minimum -0.2785 (rounded) and never above max(x, 0) + 1 LSB."""
    xs = np.arange(-(1 << (cfg.act_width - 1)), 1 << (cfg.act_width - 1))
    real = k3.silu(xs / 2.0 ** cfg.act_frac) * 2.0 ** cfg.act_frac
    got = I.silu_q(xs, cfg)
    assert np.max(np.abs(got - np.round(real))) <= 1
    assert np.max(np.abs(got - real)) <= 1.5
    assert got[xs == 0] == 0
    assert got.min() >= math.floor(-0.27847 * 2 ** cfg.act_frac) - 1
    assert np.all(got <= np.maximum(xs, 0) + 1)


def test_decay_table_every_input():
    """Within 1 LSB of the correctly rounded exp(kda_gate_min sigmoid(z)) and 1.5 LSB of the real value,
    non-increasing, exactly 1.0 where that rounds to 1.0 (g = 0: no decay) and exp(-5) at the top."""
    real = np.exp(TINY.kda_gate_min * k3.sigmoid(XS / 2.0 ** TINY.act_frac)) * ONE
    got = I.decay_q(XS, TINY)
    assert np.max(np.abs(got - np.round(real))) <= 1
    assert np.max(np.abs(got - real)) <= 1.5
    assert np.all(np.diff(got) <= 0)
    assert np.all(got[np.round(real) == ONE] == ONE) and got[0] == ONE
    assert got[-1] == round(math.exp(TINY.kda_gate_min) * ONE)


# ---------------------------------------------------------------------------------------
# l2norm
# ---------------------------------------------------------------------------------------
def test_l2norm_zero_row_and_one_hot_extremes():
    """A zero row gives 0 (the float eps is below the format); a one-hot row gives exactly +-1.0,
    act-format extremes included."""
    x = np.zeros((4, 8), dtype=np.int64)
    x[1, 3] = XS[0]
    x[2, 0] = XS[-1]
    x[3, 7] = 1
    y = I.l2norm_int(x, U, TINY)
    want = np.zeros_like(x)
    want[1, 3], want[2, 0], want[3, 7] = -(1 << U), 1 << U, 1 << U
    assert np.array_equal(y, want)


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_l2norm_ties_and_extreme_rows(mode):
    """Equal elements give equal outputs (all -32768: -2**U / sqrt(8) within 0.75 LSB); every row within
    0.75 LSB (floor: 1.25) of x / sqrt(sum x^2) * 2**U, from 1-LSB rows to saturated ones."""
    cfg = TINY.replace(rounding=mode)
    rng = np.random.default_rng(1)
    x = np.concatenate([np.full((1, 8), XS[0]), np.full((1, 8), XS[-1]), rng.choice([XS[0], XS[-1]], (50, 8)),
                        rng.integers(-1, 2, (50, 8)), rng.integers(XS[0], XS[-1] + 1, (200, 8))])
    y = I.l2norm_int(x, U, cfg)
    assert np.all(y[0] == y[0, 0]) and np.all(y[1] == y[1, 0])
    ss = np.sqrt((x.astype(np.float64) ** 2).sum(axis=1, keepdims=True))
    exact = np.where(ss > 0, x / np.maximum(ss, 1) * 2.0 ** U, 0.0)
    assert np.max(np.abs(y - exact)) <= (1.25 if mode == "floor" else 0.75)
    assert np.abs(y).max() <= (1 << U) + 1


def test_l2norm_sign_symmetry_and_scale():
    """half_even rounds symmetrically: l2norm(-x) = -l2norm(x); l2norm(4x) within 1 LSB of l2norm(x)."""
    x = np.random.default_rng(2).integers(-2000, 2000, (300, 8))
    y = I.l2norm_int(x, U, TINY)
    assert np.array_equal(I.l2norm_int(-x, U, TINY), -y)
    assert np.max(np.abs(I.l2norm_int(4 * x, U, TINY) - y)) <= 1


# ---------------------------------------------------------------------------------------
# The recurrence
# ---------------------------------------------------------------------------------------
def _mixer(cfg=TINY, tokens=8, seed=0, **params):
    rng = np.random.default_rng(seed)
    P = k3.init_kda(cfg, rng)
    P = dataclasses.replace(P, **params)
    x = rng.standard_normal((tokens, cfg.d_model))
    Q, x_q = KD.quantize_kda(P, x, cfg)
    return P, x, Q, x_q


def _step_inputs(rng, H=TINY.n_heads, K=TINY.kda_head_dim):
    S = rng.integers(-(1 << 20), 1 << 20, (H, K, K))
    q = I.l2norm_int(rng.integers(-3000, 3000, (H, K)), U, TINY)
    k = I.l2norm_int(rng.integers(-3000, 3000, (H, K)), U, TINY)
    v = rng.integers(-3000, 3000, (H, K))
    decay = rng.integers(0, ONE + 1, (H, K))
    beta = rng.integers(0, ONE + 1, H)
    return S, q, k, v, decay, beta


def test_quantize_kda_formats():
    _, _, Q, x_q = _mixer()
    assert x_q.dtype == np.int64 and np.max(np.abs(x_q)) == 127
    for proj in (Q.proj_q, Q.proj_k, Q.proj_v, Q.proj_f, Q.proj_b, Q.proj_gate, Q.proj_o, Q.conv_q):
        assert np.max(np.abs(proj.W)) <= 127
    assert Q.rq_read.width == TINY.act_width and 0 <= Q.o_frac <= KD.state_frac(TINY)
    assert Q.proj_f.rq.per_column and len(Q.proj_f.rq.mult) == TINY.n_heads * TINY.kda_head_dim


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_step_integer_reference(mode):
    """One step for every head, with Python integers: decay, S^T k, beta k, the saturating rank-1
    update, the read after the write and its requantiser."""
    cfg = TINY.replace(rounding=mode)
    _, _, Q, _ = _mixer(cfg)
    S, q, k, v, decay, beta = _step_inputs(np.random.default_rng(3))
    S_new, o = KD.kda_step_int(S, q, k, v, decay, beta, Q, cfg)
    K, u, sf, w = cfg.kda_head_dim, 1 << U, ONE, KD.state_width(cfg)
    rq = Q.rq_read
    for h in range(cfg.n_heads):
        S1 = [[exact_round(int(decay[h, c]) * int(S[h, c, j]), sf, mode) for j in range(K)] for c in range(K)]
        pred = [exact_round(sum(int(k[h, c]) * S1[c][j] for c in range(K)), u, mode) for j in range(K)]
        e = [(int(v[h, j]) << (KD.state_frac(cfg) - cfg.act_frac)) - pred[j] for j in range(K)]
        bk = [exact_round(int(beta[h]) * int(k[h, c]), sf, mode) for c in range(K)]
        S2 = [[clamp(S1[c][j] + exact_round(bk[c] * e[j], u, mode), w) for j in range(K)] for c in range(K)]
        read = [exact_round(sum(int(q[h, c]) * S2[c][j] for c in range(K)), u, mode) for j in range(K)]
        want_o = [clamp(exact_round(r * rq.mult, 1 << rq.shift, mode), rq.width) for r in read]
        assert S_new[h].tolist() == S2, (mode, h)
        assert o[h].tolist() == want_o, (mode, h)


def test_no_decay_no_update():
    """g = 0 (decay exactly 1.0) and beta = 0: the state is unchanged and o its read-out; beta = 0 with
    decay keeps only the decayed state."""
    _, _, Q, _ = _mixer()
    S, q, k, v, decay, _ = _step_inputs(np.random.default_rng(4))
    zero = np.zeros(TINY.n_heads, dtype=np.int64)
    S1, o = KD.kda_step_int(S, q, k, v, np.full_like(decay, ONE), zero, Q, TINY)
    assert np.array_equal(S1, S)
    read = I.round_shift(np.einsum("hk,hkv->hv", q, S), U, TINY.rounding)
    assert np.array_equal(o, Q.rq_read(read, TINY))
    S2, _ = KD.kda_step_int(S, q, k, v, decay, zero, Q, TINY)
    assert np.array_equal(S2, I.round_shift(decay[:, :, None] * S, TINY.score_frac, TINY.rounding))


def test_strong_decay_forgets_and_writes_k_v():
    """Decay 0 (the state forgotten), beta = 1, q = k one-hot: S = k v^T exactly (v in the state
    format) and o = v / sqrt(K) in o's format, within the requantiser's rounding."""
    _, _, Q, _ = _mixer()
    rng = np.random.default_rng(5)
    S = rng.integers(-(1 << 25), 1 << 25, (2, 8, 8))
    k = np.zeros((2, 8), dtype=np.int64)
    k[0, 2], k[1, 5] = 1 << U, -(1 << U)
    lim = 1 << (TINY.act_width - 1 + TINY.act_frac - Q.o_frac)     # o unsaturated
    v = rng.integers(-lim, lim, (2, 8))
    S1, o = KD.kda_step_int(S, k, k, v, np.zeros((2, 8), dtype=np.int64), np.full(2, ONE), Q, TINY)
    want = (k[:, :, None] >> U) * (v[:, None, :] << (KD.state_frac(TINY) - TINY.act_frac))
    assert np.array_equal(S1, want)
    real = v * 2.0 ** (Q.o_frac - TINY.act_frac) / math.sqrt(TINY.kda_head_dim)
    assert np.max(np.abs(o - real)) <= 0.5 + np.abs(real).max() * 2.0 ** -(TINY.mult_width - 1)


def test_strong_decay_through_the_mixer():
    """dt_bias = +1e3 (the gate logit saturates high): every decay is exp(kda_gate_min) rounded; dt_bias =
    -1e3: exactly 1.0 (g = 0, DeltaNet)."""
    for dt, want in ((1e3, round(math.exp(TINY.kda_gate_min) * ONE)), (-1e3, ONE)):
        P, _, Q, x_q = _mixer(dt_bias=np.full(TINY.n_heads * TINY.kda_head_dim, dt))
        assert np.all(I.decay_q(Q.proj_f(x_q, TINY, Q.f_bias), TINY) == want), dt


def test_state_bound_under_the_delta_rule():
    """Adversarial inputs (decay 1.0, beta 1.0, v at the act-format extremes, fresh unit k each token,
    64 tokens): each column norm of S stays within sqrt(sum_t beta v_j^2) (the module's bound) plus the
    rounding of each step, and far below the state format's range."""
    _, _, Q, _ = _mixer()
    rng = np.random.default_rng(6)
    H, K = TINY.n_heads, TINY.kda_head_dim
    S = np.zeros((H, K, K), dtype=np.int64)
    bound_sq = np.zeros((H, K))
    for _ in range(64):
        k = I.l2norm_int(rng.integers(-3000, 3000, (H, K)), U, TINY)
        v = rng.choice([XS[0], XS[-1]], (H, K))
        S, _ = KD.kda_step_int(S, k, k, v, np.full((H, K), ONE), np.full(H, ONE), Q, TINY)
        bound_sq += (v * 2.0 ** -TINY.act_frac) ** 2
    col = np.sqrt(((S * 2.0 ** -KD.state_frac(TINY)) ** 2).sum(axis=1))
    assert np.all(col <= np.sqrt(bound_sq) * 1.001 + 64 * K * 2.0 ** -KD.state_frac(TINY))
    assert np.abs(S).max() < 1 << (KD.state_width(TINY) - 4)


def test_decode_steps_chain():
    """Four one-token calls, each from the previous state (the conv tail included), equal one call over
    the four tokens, bit for bit; a second run gives the same integers."""
    _, _, Q, x_q = _mixer(tokens=4, seed=7)
    y, state = KD.kda_int(x_q, Q, TINY)
    st = None
    for t in range(4):
        y_t, st = KD.kda_int(x_q[t:t + 1], Q, TINY, st)
        assert np.array_equal(y_t[0], y[t]), t
    assert np.array_equal(st.S, state.S) and np.array_equal(st.conv, state.conv)
    y2, state2 = KD.kda_int(x_q, Q, TINY)
    assert np.array_equal(y2, y) and np.array_equal(state2.S, state.S)


def test_state_carries_history():
    """The state matters: the last token from a zero state differs from the same token after three."""
    _, _, Q, x_q = _mixer(tokens=4, seed=8)
    y, _ = KD.kda_int(x_q, Q, TINY)
    y_alone, _ = KD.kda_int(x_q[3:], Q, TINY)
    assert not np.array_equal(y_alone[0], y[3])


# ---------------------------------------------------------------------------------------
# Error against the float path (docs/errors.md)
# ---------------------------------------------------------------------------------------
#: Measured (seed 0) max abs error of the KDA ops and their bounds, in LSB (docs/errors.md).
KDA_OPS = {"tiny": {"SiLU": (1.44, 1.5), "KDA decay": (0.77, 1.5), "l2norm": (4.03, 8.20)},
           "small": {"SiLU": (1.44, 1.5), "KDA decay": (0.77, 1.5), "l2norm": (0.62, 1.14)}}


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_kda_ops_within_bound(name):
    rows = {r.op: r for r in errors.kda_op_errors(profile(name), seed=0)}
    assert set(rows) == set(KDA_OPS[name])
    for op, (measured, bound) in KDA_OPS[name].items():
        assert rows[op].max_abs <= rows[op].bound, (name, op, rows[op])
        assert rows[op].max_lsb == pytest.approx(measured, abs=0.006), (name, op, rows[op])
        assert rows[op].bound / rows[op].lsb == pytest.approx(bound, abs=0.006), (name, op, rows[op])


#: (profile, seed) -> measured (cosine, max abs error of y) of kda_int against k3.kda, 64 tokens.
KDA_MEASURED = {("tiny", 0): (0.998546, 0.224), ("tiny", 1): (0.999048, 0.139),
                ("small", 0): (0.999009, 0.136), ("small", 1): (0.998562, 0.288)}


@pytest.mark.parametrize("name, seed", sorted(KDA_MEASURED))
def test_kda_tracks_float(name, seed):
    """Within 2e-5 of the measured cosine and 5 % of the measured max abs error."""
    e = errors.kda_errors(profile(name), seed=seed)
    cosine, max_abs = KDA_MEASURED[name, seed]
    assert e["cosine"] >= cosine - 2e-5, (name, seed, e)
    assert e["max_abs"] <= 1.05 * max_abs, (name, seed, e)


def test_l2norm_eps_word_is_added_to_the_sum_of_squares():
    """eps_q enters the sum of squares: with eps_q = 3 sum(x**2) every row is halved (within the
    bound); l2_eps_q is round(l2_eps 4**act_frac): 0 in Q16.8, 1 in Q16.10 (0.0655 and 1.05)."""
    x = np.random.default_rng(4).integers(-3000, 3000, (50, 8))
    x[0] = [1, 0, 0, 0, 0, 0, 0, 0]
    for row in x:
        ss = int((row * row).sum())
        y = I.l2norm_int(row, U, TINY, eps_q=3 * ss)
        assert np.max(np.abs(y - row / np.sqrt(4.0 * ss) * 2.0 ** U)) <= 0.75, row
    assert I.l2_eps_q(TINY) == 0 and I.l2_eps_q(profile("tiny", act_frac=10)) == 1
    assert np.array_equal(I.l2norm_int(x, U, TINY, eps_q=0), I.l2norm_int(x, U, TINY))


def test_short_conv_is_a_causal_convolution_per_channel():
    """short_conv_int over [tail; p] is, channel by channel, np.convolve with the kernel reversed
    (its valid part): exact at both ends of the formats in 32 bits, wrapped in 24, T = 1 (a decode
    step) and T = 5."""
    rng = np.random.default_rng(8)
    lo = -(1 << (TINY.act_width - 1))
    for T in (1, 5):
        for k in (1, 4):
            x = rng.integers(lo, -lo, (T + k - 1, 6))
            W = rng.integers(-128, 128, (6, k))
            x[:, 0], W[0] = lo, -128                         # the largest products
            y = I.short_conv_int(x, W)
            assert y.shape == (T, 6)
            for c in range(6):
                assert np.array_equal(y[:, c], np.convolve(x[:, c], W[c, ::-1], mode="valid")), (T, k, c)
            assert y[0, 0] == k << (TINY.act_width + TINY.in_width - 2)
            # in TINY's 24-bit accumulator 4 taps of -128 on -32768 wrap, as matmul_int's sums do
            assert I.short_conv_int(x, W, TINY.acc_width)[0, 0] == (0 if k == 4 else 1 << 22)
