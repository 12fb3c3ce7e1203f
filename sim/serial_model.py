"""A serial port on a design's ``rx``/``tx`` pins (8N1), for the PC clients in cocotb benches.

The clients (:class:`nanokpu.host.client.KpuClient`, :class:`nanokpu.host.bridge_client.BridgeClient`) are
plain blocking code; they run in a ``cocotb.task.bridge`` thread and call :meth:`SerialModel.write`,
:meth:`SerialModel.read` and :meth:`SerialModel.send_break`, which resume the simulation until
the bytes have gone or come.
"""

from __future__ import annotations

from collections import deque

import cocotb
from cocotb.clock import Clock
from cocotb.task import resume
from cocotb.triggers import ClockCycles, Event, FallingEdge, Timer, with_timeout

__all__ = ["CLOCK_HZ", "SerialModel", "open_line"]

#: The clock :func:`open_line` gives the design: its period in ns, its rate.
CLOCK_NS = 10
CLOCK_HZ = 1_000_000_000 // CLOCK_NS

#: Bit times the line idles after a break: the time a client waits before it drops what it
#: received (:data:`nanokpu.host.bridge_client.BREAK_SETTLE`), which its thread's sleep does not
#: give the simulation.
BREAK_IDLE_BITS = 20


async def open_line(dut, divisor: int) -> SerialModel:
    """Start ``dut``'s :data:`CLOCK_HZ` clock, reset it (``rx`` idle high) and return the serial port
    on its ``rx``/``tx`` (``divisor`` clock cycles a bit)."""
    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns", impl="gpi").start())   # no Python per clock edge
    dut.rx.value = 1
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 4)
    return SerialModel(dut, divisor)


class SerialModel:
    """``write``/``read`` of a serial port on ``dut.rx``/``dut.tx``, callable from a bridge thread.

    ``traffic`` counts ``bytes_out`` (written), ``bytes_in`` (read), ``waits`` (the reads that
    found fewer bytes than they asked for and waited for the design) and ``round_trips`` (the
    waits whose answer came with nothing left to send but the byte on the line: the line to
    the design idles until the client has the answer, so on a USB serial adapter each costs
    the adapter's latency on top of the line time). ``baudrate``, ``send_break`` and
    ``reset_input_buffer`` are pyserial's.
    """

    def __init__(self, dut, divisor: int):
        self.dut, self.div = dut, divisor
        self.traffic = {"bytes_out": 0, "bytes_in": 0, "waits": 0, "round_trips": 0}
        self.out, self.inp = deque(), deque()
        self.queued, self.arrived = Event(), Event()
        cocotb.start_soon(self._send())
        cocotb.start_soon(self._receive())

    def _bit_time(self) -> Timer:
        """One bit time: one Python wake-up a bit, none a clock cycle (a Timer each await: the send
        and receive tasks wait at different times)."""
        return Timer(self.div * CLOCK_NS, "ns")

    async def _send(self):
        self.dut.rx.value = 1
        while True:
            if not self.out:
                self.queued.clear()
                await self.queued.wait()
            byte = self.out.popleft()
            await FallingEdge(self.dut.clk)   # rx moves between rising edges: never a race with the clock
            if isinstance(byte, tuple):    # a break: rx low for `cycles`, then idle
                cycles, done = byte
                self.dut.rx.value = 0
                await Timer(cycles * CLOCK_NS, "ns")
                self.dut.rx.value = 1
                await Timer(BREAK_IDLE_BITS * self.div * CLOCK_NS, "ns")
                done.set()
                continue
            for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
                self.dut.rx.value = bit
                await self._bit_time()

    async def _receive(self):
        while True:
            await FallingEdge(self.dut.tx)
            await Timer((self.div + self.div // 2) * CLOCK_NS, "ns")   # the middle of bit 0
            byte = 0
            for i in range(8):
                byte |= int(self.dut.tx.value) << i
                await self._bit_time()
            assert int(self.dut.tx.value) == 1, "stop bit"
            self.inp.append(byte)
            self.arrived.set()

    @resume
    async def write(self, data: bytes):
        self.out.extend(data)
        self.traffic["bytes_out"] += len(data)
        self.queued.set()

    @property
    def baudrate(self) -> float:
        return CLOCK_HZ / self.div

    @resume
    async def send_break(self, duration: float):
        """Hold ``rx`` low for ``duration`` seconds once the bytes written before have gone,
        then idle :data:`BREAK_IDLE_BITS` bit times; return after that."""
        done = Event()
        self.out.append((max(1, round(duration * CLOCK_HZ)), done))
        self.queued.set()
        await done.wait()

    def reset_input_buffer(self):
        self.inp.clear()

    @resume
    async def read(self, n: int) -> bytes:
        waited = len(self.inp) < n
        while len(self.inp) < n:
            self.arrived.clear()
            await with_timeout(self.arrived.wait(), 2_000_000, "ns")
        self.traffic["waits"] += waited
        self.traffic["round_trips"] += waited and not self.out
        self.traffic["bytes_in"] += n
        return bytes(self.inp.popleft() for _ in range(n))
