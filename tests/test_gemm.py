"""GEMM engine on Verilator (cocotb, sim/bench_gemm.py): bit-exact to golden.intops.matmul_int
and requantize, random idle and backpressure on every stream, refused bad commands, exact cycles.

Each hardware parameter set builds in its own directory (``sim_build/<name>-<verilog hash>``).
"""

import gc
import warnings

import pytest
from amaranth.hdl import UnusedElaboratable

from nanokpu.config import profile
from nanokpu.gemm import GemmEngine, command_layout
from sim.runner import run_bench

# (id, profile, overrides, out_width): at least 2x2, 4x4, 8x8 and a non-square array; all
# three rounding modes; a 16-bit accumulator that wraps; a raw 32-bit read-out.
FAST = [
    ("8x8", "small", {}, None),
]
SLOW = [
    ("2x2", "tiny", {"rows": 2, "cols": 2}, None),
    ("2x4-raw", "tiny", {"rows": 2, "cols": 4}, 32),
    ("2x2-floor-acc16", "tiny", {"rows": 2, "cols": 2, "rounding": "floor", "acc_width": 16}, None),
    ("2x2-half_up", "tiny", {"rows": 2, "cols": 2, "rounding": "half_up"}, None),
    ("4x4", "tiny", {}, None),
    ("3x2", "tiny", {"rows": 3, "cols": 2, "spad_b_depth": 64}, 16),
]


def bench(name, overrides, out_width, seed, **extra):
    cfg = profile(name, **overrides)
    engine = GemmEngine(cfg, out_width)
    params = {"profile": name, "overrides": overrides, "out_width": out_width, "seed": seed, **extra}
    run_bench(engine, "gemm", "bench_gemm", params=params, seed=seed)


@pytest.mark.parametrize("case", FAST, ids=[c[0] for c in FAST])
def test_gemm_bench(case):
    _, name, overrides, out_width = case
    bench(name, overrides, out_width, seed=11)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=[c[0] for c in SLOW])
def test_gemm_bench_slow(case):
    _, name, overrides, out_width = case
    bench(name, overrides, out_width, seed=23)


def test_gemm_64x256x256_on_8x8_is_exact_and_busy():
    """The benchmark's headline: cycles equal GemmEngine.ideal_cycles and the array is busy
    >= 90% of them (ideal = MACs / 64), loading and storing included."""
    cfg = profile("small")
    engine = GemmEngine(cfg)
    cycles = engine.ideal_cycles(64, 256, 256)
    assert 64 * 256 * 256 / 64 / cycles >= 0.90
    run_bench(engine, "gemm", "bench_gemm", testcase="test_exact_cycles", seed=3,
              params={"profile": "small", "seed": 3, "timing": [[64, 256, 256]]})


def test_command_layout_fields_hold_the_scratchpads():
    cfg = profile("small")
    layout = command_layout(cfg)
    assert layout.size == sum(f.width for _, f in layout)
    assert 1 << layout["a_addr"].shape.width > cfg.spad_a_depth  # an address past the end is refused,
    assert 1 << layout["c_addr"].shape.width > cfg.spad_c_depth  # not wrapped
    assert 1 << layout["m"].shape.width > cfg.rows * cfg.spad_c_depth


def test_ideal_cycles_of_the_headline_gemm():
    """64 x 256 x 256 on 8x8: 10 (check) + 256 (panel 0) + 256 * 256 - 23 * 0 (tiles of K >
    tile_gap) + 25 (tail) + 2048 + 6 (store)."""
    engine = GemmEngine(profile("small"))
    assert engine.tile_gap == 23
    assert engine.ideal_cycles(64, 256, 256) == 10 + 256 + 256 * 256 + 25 + 2048 + 6
    keep_alive(engine)


@pytest.mark.parametrize("field, value", [("spad_b_depth", 7), ("spad_a_depth", 0), ("spad_c_depth", 1 << 21)])
def test_config_rejects_bad_scratchpads(field, value):
    with pytest.raises(ValueError, match=f"KpuConfig.{field} = {value}"):
        profile("tiny", **{field: value})


def keep_alive(component):
    """A component built only for its Python-side timing model is not an unused design."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        del component
        gc.collect()
