"""The move executor alone (Amaranth simulator): GATHER and SCATTER of random lists (rows in any
order, repeated rows, row 0 and row m - 1), with either scratchpad build (ECP5's one write port:
a cycle that performs a write performs no read) and reads refused at random, a row outside [0, m)
ending the instruction with SPAD_RANGE after the rows before it moved, and its exact cycles."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from nanokpu.config import profile
from nanokpu.isa import Err, Op
from nanokpu.kpu.executors.move import Move
from sim.lib.executor_model import run_instruction, serve_scratchpad

CFG = profile("tiny")


def _run(op, m, n, lst, one_write_port, seed, stall=0.0):
    rng = np.random.default_rng(seed)
    a, b, c, offset = 10, 300, 500, 3
    count = len(lst)
    rows_a = m if op == Op.GATHER else count
    spad = {a + i: int(v) for i, v in enumerate(rng.integers(-(1 << 31), 1 << 31, rows_a * n))}
    spad |= {b + offset + i: int(r) for i, r in enumerate(lst)}
    before = dict(spad)
    dut = Move(CFG)
    out = {}

    async def scratchpad(ctx):
        await serve_scratchpad(ctx, dut.spad, spad, one_write_port, stall, rng)

    async def controller(ctx):
        out.update(await run_instruction(ctx, dut, {
            "op": op, "a": a, "b": b, "c": c, "m": m, "n": n, "k": 0, "len": m * n, "count": count,
            "offset": offset}, limit=10_000))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(scratchpad)
    sim.add_testbench(controller)
    sim.run()

    expect = dict(before)
    for i, r in enumerate(lst):
        if not 0 <= r < m:
            break
        for j in range(n):
            if op == Op.GATHER:
                expect[c + i * n + j] = before[a + r * n + j]
            else:
                expect[c + r * n + j] = before[a + i * n + j]
    return spad, expect, out


@pytest.mark.parametrize("op", [Op.GATHER, Op.SCATTER])
@pytest.mark.parametrize("one_write_port", [False, True])
def test_moves_rows_by_the_list(op, one_write_port):
    m, n = 7, 5
    lst = [6, 0, 3, 3, 1] if op == Op.GATHER else [6, 0, 3, 2, 1]
    spad, expect, out = _run(op, m, n, lst, one_write_port, 1)
    assert spad == expect and out["error"] == Err.NONE, op.name


@pytest.mark.parametrize("op", [Op.GATHER, Op.SCATTER])
@pytest.mark.parametrize("bad", [7, -1])
def test_a_row_outside_m_stops_with_spad_range(op, bad):
    spad, expect, out = _run(op, 7, 3, [2, bad, 4], False, 2)
    assert out["error"] == Err.SPAD_RANGE
    assert spad == expect, "the rows before the bad one moved, none after"


def test_empty_list_is_done_at_once():
    _spad, _expect, out = _run(Op.GATHER, 4, 4, [], False, 3)
    assert out == {"cycles": 1, "error": Err.NONE}


@pytest.mark.parametrize("op", [Op.GATHER, Op.SCATTER])
@pytest.mark.parametrize("n, first", [(32, 0), (33, 7), (31, 5)])
def test_rows_back_to_back(op, n, first):
    """Rows of ceil(n/B) >= 5 + bit_length(r) reads (B = 4 words a read on tiny): the next row
    is prepared under the copy, so the instruction takes count * ceil(n/B) + bit_length(r_0) +
    Move.FIXED_CYCLES cycles (one word a read, or a list read, check and multiply per row not
    hidden, would cost more), rows ending inside a read (n = 33, 61) written without their
    neighbours."""
    rng = np.random.default_rng(n + first)
    lst = [first, *(int(r) for r in rng.integers(0, 8, 5)), 7, 0]
    spad, expect, out = _run(op, 8, n, lst, False, 4)
    assert spad == expect and out["error"] == Err.NONE
    assert out["cycles"] == len(lst) * -(-n // 4) + first.bit_length() + Move.FIXED_CYCLES, out


@pytest.mark.parametrize("op", [Op.GATHER, Op.SCATTER])
@pytest.mark.parametrize("n", [4, 8, 12])
def test_short_rows_wait_for_the_front(op, n):
    """Rows of R = ceil(n/B) < 5 reads: each row waits for its front's 5 + bit_length(r)
    cycles, and the instruction takes their sum + R - 2 cycles."""
    lst = [0, 1, 2, 3, 7, 4]
    spad, expect, out = _run(op, 8, n, lst, False, 5)
    assert spad == expect and out["error"] == Err.NONE
    assert out["cycles"] == sum(5 + r.bit_length() for r in lst) + -(-n // 4) - 2, out


@pytest.mark.parametrize("op", [Op.GATHER, Op.SCATTER])
@pytest.mark.parametrize("one_write_port", [False, True])
@pytest.mark.parametrize("n", [1, 3, 9])
def test_moves_under_random_read_blocking(op, one_write_port, n):
    """The scratchpad refuses a third of the reads at random (list and copy reads alike); short
    rows make the copy wait for the front."""
    rng = np.random.default_rng(n)
    m = 6
    lst = [int(r) for r in rng.permutation(m)] if op == Op.SCATTER else [int(r) for r in rng.integers(0, m, 8)]
    spad, expect, out = _run(op, m, n, lst, one_write_port, n, stall=0.33)
    assert spad == expect and out["error"] == Err.NONE, (op.name, n, lst)


def test_a_bad_row_after_prepared_rows_under_blocking():
    """The front finds the bad row while rows before it are still being copied: they all land."""
    spad, expect, out = _run(Op.GATHER, 5, 12, [4, 0, 3, 5, 1], True, 7, stall=0.2)
    assert out["error"] == Err.SPAD_RANGE and spad == expect
