"""The element-wise and GEMM executors alone (Amaranth simulator), the GEMM executor lending its
engine's requantiser to REQUANT: every element-wise op and GEMM (requantised and raw) against
FuncSim on the same scratchpad, bit for bit, under random bus stalls, with either scratchpad build
(ECP5's one write port: a cycle that performs a write performs no read); saturation and ties
included (extreme operands, REQUANT to 2 bits)."""

import numpy as np
import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from nanokpu.config import profile
from nanokpu.host.funcsim import FuncSim
from nanokpu.isa import F_RQ_CHANNEL, F_RQ_EXPERT, Err, Instr, Op, bus_bytes, weight_panels
from nanokpu.kpu.executors.elementwise import Elementwise
from nanokpu.kpu.executors.gemm_feed import GemmFeed
from sim.lib.executor_model import run_instruction, serve_scratchpad

CFG = profile("tiny")
BW = bus_bytes(CFG)


class _Pair(Elaboratable):
    def __init__(self):
        self.gemm = GemmFeed(CFG)
        self.elem = Elementwise(CFG)

    def elaborate(self, platform):
        m = Module()
        m.submodules.gemm, m.submodules.elem = self.gemm, self.elem
        wiring.connect(m, self.elem.rq, self.gemm.rq)
        return m


def _run(ins: Instr, spad_init: dict, host: bytes = b"", one_write_port=False, stall=0.3, seed=0, expert=None):
    """Run ``ins`` on its executor and on FuncSim (``expert``: the current expert, as after a
    ``ROUTE`` and ``EXPERT``); returns (RTL scratchpad, FuncSim's, error, cycles from start to
    done)."""
    ref = FuncSim(CFG, host=host)
    for addr, v in spad_init.items():
        ref.spad[addr] = v
    if expert is None:
        res = ref.run([ins, Instr(Op.HALT)])
        assert res.error == Err.NONE, res
    else:
        ref.run([Instr(Op.HALT)])        # the state of a run, then the expert iterator's
        ref.route_done, ref.expert, ref.count = True, expert, ins.m
        ref.step(ins, Op(ins.op), 0)

    dut = _Pair()
    ex = dut.gemm if ins.op == Op.GEMM else dut.elem
    rng = np.random.default_rng(seed)
    spad = dict(spad_init)
    out = {}
    beats = [int.from_bytes(host[i:i + BW], "little") for i in range(ins.host, len(host), BW)]

    async def scratchpad(ctx):
        await serve_scratchpad(ctx, ex.spad, spad, one_write_port)

    async def bus(ctx):
        if ins.op != Op.GEMM:
            return
        d = dut.gemm.dma
        async for _c, _r, start in ctx.tick().sample(d.rd_start):
            if start:
                break
        ctx.set(d.rd_busy, 1)
        sent = 0
        while sent < len(beats):
            ctx.set(d.rd_data.valid, int(rng.random() >= stall))
            ctx.set(d.rd_data.payload, beats[sent])
            _c, _r, v, r = await ctx.tick().sample(d.rd_data.valid, d.rd_data.ready)
            sent += v and r
        ctx.set(d.rd_data.valid, 0)
        ctx.set(d.rd_busy, 0)

    async def controller(ctx):
        m, n, k = ins.m, ins.n, ins.k
        out.update(await run_instruction(ctx, ex, {
            "op": ins.op, "flags": ins.flags, "width": ins.width, "a": ins.a, "b": ins.b, "c": ins.c,
            "m": m, "n": n, "k": k, "len": m * n, "p2": k * n, "mult": ins.mult, "shift": ins.shift,
            "expert": expert or 0},
            limit=50_000))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(scratchpad)
    sim.add_process(bus)
    sim.add_testbench(controller)
    sim.run()
    addrs = sorted(set(spad) | {i for i in range(len(ref.spad)) if ref.spad[i] != 0})
    got = {i: spad.get(i, 0) for i in addrs}
    want = {i: int(ref.spad[i]) for i in addrs}
    return got, want, out["error"], out["cycles"]


def _act(rng, size, extremes=True):
    lo, hi = -(1 << (CFG.act_width - 1)), (1 << (CFG.act_width - 1)) - 1
    v = rng.integers(lo, hi + 1, size) >> rng.integers(0, CFG.act_width, size)
    if extremes:
        v[:2] = [lo, hi]
    return v


def _cases(rng):
    """(name, instruction, scratchpad) for every element-wise op."""
    n, m, k = 6, 3, CFG.top_k
    a, b, c = 16, 160, 320
    acc = rng.integers(-(1 << 31), 1 << 31, m * n)
    acc[:4] = [-(1 << 31), (1 << 31) - 1, 2, -2]            # extremes; ties at shift 2 with mult 1
    w = rng.integers(0, (1 << CFG.weight_frac) + 1, m * k)
    return [
        ("requant", Instr(Op.REQUANT, m=m, n=n, a=a, c=c, mult=40503, shift=20, width=8), acc),
        ("requant-2bit-ties", Instr(Op.REQUANT, m=m, n=n, a=a, c=c, mult=1, shift=2, width=2), acc),
        ("sigmoid", Instr(Op.SIGMOID, m=m, n=n, a=a, c=c), _act(rng, m * n)),
        ("situ", Instr(Op.SITU, m=m, n=n, a=a, b=b, c=c), (_act(rng, m * n), _act(rng, m * n))),
        ("add", Instr(Op.ADD, m=m, n=n, a=a, b=b, c=c), (_act(rng, m * n), _act(rng, m * n))),
        ("combine", Instr(Op.COMBINE, m=m, n=n, k=k, a=a, b=b, c=c), (_act(rng, m * k * n), w)),
        ("norm", Instr(Op.NORM, m=m, n=n, a=a, c=c), _act(rng, m * n, extremes=False)),
    ]


@pytest.mark.parametrize("one_write_port", [False, True])
def test_elementwise_ops_match_funcsim(one_write_port):
    rng = np.random.default_rng(5)
    for name, ins, data in _cases(rng):
        first, second = data if isinstance(data, tuple) else (data, None)
        spad = {ins.a + i: int(v) for i, v in enumerate(first)}
        if second is not None:
            spad |= {ins.b + i: int(v) for i, v in enumerate(second)}
        got, want, err, _ = _run(ins, spad, one_write_port=one_write_port, seed=len(name))
        assert got == want and err == Err.NONE, name


@pytest.mark.parametrize("width", [0, 8, 16])
@pytest.mark.parametrize("shape", [(5, 7, 6), (1, 3, 9), (4, 16, 4)])
def test_gemm_matches_funcsim(width, shape):
    m, k, n = shape
    rng = np.random.default_rng(m * 100 + k * 10 + n + width)
    A = rng.integers(-128, 128, (m, k))
    W = rng.integers(-128, 128, (n, k))
    A[0, 0], W[0, 0] = -128, -128
    host = weight_panels(W, CFG).astype(np.int8).tobytes()
    ins = Instr(Op.GEMM, m=m, k=k, n=n, a=8, c=400, host=0, mult=20000, shift=12, width=width)
    got, want, err, _ = _run(ins, {8 + i: int(v) for i, v in enumerate(A.ravel())}, host,
                          one_write_port=width == 8, seed=width)
    assert got == want and err == Err.NONE, (shape, width)


@pytest.mark.parametrize("op", [Op.REQUANT, Op.SIGMOID, Op.SITU, Op.ADD])
def test_streaming_ops_take_one_cycle_per_element(op):
    """Each element more costs exactly one cycle (REQUANT too: its requantiser runs on while a
    result word is written back), results still FuncSim's."""
    rng = np.random.default_rng(int(op))
    cycles = []
    for n in (24, 72):
        ins = Instr(op, m=1, n=n, a=16, b=160, c=320, mult=40503, shift=20, width=8)
        first = rng.integers(-(1 << 31), 1 << 31, n) if op == Op.REQUANT else _act(rng, n)
        spad = {ins.a + i: int(v) for i, v in enumerate(first)}
        spad |= {ins.b + i: int(v) for i, v in enumerate(_act(rng, n))}
        got, want, err, c = _run(ins, spad)
        assert got == want and err == Err.NONE, (op, n)
        cycles.append(c)
    assert cycles[1] - cycles[0] == 72 - 24, (op, cycles)


@pytest.mark.parametrize("m", [1, 2, 4])
def test_gemm_a_feed_takes_m_cycles_per_word(m):
    """A word of A costs its M real rows' reads and nothing more (the feed reads ahead of the
    engine): 16 more columns of A are 16*M more cycles (one tile, no bus stalls), results
    still FuncSim's. Waiting for the engine to take each word before reading the next costs
    M + 2 per word (the test fails with 48, 64, 96)."""
    cycles = []
    for k in (16, 32):
        rng = np.random.default_rng(m * 100 + k)
        A = rng.integers(-128, 128, (m, k))
        W = rng.integers(-128, 128, (CFG.cols, k))
        host = weight_panels(W, CFG).astype(np.int8).tobytes()
        ins = Instr(Op.GEMM, m=m, k=k, n=CFG.cols, a=8, c=400, host=0, mult=20000, shift=12, width=8)
        got, want, err, c = _run(ins, {8 + i: int(v) for i, v in enumerate(A.ravel())}, host, stall=0)
        assert got == want and err == Err.NONE, (m, k)
        cycles.append(c)
    assert cycles[1] - cycles[0] == 16 * m, (m, cycles)


@pytest.mark.parametrize("flags, expert", [(F_RQ_CHANNEL, None), (F_RQ_CHANNEL | F_RQ_EXPERT, 5)],
                         ids=["channel", "channel-expert"])
@pytest.mark.parametrize("width", [0, 8, 24])
@pytest.mark.parametrize("shape", [(5, 7, 6), (1, 3, 9), (4, 2, 16)])
def test_gemm_per_column_matches_funcsim(shape, width, flags, expert):
    """F_RQ_CHANNEL: a (mult, shift) per column from the table at b (per expert with
    F_RQ_EXPERT), random per column with the extremes (mult 0, 1 and 2**16 - 1, shift 0 and
    63) and garbage above the bits taken; k = 2 makes the compute shorter than the table copy
    (the store waits for it); width 0 ignores the table."""
    m, k, n = shape
    seed = m * 100 + k * 10 + n + width + flags
    rng = np.random.default_rng(seed)
    A = rng.integers(-128, 128, (m, k))
    W = rng.integers(-128, 128, (n, k))
    A[0, 0], W[0, 0] = -128, -128
    E = CFG.n_experts if flags & F_RQ_EXPERT else 1
    mult = rng.integers(0, 1 << CFG.mult_width, (n, E))
    shift = rng.integers(0, 64, (n, E))
    mult[:3, :], shift[:3, :] = np.array([[0], [1], [(1 << CFG.mult_width) - 1]]), np.array([[63], [0], [20]])
    shift[3:, :] = np.minimum(shift[3:, :], 24)         # mostly shifts that leave something
    table = np.stack([mult | rng.integers(0, 1 << 8, (n, E)) << CFG.mult_width,
                      shift | rng.integers(0, 1 << 8, (n, E)) << 6], axis=-1).ravel()
    host = weight_panels(W, CFG).astype(np.int8).tobytes()
    ins = Instr(Op.GEMM, flags=flags, m=m, k=k, n=n, a=8, b=600, c=400, host=0, mult=20000, shift=12, width=width)
    spad = {8 + i: int(v) for i, v in enumerate(A.ravel())} | {600 + i: int(v) for i, v in enumerate(table)}
    got, want, err, _ = _run(ins, spad, host, one_write_port=width == 8, seed=seed, expert=expert)
    assert got == want and err == Err.NONE, (shape, width)
