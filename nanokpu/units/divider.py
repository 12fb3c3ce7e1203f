"""A sequential (restoring, radix-2) unsigned divider: one quotient bit per cycle."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SeqDivider"]


class SeqDivider(wiring.Component):
    """``quot = floor(num / den)``, ``rem = num - quot * den`` for unsigned integers.

    Restoring long division, most significant quotient bit first: ``num_width`` cycles,
    one subtractor of ``den_width + 1`` bits. Division by zero gives ``quot = 2**num_width - 1``
    and ``rem = num`` (as the recurrence does); callers that can divide by zero handle it.

    A caller that knows the quotient has at most ``b`` bits shortens the division to ``b``
    cycles: ``bits = b``, ``rem_in = N >> b`` (then ``< den``) and ``num = (N % 2**b) <<
    (num_width - b)``; ``quot`` is then ``floor(N / den)``, ``rem`` its remainder. Left at their
    defaults (``bits = num_width``, ``rem_in = 0``) these give the full division above.

    Parameters
    ----------
    num_width : int
        Width of the dividend and of the quotient.
    den_width : int
        Width of the divisor and of the remainder.

    Members
    -------
    start : In(1)
        Starts a division with ``num`` and ``den`` (sampled in the same cycle) when ``busy``
        is low; ignored while busy.
    num : In(num_width)
    den : In(den_width)
    rem_in : In(den_width)
        The partial remainder the division starts from (sampled with ``start``; default 0).
    bits : In(range(num_width + 1), init=num_width)
        Quotient bits to produce, one a cycle (sampled with ``start``; default ``num_width``).
    busy : Out(1)
        High for exactly ``bits`` cycles (:attr:`latency` by default), from the cycle after ``start``.
    quot : Out(num_width)
    rem : Out(den_width)
        The results, valid while ``busy`` is low after a division, held until the next start.
    """

    def __init__(self, num_width: int, den_width: int):
        for name, value in (("num_width", num_width), ("den_width", den_width)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SeqDivider.{name} = {value!r}: must be a positive integer")
        self.num_width = num_width
        self.den_width = den_width
        super().__init__({
            "start": In(1),
            "num": In(num_width),
            "den": In(den_width),
            "rem_in": In(den_width),
            "bits": In(range(num_width + 1), init=num_width),
            "busy": Out(1),
            "quot": Out(num_width),
            "rem": Out(den_width),
        })

    @property
    def latency(self) -> int:
        """Cycles ``busy`` stays high after ``start`` with ``bits`` at its default: one per quotient bit."""
        return self.num_width

    def elaborate(self, platform):
        m = Module()
        den = Signal(self.den_width)
        count = Signal(range(self.num_width + 1))
        # ``shift`` holds the dividend bits not yet consumed (top) and the quotient bits
        # produced so far (bottom): one register for both, as in textbook long division.
        shift = Signal(self.num_width)
        rem = Signal(self.den_width + 1)
        trial = Cat(shift[-1], rem[:self.den_width])  # rem * 2 + next dividend bit
        fits = trial >= den

        m.d.comb += [self.busy.eq(count != 0), self.quot.eq(shift), self.rem.eq(rem)]
        with m.If(count != 0):
            m.d.sync += [
                rem.eq(Mux(fits, trial - den, trial)),
                shift.eq(Cat(fits, shift[:-1])),
                count.eq(count - 1),
            ]
        with m.Elif(self.start):
            m.d.sync += [shift.eq(self.num), den.eq(self.den), rem.eq(self.rem_in),
                         count.eq(self.bits)]
        return m
