"""The integer golden path: exact arithmetic checks and documented error bounds vs float."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from golden import intops as I
from golden import k3
from nanokpu.config import ROUNDING_MODES, profile

TINY = profile("tiny")


def exact_round(num: int, den: int, mode: str) -> int:
    """Reference rounding of the rational num/den, written independently with Fractions."""
    q = Fraction(num, den)
    fl = q.numerator // q.denominator
    rem = q - fl
    if mode == "floor" or rem == 0:
        return fl
    if rem > Fraction(1, 2):
        return fl + 1
    if rem < Fraction(1, 2):
        return fl
    return fl + 1 if mode == "half_up" else fl + (fl % 2)


@pytest.mark.parametrize("mode", ROUNDING_MODES)
@given(x=st.integers(-(1 << 40), 1 << 40), shift=st.integers(0, 20))
@settings(max_examples=300, deadline=None)
def test_round_shift_matches_exact_rounding(mode, x, shift):
    assert int(I.round_shift(np.array([x]), shift, mode)[0]) == exact_round(x, 1 << shift, mode)


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_round_shift_ties(mode):
    # +-0.5, +-1.5, +-2.5 at shift 1: the corners where the modes differ
    x = np.array([1, 3, 5, -1, -3, -5])
    expect = {"half_even": [0, 2, 2, 0, -2, -2], "half_up": [1, 2, 3, 0, -1, -2],
              "floor": [0, 1, 2, -1, -2, -3]}[mode]
    assert I.round_shift(x, 1, mode).tolist() == expect


def test_round_shift_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rounding mode"):
        I.round_shift(np.array([1]), 1, "nearest")
    with pytest.raises(ValueError, match="shift"):
        I.round_shift(np.array([1]), -1)
    with pytest.raises(TypeError, match="integer"):
        I.round_shift(np.array([1.5]), 1)


@given(acc=st.integers(-(1 << 31), (1 << 31) - 1), mult=st.integers(0, (1 << 16) - 1),
       shift=st.integers(0, 40))
@settings(max_examples=300, deadline=None)
def test_requantize_is_round_then_saturate(acc, mult, shift):
    got = int(I.requantize(np.array([acc]), mult, shift, 8, "half_even")[0])
    assert got == max(-128, min(127, exact_round(acc * mult, 1 << shift, "half_even")))


def test_requantize_saturates_both_ends():
    acc = np.array([1 << 30, -(1 << 30), 127, -128, 128, -129])
    assert I.requantize(acc, 1, 0, 8).tolist() == [127, -128, 127, -128, 127, -128]


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_requantize_per_column_is_each_column_alone(mode):
    """Per-channel requantiser: one (mult, shift) per output column, shift 0 included, equals
    the per-tensor requantiser applied to each column; a shift past 63 is refused."""
    rng = np.random.default_rng(7)
    acc = rng.integers(-(1 << 40), 1 << 40, (64, 6))
    acc[:4] = [[1, 2, 3, 4, 5, 6], [-1, -2, -3, -4, -5, -6], [6, 10, 14, 3, 2, 1], [0] * 6]   # ties
    mult, shift = [1, 3, 40_000, 65_535, 2, 1], [0, 1, 2, 30, 62, 1]
    got = I.requantize(acc, mult, np.array(shift), 24, mode)
    for col in range(6):
        want = I.requantize(acc[:, col], mult[col], shift[col], 24, mode)
        assert np.array_equal(got[:, col], want), (mode, col)
    with pytest.raises(ValueError, match="shift"):
        I.round_shift(acc, np.array([0, 64, 1, 1, 1, 1]))


def test_matmul_int_extremes_and_wrap():
    k = 1 << 17  # (-128)(-128) * 2**17 = 2**31: one past the int32 maximum
    a = np.full((1, k), -128)
    b = np.full((k, 1), -128)
    assert I.matmul_int(a, b, 32)[0, 0] == -(1 << 31)  # wraps, explicitly
    assert I.matmul_int(a[:, :-1], b[:-1], 32)[0, 0] == (1 << 31) - (1 << 14)
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (5, 7))
    w = rng.integers(-128, 128, (7, 3))
    assert np.array_equal(I.matmul_int(x, w), x @ w)
    with pytest.raises(ValueError, match="chain"):
        I.matmul_int(x, w.T)


@pytest.mark.parametrize("digit", [4, 8])
def test_two_digit_operands_multiply_exactly_by_their_digits(digit):
    """split_digits: v = h * 2**D + l with a balanced low digit; within router_qmax (the golden
    router's operand limit) the high digit fits D bits too, and join_partials of the four digit
    GEMMs (each exact in a narrow accumulator) is the wide GEMM, extremes included."""
    from golden.block import router_qmax
    cfg = profile("tiny", in_width=digit, router_width=2 * digit)
    lim = router_qmax(cfg)
    assert lim == ((1 << (digit - 1)) - 1) << digit
    rng = np.random.default_rng(digit)
    x = np.concatenate([[[lim] * 64, [-lim] * 64, np.arange(-32, 32)], rng.integers(-lim, lim + 1, (5, 64))])
    w = np.concatenate([[[lim] * 64, [-lim] * 64], rng.integers(-lim, lim + 1, (6, 64))])
    digits = []
    for v in (x, w):
        h, lo = I.split_digits(v, digit)
        assert np.array_equal(h * (1 << digit) + lo, v)
        assert lo.min() >= -(1 << (digit - 1)) and lo.max() < 1 << (digit - 1)
        assert np.abs(h).max() <= (1 << (digit - 1)) - 1
        digits.append((h, lo))
    (xh, xl), (wh, wl) = digits
    parts = [I.matmul_int(a, b.T, cfg.acc_width) for b in (wh, wl) for a in (xh, xl)]    # hh, lh, hl, ll
    assert np.array_equal(I.join_partials(*parts, digit, cfg.router_acc_width),
                          I.matmul_int(x, w.T, cfg.router_acc_width))


# ---------------------------------------------------------------------------------------
# Activation tables: every factor within 1 LSB of the correctly rounded value, exhaustively
# ---------------------------------------------------------------------------------------
BETAS = [(4.0, 25.0), (2.0, 8.0)]
ALL_ACT = np.arange(-(1 << 15), 1 << 15)


def _funcs(cfg):
    return {
        "sigmoid": (I.sigmoid_q, k3.sigmoid, cfg.score_frac),
        "gate": (I.gate_q, lambda x: k3.situ_gate(x, cfg.beta1), cfg.situ_frac),
        "up": (I.up_q, lambda x: k3.situ_up(x, cfg.beta2), cfg.situ_frac),
    }


@pytest.mark.parametrize("betas", BETAS)
@pytest.mark.parametrize("which", ["sigmoid", "gate", "up"])
def test_activation_factor_within_one_lsb(betas, which):
    cfg = TINY.replace(beta1=betas[0], beta2=betas[1])
    fq, f, frac = _funcs(cfg)[which]
    real = f(ALL_ACT / 2.0 ** cfg.act_frac) * 2.0 ** frac
    got = fq(ALL_ACT, cfg)
    assert np.max(np.abs(got - np.round(real))) <= 1           # vs correctly rounded
    assert np.max(np.abs(got - real)) <= 1.5                    # vs the real value, documented


def test_sigmoid_range_and_monotone():
    s = I.sigmoid_q(ALL_ACT, TINY)
    assert s.min() == 0 and s.max() == 1 << TINY.score_frac
    assert np.all(np.diff(s) >= 0)


@pytest.mark.parametrize("betas", BETAS)
def test_situ_q_bound_sign_and_zero(betas):
    cfg = TINY.replace(beta1=betas[0], beta2=betas[1])
    g = np.repeat(ALL_ACT[::97], len(ALL_ACT[::89]))
    u = np.tile(ALL_ACT[::89], len(ALL_ACT[::97]))
    edge = np.array([-(1 << 15), (1 << 15) - 1])
    g = np.concatenate([g, np.repeat(edge, 2)])
    u = np.concatenate([u, np.tile(edge, 2)])
    h = I.situ_q(g, u, cfg)
    bound = int(cfg.situ_bound * 2 ** cfg.h_frac)
    assert np.max(np.abs(h)) <= bound
    # Both factors saturate inside the input range for (2, 8): the bound is then reached exactly.
    # For K3's beta2 = 25, up(128) = 24.998 and the largest |h| is 99.99.
    assert (np.max(np.abs(h)) == bound) == (betas == (2.0, 8.0))
    assert np.max(np.abs(h)) < 1 << (cfg.h_width - 1)
    gate, up = I.gate_q(g, cfg), I.up_q(u, cfg)
    assert np.all(np.sign(h) * np.sign(gate) * np.sign(up) >= 0)
    assert np.all(I.situ_q(np.zeros_like(u), u, cfg) == 0)


@pytest.mark.parametrize("betas", BETAS)
def test_situ_q_error_bound(betas):
    """|h_q - h| <= beta2*e + beta1*e + e**2 + 0.5 LSB(h), e = 1.5 * 2**-situ_frac."""
    cfg = TINY.replace(beta1=betas[0], beta2=betas[1])
    rng = np.random.default_rng(7)
    g = rng.integers(-(1 << 15), 1 << 15, 200_000)
    u = rng.integers(-(1 << 15), 1 << 15, 200_000)
    real = k3.situ_glu(g / 256.0, u / 256.0, cfg)
    got = I.situ_q(g, u, cfg) / 2.0 ** cfg.h_frac
    e = 1.5 * 2.0 ** -cfg.situ_frac
    bound = cfg.beta2 * e + cfg.beta1 * e + e * e + 2.0 ** -(cfg.h_frac + 1)
    assert np.max(np.abs(got - real)) <= bound


# ---------------------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------------------
def test_topk_int_stable_ties():
    keys = np.array([[5, 7, 7, 1, 7], [3, 3, 3, 3, 3]])
    assert I.topk_int(keys, 3).tolist() == [[1, 2, 4], [0, 1, 2]]
    with pytest.raises(ValueError, match="top_k"):
        I.topk_int(keys, 6)


@given(st.lists(st.integers(0, 1 << 12), min_size=1, max_size=16))
@settings(max_examples=300, deadline=None)
def test_route_weights_within_one_lsb(scores):
    cfg = TINY
    s = np.array([scores])
    w = I.route_weights_int(s, cfg)
    total = s.sum()
    if total == 0:
        assert np.all(w == 0)
        return
    exact = s * 2.0 ** cfg.weight_frac / total
    assert np.max(np.abs(w - exact)) <= 1
    assert abs(int(w.sum()) - (1 << cfg.weight_frac)) <= len(scores)


def test_route_int_selection_uses_bias_weights_do_not():
    cfg = profile("tiny", n_experts=4, top_k=2)
    s = np.array([[100, 200, 300, 400]])
    idx, w, loads = I.route_int(s, np.array([0, 0, 0, 0]), cfg)
    assert idx.tolist() == [[3, 2]]
    idx_b, w_b, loads_b = I.route_int(s, np.array([1000, 0, 0, 0]), cfg)
    assert idx_b.tolist() == [[0, 3]] and loads_b.tolist() == [1, 0, 0, 1]
    assert w_b[0, 1] == I.route_weights_int(np.array([[100, 400]]), cfg)[0, 1]


def test_combine_int_matches_float_within_half_lsb():
    cfg = TINY
    rng = np.random.default_rng(3)
    e = rng.integers(-(1 << 15), 1 << 15, (6, 2, 16))
    w = I.route_weights_int(rng.integers(0, 1 << 12, (6, 2)), cfg)
    got = I.combine_int(e, w, cfg)
    exact = np.einsum("tk,tkn->tn", w / 2.0 ** cfg.weight_frac, e)
    assert np.max(np.abs(got - exact)) <= 0.5


def test_rmsnorm_int_error_bound():
    cfg = TINY
    rng = np.random.default_rng(5)
    u = rng.integers(-3000, 3000, (32, 16))
    got = I.rmsnorm_int(u, cfg) / 2.0 ** cfg.norm_frac
    ref = k3.rmsnorm(u / 2.0 ** cfg.act_frac, np.ones(16), cfg.rms_eps)
    ref = np.clip(ref, -128 / 2.0 ** cfg.norm_frac, 127 / 2.0 ** cfg.norm_frac)
    # half an output LSB of rounding, the truncated reciprocal (relative < 2**-(M-1)) and the
    # floor sqrt's relative error (r >= 100 here)
    rel = 2.0 ** -(I.norm_recip_bits(cfg) - 1) + 0.02
    assert np.max(np.abs(got - ref)) <= 0.5 / 2 ** cfg.norm_frac + np.max(np.abs(ref)) * rel
    assert np.all(I.rmsnorm_int(np.zeros((2, 16), dtype=np.int64), cfg) == 0)


# ---------------------------------------------------------------------------------------
# exp and softmax (Attention Residuals)
# ---------------------------------------------------------------------------------------
EXP_CONFIGS = [TINY, profile("tiny", act_width=8, act_frac=4, score_frac=7),
               profile("tiny", score_frac=16, bias_width=20)]


@pytest.mark.parametrize("cfg", EXP_CONFIGS, ids=["tiny", "act8", "score16"])
def test_exp_table_every_input(cfg):
    """Over every act-format input: within 1 LSB of the correctly rounded exp(min(x, 0)) and 1.5 LSB
    of the real value; exactly 1.0 from 0 up, exactly 0 where the rounded value is 0; monotone."""
    xs = np.arange(-(1 << (cfg.act_width - 1)), 1 << (cfg.act_width - 1))
    real = np.exp(np.minimum(xs / 2.0 ** cfg.act_frac, 0.0)) * 2.0 ** cfg.score_frac
    got = I.exp_q(xs, cfg)
    assert np.max(np.abs(got - np.round(real))) <= 1
    assert np.max(np.abs(got - real)) <= 1.5
    assert np.all(got[xs >= 0] == 1 << cfg.score_frac)
    assert np.all(got[np.round(real) == 0] == 0)
    assert np.all(np.diff(got) >= 0)


def test_exp_table_is_small():
    """513 segments of 8 LSB for the default formats (the sigmoid's table has 256 of 32)."""
    table = I.exp_table(TINY)
    assert (table.n_seg, 1 << table.seg_shift, table.x0) == (513, 8, -4096)


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_softmax_int_directed(mode):
    cfg = TINY.replace(rounding=mode)
    one = 1 << cfg.weight_frac
    lo, hi = -(1 << (cfg.act_width - 1)), (1 << (cfg.act_width - 1)) - 1
    assert I.softmax_int(np.array([[1234]]), cfg).tolist() == [[one]]             # one candidate
    assert I.softmax_int(np.array([[7, 7]]), cfg).tolist() == [[one // 2] * 2]    # equal: exact halves
    # three equal logits: recip = floor(2**28 / 3 * 2**12) = 21845, w = 21845 * 2**12 / 2**13 = 10922.5, a tie
    third = exact_round(21845 << 12, 1 << 13, mode)
    assert I.softmax_int(np.array([[-5, -5, -5]]), cfg).tolist() == [[third] * 3]
    # one dominant logit (the others at least 9.4 below: exp rounds to 0), extremes included
    assert I.softmax_int(np.array([[0, -2400, lo], [hi, lo, hi - 2400], [lo, lo + 2400, lo]]), cfg).tolist() == \
        [[one, 0, 0], [one, 0, 0], [0, one, 0]]


def test_softmax_int_shift_and_permutation():
    """Adding a constant to a row changes nothing (the max is subtracted first); permuting the
    logits permutes the weights."""
    cfg = TINY
    rng = np.random.default_rng(11)
    s = rng.integers(-2000, 2000, (500, 5))
    w = I.softmax_int(s, cfg)
    assert np.array_equal(I.softmax_int(s + 20_000, cfg), w)
    assert np.array_equal(I.softmax_int(s - 30_000, cfg), w)
    perm = rng.permutation(5)
    assert np.array_equal(I.softmax_int(s[:, perm], cfg), w[:, perm])
    assert np.all(np.abs(w.sum(axis=1) - (1 << cfg.weight_frac)) <= 5)


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_softmax_int_integer_reference(mode):
    """Row by row with Python integers: running max, exp table, sum, floor reciprocal, rounding."""
    cfg = TINY.replace(rounding=mode)
    rng = np.random.default_rng(12)
    s = rng.integers(-3000, 3000, (50, 4))
    r_bits = cfg.weight_frac + cfg.score_frac + 1
    got = I.softmax_int(s, cfg)
    for row, out in zip(s.tolist(), got.tolist(), strict=True):
        m = row[0]
        for v in row[1:]:
            m = max(m, v)
        e = [int(I.exp_q(np.array([v - m]), cfg)[0]) for v in row]
        recip = (1 << r_bits) // sum(e)
        assert out == [exact_round(v * recip, 1 << (r_bits - cfg.weight_frac), mode) for v in e]


# ---------------------------------------------------------------------------------------
# RMSNorm with weight
# ---------------------------------------------------------------------------------------
def test_quantize_norm_weight_format():
    cfg = TINY
    qmax = (1 << (cfg.mult_width - 1)) - 1
    q, shift = I.quantize_norm_weight(np.array([1.0, -0.5, 0.25]), cfg)
    assert (q.tolist(), shift) == ([1 << 14, -(1 << 13), 1 << 12], 14)
    # just below 1.0: frexp says shift 15, but 32768 would not fit, so 14
    q, shift = I.quantize_norm_weight(np.array([1.0 - 2.0 ** -20, 0.3]), cfg)
    assert (int(q[0]), shift) == (1 << 14, 14)
    rng = np.random.default_rng(13)
    w = 1.0 + 0.1 * rng.standard_normal(100)
    q, shift = I.quantize_norm_weight(w, cfg)
    assert np.max(np.abs(q)) <= qmax < np.max(np.abs(np.round(w * 2.0 ** (shift + 1))))   # the largest shift
    assert np.max(np.abs(q / 2.0 ** shift - w)) <= 2.0 ** -(shift + 1)
    assert I.quantize_norm_weight(np.zeros(4), cfg)[1] == cfg.mult_width - 1
    with pytest.raises(ValueError, match="mult_width"):
        I.quantize_norm_weight(np.array([2.0 ** 15]), cfg)


def test_rms_eps_is_a_mean_of_squares_in_the_rows_units():
    """rms_eps_q(cfg, f) = round(rms_eps 4**f) (1e-5: 1 at act_frac 8, 10,737 at 15, 0 at 0), the
    default of rmsnorm_int; a larger eps_q lowers every normalised value of a small row."""
    assert (I.rms_eps_q(TINY), I.rms_eps_q(TINY, 15), I.rms_eps_q(TINY, 0)) == (1, 10737, 0)
    u = np.array([[3, -3, 2, -2, 1, -1, 4, -4]])
    assert np.array_equal(I.rmsnorm_int(u, TINY), I.rmsnorm_int(u, TINY, eps_q=1))
    small, large = I.rmsnorm_int(u, TINY, eps_q=0), I.rmsnorm_int(u, TINY, eps_q=10737)
    assert np.all(np.abs(large) <= np.abs(small)) and np.abs(large).sum() < np.abs(small).sum()


@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_rmsnorm_weight_int_directed(mode):
    """Weight 1 is RMSNorm itself; weight -1 negates (saturating -128 to 127); weight 0.5 halves
    with a tie at every odd value, rounded by the mode."""
    cfg = TINY.replace(rounding=mode)
    rng = np.random.default_rng(14)
    u = rng.integers(-(1 << 15), 1 << 15, (64, 16))
    u[0] = [-(1 << 15)] + [0] * 15                      # one element: RMSNorm saturates to -128
    n = I.rmsnorm_int(u, cfg)
    assert n[0, 0] == -128
    ones, shift = I.quantize_norm_weight(np.ones(16), cfg)
    assert np.array_equal(I.rmsnorm_weight_int(u, ones, shift, cfg), n)
    assert np.array_equal(I.rmsnorm_weight_int(u, -ones, shift, cfg), np.minimum(-n, 127))
    halves = I.rmsnorm_weight_int(u, ones // 2, shift, cfg)
    assert np.any(n % 2 == 1)
    assert halves.tolist() == [[exact_round(v, 2, mode) for v in row] for row in n.tolist()]
