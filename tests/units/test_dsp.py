# amaranth: UnusedElaboratable=no
"""nanokpu/units/dsp.py: the DSP-mapped multipliers.

* ``generic``: the Amaranth simulator, random and extreme operands, random clock enable,
  against a cycle model whose arithmetic is :func:`golden.intops.matmul_int`.
* ``ice40``: the hand-instantiated SB_MAC16 (dual 8x8 mode) simulated on Verilator with Yosys'
  own SB_MAC16 model, every operand pair on every lane (sim/bench_dsp.py); and synthesis shows
  one block per two lanes and no fabric logic.
* ``ecp5``: MULT18X18D is a black box in Yosys (no simulation model), so the check is
  structural: one block per lane, its registers packed (no fabric flip-flop, no LUT), and
  nextpnr places it.
* The GEMM engine with ``KpuConfig.dsp = "ice40"``: the tiny engine (its array on SB_MAC16
  dual 8x8 blocks, its requantiser bit-serial) runs the whole GEMM bench (sim/bench_gemm.py:
  random and extreme operands, bit-exact to the golden model, exact cycles) on Verilator
  with Yosys' SB_MAC16 model, and synthesizes into the UP5K's 8 SB_MAC16.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from amaranth.sim import Simulator

from fpga.flow import BUILD_DIR, synthesize, vendor_sim_model
from golden.intops import matmul_int
from nanokpu.config import profile
from nanokpu.units.dsp import Multiplier
from nanokpu.units.gemm import GemmEngine
from sim.runner import run_bench


def _golden(a: int, b: int, width: int) -> int:
    return int(matmul_int([[a]], [[b]], acc_width=2 * width)[0, 0])


@pytest.mark.parametrize("width,lanes,latency", [(8, 2, 1), (8, 3, 2), (18, 1, 1), (3, 2, 2)])
def test_generic_matches_golden(width, lanes, latency):
    seed = 7 * width + lanes + latency
    rng = np.random.default_rng(seed)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    edges = [lo, hi, 0, -1, 1, lo + 1]
    dut = Multiplier(width, lanes, latency=latency)

    async def bench(ctx):
        held = [(0, 0)] * lanes
        prod = [0] * lanes
        for cycle in range(300):
            for i in range(lanes):
                got = ctx.get(dut.p[i])
                assert got == prod[i], f"cycle {cycle} lane {i}: {got} != {prod[i]} (seed {seed})"
            if cycle < len(edges) ** 2:  # every pair of extremes first, then random operands
                pairs = [(edges[cycle // len(edges)], edges[(cycle + i) % len(edges)]) for i in range(lanes)]
            else:
                pairs = [tuple(int(x) for x in rng.integers(lo, hi + 1, 2)) for _ in range(lanes)]
            en = int(rng.random() < 0.8)
            for i, (a, b) in enumerate(pairs):
                ctx.set(dut.a[i], a)
                ctx.set(dut.b[i], b)
            ctx.set(dut.en, en)
            await ctx.tick()
            if en:
                src = held if latency == 2 else pairs
                prod = [_golden(a, b, width) for a, b in src]
                held = pairs

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("width,lanes,latency", [(8, 3, 2), (6, 2, 1)])
def test_ice40_sb_mac16_exhaustive_on_vendor_model(width, lanes, latency):
    model = vendor_sim_model("SB_MAC16", "ice40")
    dut = Multiplier(width, lanes, latency=latency, target="ice40")
    run_bench(dut, f"dsp_ice40_w{width}_l{lanes}_p{latency}", "bench_dsp",
              params={"width": width, "lanes": lanes, "latency": latency, "seed": width + lanes},
              build_args=(str(model), "-Wno-MULTIDRIVEN", "-Wno-PINMISSING"))


@pytest.mark.parametrize("latency", [1, 2])
def test_ice40_uses_one_block_per_two_lanes(latency):
    dut = Multiplier(8, 3, latency=latency, target="ice40")
    assert dut.blocks == 2
    report = synthesize(dut, "dsp_ice40", "up5k", build_dir=BUILD_DIR / f"test-up5k-dsp{latency}")
    assert report["resources"]["dsp"] == 2
    assert report["resources"]["lut"] == 0 and report["resources"]["ff"] == 0, report["cells"]
    assert report["latches"] == 0 and report["unmapped"] == {}


def test_ecp5_packs_registers_into_mult18x18d():
    dut = Multiplier(8, 2, latency=2, target="ecp5")
    assert dut.blocks == 2
    report = synthesize(dut, "dsp_ecp5", "ecp5-25f", pnr=True, build_dir=BUILD_DIR / "test-ecp5-25f-dsp")
    assert report["resources"]["dsp"] == 2
    assert report["resources"]["lut"] == 0 and report["resources"]["ff"] == 0, report["cells"]
    assert report["latches"] == 0 and report["unmapped"] == {}
    netlist = json.loads((BUILD_DIR / "test-ecp5-25f-dsp" / "dsp_ecp5.json").read_text())
    cells = [c for c in netlist["modules"]["dsp_ecp5"]["cells"].values() if c["type"] == "MULT18X18D"]
    assert len(cells) == 2
    for cell in cells:
        for reg in ("REG_INPUTA_CLK", "REG_INPUTB_CLK", "REG_OUTPUT_CLK"):
            assert cell["parameters"][reg] == "CLK0"
    # Placed and routed: the two blocks, no fabric flip-flop (so no clock path to time).
    used = {k: v["used"] for k, v in report["pnr"]["utilization"].items()}
    assert used["MULT18X18D"] == 2 and "TRELLIS_FF" not in used, used


@pytest.mark.parametrize("kwargs,field", [
    ({"width": 9, "target": "ice40"}, "width"), ({"width": 19}, "width"), ({"width": 8, "lanes": 0}, "lanes"),
    ({"width": 8, "latency": 3}, "latency"), ({"width": 8, "target": "xilinx"}, "target"),
])
def test_bad_parameters_name_the_field(kwargs, field):
    width = kwargs.pop("width")
    with pytest.raises(ValueError, match=f"^{field} = "):
        Multiplier(width, **kwargs)


def test_tiny_gemm_on_ice40_blocks_is_bit_exact():
    model = vendor_sim_model("SB_MAC16", "ice40")
    cfg = profile("tiny", dsp="ice40")
    # exact cycles (gemm_cycles) with K above and below tile_gap (broadcast array, columns
    # waiting in it, the bit-serial requantiser)
    m, n = 2 * cfg.rows + 1, 2 * cfg.cols + 1
    timing = [[cfg.rows, 2, cfg.cols], [m, 40, n], [m, 3, n]]
    run_bench(GemmEngine(cfg), "gemm", "bench_gemm", seed=31,
              params={"seed": 31, "timing": timing},
              build_args=(str(model), "-Wno-MULTIDRIVEN", "-Wno-PINMISSING"))


def test_tiny_gemm_on_ice40_fits_the_up5k_dsp_blocks():
    """Yosys only: the 16 PE products in 8 SB_MAC16, the requantiser in the fabric."""
    report = synthesize(GemmEngine(profile("tiny", dsp="ice40")), "gemm_ice40", "up5k",
                        build_dir=BUILD_DIR / "test-up5k-gemm-ice40")
    assert report["resources"]["dsp"] == 8, report["cells"]
    assert report["latches"] == 0 and report["unmapped"] == {}
