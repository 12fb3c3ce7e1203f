# amaranth: UnusedElaboratable=no
"""nanokpu/uart_bridge.py on the Amaranth simulator, with a host-side UART model in the bench.

The wrapped test unit adds its two input bytes (registered) and counts the cycles its
``inc`` input is high, so a read shows whether ``W`` reached the right bits and whether ``P``
lasted exactly one cycle. Random idle gaps between the host's bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from nanokpu.uart_bridge import (
    BAUD_TOLERANCE,
    BREAK_DETECT_BITS,
    BREAK_RELEASE_BITS,
    CMD_PULSE,
    CMD_READ,
    CMD_STATUS,
    CMD_UNTIL,
    CMD_WRITE,
    STATUS_BYTES_LOST,
    STATUS_WAIT_RAN_OUT,
    UartBridge,
    uart_divisor,
)

DIV = 5  # clock cycles per bit


class AddCount(wiring.Component):
    """s <= a + b; count <= count + inc; done goes high ``DONE_AFTER`` cycles after go is
    pulsed and stays high; never stays 0 (test unit only)."""

    DONE_AFTER = 300

    def __init__(self):
        super().__init__({"a": In(8), "b": In(8), "inc": In(1), "go": In(1),
                          "s": Out(9), "count": Out(16), "done": Out(1), "never": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.s.eq(self.a + self.b)
        with m.If(self.inc):
            m.d.sync += self.count.eq(self.count + 1)
        timer, started = Signal(range(self.DONE_AFTER + 1)), Signal()
        with m.If(self.go):
            m.d.sync += [timer.eq(self.DONE_AFTER), started.eq(1)]
        with m.Elif(timer != 0):
            m.d.sync += timer.eq(timer - 1)
        m.d.comb += self.done.eq(started & (timer == 0))
        return m


def run_line(dut, bench, seed):
    """Run ``bench(ctx, send, replies)`` on ``dut``'s serial line: ``await send(ctx, *bytes, gap=)``
    sends bytes (``gap``: idle cycles after each, random if None), ``replies`` is the list of
    bytes the bridge sent so far (a background receiver fills it)."""
    rng = np.random.default_rng(seed)
    replies = []

    async def send(ctx, *data, gap=None):
        for byte in data:
            for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
                ctx.set(dut.rx, bit)
                await ctx.tick().repeat(DIV)
            idle = int(rng.integers(1, 3 * DIV)) if gap is None else gap
            if idle:
                await ctx.tick().repeat(idle)

    async def receiver(ctx):
        while True:
            while ctx.get(dut.tx):
                await ctx.tick()
            await ctx.tick().repeat(DIV // 2)
            byte = 0
            for i in range(8):
                await ctx.tick().repeat(DIV)
                byte |= ctx.get(dut.tx) << i
            await ctx.tick().repeat(DIV)
            assert ctx.get(dut.tx) == 1, f"stop bit (seed {seed})"
            replies.append(byte)

    async def main(ctx):
        ctx.set(dut.rx, 1)
        await ctx.tick().repeat(3)
        await bench(ctx, send, replies)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(receiver, background=True)
    sim.add_testbench(main)
    sim.run()


async def reply(ctx, replies, n, seed):
    """Wait for the bridge's ``n``-th reply byte (counted from 1); return it."""
    for _ in range(60 * DIV * n + 1000):
        if len(replies) >= n:
            return replies[n - 1]
        await ctx.tick()
    raise AssertionError(f"no reply {n} (seed {seed}); got {replies}")


def test_write_pulse_read():
    seed = 11
    rng = np.random.default_rng(seed)
    dut = UartBridge(AddCount(), clk_freq=DIV * 1000, baud=1000)
    assert (dut.in_bytes, dut.out_bytes) == (3, 4)  # 8+8+1+1 input bits, 9+16+1+1 output bits

    async def bench(ctx, send, replies):
        async def read(addr):
            await send(ctx, CMD_READ, addr)
            return await reply(ctx, replies, len(replies) + 1, seed)

        pulses = 0
        for _ in range(4):
            a, b = (int(x) for x in rng.integers(0, 256, 2))
            for addr, val in ((0, a), (1, b)):
                await send(ctx, CMD_WRITE, addr, val)
            s = await read(0) | (await read(1) & 1) << 8
            assert s == a + b, f"{a} + {b} read back as {s} (seed {seed})"
            n = int(rng.integers(1, 3))
            for _ in range(n):
                await send(ctx, CMD_PULSE, 2, 1)
            pulses += n
            count = (await read(1) >> 1) | (await read(2)) << 7 | (await read(3) & 1) << 15
            assert count == pulses, f"count {count}, expected {pulses} (seed {seed})"
        assert await read(200) == 0  # beyond the end
        await send(ctx, 0x00)  # unknown command: ignored, the next read still works
        assert await read(0) == a + b & 0xFF

    run_line(dut, bench, seed)


def test_until_queues_commands_and_status_reports_losses():
    """Back-to-back bytes while a ``U`` waits: they queue and run after it (an ``R`` sees the
    awaited bit); a ``U`` that runs out sets status bit 0; bytes beyond the queue are lost and
    set bit 1; ``S`` clears both."""
    seed = 5
    depth, limit = 4, 700
    dut = UartBridge(AddCount(), clk_freq=DIV * 1000, baud=1000, queue_depth=depth, wait_limit=limit)
    done_byte, done_bit = 3, 1 << 1  # out bits: s 0-8, count 9-24, done 25, never 26
    never_bit = 1 << 2

    async def bench(ctx, send, replies):
        # P go, U done, R done, S in one burst: without the wait, R would run 250 cycles after
        # the pulse, before done rises
        await send(ctx, CMD_PULSE, 2, 2, CMD_UNTIL, done_byte, done_bit, CMD_READ, done_byte, CMD_STATUS, gap=0)
        assert await reply(ctx, replies, 1, seed) & done_bit, f"R ran before U saw done (seed {seed})"
        assert await reply(ctx, replies, 2, seed) == 0, f"status {replies[1]} (seed {seed})"
        # U on a bit that never rises, then 6 S back to back: 4 queue, 2 are lost (700 cycles)
        await send(ctx, CMD_UNTIL, done_byte, never_bit, *[CMD_STATUS] * 6, gap=0)
        got = [await reply(ctx, replies, n, seed) for n in range(3, 7)]
        assert got == [STATUS_WAIT_RAN_OUT | STATUS_BYTES_LOST, 0, 0, 0], f"{got} (seed {seed})"
        await ctx.tick().repeat(60 * DIV)
        assert len(replies) == 6, f"{replies}: the lost bytes were answered (seed {seed})"

    run_line(dut, bench, seed)


@pytest.mark.parametrize("field,value", [("queue_depth", 1), ("wait_limit", 0), ("queue_depth", 2.5)])
def test_bad_queue_or_limit_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} = "):
        UartBridge(AddCount(), clk_freq=12_000_000, **{field: value})


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
    bit-exact, reports a refused command by its error code, and ``board-run`` runs a 2-token
    block bit-exact (sim/bench_uart_gemm.py)."""
    from nanokpu.bench_bridge import run_uart_gemm_bench

    run_uart_gemm_bench(dsp, seed=3)


def test_bridge_bench_table_adds_a_latency_per_round_trip():
    from nanokpu.bench_bridge import bridge_table

    text = bridge_table([{"tokens": 2, "bytes_out": 115_200, "bytes_in": 4_000, "round_trips": 250}])
    # 1,152,000 bits: 10 s at 115,200 baud, 1.152 s at 1 Mbaud; 250 trips: +0.25 s, +4 s
    assert "| 2 | 115,200 | 4,000 | 250 | 10.00 s | 10.25 s | 14.00 s | 1.15 s | 1.40 s | 5.15 s |" in text


class FakeLine:
    """The bridge's protocol without the hardware, for BridgeClient: an ``R`` answers
    ``OUT[a]`` of ``out`` (0xA5 by default), an ``S`` the next of ``statuses`` (0 when none
    is left); it asserts that the client never has more than ``depth`` bytes unanswered (sent
    after the last command whose reply it has read). A break drops the commands not yet
    parsed (asserting it is long enough), ``reset_input_buffer`` the replies not read.
    ``log`` is what was written since the last ``clear()``; ``reads`` counts the reads,
    ``breaks`` the breaks."""

    baudrate = 115200

    def __init__(self, depth, out=None, statuses=()):
        self.depth, self.out, self.statuses = depth, out or {}, list(statuses)
        self.buf, self.replies, self.parsed, self.taken = b"", [], 0, 0
        self.breaks = 0
        self.clear()

    def send_break(self, duration):
        assert duration * self.baudrate >= BREAK_DETECT_BITS, f"a break of {duration} s is too short"
        self.buf, self.parsed, self.taken = b"", 0, 0
        self.breaks += 1

    def reset_input_buffer(self):
        self.replies = []

    def clear(self):
        self.log, self.reads = b"", 0

    def write(self, data):
        self.buf += data
        self.log += data
        assert len(self.buf) - self.taken <= self.depth, "the bridge's queue would overflow"
        while self.parsed < len(self.buf):
            cmd = self.buf[self.parsed]
            end = self.parsed + {CMD_STATUS: 1, CMD_READ: 2}.get(cmd, 3)
            if end > len(self.buf):
                break
            if cmd == CMD_READ:
                self.replies.append((end, self.out.get(self.buf[self.parsed + 1], 0xA5)))
            elif cmd == CMD_STATUS:
                self.replies.append((end, self.statuses.pop(0) if self.statuses else 0))
            self.parsed = end

    def read(self, n):
        self.reads += 1
        got, self.replies = self.replies[:n], self.replies[n:]
        if got:
            self.taken = got[-1][0]
        return bytes(byte for _, byte in got)


def test_client_names_ports_and_refuses_bad_ones():
    """BridgeClient's byte map is the bridge's: a write touches only the bytes of its port."""
    from nanokpu.bridge_client import BridgeClient

    line = FakeLine(512)
    client = BridgeClient(line, AddCount())
    # a break (the inputs 0), then a status read
    assert line.breaks == 1 and line.log == bytes([CMD_STATUS])
    assert client.inputs == {"a": (0, 8), "b": (8, 8), "inc": (16, 1), "go": (17, 1)}
    assert client.outputs == {"s": (0, 9), "count": (9, 16), "done": (25, 1), "never": (26, 1)}
    line.clear()
    client.set("b", 0x42)
    client.set("b", 0x42)                 # unchanged: nothing sent
    client.pulse("inc")
    client.until("done")
    assert line.log == bytes([CMD_WRITE, 1, 0x42, CMD_PULSE, 2, 1, CMD_UNTIL, 3, 2]) and line.reads == 0
    line.clear()
    assert client.get("s", "count") == [0x1A5, (0xA5A5A5 >> 1) & 0xFFFF]
    assert line.log == bytes([CMD_READ, 0, CMD_READ, 1, CMD_READ, 2, CMD_READ, 3])  # each byte once
    with pytest.raises(ValueError, match="^name = 'c': not a port of the unit"):
        client.set("c", 1)
    with pytest.raises(ValueError, match="^name = 'a': 8 bits wide"):
        client.pulse("a")
    with pytest.raises(ValueError, match="^name = 's': 9 bits wide"):
        client.until("s")


class Streams(wiring.Component):
    """An input stream ``x`` of 32 bits and an output stream ``y`` of 16 (port map only)."""

    def __init__(self):
        super().__init__({"x": In(stream.Signature(32)), "y": Out(stream.Signature(16))})


@pytest.mark.parametrize("depth", [16, 40, 512])
def test_client_streams_without_waiting_and_never_overflows_the_queue(depth):
    """A send goes out without reads but a status request each half queue, read when the
    queue would be full, and one at the end; a receive queues every beat before it reads;
    the client never has more bytes unanswered than the queue holds (FakeLine asserts it)."""
    from nanokpu.bridge_client import BridgeClient

    # outputs: x.ready bit 0, y.payload bits 1-16, y.valid 17: 0x1234 << 1 = 0x2468
    line = FakeLine(depth, out={0: 0x68, 1: 0x24, 2: 0x00})
    client = BridgeClient(line, Streams(), queue_depth=depth)
    line.clear()
    client.send("x", range(0x01020300, 0x01020300 + 10))
    # first beat 3 W (byte 0 stays 0), then 1 W, each with a U and a P
    assert line.log.count(CMD_UNTIL) == 10 and len(line.log) == 15 + 9 * 9 + line.log.count(CMD_STATUS)
    assert line.reads <= 96 // (depth // 2) + 1 and (depth < 96 or line.reads == 1), line.reads
    line.clear()
    assert client.receive("y", 5) == [0x1234] * 5
    assert line.log.count(CMD_READ) == 15
    assert line.reads <= 60 // (depth // 2) + 2 and (depth < 60 or line.reads == 2), line.reads
    assert client.traffic["bytes_out"] == len(line.buf) and client.traffic["waits"] >= 3


def test_a_new_client_starts_clean_after_one_that_stopped_midway():
    """A client stops with commands queued and a reply unread; the next one on the same line
    resets the bridge with a break, drops the stale reply and reads its own answers."""
    from nanokpu.bridge_client import BridgeClient

    line = FakeLine(64, out={0: 0x11})
    old = BridgeClient(line, AddCount(), queue_depth=64)
    old.set("a", 7)
    old._write(bytes([CMD_READ, 0]), 1)      # a read whose reply is never taken
    old.until("never")
    new = BridgeClient(line, AddCount(), queue_depth=64)
    assert line.breaks == 2 and new.shadow == bytearray(3)
    line.out[0] = 0x22
    assert new.get("s") == [0x22 | (0xA5 & 1) << 8]
    new.set("a", 7)
    new.reset()
    line.clear()
    new.set("a", 7)      # the break set it to 0: the client writes it again
    assert line.breaks == 3 and line.log == bytes([CMD_WRITE, 0, 7])


def test_client_reports_the_bridge_status():
    from nanokpu.bridge_client import BridgeClient

    with pytest.raises(TimeoutError, match="wait for a port of the unit ran out"):
        BridgeClient(FakeLine(512, statuses=[STATUS_WAIT_RAN_OUT]), AddCount())
    with pytest.raises(RuntimeError, match="lost bytes"):
        BridgeClient(FakeLine(512, statuses=[STATUS_BYTES_LOST]), AddCount())

    class Silent(FakeLine):
        def read(self, n):
            return b""

    with pytest.raises(TimeoutError, match="answered 0 of 1 bytes"):
        BridgeClient(Silent(512), AddCount())


def test_break_resets_the_bridge_and_the_unit():
    """A break (``rx`` low for BREAK_DETECT_BITS bit times) in the middle of a command, with a
    ``U`` waiting and bytes queued behind it, leaves nothing behind: the next commands run at
    once on a reset unit (inputs 0, count 0, status clear). A shorter low run is a dropped byte
    and resets nothing."""
    seed = 8
    dut = UartBridge(AddCount(), clk_freq=DIV * 1000, baud=1000, wait_limit=1 << 20)
    never_byte, never_bit = 3, 1 << 2

    async def line_low(ctx, bits):
        ctx.set(dut.rx, 0)
        await ctx.tick().repeat(bits * DIV)
        ctx.set(dut.rx, 1)
        await ctx.tick().repeat(BREAK_RELEASE_BITS * DIV + 3)

    async def bench(ctx, send, replies):
        async def read(addr):
            await send(ctx, CMD_READ, addr)
            return await reply(ctx, replies, len(replies) + 1, seed)

        await send(ctx, CMD_WRITE, 0, 0x40, CMD_WRITE, 1, 0x02, CMD_PULSE, 2, 1, CMD_PULSE, 2, 1)
        assert await read(0) == 0x42 and await read(1) >> 1 == 2, f"{replies} (seed {seed})"
        await line_low(ctx, BREAK_DETECT_BITS - 5)     # a framing error, not a break
        assert await read(0) == 0x42 and await read(1) >> 1 == 2, f"{replies} (seed {seed})"
        # a wait that would last 2**20 cycles, commands queued behind it, half a W
        await send(ctx, CMD_UNTIL, never_byte, never_bit, CMD_PULSE, 2, 1, CMD_WRITE, 0)
        await line_low(ctx, BREAK_DETECT_BITS + 1)
        n = len(replies)
        assert [await read(0), await read(1), await read(2)] == [0, 0, 0], f"{replies} (seed {seed})"
        await send(ctx, CMD_STATUS)
        assert await reply(ctx, replies, n + 4, seed) == 0, f"status {replies[-1]} (seed {seed})"

    run_line(dut, bench, seed)
