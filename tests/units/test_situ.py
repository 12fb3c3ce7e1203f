# amaranth: UnusedElaboratable=no
"""nanokpu.units.situ: fixed-point SiTU-GLU, bit-exact to golden.intops.situ_q; its bound and error."""

import numpy as np
import pytest

from golden.intops import gate_q, situ_q, up_q
from nanokpu.commands.report_activation import factor_errors, situ_errors
from nanokpu.config import KpuConfig, profile
from nanokpu.units.situ import Situ, situ_error_bound, situ_h_range
from sim import bench_activation

#: Two beta settings (K3's 4/25 and 2/8), both used by the Verilator benches.
BETAS = [(4.0, 25.0), (2.0, 8.0)]


def _narrow(**overrides) -> KpuConfig:
    """A Q8.4 input format (exhaustive in the Amaranth simulator): h in Q12.4 holds +-100."""
    return profile("tiny", act_width=8, act_frac=4, situ_frac=6, h_width=12, h_frac=4, **overrides)


@pytest.mark.parametrize("lanes, rounding, guard", [(1, "half_even", 4), (3, "floor", 0), (2, "half_up", 2)])
def test_situ_narrow_format_with_idle_and_backpressure(lanes, rounding, guard):
    """Every g with a random u and every u with a random g, every rounding mode, Amaranth simulator."""
    cfg = _narrow(act_lanes=lanes, rounding=rounding, pwl_guard=guard)
    seed = 40 + lanes
    pairs = bench_activation.situ_pairs(cfg, seed, n_random=64, sweep=True)
    pairs = pairs[: len(pairs) - len(pairs) % lanes].reshape(-1, lanes, 2)
    payloads = [[{"g": int(g), "u": int(u)} for g, u in row] for row in pairs]
    got = bench_activation.amaranth_stream(Situ(cfg), payloads, seed)
    np.testing.assert_array_equal(np.array(got), situ_q(pairs[..., 0], pairs[..., 1], cfg), err_msg=f"seed {seed}")


@pytest.mark.parametrize("key", sorted(bench_activation.BENCH_CONFIGS))
def test_situ_on_verilator(key):
    """Corner grid of the input format, 4096 random pairs, every g with a random u and every u
    with a random g; full rate, then random idle and backpressure; bit for bit."""
    bench_activation.run(key, "situ_random", seed=51, n_random=4096, sweep=True)


@pytest.mark.parametrize("beta1, beta2", BETAS)
def test_bound_over_all_inputs(beta1, beta2):
    """max |h| over all 2**32 input pairs (from the exhaustive factors: h is monotone in the
    product) never exceeds beta1*beta2 in Q<h_width>.<h_frac>, and the format holds it."""
    cfg = profile("tiny", beta1=beta1, beta2=beta2)
    xs = np.arange(-(1 << (cfg.act_width - 1)), 1 << (cfg.act_width - 1))
    g, u = gate_q(xs, cfg), up_q(xs, cfg)
    assert g.max() <= beta1 * 2 ** cfg.situ_frac and -g.min() <= beta1 * 2 ** cfg.situ_frac
    assert np.abs(u).max() <= beta2 * 2 ** cfg.situ_frac
    corners = situ_q(np.array([g.argmin(), g.argmin(), g.argmax(), g.argmax()]) + xs[0],
                     np.array([u.argmin(), u.argmax(), u.argmin(), u.argmax()]) + xs[0], cfg)
    lo, hi = situ_h_range(cfg)
    assert (lo, hi) == (corners.min(), corners.max())
    assert max(-lo, hi) <= beta1 * beta2 * 2 ** cfg.h_frac < 2 ** (cfg.h_width - 1)
    dut = Situ(cfg)
    assert dut.h_range == (lo, hi) and dut.o.payload.shape().elem_shape.width == cfg.h_width
    # The extremes are reached at the ends of the input format (the bench's corner grid).
    top = xs[-1]
    assert situ_q([top], [top], cfg)[0] == hi


@pytest.mark.parametrize("beta1, beta2", BETAS)
def test_error_against_float(beta1, beta2):
    """Factors over every input, h over every g (u) with 48 partners: within the documented bounds."""
    cfg = profile("tiny", beta1=beta1, beta2=beta2)
    h = situ_errors(cfg, partners=48, seed=61)
    for name, err in {**factor_errors(cfg), "h": h}.items():
        assert err["max_abs"] <= err["bound"], (name, err)
        assert err["max_rel"] <= err["rel_bound"], (name, err)
    assert h["bound"] == situ_error_bound(cfg) == Situ(cfg).error_bound


def test_latency_and_ports():
    cfg = profile("small")
    dut = Situ(cfg)
    assert dut.latency == 6
    assert dut.i.payload.shape().length == dut.o.payload.shape().length == cfg.act_lanes
    assert dut.i.payload.shape().elem_shape.size == 2 * cfg.act_width


@pytest.mark.parametrize("field, value", [
    ("beta1", 0.0), ("beta1", -4.0), ("beta2", 0.0), ("beta2", -25.0),
    ("act_lanes", 0),
    ("h_width", 15),   # Q15.8 holds at most 63.99 < beta1*beta2 = 100
    ("h_frac", 21),    # more than 2 * situ_frac: the product cannot be shifted left
])
def test_invalid_configs_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        profile("tiny", **{field: value})


def test_rounding_of_non_dyadic_betas_is_caught_by_the_unit():
    """Betas whose bound passes the config's analytic check, but whose factor tables round up
    past it: the exact range check of the unit refuses h_width (h would reach 32770)."""
    cfg = profile("tiny", beta1=4 + 0.6 / 1024, beta2=(32767 - 0.25) / 256 / (4 + 0.6 / 1024), act_frac=0)
    assert cfg.situ_bound * 2 ** cfg.h_frac <= 2 ** (cfg.h_width - 1) - 1
    with pytest.raises(ValueError, match="h_width"):
        Situ(cfg)
    with pytest.raises(TypeError, match="KpuConfig"):
        Situ(None)
