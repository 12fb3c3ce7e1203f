"""Processing element: wrapping multiply-accumulate, tags, drain chain (Amaranth simulator)."""

import numpy as np
import pytest
from amaranth import Module
from amaranth.sim import Simulator

from golden.intops import wrap
from nanokpu.config import profile
from nanokpu.units.dsp import Multiplier
from nanokpu.units.pe import ProcessingElement


def with_multiplier(dut):
    """The PE and its product register (a one-lane generic Multiplier), as in the array."""
    m = Module()
    m.submodules.pe = dut
    m.submodules.mul = mul = Multiplier(dut.cfg.in_width)
    m.d.comb += [mul.a[0].eq(dut.a_in), mul.b[0].eq(dut.b_in), dut.prod.eq(mul.p[0])]
    return m


def run_pe(cfg, tiles, seed):
    """Feed ``tiles`` (lists of (a, b) steps) with random bubbles; return [(res, cycle)] at done."""
    dut = ProcessingElement(cfg)
    rng = np.random.default_rng(seed)
    seen = []
    timing = []

    def check(ctx, cycle):
        if ctx.get(dut.done):
            seen.append((int(ctx.get(dut.res)), cycle))

    async def tb(ctx):
        cycle = 0
        for steps in tiles:
            for k, (a, b) in enumerate(steps):
                while rng.random() < 0.3:  # a bubble: its operands must not count
                    ctx.set(dut.valid_in, 0)
                    ctx.set(dut.a_in, int(rng.integers(-128, 128)))
                    ctx.set(dut.b_in, int(rng.integers(-128, 128)))
                    await ctx.tick()
                    cycle += 1
                    check(ctx, cycle)
                ctx.set(dut.valid_in, 1)
                ctx.set(dut.first_in, k == 0)
                ctx.set(dut.last_in, k == len(steps) - 1)
                ctx.set(dut.a_in, a)
                ctx.set(dut.b_in, b)
                if k == len(steps) - 1:
                    timing.append(cycle)
                await ctx.tick()
                cycle += 1
                check(ctx, cycle)
                # the pass-through is registered: one cycle later it shows this step
                assert (ctx.get(dut.a_out), ctx.get(dut.b_out), ctx.get(dut.last_out)) == (
                    a, b, k == len(steps) - 1), f"seed {seed}"
            ctx.set(dut.valid_in, 0)
            # 3 idle cycles so that the tile's result lands before the next one starts
            for _ in range(3):
                await ctx.tick()
                cycle += 1
                check(ctx, cycle)

    sim = Simulator(with_multiplier(dut))
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return seen, timing


@pytest.mark.parametrize("acc_width", [16, 32])
def test_pe_accumulates_and_wraps_like_the_golden(acc_width):
    seed = 7 + acc_width
    # the PE takes any K: a config whose GEMM engine takes one product per sum allows 16 bits
    cfg = profile("tiny", acc_width=acc_width, spad_b_depth=2)
    rng = np.random.default_rng(seed)
    tiles = [
        [(-128, -128)] * 3,                       # 3 * 16384: wraps a 16-bit accumulator
        [(int(rng.integers(-128, 128)), int(rng.integers(-128, 128))) for _ in range(9)],
        [(127, -128)],                           # K = 1
        [(-128, 127), (-128, -128), (127, 127)],
    ]
    seen, timing = run_pe(cfg, tiles, seed)
    want = [int(wrap(sum(a * b for a, b in steps), acc_width)) for steps in tiles]
    assert [r for r, _ in seen] == want, f"seed {seed}"
    # done (and the sum in res) arrive 2 cycles after the last step entered
    assert [c - t for (_, c), t in zip(seen, timing, strict=True)] == [2] * len(tiles), f"seed {seed}"


def test_pe_drain_chain_shifts_in_the_neighbour():
    cfg = profile("tiny")
    dut = ProcessingElement(cfg)

    async def tb(ctx):
        ctx.set(dut.res_in, -77)
        ctx.set(dut.shift, 1)
        await ctx.tick()
        assert ctx.get(dut.res) == -77
        ctx.set(dut.shift, 0)
        ctx.set(dut.res_in, 5)
        await ctx.tick()
        assert ctx.get(dut.res) == -77

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
