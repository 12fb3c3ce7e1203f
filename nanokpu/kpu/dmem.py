"""The nano-KPU's data scratchpad: two read ports and a write port over ``dmem_depth`` words."""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from nanokpu.config import KpuConfig
from nanokpu.isa import word_width
from nanokpu.units.memport import unchecked_read_port

__all__ = ["DataMemory", "read_signature", "writes_block_reads"]

def writes_block_reads(cfg: KpuConfig) -> bool:
    """Whether a cycle in which the data scratchpad performs a write (``DataMemory.writing``)
    performs no read (the controller then issues none): with ``dsp = "ecp5"`` the words are one
    copy in true-dual-port block RAM, the write sharing port A with ``rd0`` (half the blocks of
    two copies). Otherwise (``generic``) two copies of 1-read 1-write block RAM, no restriction."""
    return cfg.dsp == "ecp5"


def read_signature(addr_width: int, shape) -> wiring.Signature:
    """A read port as its user sees it: ``en`` (1 by default), ``addr`` out, ``data`` in."""
    return wiring.Signature({"en": Out(1, init=1), "addr": Out(addr_width), "data": In(shape)})


class DataMemory(wiring.Component):
    """``cfg.dmem_depth`` signed words of :func:`~nanokpu.isa.word_width` bits.

    Members
    -------
    rd0, rd1 : In(read_signature(addr_width, signed(word_width)))
        Synchronous reads: ``data`` is the word at the ``addr`` of the last edge where ``en``
        was high, and holds while ``en`` is low. A read of the row being written, issued while
        ``writing`` is high, returns an undefined word (no collision logic in front of the
        block RAM: :func:`~nanokpu.units.memport.unchecked_read_port`).
    wr : In(Signature({"en": Out(1), "addr": Out(addr_width), "data": Out(signed(word_width))}))
        Writes ``data`` at ``addr``: registered on the edge where ``en`` is high, performed on
        the next edge (the blocks take data, address and enable off flip-flops, so no logic of
        the caller's lies on the paths to them, which on a large ECP5 scratchpad cross the die).
    writing : Out(1)
        High in the cycle in which the memory performs a write (the one after ``wr.en``).

    With :func:`writes_block_reads` a read issued while ``writing`` is high is not performed
    (its ``data`` holds, as with ``en`` low); the caller never issues one.
    """

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        self.addr_width = ceil_log2(cfg.dmem_depth)
        shape = signed(word_width(cfg))
        super().__init__({
            "rd0": In(read_signature(self.addr_width, shape)),
            "rd1": In(read_signature(self.addr_width, shape)),
            "wr": In(wiring.Signature({"en": Out(1), "addr": Out(self.addr_width), "data": Out(shape)})),
            "writing": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, reads = self.cfg, (self.rd0, self.rd1)
        ww = word_width(cfg)
        # the write, registered: what the blocks write in the cycle after wr.en
        wr = Signal(data.StructLayout({"en": 1, "addr": self.addr_width, "data": signed(ww)}), name="wq")
        m.d.sync += wr.en.eq(self.wr.en)
        m.d.comb += self.writing.eq(wr.en)
        with m.If(self.wr.en):
            m.d.sync += [wr.addr.eq(self.wr.addr), wr.data.eq(self.wr.data)]
        m.submodules.mem = mem = Memory(shape=signed(ww), depth=cfg.dmem_depth, init=[],
                                        attrs={"no_rw_check": 1})
        port_w = mem.write_port()
        ports = [unchecked_read_port(m, mem, f"rd{i}") for i in range(len(reads))]
        if writes_block_reads(cfg):
            # port A: the write's address or rd0's (no read is performed while writing)
            shared = Mux(wr.en, wr.addr, self.rd0.addr)
            addrs, ens = (shared, self.rd1.addr), [rd.en & ~wr.en for rd in reads]
        else:
            shared = wr.addr
            addrs, ens = [rd.addr for rd in reads], [rd.en for rd in reads]
        m.d.comb += [port_w.addr.eq(shared), port_w.en.eq(wr.en), port_w.data.eq(wr.data)]
        for rd, port, addr, en in zip(reads, ports, addrs, ens, strict=True):
            m.d.comb += [port.addr.eq(addr), port.en.eq(en), rd.data.eq(port.data)]
        return m
