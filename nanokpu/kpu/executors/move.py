"""The move executor: ``GATHER`` and ``SCATTER`` of the current expert's token rows."""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import wiring

from nanokpu.config import KpuConfig
from nanokpu.isa import Err, Op, word_width
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.dmem import banks
from nanokpu.kpu.executors import executor_signature
from nanokpu.units.shift_add import ShiftAddMultiplier

__all__ = ["Move"]


class Move(wiring.Component):
    """``GATHER``: ``c[i*n .. i*n+n) = a[r*n .. r*n+n)`` and ``SCATTER``: ``c[r*n ..) = a[i*n ..)``
    for ``i < count``, ``r = b[offset + i]`` (the current expert's list, :mod:`nanokpu.isa`);
    a row ``r`` outside ``[0, m)`` ends the instruction with
    :attr:`~nanokpu.isa.Err.SPAD_RANGE` (the rows before it are moved, none after).

    Members: :func:`~nanokpu.kpu.executors.executor_signature` (``ins.count``, ``ins.offset``
    the expert's).

    Two stages. The front prepares row ``i + 1`` while row ``i`` is copied: its list word read on
    ``rd1`` (read, registered, checked: 3 cycles), ``r * n`` on a shift-add multiplier (``1 +
    bit_length(r)`` cycles) and the row's source and destination addresses into a one-row slot.
    The copy reads ``B`` (:func:`~nanokpu.kpu.dmem.banks`) words a cycle on ``rd0`` (its
    ``lanes``) from a registered address and writes them (the lanes past the row's end masked
    off) a cycle after their data arrive, and starts the next row from the slot in the cycle
    after its last read. With rows of ``ceil(n / B) >= 5 + bit_length(r)`` reads (every ``r``
    after the first) the copy never waits: ``GATHER`` and ``SCATTER`` take ``count * ceil(n /
    B) + bit_length(r_0) +`` :data:`FIXED_CYCLES` cycles (``r_0`` the first row); rows of fewer
    than 5 reads wait for the front: ``sum(5 + bit_length(r_i)) + ceil(n / B) - 2`` cycles.
    Neither reads what it writes (the result region overlaps no operand:
    :data:`~nanokpu.isa.OP_RULES`), so the copy's writes may trail the next row's reads.
    """

    #: Cycles besides the words' and the first row's multiply: the first list word read,
    #: registered and checked (3), the multiply's last cycle and the slot taken (2), the last
    #: word's data and write (2), ``done`` (1).
    FIXED_CYCLES = 8

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        super().__init__(executor_signature(cfg))

    def elaborate(self, platform):
        m = Module()
        cfg, ins, spad = self.cfg, self.ins, self.spad
        w = widths(cfg)
        rd0, rd1, wr, blocked = spad.rd0, spad.rd1, spad.wr, spad.blocked
        m.submodules.mul = mul = ShiftAddMultiplier(16, w.aw)
        n = ins.n[:w.sw]
        gather = Signal()

        # the front: list entry i (row_i = i * n), its word registered in `entry`
        i = Signal(16)
        row_i = Signal(w.aw)
        entry = Signal(signed(word_width(cfg)))
        bad = Signal()          # entry i is outside [0, m): the front stops there
        slot = Signal()         # a row is prepared: its first source and destination words
        slot_src = Signal(w.aw)
        slot_dst = Signal(w.aw)

        # the copy: `left` words of the row from src to dst, B a read; the read issued last cycle
        # (rv, its rn words) goes to ra, the words in q (read data, registered) are written at wa
        # (wv, the first wn lanes)
        B = banks(cfg)
        left = Signal(w.sw + 1)
        more = Signal()         # left != 0, registered
        src = Signal(w.aw)
        dst = Signal(w.aw)
        rv, wv = Signal(), Signal()
        ra, wa = Signal(w.aw), Signal(w.aw)
        rn, wn = Signal(range(B + 1)), Signal(range(B + 1))
        q = Signal.like(rd0.lanes)
        m.d.sync += [q.eq(rd0.lanes), wv.eq(rv), wa.eq(ra), wn.eq(rn), rv.eq(0)]
        with m.If(wv):
            m.d.comb += [wr.addr.eq(wa), wr.data.eq(q[0]), wr.en.eq(1)]
            m.d.comb += [wr.upper[j - 1].eq(q[j]) for j in range(1, B)]
            m.d.comb += [wr.upper_en[j - 1].eq(wn > j) for j in range(1, B)]

        running = Signal()
        drained = ~slot & ~more & ~rv & ~wv     # every row prepared is copied, its last word written
        with m.If(running):
            reading = more & ~blocked
            last = left <= B    # the row's last read
            with m.If(reading):
                m.d.comb += [rd0.addr.eq(src), rd0.en.eq(1)]
                m.d.sync += [src.eq(src + B), dst.eq(dst + B), left.eq(left - B), more.eq(~last),
                             rv.eq(1), ra.eq(dst), rn.eq(Mux(last, left, B))]
            with m.If(slot & ~(more & ~(reading & last))):     # the copy is free after this cycle
                m.d.sync += [src.eq(slot_src), dst.eq(slot_dst), left.eq(n), more.eq(1), slot.eq(0)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [i.eq(0), row_i.eq(0), bad.eq(0), slot.eq(0), more.eq(0),
                                 gather.eq(ins.op == Op.GATHER)]
                    m.next = "LIST"
            with m.State("LIST"):
                m.d.comb += running.eq(1)
                with m.If((i >= ins.count) & drained):
                    m.d.comb += [self.done.eq(1), self.error.eq(Err.NONE)]
                    m.next = "IDLE"
                with m.Elif(i >= ins.count):
                    m.next = "DRAIN"
                with m.Elif(~blocked):
                    m.d.comb += [rd1.addr.eq(ins.b + ins.offset + i), rd1.en.eq(1)]
                    m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += running.eq(1)
                m.d.sync += entry.eq(rd1.data)
                m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += running.eq(1)
                with m.If(entry[16:].any() | (entry[:16] >= ins.m)):     # r < 0 or r >= m
                    m.d.sync += bad.eq(1)
                    m.next = "DRAIN"
                with m.Else():
                    m.d.comb += [mul.load.eq(1), mul.y.eq(entry[:16]), mul.x.eq(n)]     # r * n, exact: r < m
                    m.next = "MUL"
            with m.State("MUL"):
                m.d.comb += running.eq(1)
                row = mul.acc
                with m.If(~mul.busy & ~slot):
                    m.d.sync += [slot.eq(1), slot_src.eq(ins.a + Mux(gather, row, row_i)),
                                 slot_dst.eq(ins.c + Mux(gather, row_i, row)),
                                 i.eq(i + 1), row_i.eq(row_i + n)]
                    m.next = "LIST"
            with m.State("DRAIN"):
                m.d.comb += running.eq(1)
                with m.If(drained):
                    m.d.comb += [self.done.eq(1), self.error.eq(Mux(bad, Err.SPAD_RANGE, Err.NONE))]
                    m.next = "IDLE"
        return m
