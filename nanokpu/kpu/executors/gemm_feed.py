"""The GEMM executor: ``GEMM`` on the GEMM engine (:func:`~nanokpu.units.gemm.kpu_engine`), its A
operand packed from the scratchpad, B streamed from the bus, the results unpacked back."""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.isa import F_RQ_CHANNEL, F_RQ_EXPERT, Err
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.dmem import banks
from nanokpu.kpu.executors import (
    dma_client_signature,
    executor_signature,
    requantiser_signature,
    saturate_to_width,
)
from nanokpu.units.gemm import kpu_engine

__all__ = ["GemmFeed"]

#: Words of A the feed reads ahead of the engine (see GemmFeed.elaborate)
A_WORDS = 3


class GemmFeed(wiring.Component):
    """``GEMM`` (:mod:`nanokpu.isa`): ``c = requant(a @ W^T)`` (or raw accumulators with
    ``width = 0``), ``a`` ``[m, k]`` in the scratchpad, the weight panels from the bus.

    Members: :func:`~nanokpu.kpu.executors.executor_signature`, ``dma``
    (:func:`~nanokpu.kpu.executors.dma_client_signature`: the B panels as one burst read started
    with the command) and ``rq`` (:func:`~nanokpu.kpu.executors.requantiser_signature`, flipped):
    the engine's requantiser lent to the element-wise executor while no ``GEMM`` runs.

    A word of A (``rows`` lanes of row block ``mb``, column ``k``) takes a scratchpad read per
    real row, two a cycle (``rd0`` and ``rd1``), pipelined, up to :data:`A_WORDS` words ahead of
    the engine: ``M`` real rows give a word every ``ceil(M/2)`` cycles, back to back. The result
    words (``rows`` lanes: column ``j`` of a row block) are gathered ``B =``
    :func:`~nanokpu.kpu.dmem.banks` columns at a time, double-buffered (the next ``B`` fill
    while the last are written), and written one real row per cycle: a masked wide write of the
    row's ``B`` consecutive columns (those ``< n``), saturated to ``width``. ``M`` real rows and
    ``n`` columns take ``M * ceil(n/B)`` writes (the engine's store, one word a cycle, waits
    while ``M > B``); ``done`` follows the last write. With
    :data:`~nanokpu.isa.F_RQ_EXPERT` the multiplier and shift are first read from ``b +
    2*expert``. With :data:`~nanokpu.isa.F_RQ_CHANNEL` (and ``width != 0``) the ``n`` table
    entries (``b + 2*(j*E + e)``, :mod:`nanokpu.isa`) are copied into the engine's per-column
    table under the compute, one scratchpad read a cycle on ``rd1`` (2 per entry; the A feed
    reads one lane a cycle on ``rd0`` meanwhile); the engine's store waits for the copy
    (``col_hold``). The compute outlasts the copy whenever ``tile_gap >= 2*cols``
    (``ceil(n/cols)`` tiles of at least ``tile_gap`` cycles against ``2*n`` reads: every
    profile); the hold is the interlock otherwise. A bus error ends the instruction at once
    with :attr:`~nanokpu.isa.Err.BUS_ERROR`, an engine error with
    :attr:`~nanokpu.isa.Err.BAD_SHAPE`.
    """

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        super().__init__(dict(executor_signature(cfg).members) | {
            "dma": Out(dma_client_signature(cfg)), "rq": In(requantiser_signature(cfg))})

    def elaborate(self, platform):  # noqa: C901 - A packing and C unpacking side by side
        m = Module()
        cfg, ins, spad, dma = self.cfg, self.ins, self.spad, self.dma
        w = widths(cfg)
        SW, AW, R, accw = w.sw, w.aw, cfg.rows, cfg.acc_width
        rd0, wr, blocked = spad.rd0, spad.wr, spad.blocked
        m.submodules.engine = gemm = kpu_engine(cfg, column_rq=True)

        mult = Signal(32)
        shift = Signal(6)
        width = Signal(6)
        iw = cfg.in_width
        pack = Signal(data.ArrayLayout(signed(iw), R))   # the A word being filled
        busy = Signal()
        # the engine's requantiser: this instruction's, or lent out (rq) while idle
        with m.If(busy):
            m.d.comb += [gemm.rq_mult.eq(Mux(width != 0, mult, 1)), gemm.rq_shift.eq(Mux(width != 0, shift, 0))]
        with m.Else():
            m.d.comb += [gemm.rq_mult.eq(self.rq.mult), gemm.rq_shift.eq(self.rq.shift),
                         gemm.rq_in.valid.eq(self.rq.i.valid), gemm.rq_in.payload.eq(self.rq.i.payload),
                         self.rq.i.ready.eq(gemm.rq_in.ready),
                         self.rq.o.valid.eq(gemm.c_out.valid), self.rq.o.payload.eq(gemm.c_out.payload),
                         gemm.c_out.ready.eq(self.rq.o.ready)]

        # running scratchpad addresses: A word (mb, k) lane i at a + (mb*R + i)*k + k_idx; after
        # the last word of a row block the next block starts one past the last lane's address.
        # C word (mb, n) lane i at c + (mb*R + i)*n + n_idx
        KW, NW = (cfg.spad_b_depth // 2).bit_length(), cfg.spad_c_depth.bit_length()
        k_g, n_g = ins.k[:KW], ins.n[:NW]          # exact once the shape checks passed
        m_s = ins.m[:SW]
        # gm_left, gc_left: rows of A / C from the current row block on (m, m - R, ...)
        gm_left = Signal(SW)
        gm_k = Signal(KW)
        gm_lane = Signal(range(R + 1))
        gm_addr = Signal(AW)
        gm_addr1 = Signal(AW)   # gm_addr + k: the next lane's address (rd1's)
        gm_wstart = Signal(AW)
        gm_cap = Signal()
        gm_cap2 = Signal()      # rd1's lane (gm_cap_lane + 1) was read too
        gm_cap_lane = Signal(range(R))
        gm_cap_last = Signal()  # the (last) lane captured is its word's last
        gm_afeed_done = Signal()
        gm_owed = Signal(range(A_WORDS + 1))   # words begun and not yet taken by the engine
        gm_go = Signal()        # a lane of A is read unless blocked (see below)
        gm_two = Signal()       # ... and the next one on rd1 (see below)
        # C: the engine's result words gathered B columns (a group) at a time into cbuf, written
        # from wbuf (see below)
        B = banks(cfg)
        group = data.ArrayLayout(data.ArrayLayout(signed(accw), B), R)   # [row i][column j]
        gc_left = Signal(SW)
        gc_n = Signal(NW)        # the column of the next result word
        gc_col = Signal(range(B))   # ... its column in its group
        gc_block = Signal(AW)    # the address of the row block's first word (row mb*R, column 0)
        gc_gaddr = Signal(AW)    # ... of the group's (row mb*R, column n - gc_col)
        gc_full = Signal()       # cbuf holds a whole group, not yet handed to the writer
        rn = Signal(AW)          # R*n: from a row block's first word to the next's
        cbuf = Signal(group)
        g_addr = Signal(AW)      # cbuf's group: gc_gaddr, gc_left and its columns' mask
        g_left = Signal(SW)
        g_cols = Signal(B)
        wbuf = Signal(group)     # the group being written, the next row first (shifted a row per write)
        w_busy = Signal()
        w_addr = Signal(AW)
        w_left = Signal(SW)
        w_cols = Signal(B)
        w_row = Signal(range(R))
        w_last = Signal()        # registered: row w_row is the group's last
        LB = (R + 1).bit_length()

        def reached(left, lanes):
            """``lanes >= left`` for ``lanes <= R + 1``: a block of ``left`` rows ends within ``lanes``."""
            return (left[LB:] == 0) & (lanes >= left[:LB])

        # The A feed reads the lanes of word after word without waiting for the engine to take
        # them: a word begins only while fewer than A_WORDS are owed (begun, not taken), and a
        # word whose last lane is captured goes into a queue of A_WORDS words the engine takes
        # from (a read captured in the next cycle, queued in the one after: A_WORDS = 3 keeps
        # one word per cycle). Its flags as they will be after this edge (held unless assigned
        # below) make its read enable a flip-flop (gm_go) and ~blocked: on a large ECP5 the
        # scratchpad's blocks span the die, and the paths to their enables leave no time for
        # the word's bookkeeping. So is rd1's (gm_two: the lane after gm_lane is in the word, and
        # the per-column table copy does not hold rd1; a cycle late when the copy ends)
        lane_n, afeed_done_n, owed_n = Signal.like(gm_lane), Signal(), Signal.like(gm_owed)
        left_n = Signal.like(gm_left)
        m.d.comb += [lane_n.eq(gm_lane), afeed_done_n.eq(gm_afeed_done), owed_n.eq(gm_owed), left_n.eq(gm_left)]
        m.d.sync += [gm_lane.eq(lane_n), gm_afeed_done.eq(afeed_done_n), gm_owed.eq(owed_n), gm_left.eq(left_n),
                     gm_go.eq(~afeed_done_n & ((lane_n != 0) | (owed_n < A_WORDS)))]
        m.submodules.a_queue = a_queue = ResetInserter(self.start)(SyncFIFO(width=R * iw, depth=A_WORDS))

        def last_row(left, row):
            """Row ``row`` of a block with ``left`` rows left is its last: row R-1 or row M-1."""
            return (row == R - 1) | reached(left, row + 1)

        # the per-column table: entry j (mult, then shift one word on) read on rd1 at t_addr while
        # t_left columns are left (t_on), the column's address stepping by 2*E; the read captured
        # in the next cycle (t_cap): the mult registered, the entry written with the shift. The
        # read's address and enable come off flip-flops (and ~blocked), like the A feed's
        E = cfg.n_experts
        col = Signal()                   # this GEMM requantises per column (F_RQ_CHANNEL, width != 0)
        t_left = Signal(NW)
        t_on = Signal()                  # t_left != 0
        m.d.sync += gm_two.eq(~((lane_n == R - 1) | reached(left_n, lane_n + 1)) & ~t_on)
        t_addr = Signal(AW)              # the next read's address
        t_step = Signal(range(2 * E))    # from a shift to the next column's mult: 2*E - 1 (per expert) or 1
        t_half = Signal()                # the next read is the shift's
        t_cap = Signal()
        t_cap_half = Signal()
        t_col = Signal(NW)               # the column of the entry read
        t_mult = Signal(cfg.mult_width)
        m.d.comb += [gemm.col_en.eq(col), gemm.col_hold.eq(t_on | t_cap),
                     gemm.col_wr.addr.eq(t_col), gemm.col_wr.data.mult.eq(t_mult),
                     gemm.col_wr.data.shift.eq(spad.rd1.data[:6])]
        m.d.sync += t_cap.eq(0)
        with m.If(t_on & ~blocked):
            m.d.comb += [spad.rd1.addr.eq(t_addr), spad.rd1.en.eq(1)]
            m.d.sync += [t_cap.eq(1), t_cap_half.eq(t_half), t_half.eq(~t_half)]
            with m.If(t_half):
                m.d.sync += [t_addr.eq(t_addr + t_step), t_left.eq(t_left - 1), t_on.eq(t_left != 1)]
            with m.Else():
                m.d.sync += t_addr.eq(t_addr + 1)
        with m.If(t_cap & ~t_cap_half):
            m.d.sync += t_mult.eq(spad.rd1.data[:cfg.mult_width])
        with m.If(t_cap & t_cap_half):
            m.d.comb += gemm.col_wr.en.eq(1)
            m.d.sync += t_col.eq(t_col + 1)
        with m.If(self.done):   # (an instruction ended by an error: the copy stops)
            m.d.sync += [t_left.eq(0), t_on.eq(0), t_cap.eq(0)]

        # the writer: row i of wbuf's group (mb, columns n0 .. n0 + B - 1), at address
        # c + (mb*R + i)*n + n0, one masked wide write a cycle (its columns < n), saturated to width
        handoff = gc_full & (~w_busy | w_last)     # cbuf to wbuf: the writer is free, or will be
        with m.If(w_busy):
            lanes = [Mux(width != 0, saturate_to_width(v, width, accw), v) for v in (wbuf[0][j] for j in range(B))]
            m.d.comb += [wr.en.eq(1), wr.addr.eq(w_addr), wr.data.eq(lanes[0]), wr.upper_en.eq(w_cols[1:])]
            m.d.comb += [wr.upper[j - 1].eq(lanes[j]) for j in range(1, B)]
            m.d.sync += [wbuf[i].eq(wbuf[i + 1]) for i in range(R - 1)]
            m.d.sync += [w_row.eq(w_row + 1), w_addr.eq(w_addr + n_g), w_last.eq(last_row(w_left, w_row + 1)),
                         w_busy.eq(~w_last)]
        with m.If(handoff):
            m.d.sync += [wbuf.eq(cbuf), w_busy.eq(1), w_row.eq(0), w_addr.eq(g_addr), w_left.eq(g_left),
                         w_cols.eq(g_cols), w_last.eq(last_row(g_left, 0)), gc_full.eq(0)]
        running = Signal()
        m.d.comb += [
            gemm.cmd.payload.m.eq(ins.m), gemm.cmd.payload.k.eq(ins.k), gemm.cmd.payload.n.eq(ins.n),
            gemm.cmd.payload.a_addr.eq(0), gemm.cmd.payload.c_addr.eq(0),
            gemm.cmd.payload.mult.eq(Mux(width != 0, mult, 1)),
            gemm.cmd.payload.shift.eq(Mux(width != 0, shift, 0)),
            gemm.cmd.payload.load_a.eq(1), gemm.cmd.payload.compute.eq(1),
            gemm.cmd.payload.store.eq(1), gemm.cmd.payload.accumulate.eq(0),
            gemm.a_in.payload.eq(a_queue.r_data), gemm.a_in.valid.eq(a_queue.r_rdy),
            a_queue.r_en.eq(gemm.a_in.ready),
            gemm.b_in.payload.eq(dma.rd_data.payload),
        ]
        with m.If(running):
            m.d.comb += [gemm.b_in.valid.eq(dma.rd_data.valid), dma.rd_data.ready.eq(gemm.b_in.ready)]
            # A: word (mb, k), lane i = A[mb*R + i, k]; one scratchpad read per lane, pipelined
            # (lanes of rows >= M are not read: the word was cleared, they stay 0)
            begins = gm_go & ~blocked & (gm_lane == 0)
            taken = gemm.a_in.valid & gemm.a_in.ready
            m.d.comb += owed_n.eq(gm_owed + begins - taken)
            m.d.sync += gm_cap.eq(0)
            with m.If(gm_go & ~blocked):
                last0 = (gm_lane == R - 1) | reached(gm_left, gm_lane + 1)
                two = gm_two        # rd1 reads the next lane too
                last = last0 | ((gm_lane + 1 == R - 1) | reached(gm_left, gm_lane + 2))
                step = Mux(two, k_g << 1, k_g)[:AW]
                m.d.comb += [rd0.addr.eq(gm_addr), rd0.en.eq(1), lane_n.eq(gm_lane + 1 + two)]
                with m.If(two):
                    m.d.comb += [spad.rd1.addr.eq(gm_addr1), spad.rd1.en.eq(1)]
                m.d.sync += [gm_cap.eq(1), gm_cap2.eq(two), gm_cap_lane.eq(gm_lane),
                             gm_cap_last.eq(Mux(two, last, last0)),
                             gm_addr.eq(gm_addr + step), gm_addr1.eq(gm_addr1 + step)]
                with m.If(Mux(two, last, last0)):    # the next word: column k + 1, or the next row block
                    m.d.comb += lane_n.eq(0)
                    with m.If(gm_k + 1 < k_g):
                        m.d.sync += [gm_k.eq(gm_k + 1), gm_wstart.eq(gm_wstart + 1), gm_addr.eq(gm_wstart + 1),
                                     gm_addr1.eq(gm_wstart + 1 + k_g)]
                    with m.Else():
                        nxt = Mux(two, gm_addr1, gm_addr) + 1     # one past the word's last lane
                        m.d.comb += left_n.eq(gm_left - R)
                        m.d.sync += [gm_k.eq(0), gm_wstart.eq(nxt),
                                     gm_addr.eq(nxt), gm_addr1.eq(nxt + k_g)]
                        with m.If(reached(gm_left, R)):
                            m.d.comb += afeed_done_n.eq(1)
            with m.If(gm_cap):
                hit0 = [gm_cap_lane == i for i in range(R)]
                hit1 = [gm_cap2 & (gm_cap_lane + 1 == i) for i in range(R)]
                lanes = [Mux(hit0[i], rd0.data, Mux(hit1[i], spad.rd1.data, pack[i]))[:iw] for i in range(R)]
                m.d.sync += [pack[i].eq(lanes[i]) for i in range(R)]
                with m.If(gm_cap_last):
                    m.d.comb += [a_queue.w_data.eq(Cat(lanes)), a_queue.w_en.eq(1)]
                    m.d.sync += pack.eq(0)
            # C: word (mb, n) -> column gc_col of cbuf; a group ends with its B-th column or the
            # row block's last (column n - 1), and waits in cbuf for the writer
            take = ~gc_full | handoff
            m.d.comb += gemm.c_out.ready.eq(take)
            with m.If(gemm.c_out.valid & take):
                for j in range(B):
                    with m.If(gc_col == j):
                        m.d.sync += [cbuf[i][j].eq(gemm.c_out.payload[i]) for i in range(R)]
                m.d.sync += [gc_n.eq(gc_n + 1), gc_col.eq(gc_col + 1)]
                block_ends = gc_n + 1 == n_g
                with m.If((gc_col == B - 1) | block_ends):
                    m.d.sync += [gc_full.eq(1), gc_col.eq(0), g_addr.eq(gc_gaddr), g_left.eq(gc_left),
                                 g_cols.eq(Cat(Const(1, 1), *(gc_col >= j for j in range(1, B)))),
                                 gc_gaddr.eq(gc_gaddr + B)]
                    with m.If(block_ends):
                        m.d.sync += [gc_n.eq(0), gc_left.eq(gc_left - R), gc_block.eq(gc_block + rn),
                                     gc_gaddr.eq(gc_block + rn)]

        with m.If(self.done):   # (an instruction ended by an error: the writes stop)
            m.d.sync += [w_busy.eq(0), gc_full.eq(0)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.comb += [lane_n.eq(0), afeed_done_n.eq(0), owed_n.eq(0), left_n.eq(m_s)]
                    m.d.sync += [busy.eq(1), width.eq(ins.width), mult.eq(ins.mult), shift.eq(ins.shift),
                                 gm_k.eq(0), pack.eq(0), gm_addr.eq(ins.a), gm_wstart.eq(ins.a),
                                 gm_addr1.eq(ins.a + k_g),
                                 gc_left.eq(m_s), gc_n.eq(0), gc_col.eq(0), gc_full.eq(0), w_busy.eq(0),
                                 gc_block.eq(ins.c), gc_gaddr.eq(ins.c),
                                 rn.eq(sum(n_g << b for b in range(R.bit_length()) if R >> b & 1))]
                    per_expert = (ins.flags & F_RQ_EXPERT) != 0
                    per_column = ((ins.flags & F_RQ_CHANNEL) != 0) & (ins.width != 0)
                    m.d.sync += [col.eq(per_column), t_left.eq(Mux(per_column, n_g, 0)),
                                 t_on.eq(per_column & (n_g != 0)), t_half.eq(0), t_col.eq(0),
                                 t_addr.eq(ins.b + Mux(per_expert, ins.expert << 1, 0)),
                                 t_step.eq(Mux(per_expert, 2 * E - 1, 1))]
                    with m.If(per_expert & ~per_column):
                        m.next = "RQ_TABLE"
                    with m.Else():
                        m.next = "CMD"
            with m.State("RQ_TABLE"):
                # (t_addr: b + 2*expert)
                m.d.comb += [rd0.addr.eq(t_addr), spad.rd1.addr.eq(t_addr + 1), rd0.en.eq(1), spad.rd1.en.eq(1)]
                m.next = "RQ_TABLE2"
            with m.State("RQ_TABLE2"):
                m.d.sync += [mult.eq(rd0.data[:cfg.mult_width]), shift.eq(spad.rd1.data[:6])]
                m.next = "CMD"
            with m.State("CMD"):
                m.d.comb += gemm.cmd.valid.eq(1)
                with m.If(gemm.cmd.ready):
                    m.d.comb += dma.rd_start.eq(1)
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += running.eq(1)
                with m.If(dma.error):
                    m.d.comb += [self.done.eq(1), self.error.eq(Err.BUS_ERROR)]
                    m.d.sync += busy.eq(0)
                    m.next = "IDLE"
                with m.Elif(gemm.done):
                    with m.If(gemm.error):
                        m.d.comb += [self.done.eq(1), self.error.eq(Err.BAD_SHAPE)]
                        m.d.sync += busy.eq(0)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "END"
            with m.State("END"):
                with m.If(~dma.rd_busy & ~gc_full & ~w_busy):
                    m.d.comb += [self.done.eq(1), self.error.eq(Err.NONE)]
                    m.d.sync += busy.eq(0)
                    m.next = "IDLE"
        return m
