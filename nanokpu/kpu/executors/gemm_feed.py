"""The GEMM executor: ``GEMM`` on the GEMM engine (:func:`~nanokpu.units.gemm.kpu_engine`), its A
operand packed from the scratchpad, B streamed from the bus, the results unpacked back."""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.isa import F_B_SPAD, F_B_T, F_RQ_CHANNEL, F_RQ_EXPERT, Err
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.dmem import banks
from nanokpu.kpu.executors import (
    dma_client_signature,
    executor_signature,
    requantiser_signature,
    saturate_to_width,
)
from nanokpu.units.gemm import kpu_engine
from nanokpu.units.shift_add import times_const

__all__ = ["GemmFeed"]

#: Groups of A words (``B`` columns each) the feed reads ahead of the engine (see GemmFeed.elaborate)
A_GROUPS = 3


class GemmFeed(wiring.Component):
    """``GEMM`` (:mod:`nanokpu.isa`): ``c = requant(a @ W^T)`` (or raw accumulators with
    ``width = 0``), ``a`` ``[m, k]`` in the scratchpad, the weight panels from the bus.

    Members: :func:`~nanokpu.kpu.executors.executor_signature`, ``dma``
    (:func:`~nanokpu.kpu.executors.dma_client_signature`: the B panels as one burst read started
    with the command) and ``rq`` (:func:`~nanokpu.kpu.executors.requantiser_signature`, flipped):
    the engine's requantiser lent to the element-wise executor while no ``GEMM`` runs.

    With ``B =`` :func:`~nanokpu.kpu.dmem.banks` and ``M_b`` the real rows of a row block: the
    words of A (``rows`` lanes: column ``k`` of a row block) are read ``B`` columns (a group) at
    a time, a wide ``rd0`` read per real row (its ``B`` consecutive columns) a cycle, pipelined,
    up to :data:`A_GROUPS` groups ahead of the engine: a group every ``max(M_b, B)`` cycles,
    back to back (a word a cycle while ``M_b <= B``). The result words (column ``j`` of a row
    block) are gathered ``B`` columns at a time, double-buffered (the next ``B`` fill while the
    last are written), and written one real row per cycle: a masked wide write of the row's
    ``B`` consecutive columns (those ``< n``), saturated to ``width``: ``M_b * ceil(n/B)``
    writes a row block (the engine's store, a word a cycle, waits while ``M_b > B``); ``done``
    follows the last write. With
    :data:`~nanokpu.isa.F_RQ_EXPERT` the multiplier and shift are first read from ``b +
    2*expert``. With :data:`~nanokpu.isa.F_RQ_CHANNEL` (and ``width != 0``) the ``n`` table
    entries (``b + 2*(j*E + e)``, :mod:`nanokpu.isa`) are copied into the engine's per-column
    table under the compute, one scratchpad read a cycle on ``rd1`` (2 per entry; the A feed
    reads on ``rd0`` alone); the engine's store, which runs under the compute, reads no
    result word until the copy is done (``col_hold``), then catches up a word a cycle. With
    :data:`~nanokpu.isa.F_B_SPAD` (built with ``layer_ops``) the B beats come from the
    scratchpad instead of the bus: lane ``j`` of beat ``kk`` of panel ``p`` is word ``b +
    (p*cols + j)*k + kk`` (with :data:`~nanokpu.isa.F_B_T` ``b + kk*n + p*cols + j``), read
    one a cycle on ``rd1`` (a lane past ``n`` takes a cycle without a read), a beat handed to
    the engine from a register once its last lane is in: ``cols`` cycles a beat while the
    engine keeps up. A bus error ends the instruction at once with
    :attr:`~nanokpu.isa.Err.BUS_ERROR`, an engine error with :attr:`~nanokpu.isa.Err.BAD_SHAPE`.
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
        B = banks(cfg)
        # A: groups of B words (columns k0 .. k0 + B - 1 of a row block), a wide rd0 read per real
        # row into tbuf, then into a_queue (see below)
        # gm_left, gc_left: rows of A / C from the current row block on (m, m - R, ...)
        gm_left = Signal(SW)
        gm_k0 = Signal(KW)         # the group's first column
        gm_row = Signal(range(R))  # the row of the next read
        gm_addr = Signal(AW)       # ... its address: a + (mb*R + gm_row)*k + k0
        gm_gaddr = Signal(AW)      # the group's row 0: a + mb*R*k + k0
        gm_block = Signal(AW)      # the row block's first word: a + mb*R*k
        rk = Signal(AW)            # R*k: from a row block's first word to the next's
        gm_cap = Signal()          # a read was performed at the last edge: its lanes on rd0 now
        gm_cap_row = Signal(range(R))
        gm_cap_last = Signal()     # ... the group's last row
        gm_cap_cols = Signal(range(B + 1))   # ... the group's columns: min(B, k - k0)
        gm_afeed_done = Signal()
        gm_owed = Signal(range(A_GROUPS + 1))   # groups begun and not yet wholly taken by the engine
        gm_go = Signal()           # a row of A is read unless blocked (see below)
        a_group = data.StructLayout({"words": data.ArrayLayout(data.ArrayLayout(signed(iw), B), R),  # [row][column]
                                     "cols": range(B + 1)})
        tbuf = Signal(a_group.members["words"])   # the group being read
        a_col = Signal(range(B))   # the column of the queue's head group the engine takes next
        # C: the engine's result words gathered B columns (a group) at a time into cbuf, written
        # from wbuf (see below)
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

        # The A feed reads the groups of A words one after another without waiting for the engine
        # to take them: a group begins only while fewer than A_GROUPS are owed (begun, not wholly
        # taken), its rows read one a cycle (a wide read: the row's B columns), and a group whose
        # last row is captured goes into a queue of A_GROUPS groups the engine takes a word (a
        # column) at a time from: A_GROUPS = 3 keeps one word per cycle while a row block has at
        # most B real rows (a group's reads, captured a cycle on and queued with the last, take
        # fewer cycles than the two groups ahead of it). Its flags as they will be after this
        # edge (held unless assigned below) make its read enable a flip-flop (gm_go) and
        # ~blocked: on a large ECP5 the scratchpad's blocks span the die, and the paths to their
        # enables leave no time for the group's bookkeeping
        row_n, afeed_done_n, owed_n = Signal.like(gm_row), Signal(), Signal.like(gm_owed)
        left_n = Signal.like(gm_left)
        m.d.comb += [row_n.eq(gm_row), afeed_done_n.eq(gm_afeed_done), owed_n.eq(gm_owed), left_n.eq(gm_left)]
        m.d.sync += [gm_row.eq(row_n), gm_afeed_done.eq(afeed_done_n), gm_owed.eq(owed_n), gm_left.eq(left_n),
                     gm_go.eq(~afeed_done_n & ((row_n != 0) | (owed_n < A_GROUPS)))]
        m.submodules.a_queue = a_queue = ResetInserter(self.start)(SyncFIFO(width=a_group.size, depth=A_GROUPS))
        head = data.View(a_group, a_queue.r_data)
        a_taken = gemm.a_in.valid & gemm.a_in.ready
        group_taken = a_taken & (a_col + 1 == head.cols)    # the head group's last word
        with m.If(a_taken):
            m.d.sync += a_col.eq(Mux(group_taken, 0, a_col + 1))

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

        # B from the scratchpad (F_B_SPAD): lane j of beat kk of panel p read at bs_addr = b + (p*C + j)*k +
        # kk (F_B_T: b + kk*n + p*C + j; the steps from lane to lane, beat to beat and panel to panel in
        # bs_lstep, bs_bstep, bs_pstep) on rd1 (the per-column table's port: the flags exclude each other),
        # captured a cycle on into the beat being gathered (bs_gather), whose last lane moves it whole into
        # bs_out for the engine. A read waits while bs_out is full and not taken, so the last lane's capture
        # never finds it full. A lane past n takes its cycle without a read (reads stay inside the checked
        # region; its column is never written).
        b_spad = Const(0)
        if cfg.layer_ops:
            C = cfg.cols
            b_spad = Signal()
            bs_on = Signal()                  # reads left
            bs_addr = Signal(AW)
            bs_beat = Signal(AW)              # lane 0's address of the current beat
            bs_panel = Signal(AW)             # lane 0's address of the panel's first beat
            bs_lstep, bs_bstep, bs_pstep = Signal(AW), Signal(AW), Signal(AW)   # k, 1, C*k (F_B_T: 1, n, C)
            bs_lane = Signal(range(C))
            bs_kk = Signal(KW)
            bs_rows = Signal(NW)              # rows of W from the panel's first on: n - p*C
            bs_cap = Signal()
            bs_cap_lane = Signal(range(C))
            bs_gather = Signal(data.ArrayLayout(signed(iw), C))
            bs_out = Signal(C * iw)
            bs_full = Signal()
            b_taken = gemm.b_in.valid & gemm.b_in.ready
            go = bs_on & ~blocked & (~bs_full | b_taken)
            m.d.sync += bs_cap.eq(0)
            with m.If(b_taken):
                m.d.sync += bs_full.eq(0)
            with m.If(go):
                m.d.comb += [spad.rd1.addr.eq(bs_addr), spad.rd1.en.eq(bs_rows > bs_lane)]
                m.d.sync += [bs_cap.eq(1), bs_cap_lane.eq(bs_lane),
                             bs_lane.eq(bs_lane + 1), bs_addr.eq(bs_addr + bs_lstep)]
                with m.If(bs_lane == C - 1):      # the beat's last lane: the next beat, or panel
                    m.d.sync += [bs_lane.eq(0), bs_kk.eq(bs_kk + 1), bs_beat.eq(bs_beat + bs_bstep),
                                 bs_addr.eq(bs_beat + bs_bstep)]
                    with m.If(bs_kk + 1 == k_g):
                        m.d.sync += [bs_kk.eq(0), bs_panel.eq(bs_panel + bs_pstep), bs_beat.eq(bs_panel + bs_pstep),
                                     bs_addr.eq(bs_panel + bs_pstep), bs_rows.eq(bs_rows - C),
                                     bs_on.eq(bs_rows > C)]
            with m.If(bs_cap):
                lane = spad.rd1.data[:iw]
                m.d.sync += bs_gather[bs_cap_lane].eq(lane)
                with m.If(bs_cap_lane == C - 1):
                    m.d.sync += [bs_out.eq(Cat(*(bs_gather[j] for j in range(C - 1)), lane)), bs_full.eq(1)]
            with m.If(self.done):
                m.d.sync += [bs_on.eq(0), bs_cap.eq(0), bs_full.eq(0)]

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
            gemm.a_in.payload.eq(Cat(Array(head.words[i][j] for j in range(B))[a_col] for i in range(R))),
            gemm.a_in.valid.eq(a_queue.r_rdy), a_queue.r_en.eq(group_taken),
            gemm.b_in.payload.eq(Mux(b_spad, bs_out, dma.rd_data.payload) if cfg.layer_ops else dma.rd_data.payload),
        ]
        with m.If(running):
            if cfg.layer_ops:
                m.d.comb += [gemm.b_in.valid.eq(Mux(b_spad, bs_full, dma.rd_data.valid)),
                             dma.rd_data.ready.eq(~b_spad & gemm.b_in.ready)]
            else:
                m.d.comb += [gemm.b_in.valid.eq(dma.rd_data.valid), dma.rd_data.ready.eq(gemm.b_in.ready)]
            # A: group (mb, k0): row i's read at a + (mb*R + i)*k + k0 gives A[mb*R + i, k0 + j]
            # in lane j, captured into tbuf row i (rows >= M are not read: queued as 0)
            begins = gm_go & ~blocked & (gm_row == 0)
            m.d.comb += owed_n.eq(gm_owed + begins - group_taken)
            m.d.sync += gm_cap.eq(0)
            with m.If(gm_go & ~blocked):
                last = last_row(gm_left, gm_row)
                left_k = (k_g - gm_k0)[:KW]
                m.d.comb += [rd0.addr.eq(gm_addr), rd0.en.eq(1), row_n.eq(gm_row + 1)]
                m.d.sync += [gm_cap.eq(1), gm_cap_row.eq(gm_row), gm_cap_last.eq(last),
                             gm_cap_cols.eq(Mux(left_k >= B, B, left_k)), gm_addr.eq(gm_addr + k_g)]
                with m.If(last):    # the next group: columns k0 + B on, or the next row block
                    m.d.comb += row_n.eq(0)
                    with m.If(gm_k0 + B < k_g):
                        m.d.sync += [gm_k0.eq(gm_k0 + B), gm_gaddr.eq(gm_gaddr + B), gm_addr.eq(gm_gaddr + B)]
                    with m.Else():
                        m.d.comb += left_n.eq(gm_left - R)
                        m.d.sync += [gm_k0.eq(0), gm_block.eq(gm_block + rk), gm_gaddr.eq(gm_block + rk),
                                     gm_addr.eq(gm_block + rk)]
                        with m.If(reached(gm_left, R)):
                            m.d.comb += afeed_done_n.eq(1)
            with m.If(gm_cap):
                row = Cat(rd0.lanes[j][:iw] for j in range(B))
                rows = [Mux(gm_cap_row == i, row, tbuf[i].as_value()) for i in range(R)]
                m.d.sync += [tbuf[i].eq(rows[i]) for i in range(R)]
                with m.If(gm_cap_last):
                    words = Cat(rows[0], *(Mux(gm_cap_row >= i, rows[i], 0) for i in range(1, R)))
                    m.d.comb += [a_queue.w_data.eq(Cat(words, gm_cap_cols)), a_queue.w_en.eq(1)]
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
                    m.d.comb += [row_n.eq(0), afeed_done_n.eq(0), owed_n.eq(0), left_n.eq(m_s)]
                    m.d.sync += [busy.eq(1), width.eq(ins.width), mult.eq(ins.mult), shift.eq(ins.shift),
                                 gm_k0.eq(0), gm_addr.eq(ins.a), gm_gaddr.eq(ins.a), gm_block.eq(ins.a),
                                 rk.eq(times_const(k_g, R)), a_col.eq(0),
                                 gc_left.eq(m_s), gc_n.eq(0), gc_col.eq(0), gc_full.eq(0), w_busy.eq(0),
                                 gc_block.eq(ins.c), gc_gaddr.eq(ins.c),
                                 rn.eq(times_const(n_g, R))]
                    if cfg.layer_ops:
                        from_spad, transposed = (ins.flags & F_B_SPAD) != 0, (ins.flags & F_B_T) != 0
                        m.d.sync += [b_spad.eq(from_spad), bs_on.eq(from_spad), bs_addr.eq(ins.b),
                                     bs_beat.eq(ins.b), bs_panel.eq(ins.b), bs_lane.eq(0),
                                     bs_kk.eq(0), bs_rows.eq(n_g), bs_full.eq(0),
                                     bs_lstep.eq(Mux(transposed, 1, k_g)), bs_bstep.eq(Mux(transposed, n_g, 1)),
                                     bs_pstep.eq(Mux(transposed, C, times_const(k_g, C)))]
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
                # (t_addr: b + 2*expert), once the reads are served
                m.d.comb += [rd0.addr.eq(t_addr), spad.rd1.addr.eq(t_addr + 1), rd0.en.eq(~blocked),
                             spad.rd1.en.eq(~blocked)]
                with m.If(~blocked):
                    m.next = "RQ_TABLE2"
            with m.State("RQ_TABLE2"):
                m.d.sync += [mult.eq(rd0.data[:cfg.mult_width]), shift.eq(spad.rd1.data[:6])]
                m.next = "CMD"
            with m.State("CMD"):
                m.d.comb += gemm.cmd.valid.eq(1)
                with m.If(gemm.cmd.ready):
                    m.d.comb += dma.rd_start.eq(~b_spad)
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
