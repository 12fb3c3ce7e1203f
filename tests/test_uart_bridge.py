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

from nanokpu.uart_bridge import BAUD_TOLERANCE, CMD_PULSE, CMD_READ, CMD_WRITE, UartBridge, uart_divisor

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



@pytest.mark.parametrize("clk_freq,baud,divisor", [(12_000_000, 115200, 104), (25_000_000, 115200, 217),
                                                  (12_000_000, 3_000_000, 4), (12_000_000, 921600, 13),
                                                  (25_000_000, 1_000_000, 25)])
def test_divisor_rounds_to_the_nearest_rate(clk_freq, baud, divisor):
    assert uart_divisor(clk_freq, baud) == divisor
    assert abs(clk_freq / divisor - baud) <= BAUD_TOLERANCE * baud


@pytest.mark.parametrize("baud,message", [
    (0, "must be a positive integer"), (-9600, "must be a positive"), (115200.0, "must be a positive integer"),
    (4_000_000, "at most clk_freq / 4 = 3000000"),
    (2_500_000, r"gives 2400000 baud \(12000000 / 5\), more than 2% off; the nearest exact rates are "
                "3000000 or 2400000")])
def test_bad_baud_names_the_field(baud, message):
    with pytest.raises(ValueError, match=f"^baud = .*{message}"):
        uart_divisor(12_000_000, baud)


@pytest.mark.parametrize("dsp", ["ice40", pytest.param("generic", marks=pytest.mark.slow)])
def test_gemm_over_the_uart(dsp):
    """The iCEBreaker board design (the tiny GEMM engine in a UartBridge, as built for the UP5K:
    SB_MAC16 by Yosys' model) on Verilator: BridgeClient runs GEMMs over the serial line,
    bit-exact, and reports a refused command by its error code (sim/bench_uart_gemm.py)."""
    from nanokpu.config import profile
    from nanokpu.gemm import kpu_engine
    from sim.runner import FAST_BUILD, run_bench, vendor_build_args, vendor_name

    divisor = 4
    cfg = profile("tiny", dsp=dsp)
    run_bench(UartBridge(kpu_engine(cfg), clk_freq=divisor * 1_000_000, baud=1_000_000),
              vendor_name("uart_gemm_tiny", dsp), "bench_uart_gemm",
              params={"profile": "tiny", "dsp": dsp, "seed": 3, "divisor": divisor}, seed=3,
              build_args=FAST_BUILD + vendor_build_args(dsp))


def test_client_names_ports_and_refuses_bad_ones():
    """BridgeClient's byte map is the bridge's: a write touches only the bytes of its port."""
    from nanokpu.bridge_client import BridgeClient

    class Line:
        def __init__(self):
            self.sent = b""

        def write(self, data):
            self.sent += data

        def read(self, n):
            return bytes([0xA5] * n)

    line = Line()
    client = BridgeClient(line, AddCount())
    assert line.sent == bytes([CMD_WRITE, 0, 0, CMD_WRITE, 1, 0, CMD_WRITE, 2, 0])  # inputs from 0
    line.sent = b""
    assert client.inputs == {"a": (0, 8), "b": (8, 8), "inc": (16, 1)}
    assert client.outputs == {"s": (0, 9), "count": (9, 16)}
    client.set("b", 0x42)
    client.set("b", 0x42)                 # unchanged: nothing sent
    client.pulse("inc")
    assert line.sent == bytes([CMD_WRITE, 1, 0x42, CMD_PULSE, 2, 1])
    line.sent = b""
    assert client.get("s", "count") == [0x1A5, (0xA5A5A5 >> 1) & 0xFFFF]
    assert line.sent == bytes([CMD_READ, 0, CMD_READ, 1, CMD_READ, 2, CMD_READ, 3])  # each byte once
    with pytest.raises(ValueError, match="^name = 'c': not a port of the unit"):
        client.set("c", 1)
    with pytest.raises(ValueError, match="^name = 'a': 8 bits wide"):
        client.pulse("a")
