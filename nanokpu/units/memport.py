"""A block RAM read port without read-write collision logic."""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Module, Mux, Signal, Value
from amaranth.lib.memory import Memory

__all__ = ["inverting_read_port", "unchecked_read_port"]


def unchecked_read_port(m: Module, memory: Memory, name: str) -> SimpleNamespace:
    """A synchronous read port of ``memory`` (``addr``, ``en``, ``data``: the row read at the
    last edge where ``en`` was high, held while ``en`` is low) whose data is undefined when the
    row is written in the same cycle.

    An asynchronous read into a register, which Yosys merges into the block RAM without soft
    logic for the collision when ``memory`` carries the ``no_rw_check`` attribute (Amaranth's
    synchronous port promises the old word, which Yosys builds in the fabric: on iCE40 every
    write delayed a cycle and the read data bypassed, a register and a LUT per data bit; on
    the ECP5, a read on the other port of a true-dual-port block, an address comparison in
    front of every read). The caller must never use a read of a row written in the same cycle.
    """
    if memory.attrs.get("no_rw_check") != 1:
        raise ValueError(f"{name}: the memory needs attrs={{'no_rw_check': 1}}")
    port = memory.read_port(domain="comb")
    return _registered(m, port, name, port.data)


def _registered(m: Module, port, name: str, word) -> SimpleNamespace:
    """The port ``port`` (an asynchronous read) with ``word`` (its data, or a function of it)
    registered while ``en`` is high."""
    en = Signal(name=f"{name}_rd_en", init=1)
    data = Signal.like(port.data, name=f"{name}_rd_data", reset_less=True)
    with m.If(en):
        m.d.sync += data.eq(word)
    return SimpleNamespace(addr=port.addr, en=en, data=data)


def inverting_read_port(m: Module, memory: Memory, name: str) -> SimpleNamespace:
    """For tests, in place of :func:`unchecked_read_port`: the same port, except that a read of
    the row the memory's first write port writes in the same cycle returns the word's bits
    inverted, so that a design which used such a read would compute wrong results. Its
    ``collide`` signal is high in the cycles of such reads."""
    port, wr = memory.read_port(domain="comb"), memory.write_ports[0]
    collide = Signal(name=f"{name}_collide")
    m.d.comb += collide.eq(wr.en.any() & (wr.addr == port.addr))
    word = Value.cast(port.data)
    registered = _registered(m, port, name, Mux(collide, ~word, word))
    registered.collide = collide
    return registered
