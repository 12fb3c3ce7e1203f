# amaranth: UnusedElaboratable=no
"""The vector unit against golden.intops (add_sat, combine_int, rmsnorm_int, l2norm_int), bit for bit."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from golden import intops as I
from nanokpu.config import profile
from nanokpu.units.vector import VecOp, VectorUnit
from sim.runner import FAST_BUILD, run_bench


def beats_for(op, cfg, a, b=None):
    """The input beats (a, b, last) of one operation on golden-shaped arrays."""
    if op == VecOp.ADD:
        return [(int(x), int(y), 0) for x, y in zip(a.ravel(), b.ravel(), strict=True)]
    if op == VecOp.COMBINE:  # a: e [T, k, n], b: w [T, k] -> per (t, j): k beats
        T, k, n = a.shape
        return [(int(a[t, s, j]), int(b[t, s]), int(s == k - 1))
                for t in range(T) for j in range(n) for s in range(k)]
    out = []  # NORM: each row twice
    for row in a:
        for _ in range(2):
            out += [(int(x), 0, int(j == len(row) - 1)) for j, x in enumerate(row)]
    return out


def golden(op, cfg, a, b=None):
    if op == VecOp.ADD:
        return I.add_sat(a, b, cfg.act_width).ravel()
    if op == VecOp.COMBINE:
        return I.combine_int(a, b, cfg).ravel()
    return I.rmsnorm_int(a, cfg).ravel()


def run_amaranth(cfg, op, beats, n_out, n_row, seed, l2=False, dot=False):
    dut = VectorUnit(cfg)
    rng = np.random.default_rng(seed)
    got = []

    async def source(ctx):
        ctx.set(dut.op, op)
        ctx.set(dut.n, n_row)
        if l2:
            ctx.set(dut.l2, 1)
            ctx.set(dut.eps, dut.l2_eps_q)
        if dot:
            ctx.set(dut.dot, 1)
        for a, b, last in beats:
            while rng.random() < 0.3:
                await ctx.tick()
            ctx.set(dut.i.payload, {"a": a, "b": b, "last": last})
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        while len(got) < n_out:
            ready = int(rng.random() < 0.7)
            ctx.set(dut.o.ready, ready)
            _clk, _rst, valid, payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if ready and valid:
                got.append(payload)
        ctx.set(dut.o.ready, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run()
    return np.array(got, dtype=np.int64)


def cases(cfg, rng):
    act = cfg.act_width
    lo, hi = -(1 << (act - 1)), (1 << (act - 1)) - 1
    w_max = 1 << cfg.weight_frac
    a = rng.integers(lo, hi + 1, (2, 5))
    b = rng.integers(lo, hi + 1, (2, 5))
    a[0, :4], b[0, :4] = [hi, lo, hi, 0], [hi, lo, 1, lo]  # saturation both ways, exact edge
    e = rng.integers(lo, hi + 1, (2, cfg.top_k, 3))
    w = rng.integers(0, w_max + 1, (2, cfg.top_k))
    e[0], w[0] = hi, w_max  # weights 1.0 each: saturates
    w[1] = [(1 << cfg.weight_width) - 1, w_max + 1]  # any weight_width-bit weight, top bit set
    e[1, 0] = lo
    u = rng.integers(-300, 300, (3, 6))
    u[0] = 0              # zero row: r = isqrt(eps_q)
    u[1] = [hi, 0, 0, 0, 0, lo]  # extreme values, output saturation
    return [(VecOp.ADD, a, b, 5), (VecOp.COMBINE, e, w, 3), (VecOp.NORM, u, None, 6)]


@pytest.mark.parametrize("seed", [1, 2])
def test_vector_unit_amaranth(seed):
    cfg = profile("tiny")
    rng = np.random.default_rng(seed)
    for op, a, b, n in cases(cfg, rng):
        ref = golden(op, cfg, a, b)
        got = run_amaranth(cfg, op, beats_for(op, cfg, a, b), ref.size, n, seed)
        assert np.array_equal(got, ref), f"{op.name} seed {seed}: {got} != {ref}"


#: NORM rows whose RMS r is 64 or 128 (n = 4, eps_q = 1), so that a * 2**norm_frac / r ties
#: (remainder r / 2) for odd a at r = 64 and a = 2 mod 4 at r = 128: the only rows where the
#: rounding modes' tie rules show (random rows almost never tie); and a row whose ms + eps_q
#: is a square (1: r = 1 exactly).
TIE_ROWS = [[64, -64, 64, 65], [-65, 64, -64, 63], [65, 65, -63, -63], [128, -128, 130, -126],
            [-130, 126, 3, 1], [1, -1, 0, 0]]


@pytest.mark.parametrize("rounding", ["half_even", "half_up", "floor"])
def test_norm_ties_amaranth(rounding):
    """NORM on tie rows, positive and negative ties, bit for bit (Amaranth simulator)."""
    cfg = profile("tiny", rounding=rounding)
    u = np.array(TIE_ROWS)
    r = I.isqrt((u * u).sum(axis=-1, keepdims=True) // u.shape[-1] + 1)
    ties = 2 * ((u << cfg.norm_frac) % r) == r
    assert ties[:4].any(axis=1).all() and (ties & (u < 0)).any() and (ties & (u > 0)).any()
    if rounding == "floor":   # and rows where the remainder is above one half
        assert (2 * ((u << cfg.norm_frac) % r) > r).any()
    ref = golden(VecOp.NORM, cfg, u)
    got = run_amaranth(cfg, VecOp.NORM, beats_for(VecOp.NORM, cfg, u), ref.size, u.shape[-1], 3)
    assert np.array_equal(got, ref), f"NORM {rounding}: {got} != {ref}"


@pytest.mark.parametrize("rounding", ["half_even", "half_up", "floor"])
def test_combine_ties_amaranth(rounding):
    """COMBINE sums that tie (x.5 in act LSBs, odd and even, positive and negative) or fall
    above and below one half, unsaturated, bit for bit (Amaranth simulator)."""
    cfg = profile("tiny", rounding=rounding)
    rng = np.random.default_rng(5)
    half = 1 << (cfg.weight_frac - 1)
    w = np.array([[half, 0], [half, half], [half, half], [half + 1, half - 1], [3, 1 << cfg.weight_frac]])
    w = np.concatenate([w, rng.integers(0, 1 << cfg.weight_frac, (6, 2))])
    e = rng.integers(-2000, 2000, (len(w), 2, 4))
    e[:3, :, 0] = [[1, 0], [3, 4], [-5, 2]]      # 0.5, 3.5, -1.5
    e[:3, :, 1] = [[-1, 7], [1, 2], [-1, -2]]    # -0.5, 1.5, -1.5
    acc = np.einsum("tk,tkn->tn", w, e) % (1 << cfg.weight_frac)
    assert (acc == half).sum() >= 5 and (acc > half).any() and (0 < acc).any()
    ref = golden(VecOp.COMBINE, cfg, e, w)
    assert np.all(np.abs(ref) < (1 << (cfg.act_width - 1)) - 1)
    got = run_amaranth(cfg, VecOp.COMBINE, beats_for(VecOp.COMBINE, cfg, e, w), ref.size, 4, 4)
    assert np.array_equal(got, ref), f"COMBINE {rounding}: {got} != {ref}"


@pytest.mark.parametrize(("rounding", "layer_ops"), [("half_even", True), ("half_up", False), ("floor", True)])
def test_vector_unit_verilator(rounding, layer_ops):
    """ADD, COMBINE, NORM (and with layer_ops the l2norm) on Verilator under random stalls."""
    cfg = profile("tiny", rounding=rounding, layer_ops=layer_ops)
    run_bench(VectorUnit(cfg), f"vector_{rounding}", "bench_vector",
              seed=7, build_args=FAST_BUILD)


def l2_tie_rows(cfg):
    """Rows of 4 whose l2norm has ties at its rounding (rounded differently half_up and half_even),
    positive and negative, beside rows of one value (e the largest), the extremes, and rows whose
    ss has from 1 to 2P + 9 bits (e from 2P down to 0)."""
    rng = np.random.default_rng(11)
    U = cfg.kda_unit_frac
    even, up = profile("tiny", rounding="half_even"), profile("tiny", rounding="half_up")
    x = rng.integers(-40, 41, (4000, 4))
    tie = I.l2norm_int(x, U, even) != I.l2norm_int(x, U, up)
    rows = [x[tie.any(axis=1) & (x * tie > 0).any(axis=1)][:3], x[tie.any(axis=1) & (x * tie < 0).any(axis=1)][:3]]
    hi, lo = (1 << (cfg.act_width - 1)) - 1, -(1 << (cfg.act_width - 1))
    rows.append([[1, 0, 0, 0], [0, -1, 0, 0], [hi, hi, hi, hi], [lo, lo, lo, lo], [hi, lo, 1, -1]])
    rows.append([[1 << j, 3, 0, -(1 << j) + 1] for j in range(0, cfg.act_width - 1, 3)])
    return np.concatenate(rows)


@pytest.mark.parametrize("rounding", ["half_even", "half_up", "floor"])
def test_l2norm_amaranth(rounding):
    """NORM with l2 (layer_ops) on tie rows, extremes, one-value rows and every pre-shift e, bit
    for bit with l2norm_int at kda_unit_frac (Amaranth simulator, random stalls both ways)."""
    cfg = profile("tiny", rounding=rounding, layer_ops=True)
    u = l2_tie_rows(cfg)
    ref = I.l2norm_int(u, cfg.kda_unit_frac, cfg).ravel()
    got = run_amaranth(cfg, VecOp.NORM, beats_for(VecOp.NORM, cfg, u), ref.size, 4, 6, l2=True)
    assert np.array_equal(got, ref), f"l2 NORM {rounding}: {got} != {ref}"


def test_dot_amaranth():
    """COMBINE with dot (layer_ops, CONV's taps): groups of 1 to 4 beats of act-format a times
    signed in_width b, the sum raw in acc_width bits: the largest products (wrapping in tiny's
    24-bit accumulator at 4 taps), mixed signs, zeros, random (Amaranth simulator, random stalls)."""
    cfg = profile("tiny", layer_ops=True)
    rng = np.random.default_rng(12)
    lo = -(1 << (cfg.act_width - 1))
    beats, ref = [], []
    for k in (1, 2, 3, 4, 4, 3, 4):
        x = rng.integers(lo, -lo, (5, k))
        w = rng.integers(-128, 128, (5, k))
        x[0], w[0] = lo, -128                  # the largest products: 4 of them wrap
        x[1], w[1] = -lo - 1, -128
        x[2] = 0
        for row_x, row_w in zip(x, w, strict=True):
            beats += [(int(a), int(b), int(j == k - 1)) for j, (a, b) in enumerate(zip(row_x, row_w, strict=True))]
        ref += list(I.short_conv_int(x.T, w, cfg.acc_width)[0])   # one result row: a dot product per row
    got = run_amaranth(cfg, VecOp.COMBINE, beats, len(ref), 1, 8, dot=True)
    assert np.array_equal(got, ref), f"dot: {got} != {ref}"


@pytest.mark.parametrize(("n", "l2"), [(4, False), (6, False), (16, False), (4, True), (7, True)])
def test_norm_row_cycles_are_exact(n, l2):
    """NORM rows with beats always offered and results always taken: pass 1 of each row begins
    exactly norm_row_cycles(n) after its pass 0 (the mean a shift for n = 4 and 16, the divider
    for n = 6; r's leading zeros, 3 to 16 here, in one cycle; with l2 the pre-shift, e from 0 to
    2P), results bit for bit."""
    cfg = profile("tiny", layer_ops=l2)
    dut = VectorUnit(cfg)
    rng = np.random.default_rng(n)
    u = rng.integers(-300, 300, (4, n))
    u[1, 0] = (1 << (cfg.act_width - 1)) - 1       # r near its largest: few leading zeros
    u[2] = 0                                       # r = isqrt(eps_q): most leading zeros
    if l2:
        u[2, 0], u[3] = 1, (1 << (cfg.act_width - 1)) - 1   # ss = 1 (e = 2P), ss the largest (e = 0)
    beats = beats_for(VecOp.NORM, cfg, u)
    ref = I.l2norm_int(u, cfg.kda_unit_frac, cfg).ravel() if l2 else golden(VecOp.NORM, cfg, u)
    taken, got = [], []

    async def source(ctx):
        ctx.set(dut.op, VecOp.NORM)
        ctx.set(dut.n, n)
        if l2:
            ctx.set(dut.l2, 1)
            ctx.set(dut.eps, dut.l2_eps_q)
        ctx.set(dut.o.ready, 1)
        cycle = 0
        for a, b, last in beats:
            ctx.set(dut.i.payload, {"a": a, "b": b, "last": last})
            ctx.set(dut.i.valid, 1)
            while True:
                _clk, _rst, ready, valid, out = await ctx.tick().sample(dut.i.ready, dut.o.valid, dut.o.payload)
                if valid:
                    got.append(out)
                cycle += 1
                if ready:
                    break
            taken.append(cycle)
        ctx.set(dut.i.valid, 0)
        while len(got) < ref.size:
            _clk, _rst, valid, out = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if valid:
                got.append(out)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(source)
    sim.run()
    assert np.array_equal(np.array(got), ref), f"n = {n}: {got} != {ref}"
    starts = [taken[2 * n * row + n] - taken[2 * n * row] for row in range(len(u))]
    assert starts == [dut.norm_row_cycles(n, l2)] * len(u), (starts, dut.norm_row_cycles(n, l2))


@pytest.mark.parametrize("field", ["rms_eps", "l2_eps"])
def test_an_epsilon_past_the_eps_port_is_refused(field):
    """An epsilon whose eps_q (in act-format units squared) does not fit 2*act_width bits fails at
    construction naming its field (the eps register would drop its top bits)."""
    cfg = profile("tiny", layer_ops=True, **{field: 2.0 ** 17})
    with pytest.raises(ValueError, match=field):
        VectorUnit(cfg)
    VectorUnit(profile("tiny", layer_ops=True, **{field: 2.0 ** 15}))
