"""Proof of the sequential divider behind the router's reciprocal (``floor(2**R / S)``).

:class:`DividerProof` wraps a :class:`~nanokpu.units.divider.SeqDivider`: the environment starts
one division of any ``num`` by any non-zero ``den``; when ``busy`` falls the results must
satisfy ``quot * den + rem == num`` and ``rem < den`` (which defines floor division), and
``busy`` must have stayed high exactly :attr:`SeqDivider.latency` cycles. Division by zero
is excluded (the router's weights are 0 then whatever the quotient, since every selected
score is 0). Bounded check of depth :func:`divider_depth` from reset, which covers
every operand pair.
"""

from __future__ import annotations

from amaranth.hdl import Assert, Assume, Module, ResetSignal, Signal
from amaranth.lib import wiring

from nanokpu.units.divider import SeqDivider

__all__ = ["DividerProof", "divider_depth"]


def divider_depth(divider: SeqDivider) -> int:
    """BMC depth covering one start, the whole division and the result: ``latency + 4``."""
    return divider.latency + 4


class DividerProof(wiring.Component):
    """Formal wrapper of ``divider`` (same ports): one division, checked by multiplication.

    Parameters
    ----------
    divider : SeqDivider
        The design under proof (a fresh instance).
    """

    def __init__(self, divider: SeqDivider):
        if not isinstance(divider, SeqDivider):
            raise TypeError(f"DividerProof takes a SeqDivider, not {type(divider).__name__}")
        self.divider = divider
        super().__init__(dict(divider.signature.members))

    def elaborate(self, platform):
        m = Module()
        m.submodules.divider = div = self.divider
        m.d.comb += [div.start.eq(self.start), div.num.eq(self.num), div.den.eq(self.den),
                     self.busy.eq(div.busy), self.quot.eq(div.quot), self.rem.eq(div.rem)]
        m.d.comb += Assume(~ResetSignal())
        num = Signal.like(self.num)
        den = Signal.like(self.den)
        started = Signal()
        cycles = Signal(range(div.latency + 2))
        accepted = self.start & ~started
        m.d.comb += [Assume(~self.start | (self.den != 0)), Assume(~self.start | ~started)]
        with m.If(accepted):
            m.d.sync += [started.eq(1), num.eq(self.num), den.eq(self.den)]
        with m.If(started & div.busy):
            m.d.sync += cycles.eq(cycles + 1)
        m.d.comb += Assert(div.busy == (started & (cycles < div.latency)),
                           "busy is not high for exactly `latency` cycles after start")
        with m.If(started & ~div.busy):
            m.d.comb += [
                Assert(self.quot * den + self.rem == num, "quot * den + rem != num"),
                Assert(self.rem < den, "rem >= den"),
            ]
        return m
