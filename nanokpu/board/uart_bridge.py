"""A UART-to-register bridge: a PC reaches a unit's ports over a serial line (8N1).

The byte protocol, the port map and the bit-rate divisor are the contract
:mod:`nanokpu.bridge_protocol`, which the PC side (:class:`nanokpu.host.bridge_client.BridgeClient`)
reads too.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, ResetInserter, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from nanokpu.bridge_protocol import (
    BREAK_DETECT_BITS,
    BREAK_RELEASE_BITS,
    BURST_PARAMS,
    CMD_BURST,
    CMD_READ,
    CMD_STATUS,
    CMD_UNTIL,
    CMD_WRITE,
    RX_QUEUE_DEPTH,
    WAIT_LIMIT,
    uart_divisor,
)

__all__ = ["UartBridge", "UartRx", "UartTx"]

class UartBridge(wiring.Component):
    """UART (8N1, :func:`uart_divisor` cycles a bit) register access to the ports of ``unit``.

    Parameters
    ----------
    unit : wiring.Component
        The wrapped unit, in the bridge's ``sync`` domain; at most 256 bytes of inputs and
        256 bytes of outputs.
    clk_freq : int
        Clock frequency in Hz.
    baud : int
        Bit rate: the divisor ``round(clk_freq / baud)`` must be at least 4 and give a rate
        within 2 % of ``baud`` (:func:`~nanokpu.board.uart_bridge.uart_divisor`).
    queue_depth : int
        Bytes the receive queue holds (:data:`RX_QUEUE_DEPTH`; the PC client assumes that).
    wait_limit : int
        Clock cycles a ``U`` waits at most (:data:`WAIT_LIMIT`).

    Members
    -------
    rx : In(1, init=1)
        Serial input (idle high), synchronised by two flip-flops inside.
    tx : Out(1, init=1)
        Serial output.

    Latency, with the receive queue empty: a ``W`` takes effect 3 cycles after the
    receiver delivers ``d`` (:class:`UartRx` ``strobe``); the start bit of an ``R``/``S`` reply
    leaves 4 cycles after its last byte is delivered, or once the previous reply has left. A
    ``U`` checks ``OUT[a] & m`` every cycle from the cycle after ``m`` is taken. A ``B`` beat's
    ``valid`` rises with its last byte (as a ``W``) and falls after the first cycle that has
    ``ready`` high, the cycle the beat moves. A break holds
    the bridge and the unit in reset from 3 cycles after ``rx`` has been low for
    :data:`BREAK_DETECT_BITS` bit times until 3 cycles after it has been high for
    :data:`BREAK_RELEASE_BITS` (:class:`UartRx` ``brk``, one cycle late).
    """

    def __init__(self, unit: wiring.Component, clk_freq: int, baud: int = 115200, *,
                 queue_depth: int = RX_QUEUE_DEPTH, wait_limit: int = WAIT_LIMIT):
        divisor = uart_divisor(clk_freq, baud)
        for name, value in (("queue_depth", queue_depth), ("wait_limit", wait_limit)):
            if not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} = {value!r}: must be an integer of at least 2")
        ports = [(m.flow, Value.cast(v)) for _, m, v in unit.signature.flatten(unit)]
        self.ins = [v for flow, v in ports if flow == In]
        self.outs = [v for flow, v in ports if flow == Out]
        self.in_bytes = -(-sum(len(v) for v in self.ins) // 8)
        self.out_bytes = -(-sum(len(v) for v in self.outs) // 8)
        if self.in_bytes > 256 or self.out_bytes > 256:
            raise ValueError(f"unit: {self.in_bytes} input / {self.out_bytes} output bytes; "
                             "the bridge addresses at most 256 of each")
        self.unit, self.divisor = unit, divisor
        self.queue_depth, self.wait_limit = queue_depth, wait_limit
        super().__init__({"rx": In(1, init=1), "tx": Out(1, init=1)})

    def elaborate(self, platform):
        top = Module()
        top.submodules.uart_rx = urx = UartRx(self.divisor)
        top.d.comb += urx.rx.eq(self.rx)
        # everything else, the unit included, is reset by a break on the line
        m = Module()
        top.submodules.core = ResetInserter(urx.brk)(m)
        m.submodules.unit = self.unit
        m.submodules.uart_tx = utx = UartTx(self.divisor)
        m.d.comb += self.tx.eq(utx.tx)

        # -- receive queue ----------------------------------------------------------------------
        m.submodules.rx_queue = queue = SyncFIFOBuffered(width=8, depth=self.queue_depth)
        m.d.comb += [queue.w_data.eq(urx.data), queue.w_en.eq(urx.strobe)]
        byte = queue.r_data
        wait_ran_out = Signal()
        bytes_lost = Signal()
        with m.If(urx.strobe & ~queue.w_rdy):
            m.d.sync += bytes_lost.eq(1)

        # -- register file and command decoder ------------------------------------------------
        in_regs = Array(Signal(8, name=f"in{i}") for i in range(self.in_bytes))
        in_bits = Cat(*in_regs)
        pos = 0
        for value in self.ins:
            m.d.comb += value.eq(in_bits[pos:pos + len(value)])
            pos += len(value)
        out_bits = Cat(*self.outs)
        out_regs = Array(out_bits[8 * i:8 * i + 8] for i in range(self.out_bytes))
        out_byte = Signal(8)
        cmd = Signal(8)
        addr = Signal(8)         # IN byte of W and a burst's next payload byte
        out_addr = Signal(8)     # OUT byte of R, U and a burst's wait
        mask = Signal(8)
        with m.If(out_addr < self.out_bytes):
            m.d.comb += out_byte.eq(out_regs[out_addr])
        timer = Signal(range(self.wait_limit))
        # the one write port of the IN bytes (nothing reads them back: a plain enable per byte)
        w_en = Signal()
        w_data = Signal(8)
        with m.If(w_en & (addr < self.in_bytes)):
            m.d.sync += in_regs[addr].eq(w_data)
        # a burst's parameters: first and last payload byte, valid bits, beats left - 1; the
        # last byte as written (valid set), to write it again with valid cleared
        first = Signal(8)
        last = Signal(8)
        valid_bits = Signal(8)
        beats = Signal(8)
        last_byte = Signal(8)
        param = Signal(range(BURST_PARAMS))
        with m.FSM(name="bridge"):
            with m.State("CMD"):
                m.d.comb += queue.r_en.eq(1)
                with m.If(queue.r_rdy):
                    m.d.sync += [cmd.eq(byte), param.eq(0)]
                    with m.If(byte == CMD_STATUS):
                        m.next = "REPLY"
                    with m.Elif(byte == CMD_BURST):
                        m.next = "PARAMS"
                    with m.Elif((byte == CMD_WRITE) | (byte == CMD_READ) | (byte == CMD_UNTIL)):
                        m.next = "ADDR"
            with m.State("ADDR"):
                m.d.comb += queue.r_en.eq(1)
                with m.If(queue.r_rdy):
                    m.d.sync += [addr.eq(byte), out_addr.eq(byte)]
                    m.next = "DATA"
                    with m.If(cmd == CMD_READ):
                        m.next = "REPLY"
            with m.State("DATA"):
                m.d.comb += queue.r_en.eq(1)
                with m.If(queue.r_rdy):
                    with m.If(cmd == CMD_UNTIL):
                        m.d.sync += [mask.eq(byte), timer.eq(self.wait_limit - 1)]
                        m.next = "UNTIL"
                    with m.Else():
                        m.d.comb += [w_en.eq(1), w_data.eq(byte)]
                        m.next = "CMD"
            with m.State("PARAMS"):   # B f l v r m n
                m.d.comb += queue.r_en.eq(1)
                with m.If(queue.r_rdy):
                    m.d.sync += param.eq(param + 1)
                    with m.Switch(param):
                        for i, reg in enumerate((first, last, valid_bits, out_addr, mask, beats)):
                            with m.Case(i):
                                m.d.sync += reg.eq(byte)
                    with m.If(param == BURST_PARAMS - 1):
                        m.d.sync += addr.eq(first)
                        m.next = "BEAT"
            with m.State("BEAT"):
                m.d.comb += queue.r_en.eq(1)
                with m.If(queue.r_rdy):
                    m.d.comb += [w_en.eq(1), w_data.eq(byte)]
                    with m.If(addr == last):      # valid rises with the last byte
                        m.d.comb += w_data.eq(byte | valid_bits)
                        m.d.sync += [last_byte.eq(byte | valid_bits), timer.eq(self.wait_limit - 1)]
                        m.next = "UNTIL"
                    with m.Else():
                        m.d.sync += addr.eq(addr + 1)
            with m.State("UNTIL"):
                m.d.sync += timer.eq(timer - 1)
                ready = (out_byte & mask).any()
                with m.If(ready | (timer == 0)):
                    m.next = "CMD"
                    with m.If(~ready):
                        m.d.sync += wait_ran_out.eq(1)
                    with m.If(cmd == CMD_BURST):   # the beat moves now: valid falls, the next beat
                        m.d.comb += [w_en.eq(1), w_data.eq(last_byte & ~valid_bits)]
                        m.d.sync += [addr.eq(first), beats.eq(beats - 1)]
                        with m.If(beats != 0):
                            m.next = "BEAT"
            with m.State("REPLY"):
                with m.If(~utx.busy):
                    m.d.comb += utx.start.eq(1)
                    with m.If(cmd == CMD_STATUS):
                        m.d.comb += utx.data.eq(Cat(wait_ran_out, bytes_lost))
                        m.d.sync += [wait_ran_out.eq(0), bytes_lost.eq(urx.strobe & ~queue.w_rdy)]
                    with m.Else():
                        m.d.comb += utx.data.eq(out_byte)
                    m.next = "CMD"
        return top


class UartRx(wiring.Component):
    """UART receiver (8N1, ``divisor`` clock cycles a bit, at least 4).

    Members
    -------
    rx : In(1, init=1)
        Serial input (idle high), synchronised by two flip-flops inside.
    data : Out(8)
        The last byte received (held).
    strobe : Out(1)
        High for one cycle when ``data`` is new: the cycle after the stop bit is sampled (the
        middle of the stop bit plus the 2 synchroniser cycles). A byte whose stop bit is low
        (framing error) is dropped.
    brk : Out(1)
        A break: high from the cycle ``rx`` (synchronised) has been low for
        :data:`BREAK_DETECT_BITS` bit times until it has been high for
        :data:`BREAK_RELEASE_BITS`; no byte starts while it is high, none is delivered.
    """

    def __init__(self, divisor: int):
        if divisor < 4:
            raise ValueError(f"divisor = {divisor!r}: must be at least 4")
        self.divisor = divisor
        super().__init__({"rx": In(1, init=1), "data": Out(8), "strobe": Out(1), "brk": Out(1)})

    def elaborate(self, platform):
        m = Module()
        div = self.divisor
        rx = Signal(init=1)
        m.submodules.rx_sync = FFSynchronizer(self.rx, rx, init=1)
        rx_timer = Signal(range(div + div // 2 + 1))
        rx_bits = Signal(range(10))
        rx_shift = Signal(8)
        # cycles rx has been low (no break) or high (in a break)
        brk_timer = Signal(range(BREAK_DETECT_BITS * div))
        with m.If(rx ^ self.brk):
            m.d.sync += brk_timer.eq(0)
        with m.Elif(brk_timer == Mux(self.brk, BREAK_RELEASE_BITS * div - 1, BREAK_DETECT_BITS * div - 1)):
            m.d.sync += [brk_timer.eq(0), self.brk.eq(~self.brk)]
        with m.Else():
            m.d.sync += brk_timer.eq(brk_timer + 1)
        m.d.sync += self.strobe.eq(0)
        with m.FSM(name="uart_rx"):
            with m.State("IDLE"):
                with m.If(~rx & ~self.brk):
                    m.d.sync += [rx_timer.eq(div + div // 2 - 1), rx_bits.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.sync += rx_timer.eq(rx_timer - 1)
                with m.If(rx_timer == 0):
                    m.d.sync += [rx_timer.eq(div - 1), rx_bits.eq(rx_bits + 1),
                                 rx_shift.eq(Cat(rx_shift[1:], rx))]
                    with m.If(rx_bits == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                m.d.sync += rx_timer.eq(rx_timer - 1)
                with m.If(rx_timer == 0):
                    with m.If(rx & ~self.brk):  # a framing error drops the byte
                        m.d.sync += [self.data.eq(rx_shift), self.strobe.eq(1)]
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """UART transmitter (8N1, ``divisor`` clock cycles a bit, at least 4).

    Members
    -------
    start : In(1)
        Sample ``data`` and send it; ignored while ``busy``. The start bit goes out the cycle after.
    data : In(8)
    tx : Out(1, init=1)
        Serial output.
    busy : Out(1)
        From the cycle after ``start`` until the end of the stop bit (``10 * divisor`` cycles).
    """

    def __init__(self, divisor: int):
        if divisor < 4:
            raise ValueError(f"divisor = {divisor!r}: must be at least 4")
        self.divisor = divisor
        super().__init__({"start": In(1), "data": In(8), "tx": Out(1, init=1), "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        div = self.divisor
        tx_shift = Signal(10, init=0x3FF)
        tx_timer = Signal(range(div))
        tx_bits = Signal(range(11))
        m.d.comb += [self.tx.eq(tx_shift[0]), self.busy.eq(tx_bits != 0)]
        with m.If(tx_bits == 0):
            with m.If(self.start):
                m.d.sync += [tx_shift.eq(Cat(Const(0, 1), self.data, Const(1, 1))),
                             tx_bits.eq(10), tx_timer.eq(div - 1)]
        with m.Elif(tx_timer == 0):
            m.d.sync += [tx_shift.eq(Cat(tx_shift[1:], Const(1, 1))), tx_bits.eq(tx_bits - 1),
                         tx_timer.eq(div - 1)]
        with m.Else():
            m.d.sync += tx_timer.eq(tx_timer - 1)
        return m
