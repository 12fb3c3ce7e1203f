"""The nano-KPU top level: register bank, fetch, decode, executors and scratchpad, composed; the controller.

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

Composition
-----------
* :class:`~nanokpu.kpu.regbank.RegisterBank`: the register map, CTRL strobes, counters.
* :class:`~nanokpu.kpu.fetch.Fetch`: the instruction memory and one instruction read
  (``INSTR_WORDS`` cycles).
* :class:`~nanokpu.kpu.decode.Decode`: sizes and every check of :data:`~nanokpu.isa.OP_RULES`
  (the table :class:`~nanokpu.host.funcsim.FuncSim` reads too).
* The executors (:mod:`nanokpu.kpu.executors`), one per kind of work, each with the same
  handshake (``start``, the decoded instruction, ``done``, ``error``):
  :class:`~nanokpu.kpu.executors.loadstore.LoadStore` (``LOAD``, ``STORE``),
  :class:`~nanokpu.kpu.executors.gemm_feed.GemmFeed` (``GEMM`` on the GEMM engine),
  :class:`~nanokpu.kpu.executors.elementwise.Elementwise` (``REQUANT``, ``SIGMOID``, ``SITU``,
  ``ADD``, ``COMBINE``, ``NORM``), :class:`~nanokpu.kpu.executors.route.Route` (``ROUTE`` on the
  routing engine, then the dispatch lists), :class:`~nanokpu.kpu.executors.move.Move`
  (``GATHER``, ``SCATTER``).
* :class:`~nanokpu.kpu.spad.Scratchpad`: the data scratchpad
  (:class:`~nanokpu.kpu.dmem.DataMemory`) and the only driver of its ports, a client port per
  executor and one for the controller, the running one selected.
* The controller (here): fetch, decode, issue to an executor and retire, one instruction at a
  time; ``JUMP`` and ``EXPERT`` (the next expert with tokens, from the ``ROUTE`` table) it runs
  itself. An issued instruction is held in the issue register (the decoded fields, the host
  address and beats, the target) that the executors and the AXI4 master read, so the fetch and
  the decode are free while it runs: see `Prefetch`_.

Prefetch
--------
While an executor runs instruction ``pc``, the fetch and the decode work on ``pc + 1`` (started
in the issue cycle, when ``pc + 1 < imem_depth``). When the executor is done and the next
instruction is decoded, an executor's without error, it is latched in that cycle and started in
the next (``ISSUE``): one cycle between two executors' instructions instead of ``1 + INSTR_WORDS``
of fetch and the decode's latency; any other (``HALT``, ``JUMP``, ``EXPERT``, an error, one not
decoded yet or whose checks are settling) goes through ``DECODE``, a cycle more. Results, error
codes and the pc in ``STATUS`` are those of one instruction at a time:

* the prefetched instruction is checked when it would issue (its decode error is reported then,
  at its pc), so one never reached (an error, a stop or a soft reset before it) reports nothing;
* nothing is prefetched after ``JUMP``, ``EXPERT`` (they change the pc and the expert context)
  and ``HALT``;
* the checks follow the context they read (``ROUTE`` retired: the routing state; ``SIGMOID``:
  the scores region; a host window write) within :attr:`~nanokpu.kpu.decode.Decode.settle_latency`
  cycles, so an instruction issues only that long after the last change (the products read
  ``count`` and ``expert``, which only ``EXPERT`` changes).

Errors stop the controller (``STATUS.error``, code in ``STATUS[15:8]``, the pc in ``[31:16]``);
a stop or a soft reset (``CTRL.bit1``) drains outstanding AXI bursts, resets the decode and the
executors and returns to idle; the register bank answers throughout.
"""

from __future__ import annotations

from contextlib import contextmanager

from amaranth import Cat, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.isa import (
    ADDR_WIDTH,
    EXECUTORS,
    OP_RULES,
    Err,
    Op,
    bus_bytes,
)
from nanokpu.kpu.axi_lite import axi_lite_signature
from nanokpu.kpu.axi_master import AxiMaster, axi4_signature
from nanokpu.kpu.decode import Decode
from nanokpu.kpu.decoded import decoded_layout, widths
from nanokpu.kpu.executors.elementwise import Elementwise
from nanokpu.kpu.executors.gemm_feed import GemmFeed
from nanokpu.kpu.executors.loadstore import LoadStore
from nanokpu.kpu.executors.move import Move
from nanokpu.kpu.executors.route import Route
from nanokpu.kpu.fetch import Fetch
from nanokpu.kpu.regbank import PC_WIDTH, RegisterBank
from nanokpu.kpu.spad import Scratchpad
from nanokpu.units.router import TopKRouter

__all__ = ["NanoKPU"]

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
    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        E, BW = cfg.n_experts, bus_bytes(cfg)

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
        router = unit("router", TopKRouter(cfg))
        ldst = unit("loadstore", LoadStore(cfg))
        gfeed = unit("gemm", GemmFeed(cfg))
        elem = unit("elementwise", Elementwise(cfg))
        route = unit("route", Route(cfg, router.route_layout))
        move = unit("move", Move(cfg))
        wiring.connect(m, elem.rq, gfeed.rq)
        wiring.connect(m, route.scores, router.scores)
        wiring.connect(m, router.routes, route.routes)
        m.d.comb += [router.bias_we.eq(route.bias.we), router.bias_addr.eq(route.bias.addr),
                     router.bias_data.eq(route.bias.data)]
        executors = (ldst, gfeed, elem, route, move)
        # the executor of each isa.EXECUTORS name (its busy counter's)
        executor_of = {"dma": ldst, "gemm": gfeed, "act": elem, "vector": elem, "route": route, "move": move}
        assert set(executor_of) == set(EXECUTORS)
        # the scratchpad's clients: the controller's own states (client 0), then each executor,
        # selected while its instruction runs
        m.submodules.spad = spad = Scratchpad(cfg, 1 + len(executors))
        running_exec = Signal(len(executors))
        m.d.comb += spad.select.eq(Cat(~running_exec.any(), running_exec))
        for i, ex in enumerate(executors):
            wiring.connect(m, ex.spad, spad.clients[1 + i])
        ctrl_spad = spad.clients[0]
        rd0, rd1 = ctrl_spad.rd0, ctrl_spad.rd1    # EXPERT's table reads (after the decode, never a write)

        # -- architectural state: the controller's, and what the decode checks against -----------
        AW, SW = widths(cfg).aw, widths(cfg).sw
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

        # -- decode --------------------------------------------------------------------------
        decode = unit("decode", Decode(cfg))
        dec = decode.decoded
        op = ins.op
        m.d.comb += [decode.ins.eq(ins), decode.start.eq(fetch.done)]
        m.d.comb += [decode.context.route_done.eq(route_done), decode.context.exp_active.eq(exp_active),
                     decode.context.expert.eq(expert), decode.context.count.eq(count),
                     decode.context.offset.eq(offset), decode.context.scores_ok.eq(scores_ok),
                     decode.context.scores_a.eq(scores_a), decode.context.scores_len.eq(scores_len),
                     decode.context.host_base.eq(host_base), decode.context.host_size.eq(host_size)]

        # -- the issue register: the instruction issued (an executor's, EXPERT's), as decoded -------
        w = widths(cfg)
        cur = Signal(data.StructLayout({"ins": decoded_layout(cfg), "host": w.hw, "beats": w.lbw - w.bw_log,
                                        "target": len(ins.target)}))

        # -- executors: the issued instruction, the AXI4 master shared -----------------------------
        exec_start = Signal(len(executors))
        exec_done = Signal()
        exec_error = Signal(8)
        for i, ex in enumerate(executors):
            m.d.comb += [ex.ins.eq(cur.ins), ex.start.eq(exec_start[i])]
            with m.If(running_exec[i]):
                m.d.comb += [exec_done.eq(ex.done), exec_error.eq(ex.error)]
        # the AXI4 master's two users: each drives its strobes and handshakes only while it runs
        users = (ldst.dma, gfeed.dma)
        m.d.comb += [
            dma.rd_start.eq(Cat(u.rd_start for u in users).any()), dma.wr_start.eq(ldst.dma.wr_start),
            dma.rd_data.ready.eq(Cat(u.rd_data.ready for u in users).any()),
            dma.wr_data.valid.eq(ldst.dma.wr_data.valid), dma.wr_data.payload.eq(ldst.dma.wr_data.payload),
            ldst.dma.wr_data.ready.eq(dma.wr_data.ready),
        ]
        for u in users:
            m.d.comb += [u.rd_data.valid.eq(dma.rd_data.valid), u.rd_data.payload.eq(dma.rd_data.payload),
                         u.rd_busy.eq(dma.rd_busy), u.wr_busy.eq(dma.wr_busy), u.error.eq(dma.error)]

        # -- controller -----------------------------------------------------------------------------
        stop_code = Signal(8)
        m.d.comb += dma.rd_addr.eq(cur.host), dma.wr_addr.eq(cur.host)   # in the window: < 2**32
        m.d.comb += [dma.rd_beats.eq(cur.beats), dma.wr_beats.eq(cur.beats)]
        pf_ready = Signal()     # decode.done came while the instruction before ran, or while settling
        # cycles until the decode's error follows the last context change (see Prefetch above)
        settle = Signal(range(Decode.settle_latency + 1))
        with m.If(bank.window_wr):
            m.d.sync += settle.eq(Decode.settle_latency)
        with m.Elif(settle != 0):
            m.d.sync += settle.eq(settle - 1)

        def goto_next(target=None, next_state="FETCH"):
            m.d.comb += retire.eq(1)
            m.d.sync += [pc.eq(pc + 1 if target is None else target), cur_executor.eq(0)]
            m.next = next_state

        def stop(code):
            m.d.sync += [stop_code.eq(code), cur_executor.eq(0)]
            m.next = "DRAIN"

        rd0_q, rd1_q = Signal.like(rd0.data), Signal.like(rd1.data)   # EXPERT's table words, registered
        m.d.sync += [rd0_q.eq(rd0.data), rd1_q.eq(rd1.data)]

        exec_ops = [[o for o, r in OP_RULES.items() if r.executor and executor_of[r.executor] is ex]
                    for ex in executors]
        assert {o for o, r in OP_RULES.items() if not r.executor} == {Op.HALT, Op.JUMP, Op.EXPERT}

        def latch():
            """The decoded instruction into the issue register (from the next cycle on)."""
            m.d.sync += [cur.ins.eq(dec), cur.host.eq(decode.host), cur.beats.eq(decode.beats),
                         cur.target.eq(ins.target)]

        def issue():
            """The decoded instruction, an executor's, latched to start next cycle (the caller
            goes to ISSUE)."""
            latch()
            with m.Switch(op):
                for i, ops in enumerate(exec_ops):
                    with m.Case(*ops):
                        m.d.sync += running_exec.eq(1 << i)

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
                    m.d.sync += pf_ready.eq(0)      # a prefetch discarded
                    m.next = "FETCH_WAIT"
            with state("FETCH_WAIT"):
                with m.If(fetch.done):      # the decode starts
                    m.next = "DECODE"
            with state("DECODE"):           # instruction pc decoded (or prefetched): checked, latched
                ready = decode.done | pf_ready
                m.d.sync += pf_ready.eq(0)
                with m.If(~ready | (settle != 0)):
                    m.d.sync += pf_ready.eq(ready)      # a done that came while the checks settle
                with m.Elif(op == Op.HALT):
                    m.d.sync += [running.eq(0), done.eq(1)]
                    m.next = "IDLE"
                with m.Elif(decode.error != 0):
                    stop(decode.error)
                with m.Elif(op == Op.JUMP):
                    goto_next(ins.target)
                with m.Elif(op == Op.EXPERT):
                    latch()
                    m.next = "EXP_READ"
                with m.Else():
                    issue()
                    m.next = "ISSUE"

            # ---- an executor's instruction: started from the issue register, pc + 1 prefetched
            with state("ISSUE"):
                m.d.comb += exec_start.eq(running_exec)
                for o, r in OP_RULES.items():
                    if r.executor:
                        with m.If(cur.ins.op == o):
                            m.d.sync += cur_executor.eq(1 << EXECUTORS.index(r.executor))
                with m.If(pc < cfg.imem_depth - 1):
                    m.d.comb += [fetch.start.eq(1), fetch.pc.eq(pc + 1)]
                m.next = "EXEC"
            with state("EXEC"):
                with m.If(decode.done):
                    m.d.sync += pf_ready.eq(1)
                with m.If(exec_done):
                    m.d.sync += running_exec.eq(0)
                    # the context the decode checks later instructions against (their checks settle)
                    route_ran = running_exec[executors.index(route)]
                    scores_written = cur.ins.op == Op.SIGMOID
                    with m.If(route_ran):
                        m.d.sync += [route_done.eq(1), exp_active.eq(0), scan.eq(0)]
                    with m.If(scores_written):
                        m.d.sync += [scores_ok.eq(1), scores_a.eq(cur.ins.c), scores_len.eq(cur.ins.len)]
                    with m.If(route_ran | scores_written):
                        m.d.sync += settle.eq(Decode.settle_latency)
                    prefetched_ok = ((decode.done | pf_ready) & (settle == 0) & ~route_ran & ~scores_written
                                     & (decode.error == 0) & Cat(op == o for ops in exec_ops for o in ops).any())
                    with m.If(exec_error != 0):
                        stop(exec_error)
                    with m.Elif(pc >= cfg.imem_depth - 1):    # nothing prefetched
                        goto_next()
                    with m.Elif(prefetched_ok):     # an executor's, checked against this context: at once
                        goto_next(next_state="ISSUE")
                        m.d.sync += pf_ready.eq(0)
                        issue()
                    with m.Else():                  # HALT, JUMP, EXPERT, an error, not decoded yet
                        goto_next(next_state="DECODE")

            # ---- EXPERT: next expert with tokens
            with state("EXP_READ"):
                with m.If(scan >= E):
                    m.d.sync += [exp_active.eq(0), scan.eq(E)]
                    goto_next(cur.target)
                with m.Else():
                    m.d.comb += [rd0.addr.eq(cur.ins.a + scan), rd1.addr.eq(cur.ins.a + E + scan),
                                 rd0.en.eq(1), rd1.en.eq(1)]
                    m.next = "EXP_WAIT"
            with state("EXP_WAIT"):
                m.next = "EXP_CHECK"
            with state("EXP_CHECK"):
                m.d.sync += scan.eq(scan + 1)
                with m.If(rd0_q != 0):
                    offset_sat = Mux(rd1_q[SW:24].any(), (1 << SW) - 1, rd1_q[:SW])    # 24 bits, saturated
                    m.d.sync += [expert.eq(scan), count.eq(rd0_q), offset.eq(offset_sat), exp_active.eq(1)]
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

