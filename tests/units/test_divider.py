# amaranth: UnusedElaboratable=no
"""Tests of :class:`nanokpu.units.divider.SeqDivider` on the Amaranth simulator."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from nanokpu.units.divider import SeqDivider

SEED = 5


def _divide_all(num_width, den_width, pairs, short=()):
    """Run every (num, den) through one divider, the i-th with (rem_in, bits) = short[i] when
    given (the defaults otherwise); returns [(quot, rem, busy cycles)]."""
    dut = SeqDivider(num_width, den_width)
    results = []

    async def tb(ctx):
        for i, (num, den) in enumerate(pairs):
            ctx.set(dut.num, num)
            ctx.set(dut.den, den)
            if short:
                ctx.set(dut.rem_in, short[i][0])
                ctx.set(dut.bits, short[i][1])
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            ctx.set(dut.num, 0)  # operands are sampled at start only
            ctx.set(dut.den, 0)
            if short:
                ctx.set(dut.rem_in, 0)
                ctx.set(dut.bits, 0)
            cycles = 0
            while ctx.get(dut.busy):
                await ctx.tick()
                cycles += 1
            results.append((ctx.get(dut.quot), ctx.get(dut.rem), cycles))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return dut, results


def test_random_and_edges():
    """Random operands plus the router's case (num = 2**R, den = 1 and den = max), den > num,
    num = 0 and division by zero (documented: quot all ones, rem = num)."""
    num_width, den_width = 12, 7
    rng = np.random.default_rng(SEED)
    pairs = [(int(a), int(b)) for a, b in zip(rng.integers(0, 1 << num_width, 40),
                                               rng.integers(1, 1 << den_width, 40), strict=True)]
    pairs += [(1 << (num_width - 1), 1), (1 << (num_width - 1), (1 << den_width) - 1),
              (5, 100), (0, 3), ((1 << num_width) - 1, 1), (77, 0)]
    dut, results = _divide_all(num_width, den_width, pairs)
    for (num, den), (quot, rem, cycles) in zip(pairs, results, strict=True):
        want = (num // den, num % den) if den else ((1 << num_width) - 1, num)
        assert (quot, rem) == want, f"{num} / {den}: got {(quot, rem)} (seed {SEED})"
        assert cycles == dut.latency == num_width


def test_short_divisions_take_one_cycle_a_quotient_bit():
    """A quotient known to have b bits: rem_in = N >> b, num = (N % 2**b) << (num_width - b),
    b cycles; N at the bound (quotient 2**b - 1, remainder den - 1), b = 1 and b = num_width,
    and the vector unit's two cases (N = 2**R, the reciprocal; N a sum of n squares, the mean)."""
    num_width, den_width = 20, 8
    rng = np.random.default_rng(SEED)
    cases = []
    for _ in range(40):
        b = int(rng.integers(1, num_width + 1))
        den = int(rng.integers(1, 1 << den_width))
        cases.append((int(rng.integers(0, den << b)), den, b))
    cases += [(((1 << 5) - 1) * 200 + 199, 200, 5), (254 * 2 + 1, 255, 1), (7, 3, num_width),
              (1 << 14, 128, 8), (1 << 14, 255, 7), (25 * 3 * 3, 3, 7)]
    for N, den, b in cases:
        assert N >> b < den and b <= num_width
    pairs = [((N % (1 << b)) << (num_width - b), den) for N, den, b in cases]
    _dut, results = _divide_all(num_width, den_width, pairs, short=[(N >> b, b) for N, _, b in cases])
    for (N, den, b), (quot, rem, cycles) in zip(cases, results, strict=True):
        assert (quot, rem, cycles) == (N // den, N % den, b), f"{N} / {den} in {b} bits (seed {SEED})"


@pytest.mark.parametrize("field,value", [("num_width", 0), ("den_width", True), ("num_width", 2.0)])
def test_rejects_bad_widths(field, value):
    kwargs = {"num_width": 8, "den_width": 8, field: value}
    with pytest.raises(ValueError, match=field):
        SeqDivider(**kwargs)
