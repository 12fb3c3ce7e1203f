"""A UART host bridge for the whole nano-KPU: 32-bit word reads and writes from a PC over 8N1.

:class:`UartKpu` is the board design: a :class:`~nanokpu.kpu.top.NanoKPU`, an on-chip host memory
(:class:`HostMemory`, block RAM) on its ``m_axi`` master port, and a :class:`UartAxiBridge` that
reaches both from the serial line. Bridge address space (byte addresses, 32 bits):

==========================================  ===============================================
bridge address                              what
==========================================  ===============================================
``KPU_BASE + a``, ``a < 2**ADDR_WIDTH``     the nano-KPU's AXI4-Lite slave (``s_axil``) at
                                            ``a``: registers, instruction memory, load
                                            counters (:mod:`nanokpu.isa`)
``MEM_BASE + a``, ``a < host_bytes``        host memory byte ``a``: what the nano-KPU sees
                                            at ``m_axi`` address ``a``
anything else                               answers SLVERR (reads return 0)
==========================================  ===============================================

Protocol (host -> bridge; words and addresses little endian; unknown command bytes are ignored):

==========================  ================================  ====================================
bytes                       reply                             effect
==========================  ================================  ====================================
``W a0..a3 n d0..d3 ...``   ``s``                             write ``n + 1`` words (``4 (n + 1)``
                                                              data bytes) at ``a, a + 4, ...``
``R a0..a3 n``              ``4 (n + 1)`` data bytes, ``s``   read ``n + 1`` words at
                                                              ``a, a + 4, ...``
==========================  ================================  ====================================

``W`` and ``R`` are the ASCII bytes 0x57 and 0x52; ``n`` is one byte, the word count minus 1;
``a`` is a multiple of 4. ``s`` is the OR of the words' AXI responses: 0 when every word was
OKAY, 2 (SLVERR) when a word was outside both regions (that word was not written, or read as 0).
A write word is performed as soon as its 4 bytes have arrived (the host sends a command's bytes
back to back); the reply of a read starts when the first word is read. The host sends the next
command after the status byte of the previous one (bytes arriving during a reply are dropped).
A command left incomplete for ``timeout`` seconds is dropped (the parser waits for a command
byte again), so a host that lost sync recovers by pausing.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from nanokpu.board.uart_bridge import UartRx, UartTx
from nanokpu.bridge_protocol import uart_divisor
from nanokpu.config import KpuConfig
from nanokpu.host_protocol import (
    CMD_READ,
    CMD_WRITE,
    DEFAULT_HOST_BYTES,
    KPU_BASE,
    MEM_BASE,
    RESP_OKAY,
    RESP_SLVERR,
)
from nanokpu.isa import ADDR_WIDTH, bus_bytes
from nanokpu.kpu.axi_lite import axi_lite_signature
from nanokpu.kpu.axi_master import axi4_signature

__all__ = ["HostMemory", "UartAxiBridge", "UartKpu"]

_FIXED, _INCR, _WRAP = 0, 1, 2


class HostMemory(wiring.Component):
    """``host_bytes`` of block RAM: an AXI4 slave for the nano-KPU and a word port for the bridge.

    Parameters
    ----------
    host_bytes : int
        Size, a power of two, at least one data word.
    data_width : int
        AXI data bits, a power of two >= 32 (the memory's word).

    Members
    -------
    bus : In(axi4_signature(32, data_width))
        FIXED, INCR and WRAP bursts of any size up to ``data_width``, every byte strobe honoured,
        IDs echoed. A beat at or beyond ``host_bytes`` is not performed and answers SLVERR
        (read data 0; a write burst with any such beat answers SLVERR). Writes: ``awready``
        while no write burst or response is pending, then one beat a cycle, the response the
        cycle after the last beat. Reads: ``arready`` once every beat of the previous burst was
        read from the memory; the first beat is valid 3 cycles after the address handshake,
        then one a cycle while ``rready`` is high (a 2-entry output FIFO).
    addr : In(32)
        Word port (32-bit words, byte address, bits 1:0 ignored, taken modulo ``host_bytes``).
    rd_en : In(1)
        Read ``addr``: ``rd_data`` is valid the next cycle.
    rd_data : Out(32)
    wr_en : In(1)
        Write ``wr_data`` at ``addr``.
    wr_data : In(32)

    The word port has priority: in a cycle with ``rd_en`` the AXI read side issues no read, in a
    cycle with ``wr_en`` ``wready`` is low. The block RAM has one read and one write port.
    """

    def __init__(self, host_bytes: int, data_width: int = 32):
        if data_width < 32 or data_width & (data_width - 1):
            raise ValueError(f"HostMemory.data_width = {data_width!r}: must be a power of two >= 32")
        if not isinstance(host_bytes, int) or host_bytes < data_width // 8 or host_bytes & (host_bytes - 1):
            raise ValueError(f"HostMemory.host_bytes = {host_bytes!r}: must be a power of two >= "
                             f"{data_width // 8}")
        self.host_bytes, self.data_width = host_bytes, data_width
        super().__init__({
            "bus": In(axi4_signature(32, data_width)),
            "addr": In(32), "rd_en": In(1), "rd_data": Out(32), "wr_en": In(1), "wr_data": In(32),
        })

    @staticmethod
    def _next(addr, size, burst, length):
        """Address of the beat after ``addr`` in a burst (AXI4 A3.4.1)."""
        incr = (Const(1, 8) << size)[:8]
        wrap_mask = ((length + 1) << size) - 1
        base = addr - (addr & wrap_mask)
        return Mux(burst == _FIXED, addr,
                   Mux(burst == _WRAP, base | ((addr + incr) & wrap_mask), addr + incr))

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        lanes = self.data_width // 8
        lane_bits = lanes.bit_length() - 1
        size_bits = self.host_bytes.bit_length() - 1
        m.submodules.mem = mem = Memory(shape=self.data_width, depth=self.host_bytes // lanes, init=[])
        rd, wr = mem.read_port(), mem.write_port(granularity=8)

        def index(addr):
            return addr[lane_bits:size_bits]

        def in_range(addr):
            return addr[size_bits:] == 0

        # -- word port (priority) -----------------------------------------------------------
        word_lane = Signal(max(lane_bits - 2, 0) + 1)
        if lane_bits > 2:
            with m.If(self.rd_en):
                m.d.sync += word_lane.eq(self.addr[2:lane_bits])
        m.d.comb += self.rd_data.eq(rd.data.word_select(word_lane, 32))

        # -- writes -------------------------------------------------------------------------
        w_active = Signal()
        w_err = Signal()
        w_addr = Signal(32)
        w_len = Signal(8)
        w_size = Signal(3)
        w_burst = Signal(2)
        w_left = Signal(9)
        m.d.comb += [
            bus.awready.eq(~w_active & ~bus.bvalid),
            bus.wready.eq(w_active & ~self.wr_en),
        ]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [w_active.eq(1), w_err.eq(0), w_addr.eq(bus.awaddr), w_len.eq(bus.awlen),
                         w_size.eq(bus.awsize), w_burst.eq(bus.awburst), w_left.eq(bus.awlen + 1),
                         bus.bid.eq(bus.awid)]
        beat_bad = ~in_range(w_addr)
        with m.If(self.wr_en):
            m.d.comb += [wr.addr.eq(index(self.addr)), wr.data.eq(Cat(*([self.wr_data] * (lanes // 4))))]
            if lane_bits > 2:
                m.d.comb += wr.en.eq(Const(0xF, lanes) << (self.addr[2:lane_bits] * 4))
            else:
                m.d.comb += wr.en.eq(0xF)
        with m.Elif(bus.wvalid & bus.wready):
            m.d.comb += [wr.addr.eq(index(w_addr)), wr.data.eq(bus.wdata),
                         wr.en.eq(Mux(beat_bad, 0, bus.wstrb))]
            m.d.sync += [w_addr.eq(self._next(w_addr, w_size, w_burst, w_len)), w_left.eq(w_left - 1),
                         w_err.eq(w_err | beat_bad)]
            with m.If(w_left == 1):
                m.d.sync += [w_active.eq(0), bus.bvalid.eq(1),
                             bus.bresp.eq(Mux(w_err | beat_bad, RESP_SLVERR, RESP_OKAY))]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)

        # -- reads: issue into the memory, data through a 2-entry FIFO ----------------------
        r_addr = Signal(32)
        r_len = Signal(8)
        r_size = Signal(3)
        r_burst = Signal(2)
        r_id = Signal(1)
        r_left = Signal(9)
        m.submodules.r_fifo = fifo = SyncFIFO(width=self.data_width + 3, depth=2)
        inflight = Signal()
        inflight_err = Signal()
        inflight_last = Signal()
        inflight_id = Signal()
        m.d.comb += bus.arready.eq(r_left == 0)
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += [r_addr.eq(bus.araddr), r_len.eq(bus.arlen), r_size.eq(bus.arsize),
                         r_burst.eq(bus.arburst), r_left.eq(bus.arlen + 1), r_id.eq(bus.arid)]
        pop = fifo.r_en & fifo.r_rdy
        issue = (r_left != 0) & ~self.rd_en & (fifo.level + inflight <= 1 + pop)
        m.d.sync += inflight.eq(issue)
        with m.If(self.rd_en):
            m.d.comb += rd.addr.eq(index(self.addr))
        with m.Else():
            m.d.comb += rd.addr.eq(index(r_addr))
        with m.If(issue):
            m.d.sync += [r_addr.eq(self._next(r_addr, r_size, r_burst, r_len)), r_left.eq(r_left - 1),
                         inflight_err.eq(~in_range(r_addr)), inflight_last.eq(r_left == 1),
                         inflight_id.eq(r_id)]
        m.d.comb += [
            fifo.w_en.eq(inflight),
            fifo.w_data.eq(Cat(Mux(inflight_err, 0, rd.data), inflight_err, inflight_last, inflight_id)),
            bus.rvalid.eq(fifo.r_rdy),
            bus.rdata.eq(fifo.r_data[:self.data_width]),
            bus.rresp.eq(Mux(fifo.r_data[self.data_width], RESP_SLVERR, RESP_OKAY)),
            bus.rlast.eq(fifo.r_data[self.data_width + 1]),
            bus.rid.eq(fifo.r_data[self.data_width + 2]),
            fifo.r_en.eq(bus.rready),
        ]
        return m


class UartAxiBridge(wiring.Component):
    """The serial protocol of this module (8N1, ``uart_divisor(clk_freq, baud)`` cycles a bit) on an
    AXI4-Lite master (``axil``, the nano-KPU's registers) and a :class:`HostMemory` inside.

    Parameters
    ----------
    clk_freq : int
        Clock frequency in Hz.
    baud : int
        Bit rate: the divisor ``round(clk_freq / baud)`` must be at least 4 and give a rate
        within 2 % of ``baud`` (:func:`~nanokpu.board.uart_bridge.uart_divisor`).
    host_bytes : int
        Host memory size (a power of two).
    data_width : int
        The host memory's AXI4 data width (the nano-KPU's ``m_axi``: ``8 * bus_bytes(cfg)``).
    timeout : float
        Seconds after which an incomplete command is dropped.

    Members
    -------
    rx : In(1, init=1)
        Serial input (idle high).
    tx : Out(1, init=1)
        Serial output.
    axil : Out(axi_lite_signature(ADDR_WIDTH))
        One transaction at a time, all byte strobes set; any response is accepted (the words'
        responses are ORed into the status byte).
    mem : In(axi4_signature(32, data_width))
        The host memory's AXI4 slave (:class:`HostMemory`).

    Latency: a word write reaches its region the cycle after its last byte's stop bit is
    sampled (the AXI4-Lite ``awvalid``/``wvalid`` rise then); a read reply starts 2 cycles after
    the word is read (a host memory word is read the cycle after the ``n`` byte or, for the next
    words, when the previous word's last byte is sent).
    """

    def __init__(self, clk_freq: int, baud: int = 115200, host_bytes: int = DEFAULT_HOST_BYTES,
                 data_width: int = 32, timeout: float = 0.1):
        divisor = uart_divisor(clk_freq, baud)
        self.timeout_cycles = int(timeout * clk_freq)
        if self.timeout_cycles < 12 * divisor:
            raise ValueError(f"timeout = {timeout!r}: must be at least 12 bit times ({12 / baud:g} s)")
        if host_bytes > MEM_BASE:
            raise ValueError(f"host_bytes = {host_bytes!r}: must be at most {MEM_BASE:#x}")
        self.divisor = divisor
        self.memory = HostMemory(host_bytes, data_width)
        self.host_bytes, self.data_width = host_bytes, data_width
        super().__init__({
            "rx": In(1, init=1), "tx": Out(1, init=1),
            "axil": Out(axi_lite_signature(ADDR_WIDTH)),
            "mem": In(axi4_signature(32, data_width)),
        })

    def elaborate(self, platform):  # noqa: C901 - one command parser
        m = Module()
        m.submodules.memory = hm = self.memory
        wiring.connect(m, wiring.flipped(self.mem), hm.bus)
        m.submodules.uart_rx = urx = UartRx(self.divisor)
        m.submodules.uart_tx = utx = UartTx(self.divisor)
        m.d.comb += [urx.rx.eq(self.rx), self.tx.eq(utx.tx)]
        axil = self.axil
        m.d.comb += [axil.wstrb.eq(0xF), axil.bready.eq(1), axil.rready.eq(1)]

        cmd = Signal(8)
        addr = Signal(32)
        data = Signal(32)
        count = Signal(8)
        nbyte = Signal(2)          # bytes of the current address/word received or sent
        status = Signal(2)
        in_kpu = addr[ADDR_WIDTH:] == KPU_BASE >> ADDR_WIDTH
        mem_bits = self.host_bytes.bit_length() - 1
        in_mem = addr[mem_bits:] == MEM_BASE >> mem_bits
        aw_done = Signal()
        w_done = Signal()
        m.d.comb += [axil.awaddr.eq(addr), axil.araddr.eq(addr), axil.wdata.eq(data),
                     hm.addr.eq(addr), hm.wr_data.eq(data)]

        idle = Signal(range(self.timeout_cycles + 1))
        receiving = Signal()
        with m.If(urx.strobe | ~receiving):
            m.d.sync += idle.eq(0)
        with m.Else():
            m.d.sync += idle.eq(idle + 1)
        timed_out = idle == self.timeout_cycles

        def next_word(m):
            """After a word: the next one (address + 4), or the status byte."""
            m.d.sync += [addr.eq(addr + 4), count.eq(count - 1)]
            with m.If(count == 0):
                m.next = "STATUS"
            with m.Elif(cmd == CMD_WRITE):
                m.next = "DATA"
            with m.Else():
                m.next = "READ"

        with m.FSM(name="bridge"):
            with m.State("CMD"):
                with m.If(urx.strobe & ((urx.data == CMD_WRITE) | (urx.data == CMD_READ))):
                    m.d.sync += [cmd.eq(urx.data), nbyte.eq(0), status.eq(RESP_OKAY)]
                    m.next = "ADDR"
            with m.State("ADDR"):
                m.d.comb += receiving.eq(1)
                with m.If(urx.strobe):
                    m.d.sync += [addr.eq(Cat(addr[8:], urx.data)), nbyte.eq(nbyte + 1)]
                    with m.If(nbyte == 3):
                        m.next = "COUNT"
                with m.If(timed_out):
                    m.next = "CMD"
            with m.State("COUNT"):
                m.d.comb += receiving.eq(1)
                with m.If(urx.strobe):
                    m.d.sync += count.eq(urx.data)
                    with m.If(cmd == CMD_WRITE):
                        m.next = "DATA"
                    with m.Else():
                        m.next = "READ"
                with m.If(timed_out):
                    m.next = "CMD"
            with m.State("DATA"):
                m.d.comb += receiving.eq(1)
                with m.If(urx.strobe):
                    m.d.sync += [data.eq(Cat(data[8:], urx.data)), nbyte.eq(nbyte + 1)]
                    with m.If(nbyte == 3):
                        m.d.sync += [aw_done.eq(0), w_done.eq(0)]
                        m.next = "WRITE"
                with m.If(timed_out):
                    m.next = "CMD"
            with m.State("WRITE"):
                with m.If(in_kpu):
                    m.d.comb += [axil.awvalid.eq(~aw_done), axil.wvalid.eq(~w_done)]
                    with m.If(axil.awready):
                        m.d.sync += aw_done.eq(1)
                    with m.If(axil.wready):
                        m.d.sync += w_done.eq(1)
                    with m.If(axil.bvalid):
                        m.d.sync += status.eq(status | axil.bresp)
                        next_word(m)
                with m.Elif(in_mem):
                    m.d.comb += hm.wr_en.eq(1)
                    next_word(m)
                with m.Else():
                    m.d.sync += status.eq(status | RESP_SLVERR)
                    next_word(m)
            with m.State("READ"):
                with m.If(in_kpu):
                    m.d.comb += axil.arvalid.eq(1)
                    with m.If(axil.arready):
                        m.next = "READ_KPU"
                with m.Elif(in_mem):
                    m.d.comb += hm.rd_en.eq(1)
                    m.next = "READ_MEM"
                with m.Else():
                    m.d.sync += [data.eq(0), status.eq(status | RESP_SLVERR), nbyte.eq(0)]
                    m.next = "SEND"
            with m.State("READ_KPU"):
                with m.If(axil.rvalid):
                    m.d.sync += [data.eq(axil.rdata), status.eq(status | axil.rresp), nbyte.eq(0)]
                    m.next = "SEND"
            with m.State("READ_MEM"):
                m.d.sync += [data.eq(hm.rd_data), nbyte.eq(0)]
                m.next = "SEND"
            with m.State("SEND"):
                with m.If(~utx.busy):
                    m.d.comb += [utx.start.eq(1), utx.data.eq(data[:8])]
                    m.d.sync += [data.eq(data >> 8), nbyte.eq(nbyte + 1)]
                    with m.If(nbyte == 3):
                        next_word(m)
            with m.State("STATUS"):
                with m.If(~utx.busy):
                    m.d.comb += [utx.start.eq(1), utx.data.eq(status)]
                    m.next = "CMD"
        return m


class UartKpu(wiring.Component):
    """The board design: a :class:`~nanokpu.kpu.top.NanoKPU` of ``cfg`` with its ``m_axi`` on a
    :class:`HostMemory` and both reached through a :class:`UartAxiBridge` (parameters as there).

    Members
    -------
    rx : In(1, init=1)
    tx : Out(1, init=1)
    irq : Out(1)
        The nano-KPU's ``irq`` (stopped with ``done`` or ``error``).
    """

    def __init__(self, cfg: KpuConfig, clk_freq: int, baud: int = 115200,
                 host_bytes: int = DEFAULT_HOST_BYTES, timeout: float = 0.1):
        from nanokpu.kpu.top import NanoKPU

        self.kpu = NanoKPU(cfg)
        self.bridge = UartAxiBridge(clk_freq, baud, host_bytes, 8 * bus_bytes(cfg), timeout)
        super().__init__({"rx": In(1, init=1), "tx": Out(1, init=1), "irq": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.kpu = kpu = self.kpu
        m.submodules.bridge = bridge = self.bridge
        wiring.connect(m, bridge.axil, kpu.s_axil)
        wiring.connect(m, kpu.m_axi, bridge.mem)
        m.d.comb += [bridge.rx.eq(self.rx), self.tx.eq(bridge.tx), self.irq.eq(kpu.irq)]
        return m
