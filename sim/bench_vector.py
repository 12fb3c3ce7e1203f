"""cocotb bench of nanokpu.units.vector.VectorUnit on Verilator, bit-exact against golden.intops.

The unit's config (its rounding mode included) comes from :func:`sim.runner.bench_config`.
Parameters (``NANOKPU_PARAMS``): ``seed``. Each test drives the input
stream with random idle (30 %) and the output with random backpressure (30 %); the seed is in
every failure message.
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from golden import intops as I
from nanokpu.units.vector import VecOp, vector_in_layout
from sim.runner import bench_config, bench_params


class TB:
    def __init__(self, dut):
        p = bench_params()
        self.dut = dut
        self.cfg = bench_config()
        self.seed = int(p.get("seed", 7))
        self.rng = np.random.default_rng(self.seed)
        lay = vector_in_layout(self.cfg)
        self.wa, self.wb = lay.members["a"].width, lay.members["b"].width
        self.out_width = len(dut.o__payload)
        dut._log.info(f"seed {self.seed}, rounding {self.cfg.rounding}")
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())

    async def reset(self):
        self.dut.rst.value = 1
        self.dut.i__valid.value = 0
        self.dut.o__ready.value = 0
        if self.cfg.layer_ops:      # the ports an instruction holds: the plain NORM's by default
            self.dut.eps.value = I.rms_eps_q(self.cfg)
            self.dut.l2.value = 0
            self.dut.dot.value = 0
        for _ in range(2):
            await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0

    async def run(self, op, beats, n_out, n_row=1):
        dut = self.dut
        dut.op.value = int(op)
        dut.n.value = n_row
        got = []

        async def source():
            for a, b, last in beats:
                while self.rng.random() < 0.3:
                    dut.i__valid.value = 0
                    await RisingEdge(dut.clk)
                word = (a & ((1 << self.wa) - 1)) | ((b & ((1 << self.wb) - 1)) << self.wa)
                dut.i__payload.value = word | (last << (self.wa + self.wb))
                dut.i__valid.value = 1
                while True:
                    await RisingEdge(dut.clk)
                    if int(dut.i__ready.value):  # sampled at the edge (before the update)
                        break
            dut.i__valid.value = 0

        cocotb.start_soon(source())
        while len(got) < n_out:
            ready = int(self.rng.random() < 0.7)
            dut.o__ready.value = ready
            await ReadOnly()
            take = ready and int(dut.o__valid.value)
            value = dut.o__payload.value.to_signed() if take else None
            await RisingEdge(dut.clk)
            if take:
                got.append(value)
        dut.o__ready.value = 0
        return np.array(got, dtype=np.int64)


def _check(tb, op, got, ref):
    assert np.array_equal(got, ref), (f"{op.name} seed {tb.seed}: first mismatch at "
                                      f"{int(np.argmax(got != ref))}: {got[got != ref][:5]} vs {ref[got != ref][:5]}")


@cocotb.test()
async def test_add(dut):
    tb = TB(dut)
    await tb.reset()
    act = tb.cfg.act_width
    lo, hi = -(1 << (act - 1)), (1 << (act - 1)) - 1
    a = tb.rng.integers(lo, hi + 1, 3000)
    b = tb.rng.integers(lo, hi + 1, 3000)
    a[:6], b[:6] = [hi, lo, hi, lo, 0, -1], [hi, lo, lo, hi, 0, 1]
    got = await tb.run(VecOp.ADD, [(int(x), int(y), 0) for x, y in zip(a, b, strict=True)], a.size)
    _check(tb, VecOp.ADD, got, I.add_sat(a, b, act))


@cocotb.test()
async def test_combine(dut):
    tb = TB(dut)
    await tb.reset()
    cfg = tb.cfg
    act, k = cfg.act_width, cfg.top_k
    lo, hi = -(1 << (act - 1)), (1 << (act - 1)) - 1
    T, n = 40, 16
    e = tb.rng.integers(lo, hi + 1, (T, k, n)) >> tb.rng.integers(0, act, (T, k, n))
    w = tb.rng.integers(0, (1 << cfg.weight_frac) + 1, (T, k))
    e[0], w[0] = hi, 1 << cfg.weight_frac   # saturates high
    e[1], w[1] = lo, 1 << cfg.weight_frac   # saturates low
    w[2] = 0                                 # all-zero weights
    # any unsigned weight_width-bit weight (a program may COMBINE with words that are no
    # renormalised weights): the top bit set, the largest value, against both extremes
    w[3:6] = tb.rng.integers(0, 1 << cfg.weight_width, (3, k))
    w[6], e[6] = (1 << cfg.weight_width) - 1, lo
    w[7], e[7] = (1 << cfg.weight_width) - 1, hi
    beats = [(int(e[t, s, j]), int(w[t, s]), int(s == k - 1))
             for t in range(T) for j in range(n) for s in range(k)]
    got = await tb.run(VecOp.COMBINE, beats, T * n)
    _check(tb, VecOp.COMBINE, got, I.combine_int(e, w, cfg).ravel())


@cocotb.test()
async def test_norm(dut):
    tb = TB(dut)
    await tb.reset()
    cfg = tb.cfg
    act = cfg.act_width
    lo, hi = -(1 << (act - 1)), (1 << (act - 1)) - 1
    for n in (16, 5, 1):
        u = tb.rng.integers(lo, hi + 1, (12, n)) >> tb.rng.integers(0, act, (12, 1))
        u[0] = 0                      # zero row
        u[1] = hi                     # constant extreme row
        u[2] = lo
        u[3, 0] = hi if n > 1 else 0  # one outlier: saturates out_width
        u[3, 1:] = 1
        u[4] = tb.rng.integers(-2, 3, n)  # tiny values: eps dominates
        beats = []
        for row in u:
            for _ in range(2):
                beats += [(int(x), 0, int(j == n - 1)) for j, x in enumerate(row)]
        got = await tb.run(VecOp.NORM, beats, u.size, n)
        _check(tb, VecOp.NORM, got, I.rmsnorm_int(u, cfg).ravel())


@cocotb.test(skip=not bench_config().layer_ops)
async def test_l2norm(dut):
    """NORM with l2 (layer_ops): l2norm_int at kda_unit_frac, rows of 1 to 16 values from the
    extremes to single LSBs (the pre-shift e from 0 to 2P), zero rows; its epsilon at the port."""
    tb = TB(dut)
    await tb.reset()
    cfg = tb.cfg
    act = cfg.act_width
    lo, hi = -(1 << (act - 1)), (1 << (act - 1)) - 1
    dut.l2.value = 1
    for n, eps_q in ((16, I.l2_eps_q(cfg)), (3, I.l2_eps_q(cfg)), (1, 0), (8, 10737)):
        dut.eps.value = eps_q
        u = tb.rng.integers(lo, hi + 1, (40, n)) >> tb.rng.integers(0, act, (40, 1))
        u[0] = 0
        u[1], u[2] = hi, lo
        u[3, 0] = 1
        u[3, 1:] = 0
        u[4] = tb.rng.integers(-2, 3, n)
        beats = []
        for row in u:
            for _ in range(2):
                beats += [(int(x), 0, int(j == n - 1)) for j, x in enumerate(row)]
        got = await tb.run(VecOp.NORM, beats, u.size, n)
        _check(tb, VecOp.NORM, got, I.l2norm_int(u, cfg.kda_unit_frac, cfg, eps_q).ravel())


@cocotb.test(skip=not bench_config().layer_ops)
async def test_dot(dut):
    """COMBINE with dot (layer_ops): CONV's taps, groups of 1 to 8 beats of act-format a times
    signed in_width b, each group's sum raw in acc_width bits (the largest products wrap), against
    short_conv_int."""
    tb = TB(dut)
    await tb.reset()
    cfg = tb.cfg
    lo = -(1 << (cfg.act_width - 1))
    w_lo = -(1 << (cfg.in_width - 1))
    dut.dot.value = 1
    for k in (1, 4, 8):
        x = tb.rng.integers(lo, -lo, (60, k)) >> tb.rng.integers(0, cfg.act_width, (60, 1))
        w = tb.rng.integers(w_lo, -w_lo, (60, k))
        x[0], w[0] = lo, w_lo
        x[1], w[1] = -lo - 1, w_lo
        w[2] = 0
        beats = [(int(a), int(b), int(j == k - 1)) for row_x, row_w in zip(x, w, strict=True)
                 for j, (a, b) in enumerate(zip(row_x, row_w, strict=True))]
        got = await tb.run(VecOp.COMBINE, beats, len(x))
        _check(tb, VecOp.COMBINE, got, I.short_conv_int(x.T, w, cfg.acc_width)[0])
