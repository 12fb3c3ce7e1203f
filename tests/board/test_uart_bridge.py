# amaranth: UnusedElaboratable=no
"""nanokpu/board/uart_bridge.py on the Amaranth simulator, with a host-side UART model in the bench.

The wrapped test unit adds its two input bytes (registered) and counts the cycles its
``inc`` input is high, so a read shows whether ``W`` reached the right bits and whether a
handshake (a one-byte ``B``) against an output that is always 1 lasted exactly one cycle.
Random idle gaps between the host's bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from nanokpu.board.uart_bridge import UartBridge
from nanokpu.bridge_protocol import (
    BAUD_TOLERANCE,
    BREAK_DETECT_BITS,
    BREAK_RELEASE_BITS,
    BURST_PARAMS,
    CMD_BURST,
    CMD_READ,
    CMD_STATUS,
    CMD_UNTIL,
    CMD_WRITE,
    STATUS_BYTES_LOST,
    STATUS_WAIT_RAN_OUT,
    uart_divisor,
)

DIV = 5  # clock cycles per bit


class AddCount(wiring.Component):
    """s <= a + b; count <= count + inc; done goes high ``DONE_AFTER`` cycles after go is
    pulsed and stays high; never stays 0, one stays 1 (test unit only)."""

    DONE_AFTER = 300

    def __init__(self):
        super().__init__({"a": In(8), "b": In(8), "inc": In(1), "go": In(1),
                          "s": Out(9), "count": Out(16), "done": Out(1), "never": Out(1), "one": Out(1)})

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
        m.d.comb += [self.done.eq(started & (timer == 0)), self.one.eq(1)]
        return m


def handshake(byte: int, bit: int, until_byte: int, until_bit: int, data: int = 0) -> list[int]:
    """A one-byte ``B``: ``IN[byte] = data | bit`` until ``OUT[until_byte] & until_bit``, then ``data``."""
    return [CMD_BURST, byte, byte, bit, until_byte, until_bit, 0, data]


#: On :class:`AddCount` behind the bridge: ``inc`` (IN byte 2 bit 0) and ``go`` (bit 1) high for
#: exactly one cycle (against ``one``, OUT byte 3 bit 3).
INC_ONCE, GO_ONCE = handshake(2, 1, 3, 1 << 3), handshake(2, 2, 3, 1 << 3)


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


def test_write_handshake_read():
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
                await send(ctx, *INC_ONCE)
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
        # go, U done, R done, S back to back: without the wait, R would run 250 cycles after
        # go, before done rises
        await send(ctx, *GO_ONCE, CMD_UNTIL, done_byte, done_bit, CMD_READ, done_byte, CMD_STATUS, gap=0)
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


@pytest.mark.slow(100)
def test_gemm_over_the_uart():
    """The iCEBreaker board design (the tiny GEMM engine in a UartBridge, as built for the UP5K:
    SB_MAC16 by Yosys' model) on Verilator: BridgeClient runs GEMMs over the serial line,
    bit-exact, reports a refused command by its error code, and a 2-token block runs with every
    GEMM on it, bit-exact (sim/bench_uart_gemm.py)."""
    from nanokpu.commands.bench_bridge import run_uart_gemm_bench

    run_uart_gemm_bench("ice40", seed=3)


def test_bridge_bench_table_adds_a_latency_per_round_trip():
    from nanokpu.commands.bench_bridge import bridge_table

    text = bridge_table([{"tokens": 2, "bytes_out": 115_200, "bytes_in": 4_000, "round_trips": 250}])
    # 1,152,000 bits: 10 s at 115,200 baud, 1.152 s at 1 Mbaud; 250 trips: +0.25 s, +4 s
    assert "| 2 | 115,200 | 4,000 | 250 | 10.00 s | 10.25 s | 14.00 s | 1.15 s | 1.40 s | 5.15 s |" in text


class FakeLine:
    """The bridge's protocol without the hardware, for BridgeClient: an ``R`` answers
    ``OUT[a]`` of ``out`` (0xA5 by default), an ``S`` the next of ``statuses`` (0 when none
    is left); it asserts that the client never has more than ``depth`` bytes unanswered (sent
    after the last command whose reply it has read). A break drops the commands not yet
    parsed (asserting it is long enough), ``reset_input_buffer`` the replies not read.
    ``log`` is what was written since the last ``clear()``, ``commands`` the whole commands
    in it; ``reads`` counts the reads, ``breaks`` the breaks."""

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
        self.log, self.reads, self.commands = b"", 0, []

    def write(self, data):
        self.buf += data
        self.log += data
        assert len(self.buf) - self.taken <= self.depth, "the bridge's queue would overflow"
        while self.parsed < len(self.buf):
            cmd = self.buf[self.parsed]
            end = self.parsed + {CMD_STATUS: 1, CMD_READ: 2, CMD_BURST: 1 + BURST_PARAMS}.get(cmd, 3)
            if end > len(self.buf):
                break
            if cmd == CMD_BURST:
                f, last, *_, n = self.buf[self.parsed + 1:end]
                assert f <= last, f"a burst from byte {f} to {last}"
                end += (n + 1) * (last - f + 1)
                if end > len(self.buf):
                    break
            self.commands.append(self.buf[self.parsed:end])
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
    from nanokpu.host.bridge_client import BridgeClient

    line = FakeLine(512)
    client = BridgeClient(line, AddCount())
    # a break (the inputs 0), then a status read
    assert line.breaks == 1 and line.log == bytes([CMD_STATUS])
    assert client.inputs == {"a": (0, 8), "b": (8, 8), "inc": (16, 1), "go": (17, 1)}
    assert client.outputs == {"s": (0, 9), "count": (9, 16), "done": (25, 1), "never": (26, 1), "one": (27, 1)}
    line.clear()
    client.set("b", 0x42)
    client.set("b", 0x42)                 # unchanged: nothing sent
    client.handshake("inc", "one")
    client.until("done")
    assert line.log == bytes([CMD_WRITE, 1, 0x42, *INC_ONCE, CMD_UNTIL, 3, 2]) and line.reads == 0
    line.clear()
    assert client.get("s", "count") == [0x1A5, (0xA5A5A5 >> 1) & 0xFFFF]
    assert line.log == bytes([CMD_READ, 0, CMD_READ, 1, CMD_READ, 2, CMD_READ, 3])  # each byte once
    with pytest.raises(ValueError, match="^name = 'c': not a port of the unit"):
        client.set("c", 1)
    with pytest.raises(ValueError, match="^name = 'a': 8 bits wide"):
        client.handshake("a", "one")
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
    from nanokpu.host.bridge_client import BridgeClient

    # outputs: x.ready bit 0, y.payload bits 1-16, y.valid 17: 0x1234 << 1 = 0x2468
    line = FakeLine(depth, out={0: 0x68, 1: 0x24, 2: 0x00})
    client = BridgeClient(line, Streams(), queue_depth=depth)
    line.clear()
    words = list(range(0x01020300, 0x01020300 + 10))
    client.send("x", words)
    if depth == 16:  # a burst of one beat is more than half the queue: W and a handshake a beat
        # first beat 3 W (byte 0 stays 0), then 1 W, each with a handshake of x.valid (byte 4
        # bit 0) against x.ready (OUT byte 0 bit 0)
        shakes = [c for c in line.commands if c[0] == CMD_BURST]
        assert shakes == [bytes([CMD_BURST, 4, 4, 1, 0, 1, 0, 0])] * 10, shakes
        assert len(line.log) == 3 * 3 + 9 * 3 + 10 * 8 + line.log.count(CMD_STATUS)
    else:  # bursts of 2 or 10 beats (half a queue at most): x.payload bytes 0-3, x.valid byte 4
        # bit 0, x.ready OUT byte 0 bit 0; each beat the payload and byte 4 (y.ready 0, x.valid 0)
        bursts = [c for c in line.commands if c[0] == CMD_BURST]
        per = {40: 2, 512: 10}[depth]
        assert [c[1:7] for c in bursts] == [bytes([0, 4, 1, 0, 1, per - 1])] * (10 // per), bursts
        assert b"".join(c[7:] for c in bursts) == b"".join(w.to_bytes(4, "little") + b"\0" for w in words)
        assert all(len(c) <= depth // 2 for c in bursts)
        assert len(line.commands) == len(bursts) + line.log.count(CMD_STATUS)
    sent = len(line.log)
    assert line.reads <= sent // (depth // 2) + 1 and (depth < sent or line.reads == 1), line.reads
    line.clear()
    assert client.receive("y", 5) == [0x1234] * 5
    # each word: U on y.valid (OUT byte 2 bit 1), 3 R, a handshake of y.ready (IN byte 4 bit 1)
    word = bytes([CMD_UNTIL, 2, 2, CMD_READ, 0, CMD_READ, 1, CMD_READ, 2, CMD_BURST, 4, 4, 2, 2, 2, 0, 0])
    assert [c for c in line.commands if c[0] != CMD_STATUS] == [word[:3], *(word[i:i + 2] for i in (3, 5, 7)),
                                                                  word[9:]] * 5
    sent = len(line.log)
    assert line.reads <= sent // (depth // 2) + 2 and (depth < sent or line.reads == 2), line.reads
    assert client.traffic["bytes_out"] == len(line.buf) and client.traffic["waits"] >= 3


def test_a_new_client_starts_clean_after_one_that_stopped_midway():
    """A client stops with commands queued and a reply unread; the next one on the same line
    resets the bridge with a break, drops the stale reply and reads its own answers."""
    from nanokpu.host.bridge_client import BridgeClient

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
    from nanokpu.host.bridge_client import BridgeClient

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

        await send(ctx, CMD_WRITE, 0, 0x40, CMD_WRITE, 1, 0x02, *INC_ONCE, *INC_ONCE)
        assert await read(0) == 0x42 and await read(1) >> 1 == 2, f"{replies} (seed {seed})"
        await line_low(ctx, BREAK_DETECT_BITS - 5)     # a framing error, not a break
        assert await read(0) == 0x42 and await read(1) >> 1 == 2, f"{replies} (seed {seed})"
        # a wait that would last 2**20 cycles, commands queued behind it, half a W
        await send(ctx, CMD_UNTIL, never_byte, never_bit, *INC_ONCE, CMD_WRITE, 0)
        await line_low(ctx, BREAK_DETECT_BITS + 1)
        n = len(replies)
        assert [await read(0), await read(1), await read(2)] == [0, 0, 0], f"{replies} (seed {seed})"
        await send(ctx, CMD_STATUS)
        assert await reply(ctx, replies, n + 4, seed) == 0, f"status {replies[-1]} (seed {seed})"

    run_line(dut, bench, seed)


class Sink(wiring.Component):
    """Takes 12-bit beats on ``x`` (ready 2 cycles of 3, never while ``hold``), sums them
    (``total``, mod 2**16) and counts them (``beats``, mod 2**8) (test unit only)."""

    def __init__(self):
        super().__init__({"x": In(stream.Signature(12)), "hold": In(1), "total": Out(16), "beats": Out(8)})

    def elaborate(self, platform):
        m = Module()
        phase = Signal(2)
        m.d.sync += phase.eq(Mux(phase == 2, 0, phase + 1))
        m.d.comb += self.x.ready.eq((phase != 0) & ~self.hold)
        with m.If(self.x.valid & self.x.ready):
            m.d.sync += [self.total.eq(self.total + self.x.payload), self.beats.eq(self.beats + 1)]
        return m


def test_burst_moves_each_beat_once_and_reports_a_stalled_stream():
    """``B``: beats sent back to back reach a sink whose ``ready`` drops 1 cycle in 3, each
    exactly once (sum and count); a stream that never gets ``ready`` costs the wait limit per
    beat, sets status bit 0 and moves nothing, and the commands after the burst still parse."""
    seed = 21
    rng = np.random.default_rng(seed)
    limit = 400
    dut = UartBridge(Sink(), clk_freq=DIV * 1000, baud=1000, wait_limit=limit)
    # IN: x.payload bits 0-11, x.valid 12, hold 13; OUT: x.ready 0, total 1-16, beats 17-24
    header = [CMD_BURST, 0, 1, 1 << 4, 0, 1]

    async def bench(ctx, send, replies):
        async def read_all():
            n = len(replies)
            await send(ctx, *(b for a in range(4) for b in (CMD_READ, a)))
            out = [await reply(ctx, replies, n + i, seed) for i in range(1, 5)]
            word = int.from_bytes(bytes(out), "little")
            return (word >> 1) & 0xFFFF, (word >> 17) & 0xFF

        words = [int(w) for w in rng.integers(0, 1 << 12, 9)]
        words[0], words[1] = 0xFFF, 0x000          # the extremes
        await send(ctx, *header, len(words) - 1, *(b for w in words for b in (w & 0xFF, w >> 8)), gap=0)
        assert await read_all() == (sum(words) & 0xFFFF, len(words)), f"{words} (seed {seed})"
        # hold: ready never rises; 2 beats, each waits out the limit; then S reports it
        await send(ctx, CMD_WRITE, 1, 1 << 5, *header, 1, 0x12, 0x20, 0x34, 0x20, CMD_STATUS, gap=0)
        assert await reply(ctx, replies, 5, seed) == STATUS_WAIT_RAN_OUT, f"{replies} (seed {seed})"
        await send(ctx, CMD_WRITE, 1, 0)
        assert await read_all() == (sum(words) & 0xFFFF, len(words)), f"a held beat moved (seed {seed})"
        await send(ctx, *header, 0, 0x01, 0x00, gap=0)
        assert await read_all() == ((sum(words) + 1) & 0xFFFF, len(words) + 1), f"(seed {seed})"

    run_line(dut, bench, seed)
