"""Requantiser: bit-exact to golden.intops.requantize on every rounding corner (Amaranth simulator)."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from golden.intops import requantize
from nanokpu.config import ROUNDING_MODES, profile
from nanokpu.units.requant import Requantiser

LANES = 2


def corner_cases(cfg, out_width):
    """(acc, mult, shift) triples: ties, negative ties, near-ties, saturation at both ends."""
    amax, amin = (1 << (cfg.acc_width - 1)) - 1, -(1 << (cfg.acc_width - 1))
    mmax = (1 << cfg.mult_width) - 1
    cases = []
    for shift in (0, 1, 2, 3, 7, 31, 47, 48, 62, 63):
        half = 1 << (shift - 1) if shift else 0
        for q in (-3, -2, -1, 0, 1, 2, 3):     # exact ties x = q*2**s + half, odd and even q
            for delta in (-1, 0, 1):            # and one below / one above
                x = (q << shift) + half + delta
                if amin <= x <= amax:
                    cases.append((x, 1, shift))
    top = (1 << (out_width - 1))
    for shift in (0, 4, 12):                    # saturation at both ends, just inside and outside
        for v in (top - 1, top, -top, -top - 1, 3 * top):
            for x in (v << shift, (v << shift) + (1 << shift) // 2):
                if amin <= x <= amax:
                    cases.append((x, 1, shift))
    cases += [(amax, mmax, 0), (amin, mmax, 0), (amax, mmax, 63), (amin, mmax, 63),
              (amin, mmax, 47), (amax, mmax, 47), (amin, 0, 5), (-1, 1, 63), (-1, mmax, 62)]
    return cases


def run_requant(cfg, out_width, cases, seed, lanes=LANES):
    """Drive ``cases`` through the RTL with random idle/backpressure, each word with its own
    ``(mult, shift)`` (the words of all groups shuffled, so consecutive words differ; random ones
    while no word is offered); returns the outputs per ``(mult, shift)``."""
    dut = Requantiser(cfg, lanes, out_width)
    rng = np.random.default_rng(seed)
    groups = {}
    for acc, mult, shift in cases:
        groups.setdefault((mult, shift), []).append(acc)
    words = [(key, accs[k:k + lanes] + [0] * (lanes - len(accs[k:k + lanes])))
             for key, accs in groups.items() for k in range(0, len(accs), lanes)]
    order = rng.permutation(len(words))
    results = {key: [] for key in groups}

    async def tb(ctx):
        got = []
        sent = 0
        while len(got) < len(words):
            idle = rng.random() < 0.3
            ctx.set(dut.i.valid, sent < len(words) and not idle)
            (mult, shift), payload = words[order[sent]] if sent < len(words) and not idle else \
                ((int(rng.integers(0, 1 << cfg.mult_width)), int(rng.integers(0, 64))), [0] * lanes)
            ctx.set(dut.i.payload, payload)
            ctx.set(dut.mult, mult)
            ctx.set(dut.shift, shift)
            ctx.set(dut.o.ready, rng.random() < 0.7)
            await ctx.delay(1e-9)  # settle the combinational ready
            took = ctx.get(dut.i.valid) and ctx.get(dut.i.ready)
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                got.append([int(v) for v in ctx.get(dut.o.payload)])
            await ctx.tick()
            sent += bool(took)
        outs = dict(zip(order, got, strict=True))
        for i, (key, _) in enumerate(words):
            results[key] += outs[i]
        for key, accs in groups.items():
            results[key] = results[key][:len(accs)]

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return groups, results


@pytest.mark.parametrize("dsp", ["generic", "ice40"])
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
@pytest.mark.parametrize("out_width", [8, 16, 32])
def test_requant_matches_golden(rounding, out_width, dsp):
    """``ice40``: the bit-serial product (fabric only, so the Amaranth simulator runs it)."""
    seed = 1000 + ROUNDING_MODES.index(rounding) * 10 + out_width
    cfg = profile("tiny", rounding=rounding, dsp=dsp, acc_width=32)     # the widest: small's
    rng = np.random.default_rng(seed)
    cases = corner_cases(cfg, out_width)
    for _ in range(60):  # random (acc, mult, shift) too
        cases.append((int(rng.integers(-(1 << 31), 1 << 31)), int(rng.integers(0, 1 << 16)),
                      int(rng.integers(0, 64))))
    groups, results = run_requant(cfg, out_width, cases, seed)
    for (mult, shift), accs in groups.items():
        want = requantize(np.array(accs), mult, shift, out_width, rounding).tolist()
        assert results[(mult, shift)] == want, (
            f"seed {seed}: mult={mult} shift={shift} acc={accs}")


@pytest.mark.parametrize("mult_width, lanes", [(1, 1), (2, 3), (3, 3), (5, 4)])
def test_serial_requant_matches_golden(mult_width, lanes):
    """``ice40`` with short multipliers (zero-extended to 3 bits; the first product step adds in
    two bits) and odd lane counts (a lane pair with one lane): every corner and random case."""
    seed = 2000 + 10 * mult_width + lanes
    cfg = profile("tiny", dsp="ice40", mult_width=mult_width)     # 24-bit accumulators
    rng = np.random.default_rng(seed)
    cases = corner_cases(cfg, 8)
    half = 1 << (cfg.acc_width - 1)
    for _ in range(40):
        cases.append((int(rng.integers(-half, half)), int(rng.integers(0, 1 << mult_width)),
                      int(rng.integers(0, 64))))
    groups, results = run_requant(cfg, 8, cases, seed, lanes)
    for (mult, shift), accs in groups.items():
        want = requantize(np.array(accs), mult, shift, 8, cfg.rounding).tolist()
        assert results[(mult, shift)] == want, f"seed {seed}: mult={mult} shift={shift} acc={accs}"


@pytest.mark.parametrize("dsp, mult_width, lanes, latency, interval", [
    ("generic", 16, 1, 6, 1), ("ice40", 16, 1, 19, 16), ("ice40", 16, 4, 19, 16), ("ice40", 3, 3, 6, 3),
    ("ice40", 2, 2, 6, 3), ("ice40", 1, 1, 6, 3)])
def test_requant_latency_and_interval(dsp, mult_width, lanes, latency, interval):
    """Three words offered back to back: the first ``o.valid`` after ``latency`` cycles, the
    words ``interval`` cycles apart (``ice40``: ``max(mult_width, 3) + 3`` and ``max(mult_width,
    3)``, any number of lanes)."""
    cfg = profile("tiny", dsp=dsp, mult_width=mult_width)
    dut = Requantiser(cfg, lanes)
    assert (dut.latency, dut.interval) == (latency, interval)
    mult = min(3, (1 << mult_width) - 1)

    async def tb(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.mult, mult)
        taken, outs = [], []
        for cycle in range(latency + 3 * interval + 2):
            ctx.set(dut.i.payload, [5 + len(taken) + lane for lane in range(lanes)])
            ctx.set(dut.i.valid, len(taken) < 3)
            await ctx.delay(1e-9)
            if ctx.get(dut.i.valid) and ctx.get(dut.i.ready):
                taken.append(cycle)
            if ctx.get(dut.o.valid):
                outs.append((cycle, [int(v) for v in ctx.get(dut.o.payload)]))
            await ctx.tick()
        assert taken == [0, interval, 2 * interval]
        assert outs == [(latency + t, [mult * (5 + n + lane) for lane in range(lanes)]) for n, t in enumerate(taken)]

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("kwargs, message", [
    ({"lanes": 0}, "lanes = 0"),
    ({"lanes": 2, "out_width": 1}, "out_width = 1"),
    ({"lanes": 2, "out_width": 40}, "out_width = 40"),
])
def test_requant_rejects_bad_parameters(kwargs, message):
    refused(ValueError, message, lambda: Requantiser(profile("tiny"), **kwargs))


def test_requant_rejects_a_product_wider_than_int64():
    cfg = profile("tiny", acc_width=33, mult_width=32)
    refused(ValueError, "KpuConfig.mult_width = 32", lambda: Requantiser(cfg, 1))
    refused(ValueError, "acc_width = 49", lambda: Requantiser(profile("tiny"), 1, acc_width=49))


def refused(exc, message, build):
    """``build()`` raises ``exc`` matching ``message``; the half-built component is not 'unused'."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(exc, match=message):
            build()
        gc.collect()
