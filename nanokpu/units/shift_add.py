"""Multiplication without a multiplier: by a constant (shifted copies added, combinational) and,
for products that are rare, by a variable one bit per cycle."""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ShiftAddMultiplier", "times_const"]


def times_const(value, c: int):
    """``value * c`` for a constant ``c >= 0``: the shifted copies of ``value`` for the bits of ``c``,
    added (no multiplier; 0 for ``c = 0``)."""
    return sum((value << b for b in range(c.bit_length()) if c >> b & 1), Const(0, 1))


class ShiftAddMultiplier(wiring.Component):
    """``acc + y * x``, saturating at ``width`` bits: one bit of ``y`` per cycle, LSB first,
    while the bits of ``y`` left are not all zero.

    Members
    -------
    load : In(1)
        Take ``y``, ``x``, ``acc_in`` (the product starts over).
    y : In(y_width)
    x, acc_in : In(width)
    busy : Out(1)
        High while bits of ``y`` are left: ``bit_length(y)`` cycles after ``load``.
    acc : Out(width)
        The result once ``busy`` is low: ``min(acc_in + y * x, 2**width - 1)`` (``x`` doubles
        saturating, the sum saturates), held until the next ``load``.
    """

    def __init__(self, y_width: int, width: int):
        self.width = width
        super().__init__({"load": In(1), "y": In(y_width), "x": In(width), "acc_in": In(width),
                          "busy": Out(1), "acc": Out(width)})

    def elaborate(self, platform):
        m = Module()
        top = (1 << self.width) - 1
        y = Signal.like(self.y)
        x = Signal.like(self.x)
        total = self.acc + x
        m.d.comb += self.busy.eq(y != 0)
        with m.If(self.load):
            m.d.sync += [y.eq(self.y), x.eq(self.x), self.acc.eq(self.acc_in)]
        with m.Elif(self.busy):
            with m.If(y[0]):
                m.d.sync += self.acc.eq(Mux(total[self.width:].any(), top, total[:self.width]))
            m.d.sync += [x.eq(Mux(x[-1], top, x << 1)), y.eq(y >> 1)]
        return m
