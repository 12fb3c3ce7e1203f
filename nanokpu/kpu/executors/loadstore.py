"""The load/store executor: ``LOAD`` (host memory -> scratchpad) and ``STORE`` (scratchpad -> host
memory) through the AXI4 master, a beat per cycle."""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from nanokpu.config import KpuConfig
from nanokpu.isa import Err, Op, bus_bytes
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.dmem import banks
from nanokpu.kpu.executors import dma_client_signature, executor_signature, lanes_now

__all__ = ["LoadStore"]


class LoadStore(wiring.Component):
    """``LOAD``: ``c[i] = host element i`` (``width`` = 1, 2 or 4 bytes, sign-extended) and
    ``STORE``: ``host int32 element i = a[i]``, for ``i < len``, little-endian, elements packed
    ``bus_bytes / width`` to a beat.

    Members: :func:`~nanokpu.kpu.executors.executor_signature` and ``dma``
    (:func:`~nanokpu.kpu.executors.dma_client_signature`): the burst starts with ``start``
    (its address and beat count are the decode's); a bus error ends the instruction at once with
    :attr:`~nanokpu.isa.Err.BUS_ERROR` (the controller then drains the bus).

    Timing, the bus ready, ``B`` = :func:`~nanokpu.kpu.dmem.banks`: ``LOAD`` writes up to ``B``
    elements of a beat per cycle (one wide write: ``ceil(bus_bytes / width / B)`` cycles a
    beat) and takes the next beat in the cycle it writes the last elements of a beat; ``STORE``
    reads a beat's elements up to ``B`` a read (``ceil(bus_bytes / 4 / B)`` reads a beat, issued
    a cycle ahead, held in the scratchpad's read port while the beat waits) and offers the beat
    in the cycle after its last elements arrived. ``done`` comes when the burst is over and
    every element written (``LOAD``) or sent (``STORE``).
    """

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        sig = dict(executor_signature(cfg).members) | {"dma": Out(dma_client_signature(cfg))}
        super().__init__(sig)

    def elaborate(self, platform):
        m = Module()
        cfg, ins, dma, spad = self.cfg, self.ins, self.dma, self.spad
        bw = bus_bytes(cfg)
        sw = widths(cfg).sw
        busy = Signal()
        store = Signal()
        el = Signal(sw)          # LOAD: elements written; STORE: elements read
        # the fields the run reads, latched at start: its address arithmetic reads registers of
        # its own, placed beside it, not the controller's issue register
        run = Signal(ins.shape())
        more = el < run.len
        with m.If(self.start):
            m.d.sync += [busy.eq(1), store.eq(ins.op == Op.STORE), el.eq(0)]
            m.d.sync += [run.len.eq(ins.len), run.width.eq(ins.width), run.a.eq(ins.a), run.c.eq(ins.c)]
            m.d.comb += [dma.rd_start.eq(ins.op == Op.LOAD), dma.wr_start.eq(ins.op == Op.STORE)]

        # ---- LOAD: a beat held, its elements written B per cycle (lanes lane .. lane + B - 1) --
        B = banks(cfg)
        beat = Signal(8 * bw)
        full = Signal()
        lane = Signal(range(bw + B))
        per_beat = Mux(run.width == 1, bw, Mux(run.width == 2, bw // 2, bw // 4))

        def elem(i):
            """Element ``lane + i`` of the beat (0 past its end)."""
            at = lane + i
            return Mux(run.width == 1, beat.word_select(at, 8).as_signed(),
                       Mux(run.width == 2, beat.word_select(at, 16).as_signed(), beat.word_select(at, 32).as_signed()))
        beat_end = full & (lane + B >= per_beat)
        n_now = Signal(range(B + 1))     # elements written this cycle
        k_beat, k_len = per_beat - lane, run.len - el
        m.d.comb += n_now.eq(lanes_now(k_beat, k_len, B))
        # ---- STORE: wide reads issued a cycle ahead (each the elements of one beat's lanes
        # r_lane .. r_lane + r_k - 1), placed into the beat, which is offered when full -----------
        epb = bw // 4
        out = Signal(dma.wr_data.payload.shape())
        out_full = Signal()
        r_lane = Signal(range(epb))          # the beat lane of the next read's first element
        k_lane, k_left = epb - r_lane, run.len - el
        r_k = Signal(range(B + 1))           # the next read's elements
        m.d.comb += r_k.eq(lanes_now(k_lane, k_left, B))
        pending = Signal()       # rd0.lanes hold p_k elements read and not yet placed
        p_lane = Signal.like(r_lane)
        p_k = Signal.like(r_k)
        send = out_full & dma.wr_data.ready
        can_take = ~out_full | send
        take = pending & can_take
        issue = more & (~pending | take)
        m.d.comb += dma.wr_data.payload.eq(out)
        with m.If(busy & ~store):
            m.d.comb += dma.rd_data.ready.eq(~full | beat_end)
            with m.If(dma.rd_data.valid & dma.rd_data.ready):
                m.d.sync += [beat.eq(dma.rd_data.payload), full.eq(1), lane.eq(0)]
            with m.Elif(beat_end):
                m.d.sync += full.eq(0)
            with m.If(full):
                with m.If(more):
                    m.d.comb += [spad.wr.addr.eq(run.c + el), spad.wr.data.eq(elem(0)), spad.wr.en.eq(1)]
                    m.d.comb += [spad.wr.upper[j - 1].eq(elem(j)) for j in range(1, B)]
                    m.d.comb += [spad.wr.upper_en[j - 1].eq(n_now > j) for j in range(1, B)]
                    m.d.sync += el.eq(el + n_now)
                with m.If(~beat_end):
                    m.d.sync += lane.eq(lane + B)
            with m.If(dma.error | (~dma.rd_busy & ~full & ~more)):
                m.d.comb += self.done.eq(1)
        with m.If(busy & store):
            m.d.comb += [spad.rd0.addr.eq(run.a + el), spad.rd0.en.eq(issue), dma.wr_data.valid.eq(out_full)]
            with m.If(issue):
                r_next = r_lane + r_k
                m.d.sync += [el.eq(el + r_k), pending.eq(1), p_lane.eq(r_lane), p_k.eq(r_k),
                             r_lane.eq(Mux(r_next == epb, 0, r_next))]
            with m.Elif(take):
                m.d.sync += pending.eq(0)
            with m.If(send):
                m.d.sync += out_full.eq(0)
            with m.If(take):
                # lane j of the beat takes read lane j - p_lane; a read at lane 0 begins a beat
                lanes = Array(spad.rd0.lanes[i][:32] for i in range(B))
                for j in range(epb):
                    src = (j - p_lane).as_unsigned()
                    with m.If((j >= p_lane) & (src < p_k)):
                        m.d.sync += [out.data.word_select(j, 32).eq(lanes[src]), out.strb.word_select(j, 4).eq(0xF)]
                    with m.Elif(p_lane == 0):
                        m.d.sync += out.strb.word_select(j, 4).eq(0)
                m.d.sync += out_full.eq((p_lane + p_k == epb) | ~more)
            with m.If(dma.error | (~dma.wr_busy & ~more & ~pending & ~out_full)):
                m.d.comb += self.done.eq(1)
        with m.If(self.done):
            m.d.sync += busy.eq(0)
            m.d.comb += self.error.eq(Mux(dma.error, Err.BUS_ERROR, Err.NONE))
        return m
