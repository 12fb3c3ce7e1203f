# amaranth: UnusedElaboratable=no
"""nanokpu.units.pwl: the RTL rounding shift, the PWL evaluator (Amaranth simulator on small
tables of every shape, Verilator exhaustively on the SiTU factor tables)."""

import numpy as np
import pytest
from amaranth import Module, Signal, signed
from amaranth.sim import Simulator

from golden.intops import PwlTable, fit_pwl, gate_q, gate_table, silu_table, up_q, up_table
from golden.intops import round_shift as golden_round_shift
from nanokpu.config import ROUNDING_MODES, profile
from nanokpu.units.pwl import PwlEvaluator, error_bound, out_range, range_shape, round_shift
from sim import bench_activation


def test_range_shape():
    assert range_shape(0, 0) == range_shape(0, 1)
    assert range_shape(0, 4096).width == 13 and not range_shape(0, 4096).signed
    assert range_shape(-1, 0) == signed(1)
    assert range_shape(-4096, 4095) == signed(13)
    assert range_shape(-4097, 0) == signed(14)
    assert range_shape(-3, 4096) == signed(14)


def test_out_range_is_exact():
    """200 random 7-bit tables, the domain anywhere (breakpoints past either end of the input range
    too): out_range is the min and max of the table over every input."""
    seed = 40
    rng = np.random.default_rng(seed)
    for _ in range(200):
        n_seg = int(rng.integers(1, 10))
        table = PwlTable(in_width=7, out_frac=3, guard=int(rng.integers(0, 3)), rounding="half_even",
                         x0=int(rng.integers(-90, 60)), seg_shift=int(rng.integers(0, 4)),
                         values=tuple(int(v) for v in rng.integers(-500, 500, size=n_seg + 1)))
        y = table(np.arange(-64, 64))
        assert out_range(table) == (y.min(), y.max()), f"seed {seed}, table {table}"


def test_out_range_of_silu_ends_at_the_largest_input():
    """SiLU's last breakpoint (128.0) lies past the largest Q16.8 input: its outputs fit 16 bits."""
    table = silu_table(profile("tiny"))
    assert table.x0 + (table.n_seg << table.seg_shift) == 1 << 15
    assert out_range(table) == (-71, (1 << 15) - 1)


def test_round_shift_matches_golden_exhaustively():
    """Every 8-bit signed input, shifts 0..4, every rounding mode (ties included)."""
    x = Signal(signed(8))
    cases = [(shift, mode) for shift in range(5) for mode in ROUNDING_MODES]
    m = Module()
    outs = []
    for shift, mode in cases:
        out = Signal(signed(9))
        m.d.comb += out.eq(round_shift(x, shift, mode))
        outs.append(out)
    got = []

    async def tb(ctx):
        for v in range(-128, 128):
            ctx.set(x, v)
            got.append([ctx.get(o) for o in outs])

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()
    got = np.array(got)
    xs = np.arange(-128, 128)
    for col, (shift, mode) in enumerate(cases):
        np.testing.assert_array_equal(got[:, col], golden_round_shift(xs, shift, mode),
                                      err_msg=f"shift {shift} mode {mode}")


def test_round_shift_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rounding mode"):
        round_shift(Signal(8), 1, "nearest")
    with pytest.raises(ValueError, match="shift"):
        round_shift(Signal(8), -1, "floor")


def _simulate(dut: PwlEvaluator, xs: np.ndarray, seed: int) -> np.ndarray:
    """Feed rows of ``xs`` ([n, lanes]) with random stalls of ``en``; the results in order."""
    rng = np.random.default_rng(seed)
    got = []

    async def tb(ctx):
        issued = 0
        while len(got) < len(xs):
            en = issued >= len(xs) or rng.random() < 0.7
            if en and issued < len(xs):
                ctx.set(dut.x, [int(v) for v in xs[issued]])
            ctx.set(dut.en, en)
            await ctx.tick()
            if en:
                issued += 1
                if issued >= dut.latency:  # ctx.get after a tick sees the registers it wrote
                    got.append([ctx.get(dut.y[j]) for j in range(dut.lanes)])

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return np.array(got)


@pytest.mark.parametrize("guard, rounding, x0, seg_shift", [
    (0, "half_even", -32, 0),     # one segment per input, no guard bits
    (3, "half_even", -20, 2),     # domain inside the input range: flat tails on both sides
    (2, "half_up", 0, 3),         # domain starts mid-range
    (4, "floor", -32, 4),         # the last breakpoint one past the largest input
])
@pytest.mark.parametrize("dsp", ["generic", "ecp5"])   # slope * f, or shifted adds in the logic
def test_evaluator_matches_golden_on_arbitrary_tables(guard, rounding, x0, seg_shift, dsp):
    """Random (non-monotone, negative-slope) tables, every 6-bit input, two lanes."""
    seed = 1000 + seg_shift
    rng = np.random.default_rng(seed)
    n_seg = max(1, min((32 - x0) >> seg_shift, 12 >> (seg_shift // 2)))
    values = tuple(int(v) for v in rng.integers(-300, 300, size=n_seg + 1))
    table = PwlTable(in_width=6, out_frac=4, guard=guard, rounding=rounding, x0=x0,
                     seg_shift=seg_shift, values=values)
    xs = np.arange(-32, 32).reshape(-1, 2)
    got = _simulate(PwlEvaluator(table, lanes=2, dsp=dsp), xs, seed)
    np.testing.assert_array_equal(got, table(xs), err_msg=f"seed {seed}, dsp {dsp}, table {table}")


def test_evaluator_on_a_fitted_table():
    table = fit_pwl(np.tanh, in_width=8, in_frac=5, out_frac=7, guard=3, rounding="half_even")
    xs = np.arange(-128, 128)[:, None]
    np.testing.assert_array_equal(_simulate(PwlEvaluator(table, lanes=1), xs, 5), table(xs))


def test_evaluator_stores_every_breakpoint_and_sizes_its_words():
    table = gate_table(profile("tiny"))
    dut = PwlEvaluator(table, lanes=1)
    assert [w["value"] for w in dut.words] == list(table.values[:-1])    # the last: a constant
    assert [w["slope"] for w in dut.words] == list(table.slopes)
    for v, s in zip(table.values, [*table.slopes, 0], strict=True):
        assert dut.value_shape.signed and -(1 << (dut.value_shape.width - 1)) <= v < 1 << (dut.value_shape.width - 1)
        assert -(1 << dut.slope_shape.width) < s < 1 << dut.slope_shape.width
    assert dut.out_shape == signed(14)  # [-0.27, 4] in Q.10
    assert dut.error_bound == error_bound(table) == 1.5 / 1024


def test_evaluator_rejects_bad_parameters():
    table = up_table(profile("tiny"))
    with pytest.raises(ValueError, match="lanes"):
        PwlEvaluator(table, 0)
    with pytest.raises(TypeError, match="PwlTable"):
        PwlEvaluator(table.values, 1)
    with pytest.raises(ValueError, match="^dsp = 'xilinx': must be one of"):
        PwlEvaluator(table, 1, dsp="xilinx")


@pytest.mark.slow(60)
@pytest.mark.parametrize("key", sorted(bench_activation.BENCH_CONFIGS))
def test_factors_exhaustive_on_verilator(key):
    """Every input of the gate and up factor tables through the RTL, bit for bit."""
    bench_activation.run(key, "factors_exhaustive", seed=11)


@pytest.mark.parametrize("key", sorted(bench_activation.BENCH_CONFIGS))
def test_factor_error_against_float(key):
    """Exhaustive error of the factors (equal to the RTL's, by the bench above) against float64."""
    from golden.k3 import situ_gate, situ_up

    cfg = bench_activation.BENCH_CONFIGS[key]
    xs = np.arange(-(1 << (cfg.act_width - 1)), 1 << (cfg.act_width - 1))
    real = xs / 2.0 ** cfg.act_frac
    bound = error_bound(gate_table(cfg))
    gate_err = np.abs(gate_q(xs, cfg) / 2.0 ** cfg.situ_frac - situ_gate(real, cfg.beta1))
    up_err = np.abs(up_q(xs, cfg) / 2.0 ** cfg.situ_frac - situ_up(real, cfg.beta2))
    assert gate_err.max() <= bound and up_err.max() <= bound, (gate_err.max(), up_err.max(), bound)


@pytest.mark.parametrize("dsp, situ_products, sigmoid_products", [("generic", 3, 1), ("ice40", 3, 1), ("ecp5", 1, 0)])
def test_interpolation_products_leave_the_dsps_on_ecp5_only(dsp, situ_products, sigmoid_products):
    """On ECP5 the PWL products are shifted adds (the tiny nano-KPU then needs 28 MULT18X18D, the
    ECP5-25F's count); the multiplications left in the netlist are SiTU's gate * up product."""
    from amaranth.back import rtlil

    from nanokpu.units.sigmoid import Sigmoid
    from nanokpu.units.situ import Situ
    cfg = profile("tiny", dsp=dsp)
    assert rtlil.convert(Situ(cfg)).count("cell $mul ") == situ_products
    assert rtlil.convert(Sigmoid(cfg)).count("cell $mul ") == sigmoid_products
