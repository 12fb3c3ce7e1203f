"""The ``ATTEND`` executor: one head of MLA's gated causal read-out (:func:`golden.mla.attend_int`),
the online softmax (:func:`golden.mla.online_softmax_int`) a key at a time, one reciprocal per
query, the output gate on the way out."""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory

from golden.intops import exp_table
from golden.mla import RECIP_BITS
from nanokpu.config import ONLINE_WIDTH, KpuConfig
from nanokpu.isa import Err
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.executors import executor_signature
from nanokpu.units.divider import SeqDivider
from nanokpu.units.pwl import PwlEvaluator, round_shift, round_shift_by, saturate

__all__ = ["Attend", "cycles"]

#: Cycles of a key besides its ``n`` value reads: the score read, its capture (``m'`` and the two
#: exponent arguments registered), the exp evaluator's latency and the cycle that takes ``alpha``
#: and ``p``, the cycle after the last value's read.
KEY_CYCLES = 2 + PwlEvaluator.latency + 1 + 1

#: Cycles of a query besides its keys and its ``n`` outputs: the row's start, the divider's
#: start and its ``RECIP_BITS + 1`` quotient bits, the cycle that takes the reciprocal, and the
#: three-stage output pipeline's drain.
ROW_CYCLES = 1 + 1 + (RECIP_BITS + 1) + 1 + 3


def cycles(m: int, k: int, n: int) -> int:
    """Cycles from ``start`` to ``done`` of ``ATTEND`` (``m`` queries of ``k`` positions, ``n``
    values each) when the scratchpad serves every read: query ``t`` reads its ``k - m + t + 1``
    keys (:data:`KEY_CYCLES` + ``n`` each), then writes its ``n`` outputs (:data:`ROW_CYCLES` +
    ``n``), and ``done`` in the cycle after the last write."""
    keys = sum(k - m + t + 1 for t in range(m))
    return keys * (KEY_CYCLES + n) + m * (ROW_CYCLES + n) + 1


class Attend(wiring.Component):
    """``ATTEND`` (:mod:`nanokpu.isa`): for each query ``t < m``, the keys ``j = 0 .. k - m + t``::

        s      = a[t*k + j]                                  act format
        m'     = max(m, s);  alpha = exp_q(saturate(m - m'));  p = exp_q(saturate(s - m'))
        l      = round_shift(l * alpha, score_frac) + p
        acc[i] = round_shift(acc[i] * alpha, score_frac) + p * V[j, i],   i < n

    then ``recip = floor(2**(e + RECIP_BITS) / l)`` (``e = bit_length(l) - 1``, a
    :class:`~nanokpu.units.divider.SeqDivider` of ``RECIP_BITS + 1`` quotient bits) and for each
    ``i < n``: ``o = round_shift(acc[i] * recip, e + RECIP_BITS - score_frac)``, ``c[t*n + i] =
    saturate(round_shift(o * g, 2 score_frac), in_width)``, ``g = b[t*n + i]`` (unsigned
    ``score_width`` bits; the values at ``b + m*n``, ``V[j, i] = b[m*n + j*n + i]``).

    Members: :func:`~nanokpu.kpu.executors.executor_signature`.

    Sequential and simple, bit-exact first: a key's score read on ``rd0``, its two exponentials on
    a two-lane :class:`~nanokpu.units.pwl.PwlEvaluator` (:func:`~golden.intops.exp_table`), then its
    ``n`` values a word a cycle on ``rd1``, each accumulator (``ONLINE_WIDTH`` bits, a memory of
    ``v_head_dim`` words) read, its two products registered, the sum written back the cycle after;
    each output in three stages (the reciprocal's product registered, then its shift, then the
    gate). Every read waits for
    the scratchpad to serve it (``blocked``). Without blocking a run takes :func:`cycles`. ``done``
    in the cycle after the last output is written; no error (the decode checked the shape).
    """

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        super().__init__(executor_signature(cfg))

    def elaborate(self, platform):  # noqa: C901 - one sequencer
        m = Module()
        cfg, ins, spad = self.cfg, self.ins, self.spad
        w = widths(cfg)
        AW, act, sf, OW = w.aw, cfg.act_width, cfg.score_frac, ONLINE_WIDTH
        rd0, rd1, wr, blocked = spad.rd0, spad.rd1, spad.wr, spad.blocked
        low = -(1 << (act - 1))

        m.submodules.exp = exp = PwlEvaluator(exp_table(cfg), 2, dsp=cfg.dsp)
        m.submodules.div = div = SeqDivider(RECIP_BITS + 1, OW)
        acc_mem = Memory(shape=signed(OW), depth=cfg.v_head_dim, init=[])
        m.submodules.acc = acc_mem
        acc_wr = acc_mem.write_port()
        acc_rd = acc_mem.read_port(domain="sync")

        t = Signal(16)                  # the query
        j = Signal(16)                  # the key
        keys = Signal(16)               # the query's last key, k - m + t
        s_ptr = Signal(AW)              # a + t*k + j: the score
        v_ptr = Signal(AW)              # b + m*n + j*n + i: the value
        g_ptr = Signal(AW)              # b + t*n + i: the gate
        o_ptr = Signal(AW)              # c + t*n + i: the output
        i = Signal(16)                  # the column read next
        peak = Signal(signed(act))      # m, the running max
        total = Signal(unsigned(OW))    # l
        alpha = Signal(unsigned(cfg.score_width))
        p = Signal(unsigned(cfg.score_width))
        d_alpha = Signal(signed(act))
        d_p = Signal(signed(act))
        wait = Signal(range(PwlEvaluator.latency + 1))
        recip = Signal(RECIP_BITS + 1)
        e = Signal(range(OW))           # bit_length(l) - 1
        first = Signal()                # the key is the query's first: its accumulators start at 0

        m.d.comb += [exp.en.eq(1), exp.x[0].eq(d_alpha), exp.x[1].eq(d_p)]
        for b in range(OW):             # the leading one of l (l >= 2**score_frac once a key is in)
            with m.If(total[b]):
                m.d.comb += e.eq(b)

        # -- the value pipeline: a value and its accumulator read; the two products registered; the
        # new accumulator written (two cycles after the read: the next read is another column's)
        v_valid, s_valid = Signal(), Signal()
        v_col, s_col = Signal(range(cfg.v_head_dim)), Signal(range(cfg.v_head_dim))
        old = Mux(first, 0, acc_rd.data)
        scaled = Signal(signed(OW + cfg.score_width + 1))
        added = Signal(signed(cfg.score_width + cfg.in_width + 1))
        m.d.sync += [s_valid.eq(v_valid), s_col.eq(v_col)]
        with m.If(v_valid):
            m.d.sync += [scaled.eq(old * alpha), added.eq(p * rd1.data[:cfg.in_width].as_signed())]
        new = round_shift(scaled, sf, cfg.rounding) + added
        m.d.comb += [acc_wr.addr.eq(s_col), acc_wr.data.eq(new[:OW]), acc_wr.en.eq(s_valid)]

        # -- the output pipeline: accumulator and gate read, acc * recip registered, o registered,
        # the gated output written
        o_valid, q_valid, w_valid = Signal(), Signal(), Signal()
        prod = Signal(signed(OW + RECIP_BITS + 2))
        o_reg = Signal(signed(cfg.in_width + sf + 2))   # |o| <= 2**(in_width - 1 + score_frac) + 1
        g_in, g_reg = Signal(unsigned(cfg.score_width)), Signal(unsigned(cfg.score_width))
        shift = Signal(range(OW + RECIP_BITS))
        m.d.sync += [q_valid.eq(o_valid), w_valid.eq(q_valid)]
        with m.If(o_valid):
            m.d.sync += [prod.eq(acc_rd.data * recip), g_in.eq(rd0.data[:cfg.score_width])]
        with m.If(q_valid):
            m.d.sync += [o_reg.eq(round_shift_by(prod, shift, cfg.rounding)), g_reg.eq(g_in)]
        gated = saturate(round_shift(o_reg * g_reg, 2 * sf, cfg.rounding), cfg.in_width)
        with m.If(w_valid):
            m.d.comb += [wr.addr.eq(o_ptr), wr.data.eq(gated), wr.en.eq(1)]
            m.d.sync += o_ptr.eq(o_ptr + 1)

        m.d.sync += [v_valid.eq(0), o_valid.eq(0)]
        last_col = i + 1 == ins.n
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [t.eq(0), keys.eq(ins.k - ins.m), s_ptr.eq(ins.a), o_ptr.eq(ins.c), g_ptr.eq(ins.b)]
                    m.next = "ROW"
            with m.State("ROW"):        # a query's start: no key yet
                m.d.sync += [j.eq(0), v_ptr.eq(ins.b + ins.len), peak.eq(low), total.eq(0), first.eq(1)]
                m.next = "SCORE"
            with m.State("SCORE"):      # s = a[t*k + j], once the read is served
                m.d.comb += [rd0.addr.eq(s_ptr), rd0.en.eq(~blocked)]
                with m.If(~blocked):
                    m.d.sync += s_ptr.eq(s_ptr + 1)
                    m.next = "MAX"
            with m.State("MAX"):        # m' and the exponents' arguments (s - m' and m - m' are <= 0)
                s = rd0.data[:act].as_signed()
                top = Mux(s > peak, s, peak)
                m.d.sync += [peak.eq(top), d_alpha.eq(saturate(peak - top, act)), d_p.eq(saturate(s - top, act)),
                             wait.eq(0)]
                m.next = "EXP"
            with m.State("EXP"):        # alpha, p after the evaluator's latency; l rescaled and p added
                m.d.sync += wait.eq(wait + 1)
                with m.If(wait == PwlEvaluator.latency):
                    a_now, p_now = exp.y[0], exp.y[1]
                    m.d.sync += [alpha.eq(a_now), p.eq(p_now), i.eq(0),
                                 total.eq(round_shift(total * a_now, sf, cfg.rounding) + p_now)]
                    m.next = "VALUES"
            with m.State("VALUES"):     # V[j, i] and acc[i] read, the new acc[i] written next cycle
                m.d.comb += [rd1.addr.eq(v_ptr), rd1.en.eq(~blocked), acc_rd.addr.eq(i)]
                with m.If(~blocked):
                    m.d.sync += [v_valid.eq(1), v_col.eq(i), v_ptr.eq(v_ptr + 1), i.eq(i + 1)]
                    with m.If(last_col):
                        m.d.sync += j.eq(j + 1)
                        m.next = "NEXT"
            with m.State("NEXT"):       # the last value's accumulator is written in this cycle
                m.d.sync += first.eq(0)
                with m.If(j > keys):
                    m.d.sync += s_ptr.eq(s_ptr + ins.k - j)    # the next query's row of scores
                    m.next = "RECIP"
                with m.Else():
                    m.next = "SCORE"
            with m.State("RECIP"):      # recip = floor(2**(e + RECIP_BITS) / l): rem_in = 2**(e - 1), num = 0
                m.d.comb += [div.start.eq(1), div.den.eq(total), div.num.eq(0),
                             div.rem_in.eq(Const(1, OW) << (e - 1)[:len(e)])]
                m.d.sync += shift.eq(e + RECIP_BITS - sf)
                m.next = "DIVIDE"
            with m.State("DIVIDE"):
                with m.If(~div.busy):
                    m.d.sync += [recip.eq(div.quot), i.eq(0)]
                    m.next = "OUT"
            with m.State("OUT"):        # acc[i] and g read, their product, o and the write in the next three
                m.d.comb += [rd0.addr.eq(g_ptr), rd0.en.eq(~blocked), acc_rd.addr.eq(i)]
                with m.If(~blocked):
                    m.d.sync += [o_valid.eq(1), g_ptr.eq(g_ptr + 1), i.eq(i + 1)]
                    with m.If(last_col):
                        m.next = "DRAIN"
            with m.State("DRAIN"):      # the row's last output written in this cycle
                with m.If(~o_valid & ~q_valid & w_valid):
                    m.d.sync += [t.eq(t + 1), keys.eq(keys + 1)]
                    m.next = "ROW"
                    with m.If(t + 1 == ins.m):
                        m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += [self.done.eq(1), self.error.eq(Err.NONE)]
                m.next = "IDLE"
        return m
