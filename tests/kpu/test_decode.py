"""The decode alone (Amaranth simulator): on random instructions (every opcode, fields around the
limits) its error is FuncSim's for that instruction on a fresh machine, its sizes are the
instruction's, and its latency is Decode.min_latency plus a cycle per bit of each product's
multiplier; after done its error follows a changed context in Decode.settle_latency cycles."""

import numpy as np
from amaranth.sim import Simulator

from nanokpu.config import profile
from nanokpu.host.funcsim import FuncSim
from nanokpu.isa import F_ACC, F_B_SPAD, F_B_T, F_EPS, F_L2, F_RQ_CHANNEL, F_RQ_EXPERT, Err, Instr, Op, bus_bytes
from nanokpu.kpu.decode import Decode

CFG = profile("tiny")
HOST = 1 << 12


def _random_instr(rng):
    op = int(rng.choice([*list(Op), 31]))
    D = CFG.dmem_depth

    def size():
        return int(rng.choice([0, 1, 2, 3, 7, 16, 33, 100, 1 << 10, 0xFFFF]))

    def addr():
        return int(rng.choice([0, 5, 64, 1000, D - 40, D - 1, D, 1 << 20]))

    return Instr(op, m=size(), n=int(rng.choice([size(), CFG.n_experts])), k=int(rng.choice([size(), CFG.top_k])),
                 a=addr(), b=addr(), c=addr(), host=int(rng.choice([0, 4, 6, HOST - 64, HOST, 1 << 31])),
                 width=int(rng.choice([0, 1, 2, 4, 8, 33])), target=int(rng.choice([0, 3, CFG.imem_depth])),
                 flags=int(rng.choice([0, F_RQ_CHANNEL])))


def _per_column_gemms():
    """GEMMs flagged F_RQ_CHANNEL (a table of 2*n words at b): the table fits exactly, runs past
    the scratchpad by a word (SPAD_RANGE), overlaps the result (OVERLAP), fits elsewhere; and one
    whose b would be out of range without the flag (no table: no region)."""
    D = CFG.dmem_depth
    gemm = dict(op=Op.GEMM, flags=F_RQ_CHANNEL, m=2, k=4, n=6, a=0, c=100, host=0, width=8)
    return [Instr(**gemm, b=b) for b in (D - 12, D - 11, 95, 111, 112, 50)] + \
        [Instr(**gemm | {"flags": 0}, b=D)]


def _expected(ins, cfg=CFG):
    """FuncSim's error for ``ins`` as the first instruction (NONE once it retired)."""
    try:
        res = FuncSim(cfg, host=bytes(HOST)).run([ins], max_steps=2)
    except RuntimeError:        # a JUMP back to itself: it retired
        return Err.NONE
    return res.error if res.retired == 0 and res.pc == 0 else Err.NONE


def _decode(cfg, instrs):
    """(error, cycles from start to done, decoded len, beats) of each of ``instrs`` on a fresh Decode."""
    dut = Decode(cfg)
    got = []

    async def bench(ctx):
        ctx.set(dut.context, {"host_base": 0, "host_size": HOST})
        for ins in instrs:
            ctx.set(dut.ins.as_value(), ins.encode())
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            cycles = 1
            while not ctx.get(dut.done):
                await ctx.tick()
                cycles += 1
            got.append((ctx.get(dut.error), cycles, ctx.get(dut.decoded.len), ctx.get(dut.beats)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got


#: SPLIT and REQUANT_WIDE with fields that pass every check
_WIDE_OPS = [Instr(Op.SPLIT, m=2, n=4, a=0, c=100), Instr(Op.REQUANT_WIDE, m=1, n=4, a=0, c=100, width=8, mult=3)]


def test_decode_matches_funcsim_checks_and_latency():
    rng = np.random.default_rng(3)
    instrs = [_random_instr(rng) for _ in range(120)]
    instrs += [Instr(Op.JUMP, target=1), Instr(Op.ADD, m=3, n=5, a=0, b=15, c=30),
               Instr(Op.LOAD, m=2, n=8, c=40, host=16, width=1), *_per_column_gemms(), *_WIDE_OPS]
    got = _decode(CFG, instrs)

    checked = 0
    for ins, (err, cycles, ln, beats) in zip(instrs, got, strict=True):
        if ins.op == Op.HALT:
            assert cycles == Decode.min_latency - 2, ins      # HALT skips the checks
            continue
        assert err == _expected(ins), ins
        if ins.op in (Op.JUMP, 31):
            assert cycles == Decode.min_latency, ins
        if err == Err.NONE and ins.op in (Op.ADD, Op.LOAD):
            assert ln == ins.m * ins.n
            checked += 1
        if err == Err.NONE and ins.op == Op.LOAD:
            assert beats == -(-ins.m * ins.n * ins.width // bus_bytes(CFG))
    assert checked >= 2
    errs = [e for (e, *_), ins in zip(got, instrs, strict=True) if ins in _per_column_gemms()]
    assert errs == [Err.NONE, Err.SPAD_RANGE, Err.OVERLAP, Err.OVERLAP, Err.NONE, Err.NONE, Err.NONE]
    assert [e for e, *_ in got[-len(_WIDE_OPS):]] == [Err.BAD_OPCODE] * 2     # not built without a wide router
    assert sum(e == Err.NONE for e, *_ in got) >= 3 and len({e for e, *_ in got}) >= 5


def test_error_follows_the_context_after_done():
    """The controller's prefetch relies on it: a ROUTE retiring (route_done) or a host window
    write while a decoded instruction waits reaches its error in settle_latency cycles."""
    cases = [   # (instruction, context before, context after, error before, error after)
        (Instr(Op.GATHER, m=2, n=2, a=0, b=100, c=200), {"route_done": 0}, {"route_done": 1, "exp_active": 1,
                                                                             "count": 1},
         Err.NO_ROUTE, Err.NONE),
        (Instr(Op.LOAD, m=1, n=16, c=0, host=2048, width=4), {"host_size": HOST}, {"host_size": 1024},
         Err.NONE, Err.HOST_RANGE),
        (Instr(Op.LOAD, m=1, n=16, c=0, host=2048, width=4), {"host_size": 1024}, {"host_size": HOST},
         Err.HOST_RANGE, Err.NONE),
    ]
    dut = Decode(CFG)
    seen = []

    async def bench(ctx):
        for ins, before, after, *_ in cases:
            ctx.set(dut.context, {"host_base": 0, "host_size": HOST, "count": 1, **before})
            ctx.set(dut.ins.as_value(), ins.encode())
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            await ctx.tick().until(dut.done)
            errors = [ctx.get(dut.error)]
            ctx.set(dut.context, {"host_base": 0, "host_size": HOST, "count": 1, **before, **after})
            for _ in range(Decode.settle_latency + 3):
                await ctx.tick()
                errors.append(ctx.get(dut.error))
            seen.append(errors)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    for (ins, _, _, err_before, err_after), errors in zip(cases, seen, strict=True):
        assert errors[0] == err_before, ins
        assert set(errors[Decode.settle_latency:]) == {err_after}, (ins, errors)
    # the host window check is the slow one: the bound is tight
    assert seen[1][Decode.settle_latency - 1] == Err.NONE


def test_wide_router_ops_decode_with_a_wide_router():
    """With router_width = 16 the same SPLIT and REQUANT_WIDE pass (FuncSim agrees both ways)."""
    wide = profile("tiny", router_width=16)
    got = _decode(wide, _WIDE_OPS)
    assert [e for e, *_ in got] == [Err.NONE, Err.NONE] == [_expected(i, wide) for i in _WIDE_OPS]


def test_layer_ops_decode_only_with_layer_ops():
    """SILU, DECAY, SOFTMAX and MUL: BAD_OPCODE without layer_ops, checked like any element-wise op
    with it, SOFTMAX's rows at most attnres_candidates (3) long, MUL's factor row n words (FuncSim
    agrees each way)."""
    ops = [Instr(Op.SILU, m=2, n=4, a=0, c=100), Instr(Op.DECAY, m=2, n=4, a=0, c=0),
           Instr(Op.DECAY, m=2, n=4, a=0, c=4), Instr(Op.SOFTMAX, m=5, n=3, a=0, c=20),
           Instr(Op.SOFTMAX, m=5, n=4, a=0, c=20), Instr(Op.MUL, m=5, n=4, a=0, b=40, c=0),
           Instr(Op.MUL, m=5, n=4, a=0, b=17, c=20), Instr(Op.MUL, m=5, n=4, a=40, b=16, c=20)]
    for cfg, want in ((CFG, [Err.BAD_OPCODE] * 8), (profile("tiny", layer_ops=True),
                                                    [Err.NONE, Err.NONE, Err.OVERLAP, Err.NONE, Err.BAD_SHAPE,
                                                     Err.NONE, Err.OVERLAP, Err.NONE])):
        got = _decode(cfg, ops)
        assert [e for e, *_ in got] == want == [_expected(i, cfg) for i in ops]


def test_conv_decodes_only_with_layer_ops():
    """CONV: a [m, n] (history and new rows), the kernels n*k words at b, the result (m - k + 1)*n
    at c, each checked to its last word (one past is SPAD_RANGE, the result on the kernels'
    last word OVERLAP, on the word after them not), k <= m (k = m: one row), decoded len m*n;
    BAD_OPCODE without layer_ops (FuncSim agrees each way)."""
    D = CFG.dmem_depth
    conv = dict(op=Op.CONV, m=7, n=6, k=4, a=0, b=100)      # a: 42 words, b: 24, c: 24
    ops = [Instr(**conv, c=200), Instr(**conv, c=D - 24), Instr(**conv, c=D - 23),
           Instr(**conv | {"b": D - 24}, c=200), Instr(**conv | {"b": D - 23}, c=200),
           Instr(**conv | {"a": D - 42}, c=200), Instr(**conv | {"a": D - 41}, c=200),
           Instr(**conv, c=123), Instr(**conv, c=124), Instr(**conv, c=41), Instr(**conv | {"k": 7}, c=200),
           Instr(**conv | {"k": 8}, c=200)]
    layer = profile("tiny", layer_ops=True)
    for cfg, want in ((CFG, [Err.BAD_OPCODE] * 12),
                      (layer, [Err.NONE, Err.NONE, Err.SPAD_RANGE, Err.NONE, Err.SPAD_RANGE, Err.NONE,
                               Err.SPAD_RANGE, Err.OVERLAP, Err.NONE, Err.OVERLAP, Err.NONE, Err.BAD_SHAPE])):
        got = _decode(cfg, ops)
        assert [e for e, *_ in got] == want == [_expected(i, cfg) for i in ops], cfg.layer_ops
        if cfg.layer_ops:
            assert got[0][2] == 7 * 6


def test_requant_per_column_and_add_at_acc_width_decode_only_with_layer_ops():
    """REQUANT with F_RQ_CHANNEL: its table of 2*n words at b checked to its last word, on the
    result OVERLAP; ADD with F_ACC as ADD; both BAD_SHAPE without layer_ops, where REQUANT without
    the flag reads no table (FuncSim agrees each way)."""
    D = CFG.dmem_depth
    rq = dict(op=Op.REQUANT, flags=F_RQ_CHANNEL, m=2, n=5, a=0, c=100, mult=3, width=8)
    ops = [Instr(**rq, b=50), Instr(**rq, b=D - 10), Instr(**rq, b=D - 9), Instr(**rq, b=91), Instr(**rq, b=90),
           Instr(**rq | {"flags": 0}, b=D), Instr(Op.ADD, flags=F_ACC, m=2, n=5, a=0, b=20, c=40)]
    layer = profile("tiny", layer_ops=True)
    for cfg, want in ((CFG, [Err.BAD_SHAPE] * 5 + [Err.NONE, Err.BAD_SHAPE]),
                      (layer, [Err.NONE, Err.NONE, Err.SPAD_RANGE, Err.OVERLAP, Err.NONE, Err.NONE, Err.NONE])):
        got = _decode(cfg, ops)
        assert [e for e, *_ in got] == want == [_expected(i, cfg) for i in ops], cfg.layer_ops


def test_kda_step_decodes_only_with_layer_ops():
    """KDA_STEP: the state n*K*K words at a, the vectors m*n*(4K+1) at b, the read-out m*n*K at c,
    each checked to its last word (one past: SPAD_RANGE), the state on the vectors OVERLAP (it is
    written), the read-out on either OVERLAP, k = kda_head_dim (else BAD_SHAPE), width in [2,
    acc_width]; BAD_OPCODE without layer_ops (FuncSim agrees each way)."""
    D, K = CFG.dmem_depth, CFG.kda_head_dim
    kda = dict(op=Op.KDA_STEP, m=3, n=2, k=K, a=0, b=200, c=500, width=16)     # a 128, b 198, c 48 words
    ops = [Instr(**kda), Instr(**kda | {"a": D - 128}), Instr(**kda | {"a": D - 127}),
           Instr(**kda | {"b": D - 198}), Instr(**kda | {"b": D - 197}), Instr(**kda | {"c": D - 48}),
           Instr(**kda | {"c": D - 47}), Instr(**kda | {"b": 127}), Instr(**kda | {"b": 128}),
           Instr(**kda | {"c": 397}), Instr(**kda | {"c": 398}), Instr(**kda | {"k": K + 1}),
           Instr(**kda | {"width": 1})]
    layer = profile("tiny", layer_ops=True)
    N = Err.NONE
    for cfg, want in ((CFG, [Err.BAD_OPCODE] * 13),
                      (layer, [N, N, Err.SPAD_RANGE, N, Err.SPAD_RANGE, N, Err.SPAD_RANGE, Err.OVERLAP, N,
                               Err.OVERLAP, N, Err.BAD_SHAPE, Err.BAD_SHAPE])):
        got = _decode(cfg, ops)
        assert [e for e, *_ in got] == want == [_expected(i, cfg) for i in ops], cfg.layer_ops


def test_norm_eps_word_decodes_only_with_layer_ops():
    """NORM with F_EPS: its epsilon word at b checked like an operand (the last word, one past the end,
    on the result), in place as before; F_L2 alone reads no b (b out of range passes), with F_EPS its
    word checked; BAD_SHAPE without layer_ops (FuncSim agrees each way)."""
    D = CFG.dmem_depth
    norm = dict(op=Op.NORM, flags=F_EPS, m=2, n=4, a=0, c=100)
    ops = [Instr(**norm, b=50), Instr(**norm, b=D - 1), Instr(**norm, b=D), Instr(**norm, b=104),
           Instr(**norm | {"c": 0}, b=50), Instr(**norm | {"flags": 0}, b=D),
           Instr(**norm | {"flags": F_L2}, b=D), Instr(**norm | {"flags": F_L2 | F_EPS}, b=D),
           Instr(**norm | {"flags": F_L2, "c": 0}, b=D)]
    layer = profile("tiny", layer_ops=True)
    for cfg, want in ((CFG, [Err.BAD_SHAPE] * 5 + [Err.NONE] + [Err.BAD_SHAPE] * 3),
                      (layer, [Err.NONE, Err.NONE, Err.SPAD_RANGE, Err.OVERLAP, Err.NONE, Err.NONE,
                               Err.NONE, Err.SPAD_RANGE, Err.NONE])):
        got = _decode(cfg, ops)
        assert [e for e, *_ in got] == want == [_expected(i, cfg) for i in ops], cfg.layer_ops


def test_gemm_b_from_the_scratchpad_decodes_only_with_layer_ops():
    """GEMM with F_B_SPAD: B's n*k words at b checked like any operand (fits to the last word, one
    past it, overlapping the result), no host access (a misaligned host address passes), never with
    a per-column table; F_B_T (B transposed) only with it; BAD_SHAPE without layer_ops (FuncSim
    agrees each way)."""
    D = CFG.dmem_depth
    gemm = dict(op=Op.GEMM, flags=F_B_SPAD, m=2, k=4, n=6, a=0, c=100, host=6, width=8)
    ops = [Instr(**gemm, b=50), Instr(**gemm, b=D - 24), Instr(**gemm, b=D - 23), Instr(**gemm, b=77),
           Instr(**gemm, b=112), Instr(**gemm | {"flags": F_B_SPAD | F_RQ_CHANNEL}, b=50),
           Instr(**gemm | {"flags": F_B_SPAD | F_RQ_EXPERT}, b=50), Instr(**gemm | {"flags": 0}, b=50),
           Instr(**gemm | {"flags": F_B_SPAD | F_B_T}, b=D - 24), Instr(**gemm | {"flags": F_B_T}, b=50)]
    layer = profile("tiny", layer_ops=True)
    for cfg, want in ((CFG, [Err.BAD_SHAPE] * 6 + [Err.NO_ROUTE, Err.HOST_RANGE, Err.BAD_SHAPE, Err.BAD_SHAPE]),
                      (layer, [Err.NONE, Err.NONE, Err.SPAD_RANGE, Err.OVERLAP, Err.NONE, Err.BAD_SHAPE,
                               Err.NO_ROUTE, Err.HOST_RANGE, Err.NONE, Err.BAD_SHAPE])):
        got = _decode(cfg, ops)
        assert [e for e, *_ in got] == want == [_expected(i, cfg) for i in ops], cfg.layer_ops


def test_attend_decodes_only_with_layer_ops():
    """ATTEND: the scores m*k words at a, the gate and values (k+m)*n at b, the output m*n at c, each
    checked to its last word (one past: SPAD_RANGE), the output on the gate and values OVERLAP;
    m <= k <= mla_max_tokens and n <= v_head_dim (else BAD_SHAPE; the longest row passes); BAD_OPCODE
    without layer_ops (FuncSim agrees each way)."""
    D, S = CFG.dmem_depth, CFG.mla_max_tokens
    att = dict(op=Op.ATTEND, m=3, k=5, n=4, a=0, b=200, c=500)        # a 15, b 32, c 12 words
    ops = [Instr(**att), Instr(**att | {"a": D - 15}), Instr(**att | {"a": D - 14}),
           Instr(**att | {"b": D - 32}), Instr(**att | {"b": D - 31}), Instr(**att | {"c": D - 12}),
           Instr(**att | {"c": D - 11}), Instr(**att | {"c": 231}), Instr(**att | {"c": 232}),
           Instr(**att | {"m": 6}), Instr(**att | {"n": CFG.v_head_dim + 1}),
           Instr(**att | {"m": 1, "k": S + 1, "n": 1}), Instr(op=Op.ATTEND, m=1, k=S, n=1, a=0, b=S, c=D - 1)]
    layer = profile("tiny", layer_ops=True)
    N, B = Err.NONE, Err.BAD_SHAPE
    for cfg, want in ((CFG, [Err.BAD_OPCODE] * 13),
                      (layer, [N, N, Err.SPAD_RANGE, N, Err.SPAD_RANGE, N, Err.SPAD_RANGE, Err.OVERLAP, N,
                               B, B, B, N])):
        got = _decode(cfg, ops)
        assert [e for e, *_ in got] == want == [_expected(i, cfg) for i in ops], cfg.layer_ops
