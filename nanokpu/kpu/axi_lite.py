"""A minimal AXI4-Lite slave: bus handshakes in, one-cycle register read/write strobes out.

The owner decodes the strobes (the nano-KPU top level maps its control, status, counters,
instruction memory and routing load counters on them). Responses are always OKAY: a write to an
unmapped or read-only address is ignored and an unmapped read returns 0, so the bus never hangs.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["axi_lite_signature", "AxiLiteRegisters"]


def axi_lite_signature(addr_width: int) -> wiring.Signature:
    """AXI4-Lite signals with 32-bit data, directions seen from the master."""
    return wiring.Signature({
        "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
        "wdata": Out(32), "wstrb": Out(4), "wvalid": Out(1), "wready": In(1),
        "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
        "rdata": In(32), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
    })


class AxiLiteRegisters(wiring.Component):
    """AXI4-Lite slave front end of a register bank.

    Parameters
    ----------
    addr_width : int
        Byte address width of the bank.

    Members
    -------
    bus : In(axi_lite_signature(addr_width))
    wr_en : Out(1)
        One-cycle strobe: write ``wr_data`` (bytes enabled by ``wr_strb``) at ``wr_addr``.
    wr_addr, wr_data, wr_strb : Out
    rd_en : Out(1)
        One-cycle strobe: the owner must drive ``rd_data`` for ``rd_addr`` in the NEXT cycle
        (a synchronous memory read port fits).
    rd_addr : Out(addr_width)
    rd_data : In(32)

    Timing: a write completes (``bvalid``) one cycle after both its address and data arrived;
    a read answers (``rvalid``) two cycles after its address handshake. One transaction of each
    kind at a time.
    """

    def __init__(self, addr_width: int):
        if not isinstance(addr_width, int) or not 2 < addr_width <= 32:
            raise ValueError(f"AxiLiteRegisters.addr_width = {addr_width!r}: must be in [3, 32]")
        self.addr_width = addr_width
        super().__init__({
            "bus": In(axi_lite_signature(addr_width)),
            "wr_en": Out(1), "wr_addr": Out(addr_width), "wr_data": Out(32), "wr_strb": Out(4),
            "rd_en": Out(1), "rd_addr": Out(addr_width), "rd_data": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        aw_ok = Signal()
        w_ok = Signal()
        awaddr = Signal(self.addr_width)
        m.d.comb += [
            bus.awready.eq(~aw_ok & ~bus.bvalid),
            bus.wready.eq(~w_ok & ~bus.bvalid),
            bus.bresp.eq(0), bus.rresp.eq(0),
        ]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [aw_ok.eq(1), awaddr.eq(bus.awaddr)]
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += [w_ok.eq(1), self.wr_data.eq(bus.wdata), self.wr_strb.eq(bus.wstrb)]
        m.d.comb += [self.wr_en.eq(aw_ok & w_ok), self.wr_addr.eq(awaddr)]
        with m.If(self.wr_en):
            m.d.sync += [aw_ok.eq(0), w_ok.eq(0), bus.bvalid.eq(1)]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)

        pending = Signal()  # rd_en issued, data next cycle
        m.d.comb += [
            bus.arready.eq(~pending & ~bus.rvalid),
            self.rd_en.eq(bus.arvalid & bus.arready),
            self.rd_addr.eq(bus.araddr),
        ]
        m.d.sync += pending.eq(self.rd_en)
        with m.If(pending):
            m.d.sync += [bus.rvalid.eq(1), bus.rdata.eq(self.rd_data)]
        with m.If(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        return m
