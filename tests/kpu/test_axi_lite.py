"""AxiLiteRegisters: writes and reads with random valid/ready timing (Amaranth simulator)."""

import numpy as np
import pytest
from amaranth import Elaboratable, Module, Signal
from amaranth.sim import Simulator

from nanokpu.kpu.axi_lite import AxiLiteRegisters


class _Bank(Elaboratable):
    """The DUT plus a 16-word register file behind its strobes (data one cycle after rd_en)."""

    def __init__(self):
        self.regs = AxiLiteRegisters(8)
        self.store = [Signal(32, name=f"r{i}") for i in range(16)]

    def elaborate(self, platform):
        m = Module()
        m.submodules.regs = r = self.regs
        with m.If(r.wr_en):
            for i, s in enumerate(self.store):
                with m.If(r.wr_addr[2:6] == i):
                    m.d.sync += s.eq(r.wr_data)
        sel = Signal(4)
        with m.If(r.rd_en):
            m.d.sync += sel.eq(r.rd_addr[2:6])
        for i, s in enumerate(self.store):
            with m.If(sel == i):
                m.d.comb += r.rd_data.eq(s)
        return m


@pytest.mark.parametrize("seed", [0, 1])
def test_write_then_read_back(seed):
    dut = _Bank()
    bus = dut.regs.bus
    rng = np.random.default_rng(seed)
    values = [int(v) for v in rng.integers(0, 1 << 32, 16, dtype=np.uint64)]
    got = []

    async def idle(ctx):
        while rng.random() < 0.4:
            await ctx.tick()

    async def tb(ctx):
        for i, v in enumerate(values):
            ctx.set(bus.bready, 0)
            # address and data in random order and timing
            first, second = ((bus.awvalid, bus.awaddr, 4 * i), (bus.wvalid, bus.wdata, v))[::rng.choice([1, -1])]
            for valid, field, value in (first, second):
                await idle(ctx)
                ctx.set(field, value)
                ctx.set(valid, 1)
                ready = bus.awready if valid is bus.awvalid else bus.wready
                await ctx.tick().until(ready)
                ctx.set(valid, 0)
            await idle(ctx)
            ctx.set(bus.bready, 1)
            await ctx.tick().until(bus.bvalid)
            ctx.set(bus.bready, 0)
        for i in range(16):
            await idle(ctx)
            ctx.set(bus.araddr, 4 * i)
            ctx.set(bus.arvalid, 1)
            await ctx.tick().until(bus.arready)
            ctx.set(bus.arvalid, 0)
            await idle(ctx)
            ctx.set(bus.rready, 1)
            data, = await ctx.tick().sample(bus.rdata).until(bus.rvalid)
            ctx.set(bus.rready, 0)
            got.append(data)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert got == values, f"seed {seed}"
