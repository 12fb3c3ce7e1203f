"""The one owner of the data scratchpad's ports: each client (an executor, the controller) sees
a port set of its own, and the client the controller selects drives the memory."""

from __future__ import annotations

from amaranth import Module, Value, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.isa import word_width
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.dmem import (
    DataMemory,
    banks,
    read_signature,
    wide_read_signature,
    write_signature,
    writes_block_reads,
)

__all__ = ["Scratchpad", "spad_client_signature"]


def spad_client_signature(cfg: KpuConfig) -> wiring.Signature:
    """A client's view of the data scratchpad (:class:`~nanokpu.kpu.dmem.DataMemory`, ``B =``
    :func:`~nanokpu.kpu.dmem.banks`): the wide read port ``rd0`` (``lanes``: the ``B`` words from
    ``addr`` on), the narrow ``rd1`` (both with ``en`` low by default), the write port ``wr``
    (:func:`~nanokpu.kpu.dmem.write_signature`: ``data`` at ``addr``, up to ``B - 1`` more
    lanes after it), and ``blocked``: high in a cycle in which a read issued would not be
    performed (:func:`~nanokpu.kpu.dmem.writes_block_reads`), so a client that reads after
    writing waits while it is high."""
    aw, shape, B = widths(cfg).aw, signed(word_width(cfg)), banks(cfg)

    def enable_low(sig):
        return wiring.Signature(dict(sig.members) | {"en": Out(1)})

    return wiring.Signature({"rd0": Out(enable_low(wide_read_signature(aw, shape, B))),
                             "rd1": Out(enable_low(read_signature(aw, shape))),
                             "wr": Out(write_signature(aw, shape, B)), "blocked": In(1)})


def _or(pad, get):
    """The value ``get(client)`` of the client ``pad.select`` picks: the OR of every client's
    value masked by its select bit (0 when none is selected)."""
    out = 0
    for i, c in enumerate(pad.clients):
        v = Value.cast(get(c))
        out = out | (v.as_unsigned() & pad.select[i].replicate(len(v)))
    return out


class Scratchpad(wiring.Component):
    """The data scratchpad behind ``n_clients`` client ports.

    Members
    -------
    clients : In(spad_client_signature(cfg)).array(n_clients)
    select : In(n_clients)
        One-hot (or zero): the client whose reads and write reach the memory; the others' are
        ignored. Read data and ``blocked`` reach every client.

    The memory's timing is :class:`~nanokpu.kpu.dmem.DataMemory`'s (read data one cycle after
    the read, the write performed one cycle after it is issued).
    """

    def __init__(self, cfg: KpuConfig, n_clients: int):
        self.cfg = cfg
        self.memory = DataMemory(cfg)
        super().__init__({"clients": In(spad_client_signature(cfg)).array(n_clients),
                          "select": In(n_clients)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = mem = self.memory
        blocked = mem.writing if writes_block_reads(self.cfg) else 0

        for name in ("rd0", "rd1"):
            port = getattr(mem, name)
            m.d.comb += [port.en.eq(_or(self, lambda c, n=name: getattr(c, n).en)),
                         port.addr.eq(_or(self, lambda c, n=name: getattr(c, n).addr))]
            for c in self.clients:
                m.d.comb += getattr(c, name).data.eq(port.data)
        for c in self.clients:
            m.d.comb += c.rd0.lanes.eq(mem.rd0.lanes)
        m.d.comb += [getattr(mem.wr, n).eq(_or(self, lambda c, n=n: getattr(c.wr, n)))
                     for n in ("en", "addr", "data", "upper", "upper_en")]
        for c in self.clients:
            m.d.comb += c.blocked.eq(blocked)
        return m
