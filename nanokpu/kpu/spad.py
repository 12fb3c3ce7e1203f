"""The one owner of the data scratchpad's ports: each client (an executor, the controller) sees
a port set of its own, and the client the controller selects drives the memory."""

from __future__ import annotations

from amaranth import Module, Value, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.isa import word_width
from nanokpu.kpu.decoded import widths
from nanokpu.kpu.dmem import DataMemory, read_signature, writes_block_reads

__all__ = ["Scratchpad", "spad_client_signature", "write_signature"]


def write_signature(addr_width: int, shape) -> wiring.Signature:
    """A write port as its user sees it: ``en``, ``addr``, ``data`` out."""
    return wiring.Signature({"en": Out(1), "addr": Out(addr_width), "data": Out(shape)})


def spad_client_signature(cfg: KpuConfig) -> wiring.Signature:
    """A client's view of the data scratchpad (:class:`~nanokpu.kpu.dmem.DataMemory`): two read
    ports (``en`` low by default), a write port, and ``blocked``: high in a cycle in which a
    read issued would not be performed (:func:`~nanokpu.kpu.dmem.writes_block_reads`), so a
    client that reads after writing waits while it is high."""
    aw, shape = widths(cfg).aw, signed(word_width(cfg))
    rd = read_signature(aw, shape)
    rd = wiring.Signature({"en": Out(1), "addr": rd.members["addr"], "data": rd.members["data"]})
    return wiring.Signature({"rd0": Out(rd), "rd1": Out(rd), "wr": Out(write_signature(aw, shape)),
                             "blocked": In(1)})


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
        m.d.comb += [mem.wr.en.eq(_or(self, lambda c: c.wr.en)),
                     mem.wr.addr.eq(_or(self, lambda c: c.wr.addr)),
                     mem.wr.data.eq(_or(self, lambda c: c.wr.data))]
        for c in self.clients:
            m.d.comb += c.blocked.eq(blocked)
        return m
