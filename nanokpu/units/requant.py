"""The requantiser: int32 accumulators -> narrow integers by multiplier, shift, rounding, saturation."""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.gemm_layout import SHIFT_WIDTH
from nanokpu.units.dsp import Multiplier

__all__ = ["Requantiser", "requant_interval", "requant_latency"]


#: Width of an unsigned operand chunk of the 18x18 signed multipliers (the top chunk of the
#: signed accumulator may take 18 bits).
_CHUNK = 17

#: Cycles from a transfer on ``i`` to ``o.valid`` when the product is pipelined (``dsp``
#: ``generic`` or ``ecp5``): 2 (multiplier input and output registers) + 1 (partial products
#: summed) + 3 (shift, round, saturate).
PIPELINED_LATENCY = 6


def _bit_serial(cfg: KpuConfig, serial: bool | None) -> bool:
    """``serial``, or by default whether the product is bit-serial on ``cfg.dsp`` (``ice40``)."""
    return cfg.dsp == "ice40" if serial is None else bool(serial)


def requant_latency(cfg: KpuConfig, serial: bool | None = None) -> int:
    """Cycles from a transfer on ``i`` to ``o.valid`` of :class:`Requantiser` (``o`` ready):
    :data:`PIPELINED_LATENCY`, or ``max(mult_width, 3) + 3`` with the bit-serial product
    (``serial``; by default that of ``ice40``)."""
    return max(cfg.mult_width, 3) + 3 if _bit_serial(cfg, serial) else PIPELINED_LATENCY


def requant_interval(cfg: KpuConfig, serial: bool | None = None) -> int:
    """Cycles per word of :class:`Requantiser`: 1, or ``max(mult_width, 3)`` with the bit-serial
    product (``serial``; by default that of ``ice40``)."""
    return max(cfg.mult_width, 3) if _bit_serial(cfg, serial) else 1


def _chunks(width: int, signed_top: bool) -> list[tuple[int, int]]:
    """``(lsb, width)`` of the chunks an operand is cut into for 18x18 signed multipliers."""
    limit = _CHUNK + 1 if signed_top else _CHUNK
    out, lsb = [], 0
    while width - lsb > limit:
        out.append((lsb, _CHUNK))
        lsb += _CHUNK
    return out + [(lsb, width - lsb)]


class Requantiser(wiring.Component):
    """``o = saturate(round_shift(i * mult, shift, cfg.rounding), out_width)`` on ``lanes`` lanes.

    Bit-exact to :func:`golden.intops.requantize` with the ``mult`` and ``shift`` of each word
    and ``mode = cfg.rounding`` (fixed at elaboration). The product ``i * mult``
    (``acc_width + mult_width`` bits) comes from one of two product stages, by ``serial``
    (default: ``cfg.dsp == "ice40"``):

    * not serial (``generic`` and ``ecp5``): pipelined, one word per cycle. The accumulator is cut into
      17-bit unsigned chunks and a signed top chunk, ``mult`` into 17-bit chunks; their
      partial products come from a :class:`~nanokpu.units.dsp.Multiplier` (18 bits, latency 2:
      input and output registers inside the MULT18X18D on ``ecp5``; 2 blocks per lane for
      32 x 16 bits) and are summed in a third stage.
    * serial (``ice40``): bit-serial in the fabric (no DSP block: on the UP5K the array takes all
      of its SB_MAC16s; the wide router's requantiser on any part, ``acc_width`` its own),
      one word every ``max(mult_width, 3)`` cycles: ``p = 2p + (mult[j] ? i : 0)`` from the top
      bit of ``mult`` down, one adder of ``acc_width + mult_width`` bits per lane.

    Then three stages: (1) the low ``out_width + 1`` bits of ``2 * product >> shift`` (the
    half bit and ``product >> shift``, from a barrel shifter that keeps only the bits it
    needs), the sticky bit of the bits below the half bit, and whether ``product >> shift``
    overflows ``out_width`` bits (masks of the word's ``shift``), (2) the rounding increment,
    (3) the saturation. Pipelined, each stage is registered and serves every lane. When
    serial, stage (1) is registered and serves two lanes, one after the other, and (2) and
    (3) are one stage (:meth:`_serial`): half the barrel shifters and overflow checks, the
    same latency.

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``acc_width``, ``mult_width``, ``rounding`` and ``dsp``.
    lanes : int
        Accumulators per word.
    out_width : int, optional
        Output width (default ``cfg.out_width``), in ``[2, acc_width]``.
    acc_width : int, optional
        Width of the accumulators taken (default ``cfg.acc_width``); ``acc_width + mult_width``
        must be at most 64 (the product, signed times unsigned, fits the golden model's int64).
    serial : bool, optional
        The bit-serial product (default: ``cfg.dsp == "ice40"``).

    Members
    -------
    i : In(stream.Signature(ArrayLayout(signed(acc_width), lanes)))
    o : Out(stream.Signature(ArrayLayout(signed(out_width), lanes)))
    mult : In(unsigned(mult_width))
    shift : In(unsigned(6))
        Sampled with each word on ``i`` (in the cycle of its transfer) and carried with it
        through the pipeline: every word may have its own (the GEMM engine's per-column
        constants).

    Latency: :attr:`latency` cycles (:func:`requant_latency`: 6, or ``max(mult_width, 3) + 3``
    when serial) from a transfer on ``i`` to ``o.valid``, one word per :attr:`interval`
    cycles. When pipelined, everything stalls as a whole while ``o`` is not ready (``i.ready
    = ~o.valid | o.ready``); when serial the product waits for ``o`` instead, and ``i.ready``
    is high when the serial multiplier is free or hands its product on in this cycle.
    """

    def __init__(self, cfg: KpuConfig, lanes: int, out_width: int | None = None, *,
                 acc_width: int | None = None, serial: bool | None = None):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        if not isinstance(lanes, int) or lanes < 1:
            raise ValueError(f"lanes = {lanes!r}: must be a positive integer")
        acc_width = cfg.acc_width if acc_width is None else acc_width
        if not isinstance(acc_width, int) or acc_width < 2:
            raise ValueError(f"acc_width = {acc_width!r}: must be an integer >= 2")
        out_width = cfg.out_width if out_width is None else out_width
        if not isinstance(out_width, int) or not 2 <= out_width <= acc_width:
            raise ValueError(f"out_width = {out_width!r}: must be in [2, acc_width={acc_width}]")
        if acc_width + cfg.mult_width > 64:
            raise ValueError(f"KpuConfig.mult_width = {cfg.mult_width}: acc_width + mult_width must be "
                             f"at most 64 for the requantiser (acc_width = {acc_width})")
        self.cfg, self.lanes, self.out_width, self.acc_width = cfg, lanes, out_width, acc_width
        self.serial = _bit_serial(cfg, serial)
        super().__init__({
            "i": In(stream.Signature(data.ArrayLayout(signed(acc_width), lanes))),
            "o": Out(stream.Signature(data.ArrayLayout(signed(out_width), lanes))),
            "mult": In(unsigned(cfg.mult_width)),
            "shift": In(unsigned(SHIFT_WIDTH)),
        })

    @property
    def latency(self) -> int:
        """:func:`requant_latency` of this requantiser's config and product."""
        return requant_latency(self.cfg, self.serial)

    @property
    def interval(self) -> int:
        """:func:`requant_interval` of this requantiser's config and product."""
        return requant_interval(self.cfg, self.serial)

    def elaborate(self, platform):
        m = Module()
        cfg, lanes = self.cfg, self.lanes
        width = self.acc_width + cfg.mult_width  # the product, signed
        advance = Signal()
        m.d.comb += advance.eq(~self.o.valid | self.o.ready)

        x = [Signal(signed(width), name=f"x{lane}") for lane in range(lanes)]

        # The masks of a word's shift, registered in front of stage (1) from the shift the word
        # carries there (``shift_x``, the product path's). x2 = 2x: x2 >> shift holds the half
        # bit (bit 0, 0 when shift = 0) and x >> shift above.
        ow = self.out_width
        below = Signal(width + 1)  # bit b set when b < shift: the sticky bits of x2
        above = Signal(width + 1)  # bit b set when b >= shift + out_width: must all equal the sign
        m.d.comb += above.eq(Cat(Const(0, ow), ~below[:width + 1 - ow]))
        shift_x = Signal(SHIFT_WIDTH)   # the shift of the word in stage (1)

        def below_of(shift):
            """``below`` of ``shift``, from its two octal digits (a comparison with each constant b
            would be a carry chain of its own on iCE40); b >= shift + out_width is not(b - out_width
            < shift)."""
            hi_s, lo_s = shift[3:], shift[:3]
            return Cat(*((hi_s > (b >> 3)) | ((hi_s == (b >> 3)) & (lo_s > (b & 7))) for b in range(width + 1)))

        if self.serial:
            self._serial(m, x, below, above, below_of, shift_x, advance)
            return m
        x_valid = Signal()
        shift_2 = self._pipelined_product(m, x, x_valid, advance)
        with m.If(advance):     # the word's shift and masks enter stage (1) with its product
            m.d.sync += [shift_x.eq(shift_2), below.eq(below_of(shift_2))]
        v_shift = Signal()
        v_round = Signal()
        with m.If(advance):
            m.d.sync += [v_shift.eq(x_valid), v_round.eq(v_shift), self.o.valid.eq(v_round)]
        for lane in range(lanes):
            y, sticky, over, neg = self._stage_registers(str(lane))
            rounded = Signal(signed(ow + 1), name=f"rounded{lane}")
            over2, neg2 = Signal(name=f"over2_{lane}"), Signal(name=f"neg2_{lane}")
            with m.If(advance):
                m.d.sync += [Cat(y, sticky, over, neg).eq(Cat(*self._shift_stage(x[lane], shift_x, below, above))),
                             rounded.eq(self._rounded(y, sticky)), over2.eq(over), neg2.eq(neg),
                             self.o.payload[lane].eq(self._saturated(rounded, over2, neg2))]
        return m

    def _stage_registers(self, name):
        """The registers after stage (1): ``y``, ``sticky``, ``over``, ``neg``."""
        return (Signal(self.out_width + 1, name=f"y{name}"), Signal(name=f"sticky{name}"),
                Signal(name=f"over{name}"), Signal(name=f"neg{name}"))

    def _shift_stage(self, x, shift, below, above):
        """Stage (1) of the product ``x``, combinational: the ``out_width + 1`` low bits of ``2x >>
        shift`` (a barrel shifter that shifts by 32 first keeps ``out_width + 2**k`` bits after the
        shift by ``2**k``), the sticky bit, whether ``x >> shift`` overflows ``out_width`` bits
        (from the masks), and the sign."""
        ow = self.out_width
        x2 = Cat(0, x).as_signed()
        v = x2
        for k in reversed(range(SHIFT_WIDTH)):
            v = Mux(shift[k], v >> (1 << k), v)
            if ow + (1 << k) < len(v):  # the bits above are never needed (and not the sign)
                v = v[:ow + (1 << k)].as_signed()
        sticky = (x2.as_unsigned() & below).any()
        over = ((x2.as_unsigned() ^ x2[-1].replicate(len(x2))) & above).any()
        return v[:ow + 1], sticky, over, x2[-1]

    def _rounded(self, y, sticky):
        """Stage (2), combinational: ``x >> shift`` (``out_width`` bits when it does not overflow)
        plus the rounding increment, ``out_width + 1`` bits signed."""
        q = y[1:].as_signed()
        half = y[0]
        if self.cfg.rounding == "floor":
            inc = 0
        elif self.cfg.rounding == "half_up":
            inc = half
        else:  # half_even
            inc = half & (sticky | q[0])
        return q + inc

    def _saturated(self, rounded, over, neg):
        """Stage (3), combinational: saturation to ``out_width`` bits (``rounded`` exceeds the
        largest value only by one)."""
        hi = (1 << (self.out_width - 1)) - 1
        return Mux(over, Mux(neg, -hi - 1, hi), Mux(rounded > hi, hi, rounded))

    def _pipelined_product(self, m, x, x_valid, advance):
        """``x = i * mult`` from DSP partial products, 3 stages, one word per cycle (``mult``
        enters the multipliers' input registers with the word). Returns the word's shift one
        stage before ``x``."""
        cfg, lanes = self.cfg, self.lanes
        a_chunks = _chunks(self.acc_width, signed_top=True)
        m_chunks = _chunks(cfg.mult_width, signed_top=False)
        pairs = [(ac, mc) for ac in range(len(a_chunks)) for mc in range(len(m_chunks))]
        m.submodules.mul = mul = Multiplier(_CHUNK + 1, lanes * len(pairs), latency=2, target=cfg.dsp)
        m.d.comb += [mul.en.eq(advance), self.i.ready.eq(advance)]
        v1 = Signal()
        v2 = Signal()
        shift_1, shift_2 = Signal(SHIFT_WIDTH), Signal(SHIFT_WIDTH)
        with m.If(advance):
            m.d.sync += [v1.eq(self.i.valid), v2.eq(v1), x_valid.eq(v2), shift_1.eq(self.shift), shift_2.eq(shift_1)]
        for lane in range(lanes):
            acc = self.i.payload[lane]
            terms = []
            for n, (ac, mc) in enumerate(pairs):
                (a_lsb, a_w), (m_lsb, m_w) = a_chunks[ac], m_chunks[mc]
                a_part = acc[a_lsb:a_lsb + a_w]
                a_part = a_part.as_signed() if ac == len(a_chunks) - 1 else a_part  # the sign is on top
                lane_n = lane * len(pairs) + n
                m.d.comb += [mul.a[lane_n].eq(a_part), mul.b[lane_n].eq(self.mult[m_lsb:m_lsb + m_w])]
                terms.append(mul.p[lane_n] << (a_lsb + m_lsb))
            with m.If(advance):
                m.d.sync += x[lane].eq(sum(terms[1:], terms[0]))
        return shift_2

    def _serial(self, m, x, below, above, below_of, shift_x, advance):
        """``ice40``: ``x = i * mult`` bit-serially, then stages (1) and (2)+(3) shared by two lanes.

        Product (``mult`` zero-extended to ``w = max(mult_width, 3)`` bits; one word per ``w``
        cycles, no DSP): ``p = 2p + (mult[j] ? i : 0)`` from the top bit of ``mult`` down, one
        adder of ``acc_width + mult_width`` bits per lane. Its first step, in the cycle after the
        transfer on ``i``, adds in the top two bits at once (``(mult[w-1] ? 2i : 0) + (mult[w-2]
        ? i : 0)``), so that the product of a word is complete ``w`` cycles after its transfer
        (``take``) and stays in ``x`` for one more cycle, even when the next word is taken at
        once. Lane pair ``2u, 2u + 1`` shares one stage (1): lane ``2u`` in the ``take`` cycle,
        lane ``2u + 1`` in the next; stages (2) and (3) follow as one stage, whose result goes to
        the lane's output register. ``o.valid`` rises 3 cycles after ``take``. Nothing after the
        product stalls: ``take`` waits until ``o`` is free (``advance``), and the next ``take``
        is ``w >= 3`` cycles later, when the word has left the stages. The word's ``mult`` and
        ``shift`` are taken with it (``bits``, ``held_shift``); ``shift_x`` and ``below`` are
        registered from ``held_shift`` every cycle, so they hold the word's in ``take`` and in the
        cycle after, when the next word may have been taken.
        """
        cfg, lanes = self.cfg, self.lanes
        w = max(cfg.mult_width, 3)
        mult = Cat(self.mult, Const(0, w - cfg.mult_width))
        busy, first = Signal(name="busy"), Signal(name="first")
        count = Signal(range(w))  # product steps still to do
        held = Signal(data.ArrayLayout(signed(self.acc_width), lanes))
        bits = Signal(w + 1)  # the word's mult, shifted left once more per step: bit w - 1 is the next
        #                       one to add in (and bit w, in the first step, the top one)
        held_shift = Signal(SHIFT_WIDTH)
        # the cycles of a word after its product: take (stage 1 on lanes 2u), odd (stage 1 on
        # lanes 2u + 1, stage 2+3 on lanes 2u), last (stage 2+3 on lanes 2u + 1)
        take, odd, last = (Signal(name=n) for n in ("take", "odd", "last"))
        m.d.comb += [take.eq(busy & (count == 0) & advance),
                     self.i.ready.eq(~busy | take)]
        m.d.sync += [odd.eq(take), last.eq(odd)]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [busy.eq(1), first.eq(1), count.eq(w - 1), held.eq(self.i.payload), bits.eq(mult << 1),
                         held_shift.eq(self.shift)]
        with m.Elif(take):
            m.d.sync += busy.eq(0)
        with m.Elif(busy & (count != 0)):
            m.d.sync += [first.eq(0), count.eq(count - 1), bits.eq(bits << 1)]
            for lane in range(lanes):
                p = Mux(first, Mux(bits[w], held[lane], 0), x[lane])
                m.d.sync += x[lane].eq((p << 1) + Mux(bits[w - 1], held[lane], 0))
        with m.If(last):
            m.d.sync += self.o.valid.eq(1)
        with m.Elif(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        m.d.sync += [shift_x.eq(held_shift), below.eq(below_of(held_shift))]
        for u in range(0, lanes, 2):
            pair = x[u:u + 2]
            y, sticky, over, neg = self._stage_registers(str(u // 2))
            stage1 = self._shift_stage(Mux(odd, pair[-1], pair[0]), shift_x, below, above)
            m.d.sync += Cat(y, sticky, over, neg).eq(Cat(*stage1))
            result = self._saturated(self._rounded(y, sticky), over, neg)
            for lane, when in zip(range(u, u + 2), (odd, last), strict=True):
                if lane < lanes:
                    with m.If(when):
                        m.d.sync += self.o.payload[lane].eq(result)
