"""AxiMaster against a behavioural AXI4 slave with random stalls (Amaranth simulator): burst reads
and writes (at most 16 beats, never across 4 KB), byte strobes, and abort with drain."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from nanokpu.kpu.axi_master import MAX_BURST, AxiMaster

BW = 4  # bytes per beat


def _word(addr):
    return (addr * 2654435761) & 0xFFFF_FFFF


def _simulate(seed, op, addr, beats, abort_after=None):
    """One read or write of ``beats`` beats; returns (beats seen by the master side, slave log)."""
    dut = AxiMaster(32, 8 * BW)
    bus = dut.bus
    rng = np.random.default_rng(seed)
    log = {"ar": [], "aw": [], "w": [], "aborted_at": None}
    rq, wq, bq = [], [], []
    got = []

    def stall():
        return rng.random() < 0.3

    async def addr_slave(ctx):
        while True:
            ctx.set(bus.arready, int(not stall()))
            ctx.set(bus.awready, int(not stall()))
            _, _, arv, arr, ara, arl, awv, awr, awa, awl, ab = await ctx.tick().sample(
                bus.arvalid, bus.arready, bus.araddr, bus.arlen,
                bus.awvalid, bus.awready, bus.awaddr, bus.awlen, dut.abort)
            if arv and arr:
                log["ar"].append((ara, arl + 1, ab))
                rq.append((ara, arl + 1))
            if awv and awr:
                log["aw"].append((awa, awl + 1, ab))
                wq.append((awa, awl + 1))

    async def r_slave(ctx):
        while True:
            if not rq:
                await ctx.tick()
                continue
            a, n = rq.pop(0)
            for i in range(n):
                while stall():
                    await ctx.tick()
                ctx.set(bus.rdata, _word(a + i * BW))
                ctx.set(bus.rlast, int(i == n - 1))
                ctx.set(bus.rvalid, 1)
                await ctx.tick().until(bus.rready)
                ctx.set(bus.rvalid, 0)

    async def w_slave(ctx):
        while True:
            if not wq:
                await ctx.tick()
                continue
            a, n = wq.pop(0)
            for i in range(n):
                ctx.set(bus.wready, int(not stall()))
                _, _, v, r, d, s, last = await ctx.tick().sample(bus.wvalid, bus.wready, bus.wdata,
                                                                  bus.wstrb, bus.wlast)
                while not (v and r):
                    ctx.set(bus.wready, int(not stall()))
                    _, _, v, r, d, s, last = await ctx.tick().sample(bus.wvalid, bus.wready, bus.wdata,
                                                                      bus.wstrb, bus.wlast)
                log["w"].append((a + i * BW, d, s, last, i == n - 1))
            ctx.set(bus.wready, 0)
            bq.append(1)

    async def b_slave(ctx):
        while True:
            if not bq:
                await ctx.tick()
                continue
            bq.pop()
            ctx.set(bus.bvalid, 1)
            await ctx.tick().until(bus.bready)
            ctx.set(bus.bvalid, 0)

    async def master(ctx):
        if op == "read":
            ctx.set(dut.rd_addr, addr)
            ctx.set(dut.rd_beats, beats)
            ctx.set(dut.rd_start, 1)
        else:
            ctx.set(dut.wr_addr, addr)
            ctx.set(dut.wr_beats, beats)
            ctx.set(dut.wr_start, 1)
        await ctx.tick()
        ctx.set(dut.rd_start, 0)
        ctx.set(dut.wr_start, 0)
        stream = dut.rd_data if op == "read" else dut.wr_data
        busy = dut.rd_busy if op == "read" else dut.wr_busy
        for _ in range(20 * beats + 200):
            if abort_after is not None and len(got) >= abort_after:
                if log["aborted_at"] is None:
                    log["aborted_at"] = len(got)
                ctx.set(dut.abort, 1)
            go = int(not stall())
            if op == "read":
                ctx.set(stream.ready, go)
            else:
                n = len(got)
                ctx.set(stream.payload, {"data": _word(addr + n * BW) ^ 0x5A5A, "strb": n % 16})
                ctx.set(stream.valid, go)
            _, _, valid, ready, payload, b = await ctx.tick().sample(stream.valid, stream.ready,
                                                                    stream.payload, busy)
            if valid and ready:
                got.append(payload)
            if not b:
                break
        assert not ctx.get(busy), "the master never went idle"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for proc in (addr_slave, r_slave, w_slave, b_slave):
        sim.add_testbench(proc, background=True)
    sim.add_testbench(master)
    sim.run()
    return got, log


def _check_bursts(bursts, addr, beats):
    expect = addr
    for a, n, _ in bursts:
        assert a == expect and 1 <= n <= MAX_BURST and a % 4096 + n * BW <= 4096
        expect += n * BW
    assert expect == addr + beats * BW


@pytest.mark.parametrize("seed,addr,beats", [(0, 0, 1), (1, 4096 - 8 * BW, 40), (2, 100 * BW, 77)])
def test_burst_read(seed, addr, beats):
    got, log = _simulate(seed, "read", addr, beats)
    assert got == [_word(addr + i * BW) for i in range(beats)], f"seed {seed}"
    _check_bursts(log["ar"], addr, beats)


@pytest.mark.parametrize("seed,addr,beats", [(3, 0, 1), (4, 4096 - 3 * BW, 37)])
def test_burst_write(seed, addr, beats):
    got, log = _simulate(seed, "write", addr, beats)
    _check_bursts(log["aw"], addr, beats)
    assert [(a, d, s) for a, d, s, _, _ in log["w"]] == [
        (addr + i * BW, _word(addr + i * BW) ^ 0x5A5A, i % 16) for i in range(beats)], f"seed {seed}"
    assert all(last == is_last for *_, last, is_last in log["w"])


@pytest.mark.parametrize("op", ["read", "write"])
def test_abort_drains_and_stops_issuing(op):
    got, log = _simulate(5, op, 0, 60, abort_after=5)
    bursts = log["ar" if op == "read" else "aw"]
    assert all(not aborted for *_, aborted in bursts), "a burst was issued during abort"
    if op == "read":  # bursts already requested drain, but nothing more reaches rd_data
        assert len(got) == log["aborted_at"]
    else:
        assert sum(n for _, n, _ in bursts) < 60
    if op == "write":  # the started burst is finished with all strobes low
        beats = log["w"]
        assert len(beats) == sum(n for _, n, _ in bursts)
        assert all(s == 0 for _, _, s, _, _ in beats[len(got):])
