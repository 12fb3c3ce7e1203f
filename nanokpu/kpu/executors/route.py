"""The route executor: ``ROUTE`` on the routing engine (:class:`~nanokpu.units.router.TopKRouter`),
then the dispatch lists by a counting sort."""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.isa import Err
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.executors import executor_signature

__all__ = ["Route"]


class Route(wiring.Component):
    """``ROUTE`` (:mod:`nanokpu.isa`): the table of :func:`~nanokpu.isa.route_table` at ``c`` for
    ``m`` tokens whose scores are at ``a`` (``n_experts`` per token) with the bias at ``b``.

    Members: :func:`~nanokpu.kpu.executors.executor_signature`, and the routing engine's ports
    seen from its user: ``scores`` (out), ``routes`` (in), ``bias`` (``we``, ``addr``, ``data``).

    Phases, ``E = n_experts``, ``tk = m * top_k``:

    1. bias: ``E`` words read and written into the engine (``E + 1`` cycles), the per-expert
       counters cleared;
    2. scores fed (``route_lanes`` per beat, one scratchpad read each) while the routes come
       back: each written as its index and weight (2 writes) and counted per expert;
    3. counts and offsets (the exclusive prefix sum of the counts): 3 cycles per expert;
    4. the lists: each slot ``p < tk`` in order, its index read back and its slot ``p`` and
       token ``p // top_k`` written at its expert's next list position (4 cycles per slot),
       so each list is in slot order.
    """

    def __init__(self, cfg: KpuConfig, route_layout: data.StructLayout):
        self.cfg = cfg
        self.route_layout = route_layout
        self.index_width = route_layout.members["index"].width
        super().__init__(dict(executor_signature(cfg).members) | {
            "scores": Out(stream.Signature(data.ArrayLayout(unsigned(cfg.score_width), cfg.route_lanes))),
            "routes": In(stream.Signature(route_layout)),
            "bias": Out(wiring.Signature({"we": Out(1), "addr": Out(self.index_width),
                                          "data": Out(signed(cfg.bias_width))})),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, ins, spad = self.cfg, self.ins, self.spad
        E, top_k, lanes = cfg.n_experts, cfg.top_k, cfg.route_lanes
        w = widths(cfg)
        rd0, wr, blocked = spad.rd0, spad.wr, spad.blocked
        tk = Signal(w.sw)
        m.d.comb += tk.eq(ins.m * top_k)
        cb = ins.c + 2 * tk           # counts, then offsets
        lp = cb + 2 * E               # list of slots, then list of tokens
        # per-expert counters: counts, then the next list position of each expert
        m.submodules.ctr = ctr = Memory(shape=unsigned(w.sw), depth=E, init=[])
        c_rd, c_wr = ctr.read_port(), ctr.write_port()

        j = Signal(range(E + 1))
        # phase 2: scores fed from a packing register; routes written from a holding register
        feed_left = Signal(w.sw)     # tokens whose scores are still to feed
        route_left = Signal(w.sw)    # tokens whose routes are still to write
        el = Signal(range(E + lanes))
        lane = Signal(range(lanes + 1))
        tbase = Signal(w.aw)
        tslot = Signal(w.aw)
        s = Signal(range(top_k + 1))
        cap = Signal()
        cap_lane = Signal(range(lanes))
        cap_ok = Signal()
        pack = Signal(data.ArrayLayout(unsigned(cfg.score_width), lanes))
        wvalid = Signal()
        feed_done = Signal()
        hold = Signal()
        held = Signal(self.route_layout)
        # routes.ready: in ROUTES while no route is held, registered, since in the engine it
        # decides whether the next token's results are taken, which runs into its merge tree
        rready = Signal()
        wphase = Signal()
        # phases 3 and 4
        off = Signal(w.sw)
        p = Signal(w.sw)
        pt = Signal(w.sw)
        ps = Signal(range(top_k))
        idx_q = Signal(self.index_width)
        pos = Signal(w.sw)
        count = Signal(w.sw)

        # (wvalid is low outside ROUTES: every beat is fed before the last route comes back)
        m.d.comb += [self.scores.payload.eq(pack), self.scores.valid.eq(wvalid), self.routes.ready.eq(rready)]
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += j.eq(0)
                    m.next = "BIAS"
            with m.State("BIAS"):
                # word j read, word j - 1 written into the engine; counter j cleared
                m.d.comb += [rd0.addr.eq(ins.b + j), rd0.en.eq(1),
                             c_wr.addr.eq(j), c_wr.data.eq(0), c_wr.en.eq(j < E)]
                m.d.sync += j.eq(j + 1)
                with m.If(j != 0):
                    m.d.comb += [self.bias.we.eq(1), self.bias.addr.eq(j - 1),
                                 self.bias.data.eq(rd0.data[:cfg.bias_width])]
                with m.If(j == E):
                    m.d.sync += [feed_left.eq(ins.m), route_left.eq(ins.m), el.eq(0), lane.eq(0),
                                 wvalid.eq(0), tbase.eq(ins.a), tslot.eq(ins.c), feed_done.eq(0),
                                 cap.eq(0), s.eq(0), hold.eq(0), rready.eq(1), wphase.eq(0)]
                    m.next = "ROUTES"
            with m.State("ROUTES"):
                # scores: beat (t, b), lane l = expert el = b*lanes + l of token t, at tbase = a + t*E
                with m.If(~wvalid & ~feed_done & (lane < lanes) & ~blocked):
                    m.d.comb += [rd0.addr.eq(tbase + el), rd0.en.eq(1)]
                    m.d.sync += [cap.eq(1), cap_lane.eq(lane), cap_ok.eq(el < E), lane.eq(lane + 1),
                                 el.eq(el + 1)]
                with m.Else():
                    m.d.sync += cap.eq(0)
                with m.If(cap):
                    m.d.sync += pack[cap_lane].eq(Mux(cap_ok, rd0.data[:cfg.score_width], 0))
                    with m.If(cap_lane == lanes - 1):
                        m.d.sync += wvalid.eq(1)
                with m.If(self.scores.valid & self.scores.ready):
                    m.d.sync += [wvalid.eq(0), lane.eq(0)]
                    with m.If(el >= E):
                        m.d.sync += [el.eq(0), feed_left.eq(feed_left - 1), tbase.eq(tbase + E)]
                        with m.If(~feed_left[1:].any()):
                            m.d.sync += feed_done.eq(1)
                # routes: index then weight, two writes per route; the index's count read, then
                # written back plus one
                with m.If(self.routes.valid & rready):
                    m.d.sync += [hold.eq(1), rready.eq(0), held.eq(self.routes.payload)]
                slot = tslot + s          # c + t*top_k + s
                m.d.comb += c_rd.addr.eq(held.index)
                with m.If(hold & ~wphase):
                    m.d.comb += [wr.addr.eq(slot), wr.data.eq(held.index), wr.en.eq(1)]
                    m.d.sync += wphase.eq(1)
                with m.If(hold & wphase):
                    m.d.comb += [wr.addr.eq(slot + tk), wr.data.eq(held.weight), wr.en.eq(1),
                                 c_wr.addr.eq(held.index), c_wr.data.eq(c_rd.data + 1), c_wr.en.eq(1)]
                    m.d.sync += [hold.eq(0), rready.eq(1), wphase.eq(0)]
                    with m.If(held.last | (s == top_k - 1)):
                        m.d.sync += [s.eq(0), route_left.eq(route_left - 1), tslot.eq(tslot + top_k)]
                    with m.Else():
                        m.d.sync += s.eq(s + 1)
                with m.If(route_left == 0):
                    m.d.sync += [j.eq(0), off.eq(0), rready.eq(0)]
                    m.next = "COUNT"
            # counts and offsets: counter j read (its data in the next state); expert j's offset
            # written and put back into the counter as its next list position, then its count
            with m.State("COUNT"):
                m.d.comb += c_rd.addr.eq(j)
                m.next = "OFFSET_W"
            with m.State("OFFSET_W"):
                m.d.comb += [wr.addr.eq(cb + E + j), wr.data.eq(off), wr.en.eq(1),
                             c_wr.addr.eq(j), c_wr.data.eq(off), c_wr.en.eq(1)]
                m.d.sync += [off.eq(off + c_rd.data), count.eq(c_rd.data)]
                m.next = "COUNT_W"
            with m.State("COUNT_W"):
                m.d.comb += [wr.addr.eq(cb + j), wr.data.eq(count), wr.en.eq(1)]
                m.d.sync += j.eq(j + 1)
                with m.If(j + 1 < E):
                    m.next = "COUNT"
                with m.Else():         # m >= 1 (the decode's shape check): tk >= 1 slots
                    m.d.sync += [p.eq(0), pt.eq(0), ps.eq(0)]
                    m.next = "SLOT"
            # the lists: slot p's index read back, its expert's position read, two writes
            with m.State("SLOT"):
                with m.If(~blocked):
                    m.d.comb += [rd0.addr.eq(ins.c + p), rd0.en.eq(1)]
                    m.next = "SLOT_POS"
            with m.State("SLOT_POS"):
                m.d.comb += c_rd.addr.eq(rd0.data[:self.index_width])
                m.d.sync += idx_q.eq(rd0.data[:self.index_width])
                m.next = "SLOT_P"
            with m.State("SLOT_P"):
                m.d.comb += [wr.addr.eq(lp + c_rd.data), wr.data.eq(p), wr.en.eq(1),
                             c_wr.addr.eq(idx_q), c_wr.data.eq(c_rd.data + 1), c_wr.en.eq(1)]
                m.d.sync += pos.eq(c_rd.data)
                m.next = "SLOT_T"
            with m.State("SLOT_T"):
                m.d.comb += [wr.addr.eq(lp + tk + pos), wr.data.eq(pt), wr.en.eq(1)]
                m.d.sync += p.eq(p + 1)
                with m.If(ps == top_k - 1):
                    m.d.sync += [ps.eq(0), pt.eq(pt + 1)]
                with m.Else():
                    m.d.sync += ps.eq(ps + 1)
                with m.If(p + 1 == tk):
                    m.next = "DONE"
                with m.Else():
                    m.next = "SLOT"
            with m.State("DONE"):
                m.d.comb += [self.done.eq(1), self.error.eq(Err.NONE)]
                m.next = "IDLE"
        return m
