"""A function table as a stream unit: the part the PWL activation units share."""

from __future__ import annotations

from amaranth import Module, Shape, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.intops import PwlTable
from nanokpu.config import DSP_TARGETS
from nanokpu.units.pwl import PwlEvaluator, error_bound, out_range, stall_pipeline

__all__ = ["PwlStream"]


class PwlStream(wiring.Component):
    """Streamed :class:`~golden.intops.PwlTable`, ``lanes`` inputs per transfer, bit-exact to
    ``table(x)``.

    :class:`~nanokpu.units.sigmoid.Sigmoid` and the units of :mod:`nanokpu.units.pwl_functions`
    are this with a table and an output shape chosen from a config.

    Parameters
    ----------
    table : PwlTable
        The function, evaluated by a :class:`~nanokpu.units.pwl.PwlEvaluator`.
    lanes : int
        Inputs per transfer.
    out_shape : ShapeCastable
        Shape of an output lane; must hold every output of ``table`` (``ValueError``
        otherwise), which is then extended to it without change of value.
    dsp : str
        How the interpolation product is built (see :class:`~nanokpu.units.pwl.PwlEvaluator`).

    Members
    -------
    i : In(stream.Signature(ArrayLayout(signed(table.in_width), lanes)))
        Inputs in the table's input format.
    o : Out(stream.Signature(ArrayLayout(out_shape, lanes)))
        ``table(x)`` of each lane.

    One transfer per cycle; :attr:`latency` cycles from an ``i`` transfer to its result on
    ``o`` when ``o`` is not stalled. Backpressure on ``o`` stalls the whole pipeline (``i.ready``
    is ``~o.valid | o.ready``). Every output is within :attr:`error_bound` of the real function
    of its input (:func:`~nanokpu.units.pwl.error_bound`).
    """

    latency = PwlEvaluator.latency

    def __init__(self, table: PwlTable, lanes: int, out_shape, *, dsp: str = "generic"):
        if not isinstance(table, PwlTable):
            raise TypeError(f"table must be a PwlTable, not {table!r}")
        if not isinstance(lanes, int) or lanes <= 0:
            raise ValueError(f"lanes = {lanes!r}: must be a positive integer")
        if dsp not in DSP_TARGETS:
            raise ValueError(f"dsp = {dsp!r}: must be one of {DSP_TARGETS}")
        out_shape = Shape.cast(out_shape)
        lo, hi = out_range(table)
        shape_lo = -(1 << (out_shape.width - 1)) if out_shape.signed else 0
        shape_hi = (1 << (out_shape.width - out_shape.signed)) - 1
        if not shape_lo <= lo <= hi <= shape_hi:
            raise ValueError(f"out_shape = {out_shape!r}: does not hold the table's outputs [{lo}, {hi}]")
        self.table = table
        self.lanes = lanes
        self.dsp = dsp
        #: Largest error against the real function, in real units.
        self.error_bound = error_bound(table)
        super().__init__({
            "i": In(stream.Signature(data.ArrayLayout(signed(table.in_width), lanes))),
            "o": Out(stream.Signature(data.ArrayLayout(out_shape, lanes))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.pwl = pwl = PwlEvaluator(self.table, self.lanes, dsp=self.dsp)
        advance = stall_pipeline(m, self.i, self.o, self.latency)
        m.d.comb += [
            pwl.en.eq(advance),
            pwl.x.eq(self.i.payload),
        ]
        for lane in range(self.lanes):
            m.d.comb += self.o.payload[lane].eq(pwl.y[lane])
        return m
