"""The contract of :class:`nanokpu.kpu.dmem.DataMemory` as a cycle model (:class:`DmemModel`)
and random traffic for it (:func:`random_ops`); tests/kpu/test_dmem.py runs both against the
RTL."""

from __future__ import annotations

import numpy as np


class DmemModel:
    """The contract of :class:`nanokpu.kpu.dmem.DataMemory` (``banks`` lanes on ``rd0`` and
    ``wr``, addresses modulo ``size``), one clock edge per :meth:`edge`.

    ``data[0]`` is the list of ``rd0``'s ``banks`` lanes after the edge, ``data[1]`` the list of
    ``rd1``'s one word; an undefined word is ``None``. A write issued at one edge is performed
    at the next (``writing`` high in between). With ``writes_block_reads`` a read issued while
    writing is not performed; otherwise a read of a word being written is undefined.
    """

    def __init__(self, writes_block_reads: bool, banks: int, size: int):
        self.writes_block_reads, self.banks, self.size = writes_block_reads, banks, size
        self.mem: dict[int, int] = {}
        self.data: list[list[int | None]] = [[0] * banks, [0]]
        self.pending: dict[int, int] | None = None   # {addr: data} of the write being performed

    @property
    def writing(self) -> bool:
        """``DataMemory.writing`` before the next edge."""
        return self.pending is not None

    def edge(self, reads, write):
        """``reads``: ``[(en, addr)] * 2`` (``rd0``, ``rd1``); ``write``: ``(en, addr, lanes)``
        issued at this edge, ``lanes[i]`` the word for ``addr + i`` or ``None`` (not written;
        lane 0 is always written)."""
        for p, (en, addr) in enumerate(reads):
            if not en or (self.writes_block_reads and self.writing):
                continue
            words = [(addr + i) % self.size for i in range(self.banks if p == 0 else 1)]
            self.data[p] = [None if self.writing and a in self.pending else self.mem.get(a, 0) for a in words]
        if self.pending is not None:
            self.mem.update(self.pending)
        wr_en, wr_addr, lanes = write
        self.pending = ({(wr_addr + i) % self.size: v for i, v in enumerate(lanes) if v is not None}
                        if wr_en else None)


def random_ops(size: int, banks: int, width: int, cycles: int, rng: np.random.Generator):
    """``cycles`` random (reads, write) pairs for :meth:`DmemModel.edge` over a few low
    addresses and the last ones (so that wide accesses wrap): first writes of them all, then
    reads and masked wide writes mixed, at any alignment."""
    addrs = list(range(2 * banks + 3)) + list(range(size - banks - 1, size))
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    ops = []

    def value():
        return int(rng.choice([lo, hi, -1, 0, int(rng.integers(lo, hi, endpoint=True))]))

    for a in addrs:
        ops.append(([(0, 0), (0, 0)], (1, a, [value()] + [None] * (banks - 1))))
    for _ in range(cycles):
        reads = [(int(rng.random() < 0.6), int(rng.choice(addrs))) for _ in range(2)]
        lanes = [value()] + [value() if rng.random() < 0.6 else None for _ in range(banks - 1)]
        ops.append((reads, (int(rng.random() < 0.4), int(rng.choice(addrs)), lanes)))
    return ops
