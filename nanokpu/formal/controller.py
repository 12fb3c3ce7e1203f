"""Proof that a bad instruction stops the nano-KPU's controller with an error and the bus answers.

:class:`ControllerProof` wraps a whole :class:`~nanokpu.kpu.top.NanoKPU` and drives its AXI4-Lite
slave with a small fixed master: it writes the free 32-bit word ``instr`` (any instruction whose
opcode is not in :class:`~nanokpu.isa.Op`: the other 26 bits, flags and ``m``, are free too) as
word 0 of instruction 0, starts the controller (``CTRL = 1``) and then reads ``STATUS`` again
and again. The AXI4 master port sees a host that never answers (a bad opcode must stop the
controller before any host access). Asserted, for every such word:

* every AXI4-Lite transaction completes within :data:`BUS_LIMIT` cycles (the bus answers, also
  while the controller runs and after it stopped);
* no ``STATUS`` read before the start shows an error, and by :data:`STOP_LIMIT` cycles after
  the start a ``STATUS`` read has shown the controller stopped (busy 0, not done) with error
  code ``BAD_OPCODE`` at pc 0 - and every later read shows the same;
* ``irq`` is high once the error is reported.

A bounded check from reset (:func:`controller_depth`), not from any state: the top level's
state space (scratchpad, units) is far beyond what k-induction closes in CI time.
"""

from __future__ import annotations

from amaranth.hdl import Assert, Assume, Module, ResetSignal, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In

from nanokpu.isa import IMEM_BASE, INSTR_WORDS, STATUS_LAYOUT, Err, Op, Reg, ctrl_word
from nanokpu.kpu.decode import Decode

__all__ = ["ControllerProof", "controller_depth", "BUS_LIMIT", "STOP_LIMIT"]

#: Cycles an AXI4-Lite transaction of the proof's master may take.
BUS_LIMIT = 6
#: Cycles from the start (the CTRL write's response) by which STATUS must show the error: the
#: fetch (a cycle, then one per instruction word), the decode (its shortest: a bad opcode uses
#: no product step) and 7 more.
STOP_LIMIT = (1 + INSTR_WORDS) + Decode.min_latency + 7


def controller_depth() -> int:
    """Two writes, the stop limit and one more STATUS read: every assertion gets its chance."""
    return 2 * BUS_LIMIT + STOP_LIMIT + 2 * BUS_LIMIT + 2


class ControllerProof(wiring.Component):
    """Formal wrapper of ``kpu``: a bad first instruction, a fixed AXI4-Lite master, a silent host.

    Parameters
    ----------
    kpu : wiring.Component
        The design under proof (a :class:`NanoKPU` or a twin with its ports), a fresh instance.

    Members
    -------
    instr : In(32)
        Word 0 of instruction 0 (free; its opcode field is assumed invalid and the word stable).
    """

    def __init__(self, kpu: wiring.Component):
        self.kpu = kpu
        super().__init__({"instr": In(32)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.kpu = kpu = self.kpu
        bus, host = kpu.s_axil, kpu.m_axi
        m.d.comb += Assume(~ResetSignal())
        past_instr = Signal(32)
        m.d.sync += past_instr.eq(self.instr)
        m.d.comb += Assume(self.instr[:6] >= len(Op))
        first = Signal(init=1)
        m.d.sync += first.eq(0)
        with m.If(~first):
            m.d.comb += Assume(self.instr == past_instr)
        # a host that never answers: no ready, no response
        for name in ("awready", "wready", "bvalid", "arready", "rvalid"):
            m.d.comb += getattr(host, name).eq(0)

        # -- the AXI4-Lite master: write instr, write CTRL = 1, then read STATUS forever --------
        step = Signal(range(3))                 # 0: imem write, 1: CTRL write, 2: STATUS reads
        sent_aw, sent_w, sent_ar = Signal(), Signal(), Signal()
        wait = Signal(range(BUS_LIMIT + 2))
        writing = step < 2
        m.d.comb += [
            bus.wstrb.eq(0xF), bus.bready.eq(1), bus.rready.eq(1),
            bus.awvalid.eq(writing & ~sent_aw), bus.wvalid.eq(writing & ~sent_w),
            bus.arvalid.eq(~writing & ~sent_ar), bus.araddr.eq(Reg.STATUS),
        ]
        with m.If(step == 0):
            m.d.comb += [bus.awaddr.eq(IMEM_BASE), bus.wdata.eq(self.instr)]
        with m.Else():
            m.d.comb += [bus.awaddr.eq(Reg.CTRL), bus.wdata.eq(ctrl_word(start=1))]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += sent_aw.eq(1)
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += sent_w.eq(1)
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += sent_ar.eq(1)
        done_txn = (writing & bus.bvalid) | (~writing & bus.rvalid)
        with m.If(done_txn):
            m.d.sync += [sent_aw.eq(0), sent_w.eq(0), sent_ar.eq(0), wait.eq(0)]
            with m.If(writing):
                m.d.sync += step.eq(step + 1)
        with m.Else():
            m.d.sync += wait.eq(wait + 1)
        m.d.comb += Assert(wait < BUS_LIMIT, "s_axil: a transaction did not complete (the bus hangs)")

        # -- the controller must report BAD_OPCODE at pc 0 ----------------------------------
        since = Signal(range(STOP_LIMIT + 2))
        seen = Signal()
        with m.If(~writing & (since <= STOP_LIMIT)):
            m.d.sync += since.eq(since + 1)
        expected = STATUS_LAYOUT.const({"error": 1, "code": Err.BAD_OPCODE}).as_bits()  # not busy, not done, pc 0
        status = data.View(STATUS_LAYOUT, bus.rdata)
        with m.If(~writing & bus.rvalid):
            with m.If(bus.rdata == expected):
                m.d.sync += seen.eq(1)
            m.d.comb += Assert(~seen | (bus.rdata == expected), "STATUS: the error did not persist")
            m.d.comb += Assert((~status.error & (status.code == Err.NONE)) | (bus.rdata == expected),
                               "STATUS: an error other than BAD_OPCODE at pc 0")
        m.d.comb += Assert(~(since > STOP_LIMIT) | seen, f"STATUS: no BAD_OPCODE within {STOP_LIMIT} cycles")
        with m.If(seen):
            m.d.comb += Assert(kpu.irq, "irq low while the error is reported")
        return m
