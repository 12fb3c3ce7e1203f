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

from golden import intops as I
from golden.intops import sigmoid_q
from nanokpu.config import profile
from nanokpu.host.funcsim import FuncSim
from nanokpu.isa import (
    F_ACC,
    F_B_SPAD,
    F_B_T,
    F_EPS,
    F_L2,
    F_RQ_CHANNEL,
    F_RQ_EXPERT,
    Err,
    Instr,
    Op,
    bus_bytes,
    kda_vectors,
    weight_panels,
)
from nanokpu.kpu.dmem import banks
from nanokpu.kpu.executors.elementwise import Elementwise
from nanokpu.kpu.executors.gemm_feed import GemmFeed
from sim.lib.executor_model import run_instruction, serve_scratchpad

CFG = profile("tiny")
#: The wide router's config (REQUANT_WIDE joins partials into router_acc_width = 40 bits).
WIDE = profile("tiny", router_width=16)
#: With the K3 layer's ops (SILU, DECAY, SOFTMAX, MUL).
LAYER = profile("tiny", layer_ops=True)


class _Pair(Elaboratable):
    def __init__(self, cfg=CFG):
        self.gemm = GemmFeed(cfg)
        self.elem = Elementwise(cfg)

    def elaborate(self, platform):
        m = Module()
        m.submodules.gemm, m.submodules.elem = self.gemm, self.elem
        wiring.connect(m, self.elem.rq, self.gemm.rq)
        return m


def _run(ins: Instr, spad_init: dict, host: bytes = b"", one_write_port=False, stall=0.3, seed=0, expert=None,
         cfg=CFG, spad_stall=0.0, writes=None, limit=50_000):
    """Run ``ins`` on its executor and on FuncSim (``expert``: the current expert, as after a
    ``ROUTE`` and ``EXPERT``), the bus stalling ``stall`` of its beats and the scratchpad blocking
    reads in ``spad_stall`` of the cycles; returns (RTL scratchpad, FuncSim's, error, cycles from
    start to done). ``writes`` (a list) gets the executor's scratchpad writes
    (:func:`~sim.lib.executor_model.serve_scratchpad`); ``limit``: the cycles before it counts as a hang."""
    ref = FuncSim(cfg, host=host)
    for addr, v in spad_init.items():
        ref.spad[addr] = v
    if expert is None:
        res = ref.run([ins, Instr(Op.HALT)])
        assert res.error == Err.NONE, res
    else:
        ref.run([Instr(Op.HALT)])        # the state of a run, then the expert iterator's
        ref.route_done, ref.expert, ref.count = True, expert, ins.m
        ref.step(ins, Op(ins.op), 0)

    dut = _Pair(cfg)
    ex = dut.gemm if ins.op == Op.GEMM else dut.elem
    rng = np.random.default_rng(seed)
    spad = dict(spad_init)
    out = {}
    bw = bus_bytes(cfg)
    beats = [int.from_bytes(host[i:i + bw], "little") for i in range(ins.host, len(host), bw)]

    async def scratchpad(ctx):
        await serve_scratchpad(ctx, ex.spad, spad, one_write_port, spad_stall, rng, writes)

    async def bus(ctx):
        if ins.op != Op.GEMM:
            return
        d = dut.gemm.dma
        async for _c, _r, start in ctx.tick().sample(d.rd_start):
            if start:
                break
        out["bus_started"] = True
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
            limit=limit))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(scratchpad)
    sim.add_process(bus)
    sim.add_testbench(controller)
    sim.run()
    addrs = sorted(set(spad) | {i for i in range(len(ref.spad)) if ref.spad[i] != 0})
    got = {i: spad.get(i, 0) for i in addrs}
    want = {i: int(ref.spad[i]) for i in addrs}
    assert out.get("bus_started", False) == bool(ins.op == Op.GEMM and not ins.flags & F_B_SPAD), "the DMA's start"
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
        ("norm-8", Instr(Op.NORM, m=m, n=8, a=a, c=c), _act(rng, m * 8, extremes=False)),   # mean a shift
    ]


def test_sigmoid_reads_logits_in_their_format():
    """With logits Q20.16 (wider than the Q16.8 act format) SIGMOID takes logit_width bits of
    each word, the bits above ignored, like FuncSim: random 20-bit logits (and both ends) with
    random upper bits."""
    cfg = profile("tiny", logit_width=20, logit_frac=16, score_frac=16, bias_width=20)
    rng = np.random.default_rng(6)
    logits = rng.integers(-(1 << 19), 1 << 19, 24)
    logits[:2] = [-(1 << 19), (1 << 19) - 1]
    words = logits + (rng.integers(-(1 << 11), 1 << 11, logits.size) << 20)
    ins = Instr(Op.SIGMOID, m=4, n=6, a=16, c=64)
    got, want, err, _ = _run(ins, {ins.a + i: int(v) for i, v in enumerate(words)}, seed=6, cfg=cfg)
    assert got == want and err == Err.NONE
    assert [want[ins.c + i] for i in range(logits.size)] == sigmoid_q(logits, cfg).tolist()


@pytest.mark.parametrize("one_write_port", [False, True])
@pytest.mark.parametrize("op", [Op.SILU, Op.DECAY], ids=["SILU", "DECAY"])
def test_layer_table_ops_match_funcsim(op, one_write_port):
    """SILU and DECAY on their tables (layer_ops): both ends of the act format, the flat tails,
    zero and random values with random upper bits, under read blocking, in place too; with two
    write ports, a cycle more for each element more."""
    rng = np.random.default_rng(int(op))
    cycles = []
    for n, a, c in ((24, 16, 320), (72, 16, 320), (24, 16, 16)):
        x = _act(rng, n)
        x[2:6] = [0, -1, 1, (1 << 14)]
        words = x + (rng.integers(-8, 8, n) << CFG.act_width)
        ins = Instr(op, m=1, n=n, a=a, c=c)
        got, want, err, cyc = _run(ins, {a + i: int(v) for i, v in enumerate(words)}, cfg=LAYER,
                                   one_write_port=one_write_port, spad_stall=0.2 * (a == c), seed=n)
        assert got == want and err == Err.NONE, (op.name, n, a == c)
        cycles.append(cyc)
    if not one_write_port:   # (with one, a cycle that writes reads nothing)
        assert cycles[1] - cycles[0] == 72 - 24, cycles


@pytest.mark.parametrize("one_write_port", [False, True])
def test_norm_with_its_eps_word_matches_funcsim(one_write_port):
    """NORM with F_EPS (layer_ops): the epsilon read from b[0] (random upper bits): 0, KDA's largest
    (o_frac = 15) and the largest the word holds, on rows small enough for it to matter and a zero
    row, in place too, under read blocking: FuncSim's result, and not the plain NORM's (its epsilon
    is rms_eps_q = 1 on tiny)."""
    rng = np.random.default_rng(21)
    m_rows, n = 3, 8
    u = rng.integers(-6, 7, m_rows * n)
    u[:n] = 0
    rows = {16 + i: int(v) + (int(rng.integers(-8, 8)) << LAYER.act_width) for i, v in enumerate(u)}
    plain, _, err, _ = _run(Instr(Op.NORM, m=m_rows, n=n, a=16, c=320), rows, cfg=LAYER)
    assert err == Err.NONE
    for eps_q in (0, I.rms_eps_q(LAYER, 15), (1 << 2 * LAYER.act_width) - 1):
        for c in (320, 16):
            spad = rows | {200: eps_q + (3 << 2 * LAYER.act_width)}
            ins = Instr(Op.NORM, flags=F_EPS, m=m_rows, n=n, a=16, b=200, c=c)
            got, want, err, _ = _run(ins, spad, cfg=LAYER, one_write_port=one_write_port, spad_stall=0.3,
                                     seed=eps_q % 97 + c)
            assert got == want and err == Err.NONE, (eps_q, c)
            if c == 320:
                assert got != plain, eps_q


@pytest.mark.parametrize("one_write_port", [False, True])
def test_l2norm_matches_funcsim(one_write_port):
    """NORM with F_L2 (layer_ops): KDA's l2norm per head at kda_unit_frac, with the config's
    epsilon and with an epsilon word (F_EPS, random upper bits), on random rows with random upper
    bits, a zero row, a one-LSB row and an extreme row, in place too, under read blocking: FuncSim's
    result and golden l2norm_int's."""
    rng = np.random.default_rng(23)
    m_rows, n = 4, 8
    lo, hi = -(1 << (LAYER.act_width - 1)), (1 << (LAYER.act_width - 1)) - 1
    u = _act(rng, m_rows * n).reshape(m_rows, n)
    u[0], u[1], u[2] = 0, [1] + [0] * (n - 1), [hi, lo] * (n // 2)
    rows = {16 + i: int(v) + (int(rng.integers(-8, 8)) << LAYER.act_width) for i, v in enumerate(u.ravel())}
    for flags, eps_q in ((F_L2, None), (F_L2 | F_EPS, 5000)):
        for c in (320, 16):
            spad = rows | {200: (eps_q or 0) + (3 << 2 * LAYER.act_width)}
            ins = Instr(Op.NORM, flags=flags, m=m_rows, n=n, a=16, b=200, c=c)
            got, want, err, _ = _run(ins, spad, cfg=LAYER, one_write_port=one_write_port, spad_stall=0.3,
                                     seed=flags + c)
            assert got == want and err == Err.NONE, (flags, c)
            gold = I.l2norm_int(u, LAYER.kda_unit_frac, LAYER, eps_q).ravel()
            assert [got[c + i] for i in range(m_rows * n)] == list(gold), (flags, c)


@pytest.mark.parametrize(("one_write_port", "T", "k"), [(False, 5, 4), (True, 1, 4), (False, 3, 1), (True, 2, 3)])
def test_conv_matches_funcsim(one_write_port, T, k):
    """CONV (layer_ops): the causal depthwise convolution of T result rows over k taps (T = 1: a
    decode step) of 6 channels, the history rows first: random act-format rows and in_width taps
    with random upper bits, the largest products (wrapping in tiny's 24 bits at 4 taps), under read
    blocking: FuncSim's result and golden short_conv_int's, nothing written past the T rows."""
    rng = np.random.default_rng(T * 10 + k)
    n = 6
    x = _act(rng, (T + k - 1) * n).reshape(T + k - 1, n)
    W = rng.integers(-128, 128, (n, k))
    x[:, 0], W[0] = -(1 << (LAYER.act_width - 1)), -128
    spad = {16 + i: int(v) + (int(rng.integers(-8, 8)) << LAYER.act_width) for i, v in enumerate(x.ravel())}
    spad |= {200 + i: int(v) + (int(rng.integers(-8, 8)) << 8) for i, v in enumerate(W.ravel())}
    ins = Instr(Op.CONV, m=T + k - 1, n=n, k=k, a=16, b=200, c=320)
    got, want, err, cycles = _run(ins, spad, cfg=LAYER, one_write_port=one_write_port, spad_stall=0.3, seed=T + k)
    assert got == want and err == Err.NONE
    assert [got[320 + i] for i in range(T * n)] == list(I.short_conv_int(x, W, LAYER.acc_width).ravel())
    assert 320 + T * n not in got


@pytest.mark.parametrize(("flags", "expert", "width"), [(F_RQ_CHANNEL, None, 8), (F_RQ_CHANNEL, None, 2),
                                                    (F_RQ_CHANNEL | F_RQ_EXPERT, 5, 24)],
                         ids=["channel-8", "channel-2", "channel-expert-24"])
def test_requant_per_column_matches_funcsim(flags, expert, width):
    """REQUANT with F_RQ_CHANNEL (layer_ops): each value requantised with its column's entry (and
    expert's), random per column with the extremes (mult 0, 1 and 2**16 - 1, shift 0 and 63, and
    with random upper bits), acc-width values at both ends, saturated to width (2: nearly all), in
    place too, under read blocking and with one write port: FuncSim's result."""
    cfg = LAYER
    m, n = 3, 7
    rng = np.random.default_rng(width + flags)
    E = cfg.n_experts if flags & F_RQ_EXPERT else 1
    mult = rng.integers(0, 1 << cfg.mult_width, (n, E))
    shift = rng.integers(0, 40, (n, E))
    mult[:3, :], shift[:3, :] = np.array([[1], [(1 << cfg.mult_width) - 1], [0]]), np.array([[0], [63], [5]])
    table = np.stack([mult | rng.integers(0, 1 << 8, (n, E)) << cfg.mult_width,
                      shift | rng.integers(0, 1 << 8, (n, E)) << 6], axis=-1).ravel()
    acc = rng.integers(-(1 << (cfg.acc_width - 1)), 1 << (cfg.acc_width - 1), m * n)
    acc[:4] = [-(1 << (cfg.acc_width - 1)), (1 << (cfg.acc_width - 1)) - 1, 2, -2]
    words = acc + (rng.integers(-8, 8, acc.size) << cfg.acc_width)
    for c, one_write_port in ((400, False), (16, True)):
        ins = Instr(Op.REQUANT, flags=flags, m=m, n=n, a=16, b=600, c=c, mult=3, shift=1, width=width)
        spad = {16 + i: int(v) for i, v in enumerate(words)} | {600 + i: int(v) for i, v in enumerate(table)}
        got, want, err, _ = _run(ins, spad, seed=c + width, expert=expert, cfg=cfg, spad_stall=0.3,
                                 one_write_port=one_write_port)
        assert got == want and err == Err.NONE, (c, width)


@pytest.mark.parametrize("one_write_port", [False, True])
def test_add_at_acc_width_matches_funcsim(one_write_port):
    """ADD with F_ACC (layer_ops): add_sat at acc_width of raw sums and a bias, saturating both
    ways, random upper bits ignored, in place too, under read blocking: FuncSim's result, and the
    plain ADD's would differ."""
    rng = np.random.default_rng(31)
    accw = LAYER.acc_width
    lo, hi = -(1 << (accw - 1)), (1 << (accw - 1)) - 1
    a = rng.integers(lo, hi + 1, 24)
    b = rng.integers(lo, hi + 1, 24) >> rng.integers(0, accw, 24)
    a[:4], b[:4] = [hi, lo, hi, 70000], [hi, lo, lo, 70000]
    spad = {16 + i: int(v) + (int(rng.integers(-8, 8)) << accw) for i, v in enumerate(a)}
    spad |= {200 + i: int(v) + (int(rng.integers(-8, 8)) << accw) for i, v in enumerate(b)}
    for c in (320, 16):
        ins = Instr(Op.ADD, flags=F_ACC, m=4, n=6, a=16, b=200, c=c)
        got, want, err, _ = _run(ins, spad, cfg=LAYER, one_write_port=one_write_port, spad_stall=0.3, seed=c)
        assert got == want and err == Err.NONE, c
        assert [got[c + i] for i in range(4)] == [hi, lo, -1, 140000]


def _kda_operands(cfg, rng, m, n, directed=False):
    """KDA_STEP's scratchpad: the state S [n, K, K] at 16, the vector planes of m tokens at 1200
    (q, k, v, decay, beta: sim.bench_kda_state's random or directed steps, random upper bits),
    and (S, q, k, v, decay, beta) as golden takes them."""
    from sim import bench_kda_state as B

    steps = B.directed_steps(cfg, rng) if directed else B.random_steps(cfg, rng, m * n)
    S, decay, k, v, beta, q = B.token_steps(steps, m, n)
    planes = kda_vectors(q, k, v, decay, beta)
    planes += rng.integers(-8, 8, planes.size) << 20
    spad = {16 + i: int(x) for i, x in enumerate(S.ravel())} | {1200 + i: int(x) for i, x in enumerate(planes)}
    return spad, (S, q, k, v, decay, beta)


@pytest.mark.parametrize(("m", "n", "directed", "one_write_port"), [(2, 2, False, False), (1, 12, True, True),
                                                                    (3, 1, False, True)])
def test_kda_step_matches_funcsim_and_golden(m, n, directed, one_write_port):
    """KDA_STEP (layer_ops): m tokens of n heads on the state update unit, the state carried token to
    token in the scratchpad, under read blocking: FuncSim's scratchpad, and golden
    kda_head_step_int's state and requantised read-out (random steps over the ports' whole ranges,
    and the directed ones: saturation both ways, forgetting, keeping, extremes, ties)."""
    from golden.kda import kda_head_step_int

    cfg = LAYER
    K = cfg.kda_head_dim
    rng = np.random.default_rng(m * 10 + n)
    spad, (S, q, k, v, decay, beta) = _kda_operands(cfg, rng, m, n, directed)
    mult, shift, width = 23456, 30, cfg.act_width
    ins = Instr(Op.KDA_STEP, m=m, n=n, k=K, a=16, b=1200, c=900, mult=mult, shift=shift, width=width)
    got, want, err, _ = _run(ins, spad, cfg=cfg, one_write_port=one_write_port, spad_stall=0.2, seed=m + n)
    assert got == want and err == Err.NONE
    o = []
    for t in range(m):
        S, r = kda_head_step_int(S, decay[t], k[t], v[t], beta[t], q[t], cfg)
        o.append(I.requantize(r, mult, shift, width, cfg.rounding))
    assert [got[16 + i] for i in range(n * K * K)] == list(I.wrap(S.ravel(), 32))
    assert [got[900 + i] for i in range(m * n * K)] == list(np.concatenate(o).ravel())


def test_kda_step_takes_281_cycles_per_head_and_token():
    """KDA_STEP on tiny (K = 8) without stalls: exactly 281 cycles a head and token (each row's 8
    state words read a cycle each beside its vector words, the unit's two passes, the new state
    written a word a cycle, the 8 read-out values through the bit-serial requantiser), from start
    to done, for 1 head of 1 token, 2 heads, and 2 tokens of 2 heads (the README's figure)."""
    cycles = {}
    for m, n in ((1, 1), (1, 2), (2, 2)):
        spad, _ = _kda_operands(LAYER, np.random.default_rng(m + n), m, n)
        ins = Instr(Op.KDA_STEP, m=m, n=n, k=LAYER.kda_head_dim, a=16, b=1200, c=900, mult=23456, shift=30,
                    width=16)
        got, want, err, cycles[m, n] = _run(ins, spad, cfg=LAYER)
        assert got == want and err == Err.NONE
    assert cycles == {(1, 1): 281, (1, 2): 562, (2, 2): 1124}, cycles


def test_conv_takes_a_cycle_per_tap():
    """CONV streams a tap a cycle: 4 more result rows of 6 channels over 4 taps take 4*6*4 cycles more."""
    cycles = []
    for T in (1, 5):
        x = np.arange((T + 3) * 6).reshape(T + 3, 6)
        spad = {16 + i: int(v) for i, v in enumerate(x.ravel())} | {200 + i: i - 12 for i in range(24)}
        got, want, err, c = _run(Instr(Op.CONV, m=T + 3, n=6, k=4, a=16, b=200, c=320), spad, cfg=LAYER)
        assert got == want and err == Err.NONE
        cycles.append(c)
    assert cycles[1] - cycles[0] == 4 * 6 * 4, cycles


@pytest.mark.parametrize("one_write_port", [False, True])
def test_softmax_matches_funcsim(one_write_port):
    """SOFTMAX (layer_ops) over rows of every length up to attnres_candidates: ties (equal rows),
    a maximum beside minima (s - m saturating), random rows with random upper bits; under read
    blocking, in place too."""
    rng = np.random.default_rng(9)
    lo, hi = -(1 << (CFG.act_width - 1)), (1 << (CFG.act_width - 1)) - 1
    for n in range(1, LAYER.attnres_candidates + 1):
        s = _act(rng, 7 * n).reshape(7, n)
        s[2], s[3], s[4, :1] = lo, 5, hi
        words = s.ravel() + (rng.integers(-8, 8, s.size) << CFG.act_width)
        for c in (320, 16):
            ins = Instr(Op.SOFTMAX, m=7, n=n, a=16, c=c)
            got, want, err, _ = _run(ins, {16 + i: int(v) for i, v in enumerate(words)}, cfg=LAYER,
                                     one_write_port=one_write_port, spad_stall=0.2, seed=n)
            assert got == want and err == Err.NONE, (n, c)


def test_mul_takes_a_sigmoid_gate_of_score_frac_16():
    """MUL's factor is mul_factor_width = max(mult_width, score_width + 1) bits: a sigmoid gate of
    score_frac 16 (0 to 2**16, past a signed 16-bit factor) element by element, FuncSim's result."""
    cfg = profile("tiny", layer_ops=True, score_frac=16, bias_width=20)
    rng = np.random.default_rng(22)
    n = 24
    a = _act(rng, n)
    a[:4] = [-100, 77, 5, -99]                      # within out_width: 1.0, just below 1.0, 0, 0.5 (a tie)
    g = rng.integers(0, (1 << 16) + 1, n)
    g[:4] = [1 << 16, (1 << 16) - 1, 0, 1 << 15]
    spad = {16 + i: int(v) for i, v in enumerate(a)} | {200 + j: int(v) for j, v in enumerate(g)}
    got, want, err, _ = _run(Instr(Op.MUL, m=1, n=n, a=16, b=200, c=320, shift=16), spad, cfg=cfg, spad_stall=0.2)
    assert got == want and err == Err.NONE
    assert [got[320 + i] for i in range(4)] == [-100, 77, 0, -50]


@pytest.mark.parametrize("one_write_port", [False, True])
def test_mul_matches_funcsim(one_write_port):
    """MUL (layer_ops): rows of act-format values times one row of signed mult_width-bit factors,
    both ends of each (the largest product), ties at the rounding (x.5 of either sign), shifts 0
    (no rounding), 1, 13, past the product's width (40: only the sign and the sticky bits left) and
    63, random upper bits in every word; under read blocking, in place too; a result 3 cycles after
    its beat (one cycle more per element more)."""
    rng = np.random.default_rng(20)
    lo, hi = -(1 << (LAYER.mult_width - 1)), (1 << (LAYER.mult_width - 1)) - 1
    n = 12
    cycles = {}
    for shift in (0, 1, 13, 40, 63):
        for m_rows, c in ((3, 320), (1, 16), (5, 320)):
            a = _act(rng, m_rows * n)
            b = rng.integers(lo, hi + 1, n) >> rng.integers(0, LAYER.mult_width, n)
            b[:4] = [lo, hi, 1, -1]
            a[n:n + 4] = [lo, hi, 3, -3] if m_rows > 1 else a[n:n + 4]     # x lo, x hi, ties at shift 1
            words = a + (rng.integers(-8, 8, a.size) << CFG.act_width)
            bw = b + (rng.integers(-8, 8, n) << LAYER.mult_width)
            ins = Instr(Op.MUL, m=m_rows, n=n, a=16, b=200, c=c, shift=shift)
            spad = {16 + i: int(v) for i, v in enumerate(words)} | {200 + j: int(v) for j, v in enumerate(bw)}
            got, want, err, cyc = _run(ins, spad, cfg=LAYER, one_write_port=one_write_port,
                                       spad_stall=0.2 * (c == 16), seed=shift + m_rows)
            assert got == want and err == Err.NONE, (shift, m_rows, c)
            cycles[shift, m_rows, c] = cyc
    if not one_write_port:   # (with one, a cycle that writes reads nothing)
        assert cycles[13, 5, 320] - cycles[13, 3, 320] == 2 * n, cycles


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
@pytest.mark.parametrize("shape", [(5, 7, 6), (1, 3, 9), (4, 16, 4), (7, 5, 5)])
def test_gemm_matches_funcsim(width, shape):
    """Row blocks of 4, 3 and 1 real rows (the A feed's lanes read in pairs, and alone), the
    scratchpad blocking a quarter of the reads at random besides the writes' blocking."""
    m, k, n = shape
    rng = np.random.default_rng(m * 100 + k * 10 + n + width)
    A = rng.integers(-128, 128, (m, k))
    W = rng.integers(-128, 128, (n, k))
    A[0, 0], W[0, 0] = -128, -128
    host = weight_panels(W, CFG).astype(np.int8).tobytes()
    ins = Instr(Op.GEMM, m=m, k=k, n=n, a=8, c=400, host=0, mult=20000, shift=12, width=width)
    got, want, err, _ = _run(ins, {8 + i: int(v) for i, v in enumerate(A.ravel())}, host,
                          one_write_port=width == 8, seed=width, spad_stall=0.25)
    assert got == want and err == Err.NONE, (shape, width)


@pytest.mark.parametrize("rows, shape", [(1, (3, 5, 4)), (3, (7, 5, 5)), (3, (2, 9, 3)), (8, (11, 10, 9)),
                                         (8, (3, 17, 12))])
def test_gemm_matches_funcsim_on_other_arrays(rows, shape):
    """Arrays of 1, 3 and 8 rows (B = banks = 1, 2 and 8: row blocks of more real rows than
    banks, and a block's columns in groups of 8), with either scratchpad build and random read
    blocking."""
    m, k, n = shape
    cfg = profile("tiny", rows=rows)
    rng = np.random.default_rng(rows * 1000 + m * 100 + k * 10 + n)
    A = rng.integers(-128, 128, (m, k))
    W = rng.integers(-128, 128, (n, k))
    host = weight_panels(W, cfg).astype(np.int8).tobytes()
    for one_write_port in (False, True):
        ins = Instr(Op.GEMM, m=m, k=k, n=n, a=8, c=400, host=0, mult=20000, shift=12, width=8)
        got, want, err, _ = _run(ins, {8 + i: int(v) for i, v in enumerate(A.ravel())}, host, cfg=cfg,
                                 one_write_port=one_write_port, seed=rows, spad_stall=0.2)
        assert got == want and err == Err.NONE, (rows, shape, one_write_port)


@pytest.mark.parametrize("shape", [(1, 3, 9), (4, 16, 4), (7, 5, 5), (5, 7, 6), (8, 2, 8)])
def test_gemm_writes_a_row_of_b_columns_at_once(shape):
    """Each real row's result columns go back B = banks(cfg) at a time (one masked wide write of
    B consecutive columns, the last of a row block masked to the columns < n): m * ceil(n/B)
    writes, at c + row*n + n0, results still FuncSim's."""
    m, k, n = shape
    B = banks(CFG)
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    A = rng.integers(-128, 128, (m, k))
    W = rng.integers(-128, 128, (n, k))
    host = weight_panels(W, CFG).astype(np.int8).tobytes()
    ins = Instr(Op.GEMM, m=m, k=k, n=n, a=8, c=400, host=0, mult=20000, shift=12, width=8)
    writes = []
    got, want, err, _ = _run(ins, {8 + i: int(v) for i, v in enumerate(A.ravel())}, host, seed=m, writes=writes)
    assert got == want and err == Err.NONE, shape
    assert sorted(writes) == sorted((ins.c + r * n + n0, min(B, n - n0)) for r in range(m) for n0 in range(0, n, B))


@pytest.mark.parametrize("op", [Op.REQUANT, Op.SIGMOID, Op.SITU, Op.ADD])
def test_streaming_ops_take_one_cycle_per_element(op):
    """Each element more costs exactly one cycle; REQUANT a cycle per word of rows = banks = 4
    elements (one wide read and one wide write a word, the requantiser running on while a result
    word is written back), results still FuncSim's."""
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
    assert cycles[1] - cycles[0] == (72 - 24) // (4 if op == Op.REQUANT else 1), (op, cycles)


@pytest.mark.parametrize("one_write_port", [False, True])
@pytest.mark.parametrize("n", [1, 5, 13])
def test_requant_with_fewer_banks_than_rows(one_write_port, n):
    """rows = 6, banks(cfg) = 4: a word of 6 values takes two reads (4 + 2 lanes, and the last
    word's reads end at len) and two writes, under random read blocking: FuncSim's results."""
    cfg = profile("tiny", rows=6)
    rng = np.random.default_rng(n)
    acc = rng.integers(-(1 << 31), 1 << 31, n)
    ins = Instr(Op.REQUANT, m=1, n=n, a=16, c=320, mult=40503, shift=20, width=8)
    got, want, err, _ = _run(ins, {ins.a + i: int(v) for i, v in enumerate(acc)}, cfg=cfg,
                             one_write_port=one_write_port, seed=n, spad_stall=0.3)
    assert got == want and err == Err.NONE


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
def test_gemm_a_feed_takes_a_cycle_per_word(m):
    """The A feed reads a real row's B = banks(cfg) = 4 columns at once: a row block of M_b <= B
    real rows gives a word per cycle, the engine's rate, so 16 more columns of A are 16 more
    cycles a row block (one tile, no bus stalls), results still FuncSim's; M = 5 and 8 are two
    row blocks. A lane a read, two reads a cycle, costs 16*ceil(M_b/2) a row block (the test
    fails with 32 for M = 3 and 4); a queue of two groups, 18 for M = 4."""
    assert banks(CFG) == CFG.rows == 4
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
    assert cycles[1] - cycles[0] == 16 * -(-m // CFG.rows), (m, cycles)


@pytest.mark.parametrize("flags, expert", [(F_RQ_CHANNEL, None), (F_RQ_CHANNEL | F_RQ_EXPERT, 5)],
                         ids=["channel", "channel-expert"])
@pytest.mark.parametrize("width", [0, 8, 24])
@pytest.mark.parametrize("shape", [(5, 7, 6), (1, 3, 9), (4, 2, 16), (7, 40, 3)])
def test_gemm_per_column_matches_funcsim(shape, width, flags, expert):
    """F_RQ_CHANNEL: a (mult, shift) per column from the table at b (per expert with
    F_RQ_EXPERT), random per column with the extremes (mult 0, 1 and 2**16 - 1, shift 0 and
    63) and garbage above the bits taken; k = 2 makes the compute shorter than the table copy
    (the store waits for it), k = 40 several groups of A columns a row block; width 0 ignores
    the table. The scratchpad blocks a fifth of the reads at random."""
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
    got, want, err, _ = _run(ins, spad, host, one_write_port=width == 8, seed=seed, expert=expert,
                             spad_stall=0.2)
    assert got == want and err == Err.NONE, (shape, width)


def _split_values(rng, size):
    """SPLIT operands: the digits' extremes (+-router_qmax = +-127 * 256, a low digit of -128 and
    127), 16-bit ends (a high digit of +-128) and random words with garbage above 16 bits."""
    edge = [0, 1, -1, 127, 128, -128, -129, 255, 256, 32512, -32512, 32512 - 128, -32512 + 127, 32767, -32768,
            0x12345, -70000]
    return np.concatenate([edge, rng.integers(-(1 << 31), 1 << 31, size - len(edge))])


@pytest.mark.parametrize("op", [Op.REQUANT, Op.GEMM], ids=["REQUANT", "GEMM"])
def test_per_expert_entry_waits_for_its_reads(op):
    """REQUANT and GEMM with F_RQ_EXPERT read expert e's entry (mult, shift at b + 2e) only in a
    cycle the scratchpad serves reads: with reads blocked half the time, on 6 seeds each, the
    result is FuncSim's (an entry taken from an unserved read holds the ports' stale words)."""
    rng = np.random.default_rng(17)
    E, m, n, k = CFG.n_experts, 3, 5, 4
    table = np.stack([rng.integers(1 << 10, 1 << 16, E), rng.integers(10, 24, E)], axis=-1).ravel()
    spad = {600 + i: int(v) for i, v in enumerate(table)}
    host = b""
    if op == Op.REQUANT:
        spad |= {16 + i: int(v) for i, v in enumerate(rng.integers(-(1 << 24), 1 << 24, m * n))}
        ins = Instr(op, flags=F_RQ_EXPERT, m=m, n=n, a=16, b=600, c=320, width=8)
    else:
        W = rng.integers(-128, 128, (n, k))
        host = weight_panels(W, CFG).astype(np.int8).tobytes()
        spad |= {16 + i: int(v) for i, v in enumerate(rng.integers(-128, 128, m * k))}
        ins = Instr(op, flags=F_RQ_EXPERT, m=m, n=n, k=k, a=16, b=600, c=320, host=0, width=8)
    for seed in range(6):
        got, want, err, _ = _run(ins, spad, host, seed=seed, expert=seed % E, spad_stall=0.5)
        assert got == want and err == Err.NONE, f"seed {seed}"


@pytest.mark.parametrize("one_write_port, spad_stall", [(False, 0.0), (True, 0.0), (True, 0.3)])
def test_split_matches_funcsim(one_write_port, spad_stall):
    """SPLIT: high digits, then low digits, 2 * len results (golden.intops.split_digits)."""
    rng = np.random.default_rng(11)
    a = _split_values(rng, 40)
    ins = Instr(Op.SPLIT, m=5, n=8, a=16, c=320)
    got, want, err, cycles = _run(ins, {16 + i: int(v) for i, v in enumerate(a)}, one_write_port=one_write_port,
                                  seed=3, cfg=WIDE, spad_stall=spad_stall)
    assert got == want and err == Err.NONE
    assert one_write_port or cycles <= 2 * 40 + 8     # a result a cycle (one write port: a read after each)


def _partials(rng, m, n, cfg):
    """Four [m, n] blocks of partial sums (acc_width bits): ties at the rounding site (P_ll alone,
    mult 1: see _wide_case), the extremes of every partial (the join at +-2**39) and random."""
    lim = 1 << (cfg.acc_width - 1)
    p = rng.integers(-lim, lim, (4, m * n))
    p[:, :4] = 0
    p[3, :4] = [(3 << 9) + (1 << 8), (2 << 9) + (1 << 8), -(3 << 9) - (1 << 8), -(2 << 9) - (1 << 8)]   # ties
    p[:, 4], p[:, 5] = lim - 1, -lim                   # every partial at its ends: the widest joins
    return p


@pytest.mark.parametrize("flags, expert", [(0, None), (F_RQ_CHANNEL, None), (F_RQ_EXPERT, 3),
                                           (F_RQ_CHANNEL | F_RQ_EXPERT, 5)],
                         ids=["tensor", "channel", "expert", "channel-expert"])
@pytest.mark.parametrize("width", [2, 16, 24])
@pytest.mark.parametrize("rounding", ["half_even", "half_up", "floor"])
def test_requant_wide_matches_funcsim(flags, expert, width, rounding):
    """REQUANT_WIDE on the four partials: the join in router_acc_width = 40 bits, requantised with
    the instruction's constants, an expert's entry or each column's, saturated to width (2: nearly
    everything saturates), ties at the rounding site, reads blocked at random."""
    cfg = WIDE.replace(rounding=rounding)
    m, n = 3, 7
    seed = flags * 10 + width + len(rounding)
    rng = np.random.default_rng(seed)
    E = cfg.n_experts if flags & F_RQ_EXPERT else 1
    mult = rng.integers(0, 1 << cfg.mult_width, (n, E))
    shift = rng.integers(0, 64, (n, E))
    mult[:3, :], shift[:3, :] = np.array([[1], [(1 << cfg.mult_width) - 1], [40503]]), np.array([[9], [63], [0]])
    table = np.stack([mult | rng.integers(0, 1 << 8, (n, E)) << cfg.mult_width,
                      shift | rng.integers(0, 1 << 8, (n, E)) << 6], axis=-1).ravel()
    parts = _partials(rng, m, n, cfg)
    ins = Instr(Op.REQUANT_WIDE, flags=flags, m=m, n=n, a=16, b=600, c=400, mult=1, shift=9, width=width)
    spad = {16 + i: int(v) for i, v in enumerate(parts.ravel())} | {600 + i: int(v) for i, v in enumerate(table)}
    got, want, err, _ = _run(ins, spad, seed=seed, expert=expert, cfg=cfg, spad_stall=0.2,
                             one_write_port=width == 16)
    assert got == want and err == Err.NONE, f"seed {seed}"


def test_requant_wide_takes_a_product_per_logit():
    """One logit every max(mult_width, 3) = 16 cycles (the bit-serial product; the next logit's
    reads overlap it), no DSP multiplier in the executor."""
    rng = np.random.default_rng(1)
    cycles = []
    for n in (8, 32):
        parts = _partials(rng, 1, n, WIDE)
        ins = Instr(Op.REQUANT_WIDE, m=1, n=n, a=16, c=400, mult=40503, shift=30, width=16)
        got, want, err, c = _run(ins, {16 + i: int(v) for i, v in enumerate(parts.ravel())}, cfg=WIDE)
        assert got == want and err == Err.NONE
        cycles.append(c)
    assert cycles[1] - cycles[0] == 16 * 24, cycles


@pytest.mark.parametrize("transposed", [False, True], ids=["K", "V"])
@pytest.mark.parametrize("shape", [(5, 7, 6), (1, 3, 9), (3, 16, 4), (8, 2, 1), (16, 5, 9)])
def test_gemm_with_b_from_the_scratchpad_matches_funcsim(shape, transposed):
    """F_B_SPAD (layer_ops): A [m, k] @ K [n, k]^T, and with F_B_T A @ V [k, n], both operands in the
    scratchpad (random upper bits in every word: in_width bits taken), the extremes of both, n a
    multiple of cols and not (a part-filled last panel), a panel of one row; under read blocking with
    either scratchpad build; requantised (K) and raw (V); 16 rows (4 row blocks: the engine keeps
    the reader waiting); the bus
    never touched. Cycles exact, the same for both layouts: a read a cycle at most, and at most
    (cols - 1)*k per panel more than the same GEMM from the bus at full rate."""
    m, k, n = shape
    width = 0 if transposed else 8
    rng = np.random.default_rng(m * 100 + k * 10 + n + width)
    A = rng.integers(-128, 128, (m, k))
    K = rng.integers(-128, 128, (n, k))
    A[0, 0], K[0, 0], K[-1, -1] = -128, -128, 127
    b = 200
    words = {8 + i: int(v) + (int(rng.integers(-4, 4)) << 8) for i, v in enumerate(A.ravel())}
    B = K.T if transposed else K     # as it lies in the scratchpad: V = K^T [k, n] with F_B_T
    words |= {b + i: int(v) + (int(rng.integers(-4, 4)) << 8) for i, v in enumerate(B.ravel())}
    ins = Instr(Op.GEMM, flags=F_B_SPAD | (F_B_T if transposed else 0), m=m, k=k, n=n, a=8, b=b, c=400,
                mult=20000, shift=12, width=width)
    for one_write_port, spad_stall in ((False, 0.0), (True, 0.25)):
        got, want, err, _ = _run(ins, words, cfg=LAYER, one_write_port=one_write_port, spad_stall=spad_stall,
                                 seed=width + n, limit=2_000)
        assert got == want and err == Err.NONE, (shape, width, one_write_port)
    _, _, _, from_spad = _run(ins, words, cfg=LAYER, stall=0.0)
    host = weight_panels(K, LAYER).astype(np.int8).tobytes()
    _, _, _, from_bus = _run(Instr(Op.GEMM, m=m, k=k, n=n, a=8, c=400, mult=20000, shift=12, width=width),
                             {i: v for i, v in words.items() if i < b}, host, cfg=LAYER, stall=0.0)
    panel_reads = -(-n // LAYER.cols) * k * LAYER.cols
    assert panel_reads <= from_spad <= from_bus + panel_reads - -(-n // LAYER.cols) * k, (from_spad, from_bus)
    assert from_spad == {(5, 7, 6): 99, (1, 3, 9): 67, (3, 16, 4): 100, (8, 2, 1): 53, (16, 5, 9): 180}[shape]


def _attend_operands(cfg, rng, m, k, n, directed=False):
    """ATTEND's scratchpad: scores a [m, k] at 16, the gate g [m, n] at 1500 and the values V [k, n]
    at 1500 + m*n (random words, upper bits random: the ports take act_width, score_width and
    in_width bits; a row's scores within 6.0 of a random level, so that every key weighs), and (s,
    V, g) as golden takes them. Directed: row 0 ties (equal scores), the
    extreme scores (differences saturating; row 1 all the lowest), the extreme values with the widest gate (the output
    saturating both ways), and row 0 of a causal block (m = k) a single key whose gate of 0.5 ties
    every odd value at the gate's rounding."""
    act, sf = cfg.act_width, cfg.score_frac
    lo, hi = -(1 << (act - 1)), (1 << (act - 1)) - 1
    # a row's scores within a few units of each other (every key weighs), around a random level
    s = np.clip(rng.integers(lo // 2, hi // 2, (m, 1)) + rng.integers(-6 << cfg.act_frac, 6 << cfg.act_frac, (m, k)),
                lo, hi)
    v = rng.integers(-128, 128, (k, n))
    g = rng.integers(0, 1 << cfg.score_width, (m, n))
    if directed:
        s[0] = 1234
        s[1:] = rng.choice([lo, hi, lo + 1, hi - 1, 0], (m - 1, k))
        s[1] = lo                            # exp(m - m') = 1.0 from the first key: the accumulators start at 0
        v[: k // 2] = rng.choice([-128, 127], (k // 2, n))
        v[0] = np.arange(n) * 2 - 7          # odd values
        g[0] = 1 << (sf - 1)
        g[1:] = rng.choice([(1 << cfg.score_width) - 1, 1 << sf, 0], (m - 1, n))
    noise = lambda shape, width: rng.integers(-8, 8, shape) << width  # noqa: E731 - the ignored upper bits
    words = {16 + i: int(x) for i, x in enumerate((s + noise(s.shape, act)).ravel())}
    words |= {1500 + i: int(x) for i, x in enumerate((g + noise(g.shape, cfg.score_width)).ravel())}
    words |= {1500 + m * n + i: int(x) for i, x in enumerate((v + noise(v.shape, cfg.in_width)).ravel())}
    return words, (s, v, g)


@pytest.mark.parametrize(("m", "k", "n", "directed", "one_write_port"),
                         [(3, 5, 8, False, False), (4, 4, 3, True, True), (1, 1, 8, False, True),
                          (2, 9, 1, True, False)])
def test_attend_matches_funcsim_and_golden(m, k, n, directed, one_write_port):
    """ATTEND (layer_ops): m queries, the last m of k positions, n values each, under read blocking:
    FuncSim's scratchpad and golden attend_int (the online softmax, the gate) bit for bit; random
    scores over the whole act range and the directed cases of _attend_operands."""
    from golden.mla import attend_int

    seed = m * 100 + k * 10 + n
    rng = np.random.default_rng(seed)
    spad, (s, v, g) = _attend_operands(LAYER, rng, m, k, n, directed)
    ins = Instr(Op.ATTEND, m=m, n=n, k=k, a=16, b=1500, c=900)
    got, want, err, _ = _run(ins, spad, cfg=LAYER, one_write_port=one_write_port, spad_stall=0.25, seed=seed)
    assert err == Err.NONE
    out = [got[900 + i] for i in range(m * n)]
    assert out == list(attend_int(s, v, g, LAYER).ravel()), f"seed {seed}"
    assert got == want, f"seed {seed}"


def test_attend_cycles_are_exact():
    """ATTEND without blocking takes exactly attend.cycles(m, k, n) from start to done: each key its
    n value reads and 8 more cycles, each query its n outputs and the reciprocal's 23 more."""
    from nanokpu.kpu.executors.attend import cycles

    for m, k, n in ((1, 1, 1), (2, 3, 4), (3, 3, 8)):
        spad, _ = _attend_operands(LAYER, np.random.default_rng(k), m, k, n)
        got, want, err, c = _run(Instr(Op.ATTEND, m=m, n=n, k=k, a=16, b=1500, c=900), spad, cfg=LAYER)
        assert got == want and err == Err.NONE
        assert c == cycles(m, k, n), (m, k, n, c)
    assert cycles(1, 1, 1) == 1 * (8 + 1) + (23 + 1) + 1
