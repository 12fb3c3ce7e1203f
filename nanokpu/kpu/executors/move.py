"""The move executor: ``GATHER`` and ``SCATTER`` of the current expert's token rows."""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import wiring

from nanokpu.config import KpuConfig
from nanokpu.isa import Err, Op, word_width
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.executors import executor_signature
from nanokpu.units.shift_add import ShiftAddMultiplier

__all__ = ["Move"]


class Move(wiring.Component):
    """``GATHER``: ``c[i*n .. i*n+n) = a[r*n .. r*n+n)`` and ``SCATTER``: ``c[r*n ..) = a[i*n ..)``
    for ``i < count``, ``r = b[offset + i]`` (the current expert's list, :mod:`nanokpu.isa`);
    a row ``r`` outside ``[0, m)`` ends the instruction with
    :attr:`~nanokpu.isa.Err.SPAD_RANGE` (the rows before it are moved).

    Members: :func:`~nanokpu.kpu.executors.executor_signature` (``ins.count``, ``ins.offset``
    the expert's).

    Timing per row: the list word read (3 cycles: read, data, check), ``r * n`` on a
    shift-add multiplier (``1 + bit_length(r)`` cycles), then one word copied per cycle (each
    word read, then written from a register a cycle later) and 2 cycles to drain the copy.
    """

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        super().__init__(executor_signature(cfg))

    def elaborate(self, platform):
        m = Module()
        cfg, ins, spad = self.cfg, self.ins, self.spad
        w = widths(cfg)
        rd0, wr, blocked = spad.rd0, spad.wr, spad.blocked
        m.submodules.mul = mul = ShiftAddMultiplier(16, w.aw)
        n = ins.n[:w.sw]
        q = Signal(signed(word_width(cfg)))     # the read data, registered
        m.d.sync += q.eq(rd0.data)
        i = Signal(16)          # the list entry
        col = Signal(w.sw + 1)  # the word of the row being read
        row_i = Signal(w.aw)    # i * n
        rv = Signal()           # a word read in flight: its destination ra
        ra = Signal(w.aw)
        wv = Signal()           # the word in q is written at wa
        wa = Signal(w.aw)
        gather = Signal()
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [i.eq(0), row_i.eq(0), gather.eq(ins.op == Op.GATHER)]
                    m.next = "LIST"
            with m.State("LIST"):
                with m.If(i >= ins.count):
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"
                with m.Elif(~blocked):     # COPY's last write may be in progress
                    m.d.comb += [rd0.addr.eq(ins.b + ins.offset + i), rd0.en.eq(1)]
                    m.next = "WAIT"
            with m.State("WAIT"):
                m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(q[16:].any() | (q[:16] >= ins.m)):     # r < 0 or r >= m
                    m.d.comb += [self.done.eq(1), self.error.eq(Err.SPAD_RANGE)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += [mul.load.eq(1), mul.y.eq(q[:16]), mul.x.eq(n)]     # r * n, exact: r < m
                    m.d.sync += [col.eq(0), rv.eq(0), wv.eq(0)]
                    m.next = "COPY"
            with m.State("COPY"):
                row = mul.acc
                src = ins.a + Mux(gather, row, row_i)
                dst = ins.c + Mux(gather, row_i, row)
                with m.If(mul.busy):
                    pass
                with m.Elif((col < n) & ~blocked):
                    m.d.comb += [rd0.addr.eq(src + col), rd0.en.eq(1)]
                    m.d.sync += [col.eq(col + 1), rv.eq(1), ra.eq(dst + col)]
                with m.Else():
                    m.d.sync += rv.eq(0)
                m.d.sync += [wv.eq(rv), wa.eq(ra)]
                with m.If(wv):
                    m.d.comb += [wr.addr.eq(wa), wr.data.eq(q), wr.en.eq(1)]
                with m.If((col >= n) & ~rv & wv):
                    m.d.sync += [i.eq(i + 1), row_i.eq(row_i + n)]
                    m.next = "LIST"
        return m
