"""The register bank and the instruction fetch alone (Amaranth simulator): the register map of
isa.Reg through AXI4-Lite, the counters, instruction memory writes only while stopped, and a fetch
that lands the written words in Fetch.latency cycles."""

import numpy as np
from amaranth import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from nanokpu.config import profile
from nanokpu.isa import EXECUTORS, IMEM_BASE, INSTR_LAYOUT, INSTR_WORDS, Reg, ctrl_word, status_fields
from nanokpu.kpu.fetch import Fetch
from nanokpu.kpu.regbank import RegisterBank

CFG = profile("tiny")


class _Front(Elaboratable):
    def __init__(self):
        self.bank = RegisterBank(CFG)
        self.fetch = Fetch(CFG)

    def elaborate(self, platform):
        m = Module()
        m.submodules.bank, m.submodules.fetch = self.bank, self.fetch
        wiring.connect(m, self.bank.imem_wr, self.fetch.imem_wr)
        return m


async def _write(ctx, bus, addr, value):
    ctx.set(bus.awaddr, addr)
    ctx.set(bus.wdata, value)
    ctx.set(bus.wstrb, 0xF)
    ctx.set(bus.awvalid, 1)
    ctx.set(bus.wvalid, 1)
    ctx.set(bus.bready, 1)
    await ctx.tick().until(bus.awready & bus.wready)
    ctx.set(bus.awvalid, 0)
    ctx.set(bus.wvalid, 0)
    await ctx.tick().until(bus.bvalid)
    ctx.set(bus.bready, 0)


async def _read(ctx, bus, addr):
    ctx.set(bus.araddr, addr)
    ctx.set(bus.arvalid, 1)
    ctx.set(bus.rready, 1)
    await ctx.tick().until(bus.arready)
    ctx.set(bus.arvalid, 0)
    (data,) = await ctx.tick().sample(bus.rdata).until(bus.rvalid)
    ctx.set(bus.rready, 0)
    return data


def _run(testbench):
    dut = _Front()
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    async def bench(ctx):
        await testbench(ctx, dut.bank, dut.fetch)

    sim.add_testbench(bench)
    sim.run()


def test_registers_counters_and_strobes():
    seen = {"start": 0, "soft_reset": 0, "clear_loads": 0}
    window_writes = []      # the cycles of window_wr
    dut = _Front()

    async def tb(ctx, bank, fetch):
        bus = bank.bus
        await _write(ctx, bus, Reg.HOST_BASE, 0x1234_5000)
        await _write(ctx, bus, Reg.HOST_SIZE, 0x8000)
        assert await _read(ctx, bus, Reg.HOST_BASE) == 0x1234_5000
        assert await _read(ctx, bus, Reg.HOST_SIZE) == 0x8000
        assert await _read(ctx, bus, Reg.INFO) == CFG.dmem_depth
        assert await _read(ctx, bus, Reg.INFO_IMEM) == CFG.imem_depth
        assert len(window_writes) == 2      # one strobe per write of HOST_BASE or HOST_SIZE
        for bit in seen:       # each CTRL bit is its own one-cycle strobe
            await _write(ctx, bus, Reg.CTRL, ctrl_word(**{bit: 1}))
        # run 10 cycles: executor 1 busy for 3, 2 instructions retired
        ctx.set(bank.running, 1)
        ctx.set(bank.pc, 5)
        for cyc in range(10):
            ctx.set(bank.executor, 2 if cyc < 3 else 0)
            ctx.set(bank.retire, cyc in (4, 7))
            await ctx.tick()
        ctx.set(bank.retire, 0)
        ctx.set(bank.executor, 0)
        ctx.set(bank.running, 0)
        ctx.set(bank.done, 1)
        assert await _read(ctx, bus, Reg.CYCLES) == 10
        assert await _read(ctx, bus, Reg.INSTRS) == 2
        busy = [await _read(ctx, bus, Reg.BUSY + 4 * i) for i in range(len(EXECUTORS))]
        assert busy == [0, 3] + [0] * (len(EXECUTORS) - 2)
        st = status_fields(await _read(ctx, bus, Reg.STATUS))
        assert (st.busy, st.done, st.error, st.pc) == (0, 1, 0, 5)
        ctx.set(bank.error, 7)
        st = status_fields(await _read(ctx, bus, Reg.STATUS))
        assert (st.error, st.code) == (1, 7)
        await _write(ctx, bus, Reg.CTRL, ctrl_word(start=1))     # a start clears the counters
        assert await _read(ctx, bus, Reg.CYCLES) == 0
        assert await _read(ctx, bus, Reg.BUSY + 4) == 0

    async def bench(ctx):
        await tb(ctx, dut.bank, dut.fetch)

    async def watch(ctx):
        bank = dut.bank
        cycle = 0
        async for _clk, _rst, window_wr, *v in ctx.tick().sample(bank.window_wr, bank.start, bank.soft_reset,
                                                                  bank.clear_loads):
            for name, value in zip(seen, v, strict=True):
                seen[name] += value
            if window_wr:
                window_writes.append(cycle)
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.add_process(watch)
    sim.run()
    assert seen == {"start": 2, "soft_reset": 1, "clear_loads": 1}
    assert len(window_writes) == 2 and window_writes[1] > window_writes[0] + 1


def test_fetch_lands_the_written_words_and_ignores_writes_while_running():
    rng = np.random.default_rng(4)
    words = [[int(w) for w in rng.integers(0, 1 << 32, INSTR_WORDS, dtype=np.uint64)] for _ in range(3)]

    async def tb(ctx, bank, fetch):
        for i, instr in enumerate(words):
            for w, value in enumerate(instr):
                await _write(ctx, bank.bus, IMEM_BASE + 32 * i + 4 * w, value)
        ctx.set(bank.running, 1)        # ignored while running
        await _write(ctx, bank.bus, IMEM_BASE + 32 * 1, 0xDEAD_BEEF)
        for pc in (2, 0, 1):
            ctx.set(fetch.start, 1)
            ctx.set(fetch.pc, pc)
            await ctx.tick()
            ctx.set(fetch.start, 0)
            cycles = 1
            while not ctx.get(fetch.done):
                await ctx.tick()
                cycles += 1
            assert cycles == Fetch.latency, cycles
            await ctx.tick()
            got = INSTR_LAYOUT.const(ctx.get(fetch.ins)).as_bits()
            assert got == sum(w << (32 * j) for j, w in enumerate(words[pc])), pc

    _run(tb)
