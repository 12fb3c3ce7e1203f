"""GEMM engine on Verilator (cocotb, sim/bench_gemm.py): bit-exact to golden.intops.matmul_int
and requantize, random idle and backpressure on every stream, refused bad commands, exact cycles.

Each hardware parameter set builds in its own directory (``sim_build/<name>-<verilog hash>``).
"""


import numpy as np
import pytest
from amaranth.sim import Simulator

import nanokpu.units.gemm as gemm_module
from golden.intops import matmul_int, requantize, wrap
from nanokpu.commands.bench_gemm import breakdown
from nanokpu.config import profile
from nanokpu.gemm_layout import command_layout
from nanokpu.units.gemm import GemmEngine, gemm_cycles, tile_gap
from nanokpu.units.memport import inverting_read_port
from sim.runner import run_bench

# (id, profile, overrides, out_width, seed): at least 2x2, 4x4, 8x8 and a non-square array; all
# three rounding modes (half_even on the others); the narrowest accumulator a config allows (22
# bits for 64 products of int8); a raw 32-bit read-out.
CASES = [
    ("8x8", "small", {}, None, 11),
    ("2x4-raw", "tiny", {"rows": 2, "cols": 4, "acc_width": 32}, 32, 23),
    ("2x2-floor-acc22", "tiny", {"rows": 2, "cols": 2, "rounding": "floor", "acc_width": 22}, None, 23),
    ("2x2-half_up", "tiny", {"rows": 2, "cols": 2, "rounding": "half_up"}, None, 23),
    ("4x4", "tiny", {}, None, 23),
    ("3x2", "tiny", {"rows": 3, "cols": 2, "spad_b_depth": 64}, 16, 23),
]


def bench(name, overrides, out_width, seed, **extra):
    cfg = profile(name, **overrides)
    engine = GemmEngine(cfg, out_width)
    params = {"out_width": out_width, "seed": seed, **extra}
    run_bench(engine, "gemm", "bench_gemm", params=params, seed=seed)


@pytest.mark.slow(65)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gemm_bench(case):
    _, name, overrides, out_width, seed = case
    bench(name, overrides, out_width, seed=seed)


def test_gemm_64x256x256_on_8x8_is_exact_and_busy():
    """The benchmark's headline: cycles equal gemm_cycles and the array is busy >= 99.9% of
    them (ideal = MACs / 64), loading and storing included."""
    cfg = profile("small")
    cycles = gemm_cycles(cfg, 64, 256, 256)
    assert 64 * 256 * 256 / 64 / cycles >= 0.999
    run_bench(GemmEngine(cfg), "gemm", "bench_gemm", testcase="test_exact_cycles", seed=3,
              params={"seed": 3, "timing": [[64, 256, 256]]})


def test_command_layout_fields_hold_the_scratchpads():
    cfg = profile("small")
    layout = command_layout(cfg)
    assert layout.size == sum(f.width for _, f in layout)
    assert 1 << layout["a_addr"].shape.width > cfg.spad_a_depth  # an address past the end is refused,
    assert 1 << layout["c_addr"].shape.width > cfg.spad_c_depth  # not wrapped
    assert 1 << layout["m"].shape.width > cfg.rows * cfg.spad_c_depth


def test_ideal_cycles_of_the_headline_gemm():
    """64 x 256 x 256 on 8x8: 11 (check) + 1 (first words) + 256 tiles * 256 K steps (K >
    tile_gap: no gaps) + 28 (tail) + 17 (store: its other 2,040 words went out under the
    compute; the last tile's 8, read from a cycle before the compute's end, then the
    requantiser's 6 cycles and 5)."""
    cfg = profile("small")
    assert tile_gap(cfg) == 23
    assert gemm_cycles(cfg, 64, 256, 256) == 11 + 1 + 256 * 256 + 28 + (-1 + 7) + 6 + 5


@pytest.mark.parametrize("name", ["tiny", "small"])
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (5, 3, 9), (64, 7, 70), (17, 300, 3)])
def test_benchmark_breakdown_sums_to_the_cycle_model(name, m, k, n):
    cfg = profile(name)
    assert sum(breakdown(cfg, m, k, n).values()) == gemm_cycles(cfg, m, k, n)


@pytest.mark.parametrize("field, value", [("spad_b_depth", 7), ("spad_a_depth", 0), ("spad_c_depth", 1 << 21)])
def test_config_rejects_bad_scratchpads(field, value):
    with pytest.raises(ValueError, match=f"KpuConfig.{field} = {value}"):
        profile("tiny", **{field: value})


def test_reads_of_a_row_written_in_the_same_cycle_are_never_used(monkeypatch):
    """The scratchpads' read data is undefined when the row is written in the same cycle
    (``no_rw_check``, ``nanokpu.units.memport.unchecked_read_port``): with the bits of such a read
    inverted, random GEMMs (load, compute, accumulate, store; M = 2 R; a store alone of fewer
    rows than its region, rows >= M read as 0; a store under the compute over old results)
    under random idle and backpressure stay
    bit-exact, and such reads do happen (Amaranth simulator)."""
    collisions = {}

    def inverted_on_collision(m, memory, name):
        port = inverting_read_port(m, memory, name)
        collisions[name] = port.collide
        return port

    monkeypatch.setattr(gemm_module, "unchecked_read_port", inverted_on_collision)
    cfg = profile("tiny", rows=3, cols=2, spad_b_depth=64)
    R, C, seed = cfg.rows, cfg.cols, 5
    rng = np.random.default_rng(seed)
    dut = GemmEngine(cfg)
    layout = command_layout(cfg)

    def rand(*shape):
        return rng.integers(-128, 128, shape)

    a1, a3, a4 = rand(2 * R + 1, 6), rand(R, 1), rand(2 * R, 2)
    b1, b2, b3, b4 = rand(6, 2 * C + 1), rand(6, 2 * C + 1), rand(1, 3 * C), rand(2, C + 1)
    a5, b5 = rand(2 * R, 2), rand(2, C + 1)
    acc1, acc2 = matmul_int(a1, b1, cfg.acc_width), matmul_int(a1, b2, cfg.acc_width)
    acc12 = wrap(acc1 + acc2, cfg.acc_width)
    # (fields, A or None, B, expected requantised result or None); the M = 2 R GEMM's C region
    # ends where the first one's begins, and a store alone of fewer rows than its region holds
    # leaves out the rest (rows >= M are 0)
    commands = [
        (dict(m=2 * R + 1, k=6, n=2 * C + 1, c_addr=20, load_a=1, compute=1, mult=3, shift=4), a1, b1, None),
        (dict(m=2 * R, k=2, n=C + 1, a_addr=50, c_addr=14, load_a=1, compute=1, store=1, mult=1, shift=0), a4, b4,
         requantize(matmul_int(a4, b4, cfg.acc_width), 1, 0, cfg.out_width, cfg.rounding)),
        (dict(m=2 * R + 1, k=6, n=2 * C + 1, c_addr=20, compute=1, accumulate=1, store=1, mult=5, shift=6), None, b2,
         requantize(acc12, 5, 6, cfg.out_width, cfg.rounding)),
        (dict(m=R + 1, n=2 * C + 1, c_addr=20, store=1, mult=5, shift=6), None, np.zeros((1, 1), dtype=np.int64),
         requantize(acc12[:R + 1], 5, 6, cfg.out_width, cfg.rounding)),
        (dict(m=R, k=1, n=3 * C, a_addr=40, c_addr=40, load_a=1, compute=1, store=1, mult=1, shift=0), a3, b3,
         requantize(matmul_int(a3, b3, cfg.acc_width), 1, 0, cfg.out_width, cfg.rounding)),
        # the store under the compute over old results (their words wait in scratchpad C's read data)
        (dict(m=2 * R, k=2, n=C + 1, a_addr=50, c_addr=20, load_a=1, compute=1, store=1, mult=1, shift=0), a5, b5,
         requantize(matmul_int(a5, b5, cfg.acc_width), 1, 0, cfg.out_width, cfg.rounding)),
    ]
    seen = {name: 0 for name in ("spad_a", "spad_b", "spad_c")}

    def words(x, lanes, blocks_of_rows):
        rows, cols = x.shape if blocks_of_rows else x.T.shape
        pad = rand(-(-rows // lanes) * lanes, cols)
        pad[:rows] = x if blocks_of_rows else x.T
        mask, w = (1 << cfg.in_width) - 1, cfg.in_width
        return [sum((int(v) & mask) << (w * i) for i, v in enumerate(pad[blk * lanes:(blk + 1) * lanes, c]))
                for blk in range(len(pad) // lanes) for c in range(cols)]

    async def tb(ctx):
        for fields, a, b, want in commands:
            word = sum(int(fields.get(name, 0)) << f.offset for name, f in layout)
            a_words = words(a, R, True) if a is not None else []
            b_words = words(b, C, False)
            sent, ai, bi, got = False, 0, 0, []
            for _ in range(5000):
                av, bv = ai < len(a_words) and rng.random() < 0.7, bi < len(b_words) and rng.random() < 0.7
                ctx.set(dut.cmd.valid, not sent)
                ctx.set(dut.cmd.payload.as_value(), word)
                ctx.set(dut.a_in.valid, av)
                ctx.set(dut.a_in.payload.as_value(), a_words[min(ai, len(a_words) - 1)] if a_words else 0)
                ctx.set(dut.b_in.valid, bv)
                ctx.set(dut.b_in.payload.as_value(), b_words[min(bi, len(b_words) - 1)])
                ctx.set(dut.c_out.ready, rng.random() < 0.7)
                sent |= bool(ctx.get(dut.cmd.ready))
                ai += av and ctx.get(dut.a_in.ready)
                bi += bv and ctx.get(dut.b_in.ready)
                if ctx.get(dut.c_out.valid) and ctx.get(dut.c_out.ready):
                    got.append([int(v) for v in ctx.get(dut.c_out.payload)])
                for name, collide in collisions.items():
                    seen[name] += ctx.get(collide)
                done = ctx.get(dut.done)
                await ctx.tick()
                if done:
                    break
            assert not ctx.get(dut.error), f"seed {seed}: {fields} refused"
            if want is not None:
                m, n = fields["m"], fields["n"]
                out = np.array(got).reshape(-(-m // R), n, R).transpose(0, 2, 1).reshape(-1, n)
                assert np.array_equal(out[:m], want), f"seed {seed}: {fields}\n got {out[:m]}\n want {want}"
                assert not out[m:].any(), f"seed {seed}: {fields}: rows >= M not 0\n{out[m:]}"

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert seen["spad_a"] > 0 and seen["spad_b"] > 0, seen


@pytest.mark.parametrize("rounding, out_width, seed", [("half_even", None, 1), ("half_up", "acc_width", 2),
                                                      ("floor", 16, 3)])
def test_rq_in_values_through_the_requantiser(rounding, out_width, seed):
    """``rq_in``: words of values alone through the engine's requantiser (the nano-KPU's REQUANT),
    ``c_out`` lane for lane bit-exact to golden.intops.requantize: extreme accumulators, ties,
    saturation, the largest multiplier and shifts, under random idle and backpressure
    (Amaranth simulator)."""
    cfg = profile("tiny", rows=2, cols=2, rounding=rounding)
    dut = GemmEngine(cfg, out_width=cfg.acc_width if out_width == "acc_width" else out_width)
    ow = dut.out_width
    rng = np.random.default_rng(seed)
    amin, amax, mmax = -(1 << (cfg.acc_width - 1)), (1 << (cfg.acc_width - 1)) - 1, (1 << cfg.mult_width) - 1
    groups = [(mmax, 0), (mmax, 63), (1, 4), (3, 1), (1, 0), (mmax, 31), (int(rng.integers(mmax)), 17)]
    sat = [min(amax, (1 << (ow - 1)) * 16), max(amin, -(1 << (ow - 1)) * 16 - 8)]   # saturate
    values = [amin, amax, -1, 0, 1, 7, 8, 9, -7, -8, -9, 24, -24, *sat]
    values += [int(v) for v in rng.integers(amin, amax, 21, endpoint=True)]
    words = [values[i:i + cfg.rows] for i in range(0, len(values), cfg.rows)]

    async def tb(ctx):
        for mult, shift in groups:
            ctx.set(dut.rq_mult, mult)
            ctx.set(dut.rq_shift, shift)
            sent, got = 0, []
            for _ in range(40 * len(words) + 100):
                valid = sent < len(words) and rng.random() < 0.7
                ctx.set(dut.rq_in.valid, valid)
                ctx.set(dut.rq_in.payload, words[min(sent, len(words) - 1)])
                ctx.set(dut.c_out.ready, rng.random() < 0.7)
                sent += valid and ctx.get(dut.rq_in.ready)
                if ctx.get(dut.c_out.valid) and ctx.get(dut.c_out.ready):
                    got += [int(v) for v in ctx.get(dut.c_out.payload)]
                await ctx.tick()
                if len(got) == len(words) * cfg.rows:
                    break
            want = requantize(np.array(values), mult, shift, ow, rounding).tolist()
            assert got == want, f"seed {seed}: mult {mult} shift {shift}\n got {got}\n want {want}"

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("seed", [1, 2])
def test_per_column_table_and_hold(seed):
    """``column_rq``: with ``col_en`` the store requantises column ``n`` by table entry ``n``
    (random per column, with mult 0 and 2**16 - 1, shift 0 and 63), and does not start while
    ``col_hold`` is high (the table written meanwhile, the hold kept past the compute); then
    with ``col_en`` low the command's constants again (Amaranth simulator, random
    backpressure)."""
    cfg = profile("tiny", rows=2, cols=2)
    dut = GemmEngine(cfg, column_rq=True)
    R, C, (M, K, N) = cfg.rows, cfg.cols, (3, 2, 5)
    rng = np.random.default_rng(seed)
    A, B = rng.integers(-128, 128, (M, K)), rng.integers(-128, 128, (K, N))
    mult = rng.integers(0, 1 << cfg.mult_width, N)
    shift = rng.integers(0, 20, N)
    mult[:2], shift[:3] = [0, (1 << cfg.mult_width) - 1], [63, 0, 20]
    acc = matmul_int(A, B, cfg.acc_width)
    a_words = [[int(A[mb * R + i, k]) if mb * R + i < M else 0 for i in range(R)]
               for mb in range(-(-M // R)) for k in range(K)]
    b_words = [[int(B[k, nb * C + j]) if nb * C + j < N else 0 for j in range(C)]
               for nb in range(-(-N // C)) for k in range(K)]
    hold = gemm_cycles(cfg, M, K, N, store=False) + 10

    async def tb(ctx):
        for col_en, want in ((1, requantize(acc, mult, shift, cfg.out_width, cfg.rounding)),
                             (0, requantize(acc, 5, 3, cfg.out_width, cfg.rounding))):
            ctx.set(dut.col_en, col_en)
            ctx.set(dut.cmd.payload, {"m": M, "k": K, "n": N, "load_a": 1, "compute": 1, "store": 1,
                                      "mult": 5, "shift": 3})
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick()
            ctx.set(dut.cmd.valid, 0)
            ai = bi = 0
            got, first_out = [], None
            for cycle in range(2000):
                ctx.set(dut.col_hold, col_en and cycle < hold)
                ctx.set(dut.col_wr.en, col_en and cycle < N)
                if cycle < N:
                    ctx.set(dut.col_wr.addr, cycle)
                    ctx.set(dut.col_wr.data, {"mult": int(mult[cycle]), "shift": int(shift[cycle])})
                ctx.set(dut.a_in.valid, ai < len(a_words))
                ctx.set(dut.a_in.payload, a_words[min(ai, len(a_words) - 1)])
                ctx.set(dut.b_in.valid, bi < len(b_words))
                ctx.set(dut.b_in.payload, b_words[min(bi, len(b_words) - 1)])
                ctx.set(dut.c_out.ready, rng.random() < 0.7)
                ai += ai < len(a_words) and ctx.get(dut.a_in.ready)
                bi += bi < len(b_words) and ctx.get(dut.b_in.ready)
                if ctx.get(dut.c_out.valid):
                    first_out = cycle if first_out is None else first_out
                    if ctx.get(dut.c_out.ready):
                        got.append([int(v) for v in ctx.get(dut.c_out.payload)])
                done = ctx.get(dut.done)
                await ctx.tick()
                if done:
                    break
            assert col_en == 0 or first_out > hold, (first_out, hold)
            out = np.array(got).reshape(-(-M // R), N, R).transpose(0, 2, 1).reshape(-1, N)
            assert np.array_equal(out[:M], want), f"col_en {col_en}\n got {out[:M]}\n want {want}"

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
