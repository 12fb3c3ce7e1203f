"""The nano-KPU's register bank: the host's AXI4-Lite view of the machine (:class:`~nanokpu.isa.Reg`).

It owns what the host writes (``HOST_BASE``, ``HOST_SIZE``, the instruction memory window, the
``CTRL`` strobes) and the performance counters (``CYCLES``, ``INSTRS``, ``BUSY+4u``), and reads
back the controller's status and the routing engine's load counters.
"""

from __future__ import annotations

from amaranth import Module, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.isa import ADDR_WIDTH, CTRL_LAYOUT, EXECUTORS, IMEM_BASE, INSTR_WORDS, LOADS_BASE, STATUS_LAYOUT, Reg
from nanokpu.kpu.axi_lite import AxiLiteRegisters, axi_lite_signature

__all__ = ["RegisterBank", "PC_WIDTH", "imem_write_signature"]

#: Width of the program counter (``STATUS_LAYOUT.pc`` holds it zero-extended).
PC_WIDTH = 13


def imem_write_signature(cfg: KpuConfig) -> wiring.Signature:
    """A write of one 32-bit word of the instruction memory (word ``w`` of instruction ``i`` at
    ``i * INSTR_WORDS + w``), directions seen from the writer."""
    return wiring.Signature({"addr": Out(range(cfg.imem_depth * INSTR_WORDS)), "data": Out(32),
                             "en": Out(1)})


class RegisterBank(wiring.Component):
    """The register map of :class:`~nanokpu.isa.Reg` on an AXI4-Lite slave.

    Members
    -------
    bus : In(axi_lite_signature(ADDR_WIDTH))
    start, soft_reset, clear_loads : Out(1)
        One-cycle strobes: ``CTRL`` written with that bit set.
    host_base, host_size : Out(32)
        The host window (bytes), as last written.
    window_wr : Out(1)
        One-cycle strobe: ``HOST_BASE`` or ``HOST_SIZE`` written (the new value from the next cycle on).
    imem_wr : Out(imem_write_signature(cfg))
        Writes into the instruction memory window, passed on only while not ``running``.
    running, done : In(1)
    error : In(8)
    pc : In(PC_WIDTH)
        The controller's state, read back in ``STATUS``.
    executor : In(len(EXECUTORS))
        One-hot: the executor whose instruction runs now (its ``BUSY`` counter counts).
    retire : In(1)
        One instruction retired (``INSTRS`` counts).
    load_addr : Out(16)
    load_data : In(32)
        The routing engine's load counter ``load_addr``, one cycle after it.

    The counters clear on a ``start`` while not ``running``; ``CYCLES`` counts while ``running``.
    Reads answer two cycles after their address handshake (:class:`AxiLiteRegisters`).
    """

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        super().__init__({
            "bus": In(axi_lite_signature(ADDR_WIDTH)),
            "start": Out(1), "soft_reset": Out(1), "clear_loads": Out(1),
            "host_base": Out(32), "host_size": Out(32), "window_wr": Out(1),
            "imem_wr": Out(imem_write_signature(cfg)),
            "running": In(1), "done": In(1), "error": In(8), "pc": In(PC_WIDTH),
            "executor": In(len(EXECUTORS)), "retire": In(1),
            "load_addr": Out(16), "load_data": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.regs = regs = AxiLiteRegisters(ADDR_WIDTH)
        wiring.connect(m, wiring.flipped(self.bus), regs.bus)

        ctrl = data.View(CTRL_LAYOUT, regs.wr_data[:CTRL_LAYOUT.size])
        ctrl_write = regs.wr_en & (regs.wr_addr == Reg.CTRL)
        m.d.comb += [self.start.eq(ctrl_write & ctrl.start), self.soft_reset.eq(ctrl_write & ctrl.soft_reset),
                     self.clear_loads.eq(ctrl_write & ctrl.clear_loads),
                     self.load_addr.eq(regs.rd_addr[2:])]     # LOADS_BASE is a multiple of 2**18
        # the windows are aligned: IMEM_BASE to 2**19 > 32 * imem_depth, LOADS_BASE to 2**18 > 4 * n_experts
        iw, lw = (32 * cfg.imem_depth - 1).bit_length(), (4 * cfg.n_experts - 1).bit_length()
        in_imem = (regs.wr_addr[iw:] == IMEM_BASE >> iw) & (regs.wr_addr[5:iw] < cfg.imem_depth)
        m.d.comb += [self.imem_wr.addr.eq(regs.wr_addr[2:iw]), self.imem_wr.data.eq(regs.wr_data),
                     self.imem_wr.en.eq(regs.wr_en & in_imem & ~self.running)]
        m.d.comb += self.window_wr.eq(regs.wr_en & ((regs.wr_addr == Reg.HOST_BASE) | (regs.wr_addr == Reg.HOST_SIZE)))
        with m.If(regs.wr_en & (regs.wr_addr == Reg.HOST_BASE)):
            m.d.sync += self.host_base.eq(regs.wr_data)
        with m.If(regs.wr_en & (regs.wr_addr == Reg.HOST_SIZE)):
            m.d.sync += self.host_size.eq(regs.wr_data)

        cycles = Signal(32)
        retired = Signal(32)
        busy = Signal(data.ArrayLayout(unsigned(32), len(EXECUTORS)))
        with m.If(self.start & ~self.running):
            m.d.sync += [cycles.eq(0), retired.eq(0), busy.eq(0)]
        with m.Elif(self.running):
            m.d.sync += cycles.eq(cycles + 1)
            with m.If(self.retire):
                m.d.sync += retired.eq(retired + 1)
            for i in range(len(EXECUTORS)):
                with m.If(self.executor[i]):
                    m.d.sync += busy[i].eq(busy[i] + 1)

        rsel = Signal(ADDR_WIDTH)
        with m.If(regs.rd_en):
            m.d.sync += rsel.eq(regs.rd_addr)
        status = Signal(STATUS_LAYOUT)
        m.d.comb += [status.busy.eq(self.running), status.done.eq(self.done), status.error.eq(self.error != 0),
                     status.code.eq(self.error), status.pc.eq(self.pc)]
        readable = {Reg.STATUS: status, Reg.CYCLES: cycles, Reg.HOST_BASE: self.host_base,
                    Reg.HOST_SIZE: self.host_size, Reg.INSTRS: retired, Reg.INFO: cfg.dmem_depth,
                    Reg.INFO_IMEM: cfg.imem_depth}
        readable.update({Reg.BUSY + 4 * i: busy[i] for i in range(len(EXECUTORS))})
        with m.If((rsel[lw:] == LOADS_BASE >> lw) & (rsel[:lw] < 4 * cfg.n_experts)):
            m.d.comb += regs.rd_data.eq(self.load_data)
        with m.Elif((rsel[:2] == 0) & (rsel[7:] == 0)):     # the registers: words 0..31
            with m.Switch(rsel[2:7]):
                for addr, value in readable.items():
                    with m.Case(int(addr) >> 2):
                        m.d.comb += regs.rd_data.eq(value)
        return m
