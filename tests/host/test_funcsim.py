"""The functional simulator: bit-exact to golden.block.latent_moe_int; every error code."""

import numpy as np
import pytest

from golden import fidelity, k3
from golden import intops as I
from golden.block import latent_moe_int, quantize_latent_moe
from nanokpu.config import profile
from nanokpu.host.compiler import compile_block, expert_rq_tables, rq_tables
from nanokpu.host.funcsim import FuncSim
from nanokpu.isa import (
    F_ACC,
    F_EPS,
    F_HOST_EXPERT,
    F_L2,
    F_M_COUNT,
    F_RQ_CHANNEL,
    F_RQ_EXPERT,
    LAYER_OPS,
    OP_RULES,
    RQ_WIDTHS,
    SIZES,
    WIDE_ROUTER_OPS,
    Err,
    Instr,
    Op,
    SizeArgs,
    kda_vectors,
    weight_panels,
)


def _compiled(name, T, seed, **overrides):
    cfg = profile(name, **overrides)
    rng = np.random.default_rng(seed)
    P = k3.init_latent_moe(cfg, rng)
    x = rng.standard_normal((T, cfg.d_model)) * rng.uniform(0.1, 3.0)
    Q, xq = quantize_latent_moe(P, x, cfg)
    return cfg, Q, xq, compile_block(Q, xq, cfg)


def _check_block(name, T, seed, **overrides):
    cfg, Q, xq, prog = _compiled(name, T, seed, **overrides)
    sim = FuncSim(cfg, prog.image)
    res = sim.run(prog.instrs)
    assert res.error == Err.NONE, f"seed {seed}: {res}"
    out, ref = prog.outputs(sim.host), latent_moe_int(xq, Q, cfg)
    for key in ("y", "idx", "weights", "loads"):
        assert np.array_equal(out[key], ref[key]), f"{name} seed {seed}: {key} differs"
    assert np.array_equal(sim.loads, ref["loads"])
    # experts nobody chose are skipped
    assert res.op_counts["GATHER"] == int(np.count_nonzero(ref["loads"]))


@pytest.mark.parametrize("scales", ["tensor", "channel"])
@pytest.mark.parametrize("seed", range(20))
def test_tiny_block_bit_exact(seed, scales):
    """Per tensor, and per channel (every GEMM flagged F_RQ_CHANNEL, its table in the scratchpad)."""
    _check_block("tiny", 1 + seed % 9, seed, weight_scales=scales)


@pytest.mark.parametrize("scales", ["tensor", "channel"])
@pytest.mark.parametrize("seed", range(3))
def test_small_block_bit_exact(seed, scales):
    """16 tokens either way: per channel each expert's tables are loaded with it (LOAD with
    F_HOST_EXPERT), not resident for all 64 experts."""
    _check_block("small", 16, 100 + seed, weight_scales=scales)


@pytest.mark.parametrize("name,tokens,seeds", [("tiny", 8, range(10)), ("small", 16, range(2))])
def test_block_bit_exact_in_the_after_scheme(name, tokens, seeds):
    """Issue 26's AFTER scheme, all of it: per-channel scales, the 16-bit router GEMM, router
    logits Q20.16 (wider than the act format: the router requantises to logit_width bits and
    SIGMOID reads them whole), 16-bit scores, 20-bit bias."""
    assert fidelity.AFTER["logit_width"] > profile(name).act_width
    for seed in seeds:
        _check_block(name, tokens, 200 + seed, **fidelity.AFTER)


@pytest.mark.parametrize("scales", ["tensor", "channel"])
@pytest.mark.parametrize("seed", range(8))
def test_tiny_block_bit_exact_wide_router(seed, scales):
    """router_width = 16: x_r LOADed as int16, x_q by REQUANT, the router GEMM as two digit GEMMs of
    [Xh; Xl] (SPLIT) joined and requantised by REQUANT_WIDE (per column: its table)."""
    _check_block("tiny", 1 + seed % 9, 200 + seed, weight_scales=scales, router_width=16)


@pytest.mark.parametrize("scales", ["tensor", "channel"])
@pytest.mark.parametrize("seed", range(2))
def test_small_block_bit_exact_wide_router(seed, scales):
    """16 tokens: the wide router's buffers share the scratchpad words of the expert loop's."""
    _check_block("small", 16, 300 + seed, weight_scales=scales, router_width=16)


@pytest.mark.parametrize("rounding", ["half_even", "half_up", "floor"])
def test_requant_of_x_r_is_input_int8(rounding):
    """The compiler's x_q: REQUANT of x_r with mult 1, shift router_width - in_width, width
    in_width is golden.block.input_int8 bit for bit in every rounding mode (ties, +-router_qmax)."""
    from golden.block import input_int8, router_qmax
    cfg = profile("tiny", router_width=16, rounding=rounding)
    lim = router_qmax(cfg)
    ties = np.arange(-lim, lim + 1, 128)
    x_r = np.concatenate([ties, np.random.default_rng(4).integers(-lim, lim + 1, 3000)])
    sim = FuncSim(cfg)
    sim.spad[:x_r.size] = x_r
    res = sim.run([Instr(Op.REQUANT, m=1, n=x_r.size, a=0, c=4096, mult=1, shift=8, width=8)])
    assert res.error == Err.NONE
    assert np.array_equal(sim.spad[4096:4096 + x_r.size], input_int8(x_r, cfg))


def test_split_writes_balanced_digits():
    """SPLIT: a[i] (its low 2*in_width bits) = c[i] * 256 + c[len + i], c[len + i] in [-128, 128);
    the high digit fits int8 up to router_qmax = 127 * 256."""
    from golden import intops as I
    cfg = profile("tiny", router_width=16)
    a = np.array([0, 1, -1, 127, 128, -128, -129, 255, 256, 32512, -32512, 32767, -32768, 0x12345, -70000])
    sim = FuncSim(cfg)
    sim.spad[:a.size] = a
    assert sim.run([Instr(Op.SPLIT, m=3, n=5, a=0, c=100)]).error == Err.NONE
    h, lo = sim.spad[100:100 + a.size], sim.spad[100 + a.size:100 + 2 * a.size]
    assert np.array_equal(h * 256 + lo, I.wrap(a, 16)) and lo.min() >= -128 and lo.max() < 128
    assert np.abs(h[:11]).max() <= 127 and h[11] == 128 and h[12] == -128


@pytest.mark.parametrize("flags", [0, F_RQ_CHANNEL, F_RQ_EXPERT, F_RQ_CHANNEL | F_RQ_EXPERT])
def test_requant_wide_joins_the_digit_gemms(flags):
    """REQUANT_WIDE of the four digit GEMMs' sums is the requantised 16 x 16-bit product
    (router_acc_width), with the instruction's constants, its expert's entry or column j's entry."""
    from golden import intops as I
    from golden.block import router_qmax
    cfg = profile("tiny", router_width=16)
    rng = np.random.default_rng(9)
    m, k, n, E, expert = 3, 32, 8, cfg.n_experts, 5
    lim = router_qmax(cfg)
    x, w = (np.clip(rng.integers(-lim, lim + 1, s), -lim, lim) for s in ((m, k), (n, k)))
    x[0], w[0] = lim, -lim                                        # the extreme digits
    (xh, xl), (wh, wl) = I.split_digits(x, 8), I.split_digits(w, 8)
    parts = [I.matmul_int(xd, wd.T, cfg.acc_width) for wd in (wh, wl) for xd in (xh, xl)]   # hh, lh, hl, ll
    mult, shift = rng.integers(1 << 15, 1 << 16, (n, E)), rng.integers(16, 40, (n, E))
    sim = FuncSim(cfg)
    sim.spad[:4 * m * n] = np.concatenate([p.ravel() for p in parts])
    sim.spad[1000:1000 + 2 * n * E] = np.stack([mult, shift], -1).ravel()
    sim.route_done, sim.expert, sim.count, sim.offset = True, expert, 1, 0     # as after ROUTE and EXPERT
    sim.step(Instr(Op.REQUANT_WIDE, flags=flags, m=m, n=n, a=0, b=1000, c=500, mult=40000, shift=30, width=16),
             Op.REQUANT_WIDE, 0)
    table = sim.spad[1000:1000 + 2 * n * E]
    if flags & F_RQ_CHANNEL:    # column j's entry at b + 2*(j*E + e), E = 1 and e = 0 without F_RQ_EXPERT
        cols = table.reshape(n, E, 2)[:, expert] if flags & F_RQ_EXPERT else table[:2 * n].reshape(n, 2)
        mm, ss = cols[:, 0], cols[:, 1]
    elif flags & F_RQ_EXPERT:
        mm, ss = sim.spad[1000 + 2 * expert], sim.spad[1001 + 2 * expert]
    else:
        mm, ss = 40000, 30
    ref = I.requantize(I.matmul_int(x, w.T, cfg.router_acc_width), mm, ss, 16, cfg.rounding)
    assert np.array_equal(sim.spad[500:500 + m * n].reshape(m, n), ref)
    assert np.abs(I.matmul_int(x, w.T, cfg.router_acc_width)).max() >= 1 << cfg.acc_width   # wider than acc


def test_expert_tables_loaded_per_expert():
    """Per channel the block loads each chosen expert's tables once, before its first GEMM."""
    cfg, Q, xq, prog = _compiled("tiny", 6, 7, weight_scales="channel")
    res = FuncSim(cfg, prog.image).run(prog.instrs)
    tables = sum(expert_rq_tables(cfg).values())
    loads = [i for i in prog.instrs if i.op == Op.LOAD and i.flags & F_HOST_EXPERT]
    assert [(i.n, i.c) for i in loads] == [(tables, prog.spad["rq"] + sum(rq_tables(cfg).values()) - tables)]
    assert res.op_counts["LOAD"] == 3 + res.op_counts["GATHER"]


def test_gemms_run_on_the_engine_passed_in():
    """``FuncSim(gemm=...)`` (the iCEBreaker build's engine in ``board-run``) gets every GEMM with
    its operands, requantiser constants of the instruction or its expert's table, and the block
    is made of what it returns: bit-exact with an engine that keeps the contract, not with one
    that is off by one."""
    from golden import intops as I
    cfg, Q, xq, prog = _compiled("tiny", 3, 5)
    calls = []

    def engine(a, b, mult, shift):
        calls.append(((*a.shape, b.shape[1]), mult, shift))
        assert a.min() >= -128 and a.max() <= 127 and b.min() >= -128 and b.max() <= 127
        return I.requantize(I.matmul_int(a, b, cfg.acc_width), mult, shift, cfg.acc_width, cfg.rounding)

    sim = FuncSim(cfg, prog.image, gemm=engine)
    res = sim.run(prog.instrs)
    ref = latent_moe_int(xq, Q, cfg)
    assert res.error == Err.NONE and [shape for shape, _, _ in calls] == res.gemms
    assert {(mult, shift) for _, mult, shift in calls} - {(1, 0)}, "no requantising GEMM in the block"
    for key in ("y", "idx", "weights", "loads"):
        assert np.array_equal(prog.outputs(sim.host)[key], ref[key]), key
    off = FuncSim(cfg, prog.image, gemm=lambda a, b, mult, shift: engine(a, b, mult, shift) + 1)
    assert off.run(prog.instrs).error == Err.NONE
    assert not np.array_equal(prog.outputs(off.host)["y"], ref["y"])


# -- bad programs ------------------------------------------------------------------------
def _run(instrs, cfg=None, host=bytes(64)):
    cfg = cfg or profile("tiny")
    sim = FuncSim(cfg, host)
    before = sim.spad.copy()
    return sim.run(instrs), sim, before


@pytest.mark.parametrize("instrs,code", [
    ([Instr(63)], Err.BAD_OPCODE),
    ([Instr(Op.GEMM, m=2, k=2, n=2, c=8191)], Err.SPAD_RANGE),
    ([Instr(Op.GEMM, m=1, k=65, n=2)], Err.BAD_SHAPE),
    ([Instr(Op.GEMM, m=1, k=8, n=2, c=100, host=60)], Err.HOST_RANGE),
    ([Instr(Op.ADD, m=1, n=4, a=0, b=10, c=2)], Err.OVERLAP),
    ([Instr(Op.ADD, m=1, n=4, a=10, b=2, c=2)], Err.NONE),    # in place on b: allowed
    ([Instr(Op.NORM, m=2, n=4, a=0, c=0)], Err.NONE),            # in place: allowed
    ([Instr(Op.NORM, m=2, n=4, a=0, c=4)], Err.OVERLAP),         # row 1 would read row 0's result
    ([Instr(Op.GEMM, m=1, k=4, n=2, a=0, c=3, host=0)], Err.OVERLAP),
    ([Instr(Op.COMBINE, m=1, k=2, n=2, a=0, b=8, c=0)], Err.OVERLAP),   # not element-wise
    ([Instr(Op.SIGMOID, m=2, n=8, a=0, c=16), Instr(Op.ROUTE, m=2, n=8, k=2, a=16, b=100, c=20)],
     Err.OVERLAP),                                               # the table over the scores
    ([Instr(Op.GEMM, m=0, k=2, n=2)], Err.BAD_SHAPE),
    ([Instr(Op.LOAD, m=1, n=4, width=3)], Err.BAD_SHAPE),
    ([Instr(Op.ROUTE, m=2, n=8, k=2, a=0, b=100, c=200)], Err.NO_SCORES),
    ([Instr(Op.SIGMOID, m=2, n=8, a=0, c=16), Instr(Op.ROUTE, m=2, n=8, k=2, a=0, b=100, c=200)],
     Err.NO_SCORES),
    ([Instr(Op.LOAD, m=1, n=128, width=1)], Err.HOST_RANGE),
    ([Instr(Op.LOAD, m=1, n=4, width=1, host=2)], Err.HOST_RANGE),
    ([Instr(Op.JUMP, target=64)], Err.PC_RANGE),
    ([Instr(Op.GEMM, flags=F_M_COUNT, k=2, n=2)], Err.NO_ROUTE),
    ([Instr(Op.GATHER, m=2, n=2)], Err.NO_ROUTE),
    ([Instr(Op.EXPERT, n=8, a=0, target=0)], Err.NO_ROUTE),
])
def test_bad_program_stops_with_code(instrs, code):
    res, sim, before = _run(instrs + [Instr(Op.HALT)])
    assert res.error == code
    assert res.pc == len(instrs) - (code != Err.NONE)
    if len(instrs) == 1 and code != Err.NONE:
        assert np.array_equal(sim.spad, before)  # nothing written


def test_running_off_the_end_of_imem():
    res, _, _ = _run([Instr(Op.JUMP, target=63)] + [Instr(Op.ADD, m=1, n=1)] * 63)
    assert res.error == Err.PC_RANGE and res.pc == 64


def test_gather_index_out_of_range_stops_midway():
    from sim.bench_top import gather_out_of_range
    cfg = profile("tiny")
    instrs = gather_out_of_range(cfg)
    res, sim, _ = _run(instrs, cfg, host=(1000).to_bytes(4, "little") + bytes(60))
    assert res.error == Err.SPAD_RANGE and res.pc == len(instrs) - 1
    assert not sim.spad[1000:1008].any()  # the bad row was not copied


# -- the rules of OP_RULES, each broken in turn --------------------------------------------
_RULED = [op for op, r in OP_RULES.items() if (r.a or r.c) and not (r.route or r.expert)]


def _valid(op, cfg, **fields):
    """A program ending in one ``op`` that passes every check: m = 1 (2 with taps: k <= m), n = 2
    (n_experts), k = 2 (top_k, kda_head_dim), the first allowed width; a at 0, b at 100 (300 for
    KDA_STEP's state of 2*K*K words), c at 200 (a ROUTE's scores written by a SIGMOID before it)."""
    r = OP_RULES[op]
    width = next((w for w in r.widths if w != RQ_WIDTHS), 8) if r.widths else 0
    k = cfg.top_k if r.top_k else cfg.kda_head_dim if r.head_dim else 2
    values = dict(m=2 if r.taps else 1, n=cfg.n_experts if r.n_experts else 2, k=k,
                  a=0, b=300 if r.a_written else 100, c=200, width=width)
    values.update(fields)
    pre = [Instr(Op.SIGMOID, m=values["m"], n=values["n"], a=300, c=values["a"])] if r.scores else []
    return pre + [Instr(op, **values)]


def _code(instrs, cfg):
    res, _, _ = _run(instrs + [Instr(Op.HALT)], cfg, host=bytes(256))
    return res.error


def _cfg(op):
    """tiny, with a wide router or the layer's ops for the ops only they build."""
    if op in WIDE_ROUTER_OPS:
        return profile("tiny", router_width=16)
    return profile("tiny", layer_ops=op in LAYER_OPS)


@pytest.mark.parametrize("op", WIDE_ROUTER_OPS + LAYER_OPS, ids=lambda op: op.name)
def test_optional_ops_are_bad_opcodes_when_not_built(op):
    """SPLIT and REQUANT_WIDE are built only with router_width > in_width, SILU and DECAY only
    with layer_ops: otherwise the same valid instruction stops with BAD_OPCODE, and nothing is
    written."""
    tiny = profile("tiny")
    res, sim, _ = _run(_valid(op, _cfg(op)) + [Instr(Op.HALT)], tiny, host=bytes(256))
    assert (res.error, res.pc, res.retired) == (Err.BAD_OPCODE, 0, 0)
    assert not sim.spad.any()


@pytest.mark.parametrize("op", _RULED, ids=lambda op: op.name)
def test_each_shape_rule_is_checked(op):
    cfg = _cfg(op)
    r = OP_RULES[op]
    assert _code(_valid(op, cfg), cfg) == Err.NONE
    for letter in r.positive:
        assert _code(_valid(op, cfg, **{letter: 0}), cfg) == Err.BAD_SHAPE, f"{letter} = 0"
    if r.n_experts:
        assert _code(_valid(op, cfg, n=cfg.n_experts + 1), cfg) == Err.BAD_SHAPE
    if r.top_k:
        assert _code(_valid(op, cfg, k=cfg.top_k + 1), cfg) == Err.BAD_SHAPE
    if r.softmax_row:
        top = cfg.attnres_candidates
        assert [_code(_valid(op, cfg, n=n), cfg) for n in (top, top + 1)] == [Err.NONE, Err.BAD_SHAPE]
    if r.taps:
        assert [_code(_valid(op, cfg, k=k), cfg) for k in (1, 2, 3)] == [Err.NONE, Err.NONE, Err.BAD_SHAPE]
    if r.head_dim:
        K = cfg.kda_head_dim
        assert [_code(_valid(op, cfg, k=k), cfg) for k in (K - 1, K + 1)] == [Err.BAD_SHAPE] * 2
    for width in range(64):
        if not r.width_ok(width, cfg):
            assert _code(_valid(op, cfg, width=width), cfg) == Err.BAD_SHAPE, f"width {width}"


@pytest.mark.parametrize("op", _RULED, ids=lambda op: op.name)
def test_each_region_is_checked(op):
    """Every region OP_RULES names ends inside the scratchpad or stops with SPAD_RANGE; the result
    may lie on an operand only exactly and only for the in-place ops."""
    cfg = _cfg(op)
    r = OP_RULES[op]
    D = cfg.dmem_depth
    probe = _valid(op, cfg)[-1]
    args = SizeArgs.of(probe, cfg)
    for field in "abc":
        name = getattr(r, field)
        if not name or (field == "a" and r.scores):     # a ROUTE's a is the scores region
            continue
        words = SIZES[name](args)
        if not words:       # no region (the rq table without F_RQ_EXPERT): its base is not read
            assert _code(_valid(op, cfg, **{field: D + 1}), cfg) == Err.NONE, f"{field}: no region"
            continue
        assert _code(_valid(op, cfg, **{field: D - words}), cfg) != Err.SPAD_RANGE, f"{field} at the end"
        assert _code(_valid(op, cfg, **{field: D - words + 1}), cfg) == Err.SPAD_RANGE, f"{field} one past"
    for field in "ab":
        name = getattr(r, field)
        if not (name and r.c) or (field == "a" and r.scores):
            continue
        words = SIZES[name](args)
        on_it = _code(_valid(op, cfg, c=getattr(probe, field)), cfg)
        assert on_it == (Err.NONE if not words or r.in_place and words == SIZES[r.c](args) else Err.OVERLAP), \
            f"c on {field}"
        if words and r.in_place:
            assert _code(_valid(op, cfg, c=getattr(probe, field) + 1), cfg) == Err.OVERLAP, f"c on {field} + 1"
    if r.a_written:     # a is a result too: b on its last word overlaps it, b just after it does not
        wa = SIZES[r.a](args)
        assert [_code(_valid(op, cfg, b=probe.a + wa - 1), cfg), _code(_valid(op, cfg, b=probe.a + wa), cfg)] \
            == [Err.OVERLAP, Err.NONE]


@pytest.mark.parametrize("op, table", [(Op.SILU, "silu_q"), (Op.DECAY, "decay_q")], ids=["SILU", "DECAY"])
def test_layer_table_ops_are_their_golden_functions(op, table):
    """SILU and DECAY: every act-format input (2**16), the upper bits of each word ignored."""
    cfg = profile("tiny", layer_ops=True, dmem_depth=1 << 17)
    x = np.arange(-(1 << 15), 1 << 15)
    sim = FuncSim(cfg)
    sim.spad[:x.size] = x + (np.random.default_rng(3).integers(-3, 4, x.size) << 16)
    res = sim.run([Instr(op, m=256, n=256, a=0, c=1 << 16), Instr(Op.HALT)])
    assert res.error == Err.NONE
    assert np.array_equal(sim.spad[1 << 16:2 << 16], getattr(I, table)(x, cfg))


def test_softmax_is_softmax_int_per_row():
    """SOFTMAX over rows of every length up to attnres_candidates: ties, both ends of the act
    format (s - m saturating), the upper bits of each word ignored; in place too."""
    cfg = profile("tiny", layer_ops=True)
    rng = np.random.default_rng(4)
    lo, hi = -(1 << (cfg.act_width - 1)), (1 << (cfg.act_width - 1)) - 1
    for n in range(1, cfg.attnres_candidates + 1):
        s = rng.integers(lo, hi + 1, (40, n))
        s[0], s[1], s[2, :1] = lo, 7, hi
        s[3] = np.where(np.arange(n) % 2, lo, hi)
        for c in (0, 1000):
            sim = FuncSim(cfg)
            sim.spad[:s.size] = s.ravel() + (rng.integers(-4, 4, s.size) << cfg.act_width)
            assert sim.run([Instr(Op.SOFTMAX, m=40, n=n, a=0, c=c), Instr(Op.HALT)]).error == Err.NONE
            assert np.array_equal(sim.spad[c:c + s.size].reshape(40, n), I.softmax_int(s, cfg)), (n, c)


def test_norm_then_mul_is_rmsnorm_weight_int():
    """NORM then MUL by the weight row is golden.intops.rmsnorm_weight_int: weights of both signs,
    both ends of mult_width, their quantised shift (quantize_norm_weight) and the extremes of shift
    (0, 63); rows that saturate in the norm; in place."""
    cfg = profile("tiny", layer_ops=True)
    rng = np.random.default_rng(11)
    lo, hi = -(1 << (cfg.act_width - 1)), (1 << (cfg.act_width - 1)) - 1
    T, n = 6, 16
    u = rng.integers(lo, hi + 1, (T, n)) >> rng.integers(0, 12, (T, 1))
    u[0], u[1, :] = 0, 3
    u[1, 0] = hi                                   # one large value among small ones: saturates
    w_real = rng.normal(1.0, 0.5, n)
    w_real[:2] = (-2.0, 0.0)
    cases = [I.quantize_norm_weight(w_real, cfg), (np.array([-(1 << 15), (1 << 15) - 1] * (n // 2)), 0),
             (rng.integers(-(1 << 15), 1 << 15, n), 63)]
    for w, shift in cases:
        sim = FuncSim(cfg)
        sim.spad[:T * n] = u.ravel()
        sim.spad[500:500 + n] = w
        prog = [Instr(Op.NORM, m=T, n=n, a=0, c=100), Instr(Op.MUL, m=T, n=n, a=100, b=500, c=100, shift=shift),
                Instr(Op.HALT)]
        assert sim.run(prog).error == Err.NONE
        assert np.array_equal(sim.spad[100:100 + T * n].reshape(T, n), I.rmsnorm_weight_int(u, w, shift, cfg)), shift


def test_norm_with_its_eps_word_is_rmsnorm_of_another_format():
    """NORM with F_EPS (the word at b: rms_eps_q of fractional bits f, random upper bits) is golden
    rmsnorm_int of rows in Q<act_width>.<f>, f = act_frac (the plain NORM's), 12 and 15 (KDA's largest o_frac), on
    rows small enough for the epsilon to matter and a zero row; NORM, then MUL by the weight, is KDA's
    o_norm (rmsnorm_weight_int at act_frac = f); BAD_SHAPE where layer_ops did not build it."""
    cfg = profile("tiny", layer_ops=True)
    rng = np.random.default_rng(12)
    T, n = 5, 16
    u = rng.integers(-6, 7, (T, n))
    u[0], u[1] = 0, rng.integers(-3000, 3000, n)
    w, w_shift = I.quantize_norm_weight(rng.normal(1.0, 0.3, n), cfg)
    results = set()
    for f in (cfg.act_frac, 12, 15):
        sim = FuncSim(cfg)
        sim.spad[:T * n] = u.ravel()
        sim.spad[400] = I.rms_eps_q(cfg, f) + (5 << 2 * cfg.act_width)
        sim.spad[500:500 + n] = w
        prog = [Instr(Op.NORM, flags=F_EPS, m=T, n=n, a=0, b=400, c=100),
                Instr(Op.MUL, m=T, n=n, a=100, b=500, c=200, shift=w_shift), Instr(Op.HALT)]
        assert sim.run(prog).error == Err.NONE
        fmt = cfg.replace(act_frac=f)
        assert np.array_equal(sim.spad[100:100 + T * n].reshape(T, n), I.rmsnorm_int(u, fmt)), f
        assert np.array_equal(sim.spad[200:200 + T * n].reshape(T, n), I.rmsnorm_weight_int(u, w, w_shift, fmt)), f
        results.add(tuple(sim.spad[100:100 + T * n]))
    assert len(results) == 3       # the epsilon word changes the result
    bare = FuncSim(profile("tiny"))
    assert bare.run([Instr(Op.NORM, flags=F_EPS, m=T, n=n, a=0, b=400, c=100), Instr(Op.HALT)]).error == Err.BAD_SHAPE


def test_norm_with_f_l2_is_the_l2norm_of_kda_heads():
    """NORM with F_L2 over the heads of KDA's q (m = T*H rows of K) is golden l2norm_int at
    kda_unit_frac, the config's epsilon or (with F_EPS) the word at b, in place too: the rows of
    kda_int's q; BAD_SHAPE where layer_ops did not build it."""
    cfg = profile("tiny", layer_ops=True, act_frac=10)        # l2_eps_q = 1: the epsilon shows
    rng = np.random.default_rng(13)
    rows, K = 6, 8
    u = rng.integers(-4, 5, (rows, K))
    u[0], u[1] = 0, rng.integers(-30000, 30000, K)
    for flags, eps_q in ((F_L2, I.l2_eps_q(cfg)), (F_L2 | F_EPS, 777)):
        for c in (100, 0):
            sim = FuncSim(cfg)
            sim.spad[:rows * K] = u.ravel()
            sim.spad[400] = eps_q + (9 << 2 * cfg.act_width)
            prog = [Instr(Op.NORM, flags=flags, m=rows, n=K, a=0, b=400, c=c), Instr(Op.HALT)]
            assert sim.run(prog).error == Err.NONE
            got = sim.spad[c:c + rows * K].reshape(rows, K)
            assert np.array_equal(got, I.l2norm_int(u, cfg.kda_unit_frac, cfg, eps_q)), (flags, c)
            assert not np.array_equal(got, I.l2norm_int(u, cfg.kda_unit_frac, cfg, eps_q + 1)), (flags, c)
    bare = FuncSim(profile("tiny"))
    assert bare.run([Instr(Op.NORM, flags=F_L2, m=rows, n=K, a=0, c=100), Instr(Op.HALT)]).error == Err.BAD_SHAPE


def test_conv_then_requant_is_kdas_short_convolution():
    """CONV over [tail; p] then REQUANT is golden KDA's short convolution (kda._short_conv_int:
    short_conv_int, then its requantiser) of a quantised mixer's q branch, for 3 tokens and for a
    decode step of 1; the new tail is the last k - 1 rows; BAD_OPCODE without layer_ops."""
    from golden import kda as KD

    cfg = profile("tiny", layer_ops=True)
    rng = np.random.default_rng(14)
    P = k3.init_kda(cfg, rng)
    Q, _ = KD.quantize_kda(P, rng.standard_normal((6, cfg.d_model)), cfg)
    conv, k = Q.conv_q, cfg.kda_conv
    C = conv.W.shape[0]
    for T in (3, 1):
        p = rng.integers(-3000, 3000, (T, C))
        tail = rng.integers(-3000, 3000, (k - 1, C))
        want, new_tail = KD._short_conv_int(p, tail, conv, cfg)
        sim = FuncSim(cfg)
        sim.spad[:(T + k - 1) * C] = np.concatenate([tail, p]).ravel()
        sim.spad[1000:1000 + C * k] = conv.W.ravel()
        prog = [Instr(Op.CONV, m=T + k - 1, n=C, k=k, a=0, b=1000, c=2000),
                Instr(Op.REQUANT, m=T, n=C, a=2000, c=2000, mult=int(conv.rq.mult), shift=int(conv.rq.shift),
                      width=cfg.act_width), Instr(Op.HALT)]
        assert sim.run(prog).error == Err.NONE
        assert np.array_equal(sim.spad[2000:2000 + T * C].reshape(T, C), want), T
        assert np.array_equal(sim.spad[T * C:(T + k - 1) * C].reshape(k - 1, C), new_tail), T
    bare = FuncSim(profile("tiny"))
    assert bare.run([prog[0], Instr(Op.HALT)]).error == Err.BAD_OPCODE


def test_wf_gemm_bias_and_per_column_requant_is_kdas_decay_branch():
    """KDA's decay from its W_f projection: GEMM raw, ADD with F_ACC (the bias dt_bias in
    accumulator units, acc-width, saturating), REQUANT with F_RQ_CHANNEL (exp(A_log) of each
    column's head in its multiplier), DECAY == golden decay_q(proj_f(x, f_bias)) for 2 tokens;
    BAD_SHAPE without layer_ops."""
    from golden import kda as KD

    cfg = profile("tiny", layer_ops=True)
    rng = np.random.default_rng(15)
    P = k3.init_kda(cfg, rng)
    Q, x_q = KD.quantize_kda(P, rng.standard_normal((2, cfg.d_model)), cfg)
    W, rq, bias = Q.proj_f.W, Q.proj_f.rq, Q.f_bias
    C, d = W.shape
    assert rq.per_column and len(set(rq.mult)) > 1
    sim = FuncSim(cfg, host=weight_panels(W, cfg).astype(np.int8).tobytes())
    sim.spad[:2 * d] = x_q.ravel()
    sim.spad[1000:1000 + 2 * C] = np.tile(bias, 2)
    sim.spad[2000:2000 + 2 * C] = np.stack([rq.mult, rq.shift], axis=-1).ravel()
    prog = [Instr(Op.GEMM, m=2, k=d, n=C, a=0, c=3000, host=0, width=0),
            Instr(Op.ADD, flags=F_ACC, m=2, n=C, a=3000, b=1000, c=3000),
            Instr(Op.REQUANT, flags=F_RQ_CHANNEL, m=2, n=C, a=3000, b=2000, c=3000, width=rq.width),
            Instr(Op.DECAY, m=2, n=C, a=3000, c=3000), Instr(Op.HALT)]
    assert sim.run(prog).error == Err.NONE
    want = I.decay_q(Q.proj_f(x_q, cfg, bias), cfg)
    assert np.array_equal(sim.spad[3000:3000 + 2 * C].reshape(2, C), want)
    bare = FuncSim(profile("tiny"))
    for ins in prog[1:3]:
        assert bare.run([ins, Instr(Op.HALT)]).error == Err.BAD_SHAPE, ins.op


def test_kda_step_chains_decode_steps_as_golden_kda():
    """KDA_STEP over 4 tokens == 4 decode steps of 1 token, the state left in the scratchpad between
    them == golden kda_step_int token after token (the state and o = rq_read(S^T q)) of a quantised
    mixer's read-out requantiser; BAD_OPCODE without layer_ops."""
    from golden import kda as KD
    from sim import bench_kda_state as B

    cfg = profile("tiny", layer_ops=True)
    rng = np.random.default_rng(16)
    Q, _ = KD.quantize_kda(k3.init_kda(cfg, rng), rng.standard_normal((4, cfg.d_model)), cfg)
    H, K, T = cfg.n_heads, cfg.kda_head_dim, 4
    S0, decay, k, v, beta, q = B.token_steps(B.random_steps(cfg, rng, T * H), T, H)
    planes = kda_vectors(q, k, v, decay, beta)                               # [T, H, K] planes, one call
    steps = np.concatenate([kda_vectors(q[t], k[t], v[t], decay[t], beta[t]) for t in range(T)])   # one a step
    rq = Q.rq_read
    step = dict(n=H, k=K, a=0, c=3000, mult=rq.mult, shift=rq.shift, width=rq.width)
    results = []
    for prog, vectors in (([Instr(Op.KDA_STEP, m=T, b=1000, **step)], planes),
                          ([Instr(Op.KDA_STEP, m=1, b=1000 + t * H * (4 * K + 1), **step | {"c": 3000 + t * H * K})
                            for t in range(T)], steps)):
        sim = FuncSim(cfg)
        sim.spad[:S0.size] = S0.ravel()
        sim.spad[1000:1000 + vectors.size] = vectors
        assert sim.run(prog + [Instr(Op.HALT)]).error == Err.NONE
        results.append((sim.spad[:S0.size].copy(), sim.spad[3000:3000 + T * H * K].copy()))
    S, o = S0, []
    for t in range(T):
        S, o_t = KD.kda_step_int(S, q[t], k[t], v[t], decay[t], beta[t], Q, cfg)
        o.append(o_t)
    for got_S, got_o in results:
        assert np.array_equal(got_S, S.ravel()) and np.array_equal(got_o, np.concatenate(o).ravel())
    bare = FuncSim(profile("tiny"))
    assert bare.run([Instr(Op.KDA_STEP, m=1, b=1000, **step), Instr(Op.HALT)]).error == Err.BAD_OPCODE


def test_mul_of_one_row_gates_element_by_element():
    """MUL with m = 1 is the element-wise gate of the KDA and MLA outputs: round_shift(n * sigmoid,
    score_frac), ties of both signs included."""
    cfg = profile("tiny", layer_ops=True)
    rng = np.random.default_rng(12)
    n = rng.integers(-128, 128, 200)
    s = I.sigmoid_q(rng.integers(-(1 << 15), 1 << 15, 200), cfg)
    n[:4], s[:4] = [3, -3, 127, -128], [1 << (cfg.score_frac - 1)] * 2 + [1 << cfg.score_frac] * 2
    sim = FuncSim(cfg)
    sim.spad[:200], sim.spad[300:500] = n, s
    assert sim.run([Instr(Op.MUL, m=1, n=200, a=0, b=300, c=600, shift=cfg.score_frac), Instr(Op.HALT)]).error == 0
    assert np.array_equal(sim.spad[600:800], I.round_shift(n * s, cfg.score_frac, cfg.rounding))
