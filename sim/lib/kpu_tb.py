"""The testbench of the whole nano-KPU (:class:`nanokpu.kpu.top.NanoKPU`), through its buses only.

Runs inside the simulator (``sim/bench_top.py``, ``sim/bench_fault.py``). The host side is
cocotbext-axi: an ``AxiLiteMaster`` on ``s_axil`` (registers, instruction memory, load counters)
and an ``AxiRam`` on ``m_axi`` (host memory holding the compiled image), with random idle on the
master's channels and random backpressure/idle on the RAM's. Amaranth's flattened names
(``s_axil__awaddr``) are matched with ``bus_separator="__"``.

Without pauses, Python runs only when something happens on a bus: the clock is cocotb's C++
clock, and :meth:`TB.run` sleeps until the ``irq`` output rises (or ``poll`` cycles pass)
between reads of ``STATUS`` instead of counting cycles.
"""

from __future__ import annotations

import logging
import random
import time

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import ClockCycles, First, RisingEdge, Timer
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from nanokpu.isa import EXECUTORS, IMEM_BASE, LOADS_BASE, Reg, ctrl_word, encode_program, status_fields
from sim.runner import bench_config, bench_params

__all__ = ["CLOCK_NS", "TB", "stop_status"]

#: The clock period in ns.
CLOCK_NS = 10


def stop_status(status: int) -> tuple[int, int, bool] | None:
    """A ``STATUS`` word decoded: ``(error code, pc, done)`` once the controller has stopped,
    None while it is busy."""
    s = status_fields(status)
    if s.busy:
        return None
    return s.code, s.pc, bool(s.done)


class TB:
    """Clock, reset, the AXI4-Lite host and the AXI host memory of one nano-KPU.

    Parameters
    ----------
    dut : the cocotb handle of the NanoKPU top.

    Members
    -------
    cfg : KpuConfig
        The config the design was built from (:func:`sim.runner.bench_config`).
    p : dict
        The bench's parameters (:func:`sim.runner.bench_params`). The TB reads ``seed``
        (default 1; also seeds :mod:`random`), ``pause`` (probability of an idle/backpressure
        cycle on every AXI channel, default 0.2), ``progress`` (:meth:`run` prints the pc) and
        ``replay`` (set: keep :attr:`transcript`).
    axil : AxiLiteMaster
        The host on ``s_axil``.
    ram : AxiRam
        The host memory on ``m_axi`` (16 MiB).
    transcript : list of tuple or None
        With ``replay``: what the host did, in order, for :func:`sim.lib.raw_run.write_replay`:
        ``("reset", high cycles, low cycles)``, ``("image", bytes)`` (host memory from 0),
        ``("write", addr, value)`` and ``("read", addr, value)`` (AXI4-Lite, 32-bit; the polls
        of ``STATUS`` in :meth:`run` are not listed) and ``("run", poll, limit)`` (:meth:`run`).
        None without ``replay``.
    last_run : dict or None
        The last :meth:`run`'s ``clocks`` (simulated clock cycles from the start write to the
        last read of ``STATUS``) and ``seconds`` (their wall time).
    """

    def __init__(self, dut):
        p = bench_params()
        self.dut = dut
        self.p = p
        self.cfg = bench_config()
        self.seed = int(p.get("seed", 1))
        self.pause = float(p.get("pause", 0.2))
        random.seed(self.seed)
        self.transcript = [] if p.get("replay") else None
        self.last_run = None
        dut._log.info(f"profile {self.cfg.name}, seed {self.seed}, pause {self.pause}")
        # the C++ clock: no Python per clock edge (cocotb picks the Python clock by default,
        # for benches that write at arbitrary times; this one writes after rising edges only).
        # Reset held and the clock low first: the first rising edge comes half a period in,
        # after a 4-state simulator (Icarus) has run the design's initial values, so the bus
        # models never sample an X.
        dut.rst.value = 1
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns", impl="gpi").start(start_high=False))
        # warnings only from the bus models: their banners and one line per burst would bury
        # the bench's own output and dominate the run time
        for bus in ("s_axil", "m_axi"):
            logging.getLogger(f"{dut._log.name}.{bus}").setLevel(logging.WARNING)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil", bus_separator="__"),
                                  dut.clk, dut.rst)
        self.ram_size = 1 << 24
        self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi", bus_separator="__"), dut.clk, dut.rst,
                          size=self.ram_size)
        if self.pause:
            for ch in (self.axil.write_if.aw_channel, self.axil.write_if.w_channel,
                       self.axil.read_if.ar_channel, self.axil.write_if.b_channel,
                       self.axil.read_if.r_channel,
                       self.ram.write_if.aw_channel, self.ram.write_if.w_channel,
                       self.ram.write_if.b_channel, self.ram.read_if.ar_channel,
                       self.ram.read_if.r_channel):
                ch.set_pause_generator(self._pauses())

    def _pauses(self):
        while True:
            yield random.random() < self.pause

    def _note(self, *entry):
        if self.transcript is not None:
            self.transcript.append(entry)

    async def reset(self):
        self._note("reset", 4, 2)
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    async def rd(self, addr: int) -> int:
        value = await self.axil.read_dword(addr)
        self._note("read", addr, value)
        return value

    async def wr(self, addr: int, value: int):
        self._note("write", addr, value)
        await self.axil.write_dword(addr, value)

    async def load(self, instrs, image: bytes, window=None):
        """Put ``image`` at host address 0, ``instrs`` in the instruction memory, and the host
        window ``(base, size)`` (default: the whole image) in HOST_BASE/HOST_SIZE."""
        self._note("image", bytes(image))
        self.ram.write(0, bytes(image))
        words = encode_program(instrs)
        for i in range(0, len(words), 4):
            self._note("write", IMEM_BASE + i, int.from_bytes(words[i:i + 4], "little"))
        await self.axil.write(IMEM_BASE, words)
        base, size = window or (0, len(image))
        await self.wr(Reg.HOST_BASE, base)
        await self.wr(Reg.HOST_SIZE, size)

    async def run(self, poll: int = 2000, limit: int = 20_000_000, n_instrs: int = 0):
        """Start, then read STATUS until the controller stops, sleeping between reads until
        ``irq`` rises or ``poll`` cycles pass; returns (error code, pc, done) and sets
        :attr:`last_run`. With ``progress`` set in the parameters, prints the pc and cycles
        every 10 polls."""
        self._note("run", poll, limit)
        t0, start = time.perf_counter(), get_sim_time("ns")
        await self.axil.write_dword(Reg.CTRL, ctrl_word(start=1))
        polls = 0
        while True:
            status = await self.axil.read_dword(Reg.STATUS)
            waited = round((get_sim_time("ns") - start) / CLOCK_NS)
            stopped = stop_status(status)
            if stopped is not None:
                self.last_run = {"clocks": waited, "seconds": time.perf_counter() - t0}
                return stopped
            if self.p.get("progress") and polls % 10 == 0:
                print(f"[nanokpu sim] running: pc {status_fields(status).pc:3d}/{n_instrs}, "
                      f"{await self.axil.read_dword(Reg.INSTRS)} instructions, {waited} cycles", flush=True)
            assert waited < limit, f"seed {self.seed}: no stop within {limit} cycles"
            await First(RisingEdge(self.dut.irq), Timer(poll * CLOCK_NS, "ns"))
            polls += 1

    async def counters(self) -> dict:
        """The CYCLES, INSTRS and per-executor BUSY counters."""
        out = {"cycles": await self.rd(Reg.CYCLES), "instrs": await self.rd(Reg.INSTRS)}
        for i, u in enumerate(EXECUTORS):
            out[u] = await self.rd(Reg.BUSY + 4 * i)
        return out

    async def loads(self) -> np.ndarray:
        """The routing engine's per-expert load counters."""
        return np.array([await self.rd(LOADS_BASE + 4 * j) for j in range(self.cfg.n_experts)])
