"""The nano-KPU's data scratchpad: two read ports and a write port over ``dmem_depth`` words."""

from __future__ import annotations

from amaranth import Cat, ClockSignal, Instance, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from nanokpu.config import KpuConfig
from nanokpu.isa import word_width

__all__ = ["DataMemory", "check_dmem", "dmem_single_port", "read_signature"]

#: One UP5K SPRAM block (SB_SPRAM256KA): 16K words of 16 bits; the part has 4.
SPRAM_DEPTH, SPRAM_WIDTH, SPRAM_BLOCKS = 1 << 14, 16, 4


def dmem_single_port(cfg: KpuConfig) -> bool:
    """Whether the data scratchpad is built from single-port RAM: with ``dsp = "ice40"``, two
    copies in the UP5K's SPRAM (its block RAM holds 120 kbit in all, ``8192 x 32`` bits is 256).
    Then a cycle either writes or reads (on both read ports): the controller issues no read in
    a cycle that writes."""
    return cfg.dsp == "ice40"


def check_dmem(cfg: KpuConfig) -> None:
    """Raise ValueError, naming the field, if :func:`dmem_single_port` and ``dmem_depth`` or the
    word width needs more than the UP5K's SPRAM (call it before building a component)."""
    if not dmem_single_port(cfg):
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
        was high, and holds while ``en`` is low. A read of the row written in the same cycle
        returns the old word.
    wr : In(Signature({"en": Out(1), "addr": Out(addr_width), "data": Out(signed(word_width))}))
        Writes ``data`` at ``addr`` on the edge where ``en`` is high.

    With :func:`dmem_single_port` (hand-instantiated SB_SPRAM256KA, two copies of
    ``word_width / 16`` blocks each, ``dmem_depth <= 16384``): the copies take the write's
    address when ``wr.en`` is high, and a read issued in that cycle is not performed (its
    ``data`` holds, as with ``en`` low; a register per copy keeps it, since the block's output
    is undefined after a write). The caller never issues one. Power-up contents are undefined.

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
        })

    def elaborate(self, platform):
        m = Module()
        cfg, wr = self.cfg, self.wr
        ww = word_width(cfg)
        shape = signed(ww)
        if not dmem_single_port(cfg):
            m.submodules.mem = mem = Memory(shape=shape, depth=cfg.dmem_depth, init=[])
            for rd in (self.rd0, self.rd1):
                port = mem.read_port()
                m.d.comb += [port.addr.eq(rd.addr), port.en.eq(rd.en), rd.data.eq(port.data)]
            port = mem.write_port()
            m.d.comb += [port.addr.eq(wr.addr), port.en.eq(wr.en), port.data.eq(wr.data)]
            return m
        for i, rd in enumerate((self.rd0, self.rd1)):
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
            read_q, held = Signal(name=f"copy{i}_read"), Signal(shape, name=f"copy{i}_held")
            m.d.sync += read_q.eq(rd.en & ~wr.en)
            m.d.comb += rd.data.eq(Mux(read_q, Cat(*out)[:ww], held))
            m.d.sync += held.eq(rd.data)
        return m
