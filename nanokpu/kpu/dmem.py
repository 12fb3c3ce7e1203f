"""The nano-KPU's data scratchpad: two read ports and a write port over ``dmem_depth`` words."""

from __future__ import annotations

from amaranth import Cat, ClockSignal, Instance, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from nanokpu.config import KpuConfig
from nanokpu.isa import word_width
from nanokpu.units.memport import unchecked_read_port

__all__ = ["DataMemory", "check_dmem", "read_signature", "writes_block_reads"]

#: One UP5K SPRAM block (SB_SPRAM256KA): 16K words of 16 bits; the part has 4.
SPRAM_DEPTH, SPRAM_WIDTH, SPRAM_BLOCKS = 1 << 14, 16, 4


def writes_block_reads(cfg: KpuConfig) -> bool:
    """Whether a cycle in which the data scratchpad performs a write (``DataMemory.writing``)
    performs no read (the controller then issues none): with ``dsp = "ice40"`` (two copies in
    the UP5K's single-port SPRAM: its block RAM holds 120 kbit in all, ``8192 x 32`` bits is
    256) and ``dsp = "ecp5"`` (one copy in true-dual-port block RAM, the write sharing port A
    with ``rd0``: half the blocks of two copies). Otherwise (``generic``) two copies of 1-read
    1-write block RAM, no restriction."""
    return cfg.dsp in ("ice40", "ecp5")


def check_dmem(cfg: KpuConfig) -> None:
    """Raise ValueError, naming the field, if ``dsp = "ice40"`` and ``dmem_depth`` or the word
    width needs more than the UP5K's SPRAM (call it before building a component)."""
    if cfg.dsp != "ice40":
        return
    if cfg.dmem_depth > SPRAM_DEPTH:
        raise ValueError(f"KpuConfig.dmem_depth = {cfg.dmem_depth}: with dsp = 'ice40' the data "
                         f"scratchpad is in SPRAM, at most {SPRAM_DEPTH} words")
    ww = word_width(cfg)
    if 2 * -(-ww // SPRAM_WIDTH) > SPRAM_BLOCKS:
        raise ValueError(f"KpuConfig.acc_width = {cfg.acc_width}: with dsp = 'ice40' two copies of "
                         f"{ww}-bit words need more than the {SPRAM_BLOCKS} SPRAM blocks")


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
    (its ``data`` holds, as with ``en`` low); the caller never issues one. On ``ice40`` the
    words are in hand-instantiated SB_SPRAM256KA (two copies of ``word_width / 16`` blocks,
    sharing the write's address while ``writing``, each with a register that holds its data:
    the block's output is undefined after a write), and their power-up contents are undefined.

    Raises
    ------
    ValueError
        From :func:`check_dmem`.
    """

    def __init__(self, cfg: KpuConfig):
        check_dmem(cfg)
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
        if cfg.dsp == "ice40":
            for i, rd in enumerate(reads):
                m.d.comb += rd.data.eq(self._spram_copy(m, i, rd, wr))
            return m
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

    def _spram_copy(self, m: Module, i: int, rd, wr):
        """Copy ``i`` of the words in SB_SPRAM256KA blocks, read by ``rd``, written by the
        registered write ``wr``: its data."""
        ww = word_width(self.cfg)
        addr = Mux(wr.en, wr.addr, rd.addr)
        out = []
        for j in range(0, ww, SPRAM_WIDTH):
            dataout = Signal(SPRAM_WIDTH, name=f"copy{i}_out{j // SPRAM_WIDTH}")
            m.submodules[f"copy{i}_{j // SPRAM_WIDTH}"] = Instance(
                "SB_SPRAM256KA",
                i_ADDRESS=addr, i_DATAIN=wr.data[j:j + SPRAM_WIDTH], i_MASKWREN=0xF,
                i_WREN=wr.en, i_CHIPSELECT=wr.en | rd.en, i_CLOCK=ClockSignal(),
                i_STANDBY=0, i_SLEEP=0, i_POWEROFF=1, o_DATAOUT=dataout)
            out.append(dataout)
        read_q, held = Signal(name=f"copy{i}_read"), Signal(signed(ww), name=f"copy{i}_held")
        word = Mux(read_q, Cat(*out)[:ww], held)
        m.d.sync += [read_q.eq(rd.en & ~wr.en), held.eq(word)]
        return word
