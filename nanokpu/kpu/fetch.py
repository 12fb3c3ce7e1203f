"""Instruction fetch: the instruction memory and the sequencer that reads one instruction out of it."""

from __future__ import annotations

from amaranth import Cat, Const, Module, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.isa import INSTR_LAYOUT, INSTR_WORDS
from nanokpu.kpu.regbank import PC_WIDTH, imem_write_signature

__all__ = ["Fetch"]


class Fetch(wiring.Component):
    """The instruction memory (``imem_depth`` instructions of :data:`~nanokpu.isa.INSTR_WORDS`
    32-bit words, word ``w`` of instruction ``i`` at ``i * INSTR_WORDS + w``: a block RAM row is 16
    (iCE40) or 36 (ECP5) bits at most, so a whole instruction per row would take ``INSTR_WORDS``
    times the blocks) and its read sequencer.

    Members
    -------
    imem_wr : In(imem_write_signature(cfg))
        The host's writes.
    start : In(1)
        Fetch instruction ``pc`` (``pc < imem_depth``; sampled with ``start``).
    pc : In(PC_WIDTH)
    done : Out(1)
        High in the cycle the last word lands: :attr:`ins` holds the instruction from the next
        cycle on, until the next ``start``. ``done`` comes :attr:`latency` cycles after ``start``.
    ins : Out(INSTR_LAYOUT)
    """

    #: Cycles from ``start`` to ``done``: one read per word, the words shifted in as they come.
    latency = INSTR_WORDS

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        super().__init__({
            "imem_wr": In(imem_write_signature(cfg)),
            "start": In(1), "pc": In(PC_WIDTH),
            "done": Out(1), "ins": Out(INSTR_LAYOUT),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.imem = imem = Memory(shape=unsigned(32), depth=self.cfg.imem_depth * INSTR_WORDS, init=[])
        rd, wr = imem.read_port(), imem.write_port()
        m.d.comb += [wr.addr.eq(self.imem_wr.addr), wr.data.eq(self.imem_wr.data), wr.en.eq(self.imem_wr.en)]
        wb = INSTR_WORDS.bit_length() - 1     # word bits of an imem address (32-byte instructions)
        pc = Signal(PC_WIDTH)
        word = Signal(range(INSTR_WORDS + 1))   # the word being read; 0: idle
        with m.If(self.start):
            m.d.comb += [rd.addr.eq(Cat(Const(0, wb), self.pc)), rd.en.eq(1)]
            m.d.sync += [pc.eq(self.pc), word.eq(1)]
        with m.Elif(word != 0):
            # word - 1 arrives (shifted in from the top), word is read
            m.d.comb += [rd.addr.eq(Cat(word[:wb], pc)), rd.en.eq(1)]
            m.d.sync += [self.ins.eq(Cat(self.ins.as_value()[32:], rd.data)), word.eq(word + 1)]
            with m.If(word == INSTR_WORDS):
                m.d.comb += self.done.eq(1)
                m.d.sync += word.eq(0)
        return m
