"""cocotb bench of :class:`nanokpu.units.dsp.Multiplier` (any target with a simulation model).

Every lane sees every ``(a, b)`` pair of ``width``-bit signed operands once (lane ``i`` in its
own order), with a random clock enable; each cycle the products are compared, bit for bit,
with a cycle model of the pipeline whose arithmetic is :func:`golden.intops.matmul_int`.

Parameters (``NANOKPU_PARAMS``): ``width``, ``lanes``, ``latency``, ``seed``, ``en_prob``
(probability that ``en`` is high in a cycle).
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge

from golden.intops import matmul_int
from sim.runner import bench_params

PARAMS = bench_params()


def _signed(value: int, width: int) -> int:
    return value - (1 << width) if value >> (width - 1) else value


@cocotb.test()
async def exhaustive(dut):
    width, lanes, latency = PARAMS["width"], PARAMS["lanes"], PARAMS["latency"]
    seed = int(PARAMS.get("seed", 1))
    rng = np.random.default_rng(seed)
    lo, hi = -(1 << (width - 1)), 1 << (width - 1)
    grid = np.array([(a, b) for a in range(lo, hi) for b in range(lo, hi)], dtype=np.int64)
    orders = [rng.permutation(len(grid)) for _ in range(lanes)]
    a_ports = [getattr(dut, f"a__{i}") for i in range(lanes)]
    b_ports = [getattr(dut, f"b__{i}") for i in range(lanes)]
    p_ports = [getattr(dut, f"p__{i}") for i in range(lanes)]
    mask = (1 << width) - 1

    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.en.value = 0
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    # Cycle model: the operand registers (latency 2) hold grid indices; then the products.
    expected = np.array([matmul_int(pair[None, :1], pair[None, 1:], 2 * width)[0, 0] for pair in grid])
    held = [None] * lanes
    prod = np.zeros(lanes, dtype=np.int64)
    step, cycle = 0, 0
    while step < len(grid) + latency:
        await FallingEdge(dut.clk)
        for i in range(lanes):
            got = _signed(int(p_ports[i].value), 2 * width)
            if got != prod[i]:
                raise AssertionError(f"cycle {cycle} lane {i}: p = {got}, expected {prod[i]} "
                                     f"(width {width}, latency {latency}, seed {seed})")
        en = bool(rng.random() < PARAMS.get("en_prob", 0.8))
        cur = [int(orders[i][step % len(grid)]) for i in range(lanes)]
        for i in range(lanes):
            a_ports[i].value = int(grid[cur[i], 0]) & mask
            b_ports[i].value = int(grid[cur[i], 1]) & mask
        dut.en.value = int(en)
        if en:
            src = held if latency == 2 else cur
            prod = np.array([0 if k is None else expected[k] for k in src])
            held = cur
            step += 1
        cycle += 1
    dut._log.info(f"{len(grid)} operand pairs x {lanes} lanes checked in {cycle} cycles (seed {seed})")
