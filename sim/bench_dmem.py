"""cocotb bench of :class:`nanokpu.kpu.dmem.DataMemory` (``dsp = "ice40"``: SB_SPRAM256KA, simulated
with Yosys' model), cycle by cycle against :class:`DmemModel`.

Random reads on both ports (issued while writing too, where the contract says they are not
performed and the data holds), random writes, the lowest and highest addresses included;
``writing`` checked every cycle.

The memory's config (``dmem_depth``) comes from :func:`sim.runner.bench_config`. Parameters
(``NANOKPU_PARAMS``): ``seed``, ``cycles``.
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge

from sim.runner import bench_config, bench_params


class DmemModel:
    """The contract of :class:`nanokpu.kpu.dmem.DataMemory`, one clock edge per :meth:`edge`.

    ``data[p]`` is what read port ``p`` shows after the edge, ``None`` when undefined. A write
    issued at one edge is performed at the next (``writing`` high in between). With
    ``writes_block_reads`` a read issued while writing is not performed; otherwise a read of
    the row being written is undefined.
    """

    def __init__(self, writes_block_reads: bool):
        self.writes_block_reads = writes_block_reads
        self.mem: dict[int, int] = {}
        self.data: list[int | None] = [0, 0]
        self.pending: tuple[int, int] | None = None   # (addr, data) of the write being performed

    @property
    def writing(self) -> bool:
        """``DataMemory.writing`` before the next edge."""
        return self.pending is not None

    def edge(self, reads, write):
        """``reads``: ``[(en, addr)] * 2``; ``write``: ``(en, addr, data)`` issued at this edge."""
        for p, (en, addr) in enumerate(reads):
            if not en or (self.writes_block_reads and self.writing):
                continue
            collides = self.writing and self.pending[0] == addr
            self.data[p] = None if collides else self.mem.get(addr, 0)
        if self.pending is not None:
            addr, value = self.pending
            self.mem[addr] = value
        wr_en, wr_addr, wr_data = write
        self.pending = (wr_addr, wr_data) if wr_en else None


def random_ops(depth: int, width: int, cycles: int, rng: np.random.Generator):
    """``cycles`` random (reads, write) pairs for :meth:`DmemModel.edge`: first a write of every
    address used (a few low ones and the last), then reads and writes mixed."""
    addrs = [0, 1, 2, 3, 5, 8, depth - 2, depth - 1]
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    ops = []

    def value():
        return int(rng.choice([lo, hi, -1, 0, int(rng.integers(lo, hi, endpoint=True))]))

    for a in addrs:
        ops.append(([(0, 0), (0, 0)], (1, a, value())))
    for _ in range(cycles):
        reads = [(int(rng.random() < 0.6), int(rng.choice(addrs))) for _ in range(2)]
        write = (int(rng.random() < 0.4), int(rng.choice(addrs)), value())
        ops.append((reads, write))
    return ops


@cocotb.test()
async def test_contract(dut):
    p = bench_params()
    depth, seed = bench_config().dmem_depth, int(p.get("seed", 1))
    width = len(dut.wr__data)
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    await RisingEdge(dut.clk)
    dut.rst.value = 0
    model = DmemModel(writes_block_reads=True)
    ports = [(dut.rd0__en, dut.rd0__addr, dut.rd0__data), (dut.rd1__en, dut.rd1__addr, dut.rd1__data)]
    await FallingEdge(dut.clk)
    for n, (reads, write) in enumerate(random_ops(depth, width, int(p.get("cycles", 3000)),
                                                  np.random.default_rng(seed))):
        for (en, addr), (en_s, addr_s, _) in zip(reads, ports, strict=True):
            en_s.value, addr_s.value = en, addr
        dut.wr__en.value, dut.wr__addr.value, dut.wr__data.value = write
        assert int(dut.writing.value) == model.writing, f"seed {seed} cycle {n}: writing"
        await RisingEdge(dut.clk)
        model.edge(reads, write)
        await FallingEdge(dut.clk)
        for i, (_, _, data) in enumerate(ports):
            if n > 8:   # after the writes that define every address used are performed
                got = data.value.to_signed()
                assert got == model.data[i], (f"seed {seed} cycle {n}: rd{i}.data = {got}, expected "
                                              f"{model.data[i]} (reads {reads}, write {write})")
