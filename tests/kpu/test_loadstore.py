"""The load/store executor alone (Amaranth simulator): LOAD of 1-, 2- and 4-byte elements
(sign-extended, trailing lanes of the last beat dropped) and STORE of int32 elements (packed, byte
strobes), against a behavioural scratchpad and bus with random stalls; a bus error ends the
instruction at once; LOAD a beat per cycle, STORE an element per cycle with the bus ready."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from nanokpu.config import profile
from nanokpu.isa import Err, Op, bus_bytes
from nanokpu.kpu.executors.loadstore import LoadStore
from sim.lib.executor_model import run_instruction, serve_scratchpad

CFG = profile("small")          # 8-byte beats: two int32 elements or eight int8 to a beat
BW = bus_bytes(CFG)


def _run(op, width, n, seed, stall=0.3, error_at=None, spad_init=None, cfg=CFG):
    """One instruction; returns (scratchpad dict, beats written as (data, strb), cycles to done, error)."""
    dut = LoadStore(cfg)
    BW = bus_bytes(cfg)
    rng = np.random.default_rng(seed)
    spad = dict(spad_init or {})
    beats_in = [int.from_bytes(rng.bytes(BW), "little") for _ in range(-(-n * width // BW))]
    out = []
    result = {}

    async def scratchpad(ctx):
        await serve_scratchpad(ctx, dut.spad, spad)

    async def bus(ctx):
        sent = 0
        taken = 0
        ctx.set(dut.dma.rd_busy, 1 if op == Op.LOAD else 0)
        ctx.set(dut.dma.wr_busy, 1 if op == Op.STORE else 0)
        while True:
            if op == Op.LOAD and sent < len(beats_in):
                ctx.set(dut.dma.rd_data.valid, int(rng.random() >= stall))
                ctx.set(dut.dma.rd_data.payload, beats_in[sent])
            else:
                ctx.set(dut.dma.rd_data.valid, 0)
            ctx.set(dut.dma.wr_data.ready, int(rng.random() >= stall))
            ctx.set(dut.dma.error, int(error_at is not None and (sent + taken) >= error_at))
            _c, _r, rv, rr, wv, wr, payload = await ctx.tick().sample(
                dut.dma.rd_data.valid, dut.dma.rd_data.ready, dut.dma.wr_data.valid, dut.dma.wr_data.ready,
                dut.dma.wr_data.payload)
            if rv and rr:
                sent += 1
                if sent == len(beats_in):
                    ctx.set(dut.dma.rd_busy, 0)
            if wv and wr:
                out.append((payload.data, payload.strb))
                taken += 1
                if taken == -(-n * 4 // BW):
                    ctx.set(dut.dma.wr_busy, 0)

    async def controller(ctx):
        result.update(await run_instruction(ctx, dut, {"op": op, "width": width, "a": 5, "c": 7, "m": 1, "n": n,
                                                       "k": 1, "len": n}, limit=20 * n + 50))
        await ctx.tick()
        assert not ctx.get(dut.done)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(scratchpad)
    sim.add_process(bus)
    sim.add_testbench(controller)
    sim.run()
    return spad, out, beats_in, result


@pytest.mark.parametrize("width", [1, 2, 4])
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("cols", [8, 16])
def test_load(width, seed, cols):
    """LOAD under stalls; with cols = 16 (16-byte beats, 8 banks) an int8 beat takes two writes."""
    n = 13 if cols == 8 else 37
    cfg = profile("small", cols=cols)
    spad, _out, beats, res = _run(Op.LOAD, width, n, seed, cfg=cfg)
    raw = b"".join(b.to_bytes(bus_bytes(cfg), "little") for b in beats)
    expect = [int.from_bytes(raw[i * width:(i + 1) * width], "little", signed=True) for i in range(n)]
    got = [spad.get(7 + i) for i in range(n)]
    assert got == expect, f"seed {seed}"
    assert set(spad) == set(range(7, 7 + n)), "a write outside c .. c + len"
    assert res["error"] == Err.NONE


@pytest.mark.parametrize("n", [1, 2, 7])
@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("rows, cols", [(8, 8), (2, 16)])
def test_store(n, seed, rows, cols):
    """STORE under stalls; with rows = 2, cols = 16 (2 banks, 4 int32 a beat) a beat takes two
    reads."""
    cfg = profile("small", rows=rows, cols=cols)
    rng = np.random.default_rng(seed)
    values = [int(v) for v in rng.integers(-(1 << 31), 1 << 31, n)]
    _spad, out, _beats, res = _run(Op.STORE, 4, n, seed, spad_init={5 + i: v for i, v in enumerate(values)}, cfg=cfg)
    epb = bus_bytes(cfg) // 4
    assert len(out) == -(-n // epb)
    got = []
    for data, strb in out:
        for j in range(epb):
            if strb >> (4 * j) & 0xF:
                assert strb >> (4 * j) & 0xF == 0xF
                got.append(int.from_bytes(((data >> (32 * j)) & 0xFFFF_FFFF).to_bytes(4, "little"), "little",
                                          signed=True))
    assert got == values, f"seed {seed}"
    assert res["error"] == Err.NONE


@pytest.mark.parametrize("op, width", [(Op.LOAD, 1), (Op.LOAD, 2), (Op.LOAD, 4), (Op.STORE, 4)])
def test_a_beat_per_cycle_without_stalls(op, width):
    """With the bus always ready, LOAD and STORE take a beat per cycle (its BW / width elements,
    at most banks(cfg) = 8 of them, one wide write or read): 64 elements more cost exactly 64 /
    (BW / width) cycles more, results bit for bit (test_load and test_store check the values
    under stalls)."""
    cycles = []
    for n in (16, 80):
        spad, _o, beats, res = _run(op, width, n, 5, stall=0.0, spad_init={5 + i: i for i in range(n)})
        assert res["error"] == Err.NONE
        if op == Op.LOAD:
            raw = b"".join(b.to_bytes(BW, "little") for b in beats)
            assert [spad[7 + i] for i in range(n)] == [
                int.from_bytes(raw[i * width:(i + 1) * width], "little", signed=True) for i in range(n)]
        cycles.append(res["cycles"])
    assert cycles[1] - cycles[0] == 64 // (BW // width), (op, width, cycles)


@pytest.mark.parametrize("op", [Op.LOAD, Op.STORE])
def test_bus_error_ends_the_instruction(op):
    _s, _o, _b, res = _run(op, 4, 20, 6, error_at=2, spad_init={5 + i: i for i in range(20)})
    assert res["error"] == Err.BUS_ERROR
    assert res["cycles"] < 20
