"""The default cocotb benches on a second simulator: Icarus Verilog, small configurations.

Each test runs an existing bench (sim/bench_*.py, owned by its unit) on Icarus with the
same parameters and seed as a Verilator run of it; every bench checks each output bit for bit
against the golden integer model, so passing on both simulators means both produce the same
outputs. Icarus with cocotb is slow: the workloads are a few hundred transactions at most.
Icarus comes from Debian's ``iverilog`` package, which .ci/run installs; where it is missing the
tests skip with the reason (and fail under CI).
"""

from __future__ import annotations

import os
import shutil
import xml.etree.ElementTree as ET

import pytest

from nanokpu.config import PROFILES, profile
from sim.runner import run_bench

SEED = 8


@pytest.fixture(scope="session", autouse=True)
def iverilog():
    """Icarus Verilog on PATH (Debian's ``iverilog``; .ci/run installs it). Without it the tests
    skip, except under CI, where a missing simulator fails them."""
    path = shutil.which("iverilog")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("iverilog is not installed: .ci/run installs it (apt-get install iverilog)")
        pytest.skip("Icarus Verilog (iverilog) is not installed: apt-get install iverilog")
    return path


def _sim_times(results_xml) -> dict[str, float]:
    """Simulated duration of each bench testcase (ns) from a cocotb results file (a skipped one,
    e.g. a bench's layer_ops testcase on a build without them, has none)."""
    times = {}
    for case in ET.parse(results_xml).iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if "sim_time_duration" in props:
            times[case.get("name")] = round(float(props["sim_time_duration"]), 3)
    return times


def _both(component, name, module, **kwargs):
    """Run the bench on Verilator then on Icarus (same Verilog, parameters and seed).

    Both must pass (bit-exact to the golden model) and every testcase must take the same
    simulated time on both: the benches wait on the design's handshakes, so equal times
    mean the same cycle-by-cycle behaviour.
    """
    times = {sim: _sim_times(run_bench(component, name, module, simulator=sim, **kwargs))
             for sim in ("verilator", "icarus")}
    assert times["verilator"] == times["icarus"], f"{name}: simulated times differ: {times}"
    assert times["icarus"], f"{name}: no testcase ran"


@pytest.mark.slow(65)
def test_router_tiny():
    """Random tokens, ties and extremes through the top-k engine (tiny: 8 experts, top-2)."""
    from nanokpu.units.router import TopKRouter

    cfg = profile("tiny")
    dut = TopKRouter(cfg)
    params = {"seed": SEED, "tokens": 6,
              "cycles_per_token": dut.cycles_per_token, "latency": dut.latency}
    _both(dut, "router_tiny", "bench_router", params=params, seed=SEED,
          testcase=["random_tokens", "ties", "extremes", "clear_midstream"])


def test_gemm_2x2():
    """GEMM engine on a 2x2 array: extremes with accumulation and bad commands."""
    from nanokpu.units.gemm import GemmEngine

    overrides = {"rows": 2, "cols": 2}
    _both(GemmEngine(profile("tiny", **overrides)), "gemm_2x2", "bench_gemm",
          params={"out_width": None, "seed": SEED}, seed=SEED,
          testcase=["test_extremes_and_accumulate", "test_bad_commands"])


def test_vector_tiny():
    """Vector unit: saturating add, weighted combine, RMSNorm."""
    from nanokpu.units.vector import VectorUnit

    _both(VectorUnit(profile("tiny")), "vector_tiny", "bench_vector", params={"seed": SEED}, seed=SEED)


@pytest.mark.slow(85)
def test_situ_and_sigmoid():
    """SiTU-GLU random pairs (no sweep) and the exhaustive sigmoid of the narrow bench format."""
    from sim import bench_activation

    key = sorted(bench_activation.BENCH_CONFIGS)[0]
    bench = bench_activation.ActivationBench(bench_activation.BENCH_CONFIGS)
    _both(bench, "activation", "bench_activation", testcase=["situ_random"], seed=SEED,
          config=bench_activation.BENCH_CONFIGS[key],
          params={"key": key, "seed": SEED, "n_random": 64, "sweep": False})


def test_top_tiny_block_and_bad_programs():
    """The whole nano-KPU through its AXI buses: one tiny block end to end, the bad programs."""
    from nanokpu.kpu.top import NanoKPU

    _both(NanoKPU(PROFILES["tiny"]), "kpu_tiny", "bench_top", testcase=["test_block", "test_bad_programs"],
          params={"tokens": 2, "seed": SEED, "seeds": 1}, seed=SEED)
