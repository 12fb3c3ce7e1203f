"""``nanokpu bench-gemm`` (nanokpu/commands/bench_gemm.py): the UP5K (``dsp = "ice40"``) table, cycles
measured on Verilator with and without store, MAC/s from the measured Fmax of a report."""

from __future__ import annotations

import json

from fpga.flow import BUILD_DIR
from nanokpu.commands.bench_gemm import ice40_table, run_profile, up5k_fmax
from nanokpu.config import profile
from nanokpu.host.compiler import block_gemms
from nanokpu.units.gemm import gemm_cycles


def test_ice40_bench_times_every_block_gemm_with_and_without_store():
    """The tiny engine built for the UP5K (SB_MAC16 model), every GEMM of a 16-token block;
    the bench itself asserts each count against gemm_cycles, bit-exact results included."""
    cfg, rows = run_profile("tiny", seed=4, dsp="ice40")
    assert cfg.dsp == "ice40"
    shapes = [(m, k, n) for _, m, k, n in block_gemms(cfg, 16)]
    assert [(r["m"], r["k"], r["n"]) for r in rows] == shapes
    assert [r["cycles"] for r in rows] == [gemm_cycles(cfg, *s) for s in shapes]
    assert [r["cycles_compute"] for r in rows] == [gemm_cycles(cfg, *s, store=False) for s in shapes]


def _row(m, k, n, cycles, compute):
    return {"name": "g", "m": m, "k": k, "n": n, "cycles": cycles, "cycles_compute": compute,
            "parts": {"store": cycles - compute + 1}, "rate": 1000.0}


def test_ice40_table_gives_mac_per_cycle_and_mac_per_second_at_the_fmax():
    cfg = profile("tiny", dsp="ice40")
    fmax = {"mhz": 25.0, "seed": 2, "flow": "register-wrapper", "command": "nanokpu synth X",
            "path": "fpga/reports/tiny-up5k.json", "current": True}
    text = ice40_table("tiny", cfg, [_row(16, 32, 32, 4096, 1024)], fmax)
    # 16384 MACs: 4 MAC/cycle (25%) = 100 M MAC/s at 25 MHz; compute only 16 MAC/cycle = 400 M
    assert "| g | 16 x 32 x 32 | 4096 | 25.0% | 4.00 | 100 M | 3073 | 1024 | 100.0% | 16.00 | 400 M | 1000 |" in text
    assert "**25.0 MHz**" in text and "`nanokpu synth X`, nextpnr seed 2" in text
    assert "made from the RTL timed here" in text and "Peak: 16 MAC/cycle, 400 M MAC/s" in text
    stale = ice40_table("tiny", cfg, [_row(16, 32, 32, 4096, 1024)], {**fmax, "current": False, "seed": None})
    assert "earlier RTL" in stale and "nextpnr seed not recorded" in stale
    bare = ice40_table("tiny", cfg, [_row(16, 32, 32, 4096, 1024)], None)
    assert "| 4096 | 25.0% | 4.00 | - |" in bare and "No MAC/s" in bare


def test_up5k_fmax_reads_the_report_and_checks_its_rtl(monkeypatch):
    import fpga.flow
    reports = BUILD_DIR / "test-bench-gemm-reports"
    reports.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(fpga.flow, "REPORT_DIR", reports)
    (reports / "tiny-up5k.json").unlink(missing_ok=True)
    assert up5k_fmax("tiny") is None
    gemm = {"name": "gemm", "profile": "tiny", "target": "up5k", "key": "not this rtl",
            "pnr": {"fmax_mhz": 28.5, "seed": 3, "flow": "register-wrapper", "goal_mhz": 30.0}}
    sigmoid = {**gemm, "name": "sigmoid", "pnr": {**gemm["pnr"], "fmax_mhz": 50.0}}
    (reports / "tiny-up5k.json").write_text(json.dumps({"command": "nanokpu synth Y", "reports": [sigmoid, gemm]}))
    got = up5k_fmax("tiny")
    assert got == {"mhz": 28.5, "seed": 3, "flow": "register-wrapper", "command": "nanokpu synth Y",
                   "path": "fpga/build/test-bench-gemm-reports/tiny-up5k.json", "current": False}
