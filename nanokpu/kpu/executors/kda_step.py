"""The ``KDA_STEP`` executor: KDA's recurrent state update (:func:`golden.kda.kda_head_step_int`) for
``m`` tokens and ``n`` heads on a :class:`~nanokpu.units.kda_state.KdaStateUpdate`, the state ``S``
streamed from the scratchpad and back, the read-out requantised into ``o``."""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal
from amaranth.lib import wiring

from nanokpu.config import KpuConfig
from nanokpu.isa import Err
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.executors import executor_signature, saturate_to_width
from nanokpu.units.kda_state import KdaStateUpdate
from nanokpu.units.requant import Requantiser
from nanokpu.units.shift_add import times_const

__all__ = ["KdaStep"]


class KdaStep(wiring.Component):
    """``KDA_STEP`` (:mod:`nanokpu.isa`): for each token ``t < m`` and head ``h < n`` (``k = K =
    kda_head_dim``), one step of :class:`~nanokpu.units.kda_state.KdaStateUpdate` on the head's state
    ``S[h]`` (``K x K`` words at ``a + h*K*K``, row-major, ``2*act_width`` bits, written back in
    place) and the vector planes at ``b``: ``q``, ``k``, ``v``, ``decay`` ``[m, n, K]`` at ``b + {0, 1,
    2, 3}*P``, ``P = m*n*K`` (head ``h`` of token ``t`` at row ``t*n + h``) and ``beta [m, n]`` at
    ``b + 4*P``, as the ops before it write them over all tokens at once; the
    read-out ``r`` requantised (``mult``, ``shift``, saturated to ``width``: golden ``rq_read``) to
    ``o[t, h]`` at ``c + (t*n + h)*K``.

    Members: :func:`~nanokpu.kpu.executors.executor_signature`.

    Sequential and simple, bit-exact first: per head, ``K`` rows each read a word a cycle on
    ``rd0`` (the row's ``K`` state words) beside its four vector words on ``rd1`` (and ``beta`` with
    row 0), then handed to the unit; the new rows written back a word a cycle as the unit emits
    them; the ``K`` read-out values requantised one at a time on a bit-serial
    :class:`~nanokpu.units.requant.Requantiser` (no DSP block) and written. Every read waits for
    the scratchpad to serve it (``blocked``). ``done`` in the cycle after the last ``o`` is written;
    no error.
    """

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        super().__init__(executor_signature(cfg))

    def elaborate(self, platform):  # noqa: C901 - one sequencer
        m = Module()
        cfg, ins, spad = self.cfg, self.ins, self.spad
        K = cfg.kda_head_dim
        w = widths(cfg)
        AW, SW = w.aw, w.sw
        accw = cfg.acc_width
        rd0, rd1, wr, blocked = spad.rd0, spad.rd1, spad.wr, spad.blocked
        m.submodules.unit = unit = KdaStateUpdate(cfg)
        r_width = len(unit.r.payload[0])
        m.submodules.rq = rq = Requantiser(cfg, 1, accw, acc_width=r_width, serial=True)

        plane = Signal(SW)              # P = m*n*K: the stride of the vector planes
        bt = Signal(AW)                 # beta of head h of token t: b + 4P + t*n + h
        s_rd = Signal(AW)               # the next state word read (a linear walk over S per token)
        s_wr = Signal(AW)               # the next state word written
        o_ptr = Signal(AW)              # the next o written
        t = Signal(16)
        h = Signal(16)
        row = Signal(range(K + 1))      # the row being gathered
        col = Signal(range(K + 1))      # reads issued for it: state word col on rd0 (vector word col on rd1)
        g_valid = Signal()              # a read issued in the last cycle: its words are on the ports now
        g_col = Signal(range(K + 1))
        beat = Signal(unit.i.payload.shape())
        beat_valid = Signal()
        hv = Signal(AW)                 # b + (t*n + h)*K: the head's row of the q plane
        vec_addr = Array([hv, hv + plane, hv + (plane << 1), hv + (plane << 1) + plane])   # q, k, v, decay
        n_vec = 5                       # rd1 reads per row: q, k, v, decay, beta (row 0 only; others re-read it)

        # -- gather row `row`: state words col = 0..K-1 on rd0, vector words on rd1 ---------------
        gathering = Signal()
        issue = gathering & ~beat_valid & ~blocked & (col < K)
        m.d.comb += [rd0.addr.eq(s_rd), rd0.en.eq(issue),
                     rd1.addr.eq(Mux(col < 4, vec_addr[col[:2]] + row, bt)),
                     rd1.en.eq(issue & (col < n_vec))]
        m.d.sync += [g_valid.eq(issue), g_col.eq(col)]
        with m.If(issue):
            m.d.sync += [s_rd.eq(s_rd + 1), col.eq(col + 1)]
        with m.If(g_valid):
            m.d.sync += beat.s[g_col].eq(rd0.data[:cfg.kda_state_width].as_signed())
            act = cfg.act_width
            with m.Switch(g_col):
                with m.Case(0):
                    m.d.sync += beat.q.eq(rd1.data[:act].as_signed())
                with m.Case(1):
                    m.d.sync += beat.k.eq(rd1.data[:act].as_signed())
                with m.Case(2):
                    m.d.sync += beat.v.eq(rd1.data[:act].as_signed())
                with m.Case(3):
                    m.d.sync += beat.decay.eq(rd1.data[:cfg.score_width])
                with m.Case(4):
                    m.d.sync += beat.beta.eq(rd1.data[:cfg.score_width])
            with m.If(g_col == K - 1):
                m.d.sync += beat_valid.eq(1)
        m.d.comb += [unit.i.valid.eq(beat_valid), unit.i.payload.eq(beat)]
        with m.If(unit.i.valid & unit.i.ready):
            m.d.sync += [beat_valid.eq(0), col.eq(0), row.eq(row + 1)]
            with m.If(row == K - 1):
                m.d.sync += gathering.eq(0)

        # -- write back: each new row a word a cycle, then the read-out requantised --------------
        o_row = Signal(unit.o.payload.shape())
        o_held = Signal()
        o_col = Signal(range(K))
        rows_out = Signal(range(K + 1))
        r_row = Signal(unit.r.payload.shape())
        r_held = Signal()
        r_sent = Signal(range(K + 1))       # read-out values sent to the requantiser
        r_done = Signal(range(K + 1))       # ... and written
        width = Signal(6)
        m.d.comb += [unit.o.ready.eq(~o_held), unit.r.ready.eq(~r_held),
                     rq.mult.eq(ins.mult), rq.shift.eq(ins.shift),
                     rq.i.valid.eq(r_held & (r_sent < K)), rq.i.payload[0].eq(r_row[r_sent[:len(o_col)]]),
                     rq.o.ready.eq(~o_held)]
        with m.If(unit.o.valid & ~o_held):
            m.d.sync += [o_row.eq(unit.o.payload), o_held.eq(1), o_col.eq(0)]
        with m.If(unit.r.valid & ~r_held):
            m.d.sync += [r_row.eq(unit.r.payload), r_held.eq(1), r_sent.eq(0)]
        with m.If(rq.i.valid & rq.i.ready):
            m.d.sync += r_sent.eq(r_sent + 1)
        with m.If(o_held):          # the state row first (the read-out comes after the last row)
            m.d.comb += [wr.addr.eq(s_wr), wr.data.eq(o_row[o_col]), wr.en.eq(1)]
            m.d.sync += [s_wr.eq(s_wr + 1), o_col.eq(o_col + 1)]
            with m.If(o_col == K - 1):
                m.d.sync += [o_held.eq(0), rows_out.eq(rows_out + 1)]
        with m.Elif(rq.o.valid):
            m.d.comb += [wr.addr.eq(o_ptr), wr.data.eq(saturate_to_width(rq.o.payload[0], width, accw)),
                         wr.en.eq(1)]
            m.d.sync += [o_ptr.eq(o_ptr + 1), r_done.eq(r_done + 1)]

        # -- the walk over tokens and heads ---------------------------------------------------
        head_done = (rows_out == K) & (r_done == K)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    p = times_const(ins.len, K)
                    m.d.sync += [plane.eq(p), hv.eq(ins.b), bt.eq(ins.b + (p << 2)), s_rd.eq(ins.a),
                                 s_wr.eq(ins.a), o_ptr.eq(ins.c), t.eq(0), h.eq(0), width.eq(ins.width)]
                    m.next = "HEAD"
            with m.State("HEAD"):
                m.d.sync += [gathering.eq(1), row.eq(0), col.eq(0), rows_out.eq(0), r_done.eq(0),
                             r_held.eq(0)]
                m.next = "RUN"
            with m.State("RUN"):
                with m.If(head_done):
                    last_head = h + 1 == ins.n
                    # the next head's rows of the planes (of this token or the next)
                    m.d.sync += [h.eq(Mux(last_head, 0, h + 1)), hv.eq(hv + K), bt.eq(bt + 1)]
                    with m.If(last_head):
                        # the next token: the state from its start again
                        m.d.sync += [t.eq(t + 1), s_rd.eq(ins.a), s_wr.eq(ins.a)]
                        with m.If(t + 1 == ins.m):
                            m.d.comb += [self.done.eq(1), self.error.eq(Err.NONE)]
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "HEAD"
                    with m.Else():
                        m.next = "HEAD"
        return m
