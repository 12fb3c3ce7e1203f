"""cocotb bench of nanokpu.units.gemm.GemmEngine on Verilator, bit-exact against golden.intops.

The engine's config comes from :func:`sim.runner.bench_config`. Parameters (``NANOKPU_PARAMS``):
``seed``, ``idle`` (probability that a source skips a cycle), ``backpressure``
(probability that the sink is not ready), ``out_width`` (the engine's, default
``cfg.out_width``), and for :func:`test_exact_cycles` the shapes to time (``timing``), whether
to time each also without its store (``compute_only``) and the JSON file to write the cycle
counts to (``report``). Every failure message carries the seed.
"""

from __future__ import annotations

import json
import time

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from golden.intops import matmul_int, requantize, wrap
from nanokpu.gemm_layout import GemmError, a_words, b_words, c_matrix, command_word
from nanokpu.units.gemm import gemm_cycles
from sim.runner import bench_config, bench_params


class TB:
    """Clock, reset, stream sources with random idle, a sink with random backpressure."""

    def __init__(self, dut, seed_offset: int = 0):
        p = bench_params()
        self.dut = dut
        self.cfg = bench_config()
        self.out_width = p.get("out_width") or self.cfg.out_width
        self.seed = int(p.get("seed", 1)) + seed_offset
        self.rng = np.random.default_rng(self.seed)
        self.idle = float(p.get("idle", 0.3))
        self.backpressure = float(p.get("backpressure", 0.3))
        self.cycle = 0
        self.dut._log.info(f"seed {self.seed}, cfg {self.cfg.rows}x{self.cfg.cols} "
                           f"rounding {self.cfg.rounding}, idle {self.idle}, backpressure {self.backpressure}")
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())

    def where(self) -> str:
        return f"(seed {self.seed})"

    async def reset(self):
        d = self.dut
        # every input driven (rq_in is not used here: on Icarus an undriven input is z, which the
        # requantiser's input mux would turn into x)
        for sig in (d.cmd__valid, d.a_in__valid, d.b_in__valid, d.c_out__ready, d.rq_in__valid,
                    d.rq_in__payload, d.rq_mult, d.rq_shift):
            sig.value = 0
        d.rst.value = 1
        for _ in range(3):
            await RisingEdge(d.clk)
        d.rst.value = 0
        await RisingEdge(d.clk)
        cocotb.start_soon(self._count())

    async def _count(self):
        while True:
            await RisingEdge(self.dut.clk)
            self.cycle += 1

    def command(self, **fields) -> int:
        return command_word(self.cfg, **fields)

    async def send(self, valid, ready, payload, words, idle):
        """Drive ``words`` on a stream; returns the cycles of the transfers."""
        at = []
        for word in words:
            while True:
                await RisingEdge(self.dut.clk)
                go = not (idle and self.rng.random() < idle)
                valid.value = int(go)
                payload.value = word
                await ReadOnly()
                if go and ready.value:
                    at.append(self.cycle)
                    break
        await RisingEdge(self.dut.clk)
        valid.value = 0
        return at

    async def recv(self, n, backpressure):
        d = self.dut
        words = []
        while len(words) < n:
            await RisingEdge(d.clk)
            d.c_out__ready.value = int(not (backpressure and self.rng.random() < backpressure))
            await ReadOnly()
            if d.c_out__valid.value and d.c_out__ready.value:
                words.append(int(d.c_out__payload.value))
        await RisingEdge(d.clk)
        d.c_out__ready.value = 0
        return words

    async def wait_done(self, limit):
        for _ in range(limit):
            await RisingEdge(self.dut.clk)
            await ReadOnly()
            if self.dut.done.value:
                return self.cycle
        raise AssertionError(f"no done within {limit} cycles {self.where()}")

    # -- data layout: lanes of rows >= M and columns >= N junk (the engine must ignore them) ---
    def a_words(self, a):
        return a_words(self.cfg, a, self.rng)

    def b_words(self, b):
        return b_words(self.cfg, b, self.rng)

    def c_matrix(self, words, m, n):
        try:
            return c_matrix(self.cfg, words, m, n, self.out_width)
        except ValueError as exc:
            raise AssertionError(f"{exc} {self.where()}") from None

    async def gemm(self, a=None, b=None, *, m, k, n, a_addr=0, c_addr=0, mult=1, shift=0,
                   load_a=True, compute=True, accumulate=False, store=True, idle=None,
                   backpressure=None):
        """Run one command; returns (result [M, N] or None, cycles from accept to done, error)."""
        d = self.dut
        idle = self.idle if idle is None else idle
        backpressure = self.backpressure if backpressure is None else backpressure
        word = self.command(m=m, k=k, n=n, a_addr=a_addr, c_addr=c_addr, mult=mult, shift=shift,
                            load_a=load_a, compute=compute, accumulate=accumulate, store=store)
        cmd = cocotb.start_soon(self.send(d.cmd__valid, d.cmd__ready, d.cmd__payload, [word], idle))
        tasks = []
        if load_a:
            tasks.append(cocotb.start_soon(
                self.send(d.a_in__valid, d.a_in__ready, d.a_in__payload, self.a_words(a), idle)))
        if compute:
            tasks.append(cocotb.start_soon(
                self.send(d.b_in__valid, d.b_in__ready, d.b_in__payload, self.b_words(b), idle)))
        sink = None
        if store:
            sink = cocotb.start_soon(self.recv(-(-m // self.cfg.rows) * n, backpressure))
        accepted = (await cmd)[0]
        limit = 50 + 4 * (m * k * n + m * n + m * k + k * n) // max(1, 1 - idle) + 100 * (k + n + m)
        done = await self.wait_done(int(limit / (1 - max(idle, backpressure))))
        assert not d.error.value, f"command refused with code {int(d.error_code.value)} {self.where()}"
        for t in tasks:
            await t
        out = self.c_matrix(await sink, m, n) if sink else None
        return out, done - accepted

    async def refused(self, code, **fields):
        """Send a bad command; it must end with ``error`` and ``code`` and touch no stream."""
        d = self.dut
        d.a_in__valid.value = 1
        d.b_in__valid.value = 1
        d.c_out__ready.value = 1
        await self.send(d.cmd__valid, d.cmd__ready, d.cmd__payload, [self.command(**fields)], 0)
        while True:
            await ReadOnly()
            assert not d.a_in__ready.value and not d.b_in__ready.value, f"{fields} took data {self.where()}"
            assert not d.c_out__valid.value, f"{fields} streamed a result {self.where()}"
            if d.done.value:
                break
            await RisingEdge(d.clk)
        assert d.error.value == 1 and int(d.error_code.value) == code, (
            f"{fields}: error {int(d.error.value)} code {int(d.error_code.value)}, want {code!r} {self.where()}")
        await RisingEdge(d.clk)
        d.a_in__valid.value = 0
        d.b_in__valid.value = 0
        d.c_out__ready.value = 0

    # -- golden --------------------------------------------------------------------------
    def rand(self, *shape):
        return self.rng.integers(-(1 << (self.cfg.in_width - 1)), 1 << (self.cfg.in_width - 1), shape)

    def expect(self, acc, mult, shift):
        return requantize(acc, mult, shift, self.out_width, self.cfg.rounding)

    def check(self, got, want, what):
        if not np.array_equal(got, want):
            bad = np.argwhere(got != want)[:5].tolist()
            raise AssertionError(f"{what}: mismatch at {bad} {self.where()}\n got {got}\n want {want}")

    def max_m(self, k, n, a_addr=0, c_addr=0):
        """The largest M whose A and result fit from these addresses."""
        cfg = self.cfg
        blocks = min((cfg.spad_a_depth - a_addr) // k, (cfg.spad_c_depth - c_addr) // n)
        return blocks * cfg.rows


@cocotb.test()
async def test_random_shapes(dut):
    """Random shapes with edge tiles, K = 1, M = 1, N = 1 and the largest that fit."""
    tb = TB(dut, 1)
    await tb.reset()
    cfg = tb.cfg
    kmax = cfg.spad_b_depth // 2
    R, C = cfg.rows, cfg.cols
    shapes = [(1, 1, 1), (1, 5, C + 1), (R + 1, 1, 3), (2 * R - 1, 3, 2 * C + 1), (R, kmax, C)]
    for _ in range(int(bench_params().get("n_random", 4))):
        shapes.append((int(tb.rng.integers(1, 3 * R + 1)), int(tb.rng.integers(1, min(kmax, 40) + 1)),
                       int(tb.rng.integers(1, 3 * C + 1))))
    k_big = min(kmax, 2 * C + 3)
    n_big = 2 * C + 1
    shapes.append((min(tb.max_m(k_big, n_big), 4 * R), k_big, n_big))
    for m, k, n in shapes:
        a, b = tb.rand(m, k), tb.rand(k, n)
        mult, shift = int(tb.rng.integers(1, 1 << cfg.mult_width)), int(tb.rng.integers(8, 30))
        blocks = -(-m // R)
        a_addr = int(tb.rng.integers(0, cfg.spad_a_depth - blocks * k + 1))
        c_addr = int(tb.rng.integers(0, cfg.spad_c_depth - blocks * n + 1))
        got, _ = await tb.gemm(a, b, m=m, k=k, n=n, a_addr=a_addr, c_addr=c_addr, mult=mult, shift=shift)
        tb.check(got, tb.expect(matmul_int(a, b, cfg.acc_width), mult, shift),
                 f"M={m} K={k} N={n} a_addr={a_addr} c_addr={c_addr} mult={mult} shift={shift}")


@cocotb.test()
async def test_largest_gemm(dut):
    """The largest M for K = spad_b_depth/2 fills scratchpads A and C to the last word."""
    tb = TB(dut, 2)
    await tb.reset()
    cfg = tb.cfg
    k = cfg.spad_b_depth // 2
    n = max(1, min(cfg.spad_c_depth // max(1, cfg.spad_a_depth // k), 3 * cfg.cols))
    m = tb.max_m(k, n)
    a, b = tb.rand(m, k), tb.rand(k, n)
    got, _ = await tb.gemm(a, b, m=m, k=k, n=n, mult=1 << 10, shift=20)
    tb.check(got, tb.expect(matmul_int(a, b, cfg.acc_width), 1 << 10, 20), f"M={m} K={k} N={n}")


@cocotb.test()
async def test_extremes_and_accumulate(dut):
    """-128 x -128 summed over the largest K, then accumulated onto itself (wrapping)."""
    tb = TB(dut, 3)
    await tb.reset()
    cfg = tb.cfg
    lo = -(1 << (cfg.in_width - 1))
    k = cfg.spad_b_depth // 2
    m, n = cfg.rows + 1, cfg.cols + 1
    a, b = np.full((m, k), lo), np.full((k, n), lo)
    b[:, 0] = -lo - 1                       # -128 * 127 on one column
    acc = matmul_int(a, b, cfg.acc_width)
    total = acc.copy()
    # shift 0 shows the low bits (exactly when out_width = acc_width, saturated otherwise),
    # the other shift the top out_width bits of the accumulator
    for rep in range(3):
        shift = 0 if rep != 1 else cfg.acc_width - tb.out_width
        got, _ = await tb.gemm(a, b, m=m, k=k, n=n, c_addr=1, mult=1, shift=shift,
                               load_a=rep == 0, accumulate=rep > 0)
        if rep > 0:
            total = wrap(total + acc, cfg.acc_width)
        tb.check(got, tb.expect(total, 1, shift), f"extremes, accumulation {rep}")
    # store only: the result is still there, read at another scale
    got, _ = await tb.gemm(m=m, k=k, n=n, c_addr=1, mult=3, shift=5, load_a=False, compute=False)
    tb.check(got, tb.expect(total, 3, 5), "store only")
    # compute without store, then accumulate a different product and store
    a2, b2 = tb.rand(m, 3), tb.rand(3, n)
    await tb.gemm(a2, b2, m=m, k=3, n=n, c_addr=1, store=False)
    a3, b3 = tb.rand(m, 2), tb.rand(2, n)
    got, _ = await tb.gemm(a3, b3, m=m, k=2, n=n, c_addr=1, a_addr=7, mult=5, shift=3, accumulate=True)
    want = wrap(matmul_int(a2, b2, cfg.acc_width) + matmul_int(a3, b3, cfg.acc_width), cfg.acc_width)
    tb.check(got, tb.expect(want, 5, 3), "compute, then accumulate")
    # A stays resident: reuse it with a new B
    b4 = tb.rand(2, n)
    got, _ = await tb.gemm(None, b4, m=m, k=2, n=n, a_addr=7, c_addr=1, mult=1, shift=4, load_a=False)
    tb.check(got, tb.expect(matmul_int(a3, b4, cfg.acc_width), 1, 4), "resident A")


@cocotb.test()
async def test_rounding_corners(dut):
    """Ties (positive and negative, odd and even quotients), near-ties and saturation at both
    ends, through the whole engine: A holds the accumulator values, B = 1."""
    tb = TB(dut, 4)
    await tb.reset()
    cfg = tb.cfg
    hi = (1 << (cfg.in_width - 1)) - 1
    a = np.arange(-(hi + 1), hi + 1)[:, None]      # [2**in_width, 1]: C = A * B
    m = a.shape[0]
    for shift in (0, 1, 2, 3, 4):
        for mult in (1, 3, 1 << (cfg.mult_width - 1), (1 << cfg.mult_width) - 1):
            b = np.array([[1, -1, 2]])
            n = b.shape[1]
            for start in range(0, m, tb.max_m(1, n)):
                part = a[start:start + tb.max_m(1, n)]
                got, _ = await tb.gemm(part, b, m=len(part), k=1, n=n, mult=mult, shift=shift)
                tb.check(got, tb.expect(matmul_int(part, b, cfg.acc_width), mult, shift),
                         f"mult={mult} shift={shift}")


@cocotb.test()
async def test_bad_commands(dut):
    """Zero or too-large shapes and addresses past the scratchpads are refused, with no
    stream touched; a valid command still works afterwards."""
    tb = TB(dut, 5)
    await tb.reset()
    cfg = tb.cfg
    R, half = cfg.rows, cfg.spad_b_depth // 2
    ok = dict(m=1, k=1, n=1, load_a=1, compute=1, store=1)
    cases = [
        (GemmError.NO_PHASE, dict(ok, load_a=0, compute=0, store=0)),
        (GemmError.ZERO_SHAPE, dict(ok, m=0)),
        (GemmError.ZERO_SHAPE, dict(ok, k=0)),
        (GemmError.ZERO_SHAPE, dict(ok, n=0)),
        (GemmError.K_TOO_LARGE, dict(ok, k=half + 1)),
        (GemmError.A_RANGE, dict(ok, a_addr=cfg.spad_a_depth)),
        (GemmError.A_RANGE, dict(ok, k=half, a_addr=cfg.spad_a_depth - half + 1)),
        (GemmError.A_RANGE, dict(ok, k=half, m=R * (cfg.spad_a_depth // half) + 1)),
        (GemmError.A_RANGE, dict(ok, k=half, m=R * (cfg.spad_a_depth // half) + 1, compute=0, store=0)),
        (GemmError.C_RANGE, dict(ok, c_addr=cfg.spad_c_depth)),
        (GemmError.C_RANGE, dict(ok, n=cfg.spad_c_depth + 1)),
        (GemmError.C_RANGE, dict(ok, m=R * cfg.spad_c_depth + 1, load_a=0, compute=0)),
        (GemmError.C_RANGE, dict(ok, m=R + 1, n=cfg.spad_c_depth // 2 + 1, load_a=0, compute=0)),
    ]
    for code, fields in cases:
        await tb.refused(code, **fields)
    # nothing consumed, nothing wrapped: a valid GEMM runs right after
    a, b = tb.rand(R + 1, 2), tb.rand(2, 3)
    got, _ = await tb.gemm(a, b, m=R + 1, k=2, n=3, mult=1, shift=2)
    tb.check(got, tb.expect(matmul_int(a, b, cfg.acc_width), 1, 2), "after refusals")
    assert not dut.error.value, f"error must clear on the next command {tb.where()}"


@cocotb.test()
async def test_exact_cycles(dut):
    """With sources that never idle and a sink that never stalls, a command takes exactly
    ``nanokpu.units.gemm.gemm_cycles``, for the shapes in ``timing``; with ``compute_only``, each
    shape also as a command without store (timed, ``gemm_cycles(..., store=False)``) whose
    results a store-only command then reads and checks."""
    tb = TB(dut, 6)
    await tb.reset()
    cfg = tb.cfg
    report = []
    kmax = cfg.spad_b_depth // 2
    default = [[cfg.rows, 2, cfg.cols], [2 * cfg.rows + 1, min(kmax, 40), cfg.cols * 2 + 1]]
    shapes = bench_params().get("timing") or default
    for m, k, n in shapes:
        a, b = tb.rand(m, k), tb.rand(k, n)
        start = time.perf_counter()
        got, cycles = await tb.gemm(a, b, m=m, k=k, n=n, mult=1, shift=7, idle=0, backpressure=0)
        wall = time.perf_counter() - start
        tb.check(got, tb.expect(matmul_int(a, b, cfg.acc_width), 1, 7), f"timed M={m} K={k} N={n}")
        want = gemm_cycles(cfg, m, k, n)
        report.append({"m": m, "k": k, "n": n, "cycles": cycles, "ideal": want, "wall": wall})
        assert cycles == want or bench_params().get("explore"), (
            f"M={m} K={k} N={n}: {cycles} cycles, documented {want} {tb.where()}")
        if bench_params().get("compute_only"):
            _, cycles = await tb.gemm(a, b, m=m, k=k, n=n, store=False, idle=0, backpressure=0)
            want = gemm_cycles(cfg, m, k, n, store=False)
            assert cycles == want or bench_params().get("explore"), (
                f"M={m} K={k} N={n} without store: {cycles} cycles, documented {want} {tb.where()}")
            report[-1]["cycles_compute"] = cycles
            got, _ = await tb.gemm(m=m, k=k, n=n, mult=1, shift=7, load_a=False, compute=False,
                                   idle=0, backpressure=0)
            tb.check(got, tb.expect(matmul_int(a, b, cfg.acc_width), 1, 7), f"timed M={m} K={k} N={n}, stored apart")
    out = bench_params().get("report")
    if out:
        with open(out, "w") as f:
            json.dump(report, f)
