# amaranth: UnusedElaboratable=no
"""nanokpu.units.pwl_functions (exp, SiLU, KDA decay) and the stream unit they share with the sigmoid,
nanokpu.units.pwl_stream: bit-exact to golden.intops over every input, within the documented bounds."""

import numpy as np
import pytest
from amaranth import signed, unsigned

from golden import errors, k3
from golden.intops import fit_pwl, sigmoid_table
from nanokpu.config import profile
from nanokpu.units.pwl_functions import Decay, Exp, Silu
from nanokpu.units.pwl_stream import PwlStream
from sim import bench_activation
from sim.bench_activation import FUNCTION_KEYS, FUNCTIONS


def _real(name, cfg):
    """The real function of unit ``name``, on float64 reals."""
    return {"exp": lambda x: np.exp(np.minimum(x, 0.0)),
            "silu": k3.silu,
            "decay": lambda z: np.exp(cfg.kda_gate_min * k3.sigmoid(z))}[name]


@pytest.mark.parametrize("rounding", ["half_even", "half_up", "floor"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_narrow_format_with_idle_and_backpressure(name, rounding):
    """Every input of a Q8.4 format, three lanes, random idle and backpressure; every output within
    the unit's error bound of the real function."""
    cfg = profile("tiny", act_width=8, act_frac=4, score_frac=7, act_lanes=3, rounding=rounding)
    unit, golden, _ = FUNCTIONS[name]
    seed = 23
    xs = np.random.default_rng(seed).permutation(np.arange(-128, 130) % 256 - 128).reshape(-1, 3)
    dut = unit(cfg)
    got = np.array(bench_activation.amaranth_stream(dut, [[int(v) for v in row] for row in xs], seed))
    np.testing.assert_array_equal(got, golden(xs, cfg), err_msg=f"seed {seed}")
    err = np.abs(got * 2.0 ** -dut.table.out_frac - _real(name, cfg)(xs / 2.0 ** cfg.act_frac))
    assert err.max() <= dut.error_bound, (name, rounding, err.max(), dut.error_bound)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("key", FUNCTION_KEYS)
def test_exhaustive_on_verilator(key, name):
    """Every act-format input (2**16) through the RTL stream (shuffled; full rate, then random
    idle and backpressure), bit for bit against the golden function."""
    bench_activation.run(key, "function_exhaustive", seed=37, unit=name)


@pytest.mark.parametrize("profile_name", ["tiny", "small"])
def test_error_bound_is_the_documented_one(profile_name):
    """Each unit's error_bound is the bound golden.errors documents (docs/errors.md), and the golden
    table's error against the real function, over every input, is within it (the hardware equals
    the table over every input: the Verilator test)."""
    cfg = profile(profile_name)
    rows = {r.op: r for r in errors.op_errors(cfg) + errors.kda_op_errors(cfg)}
    for unit, op in ((Exp, "exp"), (Silu, "SiLU"), (Decay, "KDA decay")):
        row = rows[op]
        assert row.inputs == f"all {1 << cfg.act_width}", row
        assert unit(cfg).error_bound == row.bound == 1.5 * row.lsb, row
        assert row.max_abs <= row.bound, row


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_ports_and_latency(name):
    cfg = profile("small")
    unit, _, out_shape = FUNCTIONS[name]
    dut = unit(cfg)
    assert dut.i.payload.shape().length == dut.o.payload.shape().length == cfg.act_lanes
    assert dut.i.payload.shape().elem_shape == signed(cfg.act_width)
    assert dut.o.payload.shape().elem_shape == out_shape(cfg)
    assert dut.latency == 4


def test_functions_at_their_ends():
    """exp: 1.0 from 0 up, 0 at the bottom; SiLU: 0 at 0, the largest input itself; decay: 1.0 and
    exp(kda_gate_min) at the two ends."""
    cfg = profile("tiny")
    one, lo, hi = 1 << cfg.score_frac, -(1 << (cfg.act_width - 1)), (1 << (cfg.act_width - 1)) - 1
    np.testing.assert_array_equal(FUNCTIONS["exp"][1]([lo, 0, 1, hi], cfg), [0, one, one, one])
    np.testing.assert_array_equal(FUNCTIONS["silu"][1]([0, hi], cfg), [0, hi])
    decay = FUNCTIONS["decay"][1]([lo, hi], cfg)
    assert decay[0] == one and decay[1] == round(np.exp(cfg.kda_gate_min) * one)


def test_stream_rejects_bad_parameters():
    cfg = profile("tiny")
    table = sigmoid_table(cfg)
    with pytest.raises(TypeError, match="KpuConfig"):
        Exp({"act_lanes": 1})
    with pytest.raises(TypeError, match="PwlTable"):
        PwlStream(table.values, 1, unsigned(13))
    with pytest.raises(ValueError, match="lanes"):
        PwlStream(table, 0, unsigned(13))
    with pytest.raises(ValueError, match="dsp"):
        PwlStream(table, 1, unsigned(13), dsp="xilinx")
    # Outputs [0, 4096]: 12 bits miss 1.0, a signed 13 the same; a negative one needs a signed shape.
    for narrow in (unsigned(12), signed(13)):
        with pytest.raises(ValueError, match=r"out_shape = .*\[0, 4096\]"):
            PwlStream(table, 1, narrow)
    tanh = fit_pwl(np.tanh, in_width=8, in_frac=5, out_frac=6, guard=2, rounding="half_even")
    with pytest.raises(ValueError, match="out_shape"):
        PwlStream(tanh, 1, unsigned(8))
