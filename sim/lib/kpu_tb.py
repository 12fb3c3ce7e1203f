"""The testbench of the whole nano-KPU (:class:`nanokpu.kpu.top.NanoKPU`), through its buses only.

Runs inside the simulator (``sim/bench_top.py``, ``sim/bench_fault.py``). The host side is
cocotbext-axi: an ``AxiLiteMaster`` on ``s_axil`` (registers, instruction memory, load counters)
and an ``AxiRam`` on ``m_axi`` (host memory holding the compiled image), with random idle on the
master's channels and random backpressure/idle on the RAM's. Amaranth's flattened names
(``s_axil__awaddr``) are matched with ``bus_separator="__"``.
"""

from __future__ import annotations

import logging
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from nanokpu.isa import EXECUTORS, IMEM_BASE, LOADS_BASE, Reg, ctrl_word, encode_program, status_fields
from sim.runner import bench_config, bench_params

__all__ = ["TB", "stop_status"]


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
        cycle on every AXI channel, default 0.2) and ``progress`` (:meth:`run` prints the pc).
    axil : AxiLiteMaster
        The host on ``s_axil``.
    ram : AxiRam
        The host memory on ``m_axi`` (16 MiB).
    """

    def __init__(self, dut):
        p = bench_params()
        self.dut = dut
        self.p = p
        self.cfg = bench_config()
        self.seed = int(p.get("seed", 1))
        self.pause = float(p.get("pause", 0.2))
        random.seed(self.seed)
        dut._log.info(f"profile {self.cfg.name}, seed {self.seed}, pause {self.pause}")
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
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

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    async def rd(self, addr: int) -> int:
        return (await self.axil.read_dword(addr))

    async def wr(self, addr: int, value: int):
        await self.axil.write_dword(addr, value)

    async def load(self, instrs, image: bytes, window=None):
        """Put ``image`` at host address 0, ``instrs`` in the instruction memory, and the host
        window ``(base, size)`` (default: the whole image) in HOST_BASE/HOST_SIZE."""
        self.ram.write(0, bytes(image))
        await self.axil.write(IMEM_BASE, encode_program(instrs))
        base, size = window or (0, len(image))
        await self.wr(Reg.HOST_BASE, base)
        await self.wr(Reg.HOST_SIZE, size)

    async def run(self, poll: int = 2000, limit: int = 20_000_000, n_instrs: int = 0):
        """Start and poll STATUS every ``poll`` cycles until the controller stops; returns (error
        code, pc, done). With ``progress`` set in the parameters, prints the pc and cycles every
        10 polls."""
        await self.wr(Reg.CTRL, ctrl_word(start=1))
        waited = 0
        while True:
            status = await self.rd(Reg.STATUS)
            stopped = stop_status(status)
            if stopped is not None:
                return stopped
            if self.p.get("progress") and waited % (10 * poll) == 0:
                print(f"[nanokpu sim] running: pc {status_fields(status).pc:3d}/{n_instrs}, "
                      f"{await self.rd(Reg.INSTRS)} instructions, {waited} cycles", flush=True)
            await ClockCycles(self.dut.clk, poll)
            waited += poll
            assert waited < limit, f"seed {self.seed}: no stop within {limit} cycles"

    async def counters(self) -> dict:
        """The CYCLES, INSTRS and per-executor BUSY counters."""
        out = {"cycles": await self.rd(Reg.CYCLES), "instrs": await self.rd(Reg.INSTRS)}
        for i, u in enumerate(EXECUTORS):
            out[u] = await self.rd(Reg.BUSY + 4 * i)
        return out

    async def loads(self) -> np.ndarray:
        """The routing engine's per-expert load counters."""
        return np.array([await self.rd(LOADS_BASE + 4 * j) for j in range(self.cfg.n_experts)])
