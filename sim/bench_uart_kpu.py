"""cocotb bench of the board design (nanokpu.uart_axil.UartKpu) on Verilator, through its serial line only.

The PC client :class:`nanokpu.host.KpuClient`, unchanged, runs in a ``cocotb`` bridge thread on
a serial port model that sends and receives the bits on ``rx``/``tx`` (``divisor`` clock cycles
a bit, as the design was built). :meth:`KpuClient.run_block` loads a compiled random block into
the on-chip host memory and the instruction memory, starts it, polls ``STATUS`` and reads the
outputs back; they must equal :func:`golden.block.latent_moe_int` bit for bit.

Parameters (``NANOKPU_PARAMS``): ``profile``, ``tokens``, ``seed``, ``divisor``.
"""

from __future__ import annotations

from collections import deque

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.task import bridge, resume
from cocotb.triggers import ClockCycles, Event, FallingEdge, with_timeout

from golden.block import latent_moe_int, random_block
from nanokpu.compiler import compile_block
from nanokpu.config import profile
from nanokpu.host import KpuClient
from sim.runner import bench_params


class SerialModel:
    """``write``/``read`` of a serial port on ``dut.rx``/``dut.tx``, callable from a bridge thread."""

    def __init__(self, dut, divisor: int):
        self.dut, self.div = dut, divisor
        self.out, self.inp = deque(), deque()
        self.queued, self.arrived = Event(), Event()
        cocotb.start_soon(self._send())
        cocotb.start_soon(self._receive())

    async def _send(self):
        self.dut.rx.value = 1
        while True:
            if not self.out:
                self.queued.clear()
                await self.queued.wait()
            byte = self.out.popleft()
            for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
                self.dut.rx.value = bit
                await ClockCycles(self.dut.clk, self.div)

    async def _receive(self):
        while True:
            await FallingEdge(self.dut.tx)
            await ClockCycles(self.dut.clk, self.div + self.div // 2)
            byte = 0
            for i in range(8):
                byte |= int(self.dut.tx.value) << i
                await ClockCycles(self.dut.clk, self.div)
            assert int(self.dut.tx.value) == 1, "stop bit"
            self.inp.append(byte)
            self.arrived.set()

    @resume
    async def write(self, data: bytes):
        self.out.extend(data)
        self.queued.set()

    @resume
    async def read(self, n: int) -> bytes:
        while len(self.inp) < n:
            self.arrived.clear()
            await with_timeout(self.arrived.wait(), 2_000_000, "ns")
        return bytes(self.inp.popleft() for _ in range(n))


@cocotb.test()
async def test_block_over_uart(dut):
    p = bench_params()
    cfg = profile(p.get("profile", "tiny"))
    seed, tokens = int(p.get("seed", 1)), int(p.get("tokens", 4))
    dut._log.info(f"profile {cfg.name}, {tokens} tokens, seed {seed}")
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rx.value = 1
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 4)
    port = SerialModel(dut, int(p["divisor"]))
    Q, xq, _, _ = random_block(cfg, tokens, np.random.default_rng(seed))
    prog = compile_block(Q, xq, cfg)

    @bridge
    def run():
        return KpuClient(port).run_block(prog, poll=0)

    result = await run()
    ref = latent_moe_int(xq, Q, cfg)
    for key in ("y", "idx", "weights", "loads"):
        assert np.array_equal(result["outputs"][key], ref[key]), f"seed {seed}: {key} differs from latent_moe_int"
    assert np.array_equal(result["loads"], np.minimum(ref["loads"], (1 << cfg.load_width) - 1)), \
        f"seed {seed}: load counters {result['loads']} != {ref['loads']}"
    assert int(dut.irq.value) == 1
    dut._log.info(f"seed {seed}: bit-exact over the UART, {result['cycles']} cycles, {result['instrs']} instructions")
