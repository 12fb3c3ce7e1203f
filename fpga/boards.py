"""Board builds: the nano-KPU or one unit behind a UART host bridge, through an amaranth-boards platform.

``nanokpu synth --board icebreaker`` (iCE40 UP5K, 12 MHz), ``--board ulx3s`` (ECP5-85F, 25 MHz)
or ``--board ulx3s-45f`` (the ULX3S with an ECP5-45F) writes ``fpga/build/board-<board>/`` with
the platform's files, the tools' logs and the bitstream (``top.bin`` / ``top.bit``), and
``fpga/reports/board-<board>.{json,md}``. The board's FTDI UART reaches either

* the whole nano-KPU (unit ``kpu``, the ULX3S boards' default): :class:`nanokpu.board.uart_axil.UartKpu`,
  32-bit word access to its AXI4-Lite registers and to an on-chip host memory on its AXI4
  master port (:mod:`nanokpu.host.client` is the PC side); its ``irq`` drives LED 0; or
* one unit (the iCEBreaker default: the ``tiny`` GEMM engine as the nano-KPU has it,
  :func:`nanokpu.units.gemm.kpu_engine`, as the whole nano-KPU does not fit the UP5K):
  :class:`nanokpu.board.uart_bridge.UartBridge`, the unit's ports as byte registers
  (:mod:`nanokpu.host.bridge_client` is the PC side, :func:`~nanokpu.host.bridge_client.run_gemm` a GEMM;
  ``nanokpu board-run --board icebreaker`` runs a whole block with its GEMMs on the board).

Programming is left to the user (no board here): see ``fpga/README.md``.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from amaranth import Elaboratable, Module
from amaranth.lib import io

from fpga.flow import (
    BUILD_DIR,
    PNR_TIMEOUT_MIN,
    REPORT_DIR,
    SEED_TRIES,
    TARGETS,
    place_and_route,
    read_stat_cells,
    run_tool,
)
from fpga.report import critical_path_text
from nanokpu.board.uart_axil import UartKpu
from nanokpu.board.uart_bridge import UartBridge
from nanokpu.bridge_protocol import uart_divisor
from nanokpu.designs import TOP_UNIT, resolve_unit
from nanokpu.host_protocol import DEFAULT_HOST_BYTES

__all__ = ["BOARDS", "Board", "BoardTop", "BAUD", "board_design", "prepare_board", "build_board"]


@dataclass(frozen=True)
class Board:
    """An amaranth-boards platform, the flow target it matches and the default unit it carries."""

    platform: str          #: ``module:class`` in amaranth_boards
    target: str            #: key of :data:`fpga.flow.TARGETS`
    profile: str           #: default profile
    unit: str              #: default unit (a name of nanokpu.designs.UNITS or ``module:factory``)
    bitstream: str         #: file name of the bitstream


BOARDS: dict[str, Board] = {
    "icebreaker": Board("amaranth_boards.icebreaker:ICEBreakerPlatform", "up5k", "tiny",
                        "nanokpu.units.gemm:kpu_engine", "top.bin"),
    "ulx3s": Board("amaranth_boards.ulx3s:ULX3S_85F_Platform", "ecp5-85f", "tiny", "kpu", "top.bit"),
    "ulx3s-45f": Board("amaranth_boards.ulx3s:ULX3S_45F_Platform", "ecp5-45f", "tiny", "kpu", "top.bit"),
}

#: Default bit rate of the board's UART (``nanokpu synth --board B --baud N`` sets another).
BAUD = 115200


class BoardTop(Elaboratable):
    """The board's UART (``uart`` resource 0) wired to ``design``'s ``rx``/``tx`` and, when it
    has one, its ``irq`` to LED 0."""

    def __init__(self, design):
        self.design = design

    def elaborate(self, platform):
        m = Module()
        uart = platform.request("uart", 0, dir="-")
        m.submodules.bridge = bridge = self.design
        if "irq" in bridge.signature.members:
            m.submodules.led = led = io.Buffer("o", platform.request("led", 0, dir="-"))
            m.d.comb += led.o.eq(bridge.irq)
        m.submodules.rx = rx = io.Buffer("i", uart.rx)
        m.submodules.tx = tx = io.Buffer("o", uart.tx)
        m.d.comb += [bridge.rx.eq(rx.i), tx.o.eq(bridge.tx)]
        if "uart_tx_enable" in {r.name for r in platform.resources.values()}:
            m.submodules.tx_enable = enable = io.Buffer("o", platform.request("uart_tx_enable", 0, dir="-"))
            m.d.comb += enable.o.eq(1)  # ULX3S: FTDI TX buffer
        return m


def board_design(unit: str, cfg, clk_freq: int, baud: int = BAUD):
    """The design behind the board's UART (``baud`` bits per second): :class:`UartKpu` for
    :data:`TOP_UNIT`, else ``unit`` of ``cfg`` inside a :class:`UartBridge`."""
    uart_divisor(clk_freq, baud)  # a bad rate fails before the unit is built
    if unit == TOP_UNIT:
        return UartKpu(cfg, clk_freq, baud)
    return UartBridge(resolve_unit(unit)(cfg), clk_freq, baud)


def prepare_board(board: str, *, profile_name: str | None = None, unit: str | None = None,
                  baud: int = BAUD):
    """``(board spec, platform, build plan)`` of ``unit`` (built with the part's ``dsp``
    mapping) behind its UART bridge at ``baud`` on ``board`` (:func:`board_design`). Elaborates
    the whole design without running a tool, so a design the board cannot build (or a bit rate
    its clock cannot make, :func:`~nanokpu.board.uart_bridge.uart_divisor`) fails here in seconds."""
    from nanokpu.config import profile

    if board not in BOARDS:
        raise ValueError(f"board = {board!r}: must be one of {sorted(BOARDS)}")
    spec = BOARDS[board]
    target = TARGETS[spec.target]
    module, cls = spec.platform.split(":")
    platform = getattr(importlib.import_module(module), cls)()
    cfg = profile(profile_name or spec.profile, dsp=target.family)
    top = BoardTop(board_design(unit or spec.unit, cfg, int(platform.default_clk_frequency), baud))
    synth_opts = "-dsp -device u -spram" if target.family == "ice40" else ""
    plan = platform.prepare(top, name="top", synth_opts=synth_opts,
                            script_after_read="proc; flatten; splitnets",
                            script_after_synth="tee -q -o stat.json stat -json")
    return spec, platform, plan


def build_board(board: str, *, profile_name: str | None = None, unit: str | None = None,
                baud: int = BAUD, seed: int = 1, seed_tries: int = SEED_TRIES,
                pnr_timeout: float | None = PNR_TIMEOUT_MIN, progress: Callable[[str], None] | None = None,
                out: Path = REPORT_DIR) -> dict:
    """Synthesize, place, route and pack ``unit`` (behind the UART bridge) for ``board``.

    nextpnr runs with seeds ``seed``, ``seed + 1``, ... until one meets the board clock within
    ``pnr_timeout`` minutes, at most ``seed_tries`` (:func:`fpga.flow.place_and_route`).
    Returns the report dict (also written to ``<out>/board-<board>.json`` and ``.md``, ``out``
    by default ``fpga/reports``):
    resources, Fmax against the board clock, the seed and every attempt, and the bitstream
    path. Raises ``ValueError`` on an unknown board and :class:`fpga.flow.ToolError` when a
    tool fails (e.g. timing missed with every seed).
    """
    spec, platform, plan = prepare_board(board, profile_name=profile_name, unit=unit, baud=baud)
    target = TARGETS[spec.target]
    profile_name = profile_name or spec.profile
    unit = unit or spec.unit
    clk_mhz = platform.default_clk_frequency / 1e6
    cwd = BUILD_DIR / f"board-{board}"
    t0 = time.monotonic()
    plan.extract(cwd)
    run_tool(["yosys", "-q", "-l", "top.yosys.log", "top.ys"], cwd, "top.yosys.out",
             f"yosys ({board}: {profile_name}/{unit} behind its UART bridge)", progress, t0)
    common = ["--json", "top.json", "--freq", f"{clk_mhz:g}", "-q", *target.nextpnr_args]
    retries = {"seed": seed, "seed_tries": seed_tries, "pnr_timeout": pnr_timeout, "progress": progress, "t0": t0}
    if target.family == "ice40":
        timing = place_and_route(["nextpnr-ice40", *common, "--pcf", "top.pcf", "--asc", "top.asc"], cwd, "top",
                                 f"nextpnr-ice40 ({clk_mhz:g} MHz board clock)", **retries)
        run_tool(["icepack", "top.asc", spec.bitstream], cwd, "top.pack.log", "icepack", progress, t0)
    else:
        timing = place_and_route(["nextpnr-ecp5", *common, "--lpf", "top.lpf", "--textcfg", "top.config"], cwd,
                                 "top", f"nextpnr-ecp5 ({clk_mhz:g} MHz board clock)", **retries)
        run_tool(["ecppack", "--compress", "--input", "top.config", "--bit", spec.bitstream], cwd,
                 "top.pack.log", "ecppack", progress, t0)
    cells = read_stat_cells(cwd / "stat.json")
    bitstream = cwd / spec.bitstream
    report = {"board": board, "platform": spec.platform, "target": target.name, "profile": profile_name,
              "unit": unit, "baud": baud, "clock_mhz": clk_mhz, "fmax_mhz": timing["fmax_mhz"], "seed": timing["seed"],
              "attempts": timing["attempts"],
              "utilization": timing["utilization"], "critical_path": timing["critical_path"],
              "cells": cells, "bitstream": str(bitstream.relative_to(BUILD_DIR.parent.parent)),
              "bitstream_bytes": bitstream.stat().st_size, "elapsed_s": round(time.monotonic() - t0, 1)}
    if unit == TOP_UNIT:
        bridge_text = (f"The whole `{profile_name}` nano-KPU with {DEFAULT_HOST_BYTES} bytes of on-chip host "
                       "memory behind the UART host bridge (`nanokpu/board/uart_axil.py`, "
                       "client `nanokpu/host/client.py`)")
    else:
        bridge_text = (f"Unit `{unit}` of profile `{profile_name}` behind the UART register bridge "
                       "(`nanokpu/board/uart_bridge.py`)")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"board-{board}.json").write_text(json.dumps(report, indent=1) + "\n")
    util = "\n".join(f"| {k} | {v['used']} | {v['available']} |" for k, v in sorted(timing["utilization"].items()))
    (out / f"board-{board}.md").write_text(
        f"# Board build: {board}\n\nMade by `nanokpu synth --board {board}`"
        f"{'' if unit == spec.unit else f' --unit {unit}'}"
        f"{'' if profile_name == spec.profile else f' --profile {profile_name}'}"
        f"{'' if baud == BAUD else f' --baud {baud}'}.\n\n"
        f"{bridge_text} ({baud} baud 8N1) on {spec.platform.split(':')[1]}.\n\n"
        f"Clock {clk_mhz:g} MHz, Fmax {timing['fmax_mhz']} MHz (nextpnr seed {timing['seed']}); critical path "
        f"{critical_path_text(timing['critical_path'])}. "
        f"Bitstream `{report['bitstream']}` "
        f"({report['bitstream_bytes']} bytes, not committed: rebuild it with the command above).\n\n"
        f"| resource | used | available |\n|---|---|---|\n{util}\n")
    if progress:
        progress(f"[{time.monotonic() - t0:7.1f}s] {board}: wrote {report['bitstream']} "
                 f"(Fmax {timing['fmax_mhz']} MHz at a {clk_mhz:g} MHz clock)")
    return report
