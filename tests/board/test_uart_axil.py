# amaranth: UnusedElaboratable=no
"""nanokpu/board/uart_axil.py and nanokpu/host/client.py on the Amaranth simulator (a few clock cycles a bit).

* :class:`HostMemory` against a random AXI4 master (FIXED/INCR/WRAP bursts, narrow beats,
  random byte strobes, valid/ready gaps, beats beyond the end -> SLVERR) while the word port
  reads and writes another region, both checked against a Python model.
* :class:`UartAxiBridge` through :class:`nanokpu.host.client.KpuClient` and a simulated serial line
  (random idle between the host's bytes): words to a stand-in register bank and to the host
  memory, multi-word commands, SLVERR outside both regions, resync after an incomplete command,
  and a burst of the project's own AXI4 master (:class:`~nanokpu.kpu.axi_master.AxiMaster`) into the
  host memory read back over the UART.
* The ULX3S board design (the whole tiny nano-KPU behind the bridge) elaborates and runs
  a block end to end on Verilator, driven by the client over the serial line
  (sim/bench_uart_kpu.py).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from nanokpu.board.uart_axil import HostMemory, UartAxiBridge
from nanokpu.host.client import BusError, KpuClient
from nanokpu.host_protocol import CMD_WRITE, DEFAULT_HOST_BYTES, MEM_BASE, RESP_SLVERR
from nanokpu.isa import ADDR_WIDTH
from nanokpu.kpu.axi_lite import AxiLiteRegisters, axi_lite_signature
from nanokpu.kpu.axi_master import AxiMaster

DIV = 4        # clock cycles per bit
FREQ = 1000    # baud in the simulation (clock DIV * FREQ Hz)


# -- HostMemory against a random AXI4 master ---------------------------------------------------
def _beats(addr, size, burst, n):
    """Byte addresses of the beats of an AXI4 burst (AXI4 A3.4.1)."""
    out, incr = [], 1 << size
    mask = n * incr - 1
    for _ in range(n):
        out.append(addr)
        if burst == 1:
            addr += incr
        elif burst == 2:
            addr = (addr & ~mask) | ((addr + incr) & mask)
    return out


@pytest.mark.parametrize("data_width", [32, 64])
def test_host_memory_axi4_bursts(data_width):
    seed = 7 + data_width
    rng = np.random.default_rng(seed)
    host_bytes = 256
    lanes = data_width // 8
    dut = HostMemory(host_bytes, data_width)
    bus = dut.bus
    model = bytearray(host_bytes)
    word_model = {}
    state = {"axi_done": False, "bursts": 0, "errors": 0}

    async def pause(ctx, p=0.3):
        while rng.random() < p:
            await ctx.tick()

    def burst_params():
        size = int(rng.integers(0, lanes.bit_length()))          # narrow beats too
        burst = int(rng.choice([0, 1, 2]))
        n = int(rng.choice([2, 4, 8, 16])) if burst == 2 else int(rng.integers(1, 17))
        if rng.random() < 0.25:   # runs past the end (INCR) or starts beyond it
            start = host_bytes - (1 << size) * int(rng.integers(1, 4)) if burst == 1 else host_bytes + 64
        else:
            start = int(rng.integers(0, host_bytes // 2 // (n << size))) * (n << size)
        return start, size, burst, n

    async def axi_master(ctx):
        for _ in range(40):
            addr, size, burst, n = burst_params()
            beats = _beats(addr, size, burst, n)
            # write
            await pause(ctx)
            ctx.set(bus.awaddr, addr), ctx.set(bus.awlen, n - 1), ctx.set(bus.awsize, size)
            ctx.set(bus.awburst, burst), ctx.set(bus.awid, int(rng.integers(0, 2))), ctx.set(bus.awvalid, 1)
            awid = ctx.get(bus.awid)
            while not (await ctx.tick().sample(bus.awready))[2]:
                pass
            ctx.set(bus.awvalid, 0)
            bad = False
            for i, a in enumerate(beats):
                await pause(ctx)
                lo = a % lanes // (1 << size) * (1 << size)
                strb = sum(int(rng.integers(0, 2)) << j for j in range(lo, lo + (1 << size)))
                data = int(rng.integers(0, 1 << 62)) | int(rng.integers(0, 4)) << 62
                data &= (1 << data_width) - 1
                ctx.set(bus.wdata, data), ctx.set(bus.wstrb, strb), ctx.set(bus.wlast, i == n - 1)
                ctx.set(bus.wvalid, 1)
                while not (await ctx.tick().sample(bus.wready))[2]:
                    pass
                ctx.set(bus.wvalid, 0)
                if a < host_bytes:
                    row = a - a % lanes
                    for j in range(lanes):
                        if strb >> j & 1:
                            model[row + j] = data >> (8 * j) & 0xFF
                else:
                    bad = True
            await pause(ctx)
            ctx.set(bus.bready, 1)
            while True:
                _, _, bvalid, bresp, bid = await ctx.tick().sample(bus.bvalid, bus.bresp, bus.bid)
                if bvalid:
                    break
            ctx.set(bus.bready, 0)
            assert (bresp, bid) == (RESP_SLVERR if bad else 0, awid), f"B of burst {beats} (seed {seed})"
            # read the same beats back, random rready
            await pause(ctx)
            ctx.set(bus.araddr, addr), ctx.set(bus.arlen, n - 1), ctx.set(bus.arsize, size)
            ctx.set(bus.arburst, burst), ctx.set(bus.arid, awid ^ 1), ctx.set(bus.arvalid, 1)
            while not (await ctx.tick().sample(bus.arready))[2]:
                pass
            ctx.set(bus.arvalid, 0)
            for i, a in enumerate(beats):
                while True:
                    ready = int(rng.random() < 0.7)
                    ctx.set(bus.rready, ready)
                    _, _, rv, rd, rr, rl, rid = await ctx.tick().sample(bus.rvalid, bus.rdata, bus.rresp,
                                                                         bus.rlast, bus.rid)
                    if rv and ready:
                        break
                ctx.set(bus.rready, 0)
                row = a - a % lanes
                want = int.from_bytes(model[row:row + lanes], "little") if a < host_bytes else 0
                assert (rd, rr, rl, rid) == (want, RESP_SLVERR if a >= host_bytes else 0, i == n - 1, awid ^ 1), \
                    f"beat {i} at {a:#x} of burst size {size} type {burst} (seed {seed})"
            state["bursts"] += 1
            state["errors"] += bad
        state["axi_done"] = True

    async def word_port(ctx):
        lo, hi = host_bytes // 2, 3 * host_bytes // 4
        while not state["axi_done"]:
            await pause(ctx, 0.8)
            addr = int(rng.integers(lo // 4, hi // 4)) * 4
            if rng.random() < 0.5:
                value = int(rng.integers(0, 1 << 32))
                ctx.set(dut.addr, addr), ctx.set(dut.wr_data, value), ctx.set(dut.wr_en, 1)
                await ctx.tick()
                ctx.set(dut.wr_en, 0)
                word_model[addr] = value
            else:
                ctx.set(dut.addr, addr), ctx.set(dut.rd_en, 1)
                await ctx.tick()
                ctx.set(dut.rd_en, 0)
                got = ctx.get(dut.rd_data)
                assert got == word_model.get(addr, 0), f"word port at {addr:#x} (seed {seed})"

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(axi_master)
    sim.add_testbench(word_port)
    sim.run()
    assert state["bursts"] == 40 and 0 < state["errors"] < 40


def test_host_memory_latency():
    """Exact cycles: a 4-beat read answers 3 cycles after its address, one beat a cycle; a write
    answers the cycle after its last beat."""
    dut = HostMemory(256, 32)
    bus = dut.bus
    seen = {"r": [], "b": []}

    async def bench(ctx):
        ctx.set(bus.awaddr, 16), ctx.set(bus.awlen, 1), ctx.set(bus.awsize, 2), ctx.set(bus.awburst, 1)
        ctx.set(bus.awvalid, 1), ctx.set(bus.wvalid, 1), ctx.set(bus.wstrb, 0xF), ctx.set(bus.bready, 1)
        for cycle in range(5):
            ctx.set(bus.wdata, 100 + cycle)
            _, _, awr, wr, bv = await ctx.tick().sample(bus.awready, bus.wready, bus.bvalid)
            ctx.set(bus.awvalid, 0)
            seen["b"].append((awr, wr, bv))
            if cycle == 2:
                ctx.set(bus.wvalid, 0)
        ctx.set(bus.araddr, 12), ctx.set(bus.arlen, 3), ctx.set(bus.arsize, 2), ctx.set(bus.arburst, 1)
        ctx.set(bus.arvalid, 1), ctx.set(bus.rready, 1)
        for _ in range(8):
            _, _, arr, rv, rd, rl = await ctx.tick().sample(bus.arready, bus.rvalid, bus.rdata, bus.rlast)
            ctx.set(bus.arvalid, 0)
            seen["r"].append((arr, rv, rd if rv else None, rl))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    # AW in cycle 0, W beats in cycles 1 and 2, B in cycle 3
    assert seen["b"] == [(1, 0, 0), (0, 1, 0), (0, 1, 0), (0, 0, 1), (1, 0, 0)]
    assert [r[1:] for r in seen["r"]] == [(0, None, 0), (0, None, 0), (0, None, 0), (1, 0, 0), (1, 101, 0),
                                          (1, 102, 0), (1, 0, 1), (0, None, 0)]


def test_host_memory_rejects_bad_sizes():
    with pytest.raises(ValueError, match="^HostMemory.host_bytes = "):
        HostMemory(1000)
    with pytest.raises(ValueError, match="^HostMemory.data_width = "):
        HostMemory(1024, 48)
    with pytest.raises(ValueError, match="^baud = "):
        UartAxiBridge(12_000_000, 6_000_000)
    with pytest.raises(ValueError, match="^timeout = "):
        UartAxiBridge(DIV * FREQ, FREQ, timeout=1e-6)


# -- the bridge through the host client ---------------------------------------------------------
class SimSerial:
    """A serial port on the simulated bridge: ``write`` queues bytes (sent with random idle
    between them), ``read(n)`` runs the simulation until ``n`` bytes came back."""

    def __init__(self, sim, rx, tx, rng, limit=200_000):
        self.sim, self.rx, self.tx, self.rng, self.limit = sim, rx, tx, rng, limit
        self.out, self.inp = deque(), deque()
        self.now = 0
        sim.add_testbench(self._send, background=True)
        sim.add_testbench(self._receive, background=True)

    async def _send(self, ctx):
        ctx.set(self.rx, 1)
        while True:
            if not self.out:
                await ctx.tick()
                continue
            byte = self.out.popleft()
            for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
                ctx.set(self.rx, bit)
                await ctx.tick().repeat(DIV)
            await ctx.tick().repeat(int(self.rng.integers(1, 3 * DIV)))

    async def _receive(self, ctx):
        while True:
            if ctx.get(self.tx):
                await ctx.tick()
                continue
            await ctx.tick().repeat(DIV + DIV // 2)
            byte = 0
            for i in range(8):
                byte |= ctx.get(self.tx) << i
                await ctx.tick().repeat(DIV)
            assert ctx.get(self.tx) == 1, "stop bit"
            self.inp.append(byte)

    def run(self, cycles):
        self.now += cycles
        self.sim.run_until(self.now * 1e-6)

    def write(self, data):
        self.out.extend(data)

    def read(self, n):
        waited = 0
        while len(self.inp) < n:
            assert waited < self.limit, f"no reply: {len(self.inp)} of {n} bytes"
            self.run(10 * DIV)
            waited += 10 * DIV
        return bytes(self.inp.popleft() for _ in range(n))


class RegBank(wiring.Component):
    """16 read/write words at AXI4-Lite byte addresses 0..63 (reads 0 elsewhere); test only."""

    def __init__(self):
        super().__init__({"bus": In(axi_lite_signature(ADDR_WIDTH))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.regs = regs = AxiLiteRegisters(ADDR_WIDTH)
        wiring.connect(m, wiring.flipped(self.bus), regs.bus)
        words = [Signal(32, name=f"r{i}") for i in range(16)]
        for i, w in enumerate(words):
            with m.If(regs.wr_en & (regs.wr_addr == 4 * i)):
                m.d.sync += w.eq(regs.wr_data)
        with m.If(regs.rd_en):
            m.d.sync += regs.rd_data.eq(0)
            for i, w in enumerate(words):
                with m.If(regs.rd_addr == 4 * i):
                    m.d.sync += regs.rd_data.eq(w)
        return m


class BridgeBench(wiring.Component):
    """The bridge with :class:`RegBank` on ``axil`` and an :class:`AxiMaster` on the host memory."""

    def __init__(self, host_bytes):
        self.bridge = UartAxiBridge(DIV * FREQ, FREQ, host_bytes, 32, timeout=0.05)
        self.dma = AxiMaster(32, 32)
        super().__init__({"rx": In(1, init=1), "tx": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = bridge = self.bridge
        m.submodules.bank = bank = RegBank()
        m.submodules.dma = dma = self.dma
        wiring.connect(m, bridge.axil, bank.bus)
        wiring.connect(m, dma.bus, bridge.mem)
        m.d.comb += [bridge.rx.eq(self.rx), self.tx.eq(bridge.tx)]
        return m


def test_bridge_words_both_regions():
    seed = 3
    rng = np.random.default_rng(seed)
    host_bytes = 256
    dut = BridgeBench(host_bytes)
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    port = SimSerial(sim, dut.rx, dut.tx, rng)
    jobs = deque()   # AxiMaster jobs (async functions of ctx), run in order

    async def dma_jobs(ctx):
        while True:
            if jobs:
                await jobs.popleft()(ctx)
            await ctx.tick()

    sim.add_testbench(dma_jobs, background=True)
    client = KpuClient(port)
    port.run(5)

    regs = [int(x) for x in rng.integers(0, 1 << 32, 16)]
    client.write_words(0, regs)
    assert client.read_words(0, 16) == regs, f"seed {seed}"
    client.write(0x14, 0xDEADBEEF)
    assert client.read(0x14) == 0xDEADBEEF and client.read(0x100) == 0
    words = [int(x) for x in rng.integers(0, 1 << 32, host_bytes // 4)]
    client.write_words(MEM_BASE, words)
    assert client.read_words(MEM_BASE + 8, 5) == words[2:7], f"seed {seed}"
    assert client.read_bytes(MEM_BASE, host_bytes) == b"".join(w.to_bytes(4, "little") for w in words)

    # outside both regions: SLVERR, the reads return 0, nothing else is written
    with pytest.raises(BusError, match="SLVERR"):
        client.write(MEM_BASE + host_bytes, 1)
    with pytest.raises(BusError, match="SLVERR"):
        client.read(1 << ADDR_WIDTH)
    port.write(bytes([ord("R"), *(MEM_BASE + host_bytes - 4).to_bytes(4, "little"), 1]))
    reply = port.read(9)   # one word inside, one beyond the end
    assert reply == words[-1].to_bytes(4, "little") + bytes(4) + bytes([RESP_SLVERR])

    # an incomplete command is dropped after the timeout; the next command works
    port.write(bytes([ord("W"), 0, 0]))
    port.run(3 * 14 * DIV + int(0.05 * DIV * FREQ) + 10)   # 3 bytes with idle, the timeout
    assert client.read_words(0, 2) == regs[:2]

    # the project's AXI4 master: a burst into the host memory, read back over the UART; then
    # words written over the UART, read by the master; a read beyond the end -> error
    dma = dut.dma
    beats = [int(x) for x in rng.integers(0, 1 << 32, 20)]
    got = []

    async def master(ctx):
        ctx.set(dma.wr_addr, 64), ctx.set(dma.wr_beats, len(beats)), ctx.set(dma.wr_start, 1)
        await ctx.tick()
        ctx.set(dma.wr_start, 0)
        for b in beats:
            ctx.set(dma.wr_data.payload, {"data": b, "strb": 0xF}), ctx.set(dma.wr_data.valid, 1)
            while not (await ctx.tick().sample(dma.wr_data.ready))[2]:
                pass
        ctx.set(dma.wr_data.valid, 0)
        while ctx.get(dma.wr_busy):
            await ctx.tick()
        assert not ctx.get(dma.error)
        got.append("written")

    jobs.append(master)
    port.run(200)
    assert got == ["written"]
    assert client.read_words(MEM_BASE + 64, len(beats)) == beats, f"seed {seed}"

    async def reader(ctx, addr, n):
        ctx.set(dma.rd_addr, addr), ctx.set(dma.rd_beats, n), ctx.set(dma.rd_start, 1)
        ctx.set(dma.rd_data.ready, 1)
        await ctx.tick()
        ctx.set(dma.rd_start, 0)
        while ctx.get(dma.rd_busy):
            _, _, v, p = await ctx.tick().sample(dma.rd_data.valid, dma.rd_data.payload)
            if v:
                got.append(p)
        got.append(ctx.get(dma.error))

    new = [int(x) for x in rng.integers(0, 1 << 32, 3)]
    client.write_words(MEM_BASE + 32, new)
    got.clear()
    jobs.append(lambda ctx: reader(ctx, 32, 3))
    port.run(100)
    assert got == [*new, 0]
    got.clear()
    jobs.append(lambda ctx: reader(ctx, host_bytes - 8, 4))
    port.run(100)
    assert got == [*words[-2:], 0, 0, 1], "beats beyond the end: SLVERR, AxiMaster.error"


def test_default_host_memory_holds_the_largest_tiny_block():
    """DEFAULT_HOST_BYTES: the tiny block at its largest batch fits, at half the size it would not."""
    from golden.block import random_block
    from nanokpu.config import profile
    from nanokpu.host.compiler import compile_block

    cfg = profile("tiny")
    sizes = []
    for tokens in range(1, 64):
        Q, xq, _, _ = random_block(cfg, tokens, np.random.default_rng(1))
        try:
            sizes.append(len(compile_block(Q, xq, cfg).image))
        except ValueError:   # beyond the scratchpad
            break
    assert DEFAULT_HOST_BYTES // 2 < max(sizes) <= DEFAULT_HOST_BYTES


def test_board_kpu_elaborates():
    """The ULX3S board design: the whole tiny nano-KPU behind the UART bridge (no tool runs)."""
    from fpga.boards import prepare_board
    spec, platform, plan = prepare_board("ulx3s", unit="kpu")
    assert spec.unit == "kpu" and "top.ys" in plan.files and "top.lpf" in plan.files


@pytest.mark.slow(150)
def test_board_design_runs_a_block_over_the_uart():
    """UartKpu (tiny) on Verilator: KpuClient.run_block over the serial line, bit-exact."""
    from nanokpu.board.uart_axil import UartKpu
    from nanokpu.config import profile
    from sim.runner import FAST_BUILD, run_bench

    divisor = 4
    cfg = profile("tiny")
    run_bench(UartKpu(cfg, clk_freq=divisor * 1_000_000, baud=1_000_000), "uart_kpu_tiny", "bench_uart_kpu",
              config=cfg, params={"tokens": 4, "seed": 2, "divisor": divisor}, seed=2, build_args=FAST_BUILD)


def test_client_needs_pyserial_and_room(monkeypatch):
    import sys

    from golden.block import random_block
    from nanokpu.config import profile
    from nanokpu.host.compiler import compile_block

    monkeypatch.setitem(sys.modules, "serial", None)   # pyserial missing
    with pytest.raises(RuntimeError, match="pip install pyserial"):
        KpuClient.open("/dev/ttyUSB0")
    cfg = profile("tiny")
    Q, xq, _, _ = random_block(cfg, 2, np.random.default_rng(1))
    with pytest.raises(ValueError, match="^host_bytes = 4096: the image needs"):
        KpuClient(transport=None, host_bytes=4096).run_block(compile_block(Q, xq, cfg))


class _Recorder:
    """A transport that records what is sent and answers nothing."""

    def __init__(self):
        self.sent = b""

    def write(self, data):
        self.sent += data

    def read(self, n):
        return b""


@pytest.mark.parametrize("call, message", [
    (lambda c: c.write(0, 1 << 32), r"word = 4294967296: must be an integer in \[-2\*\*31, 2\*\*32\)"),
    (lambda c: c.write(0, -(1 << 31) - 1), "word = -2147483649"),
    (lambda c: c.write(0, 1.0), "word = 1.0"),
    (lambda c: c.write(2, 0), "addr = 2: must be an integer multiple of 4"),
    (lambda c: c.write(-4, 0), r"addr = -0x4: 1 words must lie in \[0, 2\*\*32\)"),
    (lambda c: c.write_words((1 << 32) - 4, [0, 0]), "2 words must lie in"),
    (lambda c: c.read_words(6, 1), "addr = 6"),
    (lambda c: c.read_words(0, -1), "words = -1"),
])
def test_client_checks_words_and_addresses_before_sending(call, message):
    """KpuClient never truncates a word or sends an unaligned or out-of-range address: one
    ValueError, nothing on the line."""
    transport = _Recorder()
    with pytest.raises(ValueError, match=message):
        call(KpuClient(transport))
    assert transport.sent == b""


def test_client_sends_a_negative_word_as_its_twos_complement():
    transport = _Recorder()
    with pytest.raises(TimeoutError):   # the recorder never answers the status byte
        KpuClient(transport).write_words(np.int64(8), [-1, np.int32(5)])
    assert transport.sent == bytes([CMD_WRITE, 8, 0, 0, 0, 1]) + bytes([0xFF] * 4) + (5).to_bytes(4, "little")
