# amaranth: UnusedElaboratable=no
"""nanokpu.units.sigmoid: the router's fixed-point sigmoid, bit-exact to golden.intops.sigmoid_q."""

import numpy as np
import pytest
from amaranth import signed

from golden.intops import sigmoid_q, sigmoid_table
from nanokpu.commands.report_activation import factor_errors
from nanokpu.config import profile
from nanokpu.units.sigmoid import Sigmoid
from sim import bench_activation


@pytest.mark.parametrize("rounding", ["half_even", "half_up", "floor"])
def test_sigmoid_narrow_format_with_idle_and_backpressure(rounding):
    """Every input of a Q8.4 format, three lanes, random idle and backpressure."""
    cfg = profile("tiny", act_width=8, act_frac=4, score_frac=7, act_lanes=3, rounding=rounding)
    seed = 21
    xs = np.random.default_rng(seed).permutation(np.arange(-128, 130) % 256 - 128).reshape(-1, 3)
    got = bench_activation.amaranth_stream(Sigmoid(cfg), [[int(v) for v in row] for row in xs], seed)
    np.testing.assert_array_equal(np.array(got), sigmoid_q(xs, cfg), err_msg=f"seed {seed}")


def test_sigmoid_takes_logits_in_their_own_format():
    """Logits Q10.6 (wider than the Q8.4 act format): the input port is logit_width bits and
    every logit, the top bits included, gives golden.intops.sigmoid_q's score."""
    cfg = profile("tiny", act_width=8, act_frac=4, logit_width=10, logit_frac=6, score_frac=7, act_lanes=2)
    dut = Sigmoid(cfg)
    assert dut.i.payload.shape().elem_shape == signed(10)
    seed = 22
    xs = np.random.default_rng(seed).permutation(np.arange(-512, 512)).reshape(-1, 2)
    got = bench_activation.amaranth_stream(dut, [[int(v) for v in row] for row in xs], seed)
    np.testing.assert_array_equal(np.array(got), sigmoid_q(xs, cfg), err_msg=f"seed {seed}")


def test_sigmoid_ports_and_latency():
    cfg = profile("small")
    dut = Sigmoid(cfg)
    assert dut.i.payload.shape().length == dut.o.payload.shape().length == cfg.act_lanes
    assert dut.o.payload.shape().elem_shape.width == cfg.score_width
    assert not dut.o.payload.shape().elem_shape.signed
    assert dut.latency == 4
    assert dut.error_bound == 1.5 * 2.0 ** -cfg.score_frac


@pytest.mark.parametrize("key", ["b4x25_l1", "b4x25_l4", "b4x25_l1_ecp5", "logit20_l4"])
def test_sigmoid_exhaustive_on_verilator(key):
    """Every logit through the RTL stream (shuffled; full rate, then random idle and backpressure);
    ``logit20_l4``: all 2**20 logits of issue 26's Q20.16 format to 16-bit scores."""
    bench_activation.run(key, "sigmoid_exhaustive", seed=31)


@pytest.mark.parametrize("key", ["b4x25_l1", "logit20_l4"])
def test_sigmoid_error_and_shape(key):
    """Against float64 over every input: within the documented bound, monotone, in [0, 1]."""
    cfg = bench_activation.BENCH_CONFIGS[key]
    err = factor_errors(cfg)["sigmoid"]
    assert err["max_abs"] <= err["bound"] and err["max_rel"] <= err["rel_bound"], err
    xs = np.arange(-(1 << (cfg.router_logit_width - 1)), 1 << (cfg.router_logit_width - 1))
    s = sigmoid_q(xs, cfg)
    assert np.all(np.diff(s) >= 0) and s.min() >= 0 and s.max() <= 1 << cfg.score_frac
    assert sigmoid_q([0], cfg)[0] == 1 << (cfg.score_frac - 1)
    assert sigmoid_table(cfg).n_seg <= 512  # one or two block RAMs


def test_sigmoid_rejects_bad_configs():
    with pytest.raises(ValueError, match="act_lanes"):
        profile("tiny", act_lanes=0)
    with pytest.raises(TypeError, match="KpuConfig"):
        Sigmoid({"act_lanes": 1})
