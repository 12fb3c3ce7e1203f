"""The requantiser: int32 accumulators -> narrow integers by multiplier, shift, rounding, saturation."""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig

__all__ = ["Requantiser", "SHIFT_WIDTH"]

#: Width of the shift amount: shifts lie in ``[0, 63]`` like :func:`golden.intops.requantize`.
SHIFT_WIDTH = 6

# The barrel shifter works on 64-bit values, the width of the golden integer path.
_WORD = 64


class Requantiser(wiring.Component):
    """``o = saturate(round_shift(i * mult, shift, cfg.rounding), out_width)`` on ``lanes`` lanes.

    Bit-exact to :func:`golden.intops.requantize` with the scalar ``mult`` and ``shift``
    and ``mode = cfg.rounding`` (fixed at elaboration). A 3-stage pipeline, one word per
    cycle: (1) the registered product (``acc_width x mult_width``, a DSP), (2) the
    arithmetic shift by ``shift - 1`` and the sticky bit of the bits shifted out below the
    half bit, (3) the rounding increment and the saturation.

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``acc_width``, ``mult_width`` and ``rounding``; ``acc_width + mult_width``
        must be at most 63 (the product fits the golden model's int64).
    lanes : int
        Accumulators per word.
    out_width : int, optional
        Output width (default ``cfg.out_width``), in ``[2, acc_width]``.

    Members
    -------
    i : In(stream.Signature(ArrayLayout(signed(acc_width), lanes)))
    o : Out(stream.Signature(ArrayLayout(signed(out_width), lanes)))
    mult : In(unsigned(mult_width))
    shift : In(unsigned(6))
        Held stable while words are in flight (the GEMM engine latches them per command).

    Latency: :attr:`latency` = 3 cycles from a transfer on ``i`` to ``o.valid``; the
    pipeline stalls as a whole while ``o`` is not ready (``i.ready = ~o.valid | o.ready``).
    """

    latency = 3

    def __init__(self, cfg: KpuConfig, lanes: int, out_width: int | None = None):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        if not isinstance(lanes, int) or lanes < 1:
            raise ValueError(f"lanes = {lanes!r}: must be a positive integer")
        out_width = cfg.out_width if out_width is None else out_width
        if not isinstance(out_width, int) or not 2 <= out_width <= cfg.acc_width:
            raise ValueError(f"out_width = {out_width!r}: must be in [2, acc_width={cfg.acc_width}]")
        if cfg.acc_width + cfg.mult_width > 63:
            raise ValueError(f"KpuConfig.mult_width = {cfg.mult_width}: acc_width + mult_width must be "
                             f"at most 63 for the requantiser (acc_width = {cfg.acc_width})")
        self.cfg, self.lanes, self.out_width = cfg, lanes, out_width
        super().__init__({
            "i": In(stream.Signature(data.ArrayLayout(signed(cfg.acc_width), lanes))),
            "o": Out(stream.Signature(data.ArrayLayout(signed(out_width), lanes))),
            "mult": In(unsigned(cfg.mult_width)),
            "shift": In(unsigned(SHIFT_WIDTH)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, lanes = self.cfg, self.lanes
        advance = Signal()
        m.d.comb += [advance.eq(~self.o.valid | self.o.ready), self.i.ready.eq(advance)]

        v1, v2 = Signal(), Signal()
        with m.If(advance):
            m.d.sync += [v1.eq(self.i.valid), v2.eq(v1), self.o.valid.eq(v2)]

        shift_m1 = Signal(SHIFT_WIDTH)  # shift - 1 (don't care when shift == 0)
        m.d.comb += shift_m1.eq(self.shift - 1)
        below_half = Signal(_WORD)  # bit b set when b < shift - 1: the sticky bits' mask
        m.d.comb += below_half.eq(Cat(*(shift_m1 > b for b in range(_WORD))))
        lo, hi = -(1 << (self.out_width - 1)), (1 << (self.out_width - 1)) - 1

        for lane in range(lanes):
            prod = Signal(signed(_WORD), name=f"prod{lane}")
            y = Signal(signed(_WORD), name=f"y{lane}")      # prod >> (shift - 1), or prod
            sticky = Signal(name=f"sticky{lane}")
            with m.If(advance):
                m.d.sync += prod.eq(self.i.payload[lane] * self.mult)
                m.d.sync += [y.eq(Mux(self.shift == 0, prod, prod >> shift_m1)),
                             sticky.eq((prod.as_unsigned() & below_half).any())]
            q = Signal(signed(_WORD), name=f"q{lane}")
            rounded = Signal(signed(_WORD + 1), name=f"rounded{lane}")
            m.d.comb += q.eq(Mux(self.shift == 0, y, y >> 1))
            half = y[0] & (self.shift != 0)
            if cfg.rounding == "floor":
                m.d.comb += rounded.eq(q)
            elif cfg.rounding == "half_up":
                m.d.comb += rounded.eq(q + half)
            else:  # half_even
                m.d.comb += rounded.eq(q + (half & (sticky | q[0])))
            with m.If(advance):
                m.d.sync += self.o.payload[lane].eq(
                    Mux(rounded < lo, lo, Mux(rounded > hi, hi, rounded)))
        return m
