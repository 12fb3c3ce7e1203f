"""The nano-KPU top level: registers, instruction memory, controller, scratchpad and the units.

Host interfaces
---------------
* ``s_axil`` (AXI4-Lite slave, 32-bit, :data:`~nanokpu.isa.ADDR_WIDTH` address bits): the
  registers of :class:`~nanokpu.isa.Reg`, the instruction memory at
  :data:`~nanokpu.isa.IMEM_BASE` (write-only, ignored while running) and the routing engine's
  per-expert load counters at :data:`~nanokpu.isa.LOADS_BASE` (read-only).
* ``m_axi`` (AXI4 master, :func:`~nanokpu.isa.bus_bytes` data): the nano-KPU fetches its inputs
  and weights from host memory and writes its results back itself. Why a memory port and not
  AXI4-Stream: routing is decided on chip, so only the nano-KPU knows which experts' weights
  it needs, and when; with a master port it fetches exactly those (a ``small`` batch touches
  ~60 % of the experts) instead of the host pushing all of them, and weights stream straight
  from the bus into the GEMM engine without ever being stored (one beat = one B panel word).

Datapath
--------
One scratchpad (:class:`~nanokpu.kpu.dmem.DataMemory`: ``dmem_depth`` words, 2 read ports, 1 write
port, the write performed in the cycle after it is issued; no instruction reads a word that
soon after writing it) holds every activation; with ``dsp = "ecp5"`` (one true-dual-port copy)
a cycle in which it writes reads nothing
(:func:`~nanokpu.kpu.dmem.writes_block_reads`), so an element-wise op with a read and a write per
element takes 2 cycles per element. Instructions run one at a time (:mod:`nanokpu.isa` gives
the semantics):

* ``GEMM``: the GEMM engine (:func:`~nanokpu.units.gemm.kpu_engine`, ``out_width = acc_width``; its requantiser
  applies the instruction's ``mult``/``shift``, then the top level saturates to ``width``, or
  ``mult = 1``, ``shift = 0`` for raw accumulators when ``width = 0``); A is packed from the
  scratchpad (one read per real row of a word), B comes from ``m_axi``, the results are
  unpacked into the scratchpad (one write per real row).
* ``REQUANT`` (the GEMM engine's requantiser, its ``rq_in`` port, + saturation to ``width``), ``SIGMOID``
  (:class:`~nanokpu.units.sigmoid.Sigmoid`), ``SITU`` (:class:`~nanokpu.units.situ.Situ`), ``ADD``/``COMBINE``/
  ``NORM`` (:class:`~nanokpu.units.vector.VectorUnit`): a streaming engine reads operands along a
  3-level affine walk, one element per cycle, and writes results back as they come.
* ``ROUTE``: :class:`~nanokpu.units.router.TopKRouter` (bias loaded from the scratchpad, scores
  streamed, routes written back), then a dispatch pass builds per-expert token lists.
* ``LOAD``/``STORE``: :class:`~nanokpu.kpu.axi_master.AxiMaster`; ``GATHER``/``SCATTER``/``EXPERT``:
  small sequencers.

The decode builds its checks (region sizes, shapes, in place, host window, what needs a ``ROUTE``)
and picks the executor from :data:`~nanokpu.isa.OP_RULES`, the table
:class:`~nanokpu.host.funcsim.FuncSim` reads too.
Errors stop the controller (``STATUS.error``, code in ``STATUS[15:8]``, the pc in ``[31:16]``);
a stop or a soft reset (``CTRL.bit1``) drains outstanding AXI bursts, resets the units and
returns to idle; the register bank answers throughout.
"""

from __future__ import annotations

from contextlib import contextmanager

from amaranth import Cat, Const, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.isa import (
    ADDR_WIDTH,
    EXECUTORS,
    F_HOST_EXPERT,
    F_M_COUNT,
    F_RQ_EXPERT,
    OP_RULES,
    RQ_WIDTHS,
    Err,
    Op,
    bus_bytes,
    word_width,
)
from nanokpu.kpu.axi_lite import axi_lite_signature
from nanokpu.kpu.axi_master import AxiMaster, axi4_signature
from nanokpu.kpu.decoded import decoded_layout
from nanokpu.kpu.executors.loadstore import LoadStore
from nanokpu.kpu.executors.move import Move
from nanokpu.kpu.executors.route import Route
from nanokpu.kpu.fetch import Fetch
from nanokpu.kpu.regbank import PC_WIDTH, RegisterBank
from nanokpu.kpu.spad import Scratchpad
from nanokpu.units.gemm import kpu_engine
from nanokpu.units.router import TopKRouter
from nanokpu.units.shift_add import ShiftAddMultiplier
from nanokpu.units.sigmoid import Sigmoid
from nanokpu.units.situ import Situ
from nanokpu.units.vector import VecOp, VectorUnit

__all__ = ["NanoKPU", "PRODUCT_STEPS"]

#: Products of instruction fields the decode computes, one after the other on one shift-add
#: lane: a step takes ``1 + bit_length(y)`` cycles (1 when the op leaves it unused), and one
#: more cycle commits the last.
PRODUCT_STEPS = 6


class NanoKPU(wiring.Component):
    """The nano-KPU: runs a compiled LatentMoE block (:mod:`nanokpu.host.compiler`) from its
    instruction memory, bit-exact to :class:`~nanokpu.host.funcsim.FuncSim`.

    Parameters
    ----------
    cfg : KpuConfig
        Every unit's config; the top level reads ``dmem_depth``, ``imem_depth``, ``rows``,
        ``cols`` (bus width ``cols * in_width``; ``in_width`` must be 8), ``n_experts``,
        ``top_k``, ``route_lanes``, ``act_width``, ``acc_width``, ``weight_width``.

    Members
    -------
    s_axil : In(axi_lite_signature(ADDR_WIDTH))
    m_axi : Out(axi4_signature(32, 8 * bus_bytes(cfg)))
    irq : Out(1)
        High while the controller is stopped with ``done`` or ``error`` set.
    """

    def __init__(self, cfg: KpuConfig):
        try:
            if not isinstance(cfg, KpuConfig):
                raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
            bits = cfg.cols * cfg.in_width
            if cfg.in_width != 8:
                raise ValueError(f"KpuConfig.in_width = {cfg.in_width}: the nano-KPU top level needs 8 "
                                 "(weights stream as bytes)")
            if bits < 32 or bits & (bits - 1):
                raise ValueError(f"KpuConfig.cols = {cfg.cols}: cols * in_width must be a power of two "
                                 ">= 32 (the AXI data width)")
            if cfg.dsp == "ice40":
                raise ValueError("KpuConfig.dsp = 'ice40': the whole nano-KPU is built for ECP5 (or generic); an iCE40 "
                                 "UP5K carries its units alone (nanokpu synth --board icebreaker: the GEMM engine)")
            if cfg.unbuilt_fields():
                name, value = cfg.unbuilt_fields()[0]
                raise ValueError(f"KpuConfig.{name} = {value!r}: the nano-KPU RTL builds per-tensor requantisers, "
                                 "the router GEMM at in_width and logits in the act format only (issue 26: the "
                                 "golden path runs this scheme, the RTL does not yet)")
        except (TypeError, ValueError):
            self._MustUse__silence = True   # refused: never elaborated, so not 'unused'
            raise
        self.cfg = cfg
        super().__init__({
            "s_axil": In(axi_lite_signature(ADDR_WIDTH)),
            "m_axi": Out(axi4_signature(32, bits)),
            "irq": Out(1),
        })

    @property
    def macs_per_cycle(self) -> int:
        """Multiply-accumulates per cycle at peak: the GEMM engine's ``rows * cols``."""
        return self.cfg.rows * self.cfg.cols

    # ------------------------------------------------------------------------------------
    def elaborate(self, platform):  # noqa: C901 - one controller, one place
        m = Module()
        cfg = self.cfg
        E, top_k, R, C = cfg.n_experts, cfg.top_k, cfg.rows, cfg.cols
        BW = bus_bytes(cfg)
        ww, act, accw = word_width(cfg), cfg.act_width, cfg.acc_width
        D = cfg.dmem_depth

        # -- units --------------------------------------------------------------------------
        unit_rst = Signal()

        def unit(name, u):
            m.submodules[name] = ResetInserter(unit_rst)(u)
            return u

        bank = m.submodules.bank = RegisterBank(cfg)
        wiring.connect(m, wiring.flipped(self.s_axil), bank.bus)
        fetch = m.submodules.fetch = Fetch(cfg)
        wiring.connect(m, bank.imem_wr, fetch.imem_wr)
        dma = m.submodules.dma = AxiMaster(32, 8 * BW)
        wiring.connect(m, wiring.flipped(self.m_axi), dma.bus)
        gemm = unit("gemm", kpu_engine(cfg))
        sig = unit("sigmoid", Sigmoid(cfg))
        situ = unit("situ", Situ(cfg))
        vec = unit("vector", VectorUnit(cfg))
        router = unit("router", TopKRouter(cfg))

        ldst = unit("loadstore", LoadStore(cfg))
        route = unit("route", Route(cfg, router.route_layout))
        move = unit("move", Move(cfg))
        wiring.connect(m, route.scores, router.scores)
        wiring.connect(m, router.routes, route.routes)
        m.d.comb += [router.bias_we.eq(route.bias.we), router.bias_addr.eq(route.bias.addr),
                     router.bias_data.eq(route.bias.data)]
        executors = {"dma": ldst, "route": route, "move": move}     # by the isa.EXECUTORS name of their instructions
        ctrl_rd_start = Signal()       # the controller's own use of the AXI4 master (GEMM's B)
        ctrl_rd_ready = Signal()
        # the scratchpad's clients: the controller's own states (client 0), then each executor,
        # selected while its instruction runs
        m.submodules.spad = spad = Scratchpad(cfg, 1 + len(executors))
        running_exec = Signal(len(executors))
        m.d.comb += spad.select.eq(Cat(~running_exec.any(), running_exec))
        for i, ex in enumerate(executors.values()):
            wiring.connect(m, ex.spad, spad.clients[1 + i])
        ctrl_spad = spad.clients[0]
        rd0, rd1, wr = ctrl_spad.rd0, ctrl_spad.rd1, ctrl_spad.wr
        # a cycle in which the scratchpad performs a write (the one after wr.en) performs no
        # read there: every read that can follow a write waits on `blocked` (the streaming
        # engine, GEMM A packing, ROUTE scores and dispatch, GATHER/SCATTER list and copy); the
        # others (RQ_TABLE, RT_BIAS, EXP_READ) follow the decode, never a write
        blocked = ctrl_spad.blocked

        # -- architectural state ------------------------------------------------------------
        # Sizes and scratchpad addresses: addresses are AW bits (the scratchpad port's, so
        # address arithmetic modulo 2**AW is exact); sizes are SW-bit saturating values, all
        # ones standing for "2**SW - 1 or more", which is beyond every size limit (dmem_depth,
        # the GEMM engine's scratchpads, the beats of a GEMM that passed its shape checks).
        AW = len(rd0.addr)
        nbk_max = -(-cfg.spad_c_depth // C) * (cfg.spad_b_depth // 2)
        SW = (max(D, cfg.spad_a_depth, cfg.spad_c_depth, nbk_max) + 1).bit_length()
        HW = 33   # host addresses: a window ends below 2**33 - 1, the saturated value
        BW_LOG = BW.bit_length() - 1
        # host bytes of a LOAD/STORE/GEMM plus BW - 1 (LOAD/STORE) that passed its shape and region
        # checks, saturating like the sizes; wide enough for k * BW and n * width unsaturated
        LBW = max((max(4 * D, nbk_max * BW) + BW).bit_length(), 16 + max(2, BW_LOG))
        running = Signal()
        done = Signal()
        err = Signal(8)
        pc = Signal(PC_WIDTH)
        retire = Signal()
        cur_executor = Signal(len(EXECUTORS))
        host_base, host_size = bank.host_base, bank.host_size
        ins = fetch.ins
        route_done = Signal()
        exp_active = Signal()
        expert = Signal(range(E + 1))
        scan = Signal(range(E + 2))
        count = Signal(16)
        offset = Signal(SW)     # the table's 24 bits, saturated
        scores_ok = Signal()
        scores_a = Signal(AW)
        scores_len = Signal(SW)
        start_req, soft_req = bank.start, bank.soft_reset
        m.d.comb += [
            bank.running.eq(running), bank.done.eq(done), bank.error.eq(err), bank.pc.eq(pc),
            bank.executor.eq(cur_executor), bank.retire.eq(retire),
            router.load_clear.eq(bank.clear_loads), router.load_addr.eq(bank.load_addr),
            bank.load_data.eq(router.load_data),
            self.irq.eq(~running & (done | (err != 0))),
        ]

        # -- decode: products of instruction fields, then combinational checks ---------------
        def sat(value, width=SW):
            """Unsigned ``value`` saturated to ``width`` bits (all ones: ``2**width - 1`` or more)."""
            if len(value) <= width:
                return value
            return Mux(value[width:].any(), (1 << width) - 1, value[:width])

        def ceil_div(value, d):
            """``ceil(value / d)`` for a constant ``d``."""
            if d & (d - 1) == 0:
                return (value + d - 1) >> (d.bit_length() - 1)
            return (value + d - 1) // d

        # Products of instruction fields, by one shift-add lane used in turn (``acc += y * x``,
        # one bit of ``y`` per cycle, LSB first, while ``y != 0``; PW bits, saturating), a step per
        # product: each step loads the lane and commits the previous step's product, saturated,
        # to its register. Steps, by the sizes OP_RULES names for the op (the engine rule: GEMM):
        #   ln = m*n (len, every op naming "m*n");
        #   mk = m*k ("m*k"), count*n ("count*n"), 4*m*top_k ("route": the table is mk + 2*E);
        #   p2 = k*n ("m*k*n"), ceil(m/rows)*k (engine), then row*n for each GATHER/SCATTER row;
        #   p3 = m*(k*n) ("m*k*n": p2 as it is committed), ceil(m/rows)*n (engine);
        #   l4 = host bytes, in whole beats: ceil(n/cols)*(k*BW) ("panels"), BW-1 + m*(n*width)
        #   ("m*n*width": rounded down to a beat), LBW bits; host_eff = host + expert*stride.
        # An unused step loads y = 0: a cycle. A step takes 1 + bit_length(y) cycles.
        PW = max(SW, LBW, HW)
        ln, mk, p2, p3 = (Signal(SW, name=n) for n in ("ln", "mk", "p2", "p3"))
        l4, host_eff = Signal(LBW, name="l4"), Signal(HW, name="host_eff")
        products = (ln, mk, p2, p3, l4, host_eff)
        assert len(products) == PRODUCT_STEPS
        m.submodules.lane = lane = ShiftAddMultiplier(16, PW)
        lane_acc, lane_busy = lane.acc, lane.busy
        step = Signal(range(len(products) + 2))   # the lane multiplies product step - 1

        beats = l4[BW_LOG:]
        nbytes = Cat(Const(0, BW_LOG), beats)
        settle = Signal(2)   # DECODE cycles since the products settled: 2 for the checks to register

        op = ins.op
        m_eff = Signal(16)
        m.d.comb += m_eff.eq(Mux(ins.flags & F_M_COUNT, count, ins.m))
        a_, b_, c_ = ins.a[:AW], ins.b[:AW], ins.c[:AW]
        m_s = m_eff[:SW]   # exact once the checks passed

        # the lane's operands at step s (products above saturate like the lane: x need not)
        st_y = Signal(16)
        st_x = Signal(PW)
        st_acc = Signal(PW)
        mb = ceil_div(m_eff, R)

        def ops_with(key):
            """The opcodes whose OP_RULES name the size ``key`` (or have the GEMM ``"engine"`` rule)."""
            return [o for o, r in OP_RULES.items()
                    if (r.engine if key == "engine" else key in (r.a, r.b, r.c, r.host))]

        # the lane's operands (y, x, acc) at each step for the ops naming a size (or with the engine
        # rule), one product per op and step; the sizes' signals below are these products
        width_log = Mux(ins.width == 4, 2, Mux(ins.width == 2, 1, 0))
        assert all(set(r.widths) <= {1, 2, 4} for r in OP_RULES.values() if r.host == "m*n*width"), \
            "host elements of 1, 2 or 4 bytes (width_log)"
        schedule = {
            0: {"m*n": (m_eff, ins.n, 0)},
            1: {"m*k": (m_eff, ins.k, 0), "count*n": (count, ins.n, 0), "route": (m_eff, 4 * top_k, 0)},
            2: {"m*k*n": (ins.k, ins.n, 0), "engine": (mb, ins.k, 0)},
            3: {"m*k*n": (m_eff, sat(lane_acc), 0), "engine": (mb, ins.n, 0)},   # m*k*n: p2, committed now
            4: {"panels": (ceil_div(ins.n, C), ins.k << BW_LOG, 0),
                "m*n*width": (m_eff, ins.n << width_log, BW - 1)},
        }
        with m.Switch(step):
            for i, products_at in schedule.items():
                with m.Case(i), m.Switch(op):
                    taken = set()
                    for key, (y, x, acc) in products_at.items():
                        ops = ops_with(key)
                        assert not taken & set(ops), f"two products at step {i} for {taken & set(ops)}"
                        taken |= set(ops)
                        if ops:
                            with m.Case(*ops):
                                m.d.comb += [st_y.eq(y), st_x.eq(x), st_acc.eq(acc)]
            with m.Case(5):
                m.d.comb += [st_y.eq(Mux((ins.flags & F_HOST_EXPERT) != 0, expert, 0)),
                             st_x.eq(ins.stride), st_acc.eq(ins.host)]

        def any_op(pred):
            """``op`` is one of the opcodes whose OP_RULES entry satisfies ``pred``."""
            return Cat(Const(0), *(op == o for o, r in OP_RULES.items() if pred(r))).any()

        needs_expert = ((ins.flags & (F_M_COUNT | F_HOST_EXPERT | F_RQ_EXPERT)) != 0) | any_op(lambda r: r.expert)
        needs_route = needs_expert | any_op(lambda r: r.route)
        valid_op = op <= max(Op)
        letters = {"m": m_eff, "n": ins.n, "k": ins.k}

        def shape_rule(r):
            """The shape rules of ``r``: letters >= 1, n = n_experts, k = top_k, width, the GEMM engine's limits."""
            terms = [letters[x] >= 1 for x in r.positive]
            terms += [ins.n == E] if r.n_experts else []
            terms += [ins.k == top_k] if r.top_k else []
            if r.widths:
                terms.append(Cat(*((ins.width >= 2) & (ins.width <= accw) if w == RQ_WIDTHS else ins.width == w
                                   for w in r.widths)).any())
            if r.engine:
                terms += [ins.k <= cfg.spad_b_depth // 2, p2 <= cfg.spad_a_depth, p3 <= cfg.spad_c_depth]
            return Cat(*terms).all() if terms else Const(1)

        shape_ok = Signal()
        with m.Switch(op):
            for o, r in OP_RULES.items():
                with m.Case(o):
                    m.d.comb += shape_ok.eq(shape_rule(r))
        # scratchpad regions: (base, words) for the a, b and c operands, words = 0 when unused; the
        # signal of each size OP_RULES names (the products of the lane's schedule above: mk is
        # m*k, count*n or 4*m*top_k, whichever the op names, the schedule allows one)
        wa = Signal(SW)
        wb = Signal(SW)
        wc = Signal(SW)
        sizes = {
            "m*n": ln, "m*k": mk, "count*n": mk, "route": sat(mk + 2 * E), "m*k*n": p3,
            "n": sat(ins.n), "2*n": sat(ins.n << 1), "list": sat(offset + count),
            "rq": Mux(ins.flags & F_RQ_EXPERT, min(2 * E, (1 << SW) - 1), 0),
        }
        host_sizes = schedule[4].keys()     # l4 (nbytes): the lane's step 4
        missing = {name for r in OP_RULES.values() for name in (r.a, r.b, r.c) if name} - sizes.keys()
        missing |= {r.host for r in OP_RULES.values() if r.host} - host_sizes
        assert not missing, f"OP_RULES names sizes without a signal in the decode: {sorted(missing)}"
        regions = {}
        for o, r in OP_RULES.items():
            if r.a or r.b or r.c:
                regions.setdefault((r.a, r.b, r.c), []).append(o)
        with m.Switch(op):
            for names, ops in regions.items():
                with m.Case(*ops):
                    m.d.comb += [w.eq(sizes[name]) for w, name in zip((wa, wb, wc), names, strict=True) if name]

        def region_ok(base, words):
            return (words == 0) | ((base[SW:] == 0) & (base[:SW] + words <= D))

        in_place_op = any_op(lambda r: r.in_place)

        def overlaps(base, words):
            """The result region ``(c, wc)`` overlaps the operand region ``(base, words)``, and
            not exactly in place (regions checked: SW-bit bases)."""
            x, r = base[:SW], ins.c[:SW]
            in_place = in_place_op & (x == r) & (words == wc)
            return (words != 0) & (wc != 0) & (x < r + wc) & (r < x + words) & ~in_place

        # the arithmetic checks registered, then decode_err from them registered (decode_q)
        shape_q = Signal()
        spad_ok = Signal()
        host_ok = Signal()
        overlap_q = Signal()
        m.d.sync += [shape_q.eq(shape_ok), overlap_q.eq(overlaps(ins.a, wa) | overlaps(ins.b, wb)),
                     spad_ok.eq(region_ok(ins.a, wa) & region_ok(ins.b, wb) & region_ok(ins.c, wc)),
                     host_ok.eq((host_eff[:BW_LOG] == 0) & (host_eff >= host_base)
                                & (host_eff + nbytes <= host_base + host_size))]
        uses_host = any_op(lambda r: r.host)
        target_ok = ins.target < cfg.imem_depth
        decode_err = Signal(8)
        # (an op without rules, JUMP, passes the shape, region, overlap and host checks)
        with m.If(~valid_op):
            m.d.comb += decode_err.eq(Err.BAD_OPCODE)
        with m.Elif((needs_route & ~route_done) | (needs_expert & ~exp_active)):
            m.d.comb += decode_err.eq(Err.NO_ROUTE)
        with m.Elif(any_op(lambda r: r.target) & ~target_ok):
            m.d.comb += decode_err.eq(Err.PC_RANGE)
        with m.Elif(~shape_q):
            m.d.comb += decode_err.eq(Err.BAD_SHAPE)
        with m.Elif(any_op(lambda r: r.scores) & ~(scores_ok & (ins.a[AW:] == 0) & (scores_a == a_)
                                                   & (scores_len == ln))):
            m.d.comb += decode_err.eq(Err.NO_SCORES)
        with m.Elif(~spad_ok):
            m.d.comb += decode_err.eq(Err.SPAD_RANGE)
        with m.Elif(overlap_q):
            m.d.comb += decode_err.eq(Err.OVERLAP)
        with m.Elif(uses_host & ~host_ok):
            m.d.comb += decode_err.eq(Err.HOST_RANGE)
        decode_q = Signal(8)
        m.d.sync += decode_q.eq(decode_err)

        # -- streaming engine for element-wise ops --------------------------------------------
        # a 3-level walk (i0 innermost) over the a and b operands; one element per cycle
        # (counts are sizes of checked regions, >= 1: SW bits; addresses and strides modulo 2**AW);
        # rem[j] counts the steps of level j left, this one included, down from cnt[j]
        cnt = [Signal(SW, name=f"cnt{j}") for j in range(2)]
        rem = [Signal(SW, name=f"rem{j}") for j in range(3)]
        # strides: sa1, sb0 and sb1 are 0 or 1 in every walk
        sa = [Signal(AW, name="sa0"), Signal(1, name="sa1"), Signal(AW, name="sa2")]
        sb = [Signal(1, name="sb0"), Signal(1, name="sb1"), Signal(AW, name="sb2")]
        pa = Signal(AW)
        ra1 = Signal(AW)
        ra2 = Signal(AW)
        pb = Signal(AW)
        rb1 = Signal(AW)
        rb2 = Signal(AW)
        # two stages: g (the scratchpad reads in flight) and h (the operands registered, the
        # beat the selected unit sees), each advancing when the next one is free
        issuing = Signal()
        g_valid = Signal()
        g_last = Signal()
        h_valid = Signal()
        h_last = Signal()
        # the read data registered: rd0_q, rd1_q; the states that compare it wait a cycle (a
        # *_WAIT state); in the streaming engine they are stage h's operands, held while it stalls
        rd0_q = Signal(signed(ww))
        rd1_q = Signal(signed(ww))
        a_word, b_word = rd0_q, rd1_q
        # elements done, one counter for the engine's results, LOAD's writes and STORE's reads
        # (each instruction clears it); every one of them handles len = ln elements
        el_i = Signal(SW)
        el_more = el_i < ln
        eng_ready = Signal()         # the selected unit takes the current beat
        eng_run = Signal()
        h_free = ~h_valid | eng_ready
        advance = ~g_valid | h_free
        issue = advance & ~blocked

        def engine_setup(c0, c1, c2, a0, a1, a2, b0, b1, b2):
            return [cnt[0].eq(c0), cnt[1].eq(c1), sa[0].eq(a0), sa[1].eq(a1),
                    sa[2].eq(a2), sb[0].eq(b0), sb[1].eq(b1), sb[2].eq(b2),
                    rem[0].eq(c0), rem[1].eq(c1), rem[2].eq(c2),
                    pa.eq(a_), ra1.eq(a_), ra2.eq(a_),
                    pb.eq(b_), rb1.eq(b_), rb2.eq(b_),
                    issuing.eq(1), g_valid.eq(0), h_valid.eq(0), el_i.eq(0)]

        with m.If(eng_run):
            m.d.comb += [rd0.addr.eq(pa), rd1.addr.eq(pb), rd0.en.eq(issue), rd1.en.eq(issue)]
            with m.If(h_free):
                m.d.sync += [h_valid.eq(g_valid), h_last.eq(g_last)]
            with m.If(advance):
                m.d.sync += [g_valid.eq(issuing & ~blocked), g_last.eq(rem[0] == 1)]
                with m.If(issuing & ~blocked):
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

        # One register packs the words a unit takes whole: REQUANT's (R lanes of acc_width bits) and
        # GEMM's A word (R lanes, the low 8 bits of each): one instruction at a time uses it
        pack = Signal(data.ArrayLayout(signed(accw), R))

        # unit inputs and outputs of the engine
        rq_mult = Signal(32)
        rq_shift = Signal(6)
        rq_width = Signal(6)
        # REQUANT: the word being filled in pack (rq_fill lanes so far, sent when rq_wvalid), the
        # lane of the result word being written back
        rq_fill = Signal(range(R + 1))
        rq_wvalid = Signal()
        rq_lane = Signal(range(R))
        rq_at_last = Signal()     # registered: the next write is the instruction's last (el_i == len - 1)
        out_valid = Signal()
        out_data = Signal(signed(ww))
        vec_op = Signal(VecOp)      # registered: ins is stable long before the engine runs
        m.d.sync += vec_op.eq(Mux(op == Op.NORM, VecOp.NORM, Mux(op == Op.COMBINE, VecOp.COMBINE, VecOp.ADD)))
        # the running op as registered flags (ins is stable from DECODE on): the states after
        # DECODE select by these, not by comparing the opcode, whose decode would otherwise sit
        # on the scratchpad's address and write-enable paths
        run = {o: Signal(name=f"run_{o.name.lower()}")
               for o in (Op.GEMM, Op.REQUANT, Op.SIGMOID, Op.SITU)}
        m.d.sync += [flag.eq(op == o) for o, flag in run.items()]
        m.d.comb += [
            gemm.rq_mult.eq(rq_mult), gemm.rq_shift.eq(rq_shift),
            gemm.rq_in.payload.eq(pack.as_value()[:R * accw]),
            sig.i.payload[0].eq(a_word[:act].as_signed()),
            situ.i.payload[0].g.eq(a_word[:act].as_signed()),
            situ.i.payload[0].u.eq(b_word[:act].as_signed()),
            vec.i.payload.a.eq(a_word[:act].as_signed()),
            vec.i.payload.b.eq(Mux(vec_op == VecOp.COMBINE, b_word[:cfg.weight_width],
                                   b_word[:act].as_signed())),
            vec.i.payload.last.eq(h_last),
            vec.n.eq(ins.n),
            vec.op.eq(vec_op),
            sig.o.ready.eq(1), situ.o.ready.eq(1), vec.o.ready.eq(1),
        ]
        # saturation to the instruction's output width rq_width (in [2, acc_width] once checked):
        # hi_sat = 2**(rq_width-1) - 1, the low bound ~hi_sat; one saturator for the GEMM engine's
        # requantiser, its lane 0 (REQUANT) or the lane the GEMM unpacking is at
        hi_sat = Signal(signed(accw))
        sat_in = Signal(signed(accw))
        rq_sat = Signal(signed(accw))
        m.d.comb += [hi_sat.eq(Cat(*[rq_width > i + 1 for i in range(accw - 1)], 0)),
                     rq_sat.eq(Mux(sat_in > hi_sat, hi_sat, Mux(sat_in < ~hi_sat, ~hi_sat, sat_in)))]
        with m.If(eng_run):
            with m.If(run[Op.REQUANT]):
                # R values a word through the GEMM engine's requantiser (R lanes, one word
                # per interval), written back lane by lane; a lane is filled in the cycle
                # its word is sent (the requantiser takes the word at that edge)
                send = rq_wvalid & gemm.rq_in.ready
                fill = Mux(send, 0, rq_fill)
                m.d.comb += [gemm.rq_in.valid.eq(rq_wvalid), eng_ready.eq(~rq_wvalid | gemm.rq_in.ready),
                             out_valid.eq(gemm.c_out.valid), out_data.eq(rq_sat)]
                with m.If(send):
                    m.d.sync += [rq_wvalid.eq(0), rq_fill.eq(0)]
                with m.If(h_valid & eng_ready):
                    m.d.sync += [pack[fill].eq(a_word[:accw].as_signed()), rq_fill.eq(fill + 1)]
                    with m.If((fill == R - 1) | h_last):
                        m.d.sync += rq_wvalid.eq(1)
                with m.If(gemm.c_out.valid):
                    word_end = (rq_lane == R - 1) | rq_at_last
                    m.d.comb += gemm.c_out.ready.eq(word_end)
                    m.d.sync += rq_lane.eq(Mux(word_end, 0, rq_lane + 1))
            with m.Elif(run[Op.SIGMOID]):
                m.d.comb += [sig.i.valid.eq(h_valid), eng_ready.eq(sig.i.ready),
                             out_valid.eq(sig.o.valid), out_data.eq(sig.o.payload[0])]
            with m.Elif(run[Op.SITU]):
                m.d.comb += [situ.i.valid.eq(h_valid), eng_ready.eq(situ.i.ready),
                             out_valid.eq(situ.o.valid), out_data.eq(situ.o.payload[0])]
            with m.Else():
                m.d.comb += [vec.i.valid.eq(h_valid), eng_ready.eq(vec.i.ready),
                             out_valid.eq(vec.o.valid), out_data.eq(vec.o.payload)]
        eng_done = eng_run & ~el_more

        # -- GEMM operand packing ----------------------------------------------------------------
        # running scratchpad addresses: A word (mb, k) lane i at a + (mb*R + i)*k + k_idx, C word
        # (mb, n) lane i at c + (mb*R + i)*n + n_idx; after the last word of a row block the
        # next block starts one past the last lane's address
        KW, NW = (cfg.spad_b_depth // 2).bit_length(), cfg.spad_c_depth.bit_length()
        k_g, n_g = ins.k[:KW], ins.n[:NW]          # exact once the shape checks passed
        # gm_left, gc_left: rows of A / C from the current row block on (m, m - R, ...)
        gm_left = Signal(SW)
        gm_k = Signal(KW)
        gm_lane = Signal(range(R + 1))
        gm_addr = Signal(AW)
        gm_wstart = Signal(AW)
        gm_cap = Signal()
        gm_cap_lane = Signal(range(R))
        gm_wvalid = Signal()
        gm_afeed_done = Signal()
        gc_left = Signal(SW)
        gc_n = Signal(NW)
        gc_lane = Signal(range(R))
        gc_addr = Signal(AW)
        gc_wstart = Signal(AW)
        gc_last = Signal()     # registered: lane gc_lane is the word's last (c_out.ready off a flip-flop)

        LB = (R + 1).bit_length()

        def reached(left, lanes):
            """``lanes >= left`` for ``lanes <= R + 1``: a block of ``left`` rows ends within ``lanes``."""
            return (left[LB:] == 0) & (lanes >= left[:LB])

        def gc_last_of(left, lane):
            """Lane ``lane`` of a word with ``left`` rows left is its last: lane R-1 or row M-1."""
            return (lane == R - 1) | reached(left, lane + 1)
        gemm_run = Signal()
        m.d.comb += [
            gemm.cmd.payload.m.eq(m_eff), gemm.cmd.payload.k.eq(ins.k), gemm.cmd.payload.n.eq(ins.n),
            gemm.cmd.payload.a_addr.eq(0), gemm.cmd.payload.c_addr.eq(0),
            gemm.cmd.payload.mult.eq(Mux(rq_width != 0, rq_mult, 1)),
            gemm.cmd.payload.shift.eq(Mux(rq_width != 0, rq_shift, 0)),
            gemm.cmd.payload.load_a.eq(1), gemm.cmd.payload.compute.eq(1),
            gemm.cmd.payload.store.eq(1), gemm.cmd.payload.accumulate.eq(0),
            gemm.a_in.payload.eq(Cat(pack[i][:8] for i in range(R))), gemm.a_in.valid.eq(gm_wvalid),
            gemm.b_in.payload.eq(dma.rd_data.payload),
            sat_in.eq(gemm.c_out.payload[Mux(run[Op.GEMM], gc_lane, rq_lane)]),
        ]
        with m.If(gemm_run):
            m.d.comb += [gemm.b_in.valid.eq(dma.rd_data.valid), ctrl_rd_ready.eq(gemm.b_in.ready)]
            # A: word (mb, k), lane i = A[mb*R + i, k]; one scratchpad read per lane, pipelined
            # (lanes of rows >= M are not read: the word was cleared, they stay 0)
            word_full = (gm_lane == R) | reached(gm_left, gm_lane)
            with m.If(~gm_wvalid & ~gm_afeed_done & ~word_full & ~blocked):
                m.d.comb += [rd0.addr.eq(gm_addr), rd0.en.eq(1)]
                m.d.sync += [gm_cap.eq(1), gm_cap_lane.eq(gm_lane), gm_lane.eq(gm_lane + 1),
                             gm_addr.eq(gm_addr + k_g)]
            with m.Else():
                m.d.sync += gm_cap.eq(0)
            with m.If(gm_cap):
                m.d.sync += pack.as_value().word_select(gm_cap_lane, accw)[:8].eq(rd0.data[:8])
            with m.If(~gm_wvalid & ~gm_afeed_done & word_full):
                m.d.sync += gm_wvalid.eq(1)  # the capture in flight (if any) lands on this edge
            with m.If(gemm.a_in.valid & gemm.a_in.ready):
                m.d.sync += [gm_wvalid.eq(0), gm_lane.eq(0), pack.eq(0)]
                with m.If(gm_k + 1 < k_g):
                    m.d.sync += [gm_k.eq(gm_k + 1), gm_wstart.eq(gm_wstart + 1), gm_addr.eq(gm_wstart + 1)]
                with m.Else():
                    next_block = gm_addr - k_g + 1
                    m.d.sync += [gm_k.eq(0), gm_left.eq(gm_left - R), gm_wstart.eq(next_block),
                                 gm_addr.eq(next_block)]
                    with m.If(reached(gm_left, R)):
                        m.d.sync += gm_afeed_done.eq(1)
            # C: word (mb, n) -> rows mb*R + i of column n, one write per lane
            # (rows >= M are skipped: the word is taken after its last real row)
            with m.If(gemm.c_out.valid):
                m.d.comb += [wr.addr.eq(gc_addr),
                             wr.data.eq(Mux(rq_width != 0, rq_sat, gemm.c_out.payload[gc_lane])), wr.en.eq(1)]
                m.d.sync += [gc_lane.eq(gc_lane + 1), gc_addr.eq(gc_addr + n_g),
                             gc_last.eq(gc_last_of(gc_left, gc_lane + 1))]
                with m.If(gc_last):
                    m.d.comb += gemm.c_out.ready.eq(1)
                    m.d.sync += gc_lane.eq(0)
                    with m.If(gc_n + 1 < n_g):
                        m.d.sync += [gc_n.eq(gc_n + 1), gc_wstart.eq(gc_wstart + 1), gc_addr.eq(gc_wstart + 1),
                                     gc_last.eq(gc_last_of(gc_left, 0))]
                    with m.Else():
                        next_left = (gc_left - R)[:SW]     # wraps after the last block: unused
                        m.d.sync += [gc_n.eq(0), gc_left.eq(next_left), gc_wstart.eq(gc_addr + 1),
                                     gc_addr.eq(gc_addr + 1), gc_last.eq(gc_last_of(next_left, 0))]

        # -- executors: the decoded instruction, the AXI4 master shared ---------------------------
        decoded = Signal(decoded_layout(cfg))
        m.d.comb += [decoded.op.eq(op), decoded.width.eq(ins.width), decoded.a.eq(a_), decoded.b.eq(b_),
                     decoded.c.eq(c_), decoded.m.eq(m_eff), decoded.n.eq(ins.n), decoded.k.eq(ins.k),
                     decoded.len.eq(ln), decoded.count.eq(count), decoded.offset.eq(offset)]
        exec_start = Signal(len(executors))
        exec_done = Signal()
        exec_error = Signal(8)
        for i, ex in enumerate(executors.values()):
            m.d.comb += [ex.ins.eq(decoded), ex.start.eq(exec_start[i])]
            with m.If(running_exec[i]):
                m.d.comb += [exec_done.eq(ex.done), exec_error.eq(ex.error)]
        m.d.comb += [
            dma.rd_start.eq(ctrl_rd_start | ldst.dma.rd_start), dma.wr_start.eq(ldst.dma.wr_start),
            dma.rd_data.ready.eq(ctrl_rd_ready | ldst.dma.rd_data.ready),
            ldst.dma.rd_data.valid.eq(dma.rd_data.valid), ldst.dma.rd_data.payload.eq(dma.rd_data.payload),
            dma.wr_data.valid.eq(ldst.dma.wr_data.valid), dma.wr_data.payload.eq(ldst.dma.wr_data.payload),
            ldst.dma.wr_data.ready.eq(dma.wr_data.ready),
            ldst.dma.rd_busy.eq(dma.rd_busy), ldst.dma.wr_busy.eq(dma.wr_busy), ldst.dma.error.eq(dma.error),
        ]

        # -- controller -----------------------------------------------------------------------------
        stop_code = Signal(8)
        m.d.comb += dma.rd_addr.eq(host_eff), dma.wr_addr.eq(host_eff)   # in the window: < 2**32
        m.d.comb += [dma.rd_beats.eq(beats), dma.wr_beats.eq(beats)]
        def goto_next(target=None):
            m.d.comb += retire.eq(1)
            m.d.sync += [pc.eq(pc + 1 if target is None else target), cur_executor.eq(0)]
            m.next = "FETCH"

        def stop(code):
            m.d.sync += [stop_code.eq(code), cur_executor.eq(0)]
            m.next = "DRAIN"

        with m.If(~eng_run | h_free):
            m.d.sync += [rd0_q.eq(rd0.data), rd1_q.eq(rd1.data)]

        @contextmanager
        def state(name):
            """An FSM state; a soft reset request overrides its transition (except when idle)."""
            with m.State(name):
                yield
                if name not in ("IDLE", "DRAIN"):
                    with m.If(soft_req):
                        stop(Err.NONE)

        with m.FSM(name="ctrl"):
            with state("IDLE"):
                with m.If(start_req):
                    m.d.sync += [running.eq(1), done.eq(0), err.eq(0), pc.eq(0),
                                 route_done.eq(0), exp_active.eq(0), scores_ok.eq(0)]
                    m.next = "FETCH"
            with state("FETCH"):
                with m.If(pc >= cfg.imem_depth):
                    stop(Err.PC_RANGE)
                with m.Else():
                    m.d.comb += [fetch.start.eq(1), fetch.pc.eq(pc)]
                    m.next = "FETCH_WAIT"
            with state("FETCH_WAIT"):
                with m.If(fetch.done):
                    m.d.sync += [step.eq(0), settle.eq(0)]
                    m.next = "DECODE"
            with state("DECODE"):
                with m.If(lane_busy):
                    pass                      # the lane multiplies (bit_length(y) cycles)
                with m.Elif(step != len(products) + 1):
                    with m.Switch(step):
                        for i, product in enumerate(products):
                            with m.Case(i + 1):
                                m.d.sync += product.eq(sat(lane_acc, len(product)))
                    m.d.comb += [lane.load.eq(1), lane.y.eq(st_y), lane.x.eq(st_x), lane.acc_in.eq(st_acc)]
                    m.d.sync += step.eq(step + 1)
                with m.Elif(op == Op.HALT):
                    m.d.sync += [running.eq(0), done.eq(1)]
                    m.next = "IDLE"
                with m.Elif(settle != 2):
                    m.d.sync += settle.eq(settle + 1)     # the checks register, then decode_q
                with m.Elif(decode_q != 0):
                    stop(decode_q)
                with m.Else():
                    for o, r in OP_RULES.items():
                        if r.executor:
                            with m.If(op == o):
                                m.d.sync += cur_executor.eq(1 << EXECUTORS.index(r.executor))
                    with m.Switch(op):
                        with m.Case(Op.JUMP):
                            goto_next(ins.target)
                        with m.Case(Op.REQUANT):
                            m.d.sync += [rq_width.eq(ins.width), rq_mult.eq(ins.mult),
                                         rq_shift.eq(ins.shift)]
                            m.d.sync += engine_setup(ln, 1, 1, 1, 0, 0, 0, 0, 0)
                            m.d.sync += [rq_fill.eq(0), rq_wvalid.eq(0), rq_lane.eq(0), rq_at_last.eq(ln == 1)]
                            with m.If(ins.flags & F_RQ_EXPERT):
                                m.next = "RQ_TABLE"
                            with m.Else():
                                m.next = "ENGINE"
                        with m.Case(Op.SIGMOID, Op.SITU, Op.ADD):
                            m.d.sync += engine_setup(ln, 1, 1, 1, 0, 0, 1, 0, 0)
                            m.next = "ENGINE"
                        with m.Case(Op.COMBINE):
                            m.d.sync += engine_setup(ins.k, ins.n, m_eff, ins.n, 1, p2,
                                                     1, 0, ins.k)
                            m.next = "ENGINE"
                        with m.Case(Op.NORM):
                            m.d.sync += engine_setup(ins.n, 2, m_eff, 1, 0, ins.n, 0, 0, 0)
                            m.next = "ENGINE"
                        with m.Case(Op.GEMM):
                            m.d.sync += [gm_left.eq(m_s), gm_k.eq(0), gm_lane.eq(0), gm_wvalid.eq(0),
                                         pack.eq(0), gm_addr.eq(a_), gm_wstart.eq(a_),
                                         gm_afeed_done.eq(0), gc_left.eq(m_s), gc_n.eq(0), gc_lane.eq(0),
                                         gc_last.eq(gc_last_of(m_s, 0)),
                                         gc_addr.eq(c_), gc_wstart.eq(c_)]
                            m.d.sync += [rq_width.eq(ins.width), rq_mult.eq(ins.mult),
                                         rq_shift.eq(ins.shift)]
                            with m.If(ins.flags & F_RQ_EXPERT):
                                m.next = "RQ_TABLE"
                            with m.Else():
                                m.next = "GEMM_CMD"
                        for i, name in enumerate(executors):
                            with m.Case(*[o for o, r in OP_RULES.items() if r.executor == name]):
                                m.d.comb += exec_start[i].eq(1)
                                m.d.sync += running_exec.eq(1 << i)
                                m.next = "EXEC"
                        with m.Case(Op.EXPERT):
                            m.next = "EXP_READ"

            # ---- element-wise ops through the streaming engine
            with state("RQ_TABLE"):
                m.d.comb += [rd0.addr.eq(b_ + (expert << 1)), rd1.addr.eq(b_ + (expert << 1) + 1),
                             rd0.en.eq(1), rd1.en.eq(1)]
                m.next = "RQ_TABLE2"
            with state("RQ_TABLE2"):
                m.d.sync += [rq_mult.eq(rd0.data[:cfg.mult_width]), rq_shift.eq(rd1.data[:6])]
                with m.If(run[Op.GEMM]):
                    m.next = "GEMM_CMD"
                with m.Else():
                    m.next = "ENGINE"
            with state("ENGINE"):
                m.d.comb += eng_run.eq(1)
                with m.If(out_valid):
                    m.d.comb += [wr.addr.eq(c_ + el_i), wr.data.eq(out_data), wr.en.eq(1)]
                    m.d.sync += [el_i.eq(el_i + 1), rq_at_last.eq(el_i + 2 == ln)]
                with m.If(eng_done):
                    with m.If(run[Op.SIGMOID]):
                        m.d.sync += [scores_ok.eq(1), scores_a.eq(c_), scores_len.eq(ln)]
                    goto_next()

            # ---- GEMM
            with state("GEMM_CMD"):
                m.d.comb += gemm.cmd.valid.eq(1)
                with m.If(gemm.cmd.ready):
                    m.d.comb += ctrl_rd_start.eq(1)
                    m.next = "GEMM_RUN"
            with state("GEMM_RUN"):
                m.d.comb += gemm_run.eq(1)
                with m.If(dma.error):
                    stop(Err.BUS_ERROR)
                with m.Elif(gemm.done):
                    with m.If(gemm.error):
                        stop(Err.BAD_SHAPE)
                    with m.Else():
                        m.next = "GEMM_END"
            with state("GEMM_END"):
                with m.If(~dma.rd_busy):
                    goto_next()

            # ---- an executor's instruction
            with state("EXEC"):
                with m.If(exec_done):
                    m.d.sync += running_exec.eq(0)
                    with m.If(running_exec[list(executors).index("route")]):
                        m.d.sync += [route_done.eq(1), exp_active.eq(0), scan.eq(0)]
                    with m.If(exec_error != 0):
                        stop(exec_error)
                    with m.Else():
                        goto_next()

            # ---- EXPERT: next expert with tokens
            with state("EXP_READ"):
                with m.If(scan >= E):
                    m.d.sync += [exp_active.eq(0), scan.eq(E)]
                    goto_next(ins.target)
                with m.Else():
                    m.d.comb += [rd0.addr.eq(a_ + scan), rd1.addr.eq(a_ + E + scan),
                                 rd0.en.eq(1), rd1.en.eq(1)]
                    m.next = "EXP_WAIT"
            with state("EXP_WAIT"):
                m.next = "EXP_CHECK"
            with state("EXP_CHECK"):
                m.d.sync += scan.eq(scan + 1)
                with m.If(rd0_q != 0):
                    m.d.sync += [expert.eq(scan), count.eq(rd0_q), offset.eq(sat(rd1_q[:24])),
                                 exp_active.eq(1)]
                    goto_next()
                with m.Else():
                    m.next = "EXP_READ"

            # ---- stop: drain the bus, reset the units, report
            with state("DRAIN"):
                m.d.comb += [dma.abort.eq(1), unit_rst.eq(1)]
                with m.If(~dma.rd_busy & ~dma.wr_busy):
                    m.d.sync += [running.eq(0), err.eq(stop_code), done.eq(0)]
                    m.next = "IDLE"
        with m.If(soft_req & ~running):
            m.d.sync += [err.eq(0), done.eq(0)]
            m.d.comb += unit_rst.eq(1)
        return m

