"""An AXI4 master (INCR bursts) that turns "read/write N beats from address A" into streams.

The nano-KPU reaches host memory through it: ``LOAD`` and ``GEMM`` (weight panels) read,
``STORE`` writes. Bursts are at most 16 beats and never cross a 4 KB boundary; reads keep
issuing bursts while earlier ones are still returning data, writes send one burst's address
then its data. An ``abort`` stops issuing and drains what is outstanding (read data is taken
and dropped, a started write burst is finished with all byte strobes low), so the slave never
sees a protocol violation and the master ends ``idle``.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["axi4_signature", "AxiMaster", "MAX_BURST"]

#: Beats per burst.
MAX_BURST = 16


def axi4_signature(addr_width: int, data_width: int) -> wiring.Signature:
    """The AXI4 master-side signals (directions seen from the master; one-bit IDs, always 0)."""
    strb = data_width // 8
    return wiring.Signature({
        "awid": Out(1), "arid": Out(1), "bid": In(1), "rid": In(1),
        "awaddr": Out(addr_width), "awlen": Out(8), "awsize": Out(3), "awburst": Out(2),
        "awvalid": Out(1), "awready": In(1),
        "wdata": Out(data_width), "wstrb": Out(strb), "wlast": Out(1), "wvalid": Out(1),
        "wready": In(1),
        "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        "araddr": Out(addr_width), "arlen": Out(8), "arsize": Out(3), "arburst": Out(2),
        "arvalid": Out(1), "arready": In(1),
        "rdata": In(data_width), "rresp": In(2), "rlast": In(1), "rvalid": In(1), "rready": Out(1),
    })


class AxiMaster(wiring.Component):
    """Burst reads into ``rd_data``, ``wr_data`` into burst writes.

    Parameters
    ----------
    addr_width : int
        Byte address width.
    data_width : int
        Bits per beat: a power of two, at least 32.

    Members
    -------
    bus : Out(axi4_signature(addr_width, data_width))
    rd_start, rd_addr, rd_beats : In
        Start reading ``rd_beats`` beats at byte address ``rd_addr`` (beat aligned); ignored
        while ``rd_busy``.
    rd_data : Out(stream.Signature(data_width))
        The beats in address order.
    rd_busy : Out(1)
        From ``rd_start`` until every beat is delivered (or dropped by ``abort``).
    wr_start, wr_addr, wr_beats : In
        Start writing ``wr_beats`` beats at ``wr_addr``; ignored while ``wr_busy``.
    wr_data : In(stream.Signature(StructLayout(data, strb)))
    wr_busy : Out(1)
        Until the last write response.
    error : Out(1)
        Set by a SLVERR/DECERR response, cleared by the next start.
    abort : In(1)
        Stop issuing, drain outstanding beats and responses.

    Latency: a read's first beat arrives one cycle after the slave's first ``rvalid``; the
    address of the next burst goes out while the current one returns.
    """

    def __init__(self, addr_width: int, data_width: int):
        if data_width < 32 or data_width & (data_width - 1):
            raise ValueError(f"AxiMaster.data_width = {data_width}: must be a power of two >= 32")
        self.addr_width, self.data_width = addr_width, data_width
        self.wr_layout = data.StructLayout({"data": data_width, "strb": data_width // 8})
        super().__init__({
            "bus": Out(axi4_signature(addr_width, data_width)),
            "rd_start": In(1), "rd_addr": In(addr_width), "rd_beats": In(24),
            "rd_data": Out(stream.Signature(data_width)), "rd_busy": Out(1),
            "wr_start": In(1), "wr_addr": In(addr_width), "wr_beats": In(24),
            "wr_data": In(stream.Signature(self.wr_layout)), "wr_busy": Out(1),
            "error": Out(1), "abort": In(1),
        })

    def _burst(self, m, addr, left):
        """Beats of the next burst: ``min(left, MAX_BURST, beats to the 4 KB boundary)``."""
        size = self.data_width // 8
        to_4k = Signal(range(4096 // size + 1))
        m.d.comb += to_4k.eq((4096 - addr[:12]) // size)
        n = Signal(range(MAX_BURST + 1))
        first = Mux(left < MAX_BURST, left, MAX_BURST)
        m.d.comb += n.eq(Mux(to_4k < first, to_4k, first))
        return n

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        size_code = (self.data_width // 8).bit_length() - 1
        m.d.comb += [bus.arsize.eq(size_code), bus.awsize.eq(size_code),
                     bus.arburst.eq(1), bus.awburst.eq(1)]

        # -- reads -------------------------------------------------------------------------
        ar_addr = Signal(self.addr_width)
        ar_left = Signal(24)
        r_out = Signal(25)       # beats requested and not yet received
        ar_n = self._burst(m, ar_addr, ar_left)
        m.d.comb += [
            bus.araddr.eq(ar_addr), bus.arlen.eq(ar_n - 1),
            bus.arvalid.eq((ar_left != 0) & ~self.abort),
            self.rd_busy.eq((ar_left != 0) | (r_out != 0)),
            self.rd_data.payload.eq(bus.rdata),
            self.rd_data.valid.eq(bus.rvalid & ~self.abort),
            bus.rready.eq(self.rd_data.ready | self.abort),
        ]
        ar_fire = bus.arvalid & bus.arready
        r_fire = bus.rvalid & bus.rready
        m.d.sync += r_out.eq(r_out + Mux(ar_fire, ar_n, 0) - r_fire)
        with m.If(ar_fire):
            m.d.sync += [ar_addr.eq(ar_addr + (ar_n << size_code)), ar_left.eq(ar_left - ar_n)]
        with m.If(self.abort):
            m.d.sync += ar_left.eq(0)
        with m.Elif(self.rd_start & ~self.rd_busy):
            m.d.sync += [ar_addr.eq(self.rd_addr), ar_left.eq(self.rd_beats)]

        # -- writes: one burst at a time (address, then its beats) --------------------------
        aw_addr = Signal(self.addr_width)
        aw_left = Signal(24)
        w_left = Signal(range(MAX_BURST + 1))   # beats of the current burst still to send
        b_out = Signal(24)                      # bursts without a response yet
        aw_n = self._burst(m, aw_addr, aw_left)
        m.d.comb += [
            bus.awaddr.eq(aw_addr), bus.awlen.eq(aw_n - 1),
            bus.awvalid.eq((aw_left != 0) & (w_left == 0) & ~self.abort),
            bus.wvalid.eq((w_left != 0) & (self.wr_data.valid | self.abort)),
            bus.wdata.eq(self.wr_data.payload.data),
            bus.wstrb.eq(Mux(self.abort, 0, self.wr_data.payload.strb)),
            bus.wlast.eq(w_left == 1),
            self.wr_data.ready.eq((w_left != 0) & bus.wready & ~self.abort),
            bus.bready.eq(1),
            self.wr_busy.eq((aw_left != 0) | (w_left != 0) | (b_out != 0)),
        ]
        aw_fire = bus.awvalid & bus.awready
        w_fire = bus.wvalid & bus.wready
        b_fire = bus.bvalid & bus.bready
        m.d.sync += b_out.eq(b_out + aw_fire - b_fire)
        with m.If(aw_fire):
            m.d.sync += [aw_addr.eq(aw_addr + (aw_n << size_code)), aw_left.eq(aw_left - aw_n),
                         w_left.eq(aw_n)]
        with m.Elif(w_fire):
            m.d.sync += w_left.eq(w_left - 1)
        with m.If(self.abort):
            m.d.sync += aw_left.eq(0)
        with m.Elif(self.wr_start & ~self.wr_busy):
            m.d.sync += [aw_addr.eq(self.wr_addr), aw_left.eq(self.wr_beats)]

        # -- errors ------------------------------------------------------------------------
        with m.If((r_fire & (bus.rresp != 0)) | (b_fire & (bus.bresp != 0))):
            m.d.sync += self.error.eq(1)
        with m.Elif((self.rd_start & ~self.rd_busy) | (self.wr_start & ~self.wr_busy)):
            m.d.sync += self.error.eq(0)
        return m

