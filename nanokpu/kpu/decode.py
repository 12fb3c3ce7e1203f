"""The decode: an instruction's sizes (products of its fields) and every check the ISA makes
before an executor runs it (:data:`~nanokpu.isa.OP_RULES`, the table FuncSim reads too)."""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.isa import (
    F_B_SPAD,
    F_B_T,
    F_EPS,
    F_HOST_EXPERT,
    F_M_COUNT,
    F_RQ_CHANNEL,
    F_RQ_EXPERT,
    INSTR_LAYOUT,
    OP_RULES,
    RQ_WIDTHS,
    Err,
    Op,
    built_ops,
    bus_bytes,
)
from nanokpu.kpu.decoded import decoded_layout, widths
from nanokpu.units.shift_add import ShiftAddMultiplier, times_const

__all__ = ["Decode", "PRODUCT_STEPS", "context_layout"]

#: Products of instruction fields the decode computes, one after the other on one shift-add
#: lane: a step takes ``1 + bit_length(y)`` cycles (1 when the op leaves it unused), and one
#: more cycle commits the last.
PRODUCT_STEPS = 6


def context_layout(cfg: KpuConfig) -> data.StructLayout:
    """What the decode checks an instruction against besides its fields: whether a ``ROUTE``
    ran (``route_done``) and an ``EXPERT`` picked an expert (``exp_active``: its number
    ``expert``, ``count`` of tokens and list ``offset``), the scores region the last
    ``SIGMOID`` wrote (``scores_ok``, ``scores_a``, ``scores_len``), and the host window."""
    w = widths(cfg)
    return data.StructLayout({"route_done": 1, "exp_active": 1, "expert": 16, "count": 16, "offset": w.sw,
                              "scores_ok": 1, "scores_a": w.aw, "scores_len": w.sw,
                              "host_base": 32, "host_size": 32})


class Decode(wiring.Component):
    """Sizes and checks of the instruction in ``ins``.

    Members
    -------
    start : In(1)
        ``ins`` holds the next instruction from the next cycle on (until the next ``start``).
    ins : In(INSTR_LAYOUT)
    context : In(context_layout(cfg))
        ``count`` and ``expert`` stable from ``start`` while the outputs are used (the products
        and ``decoded`` read them); the other fields may change after ``done``: see
        :attr:`settle_latency`.
    done : Out(1)
        One cycle: ``error`` (an :class:`~nanokpu.isa.Err`; ``NONE``: the instruction may run)
        and ``decoded``, ``host``, ``beats`` are valid, and stay so until the next ``start``.
        For ``HALT`` ``done`` comes without the checks (``error`` is not meaningful).
    error : Out(8)
    decoded : Out(decoded_layout(cfg))
    host : Out(33)
        The host byte address of a ``LOAD``/``STORE``/``GEMM`` (``host + expert * stride`` with
        :data:`~nanokpu.isa.F_HOST_EXPERT`).
    beats : Out(...)
        Its bus beats.

    Latency: :attr:`min_latency` plus ``bit_length(y)`` for each of the :data:`PRODUCT_STEPS`
    products on one shift-add lane (``y`` its multiplier, 0 when the op leaves it unused).
    """

    #: Cycles after which ``error`` follows a change of the context (other than ``count`` and
    #: ``expert``) once ``done`` came: the checks are re-evaluated every cycle, registered, then
    #: the error registered. A change seen on ``context`` in cycle ``t`` shows in ``error`` from
    #: cycle ``t + settle_latency`` on.
    settle_latency = 2

    #: Cycles from ``start`` to ``done`` when every product's multiplier is 0 (``JUMP``, a bad
    #: opcode; ``HALT``: 2 fewer, no checks): the first step loaded, a cycle per step, the last
    #: committed, two for the checks to register.
    min_latency = 1 + PRODUCT_STEPS + 1 + 2

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        w = widths(cfg)
        super().__init__({
            "start": In(1), "ins": In(INSTR_LAYOUT), "context": In(context_layout(cfg)),
            "done": Out(1), "error": Out(8), "decoded": Out(decoded_layout(cfg)),
            "host": Out(w.hw), "beats": Out(w.lbw - w.bw_log),
        })

    def elaborate(self, platform):  # noqa: C901 - one table of rules, one place
        m = Module()
        cfg, ins, ctx = self.cfg, self.ins, self.context
        E, top_k, R, C = cfg.n_experts, cfg.top_k, cfg.rows, cfg.cols
        BW, D = bus_bytes(cfg), cfg.dmem_depth
        AW, SW, HW, LBW, BW_LOG = widths(cfg)
        count, offset, expert = ctx.count, ctx.offset, ctx.expert
        host_base, host_size = ctx.host_base, ctx.host_size

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
        #   mk = m*k ("m*k"), count*n ("count*n"), 4*m*top_k ("route": the table is mk + 2*E),
        #   (m-k+1)*n ("(m-k+1)*n": CONV's result, k <= m checked);
        #   p2 = k*n ("m*k*n", "k*n"), (k+m)*n ("(k+m)*n"), ceil(m/rows)*k (engine), then row*n for each
        #   GATHER/SCATTER row;
        #   p3 = m*(k*n) ("m*k*n": p2 as it is committed), ceil(m/rows)*n (engine);
        #   l4 = host bytes, in whole beats: ceil(n/cols)*(k*BW) ("panels"; n*k with F_B_SPAD), BW-1 + m*(n*width)
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

        # the lane's operands at step s (products above saturate like the lane: x need not)
        st_y = Signal(16)
        st_x = Signal(PW)
        st_acc = Signal(PW)
        mb = ceil_div(m_eff, R)
        # F_B_SPAD on an op that may take it (GEMM): B from the scratchpad, n*k words, no host access
        b_flag = (ins.flags & F_B_SPAD) != 0
        b_on = Signal()
        if cfg.layer_ops:
            m.d.comb += b_on.eq(b_flag & Cat(Const(0), *(op == o for o, r in OP_RULES.items()
                                                          if r.b_spad and o in built_ops(cfg))).any())

        # the rules of the built ops only: any other opcode is BAD_OPCODE before its rules matter
        rules = {o: r for o, r in OP_RULES.items() if o in built_ops(cfg)}

        def ops_with(key):
            """The opcodes whose OP_RULES name the size ``key`` (or have the GEMM ``"engine"`` rule)."""
            return [o for o, r in rules.items()
                    if (r.engine if key == "engine" else key in (r.a, r.b, r.c, r.host))]

        # the lane's operands (y, x, acc) at each step for the ops naming a size (or with the engine
        # rule), one product per op and step; the sizes' signals below are these products
        width_log = Mux(ins.width == 4, 2, Mux(ins.width == 2, 1, 0))
        assert all(set(r.widths) <= {1, 2, 4} for r in OP_RULES.values() if r.host == "m*n*width"), \
            "host elements of 1, 2 or 4 bytes (width_log)"
        schedule = {
            0: {"m*n": (m_eff, ins.n, 0), "m*n*k": (m_eff, ins.n, 0)},        # m*n*k: ln first
            1: {"m*k": (m_eff, ins.k, 0), "count*n": (count, ins.n, 0), "route": (m_eff, 4 * top_k, 0),
                "(m-k+1)*n": (m_eff - ins.k + 1, ins.n, 0), "m*n*k": (ins.k, sat(lane_acc), 0)},
            2: {"m*k*n": (ins.k, ins.n, 0), "engine": (mb, ins.k, 0), "k*n": (ins.k, ins.n, 0),
                "n*k*k": (ins.k, ins.k, 0), "(k+m)*n": (ins.n, ins.k + m_eff, 0)},
            3: {"m*k*n": (m_eff, sat(lane_acc), 0), "engine": (mb, ins.n, 0),   # m*k*n: p2, committed now
                "n*k*k": (ins.n, sat(lane_acc), 0)},
            4: {"panels": (Mux(b_on, ins.n, ceil_div(ins.n, C)), Mux(b_on, ins.k, ins.k << BW_LOG), 0),   # or n*k
                "m*n*width": (m_eff, ins.n << width_log, BW - 1), "m*n*(4k+1)": ((ins.k << 2) + 1, ln, 0)},
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
            return Cat(Const(0), *(op == o for o, r in rules.items() if pred(r))).any()

        needs_expert = ((ins.flags & (F_M_COUNT | F_HOST_EXPERT | F_RQ_EXPERT)) != 0) | any_op(lambda r: r.expert)
        needs_route = needs_expert | any_op(lambda r: r.route)
        valid_op = Cat(Const(0), *(op == o for o in built_ops(cfg))).any()
        letters = {"m": m_eff, "n": ins.n, "k": ins.k}

        def shape_rule(r):
            """The shape rules of ``r``: letters >= 1, n = n_experts, k = top_k, n <= attnres_candidates,
            width, the GEMM engine's limits."""
            terms = [letters[x] >= 1 for x in r.positive]
            terms += [ins.n == E] if r.n_experts else []
            terms += [ins.k == top_k] if r.top_k else []
            terms += [ins.n <= cfg.attnres_candidates] if r.softmax_row else []
            if r.widths:
                terms.append(Cat(*((ins.width >= 2) & (ins.width <= cfg.acc_width) if w == RQ_WIDTHS else ins.width == w
                                   for w in r.widths)).any())
            if r.engine:
                terms += [ins.k <= cfg.spad_b_depth // 2, p2 <= cfg.spad_a_depth, p3 <= cfg.spad_c_depth]
            if r.taps:
                terms.append(ins.k <= m_eff)
            terms += [ins.k == cfg.kda_head_dim] if r.head_dim else []
            terms += [m_eff <= ins.k, ins.k <= cfg.mla_max_tokens, ins.n <= cfg.v_head_dim] if r.keys else []
            if r.layer_flags and not cfg.layer_ops:   # (OpRule.layer_flags_ok)
                terms.append((ins.flags & r.layer_flags) == 0)
            if r.b_spad:   # (OpRule.b_spad_ok)
                others = (ins.flags & (F_RQ_EXPERT | F_RQ_CHANNEL | F_HOST_EXPERT)) == 0
                terms += [~b_flag | (others if cfg.layer_ops else Const(0)), b_flag | ((ins.flags & F_B_T) == 0)]
            return Cat(*terms).all() if terms else Const(1)

        shape_ok = Signal()
        with m.Switch(op):
            for o, r in rules.items():
                with m.Case(o):
                    m.d.comb += shape_ok.eq(shape_rule(r))
        # scratchpad regions: (base, words) for the a, b and c operands, words = 0 when unused; the
        # signal of each size OP_RULES names (the products of the lane's schedule above: mk is
        # m*k, count*n or 4*m*top_k, whichever the op names, the schedule allows one)
        wa = Signal(SW)
        wb = Signal(SW)
        wc = Signal(SW)
        sizes = {
            "m*n": ln, "m*k": mk, "count*n": mk, "(m-k+1)*n": mk, "k*n": p2, "(k+m)*n": p2, "m*n*k": mk, "n*k*k": p3,
            "m*n*(4k+1)": sat(l4), "route": sat(mk + 2 * E), "m*k*n": p3,
            "n": sat(ins.n), "2*n": sat(ins.n << 1), "2*m*n": sat(ln << 1), "4*m*n": sat(ln << 2),
            "list": sat(offset + count),
        }
        sizes["rq"] = Mux(ins.flags & F_RQ_CHANNEL,
                          sat(Mux(ins.flags & F_RQ_EXPERT, times_const(ins.n, 2 * E), ins.n << 1)),
                          Mux(ins.flags & F_RQ_EXPERT, min(2 * E, (1 << SW) - 1), 0))
        sizes["gemm_b"] = Mux(b_on, sat(l4), sizes["rq"])   # step 4: n*k with F_B_SPAD
        sizes["eps"] = (ins.flags & F_EPS) != 0
        host_sizes = schedule[4].keys()     # l4 (nbytes): the lane's step 4
        missing = {name for r in OP_RULES.values() for name in (r.a, r.b, r.c) if name} - sizes.keys()
        missing |= {r.host for r in OP_RULES.values() if r.host} - host_sizes
        assert not missing, f"OP_RULES names sizes without a signal in the decode: {sorted(missing)}"
        regions = {}
        for o, r in rules.items():
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
        # an op that writes a too (KDA_STEP's state): a must not overlap b
        a_on_b = any_op(lambda r: r.a_written) & (wa != 0) & (wb != 0) & (ins.a[:SW] < ins.b[:SW] + wb) \
            & (ins.b[:SW] < ins.a[:SW] + wa)
        m.d.sync += [shape_q.eq(shape_ok), overlap_q.eq(overlaps(ins.a, wa) | overlaps(ins.b, wb) | a_on_b),
                     spad_ok.eq(region_ok(ins.a, wa) & region_ok(ins.b, wb) & region_ok(ins.c, wc)),
                     host_ok.eq((host_eff[:BW_LOG] == 0) & (host_eff >= host_base)
                                & (host_eff + nbytes <= host_base + host_size))]
        uses_host = any_op(lambda r: r.host) & ~b_on
        target_ok = ins.target < cfg.imem_depth
        decode_err = Signal(8)
        # (an op without rules, JUMP, passes the shape, region, overlap and host checks)
        with m.If(~valid_op):
            m.d.comb += decode_err.eq(Err.BAD_OPCODE)
        with m.Elif((needs_route & ~ctx.route_done) | (needs_expert & ~ctx.exp_active)):
            m.d.comb += decode_err.eq(Err.NO_ROUTE)
        with m.Elif(any_op(lambda r: r.target) & ~target_ok):
            m.d.comb += decode_err.eq(Err.PC_RANGE)
        with m.Elif(~shape_q):
            m.d.comb += decode_err.eq(Err.BAD_SHAPE)
        with m.Elif(any_op(lambda r: r.scores) & ~(ctx.scores_ok & (ins.a[AW:] == 0) & (ctx.scores_a == a_)
                                                   & (ctx.scores_len == ln))):
            m.d.comb += decode_err.eq(Err.NO_SCORES)
        with m.Elif(~spad_ok):
            m.d.comb += decode_err.eq(Err.SPAD_RANGE)
        with m.Elif(overlap_q):
            m.d.comb += decode_err.eq(Err.OVERLAP)
        with m.Elif(uses_host & ~host_ok):
            m.d.comb += decode_err.eq(Err.HOST_RANGE)
        decode_q = Signal(8)
        m.d.sync += decode_q.eq(decode_err)


        # the sequence: each step commits the previous step's product and loads the lane with
        # this one's operands; then the checks settle (registered twice)
        active = Signal()
        with m.If(self.start):
            m.d.sync += [active.eq(1), step.eq(0), settle.eq(0)]
        with m.Elif(active & ~lane_busy):
            with m.If(step != len(products) + 1):
                with m.Switch(step):
                    for i, product in enumerate(products):
                        with m.Case(i + 1):
                            m.d.sync += product.eq(sat(lane_acc, len(product)))
                m.d.comb += [lane.load.eq(1), lane.y.eq(st_y), lane.x.eq(st_x), lane.acc_in.eq(st_acc)]
                m.d.sync += step.eq(step + 1)
            with m.Elif((op == Op.HALT) | (settle == 2)):
                m.d.comb += self.done.eq(1)
                m.d.sync += active.eq(0)
            with m.Else():
                m.d.sync += settle.eq(settle + 1)     # the checks register, then decode_q
        d = self.decoded
        m.d.comb += [self.error.eq(decode_q), self.host.eq(host_eff), self.beats.eq(beats),
                     d.op.eq(op), d.flags.eq(ins.flags), d.width.eq(ins.width), d.a.eq(a_), d.b.eq(b_),
                     d.c.eq(c_), d.m.eq(m_eff), d.n.eq(ins.n), d.k.eq(ins.k), d.len.eq(ln), d.p2.eq(p2),
                     d.mult.eq(ins.mult), d.shift.eq(ins.shift), d.expert.eq(expert), d.count.eq(count),
                     d.offset.eq(offset)]
        return m
