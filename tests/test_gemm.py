"""GEMM engine on Verilator (cocotb, sim/bench_gemm.py): bit-exact to golden.intops.matmul_int
and requantize, random idle and backpressure on every stream, refused bad commands, exact cycles.

Each hardware parameter set builds in its own directory (``sim_build/<name>-<verilog hash>``).
"""

import pytest

from nanokpu.bench_gemm import breakdown
from nanokpu.config import profile
from nanokpu.gemm import GemmEngine, command_layout, gemm_cycles, tile_gap
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
    """The benchmark's headline: cycles equal gemm_cycles and the array is busy >= 90% of
    them (ideal = MACs / 64), loading and storing included."""
    cfg = profile("small")
    cycles = gemm_cycles(cfg, 64, 256, 256)
    assert 64 * 256 * 256 / 64 / cycles >= 0.90
    run_bench(GemmEngine(cfg), "gemm", "bench_gemm", testcase="test_exact_cycles", seed=3,
              params={"profile": "small", "seed": 3, "timing": [[64, 256, 256]]})


def test_command_layout_fields_hold_the_scratchpads():
    cfg = profile("small")
    layout = command_layout(cfg)
    assert layout.size == sum(f.width for _, f in layout)
    assert 1 << layout["a_addr"].shape.width > cfg.spad_a_depth  # an address past the end is refused,
    assert 1 << layout["c_addr"].shape.width > cfg.spad_c_depth  # not wrapped
    assert 1 << layout["m"].shape.width > cfg.rows * cfg.spad_c_depth


def test_ideal_cycles_of_the_headline_gemm():
    """64 x 256 x 256 on 8x8: 11 (check) + 1 (first words) + 256 tiles * 256 K steps (K >
    tile_gap: no gaps) + 28 (tail) + 2048 + 10 (store)."""
    cfg = profile("small")
    assert tile_gap(cfg) == 23
    assert gemm_cycles(cfg, 64, 256, 256) == 11 + 1 + 256 * 256 + 28 + 2048 + 10


@pytest.mark.parametrize("name", ["tiny", "small"])
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (5, 3, 9), (64, 7, 70), (17, 300, 3)])
def test_benchmark_breakdown_sums_to_the_cycle_model(name, m, k, n):
    cfg = profile(name)
    assert sum(breakdown(cfg, m, k, n).values()) == gemm_cycles(cfg, m, k, n)


@pytest.mark.parametrize("field, value", [("spad_b_depth", 7), ("spad_a_depth", 0), ("spad_c_depth", 1 << 21)])
def test_config_rejects_bad_scratchpads(field, value):
    with pytest.raises(ValueError, match=f"KpuConfig.{field} = {value}"):
        profile("tiny", **{field: value})
