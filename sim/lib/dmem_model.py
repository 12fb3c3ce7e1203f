"""The contract of :class:`nanokpu.kpu.dmem.DataMemory` as a cycle model (:class:`DmemModel`)
and random traffic for it (:func:`random_ops`); tests/kpu/test_dmem.py runs both against the
RTL."""

from __future__ import annotations

import numpy as np


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
