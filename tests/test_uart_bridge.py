# amaranth: UnusedElaboratable=no
"""nanokpu/uart_bridge.py on the Amaranth simulator, with a host-side UART model in the bench.

The wrapped test unit adds its two input bytes (registered) and counts the cycles its
``inc`` input is high, so a read shows whether ``W`` reached the right bits and whether ``P``
lasted exactly one cycle. Random idle gaps between the host's bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from nanokpu.uart_bridge import CMD_PULSE, CMD_READ, CMD_WRITE, UartBridge

DIV = 5  # clock cycles per bit


class AddCount(wiring.Component):
    """s <= a + b; count <= count + inc (test unit only)."""

    def __init__(self):
        super().__init__({"a": In(8), "b": In(8), "inc": In(1), "s": Out(9), "count": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.s.eq(self.a + self.b)
        with m.If(self.inc):
            m.d.sync += self.count.eq(self.count + 1)
        return m


def test_write_pulse_read():
    seed = 11
    rng = np.random.default_rng(seed)
    dut = UartBridge(AddCount(), clk_freq=DIV * 1000, baud=1000)
    assert (dut.in_bytes, dut.out_bytes) == (3, 4)  # 8+8+1 input bits, 9+16 output bits

    async def send(ctx, byte):
        for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
            ctx.set(dut.rx, bit)
            await ctx.tick().repeat(DIV)
        await ctx.tick().repeat(int(rng.integers(1, 3 * DIV)))  # random idle

    async def receive(ctx):
        for _ in range(40 * DIV):
            if not ctx.get(dut.tx):
                break
            await ctx.tick()
        else:
            raise AssertionError(f"no start bit (seed {seed})")
        await ctx.tick().repeat(DIV + DIV // 2)
        byte = 0
        for i in range(8):
            byte |= ctx.get(dut.tx) << i
            await ctx.tick().repeat(DIV)
        assert ctx.get(dut.tx) == 1, f"stop bit (seed {seed})"
        return byte

    async def read(ctx, addr):
        await send(ctx, CMD_READ)
        for bit in [0, *((addr >> i) & 1 for i in range(8))]:  # the reply starts after the stop bit
            ctx.set(dut.rx, bit)
            await ctx.tick().repeat(DIV)
        ctx.set(dut.rx, 1)
        return await receive(ctx)

    async def bench(ctx):
        ctx.set(dut.rx, 1)
        await ctx.tick().repeat(3)
        pulses = 0
        for _ in range(4):
            a, b = (int(x) for x in rng.integers(0, 256, 2))
            for addr, val in ((0, a), (1, b)):
                await send(ctx, CMD_WRITE)
                await send(ctx, addr)
                await send(ctx, val)
            s = await read(ctx, 0) | (await read(ctx, 1) & 1) << 8
            assert s == a + b, f"{a} + {b} read back as {s} (seed {seed})"
            n = int(rng.integers(1, 3))
            for _ in range(n):
                await send(ctx, CMD_PULSE)
                await send(ctx, 2)
                await send(ctx, 1)
            pulses += n
            count = (await read(ctx, 1) >> 1) | (await read(ctx, 2)) << 7 | (await read(ctx, 3) & 1) << 15
            assert count == pulses, f"count {count}, expected {pulses} (seed {seed})"
        assert await read(ctx, 200) == 0  # beyond the end
        await send(ctx, 0x00)  # unknown command: ignored, the next read still works
        assert await read(ctx, 0) == a + b & 0xFF

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_rejects_fast_baud_and_huge_units():
    with pytest.raises(ValueError, match="^baud = "):
        UartBridge(AddCount(), clk_freq=12_000_000, baud=6_000_000)

    class Wide(wiring.Component):
        def __init__(self):
            super().__init__({"x": In(8 * 257)})

        def elaborate(self, platform):
            return Module()

    with pytest.raises(ValueError, match="^unit: 257 input"):
        UartBridge(Wide(), clk_freq=12_000_000)

