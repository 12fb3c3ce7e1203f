"""The nano-KPU's data scratchpad: ``dmem_depth`` words in :func:`banks` interleaved banks, a
wide read port, a narrow one and a wide, masked write port."""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from nanokpu.config import KpuConfig
from nanokpu.isa import word_width
from nanokpu.units.memport import unchecked_read_port

__all__ = ["DataMemory", "banks", "read_signature", "wide_read_signature", "write_signature",
           "writes_block_reads"]


def writes_block_reads(cfg: KpuConfig) -> bool:
    """Whether a cycle in which the data scratchpad performs a write (``DataMemory.writing``)
    performs no read (the controller then issues none): with ``dsp = "ecp5"`` the words are one
    copy in true-dual-port block RAM, the write sharing port A with ``rd0`` (half the blocks of
    two copies). Otherwise (``generic``) two copies of 1-read 1-write block RAM, no restriction."""
    return cfg.dsp == "ecp5"


def banks(cfg: KpuConfig) -> int:
    """``B``, the data scratchpad's banks: the largest power of two ``<= cfg.rows``. Word ``a``
    lies in bank ``a mod B``, row ``a // B``; a wide access reaches ``B`` consecutive words."""
    return 1 << (cfg.rows.bit_length() - 1)


def read_signature(addr_width: int, shape) -> wiring.Signature:
    """A read port as its user sees it: ``en`` (1 by default), ``addr`` out, ``data`` in."""
    return wiring.Signature({"en": Out(1, init=1), "addr": Out(addr_width), "data": In(shape)})


def wide_read_signature(addr_width: int, shape, lanes: int) -> wiring.Signature:
    """:func:`read_signature` and ``lanes`` in: ``lanes`` words, lane ``i`` the word at
    ``addr + i`` (lane 0 is ``data``)."""
    return wiring.Signature(dict(read_signature(addr_width, shape).members)
                            | {"lanes": In(data.ArrayLayout(shape, lanes))})


def write_signature(addr_width: int, shape, lanes: int) -> wiring.Signature:
    """A write port as its user sees it, all out: ``en``, ``addr``, ``data`` (the word at
    ``addr``), and ``upper`` / ``upper_en`` (0 by default): lane ``i`` in ``1 .. lanes-1``,
    ``upper[i-1]``, is written at ``addr + i`` when ``upper_en[i-1]`` is high too."""
    return wiring.Signature({"en": Out(1), "addr": Out(addr_width), "data": Out(shape),
                             "upper": Out(data.ArrayLayout(shape, lanes - 1)), "upper_en": Out(lanes - 1)})


def _pick(values, index):
    """``values[index]`` for an unsigned ``index`` (``len(values)`` a power of two, the index
    taken modulo it): a ``len(values)``:1 multiplexer."""
    return Array(values)[index] if len(values) > 1 else values[0]


class DataMemory(wiring.Component):
    """``cfg.dmem_depth`` signed words of :func:`~nanokpu.isa.word_width` bits in ``B =``
    :func:`banks` banks of ``ceil(dmem_depth / B)`` rows (word ``a``: bank ``a mod B``, row
    ``a // B``). Addresses wrap modulo ``2**addr_width``.

    Members
    -------
    rd0 : In(wide_read_signature(addr_width, signed(word_width), B))
        A synchronous read of the ``B`` consecutive words ``addr .. addr + B - 1`` (any
        alignment): ``lanes[i]`` (``data`` = ``lanes[0]``) is the word at ``addr + i`` of the
        last edge where ``en`` was high, and holds while ``en`` is low. Bank ``j`` reads row
        ``addr // B + (j < addr mod B)``; the lanes are the banks' words rotated by the
        registered ``addr mod B`` (a ``B``:1 multiplexer after the block RAMs' registers).
    rd1 : In(read_signature(addr_width, signed(word_width)))
        The same read, one word: ``data`` is the word at ``addr`` (every bank reads row
        ``addr // B``, a ``B``:1 multiplexer picks one).
    wr : In(write_signature(addr_width, signed(word_width), B))
        Writes ``data`` at ``addr`` and each enabled ``upper`` lane ``i`` at ``addr + i``:
        registered on the edge where ``en`` is high, performed on the next edge (the banks'
        rows, data and enables are computed from those flip-flops alone, so no logic of the
        caller's lies on the paths to them, which on a large ECP5 scratchpad cross the die).
    writing : Out(1)
        High in the cycle in which the memory performs a write (the one after ``wr.en``).

    A read of a word being written, issued while ``writing`` is high, returns an undefined
    word in that lane (no collision logic in front of the block RAM:
    :func:`~nanokpu.units.memport.unchecked_read_port`). With :func:`writes_block_reads` a read
    issued while ``writing`` is high is not performed (its lanes hold, as with ``en`` low); the
    caller never issues one.
    """

    def __init__(self, cfg: KpuConfig):
        self.cfg = cfg
        self.addr_width = ceil_log2(cfg.dmem_depth)
        self.banks = banks(cfg)
        shape = signed(word_width(cfg))
        super().__init__({
            "rd0": In(wide_read_signature(self.addr_width, shape, self.banks)),
            "rd1": In(read_signature(self.addr_width, shape)),
            "wr": In(write_signature(self.addr_width, shape, self.banks)),
            "writing": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, B, AW = self.cfg, self.banks, self.addr_width
        LB = B.bit_length() - 1          # address bits of the bank
        RW = max(AW - LB, 0)             # ... and of the row
        ww = word_width(cfg)
        depth = -(-cfg.dmem_depth // B)
        # the write, registered: what the banks write in the cycle after wr.en
        wq = Signal(data.StructLayout({"en": 1, "addr": AW, "lanes": data.ArrayLayout(signed(ww), B),
                                       "mask": B}), name="wq")
        m.d.sync += wq.en.eq(self.wr.en)
        m.d.comb += self.writing.eq(wq.en)
        with m.If(self.wr.en):
            m.d.sync += [wq.addr.eq(self.wr.addr), wq.lanes.eq(Cat(self.wr.data, self.wr.upper)),
                         wq.mask.eq(Cat(Const(1, 1), self.wr.upper_en))]

        def rows_of(addr):
            """Per bank ``j``, the row of the one of the words ``addr .. addr + B - 1`` it holds:
            ``addr // B + (j < addr mod B)``."""
            base, first = addr[LB:], addr[:LB]
            return [(base + (Const(j, LB) < first))[:RW] if LB else base for j in range(B)]

        def at(i, shift):
            """``(i + shift) mod B``, for a bank or lane ``i`` and a signal ``shift``."""
            return (Const(i, LB) + shift)[:LB] if LB else 0

        off_w = wq.addr[:LB]
        w_rows = rows_of(wq.addr)                                   # bank j takes lane (j - off_w) mod B
        w_data = [_pick([wq.lanes[i] for i in range(B)], at(j, -off_w)) for j in range(B)]
        w_ens = [wq.en & _pick([wq.mask[i] for i in range(B)], at(j, -off_w)) for j in range(B)]
        r0_rows, r1_row = rows_of(self.rd0.addr), self.rd1.addr[LB:]
        tdp = writes_block_reads(cfg)
        # with one copy the read is not performed while writing
        ens = [self.rd0.en & ~wq.en, self.rd1.en & ~wq.en] if tdp else [self.rd0.en, self.rd1.en]
        outs = ([], [])                                           # the banks' words for rd0, rd1

        def bank():
            return Memory(shape=signed(ww), depth=depth, init=[], attrs={"no_rw_check": 1})

        for j in range(B):
            if tdp:
                # one true-dual-port copy: port A the write's row or rd0's, port B rd1's
                shared = Mux(wq.en, w_rows[j], r0_rows[j])
                mems, w_addr, r_rows = [bank()], shared, (shared, r1_row)
            else:
                # two 1R1W copies written alike, one per read port
                mems, w_addr, r_rows = [bank(), bank()], w_rows[j], (r0_rows[j], r1_row)
            for c, mem in enumerate(mems):
                m.submodules[f"bank{j}_{c}"] = mem
                port_w = mem.write_port()
                m.d.comb += [port_w.addr.eq(w_addr), port_w.en.eq(w_ens[j]), port_w.data.eq(w_data[j])]
            for p in range(2):
                port = unchecked_read_port(m, mems[p % len(mems)], f"bank{j}_rd{p}")
                m.d.comb += [port.addr.eq(r_rows[p]), port.en.eq(ens[p])]
                outs[p].append(port.data)
        # the registered bank of each read's lane 0
        off0, off1 = Signal(LB, name="rd0_bank"), Signal(LB, name="rd1_bank")
        with m.If(ens[0]):
            m.d.sync += off0.eq(self.rd0.addr[:LB])
        with m.If(ens[1]):
            m.d.sync += off1.eq(self.rd1.addr[:LB])
        m.d.comb += [self.rd0.lanes[i].eq(_pick(outs[0], at(i, off0))) for i in range(B)]
        m.d.comb += [self.rd0.data.eq(self.rd0.lanes[0]), self.rd1.data.eq(_pick(outs[1], off1))]
        return m
