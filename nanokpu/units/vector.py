"""The vector unit: what remains of a LatentMoE block after the GEMMs and activations.

Three operations on one input stream, bit-exact to :mod:`golden.intops`:

* ``ADD`` (:func:`~golden.intops.add_sat`): ``o = saturate(a + b, act_width)``, one result per beat.
* ``COMBINE`` (:func:`~golden.intops.combine_int`): ``acc += a * b`` over a group of beats
  (``a`` an expert output in act format, ``b`` its unsigned routing weight); the beat flagged
  ``last`` ends the group and emits ``saturate(round_shift(acc, weight_frac), act_width)``.
* ``NORM`` (:func:`~golden.intops.rmsnorm_int`): a row of ``n`` values is sent **twice**, each
  pass ending with ``last``. Pass 0 sums the squares; then ``ms = floor(sum / n)`` (sequential
  divider), ``r = isqrt(ms + eps_q)`` (bit-serial, one result bit per cycle);
  pass 1 emits ``saturate(div_round(a * 2**norm_frac, r), out_width)`` per beat (a sequential
  divider with a signed rounding fix-up), or 0 when ``r == 0``.
"""

from __future__ import annotations

import enum

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.units.divider import SeqDivider
from nanokpu.units.pwl import round_shift

__all__ = ["VecOp", "VectorUnit", "vector_in_layout", "N_WIDTH"]

#: Width of the row length ``n`` of ``NORM``.
N_WIDTH = 16


class VecOp(enum.IntEnum):
    ADD = 0
    COMBINE = 1
    NORM = 2


def vector_in_layout(cfg: KpuConfig) -> data.StructLayout:
    """One input beat: ``a`` (act format), ``b`` (act format, or an unsigned weight of
    ``weight_width`` bits for ``COMBINE``; held in ``max(act_width, weight_width + 1)`` signed
    bits), ``last`` (end of a ``COMBINE`` group or of a ``NORM`` pass)."""
    return data.StructLayout({"a": signed(cfg.act_width),
                              "b": signed(max(cfg.act_width, cfg.weight_width + 1)),
                              "last": 1})


def _sat(value, width: int):
    """Signed ``value`` saturated to ``width`` bits: it fits when its bits from ``width - 1``
    up all equal the sign (two reduction trees, where comparisons with the bounds would be
    two carry chains as wide as ``value``)."""
    if len(value) <= width:
        return value
    top = value[width - 1:]
    hi = (1 << (width - 1)) - 1
    return Mux(top.all() | ~top.any(), value[:width].as_signed(), Mux(value[-1], -hi - 1, hi))


class VectorUnit(wiring.Component):
    """Weighted combine, fixed-point RMSNorm and saturating add on one stream.

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``act_width``/``act_frac``, ``weight_frac``, ``out_width``, ``norm_frac``,
        ``rms_eps``, ``rounding``.

    Members
    -------
    op : In(VecOp)
        The operation; hold it stable while beats are in flight (reset the unit to switch
        in the middle of a ``NORM`` row).
    n : In(unsigned(16))
        Row length of ``NORM`` (the divisor of the mean of squares), ``>= 1``.
    i : In(stream.Signature(vector_in_layout(cfg)))
    o : Out(stream.Signature(signed(max(act_width, out_width))))

    Timing: ``ADD`` and ``COMBINE`` take one beat per cycle (backpressure stalls the input);
    an ``ADD`` result comes 1 cycle after its beat, a ``COMBINE`` result 2 cycles after the
    group's ``last`` beat (the product registered, then the registered output). ``NORM`` takes
    pass 0 at one beat per cycle, then :attr:`norm_row_cycles` - ``n`` cycles for the mean and the square root, then
    :attr:`norm_elem_cycles` cycles per element of pass 1 (a divider per element).
    """

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        self.eps_q = int(round(cfg.rms_eps * 4 ** cfg.act_frac))
        self.sum_width = 2 * cfg.act_width + N_WIDTH
        self.ms_width = 2 * cfg.act_width + 1          # ms + eps_q
        self.q_width = cfg.act_width + cfg.norm_frac   # |a| << norm_frac
        self.r_width = cfg.act_width + 1
        if self.eps_q >= 1 << (2 * cfg.act_width):
            raise ValueError(f"rms_eps = {cfg.rms_eps}: eps_q = {self.eps_q} too large for act_width")
        super().__init__({
            "op": In(VecOp),
            "n": In(unsigned(N_WIDTH)),
            "i": In(stream.Signature(vector_in_layout(cfg))),
            "o": Out(stream.Signature(signed(max(cfg.act_width, cfg.out_width)))),
        })

    @property
    def norm_elem_cycles(self) -> int:
        """Cycles per element of a ``NORM`` pass 1 with a ready sink: accept, divide, emit."""
        return self.q_width + 3

    @property
    def norm_row_cycles(self) -> int:
        """Cycles from the first beat of pass 0 to the first accepted beat of pass 1
        (``n`` beats, the mean divider, the square root): ``n`` + this value."""
        return 1 + self.sum_width + 1 + (self.ms_width + 1) // 2 + 1

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        act = cfg.act_width
        i, o = self.i, self.o

        # -- ADD / COMBINE: one beat per cycle, registered output -------------------------
        acc_width = act + cfg.weight_width + 1 + N_WIDTH
        acc = Signal(signed(acc_width))
        o_valid = Signal()
        o_data = Signal.like(o.payload)
        m.d.comb += [o.valid.eq(o_valid), o.payload.eq(o_data)]
        with m.If(o.ready):
            m.d.sync += o_valid.eq(0)
        free = ~o_valid | o.ready
        beat = i.payload
        p_valid = Signal()
        p_last = Signal()
        prod = Signal(signed(len(beat.a) + len(beat.b)))
        # One product serves NORM (a * a) and COMBINE (a * b): b is an unsigned weight of
        # weight_width bits, its top bit taken as a shifted copy of a, so that the multiplier is
        # act_width x act_width signed (one SB_MAC16 at act_width 16).
        hi = cfg.weight_width - 1
        mul = beat.a * Mux(self.op == VecOp.NORM, beat.a, beat.b[:hi])
        combined = Cat(mul[:hi], mul[hi:].as_signed() + Mux(beat.b[hi], beat.a, 0)).as_signed()

        # -- NORM --------------------------------------------------------------------------
        m.submodules.div_ms = div_ms = SeqDivider(self.sum_width, N_WIDTH)
        m.submodules.div = div = SeqDivider(self.q_width, self.r_width)
        row_end = Signal()
        sumsq = Signal(self.sum_width)
        rem = Signal(self.ms_width)         # isqrt: remainder
        root = Signal(self.ms_width)        # isqrt: result (shifted)
        bit = Signal(self.ms_width)         # isqrt: current bit
        r = Signal(self.r_width)
        neg = Signal()
        top = 1 << (2 * ((self.ms_width - 1) // 2))

        with m.Switch(self.op):
            with m.Case(VecOp.ADD):
                m.d.comb += i.ready.eq(free)
                with m.If(i.valid & free):
                    m.d.sync += [o_valid.eq(1), o_data.eq(_sat(beat.a + beat.b, act))]
            with m.Case(VecOp.COMBINE):
                # two stages: the product registered, then accumulated
                p_free = ~p_valid | free
                m.d.comb += i.ready.eq(p_free)
                with m.If(p_free):
                    m.d.sync += [p_valid.eq(i.valid), prod.eq(combined), p_last.eq(beat.last)]
                total = acc + prod
                with m.If(p_valid & free):
                    with m.If(p_last):
                        m.d.sync += [acc.eq(0), o_valid.eq(1),
                                     o_data.eq(_sat(round_shift(total, cfg.weight_frac, cfg.rounding),
                                                    act))]
                    with m.Else():
                        m.d.sync += acc.eq(total)
            with m.Case(VecOp.NORM):
                with m.FSM():
                    with m.State("SUM"):
                        m.d.comb += i.ready.eq(1)
                        with m.If(i.valid):
                            m.d.sync += sumsq.eq(sumsq + mul)
                            with m.If(beat.last):
                                m.next = "MEAN"
                    with m.State("MEAN"):
                        m.d.comb += [div_ms.start.eq(1), div_ms.num.eq(sumsq), div_ms.den.eq(self.n)]
                        m.next = "MEAN_WAIT"
                    with m.State("MEAN_WAIT"):
                        with m.If(~div_ms.busy):
                            m.d.sync += [rem.eq(div_ms.quot + self.eps_q), root.eq(0), bit.eq(top),
                                         sumsq.eq(0)]
                            m.next = "SQRT"
                    with m.State("SQRT"):
                        trial = root + bit
                        with m.If(rem >= trial):
                            m.d.sync += [rem.eq(rem - trial), root.eq((root >> 1) + bit)]
                        with m.Else():
                            m.d.sync += root.eq(root >> 1)
                        m.d.sync += bit.eq(bit >> 2)
                        with m.If(bit == 1):
                            m.next = "SQRT_DONE"
                    with m.State("SQRT_DONE"):
                        m.d.sync += r.eq(root)
                        m.next = "SCALE_IN"
                    with m.State("SCALE_IN"):
                        m.d.comb += i.ready.eq(free)
                        mag = Mux(beat.a < 0, -beat.a, beat.a)
                        m.d.comb += [div.num.eq(mag << cfg.norm_frac), div.den.eq(r)]
                        with m.If(i.valid & free):
                            m.d.comb += div.start.eq(1)
                            m.d.sync += [neg.eq(beat.a < 0), row_end.eq(beat.last)]
                            m.next = "SCALE_WAIT"
                    with m.State("SCALE_WAIT"):
                        with m.If(~div.busy):
                            q0 = div.quot
                            r0 = div.rem[:self.r_width]
                            exact = r0 == 0
                            q = Signal(signed(self.q_width + 2))
                            rm = Signal(self.r_width + 1)
                            m.d.comb += [
                                q.eq(Mux(neg, Mux(exact, -q0, -q0 - 1), q0)),
                                rm.eq(Mux(neg & ~exact, r - r0, r0)),
                            ]
                            twice = rm << 1
                            if cfg.rounding == "floor":
                                up = 0
                            elif cfg.rounding == "half_up":
                                up = twice >= r
                            else:
                                up = (twice > r) | ((twice == r) & q[0])
                            y = Mux(r == 0, 0, _sat(q + up, cfg.out_width))
                            m.d.sync += [o_valid.eq(1), o_data.eq(y)]
                            m.next = "SCALE_NEXT"
                    with m.State("SCALE_NEXT"):
                        m.next = "SCALE_IN"
                        with m.If(row_end):
                            m.next = "SUM"
        return m
