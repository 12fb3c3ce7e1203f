"""The tiling GEMM engine: scratchpads, double-buffered B panels, systolic array, requantiser."""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.gemm_layout import SHIFT_WIDTH, GemmError, command_layout, dim_width
from nanokpu.units.memport import unchecked_read_port
from nanokpu.units.requant import Requantiser, requant_interval, requant_latency
from nanokpu.units.systolic import SystolicArray, done_latency, min_tile_cycles

__all__ = ["GemmEngine", "col_rq_layout", "columns_wait_in_array", "tile_gap", "gemm_cycles",
           "kpu_engine", "store_tail"]


def col_rq_layout(cfg: KpuConfig) -> data.StructLayout:
    """An entry of the GEMM engine's per-column requantiser table: ``mult``, ``shift``."""
    return data.StructLayout({"mult": unsigned(cfg.mult_width), "shift": unsigned(SHIFT_WIDTH)})


#: Cycles from a drained column on the array's output to its write into scratchpad C (the
#: column and its address registered, the old word read, its copy registered).
_DRAIN_STAGES = 3


#: Cycles from the compute's end (the command's ``RUN`` phase quiet) to the first read of a word of
#: the last tile written by the store under the compute.
_TILE_READY = -1


def columns_wait_in_array(cfg: KpuConfig) -> bool:
    """Where a drained column waits for the read-add-write of scratchpad C: in the array's own
    result registers, whose drain shift is delayed by :data:`_DRAIN_STAGES` cycles (``dsp =
    "ice40"``: the UP5K has no logic cells to spare for ``3 * rows * acc_width`` more
    flip-flops; the drain rule grows by as much), or in a column register per stage."""
    return cfg.dsp == "ice40"


def tile_gap(cfg: KpuConfig) -> int:
    """Minimum cycles per tile: the array's drain rule (plus :data:`_DRAIN_STAGES` when the
    columns wait in the array, :func:`columns_wait_in_array`), and room to hand a finished
    tile's address over to the drain before the next tile's is recorded (the step reaches
    the array 2 cycles after its issue)."""
    held = _DRAIN_STAGES if columns_wait_in_array(cfg) else 0
    return max(min_tile_cycles(cfg) + held, done_latency(cfg) + 3)


def gemm_cycles(cfg: KpuConfig, m: int, k: int, n: int, *, store: bool = True) -> int:
    """Exact cycles of :class:`GemmEngine` from accepting a valid ``compute`` command without
    ``accumulate`` to ``done`` (with or without ``load_a``), streams never stalling: the
    phases' sum (see :class:`GemmEngine`)."""
    mb, nb = -(-m // cfg.rows), -(-n // cfg.cols)
    compute = (mb + 3) + 1 + k + (mb * nb - 1) * max(k, tile_gap(cfg)) + done_latency(cfg) + cfg.cols + 4
    return compute + (store_tail(cfg, m, k, n) if store else 1)


def store_tail(cfg: KpuConfig, m: int, k: int, n: int) -> int:
    """Cycles from the compute's end to ``done`` of a ``compute`` and ``store`` command without
    ``accumulate`` (its store runs under the compute), streams never stalling: the last
    word's read, the requantiser's latency, the scratchpad read and its register. The store
    reads word ``(b, j)`` (row block ``b``, column ``j``, in that order) once tile ``(j //
    cols, b)`` is written (tiles are written ``max(k, tile_gap)`` cycles apart, panel by
    panel, row block by row block) and a requantiser interval after the word before it."""
    mb, nb = -(-m // cfg.rows), -(-n // cfg.cols)
    period, interval = max(k, tile_gap(cfg)), requant_interval(cfg)
    last = None     # the last read, in cycles after the compute's end (negative: before it)
    for b in range(mb):
        for j in range(n):
            ready = _TILE_READY - (mb * nb - 1 - ((j // cfg.cols) * mb + b)) * period
            last = ready if last is None else max(last + interval, ready)
    return last + requant_latency(cfg) + 5


def kpu_engine(cfg: KpuConfig, column_rq: bool = False) -> GemmEngine:
    """The GEMM engine as the nano-KPU instantiates it (``column_rq``: the per-column
    requantiser table of ``GEMM`` with :data:`~nanokpu.isa.F_RQ_CHANNEL`), and the iCEBreaker
    board build carries it (without): ``out_width = acc_width``, so a command with ``mult = 1``,
    ``shift = 0`` returns the raw accumulators and any other requantises them, the narrower
    output width of an instruction being a saturation outside the engine."""
    return GemmEngine(cfg, out_width=cfg.acc_width, column_rq=column_rq)


class GemmEngine(wiring.Component):
    """``C (+)= A @ B`` on a ``rows x cols`` output-stationary array, tiled over scratchpads.

    Data layout (R = ``rows``, C = ``cols``, ``MB = ceil(M/R)``, ``NB = ceil(N/C)``):

    * A (``[M, K]``, the activations) lives in scratchpad A in *row blocks*: word
      ``a_addr + mb*K + k`` holds ``A[mb*R + i, k]`` in lane ``i`` (``R`` int8 lanes). Lanes
      of rows ``>= M`` are don't-care: the engine feeds zeros for them.
    * B (``[K, N]``, the weights) is never resident: it streams in as ``NB`` *panels* of
      ``K`` words, panel ``nb`` word ``k`` holding ``B[k, nb*C + j]`` in lane ``j`` (lanes
      of columns ``>= N`` are don't-care). Scratchpad B holds two panels (ping-pong): panel
      ``nb + 1`` streams in while panel ``nb`` is multiplied with every A row block.
    * Results (``[M, N]``, ``acc_width`` bits) live in scratchpad C in the A layout: word
      ``c_addr + mb*N + n`` holds ``C[mb*R + i, n]`` in lane ``i``, so a stored result is
      the next GEMM's A operand as is.

    A command runs up to three phases: ``load_a`` streams ``MB*K`` words from ``a_in``
    into scratchpad A from ``a_addr`` on; ``compute`` streams ``NB*K`` words from ``b_in``
    and writes every result tile (column by column, through the array's drain chain) into
    scratchpad C, adding to the old contents (wrapping at ``acc_width``) when
    ``accumulate`` is set; ``store`` streams the ``MB*N`` result words of ``c_addr`` on, in
    that order, through the requantiser (``mult``, ``shift``, ``cfg.rounding``, saturation
    to ``out_width``: :func:`golden.intops.requantize`) out of ``c_out``, lanes of rows ``>=
    M`` as 0. A and B loading overlap the compute: a tile step waits only for its A word and
    its B panel, so the array stays busy while operands stream in. Without ``accumulate``
    the store overlaps it too: it starts with the compute and sends each word once its tile
    is written (a word a requantiser interval); otherwise, and without ``compute``, it
    follows the compute.

    Tiles run panel by panel (``nb`` outer, ``mb`` inner, ``k`` innermost), one K step per
    cycle. A tile takes ``max(K, tile_gap)`` cycles (:func:`tile_gap`: ``rows + 2*cols - 1``
    when ``cols >= 4``, the drain rule of :class:`~nanokpu.units.systolic.SystolicArray`; ``cols +
    4`` with ``dsp = "ice40"``, whose array broadcasts the steps,
    :func:`~nanokpu.units.systolic.broadcast_operands`, and keeps the drained columns until their
    write, :func:`columns_wait_in_array`); its drain overlaps the next tile.

    Latency of the phases, with sources that never idle and a sink that never stalls,
    from the cycle the command is accepted to the ``done`` pulse (exact, asserted by the
    benches; see :func:`gemm_cycles`), ``T = MB * NB`` tiles:

    * check: ``MB + 3`` cycles (validation; the ranges are walked one row block a cycle);
    * first words: 1 cycle (the compute follows the first B panel and A one word behind
      while they stream in: a K step needs only its own A and B words);
    * compute: ``K + (T - 1) * max(K, tile_gap)`` cycles; later panels stream in under the
      compute of the previous ones;
    * tail: ``done_latency + cols + 4``, ``rows + 2*cols + 4`` skewed, ``cols + 6`` on
      ``ice40`` (last step -> feed register -> array -> drain -> column address register ->
      scratchpad C read, registered -> write);
    * store: under the compute, :func:`store_tail` cycles after it (the words of the last
      tile written and any not yet sent, ``cols + 9`` with the pipelined requantiser while
      the store keeps up), or 1 cycle without ``store``. A store after the compute
      (``accumulate``) takes ``(MB*N - 1) * interval + latency + 5`` (the requantiser's).

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``rows``, ``cols``, ``in_width``, ``acc_width``, ``mult_width``,
        ``rounding``, ``spad_a_depth``, ``spad_b_depth``, ``spad_c_depth``.
    out_width : int, optional
        Width of the requantised results (default ``cfg.out_width``).
    column_rq : bool, optional
        Build the per-column requantiser table (the members ``col_en``, ``col_wr``,
        ``col_hold``; default off).

    Members
    -------
    cmd : In(stream.Signature(command_layout(cfg)))
        One command; accepted (``ready``) only when idle.
    a_in : In(stream.Signature(ArrayLayout(signed(in_width), rows)))
    b_in : In(stream.Signature(ArrayLayout(signed(in_width), cols)))
    c_out : Out(stream.Signature(ArrayLayout(signed(out_width), rows)))
    rq_in : In(stream.Signature(ArrayLayout(signed(acc_width), rows)))
        Words of values for the requantiser alone, for a user that has one requantiser for its
        GEMM results and other values: each word comes out of ``c_out``, lane for lane, with
        the latency and interval of a stored word. Taken while no store runs (``ready`` low
        during one); let the results out before the next command.
    rq_mult : In(unsigned(mult_width))
    rq_shift : In(unsigned(SHIFT_WIDTH))
        The requantiser's multiplier and right shift for ``rq_in``, held while its values are
        in flight.
    busy : Out(1)
        High from the accepted command to its ``done``.
    done : Out(1)
        One-cycle pulse when a command finishes or is refused.
    error : Out(1)
        Set with ``done`` when the command was refused (see :class:`GemmError`), cleared
        when the next command is accepted. A refused command reads, writes and streams
        nothing.
    error_code : Out(GemmError)
    col_en : In(1)
        (``column_rq``) Held from the command to its ``done``: the store requantises result
        column ``n`` by entry ``n`` of the table instead of ``cmd.mult``, ``cmd.shift``.
    col_wr : In(Signature({"en": Out(1), "addr": Out(range(spad_c_depth)), "data":
        Out(col_rq_layout(cfg))}))
        (``column_rq``) Writes entry ``addr`` of the table (``spad_c_depth`` entries of
        :func:`col_rq_layout`: ``mult``, ``shift``), performed at the edge.
    col_hold : In(1)
        (``column_rq``) While high the store reads no word (nor comes ``done`` of a command
        without one): the writer fills the table under the compute, the store reads entry ``n``
        with every word of column ``n`` and carries it with the word through the requantiser,
        one word per cycle as ever. The latencies above hold when it falls before the store
        would read its first word.
    """

    def __init__(self, cfg: KpuConfig, out_width: int | None = None, column_rq: bool = False):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg, self.column_rq = cfg, column_rq
        self.out_width = cfg.out_width if out_width is None else out_width
        self._requant = Requantiser(cfg, cfg.rows, self.out_width)  # validates out_width
        self._array = SystolicArray(cfg)
        op = signed(cfg.in_width)
        column = {"col_en": In(1), "col_hold": In(1), "col_wr": In(wiring.Signature({
            "en": Out(1), "addr": Out(range(cfg.spad_c_depth)), "data": Out(col_rq_layout(cfg))}))}
        super().__init__((column if column_rq else {}) | {
            "cmd": In(stream.Signature(command_layout(cfg))),
            "a_in": In(stream.Signature(data.ArrayLayout(op, cfg.rows))),
            "b_in": In(stream.Signature(data.ArrayLayout(op, cfg.cols))),
            "c_out": Out(stream.Signature(data.ArrayLayout(signed(self.out_width), cfg.rows))),
            "rq_in": In(stream.Signature(data.ArrayLayout(signed(cfg.acc_width), cfg.rows))),
            "rq_mult": In(unsigned(cfg.mult_width)), "rq_shift": In(unsigned(SHIFT_WIDTH)),
            "busy": Out(1), "done": Out(1), "error": Out(1),
            "error_code": Out(GemmError),
        })

    @property
    def macs_per_cycle(self) -> int:
        """Multiply-accumulates per cycle at peak: one per PE, ``rows * cols``."""
        return self.cfg.rows * self.cfg.cols

    @property
    def tile_gap(self) -> int:
        """:func:`tile_gap` of this engine's config."""
        return tile_gap(self.cfg)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        R, C = cfg.rows, cfg.cols
        half = cfg.spad_b_depth // 2
        dim = dim_width(cfg)
        wide = max(dim, cfg.spad_a_depth.bit_length(), cfg.spad_c_depth.bit_length()) + 2

        m.submodules.array = array = self._array
        m.submodules.requant = requant = self._requant
        spads = {}
        for name, width, lanes, depth in [("spad_a", cfg.in_width, R, cfg.spad_a_depth),
                                          ("spad_b", cfg.in_width, C, cfg.spad_b_depth),
                                          ("spad_c", cfg.acc_width, R, cfg.spad_c_depth)]:
            m.submodules[name] = spad = Memory(shape=data.ArrayLayout(signed(width), lanes), depth=depth, init=[],
                                               attrs={"no_rw_check": 1})
            # the engine never uses a read of a row written in the same cycle: a step reads the A
            # and B words it found written (a_ok, b_ok), the drain reads each result word once per
            # command, and the store reads a word once its tile is written (tiles_written)
            spads[name] = spad.write_port(), unchecked_read_port(m, spad, name)
        (a_wr, a_rd), (b_wr, b_rd), (c_wr, c_rd) = spads.values()

        # -- the latched command -------------------------------------------------------
        cmd = Signal(command_layout(cfg))
        k_m1 = Signal(dim)          # cmd.k - 1, registered (cmd is held from CHECK on)
        m.d.sync += k_m1.eq(cmd.k - 1)
        uses_a = cmd.load_a | cmd.compute
        uses_c = cmd.compute | cmd.store
        rows_left = Signal(dim)     # check walk: rows of the blocks not yet counted
        blocks = Signal(dim)        # MB, counted by the walk
        a_lim = Signal(wide)        # a_addr + MB*K once the walk ends
        c_lim = Signal(wide)        # c_addr + MB*N

        def lane_mask(rows):
            """Lanes of a row block that hold real rows (``rows`` left from this block on)."""
            return Cat(*(rows > i for i in range(R)))

        # -- phase activity (set when a checked command starts) --------------------------
        start = Signal()            # registered pulse, the first cycle of RUN
        m.d.sync += start.eq(0)
        a_loading = Signal()
        b_loading = Signal()
        issuing = Signal()
        pending = Signal(range(4))  # tiles issued whose drain has not finished
        drain_busy = Signal()
        w_valid = Signal()          # the scratchpad C write stage holds a word to write
        w_busy = Signal()           # the write stage holds a drained column (written or not)
        storing = Signal()
        store_start = Signal()
        early = Signal()            # the store runs under the compute (see the store below)
        tiles_written = Signal(2 * dim)   # tiles whose last column is in scratchpad C

        # -- A loader ---------------------------------------------------------------------
        a_wptr = Signal(wide)
        m.d.comb += [self.a_in.ready.eq(a_loading), a_wr.addr.eq(a_wptr),
                     a_wr.data.eq(self.a_in.payload), a_wr.en.eq(self.a_in.valid & a_loading)]
        with m.If(start):
            m.d.sync += [a_wptr.eq(cmd.a_addr), a_loading.eq(cmd.load_a)]
        with m.Elif(self.a_in.valid & a_loading):
            m.d.sync += a_wptr.eq(a_wptr + 1)
            with m.If(a_wptr + 1 == a_lim):
                m.d.sync += a_loading.eq(0)

        # -- B loader: K-word panels into the free half of scratchpad B -----------------
        full = Signal(2)
        full_set = Signal(2)
        full_clr = Signal(2)
        m.d.sync += full.eq((full | full_set) & ~full_clr)
        wbuf = Signal()
        b_k = Signal(dim)
        b_cols_left = Signal(dim)
        b_take = Signal()
        m.d.comb += [b_take.eq(b_loading & ~full.bit_select(wbuf, 1)),
                     self.b_in.ready.eq(b_take),
                     b_wr.addr.eq(Mux(wbuf, half, 0) + b_k), b_wr.data.eq(self.b_in.payload),
                     b_wr.en.eq(self.b_in.valid & b_take)]
        with m.If(start):
            m.d.sync += [b_loading.eq(cmd.compute), wbuf.eq(0), b_k.eq(0), b_cols_left.eq(cmd.n)]
        with m.Elif(self.b_in.valid & b_take):
            m.d.sync += b_k.eq(b_k + 1)
            with m.If(b_k == k_m1):
                m.d.comb += full_set.bit_select(wbuf, 1).eq(1)
                m.d.sync += [b_k.eq(0), wbuf.eq(~wbuf), b_cols_left.eq(b_cols_left - C)]
                with m.If(b_cols_left <= C):
                    m.d.sync += b_loading.eq(0)

        # -- compute issue: one K step per cycle into the array ---------------------------
        rbuf = Signal()
        k = Signal(dim)
        a_ptr = Signal(wide)
        rows_c = Signal(dim)        # M - mb*R: rows from the current block on
        cols_c = Signal(dim)        # N - nb*C
        c_panel = Signal(wide)      # c_addr + nb*C
        c_tile = Signal(wide)       # c_addr + mb*N + nb*C
        gap = Signal(range(self.tile_gap + 1))
        # The tests of a step, each a flip-flop loaded with its next-cycle value (a step is an
        # AND of registers): last_k = (k == K - 1), last_row = (rows_c <= R: the last row block),
        # a_ok = A word a_ptr is in scratchpad A, b_ok = B word k of panel rbuf is in scratchpad B.
        last_k, last_row, a_ok, b_ok = (Signal(name=n) for n in ("last_k", "last_row", "a_ok", "b_ok"))
        step = Signal()
        m.d.comb += step.eq(issuing & a_ok & b_ok & (~last_k | (gap >= self.tile_gap - 1)))
        # a_ptr never passes a_wptr while A streams in (a_ok), and every word is in once A is
        # loaded (a_loading low; the last step of the first panel reads the last word)
        with m.If(start):
            m.d.sync += a_ok.eq(~cmd.load_a)
        with m.Else():
            m.d.sync += a_ok.eq(~a_loading | a_wr.en | Mux(step, a_ptr + 1 != a_wptr, a_ok))
        # While issuing, panel rbuf is full or being loaded (wbuf == rbuf), b_k >= k, and B word
        # k is in when b_k > k; a panel whose last step issues is full.
        with m.If(start):
            m.d.sync += b_ok.eq(0)
        with m.Elif(step & last_k & last_row):  # word 0 of the next panel
            m.d.sync += b_ok.eq(full.bit_select(~rbuf, 1) | ((wbuf != rbuf) & (b_wr.en | (b_k != 0))))
        with m.Elif(step & last_k):
            m.d.sync += b_ok.eq(1)
        with m.Elif(step):  # word k + 1
            m.d.sync += b_ok.eq(full.bit_select(rbuf, 1) | ((wbuf == rbuf) & (b_wr.en | (b_k != k + 1))))
        with m.Else():
            m.d.sync += b_ok.eq(b_ok | ((wbuf == rbuf) & b_wr.en))
        m.d.comb += [a_rd.addr.eq(a_ptr), b_rd.addr.eq(Mux(rbuf, half, 0) + k)]
        with m.If(gap < self.tile_gap):
            m.d.sync += gap.eq(gap + 1)
        # the scratchpads' read data comes one cycle after the step, and is registered (the
        # feed stage) before the array: the array sees the step two cycles after its issue
        s_valid = Signal()
        s_first = Signal()
        s_last = Signal()
        s_mask = Signal(R)
        m.d.sync += [s_valid.eq(step), s_first.eq(k == 0), s_last.eq(last_k),
                     s_mask.eq(lane_mask(rows_c))]
        m.d.sync += [array.valid.eq(s_valid), array.first.eq(s_first), array.last.eq(s_last),
                     array.b.eq(b_rd.data)]
        for i in range(R):
            m.d.sync += array.a[i].eq(Mux(s_mask[i], a_rd.data[i], 0))
        # tile metadata, handed to the drain when the array reports the tile done
        t_base = Signal(wide)
        t_cols = Signal(range(C + 1))
        tile_issued = Signal()
        with m.If(start):
            m.d.sync += [issuing.eq(cmd.compute), rbuf.eq(0), k.eq(0), a_ptr.eq(cmd.a_addr),
                         rows_c.eq(cmd.m), cols_c.eq(cmd.n), c_panel.eq(cmd.c_addr),
                         c_tile.eq(cmd.c_addr), gap.eq(self.tile_gap),
                         last_k.eq(k_m1 == 0), last_row.eq(cmd.m <= R)]
        with m.Elif(step):
            m.d.sync += [k.eq(k + 1), a_ptr.eq(a_ptr + 1), last_k.eq(k + 1 == k_m1)]
            with m.If(last_k):
                m.d.comb += tile_issued.eq(1)
                m.d.sync += [k.eq(0), gap.eq(0), t_base.eq(c_tile),
                             t_cols.eq(Mux(cols_c < C, cols_c, C)),
                             rows_c.eq(rows_c - R), c_tile.eq(c_tile + cmd.n),
                             last_k.eq(k_m1 == 0), last_row.eq(rows_c <= 2 * R)]
                with m.If(last_row):  # the panel is done
                    m.d.comb += full_clr.bit_select(rbuf, 1).eq(1)
                    m.d.sync += [rbuf.eq(~rbuf), a_ptr.eq(cmd.a_addr), rows_c.eq(cmd.m),
                                 cols_c.eq(cols_c - C), c_panel.eq(c_panel + C),
                                 c_tile.eq(c_panel + C), last_row.eq(cmd.m <= R)]
                    with m.If(cols_c <= C):
                        m.d.sync += issuing.eq(0)

        # -- drain: the array's columns into scratchpad C (read-add-write) -----------------
        d_col = Signal(range(C + 1))
        d_base = Signal(wide)
        d_cols = Signal(range(C + 1))
        w_addr = Signal(wide)
        w_word = Signal(data.ArrayLayout(signed(cfg.acc_width), R))
        c_q = Signal(data.ArrayLayout(signed(cfg.acc_width), R))  # scratchpad C read data, registered
        tile_drained = Signal()
        with m.If(array.done):  # column 0 is on array.out now
            m.d.sync += [d_col.eq(1), d_base.eq(t_base), d_cols.eq(t_cols)]
            if C > 1:
                m.d.sync += drain_busy.eq(1)
            else:
                m.d.comb += tile_drained.eq(1)
        with m.Elif(drain_busy):
            m.d.sync += d_col.eq(d_col + 1)
            with m.If(d_col == C - 1):
                m.d.sync += drain_busy.eq(0)
                m.d.comb += tile_drained.eq(1)
        cur_base = Mux(array.done, t_base, d_base)
        cur_cols = Mux(array.done, t_cols, d_cols)
        cur_col = Mux(array.done, 0, d_col)
        draining = array.done | drain_busy
        # _DRAIN_STAGES stages: the drained column's address registered (the scratchpad C read
        # of the old word starts from it), the read, the write (the old word's registered
        # copy c_q plus the column)
        col_valid = [Signal(name=f"col_valid{n}") for n in range(2)]
        col_busy = [Signal(name=f"col_busy{n}") for n in range(2)]
        col_addr = [Signal(wide, name=f"col_addr{n}") for n in range(2)]
        col_end = [Signal(name=f"col_end{n}") for n in range(2)]   # the tile's last column
        w_end = Signal()
        m.d.sync += [col_valid[0].eq(draining & (cur_col < cur_cols)), col_busy[0].eq(draining),
                     col_addr[0].eq(cur_base + cur_col), col_end[0].eq(tile_drained),
                     col_valid[1].eq(col_valid[0]), col_busy[1].eq(col_busy[0]),
                     col_addr[1].eq(col_addr[0]), col_end[1].eq(col_end[0]),
                     w_valid.eq(col_valid[1]), w_busy.eq(col_busy[1]), w_addr.eq(col_addr[1]), w_end.eq(col_end[1])]
        with m.If(start):
            m.d.sync += tiles_written.eq(0)
        with m.Elif(w_end):
            m.d.sync += tiles_written.eq(tiles_written + 1)
        if columns_wait_in_array(cfg):  # the column stays on array.out until its write
            m.d.comb += [array.shift.eq(w_busy), w_word.eq(array.out)]
        else:
            col_word = [Signal(data.ArrayLayout(signed(cfg.acc_width), R), name=f"col_word{n}") for n in range(2)]
            m.d.comb += array.shift.eq(draining)
            m.d.sync += [col_word[0].eq(array.out), col_word[1].eq(col_word[0]), w_word.eq(col_word[1])]
        for i in range(R):  # c_q is 0 while computing without accumulate (see the store below)
            m.d.comb += c_wr.data[i].eq(w_word[i] + Mux(early, 0, c_q[i]))
        m.d.comb += [c_wr.addr.eq(w_addr), c_wr.en.eq(w_valid)]
        m.d.sync += pending.eq(pending + tile_issued - tile_drained)

        # -- store: scratchpad C -> requantiser -> c_out ----------------------------------
        # Word (mb, n) is read once tile (n // C, mb) is written: a store that starts with the
        # compute (early: compute and store without accumulate, the drain then reads nothing of
        # scratchpad C) follows the drain; one that starts after it finds every tile written.
        s_addr = Signal(wide)
        s_n = Signal(dim)
        s_rows = Signal(dim)
        s_left = Signal(wide)       # words not yet read
        s_col = Signal(range(C))    # n mod C
        s_block = Signal(dim)       # mb
        s_tile = Signal(2 * dim)    # word (mb, n)'s tile: (n // C) * MB + mb
        s_ok = Signal()             # ... is written (or the compute is over)
        m.d.comb += s_ok.eq(~early | ((s_tile < tiles_written) & ~(self.col_hold if self.column_rq else Const(0))))
        r_valid = Signal()          # c_rd.data holds a word read for the store
        r_mask = Signal(R)
        q_valid = Signal()          # c_q holds it
        out_left = Signal(wide)     # words not yet sent
        advance = ~q_valid | requant.i.ready
        # the stored word's (mult, shift): the command's, or (column_rq) its column's entry of the
        # table, read with the word (c_rd and col_rd: the same enable) and registered with it (q_rq)
        q_rq = Signal(col_rq_layout(cfg))
        if self.column_rq:
            m.submodules.col_rq = col_mem = Memory(shape=col_rq_layout(cfg), depth=cfg.spad_c_depth, init=[],
                                                   attrs={"no_rw_check": 1})
            col_wr, col_rd = col_mem.write_port(), unchecked_read_port(m, col_mem, "col_rq")
            m.d.comb += [col_wr.en.eq(self.col_wr.en), col_wr.addr.eq(self.col_wr.addr),
                         col_wr.data.eq(self.col_wr.data), col_rd.addr.eq(s_n), col_rd.en.eq(c_rd.en)]
            with m.If(advance):
                m.d.sync += q_rq.eq(Mux(self.col_en, col_rd.data, Cat(cmd.mult, cmd.shift)))
        else:
            m.d.comb += [q_rq.mult.eq(cmd.mult), q_rq.shift.eq(cmd.shift)]
        # the requantiser takes the stored words, or rq_in's while no store runs
        rq_in = self.rq_in
        m.d.comb += [requant.mult.eq(Mux(storing, q_rq.mult, self.rq_mult)),
                     requant.shift.eq(Mux(storing, q_rq.shift, self.rq_shift)),
                     requant.i.valid.eq(Mux(storing, q_valid, rq_in.valid)),
                     rq_in.ready.eq(~storing & requant.i.ready),
                     requant.i.payload.eq(Mux(storing, c_q, rq_in.payload))]
        wiring.connect(m, requant.o, wiring.flipped(self.c_out))
        m.d.comb += [c_rd.addr.eq(Mux(storing, s_addr, col_addr[0])),
                     c_rd.en.eq(~storing | advance)]
        with m.If(advance):
            m.d.sync += [c_q.eq(c_rd.data), q_valid.eq(r_valid)]
        # c_q lane i is 0 for the drain without accumulate (it adds 0) and for a row >= M in the
        # store: a synchronous reset of its flip-flops that overrides their enable (an ECP5
        # slice's LSR), so nothing sits between the block RAM's output and the flip-flops (a
        # reset under the enable took a LUT per bit there), nor before the adder or the requantiser
        for i in range(R):
            with m.If(advance & Mux(storing, ~r_mask[i], ~cmd.accumulate)):
                m.d.sync += c_q[i].eq(0)
        with m.If(store_start):
            m.d.sync += [storing.eq(1), s_addr.eq(cmd.c_addr), s_n.eq(0), s_rows.eq(cmd.m),
                         s_left.eq(c_lim - cmd.c_addr), out_left.eq(c_lim - cmd.c_addr),
                         s_col.eq(0), s_block.eq(0), s_tile.eq(0)]
        with m.Elif(storing & advance):
            m.d.sync += r_valid.eq((s_left != 0) & s_ok)
            with m.If((s_left != 0) & s_ok):
                m.d.sync += [s_addr.eq(s_addr + 1), s_left.eq(s_left - 1), s_n.eq(s_n + 1),
                             r_mask.eq(lane_mask(s_rows)), s_col.eq(s_col + 1)]
                with m.If(s_col == C - 1):
                    m.d.sync += [s_col.eq(0), s_tile.eq(s_tile + blocks)]
                with m.If(s_n == cmd.n - 1):
                    m.d.sync += [s_n.eq(0), s_rows.eq(s_rows - R), s_col.eq(0), s_block.eq(s_block + 1),
                                 s_tile.eq(s_block + 1)]
        with m.If(self.c_out.valid & self.c_out.ready):
            m.d.sync += out_left.eq(out_left - 1)

        # -- command FSM ------------------------------------------------------------------
        m.d.comb += self.busy.eq(~self.cmd.ready)
        m.d.sync += self.done.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    m.d.sync += [cmd.eq(self.cmd.payload), self.error.eq(0),
                                 self.error_code.eq(GemmError.NONE)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                code = Signal(GemmError)
                with m.If(~(cmd.load_a | cmd.compute | cmd.store)):
                    m.d.comb += code.eq(GemmError.NO_PHASE)
                with m.Elif((cmd.m == 0) | (uses_a & (cmd.k == 0)) | (uses_c & (cmd.n == 0))):
                    m.d.comb += code.eq(GemmError.ZERO_SHAPE)
                with m.Elif(cmd.compute & (cmd.k > half)):
                    m.d.comb += code.eq(GemmError.K_TOO_LARGE)
                # the walk's registers load whether or not the command is refused (their enables
                # do not wait for the checks)
                m.d.sync += [rows_left.eq(cmd.m), a_lim.eq(cmd.a_addr + cmd.k), c_lim.eq(cmd.c_addr + cmd.n),
                             blocks.eq(1)]
                with m.If(code != GemmError.NONE):
                    m.d.sync += [self.error.eq(1), self.error_code.eq(code), self.done.eq(1)]
                    m.next = "IDLE"
                with m.Else():
                    m.next = "WALK"
            with m.State("WALK"):  # one row block per cycle: a_lim, c_lim and their ranges
                a_over = uses_a & (a_lim > cfg.spad_a_depth)
                c_over = uses_c & (c_lim > cfg.spad_c_depth)
                with m.If(rows_left > R):
                    m.d.sync += [rows_left.eq(rows_left - R), a_lim.eq(a_lim + cmd.k),
                                 c_lim.eq(c_lim + cmd.n), blocks.eq(blocks + 1)]
                with m.If(a_over | c_over):
                    m.d.sync += [self.error.eq(1), self.done.eq(1),
                                 self.error_code.eq(Mux(a_over, GemmError.A_RANGE, GemmError.C_RANGE))]
                    m.next = "IDLE"
                with m.Elif(rows_left <= R):
                    m.d.sync += start.eq(1)
                    m.next = "RUN"
            with m.State("RUN"):
                quiet = (~(start | a_loading | b_loading | issuing | drain_busy | col_busy[0] | col_busy[1]
                           | w_busy) & (pending == 0))
                with m.If(start & cmd.compute & cmd.store & ~cmd.accumulate):
                    m.d.comb += store_start.eq(1)
                    m.d.sync += early.eq(1)
                with m.If(quiet & ~(self.col_hold if self.column_rq else Const(0))):
                    with m.If(cmd.store):
                        m.d.comb += store_start.eq(~early)
                        m.next = "STORE"
                    with m.Else():
                        m.d.sync += self.done.eq(1)
                        m.next = "IDLE"
            with m.State("STORE"):
                with m.If(out_left == 0):
                    m.d.sync += [storing.eq(0), early.eq(0), r_valid.eq(0), q_valid.eq(0), self.done.eq(1)]
                    m.next = "IDLE"
        return m
