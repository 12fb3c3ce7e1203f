"""The piecewise-linear function evaluator shared by the activation units.

:class:`PwlEvaluator` is the RTL of :class:`golden.intops.PwlTable`: ``lanes`` independent
inputs per cycle through one table of ``n_seg`` (value, slope) words, bit-exact to
``PwlTable.__call__``. It is a stallable datapath without handshake (an ``en`` input
advances every stage); :func:`stall_pipeline` wraps such a datapath in stream handshakes,
and :func:`round_shift` is the RTL of :func:`golden.intops.round_shift`.

Evaluation (``s = seg_shift``, ``t`` the input's offset from the first breakpoint)::

    t = clip(x - x0, 0, n_seg << s);  i = t >> s;  f = t & (2**s - 1)
    y = value[i] + ((slope[i] * f) >> s);  out = round_shift(y, guard, rounding)

The last breakpoint (``t = n_seg << s``, where the golden uses segment ``n_seg - 1`` with
``f = 2**s``) takes ``values[n_seg]`` from a constant instead of the table word (``f`` is 0
there): the same result, one multiplier bit fewer, and a table of ``n_seg`` words, so that
a power-of-two ``n_seg`` fills its block RAMs (``n_seg + 1`` words would double their depth).
"""

from __future__ import annotations

import numpy as np
from amaranth import Cat, Const, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from golden import intops
from nanokpu.config import DSP_TARGETS, ROUNDING_MODES

__all__ = ["PwlEvaluator", "error_bound", "out_range", "round_shift", "range_shape", "saturate",
           "stall_pipeline"]


def range_shape(lo: int, hi: int) -> Shape:
    """The narrowest shape holding every integer in ``[lo, hi]`` (unsigned when ``lo >= 0``)."""
    if lo >= 0:
        return unsigned(max(hi.bit_length(), 1))
    width = max((-lo - 1).bit_length(), hi.bit_length()) + 1
    return signed(width)


def out_range(table: intops.PwlTable) -> tuple[int, int]:
    """``(min, max)`` of ``table(x)`` over all ``in_width``-bit inputs, exact: within a segment
    ``table(x)`` is monotone, so the extremes lie at the breakpoints inside the input range or at
    its ends (a last breakpoint past the largest input, as SiLU's, is never reached)."""
    half = 1 << (table.in_width - 1)
    points = np.clip(table.x0 + (np.arange(table.n_seg + 1, dtype=np.int64) << table.seg_shift), -half, half - 1)
    y = table(points)
    return int(y.min()), int(y.max())


def error_bound(table: intops.PwlTable) -> float:
    """Largest ``|table(x) * 2**-out_frac - func(x * 2**-in_frac)|`` over all inputs, in real
    units: 1 LSB from the correctly rounded value (``fit_pwl`` checks it exhaustively) plus
    the 0.5 LSB of that rounding."""
    return 1.5 * 2.0 ** -table.out_frac


def round_shift(x, shift: int, mode: str):
    """RTL of :func:`golden.intops.round_shift`: ``x / 2**shift`` rounded by ``mode``.

    ``x`` is a signed or unsigned Amaranth value; the result is one bit wider than
    ``x >> shift`` (the round-up carry) unless ``mode`` is ``floor`` or ``shift`` is 0.
    """
    if mode not in ROUNDING_MODES:
        raise ValueError(f"rounding mode {mode!r}: must be one of {ROUNDING_MODES}")
    if shift < 0:
        raise ValueError(f"shift = {shift}: must be >= 0")
    if shift == 0:
        return x
    q = x >> shift
    if mode == "floor":
        return q
    half_bit = x[shift - 1]
    if mode == "half_up":
        return q + half_bit
    below_half = x[:shift - 1] != 0 if shift > 1 else Const(0, 1)
    return q + (half_bit & (below_half | q[0]))


def round_shift_by(x, shift, mode: str):
    """RTL of :func:`golden.intops.round_shift` by a run-time ``shift`` (an unsigned value, at most
    63): ``x / 2**shift`` rounded by ``mode``, one bit wider than ``x`` (signed ``x``). A barrel
    shifter and the sticky bits below the half bit, ``b < shift - 1`` for each bit ``b`` of ``x``
    (a shift past ``x``'s width sees its sign bits, as the golden int64 does)."""
    if mode not in ROUNDING_MODES:
        raise ValueError(f"rounding mode {mode!r}: must be one of {ROUNDING_MODES}")
    q = x >> shift
    if mode == "floor":
        return q
    half_bit = Mux(shift == 0, 0, (x >> (shift - 1)[:len(shift)])[0])
    below = Cat(*(shift > b + 1 for b in range(len(x))))
    up = half_bit if mode == "half_up" else half_bit & ((x.as_unsigned() & below).any() | q[0])
    return q + up


def saturate(value, width: int):
    """RTL of :func:`golden.intops.saturate` (signed): ``value`` clamped to ``width`` bits. It fits
    when its bits from ``width - 1`` up all equal the sign (two reduction trees, where comparisons
    with the bounds would be two carry chains as wide as ``value``)."""
    if len(value) <= width:
        return value
    top = value[width - 1:]
    hi = (1 << (width - 1)) - 1
    return Mux(top.all() | ~top.any(), value[:width].as_signed(), Mux(value[-1], -hi - 1, hi))


def stall_pipeline(m: Module, i, o, latency: int):
    """Stream handshakes around a ``latency``-stage datapath that advances on one enable.

    ``i`` and ``o`` are the (flipped-in and out) stream interfaces of the enclosing
    component; the caller drives ``o.payload`` from the datapath's last register. Returns
    the enable ``advance``: every stage moves when the output is empty or being taken, so
    the pipeline accepts one transfer per cycle without backpressure, stalls as a whole
    under it, and ``o.valid`` never depends on ``o.ready``.
    """
    advance = Signal()
    valid = Signal(latency)
    m.d.comb += [
        advance.eq(~o.valid | o.ready),
        i.ready.eq(advance),
        o.valid.eq(valid[-1]),
    ]
    with m.If(advance):
        m.d.sync += valid.eq((valid << 1) | i.valid)
    return advance


def _shift_add(a, f):
    """``a * f`` for an unsigned ``f`` of a few bits: ``a << j`` where bit ``j`` of ``f`` is set,
    added in a balanced tree, ``ceil(log2(len(f)))`` adders deep (one sum of them all takes
    about a third fewer cells but is as deep as ``f`` is wide: SiTU fell below 100 MHz)."""
    terms = [Mux(f[j], a, 0) << j for j in range(len(f))] or [Const(0)]
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


class PwlEvaluator(wiring.Component):
    """``lanes`` piecewise-linear evaluations per cycle of one :class:`~golden.intops.PwlTable`.

    Parameters
    ----------
    table : PwlTable
        The golden table (built at elaboration time, e.g. by :func:`golden.intops.gate_table`).
    lanes : int
        Inputs evaluated per cycle; all lanes read one table through their own read port.
    dsp : str
        One of :data:`~nanokpu.config.DSP_TARGETS`: how the interpolation product is built
        (below); the result is the same.

    Members
    -------
    x : In(ArrayLayout(signed(table.in_width), lanes))
        Inputs, sampled when ``en`` is high.
    en : In(1)
        Advances every pipeline stage (the table read included); low holds them.
    y : Out(ArrayLayout(out_shape, lanes))
        ``table(x)`` of the inputs sampled :attr:`latency` enabled cycles earlier.

    Pipeline: address and fraction (1), table read into a register (2), ``slope * f``
    product (3), sum and rounding (4). Error against the real function: :attr:`error_bound`.
    Costs one table of ``n_seg`` words of ``value_width + slope_width`` bits (one read
    port per lane) and one ``slope_width x seg_shift`` product per lane: ``slope * f`` (a DSP
    block) with ``dsp`` ``generic`` or ``ice40``; with ``ecp5``, ``seg_shift`` shifted copies
    of the slope added in a tree in the logic (Yosys would give so narrow a product a whole
    MULT18X18D, which the ECP5-25F runs out of before its LUTs; on the UP5K logic cells are
    the scarcer resource: a product there costs about 155 of them).
    """

    #: Enabled cycles from ``x`` to ``y``.
    latency = 4

    def __init__(self, table: intops.PwlTable, lanes: int, *, dsp: str = "generic"):
        if not isinstance(table, intops.PwlTable):
            raise TypeError(f"table must be a PwlTable, not {table!r}")
        if not isinstance(lanes, int) or lanes <= 0:
            raise ValueError(f"lanes = {lanes!r}: must be a positive integer")
        if dsp not in DSP_TARGETS:
            raise ValueError(f"dsp = {dsp!r}: must be one of {DSP_TARGETS}")
        self.table = table
        self.lanes = lanes
        self.dsp = dsp
        self.value_shape = range_shape(min(table.values), max(table.values))
        self.slope_shape = range_shape(min(0, *table.slopes), max(0, *table.slopes))
        self.out_shape = range_shape(*out_range(table))
        super().__init__({
            "x": In(data.ArrayLayout(signed(table.in_width), lanes)),
            "en": In(1),
            "y": Out(data.ArrayLayout(self.out_shape, lanes)),
        })

    @property
    def error_bound(self) -> float:
        """:func:`error_bound` of the table."""
        return error_bound(self.table)

    @property
    def words(self) -> list[dict]:
        """The table as stored: ``{"value", "slope"}`` per segment (the last breakpoint's value,
        ``table.values[-1]``, is a constant in the logic)."""
        t = self.table
        return [{"value": v, "slope": s} for v, s in zip(t.values[:-1], t.slopes, strict=True)]

    def elaborate(self, platform):
        t = self.table
        m = Module()
        word = data.StructLayout({"value": self.value_shape, "slope": self.slope_shape})
        # Block RAM even when Yosys would rather spend LUTs on a small many-ported ROM.
        m.submodules.table = table = Memory(shape=word, depth=t.n_seg, init=self.words,
                                            attrs={"rom_style": "block"})
        top = t.n_seg << t.seg_shift
        for lane in range(self.lanes):
            port = table.read_port()
            m.d.comb += port.en.eq(self.en)
            # Stage 1: offset, clip, segment index (the table address: 0 at the last
            # breakpoint, whose word is not read) and fraction.
            offset = Signal(signed(t.in_width + 2))
            clipped = Signal(range(top + 1))
            at_top = Signal()
            m.d.comb += [
                offset.eq(self.x[lane] - t.x0),
                at_top.eq(offset >= top),
                clipped.eq(Mux(offset < 0, 0, Mux(at_top, top, offset))),
                port.addr.eq(Mux(at_top, 0, clipped >> t.seg_shift)),
            ]
            # Data registers have no reset (only the valid bits of the stream wrapper do).
            def reg(shape, name, lane=lane):
                return Signal(shape, name=f"{name}_{lane}", reset_less=True)
            frac1, frac2 = reg(t.seg_shift, "frac1"), reg(t.seg_shift, "frac2")
            top1, top2 = reg(1, "top1"), reg(1, "top2")
            word2 = reg(word, "word2")
            value3 = reg(self.value_shape, "value3")
            product3 = reg(signed(self.slope_shape.width + t.seg_shift + 1), "product3")
            y4 = reg(self.out_shape, "y4")
            m.d.comb += self.y[lane].eq(y4)
            with m.If(self.en):
                m.d.sync += [
                    frac1.eq(clipped[:t.seg_shift]),
                    top1.eq(at_top),
                    # Stage 2: the table word arrives (registered: block RAM outputs are slow).
                    word2.eq(port.data),
                    top2.eq(top1),
                    frac2.eq(frac1),
                    # Stage 3: the interpolation product.
                    value3.eq(Mux(top2, t.values[-1], word2.value)),    # the last breakpoint's
                    product3.eq(_shift_add(word2.slope, frac2) if self.dsp == "ecp5"
                                else word2.slope * frac2),
                    # Stage 4: sum and round into the output register.
                    y4.eq(round_shift(value3 + (product3 >> t.seg_shift), t.guard, t.rounding)),
                ]
        return m
