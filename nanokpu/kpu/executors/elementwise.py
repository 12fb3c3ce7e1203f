"""The element-wise executor: ``REQUANT``, ``SIGMOID``, ``SITU``, ``ADD``, ``COMBINE``, ``NORM``,
``SPLIT``, ``SILU``, ``DECAY``, ``SOFTMAX``, ``MUL`` and ``CONV`` on one streaming engine that walks the
operands through the scratchpad, one element per cycle; ``REQUANT_WIDE`` on a
:class:`~nanokpu.kpu.executors.wide_requant.WideRequant`, ``KDA_STEP`` on a
:class:`~nanokpu.kpu.executors.kda_step.KdaStep` and ``ATTEND`` on an
:class:`~nanokpu.kpu.executors.attend.Attend`."""

from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import Out

from nanokpu.config import KpuConfig
from nanokpu.isa import F_ACC, F_EPS, F_L2, F_RQ_CHANNEL, F_RQ_EXPERT, Err, Op, word_width
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.dmem import banks
from nanokpu.kpu.executors import executor_signature, lanes_now, requantiser_signature, saturate_to_width
from nanokpu.kpu.executors.attend import Attend
from nanokpu.kpu.executors.kda_step import KdaStep
from nanokpu.kpu.executors.wide_requant import WideRequant
from nanokpu.units.pwl import saturate
from nanokpu.units.pwl_functions import Decay, Silu
from nanokpu.units.sigmoid import Sigmoid
from nanokpu.units.situ import Situ
from nanokpu.units.softmax import Softmax
from nanokpu.units.vector import VecOp, VectorUnit

__all__ = ["Elementwise"]

#: Reads in flight plus beats held that the engine allows: 1 in flight + 1 at the unit + 1 for
#: the cycle the count lags a take keeps one read per cycle (the skid queue holds BEATS - 1).
BEATS = 3


class Elementwise(wiring.Component):
    """The element-wise ops of :mod:`nanokpu.isa` on :class:`~nanokpu.units.sigmoid.Sigmoid`,
    :class:`~nanokpu.units.situ.Situ`, :class:`~nanokpu.units.vector.VectorUnit` (its own) and
    the GEMM engine's requantiser (``rq``, borrowed: :func:`~nanokpu.kpu.executors.requantiser_signature`);
    ``REQUANT_WIDE`` on its :class:`~nanokpu.kpu.executors.wide_requant.WideRequant`, which has the
    scratchpad port while it runs (it and ``SPLIT`` built only with
    :attr:`~nanokpu.config.KpuConfig.wide_router`); ``SILU``, ``DECAY`` and ``SOFTMAX`` on
    :class:`~nanokpu.units.pwl_functions.Silu`, :class:`~nanokpu.units.pwl_functions.Decay` and
    :class:`~nanokpu.units.softmax.Softmax` (rows of up to ``attnres_candidates``; built only with
    :attr:`~nanokpu.config.KpuConfig.layer_ops`, as ``MUL`` and ``CONV`` on the vector unit, and
    ``KDA_STEP`` on its :class:`~nanokpu.kpu.executors.kda_step.KdaStep` and ``ATTEND`` on its
    :class:`~nanokpu.kpu.executors.attend.Attend`, which have the scratchpad port while they run, as
    ``REQUANT_WIDE``'s).

    Members: :func:`~nanokpu.kpu.executors.executor_signature` (``ins`` with ``p2 = k * n`` for
    ``COMBINE``, ``expert`` for a ``REQUANT`` with :data:`~nanokpu.isa.F_RQ_EXPERT`) and ``rq``.

    The engine walks the ``a`` and ``b`` operands in 3 nested levels (``REQUANT``, ``SIGMOID``,
    ``SITU``, ``ADD``, ``SILU``, ``DECAY``: one level of ``len``; ``SOFTMAX``: each row of ``n``, the
    beat that ends a row marked ``last``; ``MUL``: each row of ``n`` of ``a``, ``b``'s one row again
    for each; ``CONV``: the ``k`` taps of each of ``n`` channels of each of ``m - k + 1`` result rows,
    ``a`` stepping a row and ``b`` a tap, each channel's taps a group of the vector unit's dot
    product; ``COMBINE``: ``k`` expert outputs of each of ``n``
    columns of each of ``m`` tokens; ``NORM``: each row of ``n`` twice, the vector unit's RMSNorm
    or with :data:`~nanokpu.isa.F_L2` its l2norm, the epsilon the config's or with
    :data:`~nanokpu.isa.F_EPS` word ``b[0]``; ``SPLIT``: ``a`` twice, the high digits written in
    the first pass, the low ones in the second: ``2 * len`` results), reading both operands
    in one cycle into a register the selected unit takes its beat from, with a skid queue in
    front (a read is issued while fewer than :data:`BEATS` are in flight or held, counted off
    flip-flops: the scratchpad's read enable does not depend on any unit's ``ready``), and writes the unit's
    results at ``c`` on in order as they come. ``REQUANT`` reads ``B``
    (:func:`~nanokpu.kpu.dmem.banks`) values a read (``rd0``'s lanes) into the word of ``rows``
    values the requantiser takes, and writes each result word back ``B`` lanes a write (a word a
    cycle when ``B = rows``; with ``F_RQ_EXPERT`` the multiplier and shift are first read from
    ``b + 2*expert``); its results are saturated to ``width`` bits. ``done`` comes in the cycle
    after the last result is written; no error.
    """

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        super().__init__(dict(executor_signature(cfg).members) | {"rq": Out(requantiser_signature(cfg))})

    def elaborate(self, platform):  # noqa: C901 - one engine, six ops
        m = Module()
        cfg, ins, spad, rq = self.cfg, self.ins, self.spad, self.rq
        w = widths(cfg)
        SW, AW, R = w.sw, w.aw, cfg.rows
        act, accw, ww = cfg.act_width, cfg.acc_width, word_width(cfg)
        rd0, rd1, wr, blocked = spad.rd0, spad.rd1, spad.wr, spad.blocked
        m.submodules.sigmoid = sig = Sigmoid(cfg)
        m.submodules.situ = situ = Situ(cfg)
        m.submodules.vector = vec = VectorUnit(cfg)
        # SILU and DECAY only with layer_ops (decode refuses them otherwise): act format in, one lane
        tables = {Op.SIGMOID: sig}
        if cfg.layer_ops:
            m.submodules.silu = tables[Op.SILU] = Silu(cfg)
            m.submodules.decay = tables[Op.DECAY] = Decay(cfg)
            m.submodules.softmax = smx = Softmax(cfg)
        # SPLIT and REQUANT_WIDE only with a wide router (nanokpu.isa.built_ops: decode refuses them otherwise)
        built_wide = cfg.wide_router
        delegates = {}      # sub-executors with the scratchpad port while they run, by their state
        if built_wide:
            m.submodules.wide = delegates["WIDE"] = wide = WideRequant(cfg)
        if cfg.layer_ops:
            m.submodules.kda = delegates["KDA"] = kda = KdaStep(cfg)
            m.submodules.attend = delegates["ATTEND"] = attend = Attend(cfg)
        D = cfg.in_width

        # the walk: rem[j] counts the steps of level j left, this one included, down from cnt[j]
        # (counts are sizes of checked regions, >= 1; addresses and strides modulo 2**AW)
        cnt = [Signal(SW, name=f"cnt{j}") for j in range(2)]
        rem = [Signal(SW, name=f"rem{j}") for j in range(3)]
        # strides: sa1 and sb0 are 0 or 1 in every walk, sb1 too but CONV's (k)
        sa = [Signal(AW, name="sa0"), Signal(1, name="sa1"), Signal(AW, name="sa2")]
        sb = [Signal(1, name="sb0"), Signal(AW if cfg.layer_ops else 1, name="sb1"), Signal(AW, name="sb2")]
        pa, ra1, ra2 = Signal(AW), Signal(AW), Signal(AW)
        pb, rb1, rb2 = Signal(AW), Signal(AW), Signal(AW)
        issuing = Signal()
        # the beats: a read issued on one edge (g: its words on rd0/rd1 in the next cycle) goes
        # to stage h (the registered beat the unit sees) or, while h is taken, to `skid`. A read
        # is issued while the beats in g, skid and h are fewer than BEATS, counted off flip-flops,
        # so the scratchpad's read enable never waits on a unit's ready
        g_valid, g_last = Signal(), Signal()
        h_valid = Signal()
        beat_layout = data.StructLayout({"a": signed(ww), "b": signed(ww), "last": 1})
        beat = Signal(beat_layout)      # stage h's operands, held while it stalls
        a_word, b_word, h_last = beat.a, beat.b, beat.last
        m.submodules.skid = skid = SyncFIFO(width=beat_layout.size, depth=BEATS - 1)
        el = Signal(SW)                 # results written
        unit_ready = Signal()           # the selected unit takes the current beat
        run = Signal()
        h_free = ~h_valid | unit_ready
        g_beat = Cat(rd0.data, rd1.data, g_last)
        with m.If(h_free):
            m.d.sync += [beat.eq(Mux(skid.r_rdy, skid.r_data, g_beat)), h_valid.eq(skid.r_rdy | g_valid)]
        m.d.comb += [skid.r_en.eq(h_free), skid.w_data.eq(g_beat),
                     skid.w_en.eq(g_valid & ~(h_free & ~skid.r_rdy))]
        issue = issuing & ~blocked & (g_valid + skid.level + h_valid < BEATS)

        def walk(c0, c1, c2, a0, a1, a2, b0, b1, b2):
            return [cnt[0].eq(c0), cnt[1].eq(c1), sa[0].eq(a0), sa[1].eq(a1),
                    sa[2].eq(a2), sb[0].eq(b0), sb[1].eq(b1), sb[2].eq(b2),
                    rem[0].eq(c0), rem[1].eq(c1), rem[2].eq(c2),
                    pa.eq(ins.a), ra1.eq(ins.a), ra2.eq(ins.a),
                    pb.eq(ins.b), rb1.eq(ins.b), rb2.eq(ins.b),
                    issuing.eq(1), g_valid.eq(0), h_valid.eq(0), el.eq(0)]

        with m.If(run):
            m.d.comb += [rd0.addr.eq(pa), rd1.addr.eq(pb), rd0.en.eq(issue), rd1.en.eq(issue)]
            m.d.sync += [g_valid.eq(issue), g_last.eq(rem[0] == 1)]
            with m.If(issue):
                with m.If(rem[0][1:].any()):
                    m.d.sync += [rem[0].eq(rem[0] - 1), pa.eq(pa + sa[0]), pb.eq(pb + sb[0])]
                with m.Elif(rem[1][1:].any()):
                    m.d.sync += [rem[0].eq(cnt[0]), rem[1].eq(rem[1] - 1),
                                 ra1.eq(ra1 + sa[1]), pa.eq(ra1 + sa[1]),
                                 rb1.eq(rb1 + sb[1]), pb.eq(rb1 + sb[1])]
                with m.Else():
                    m.d.sync += [rem[0].eq(cnt[0]), rem[1].eq(cnt[1]), rem[2].eq(rem[2] - 1),
                                 ra2.eq(ra2 + sa[2]), ra1.eq(ra2 + sa[2]), pa.eq(ra2 + sa[2]),
                                 rb2.eq(rb2 + sb[2]), rb1.eq(rb2 + sb[2]), pb.eq(rb2 + sb[2])]
                    with m.If(~rem[2][1:].any()):
                        m.d.sync += issuing.eq(0)

        # the running op as registered flags: the engine selects by these, not by comparing the
        # opcode, whose decode would otherwise sit on the scratchpad's address and enable paths
        is_rq, is_situ, is_split, is_softmax, is_conv = Signal(), Signal(), Signal(), Signal(), Signal()
        is_acc = Signal()       # ADD with F_ACC: a + b saturated to acc_width, here (not on the vector unit)
        is_table = {op: Signal(name=f"is_{op.name.lower()}") for op in tables}   # SIGMOID and the layer's
        low = Signal()          # SPLIT: the second pass (the low digits)
        results = Signal(SW + 1)    # results the op writes: len, or 2 * len for SPLIT
        vec_op = Signal(VecOp)
        # REQUANT: the word sent to the requantiser (when wvalid); the lane of it the next read
        # fills (r_lane, r_k values), the read in rd0 not yet placed (q_pend: q_k values for lanes
        # from q_lane), values read (q_read); the result word written back (hold), from lane
        # w_lane; its multiplier, shift and output width
        B = banks(cfg)
        pack = Signal(data.ArrayLayout(signed(accw), R))
        wvalid = Signal()
        r_lane, q_lane, w_lane = Signal(range(R)), Signal(range(R)), Signal(range(R))
        r_k, q_k = Signal(range(B + 1)), Signal(range(B + 1))
        q_pend = Signal()
        q_read = Signal(SW)
        hold = Signal(data.ArrayLayout(signed(accw), R))    # the result word being written back
        hold_valid = Signal()
        ln = ins.len
        k_lane, k_left = R - r_lane, ln - q_read
        m.d.comb += r_k.eq(lanes_now(k_lane, k_left, B))
        mult = Signal.like(rq.mult)
        shift = Signal.like(rq.shift)
        width = Signal(6)
        m.d.comb += [rq.mult.eq(mult), rq.shift.eq(shift), rq.i.payload.eq(pack)]
        if cfg.layer_ops:
            eps = Signal(2 * act, init=vec.eps_q)   # NORM's epsilon: F_EPS reads it from b
            l2 = Signal()                           # NORM with F_L2: the l2norm
            # REQUANT with F_RQ_CHANNEL (the RQC states): its column's entry at t_addr, from
            # t_base (b, + 2*expert with F_RQ_EXPERT) a column (2*E words, else 2) at a time
            E = cfg.n_experts
            rqc = Signal()
            t_base, t_addr, t_step = Signal(AW), Signal(AW), Signal(range(2 * E + 1))
            t_col = Signal(16)
            with m.If(rqc):
                m.d.comb += rq.o.ready.eq(1)
                with m.If(rq.o.valid):
                    m.d.comb += [wr.addr.eq(ins.c + el), wr.en.eq(1),
                                 wr.data.eq(saturate_to_width(rq.o.payload[0], width, accw))]
                    m.d.sync += el.eq(el + 1)
        out_valid = Signal()
        out_data = Signal(signed(ww))
        act_b = b_word[:act].as_signed()    # b as an activation; MUL's factor: signed mul_factor_width bits
        if cfg.layer_ops:                   # CONV's kernel taps: signed in_width bits
            act_b = Mux(vec_op == VecOp.MUL, b_word[:cfg.mul_factor_width].as_signed(),
                        Mux(is_conv, b_word[:cfg.in_width].as_signed(), act_b))
        m.d.comb += [
            sig.i.payload[0].eq(a_word[:cfg.router_logit_width].as_signed()),   # the logit format
            *(t.i.payload[0].eq(a_word[:act].as_signed()) for op, t in tables.items() if op != Op.SIGMOID),
            situ.i.payload[0].g.eq(a_word[:act].as_signed()),
            situ.i.payload[0].u.eq(b_word[:act].as_signed()),
            vec.i.payload.a.eq(a_word[:act].as_signed()),
            vec.i.payload.b.eq(Mux((vec_op == VecOp.COMBINE) & ~is_conv, b_word[:cfg.weight_width], act_b)),
            vec.i.payload.last.eq(h_last),
            vec.n.eq(ins.n),
            *([vec.shift.eq(shift), vec.eps.eq(eps), vec.l2.eq(l2), vec.dot.eq(is_conv)] if cfg.layer_ops else []),
            vec.op.eq(vec_op),
            situ.o.ready.eq(1), vec.o.ready.eq(1), *(t.o.ready.eq(1) for t in tables.values()),
        ]
        with m.If(run):
            with m.If(is_rq):
                # reads of B values (issued a cycle ahead, held in rd0 while the word waits) fill
                # lanes q_lane .. q_lane + q_k - 1 of the word sent to the requantiser when full
                send = wvalid & rq.i.ready
                take = q_pend & (~wvalid | send)
                rq_issue = (q_read < ln) & ~blocked & (~q_pend | take)
                m.d.comb += [rd0.addr.eq(pa), rd0.en.eq(rq_issue), rq.i.valid.eq(wvalid)]
                with m.If(rq_issue):
                    r_next = r_lane + r_k
                    m.d.sync += [pa.eq(pa + r_k), q_read.eq(q_read + r_k), q_pend.eq(1), q_lane.eq(r_lane),
                                 q_k.eq(r_k), r_lane.eq(Mux(r_next == R, 0, r_next))]
                with m.Elif(take):
                    m.d.sync += q_pend.eq(0)
                with m.If(send):
                    m.d.sync += wvalid.eq(0)
                with m.If(take):
                    lanes = Array(rd0.lanes[i][:accw].as_signed() for i in range(B))
                    for j in range(R):
                        src = (j - q_lane).as_unsigned()
                        with m.If((j >= q_lane) & (src < q_k)):
                            m.d.sync += pack[j].eq(lanes[src])
                    m.d.sync += wvalid.eq((q_lane + q_k == R) | (q_read >= ln))
                # a result word is taken into `hold` as its last lanes are written (or `hold` is
                # empty), so the requantiser runs on while they are
                w_k, w_word_end = Signal(range(B + 1)), Signal()
                k_lane, k_left = R - w_lane, ln - el
                m.d.comb += [w_k.eq(lanes_now(k_lane, k_left, B)),
                             w_word_end.eq((k_lane <= B) | (k_left <= B))]
                held = Array(saturate_to_width(hold[i], width, accw) for i in range(R))
                m.d.comb += rq.o.ready.eq(~hold_valid | w_word_end)
                with m.If(hold_valid):
                    m.d.comb += [wr.addr.eq(ins.c + el), wr.data.eq(held[w_lane]), wr.en.eq(1)]
                    m.d.comb += [wr.upper[j - 1].eq(held[w_lane + j]) for j in range(1, B)]
                    m.d.comb += [wr.upper_en[j - 1].eq(w_k > j) for j in range(1, B)]
                    m.d.sync += [el.eq(el + w_k), w_lane.eq(Mux(w_word_end, 0, w_lane + B))]
                    with m.If(w_word_end):
                        m.d.sync += hold_valid.eq(0)
                with m.If(rq.o.valid & rq.o.ready):
                    m.d.sync += [hold.eq(rq.o.payload), hold_valid.eq(1)]
            for op, t in tables.items():
                with m.Elif(is_table[op]):
                    m.d.comb += [t.i.valid.eq(h_valid), unit_ready.eq(t.i.ready),
                                 out_valid.eq(t.o.valid), out_data.eq(t.o.payload[0])]
            if cfg.layer_ops:
                with m.Elif(is_softmax):
                    m.d.comb += [smx.i.valid.eq(h_valid), smx.i.payload.logit.eq(a_word[:act].as_signed()),
                                 smx.i.payload.last.eq(h_last), unit_ready.eq(smx.i.ready), smx.o.ready.eq(1),
                                 out_valid.eq(smx.o.valid), out_data.eq(smx.o.payload.weight)]
            with m.Elif(is_situ):
                m.d.comb += [situ.i.valid.eq(h_valid), unit_ready.eq(situ.i.ready),
                             out_valid.eq(situ.o.valid), out_data.eq(situ.o.payload[0])]
            if cfg.layer_ops:
                with m.Elif(is_acc):
                    m.d.comb += [unit_ready.eq(1), out_valid.eq(h_valid),
                                 out_data.eq(saturate(a_word[:accw].as_signed() + b_word[:accw].as_signed(), accw))]
            with m.Elif(is_split):  # golden.intops.split_digits of the low 2*D bits, a beat a cycle
                if built_wide:
                    two = a_word[:2 * D]
                    m.d.comb += [unit_ready.eq(1), out_valid.eq(h_valid),
                                 out_data.eq(Mux(low, two[:D].as_signed(), two[D:].as_signed() + two[D - 1]))]
                    with m.If(h_valid & h_last):
                        m.d.sync += low.eq(1)
            with m.Else():
                m.d.comb += [vec.i.valid.eq(h_valid), unit_ready.eq(vec.i.ready),
                             out_valid.eq(vec.o.valid), out_data.eq(vec.o.payload)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    op = ins.op
                    is_conv_now = cfg.layer_ops & (op == Op.CONV)
                    m.d.sync += [is_rq.eq(op == Op.REQUANT), *(f.eq(op == o) for o, f in is_table.items()),
                                 is_situ.eq(op == Op.SITU), is_softmax.eq(cfg.layer_ops & (op == Op.SOFTMAX)),
                                 is_conv.eq(is_conv_now),
                                 is_acc.eq(cfg.layer_ops & (op == Op.ADD) & ((ins.flags & F_ACC) != 0)),
                                 is_split.eq(built_wide & (op == Op.SPLIT)), low.eq(0),
                                 results.eq(Mux(built_wide & (op == Op.SPLIT), ln << 1,
                                                Mux(is_conv_now, ln - ins.p2 + ins.n, ln))),
                                 vec_op.eq(Mux(op == Op.NORM, VecOp.NORM,
                                               Mux((op == Op.COMBINE) | is_conv_now, VecOp.COMBINE,
                                                   Mux(op == Op.MUL, VecOp.MUL, VecOp.ADD) if cfg.layer_ops
                                                   else VecOp.ADD))),
                                 width.eq(ins.width), mult.eq(ins.mult), shift.eq(ins.shift),
                                 wvalid.eq(0), r_lane.eq(0), q_pend.eq(0), q_read.eq(0), w_lane.eq(0),
                                 hold_valid.eq(0)]
                    if cfg.layer_ops:
                        l2_now = (ins.flags & F_L2) != 0
                        m.d.sync += [l2.eq(l2_now), eps.eq(Mux(l2_now, vec.l2_eps_q, vec.eps_q))]
                    with m.Switch(op):
                        with m.Case(Op.REQUANT):     # pa only: its own wide reads
                            m.d.sync += walk(ln, 1, 1, 1, 0, 0, 0, 0, 0) + [issuing.eq(0)]
                        with m.Case(Op.SITU, Op.ADD, *tables):
                            m.d.sync += walk(ln, 1, 1, 1, 0, 0, 1, 0, 0)
                        with m.Case(Op.COMBINE):
                            m.d.sync += walk(ins.k, ins.n, ins.m, ins.n, 1, ins.p2, 1, 0, ins.k)
                        with m.Case(Op.NORM):
                            m.d.sync += walk(ins.n, 2, ins.m, 1, 0, ins.n, 0, 0, 0)
                        with m.Case(Op.SOFTMAX):
                            m.d.sync += walk(ins.n, 1, ins.m, 1, 0, ins.n, 0, 0, 0)
                        if cfg.layer_ops:
                            with m.Case(Op.MUL):     # b: the same row of n for each of m rows
                                m.d.sync += walk(ins.n, 1, ins.m, 1, 0, ins.n, 1, 0, 0)
                            with m.Case(Op.CONV):    # tap j of channel ch of row t: a[(t+j)*n + ch], b[ch*k + j]
                                m.d.sync += walk(ins.k, ins.n, ins.m - ins.k + 1, ins.n, 1, ins.n, 1, ins.k, 0)
                        with m.Case(Op.SPLIT):
                            m.d.sync += walk(ln, 2, 1, 1, 0, 0, 0, 0, 0)
                    with m.If(built_wide & (op == Op.REQUANT_WIDE)):
                        if built_wide:
                            m.d.comb += wide.start.eq(1)
                            m.next = "WIDE"
                    with m.Elif(cfg.layer_ops & (op == Op.KDA_STEP)):
                        if cfg.layer_ops:
                            m.d.comb += kda.start.eq(1)
                            m.next = "KDA"
                    with m.Elif(cfg.layer_ops & (op == Op.ATTEND)):
                        if cfg.layer_ops:
                            m.d.comb += attend.start.eq(1)
                            m.next = "ATTEND"
                    if cfg.layer_ops:   # F_RQ_CHANNEL: a value at a time, with its column's entry
                        per_expert = (ins.flags & F_RQ_EXPERT) != 0
                        with m.Elif((op == Op.REQUANT) & ((ins.flags & F_RQ_CHANNEL) != 0)):
                            t0 = ins.b + Mux(per_expert, ins.expert << 1, 0)
                            m.d.sync += [t_base.eq(t0), t_addr.eq(t0), t_step.eq(Mux(per_expert, 2 * E, 2)),
                                         t_col.eq(0), q_read.eq(0), pa.eq(ins.a), rqc.eq(1)]
                            m.next = "RQC"
                    with m.Elif((op == Op.REQUANT) & ((ins.flags & F_RQ_EXPERT) != 0)):
                        m.next = "RQ_TABLE"
                    if cfg.layer_ops:
                        with m.Elif((op == Op.NORM) & ((ins.flags & F_EPS) != 0)):
                            m.next = "EPS"
                    with m.Else():
                        m.next = "RUN"
            with m.State("RQ_TABLE"):     # F_RQ_EXPERT: the entry at b + 2*expert, once the reads are served
                m.d.comb += [rd0.addr.eq(ins.b + (ins.expert << 1)), rd1.addr.eq(ins.b + (ins.expert << 1) + 1),
                             rd0.en.eq(~blocked), rd1.en.eq(~blocked)]
                with m.If(~blocked):
                    m.next = "RQ_TABLE2"
            with m.State("RQ_TABLE2"):
                m.d.sync += [mult.eq(rd0.data[:cfg.mult_width]), shift.eq(rd1.data[:6])]
                m.next = "RUN"
            if cfg.layer_ops:
                with m.State("EPS"):     # F_EPS: NORM's epsilon from b[0], once the read is served
                    m.d.comb += [rd0.addr.eq(ins.b), rd0.en.eq(~blocked)]
                    with m.If(~blocked):
                        m.next = "EPS2"
                with m.State("EPS2"):
                    m.d.sync += eps.eq(rd0.data[:2 * act])
                    m.next = "RUN"
            if cfg.layer_ops:
                # REQUANT with F_RQ_CHANNEL: value i (column t_col) and its column's mult read once
                # the reads are served, captured, the shift read, captured, the value sent alone
                # (lane 0) with them; the results written as they come (el), in every RQC state
                with m.State("RQC"):
                    m.d.comb += [rd0.addr.eq(pa), rd1.addr.eq(t_addr), rd0.en.eq(~blocked), rd1.en.eq(~blocked)]
                    with m.If(~blocked):
                        m.next = "RQC_CAP"
                with m.State("RQC_CAP"):
                    m.d.sync += [pack[0].eq(rd0.data[:accw].as_signed()), mult.eq(rd1.data[:cfg.mult_width])]
                    m.next = "RQC_SHIFT"
                with m.State("RQC_SHIFT"):
                    m.d.comb += [rd1.addr.eq(t_addr + 1), rd1.en.eq(~blocked)]
                    with m.If(~blocked):
                        m.next = "RQC_SHIFT2"
                with m.State("RQC_SHIFT2"):
                    m.d.sync += shift.eq(rd1.data[:6])
                    m.next = "RQC_SEND"
                with m.State("RQC_SEND"):
                    m.d.comb += rq.i.valid.eq(1)
                    with m.If(rq.i.ready):
                        last_col = t_col + 1 == ins.n
                        m.d.sync += [pa.eq(pa + 1), q_read.eq(q_read + 1), t_col.eq(Mux(last_col, 0, t_col + 1)),
                                     t_addr.eq(Mux(last_col, t_base, t_addr + t_step))]
                        m.next = "RQC"
                        with m.If(q_read + 1 == ln):
                            m.next = "RQC_DRAIN"
                with m.State("RQC_DRAIN"):
                    with m.If(el >= ln):
                        m.d.comb += [self.done.eq(1), self.error.eq(Err.NONE)]
                        m.d.sync += rqc.eq(0)
                        m.next = "IDLE"
            with m.State("RUN"):
                m.d.comb += run.eq(1)
                with m.If(out_valid):
                    m.d.comb += [wr.addr.eq(ins.c + el), wr.data.eq(out_data), wr.en.eq(1)]
                    m.d.sync += el.eq(el + 1)
                with m.If(el >= results):
                    m.d.comb += [self.done.eq(1), self.error.eq(Err.NONE)]
                    m.next = "IDLE"
            for state, sub in delegates.items():
                with m.State(state):    # the scratchpad port is the sub-executor's until it is done
                    m.d.comb += [self.done.eq(sub.done), self.error.eq(sub.error)]
                    for port in ("rd0", "rd1"):
                        ours, its = getattr(spad, port), getattr(sub.spad, port)
                        m.d.comb += [ours.en.eq(its.en), ours.addr.eq(its.addr)]
                    m.d.comb += [wr.en.eq(sub.spad.wr.en), wr.addr.eq(sub.spad.wr.addr), wr.data.eq(sub.spad.wr.data)]
                    with m.If(sub.done):
                        m.next = "IDLE"
                m.d.comb += [sub.ins.eq(ins), sub.spad.rd0.data.eq(rd0.data), sub.spad.rd1.data.eq(rd1.data),
                             sub.spad.blocked.eq(blocked)]
        return m
