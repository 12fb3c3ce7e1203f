"""``REQUANT_WIDE``: the wide router's digit-GEMM partial sums joined into its exact sums and
requantised, one logit at a time on a bit-serial requantiser (no DSP block)."""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import wiring

from nanokpu.config import KpuConfig
from nanokpu.isa import F_RQ_CHANNEL, F_RQ_EXPERT, Err
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.executors import executor_signature, saturate_to_width
from nanokpu.units.requant import Requantiser

__all__ = ["WideRequant"]


class WideRequant(wiring.Component):
    """``REQUANT_WIDE`` of :mod:`nanokpu.isa`: ``c[i] = requantize(join_partials(a[i], a[len + i],
    a[2*len + i], a[3*len + i], in_width, router_acc_width), mult, shift, width)``, ``i < len``.

    Members: :func:`~nanokpu.kpu.executors.executor_signature` (``ins`` with ``expert`` for
    :data:`~nanokpu.isa.F_RQ_EXPERT`). While no instruction runs, every output of its scratchpad
    port is 0 (addresses and data too), so its owner may OR it with others.

    Per logit ``i``: two read cycles take its four partials (``acc_width`` bits each, the port
    width), a third its requantiser constants when flagged (column ``j = i mod n``'s entry at ``b
    + 2*(j*E + e)`` with :data:`~nanokpu.isa.F_RQ_CHANNEL`, ``b + 2*expert`` with
    :data:`~nanokpu.isa.F_RQ_EXPERT` alone; else the instruction's ``mult`` and ``shift``), reads
    waiting while ``blocked``; the sum ``v = (P_hh << 2D) + ((P_lh + P_hl) << D) + P_ll`` (``D =
    in_width``, :attr:`~nanokpu.config.KpuConfig.router_acc_width` bits) goes to a
    :class:`~nanokpu.units.requant.Requantiser` of one lane with a bit-serial product (``acc_width
    = router_acc_width``, ``out_width = acc_width``), whose result, saturated to ``width``, is
    written at ``c + i``. The next logit's reads overlap the product: one logit every
    ``max(mult_width, 3)`` cycles (the requantiser's interval), ``done`` in the cycle after the
    last write: ``16 * len + 8`` cycles from ``start`` at ``mult_width = 16`` when no read waits
    (tests/kpu/test_elementwise_gemm.py); no error.
    """

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        super().__init__(executor_signature(cfg))

    def elaborate(self, platform):
        m = Module()
        cfg, ins, spad = self.cfg, self.ins, self.spad
        AW, SW = widths(cfg).aw, widths(cfg).sw
        accw, D = cfg.acc_width, cfg.in_width
        m.submodules.rq = rq = Requantiser(cfg, 1, accw, acc_width=cfg.router_acc_width, serial=True)

        running = Signal()
        left = Signal(SW)                   # logits whose operands are still to read
        left_nz = Signal()                  # left != 0, registered: off the read enable's path
        written = Signal(SW)
        ptr = [Signal(AW, name=f"ptr{q}") for q in range(4)]      # a + q*len + i
        wr_ptr = Signal(AW)
        table, per_col = Signal(), Signal()  # constants from the table; one entry per column
        tab0, tab, tab_step = Signal(AW), Signal(AW), Signal(AW)
        tab1 = Signal(AW)                   # tab + 1, registered: no adder on the read address
        col = Signal(16)
        phase = Signal(2)                   # reads of the current logit: partials 0, 1; table 2; 3 done
        cap = Signal(3)                     # the read issued last cycle, by phase (one-hot)
        parts = [Signal(signed(accw), name=f"p{q}") for q in range(4)]   # P_hh, P_lh, P_hl, P_ll
        mult, shift = Signal.like(rq.mult), Signal.like(rq.shift)
        v_valid = Signal()
        rd0, rd1, wr = spad.rd0, spad.rd1, spad.wr

        flags, ln = ins.flags, ins.len
        with m.If(self.start):
            e2 = Mux(flags & F_RQ_EXPERT, ins.expert << 1, 0)
            m.d.sync += [running.eq(1), left.eq(ln), left_nz.eq(ln != 0), written.eq(0), wr_ptr.eq(ins.c),
                         ptr[0].eq(ins.a), ptr[1].eq(ins.a + ln), ptr[2].eq(ins.a + (ln << 1)),
                         ptr[3].eq(ins.a + ln + (ln << 1)),
                         table.eq((flags & (F_RQ_CHANNEL | F_RQ_EXPERT)) != 0), per_col.eq((flags & F_RQ_CHANNEL) != 0),
                         tab0.eq(ins.b + e2), tab.eq(ins.b + e2), tab1.eq(ins.b + e2 + 1),
                         tab_step.eq(Mux(flags & F_RQ_EXPERT, 2 * cfg.n_experts, 2)), col.eq(0),
                         phase.eq(0), v_valid.eq(0), mult.eq(ins.mult), shift.eq(ins.shift)]

        # -- reads: the next logit's operands, while the register they go to is free
        reading = running & left_nz & ~v_valid
        m.d.sync += cap.eq(0)
        with m.If(reading):
            with m.Switch(phase):
                for ph, (addr0, addr1) in enumerate(((ptr[0], ptr[1]), (ptr[2], ptr[3]), (tab, tab1))):
                    with m.Case(ph):
                        with m.If(~spad.blocked):
                            m.d.comb += [rd0.addr.eq(addr0), rd1.addr.eq(addr1), rd0.en.eq(1), rd1.en.eq(1)]
                            m.d.sync += [cap.eq(1 << ph), phase.eq(Mux((ph == 1) & ~table, 3, ph + 1))]
                with m.Case(3):     # the last read's words are taken in this cycle
                    last_col = col == ins.n - 1
                    tab_next = Mux(per_col, Mux(last_col, tab0, tab + tab_step), tab)
                    m.d.sync += [v_valid.eq(1), phase.eq(0), left.eq(left - 1), left_nz.eq(left != 1),
                                 *(p.eq(p + 1) for p in ptr),
                                 col.eq(Mux(last_col, 0, col + 1)),
                                 tab.eq(tab_next), tab1.eq(tab_next + 1)]
        for q in range(2):
            with m.If(cap[q]):
                m.d.sync += [parts[2 * q].eq(rd0.data[:accw].as_signed()),
                             parts[2 * q + 1].eq(rd1.data[:accw].as_signed())]
        with m.If(cap[2]):
            m.d.sync += [mult.eq(rd0.data[:len(mult)]), shift.eq(rd1.data[:len(shift)])]

        # -- the join (golden.intops.join_partials) into the requantiser, its results written
        p_hh, p_lh, p_hl, p_ll = parts
        v = (p_hh << 2 * D) + ((p_lh + p_hl) << D) + p_ll
        m.d.comb += [rq.i.valid.eq(v_valid), rq.i.payload[0].eq(v[:cfg.router_acc_width].as_signed()),
                     rq.mult.eq(mult), rq.shift.eq(shift), rq.o.ready.eq(1)]
        with m.If(rq.i.valid & rq.i.ready):
            m.d.sync += v_valid.eq(0)
        with m.If(rq.o.valid):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(wr_ptr),
                         wr.data.eq(saturate_to_width(rq.o.payload[0], ins.width, accw))]
            m.d.sync += [wr_ptr.eq(wr_ptr + 1), written.eq(written + 1)]
        with m.If(running & (written == ln)):
            m.d.comb += [self.done.eq(1), self.error.eq(Err.NONE)]
            m.d.sync += running.eq(0)
        return m
