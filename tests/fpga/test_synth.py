"""The FPGA flow: synthesis, core-only place and route, reports (fpga/flow.py, fpga/report.py,
nanokpu/commands/synth.py).

The default suite synthesizes one small registered MAC (a test component) on each family in a
few seconds and checks that the reports parse, that the multiply lands in a DSP block, that the
design has no latches and no unmapped cells, and that a latch is caught when there is one. The
full benchmark is a command, ``nanokpu synth --all``, not a test.
"""

from __future__ import annotations

import json

import pytest
from amaranth import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from fpga.boards import BOARDS
from fpga.flow import BUILD_DIR, TARGETS, ToolError, made_from, summary_line, synthesize
from fpga.report import markdown_table, peak_macs, total_row
from nanokpu.config import profile


class RegisteredMac(wiring.Component):
    """acc <= acc + a*b with registered operands (test component only)."""

    def __init__(self, width: int = 8, acc_width: int = 32):
        super().__init__({"a": In(signed(width)), "b": In(signed(width)), "acc": Out(signed(acc_width))})
        self.width = width

    def elaborate(self, platform):
        m = Module()
        ra, rb = Signal(signed(self.width)), Signal(signed(self.width))
        m.d.sync += [ra.eq(self.a), rb.eq(self.b), self.acc.eq(self.acc + ra * rb)]
        return m


#: RTLIL of a deliberate latch (Amaranth never makes one), to prove the check can fail.
LATCH_RTLIL = """
module \\test_latch
  wire input 1 \\en
  wire input 2 \\d
  wire output 3 \\q
  cell $dlatch $latch
    parameter \\WIDTH 1
    parameter \\EN_POLARITY 1'1
    connect \\EN \\en
    connect \\D \\d
    connect \\Q \\q
  end
end
"""


def mac_unit(cfg):
    """Factory in the style of nanokpu.commands.generate.UNITS (for the CLI test)."""
    return RegisteredMac(cfg.in_width, cfg.acc_width)


def _check_clean(report):
    assert report["latches"] == 0, report["cells"]
    assert report["unmapped"] == {}, report["unmapped"]
    assert report["check_warnings"] == [], report["check_warnings"]
    on_disk = json.loads((BUILD_DIR.parent.parent / report["build_dir"] / "report.json").read_text())
    assert on_disk["resources"] == report["resources"]


@pytest.mark.parametrize("target", ["up5k", "ecp5-25f"])
def test_mac_maps_to_one_dsp_and_closes_timing(target):
    report = synthesize(RegisteredMac(), "test_mac", target, pnr=True, seed=1,
                        build_dir=BUILD_DIR / f"test-{target}-mac")
    _check_clean(report)
    assert report["inferred"].get("$mul") == 1
    assert report["resources"]["dsp"] == 1
    assert report["totals"] == TARGETS[target].totals
    pnr = report["pnr"]
    assert pnr["flow"] == ("register-wrapper" if target == "up5k" else "out-of-context")
    assert pnr["fmax_mhz"] > TARGETS[target].goal_mhz, pnr
    assert pnr["met"]
    path = pnr["critical_path"]
    assert path["start"] and path["end"] and path["delay_ns"] > 0
    assert abs(path["logic_ns"] + path["routing_ns"] - path["delay_ns"]) < 0.01
    assert pnr["seed"] == 1 and [a["outcome"] for a in pnr["attempts"]] == ["routed"]
    if target == "up5k":  # the wrapper: 16 input bits + 32 output bits of flip-flops, 5 pins
        assert pnr["extra_ffs"] == 48
        assert pnr["utilization"]["SB_IO"]["used"] == 5
    else:
        assert "TRELLIS_IO" not in pnr["utilization"]


def test_latch_is_reported():
    with pytest.raises(ToolError, match=r"latches after proc: \{'\$dlatch': 1\}"):
        synthesize(LATCH_RTLIL, "test_latch", "up5k", build_dir=BUILD_DIR / "test-up5k-latch")


def test_bad_target_names_the_field():
    with pytest.raises(ValueError, match="target"):
        synthesize(LATCH_RTLIL, "test_latch", "xc7a35t")


@pytest.mark.xdist_group("mac_unit-ecp5-25f")   # one build directory: fpga/build/tiny-ecp5-25f-mac_unit
def test_cli_writes_json_markdown_and_chart():
    from nanokpu.cli import main
    out = BUILD_DIR / "test-cli-reports"
    rc = main(["synth", "--profile", "tiny", "--target", "ecp5-25f", "--no-pnr",
               "--unit", "tests.fpga.test_synth:mac_unit", "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "tiny-ecp5-25f.json").read_text())
    (report,) = data["reports"]
    assert report["name"] == "mac_unit" and report["resources"]["dsp"] == 1
    table = (out / "tiny-ecp5-25f.md").read_text()
    assert "| mac_unit | tiny | ecp5-25f |" in table and "1/28 (4%)" in table
    assert (out / "tiny-ecp5-25f.png").read_bytes()[:4] == b"\x89PNG"
    made_by = "Made by `nanokpu synth --profile tiny --target ecp5-25f --no-pnr --unit tests.fpga.test_synth:mac_unit"
    assert made_by in table


@pytest.mark.xdist_group("mac_unit-ecp5-25f")   # one build directory: fpga/build/tiny-ecp5-25f-mac_unit
def test_cli_compares_against_an_earlier_run(capsys):
    """``--against``: a second run prints each unit unchanged against the first's JSON, a
    changed baseline shows the differences, and a missing file names the flag."""
    from nanokpu.cli import main
    out = BUILD_DIR / "test-cli-against"
    argv = ["synth", "--profile", "tiny", "--target", "ecp5-25f", "--no-pnr",
            "--unit", "tests.fpga.test_synth:mac_unit", "--out", str(out)]
    assert main(argv) == 0
    baseline = out / "tiny-ecp5-25f.json"
    assert main([*argv, "--reuse", "--against", str(baseline)]) == 0
    printed = capsys.readouterr().out
    assert f"Change against {baseline}:" in printed
    assert "| mac_unit | tiny | ecp5-25f |" in printed and "| - | unchanged |" in printed
    data = json.loads(baseline.read_text())
    data["reports"][0]["resources"]["lut"] += 5
    older = out / "older.json"
    older.write_text(json.dumps(data))
    assert main([*argv, "--reuse", "--against", str(older)]) == 0
    assert "(-5)" in capsys.readouterr().out
    assert main([*argv, "--against", str(out / "missing.json")]) == 2
    assert "error: argument --against: " in capsys.readouterr().err
    from nanokpu.commands.synth import _recorded  # the reports' "made by" line leaves the flag out
    assert _recorded(["--all", "--against", "x.json", "--reuse", "--against=y.json", "--seed", "2"]) == [
        "--all", "--reuse", "--seed", "2"]


def test_compare_table_shows_changes_by_unit_and_part():
    from fpga.report import compare_table
    totals = TARGETS["up5k"].totals

    def unit(name, lut, lc, fmax, parts):
        return {"name": name, "profile": "tiny", "target": "up5k", "totals": totals,
                "resources": {"lut": lut, "lc": lc, "ff": 10, "dsp": 8, "bram": 2},
                "pnr": {"fmax_mhz": fmax}, "parts": {p: {"lut": n, "lc": n} for p, n in parts.items()}}

    old = [unit("gemm", 100, 120, 30.0, {"array": 70, "requant": 50}), unit("router", 50, 60, 40.0, {})]
    new = [unit("gemm", 90, 115, 31.5, {"array": 70, "requant": 40, "spad": 5}), unit("router", 50, 60, 40.0, {}),
           unit("situ", 20, 25, None, {})]
    table = compare_table(new, old)
    assert "| gemm | tiny | up5k | 90 (-10) | 115 (-5) | 10 | 8 | 2 | 31.50 (+1.50) | changed |" in table
    assert "| router | tiny | up5k | 50 | 60 | 10 | 8 | 2 | 40.00 | unchanged |" in table
    assert "| situ | tiny | up5k | 20 | 25 | 10 | 8 | 2 | - | new |" in table
    assert "- `gemm` (tiny, up5k), LC by part: requant -10, spad +5" in table
    assert "router` (" not in table


def test_timed_out_seed_is_retried_with_the_next(monkeypatch, capsys):
    """``--pnr-timeout`` kills the seed-1 run of nextpnr; seed 2 (given no limit here, standing
    in for a seed that routes in time) produces the result, and the report records it."""
    import fpga.flow as flow
    real = flow.run_tool

    def run_tool(argv, cwd, log, stage, progress, t0, timeout_s=None):
        if "--seed" in argv and argv[argv.index("--seed") + 1] != "1":  # place and route, not --pack-only
            timeout_s = None
        return real(argv, cwd, log, stage, progress, t0, timeout_s)

    monkeypatch.setattr(flow, "run_tool", run_tool)
    from nanokpu.cli import main
    out = BUILD_DIR / "test-cli-retry"
    argv = ["synth", "--profile", "tiny", "--target", "up5k", "--unit", "tests.fpga.test_synth:mac_unit",
            "--seed-tries", "2", "--pnr-timeout", "0.001", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "seed 1 timed out after 0.001 min, trying seed 2" in printed
    assert "Fmax" in printed and "seed 2)" in printed
    (report,) = json.loads((out / "tiny-up5k.json").read_text())["reports"]
    pnr = report["pnr"]
    assert pnr["seed"] == 2 and pnr["fmax_mhz"] > 0
    assert [(a["seed"], a["outcome"]) for a in pnr["attempts"]] == [(1, "timed out"), (2, "routed")]
    assert pnr["attempts"][0]["error"] == "timed out after 0.001 min"
    build = BUILD_DIR.parent.parent / report["build_dir"]
    assert pnr["attempts"][0]["log"].startswith("nanokpu_mac_unit_wrap.seed1.nextpnr.")  # .out if killed early
    assert (build / pnr["attempts"][0]["log"]).exists()
    assert "Program finished normally" in (build / pnr["attempts"][1]["log"]).read_text()
    assert "| register-wrapper | 2 |" in (out / "tiny-up5k.md").read_text()
    assert made_from(report, mac_unit(profile("tiny")), "nanokpu_mac_unit")  # the key: this RTLIL, seed 2
    assert not made_from(report, RegisteredMac(4), "nanokpu_mac_unit")
    assert main([*argv, "--reuse"]) == 0  # seed 2 is one of the seeds this run tries: reused
    assert "(unchanged, reused)" in capsys.readouterr().out
    assert json.loads((out / "tiny-up5k.json").read_text())["reports"][0]["pnr"]["seed"] == 2


def test_every_seed_failing_is_reported(monkeypatch):
    """nextpnr failing with every seed (faked: no nextpnr runs) leaves the synthesis report
    with each seed's error and no Fmax."""
    import fpga.flow as flow
    real = flow.run_tool
    tried = []

    def run_tool(argv, cwd, log, stage, progress, t0, timeout_s=None):
        if "--seed" not in argv:  # Yosys (and the iCE40 packer), not place and route
            return real(argv, cwd, log, stage, progress, t0, timeout_s)
        tried.append((int(argv[argv.index("--seed") + 1]), timeout_s))
        raise ToolError(f"{stage} failed (exit 1); log: {cwd / log}\nInfo: routing\nERROR: Failed to route design")

    monkeypatch.setattr(flow, "run_tool", run_tool)
    lines = []
    report = synthesize(RegisteredMac(), "test_pnr_fail", "ecp5-25f", pnr=True, seed=5, seed_tries=2,
                        pnr_timeout=2, build_dir=BUILD_DIR / "test-pnr-fail", progress=lines.append)
    assert tried == [(5, 120), (6, 120)]
    assert any("seed 5 failed: ERROR: Failed to route design, trying seed 6" in ln for ln in lines), lines
    pnr = report["pnr"]
    assert pnr["fmax_mhz"] is None and pnr["seed"] is None and not pnr["met"]
    assert pnr["error"] == ("ERROR: no seed placed and routed: seed 5 ERROR: Failed to route design; "
                            "seed 6 ERROR: Failed to route design")
    assert [(a["seed"], a["outcome"]) for a in pnr["attempts"]] == [(5, "failed"), (6, "failed")]
    assert report["resources"]["dsp"] == 1  # the synthesis report stays


def fake_nextpnr(monkeypatch, fmax_by_seed: dict) -> list:
    """Replace nextpnr (not Yosys) by a report of ``fmax_by_seed[seed]`` MHz (``None``: the run
    fails); returns the list of seeds run."""
    import fpga.flow as flow
    real = flow.run_tool
    tried = []

    def run_tool(argv, cwd, log, stage, progress, t0, timeout_s=None):
        if "--seed" not in argv:
            return real(argv, cwd, log, stage, progress, t0, timeout_s)
        seed = int(argv[argv.index("--seed") + 1])
        tried.append(seed)
        if fmax_by_seed[seed] is None:
            raise ToolError(f"{stage} failed (exit 1); log: {cwd / log}\nERROR: Failed to route design")
        (cwd / argv[argv.index("--report") + 1]).write_text(json.dumps(
            {"fmax": {"clk": {"achieved": fmax_by_seed[seed]}}, "utilization": {}, "critical_paths": []}))
        (cwd / argv[argv.index("-l") + 1]).write_text("Program finished normally.\n")

    monkeypatch.setattr(flow, "run_tool", run_tool)
    return tried


@pytest.mark.parametrize("fmax_by_seed,tries,ran,result_seed", [
    ({2: 99.4, 3: 109.6, 4: 120.0}, 3, [2, 3], 3),  # a near miss, then met: no third seed
    ({1: 60.0, 2: 99.0}, 3, [1], 1),                # a wide miss is the design's: no other seed
    ({1: 95.0, 2: 97.0, 3: 96.0}, 3, [1, 2, 3], 2),  # near misses only: the fastest
    ({1: 95.0, 2: None}, 2, [1, 2], 1),             # a near miss, then a failure: the near miss
    ({1: None, 2: 100.0}, 3, [1, 2], 2),            # a failure, then met exactly
])
def test_a_near_miss_of_the_goal_tries_the_next_seed(monkeypatch, tmp_path, fmax_by_seed, tries, ran, result_seed):
    from fpga.flow import NEAR_MISS, near_miss, place_and_route
    assert NEAR_MISS == 0.1 and near_miss(90.0, 100.0) and not near_miss(89.9, 100.0)
    assert not near_miss(100.0, 100.0) and not near_miss(None, 100.0) and not near_miss(95.0, None)
    tried = fake_nextpnr(monkeypatch, fmax_by_seed)
    lines = []
    result = place_and_route(["nextpnr-ecp5"], tmp_path, "top", "nextpnr", seed=ran[0], seed_tries=tries,
                             goal=100.0, progress=lines.append)
    assert tried == ran
    assert result["seed"] == result_seed and result["fmax_mhz"] == fmax_by_seed[result_seed]
    assert [(a["seed"], a.get("fmax_mhz")) for a in result["attempts"]] == [(s, fmax_by_seed[s]) for s in ran]
    if ran[0] == 2:
        assert any("seed 2 reached 99.4 MHz, 0.6% short of the 100 MHz goal, trying seed 3" in ln for ln in lines)


def test_reuse_tries_a_new_seed_after_a_near_miss(monkeypatch):
    """A report that missed the goal narrowly is reused by a run with the same seeds, and run
    again by one that would try a seed it did not."""
    tried = fake_nextpnr(monkeypatch, {1: 96.0, 2: 104.0})
    args = {"pnr": True, "freq": 100, "build_dir": BUILD_DIR / "test-near-miss", "reuse": True}
    first = synthesize(RegisteredMac(), "test_near_miss", "ecp5-25f", seed_tries=1, **args)
    assert (first["pnr"]["seed"], first["pnr"]["met"], tried) == (1, False, [1])
    again = synthesize(RegisteredMac(), "test_near_miss", "ecp5-25f", seed_tries=1, **args)
    assert again["key"] == first["key"] and tried == [1]  # reused: nothing else to try
    wider = synthesize(RegisteredMac(), "test_near_miss", "ecp5-25f", seed_tries=2, **args)
    assert (wider["pnr"]["seed"], wider["pnr"]["fmax_mhz"], wider["pnr"]["met"]) == (2, 104.0, True)
    assert tried == [1, 1, 2]


@pytest.mark.parametrize("flag, value, message", [
    ("--seed-tries", "0", "argument --seed-tries: 0: must be an integer >= 1"),
    ("--pnr-timeout", "-1", "pnr_timeout = -1.0"),
    ("--freq", "0", "argument --freq: 0: must be > 0"),
    ("--freq", "-5", "argument --freq: -5: must be > 0")])
def test_bad_pnr_flags_name_the_field(flag, value, message, capsys):
    from nanokpu.cli import main
    assert main(["synth", "--unit", "tests.fpga.test_synth:mac_unit", flag, value]) == 2
    assert message in capsys.readouterr().err


def test_total_row_sums_units():
    rows = [{"name": n, "target": "up5k", "family": "ice40", "totals": TARGETS["up5k"].totals,
             "resources": {"lut": lut, "ff": 1, "dsp": 2, "bram": 0}, "latches": 0, "unmapped": {}}
            for n, lut in (("a", 10), ("b", 32))]
    total = total_row(rows)
    assert total["resources"] == {"bram": 0, "dsp": 4, "ff": 2, "lut": 42}
    assert "| all units (sum) | - | up5k | 42/5280 (1%) |" in markdown_table([total])


def test_peak_macs_from_array_size_and_fmax():
    report = {"name": "gemm", "target": "up5k", "family": "ice40", "totals": TARGETS["up5k"].totals,
              "resources": {"lut": 1, "ff": 1, "dsp": 8, "bram": 0}, "latches": 0, "unmapped": {},
              "macs_per_cycle": 16, "pnr": {"fmax_mhz": 29.67, "goal_mhz": 30.0, "met": False}}
    assert peak_macs(report) == pytest.approx(16 * 29.67e6)
    assert "| 475 M |" in markdown_table([report])
    assert peak_macs({**report, "macs_per_cycle": None}) is None
    assert peak_macs({**report, "pnr": {"fmax_mhz": None}}) is None


def test_unknown_unit_names_the_field():
    from nanokpu.cli import main
    assert main(["synth", "--unit", "no_such_unit", "--no-pnr"]) == 2


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_board_designs_elaborate(board):
    """Every board's default design elaborates with its part's DSP mapping (seconds, no tool),
    and nextpnr is told the board's own part: its device, package and speed grade."""
    from fpga.boards import prepare_board
    spec, platform, plan = prepare_board(board)
    assert "top.ys" in plan.files and any(name.endswith((".pcf", ".lpf")) for name in plan.files)
    args = TARGETS[spec.target].nextpnr_args
    if platform.family == "ecp5":   # e.g. LFE5U-45F, BG381, 6 -> --45k --package CABGA381 --speed 6
        size = platform.device.split("-")[1].rstrip("F")
        package = {"BG": "CABGA", "MG": "CSFBGA"}[platform.package[:2]] + platform.package[2:]
        assert args == (f"--{size}k", "--package", package, "--speed", str(platform.speed))
    else:                           # iCE40UP5K, SG48 -> --up5k --package sg48
        assert args == (f"--{platform.device.removeprefix('iCE40').lower()}", "--package", platform.package.lower())


def test_board_at_another_bit_rate_elaborates_and_a_bad_one_names_the_field(capsys):
    from fpga.boards import prepare_board
    from nanokpu.cli import main
    spec, platform, plan = prepare_board("icebreaker", baud=1_000_000)  # 12 cycles a bit
    assert "top.ys" in plan.files
    assert main(["synth", "--board", "icebreaker", "--baud", "2500000"]) == 2
    assert "baud = 2500000: a 12 MHz clock gives 2400000 baud" in capsys.readouterr().err
    assert main(["synth", "--unit", "gemm", "--baud", "9600"]) == 2
    assert "baud = 9600: only a board build (--board) has a UART" in capsys.readouterr().err
    assert main(["synth", "--board", "icebreaker", "--freq", "50"]) == 2
    assert "freq = 50.0: a board build's goal is its board's clock" in capsys.readouterr().err


@pytest.mark.slow(60)
def test_board_build_icebreaker():
    """The iCEBreaker bitstream chain (Yosys on the board's pins, nextpnr-ice40 at the 12 MHz board
    clock, icepack) on a small unit behind the UART bridge, the sigmoid: the board's own unit, the
    tiny GEMM engine, fills most of the UP5K and takes ~4 minutes of place and route (its fit is
    the test below; `nanokpu synth --board icebreaker` builds it, fpga/reports/board-icebreaker.md)."""
    from fpga.boards import build_board
    out = BUILD_DIR / "test-board-reports"   # not the committed report
    report = build_board("icebreaker", unit="sigmoid", out=out)
    assert json.loads((out / "board-icebreaker.json").read_text())["bitstream_bytes"] == report["bitstream_bytes"]
    assert report["bitstream_bytes"] > 100_000  # an UP5K image is 104090 bytes
    assert report["fmax_mhz"] > report["clock_mhz"]
    assert report["utilization"]["SB_IO"]["used"] == 3  # clk, rx, tx
    assert report["unit"] == "sigmoid"


def test_icebreaker_design_fits_the_up5k():
    """The iCEBreaker's own design, the tiny GEMM engine (16 int8 MACs on 8 SB_MAC16 DSPs) behind
    the UART bridge, fits the UP5K's logic cells, DSPs and RAMs after nextpnr's packer."""
    from fpga.boards import BAUD, board_design
    spec = BOARDS["icebreaker"]
    design = board_design(spec.unit, profile(spec.profile, dsp="ice40"), 12_000_000, BAUD)
    r = synthesize(design, "board_icebreaker", spec.target, build_dir=BUILD_DIR / "test-board-fit")
    assert not r["over"] and not r["latches"] and not r["unmapped"], summary_line(r)
    assert r["resources"]["dsp"] == 8 and 0 < r["resources"]["lc"] <= r["totals"]["lc"], summary_line(r)


def test_reuse_returns_the_same_report_without_running():
    first = synthesize(RegisteredMac(), "test_reuse", "ecp5-25f", build_dir=BUILD_DIR / "test-reuse")
    (BUILD_DIR / "test-reuse" / "stat.json").unlink()  # a real run would need Yosys to write it again
    again = synthesize(RegisteredMac(), "test_reuse", "ecp5-25f", build_dir=BUILD_DIR / "test-reuse",
                       reuse=True)
    assert again == first
    other = synthesize(RegisteredMac(4), "test_reuse", "ecp5-25f", build_dir=BUILD_DIR / "test-reuse",
                       reuse=True)  # different RTLIL: runs
    assert other["key"] != first["key"] and (BUILD_DIR / "test-reuse" / "stat.json").exists()


def test_design_too_big_is_reported_without_place_and_route():
    class NineMacs(wiring.Component):  # nine 16x16 multipliers: one more than the UP5K's 8 DSPs
        def __init__(self):
            super().__init__({"a": In(signed(16)).array(9), "p": Out(signed(32)).array(9)})

        def elaborate(self, platform):
            m = Module()
            m.d.sync += [self.p[i].eq(self.a[i] * self.a[(i + 1) % 9]) for i in range(9)]
            return m

    report = synthesize(NineMacs(), "test_nine", "up5k", pnr=True, build_dir=BUILD_DIR / "test-up5k-nine")
    assert report["resources"]["dsp"] == 9
    assert report["pnr"]["error"] == "ERROR: does not fit up5k: DSP 9/8"
    assert report["pnr"]["met"] is False and report["pnr"]["fmax_mhz"] is None
    assert "does not fit" in markdown_table([report])


def test_fit_is_decided_by_packed_logic_cells():
    """A comparison of two registered words is a carry chain its operands' flip-flops cannot
    share a cell with: 80 of them fit the UP5K's LUT4s and flip-flops but not its logic cells."""
    class Compares(wiring.Component):
        def __init__(self, n):
            self.n = n
            super().__init__({"a": In(24).array(n), "b": In(24).array(n), "lt": Out(n)})

        def elaborate(self, platform):
            m = Module()
            for i in range(self.n):
                a, b = Signal(24, name=f"a{i}"), Signal(24, name=f"b{i}")
                m.d.sync += [a.eq(self.a[i]), b.eq(self.b[i]), self.lt[i].eq(a < b)]
            return m

    report = synthesize(Compares(80), "test_compares", "up5k", pnr=True,
                        build_dir=BUILD_DIR / "test-up5k-compares")
    res = report["resources"]
    assert res["lut"] <= 5280 and res["ff"] <= 5280 < res["lc"], res
    assert report["over"] == ["lc"]
    assert report["pnr"]["error"] == f"ERROR: does not fit up5k: LC {res['lc']}/5280"
    assert "LC " in summary_line(report) and "does not fit up5k (LC over)" in summary_line(report)
    pct = round(100 * res["lc"] / 5280)
    assert f"| {res['lut']}/5280 ({round(100 * res['lut'] / 5280)}%) | {res['lc']}/5280 ({pct}%) |" \
        in markdown_table([report])
