"""The vector unit: what remains of a LatentMoE block after the GEMMs and activations.

Three operations on one input stream (four with ``layer_ops``), bit-exact to :mod:`golden.intops`:

* ``ADD`` (:func:`~golden.intops.add_sat`): ``o = saturate(a + b, act_width)``, one result per beat.
* ``COMBINE`` (:func:`~golden.intops.combine_int`): ``acc += a * b`` over a group of beats
  (``a`` an expert output in act format, ``b`` its unsigned routing weight); the beat flagged
  ``last`` ends the group and emits ``saturate(round_shift(acc, weight_frac), act_width)``.
  With ``dot`` (``layer_ops``) the group is a dot product: ``b`` a signed factor (``CONV``'s kernel
  taps, :func:`~golden.intops.short_conv_int`), the group's sum emitted whole, wrapped to
  ``acc_width`` bits.
* ``NORM`` (:func:`~golden.intops.rmsnorm_int`): a row of ``n`` values is sent **twice**, each
  pass ending with ``last``. Pass 0 sums the squares; then, once per row, ``ms = floor(sum / n)``
  (sequential divider; a shift when ``n`` is a power of two), ``r = isqrt(ms + eps_q)``
  (bit-serial, one result bit per cycle), ``r`` normalised (``r << z``, ``z`` its leading zeros,
  a priority encoder) and ``recip = floor(2**(r_width-1+M) / (r << z))`` (the same sequential
  divider), which equals the golden ``floor(2**(p+M) / r)``; pass
  1 emits ``saturate(round_shift((a * recip) << z, r_width-1+M-norm_frac), out_width)`` per beat
  (the golden ``round_shift(a * recip, p+M-norm_frac)`` with a constant shift), 0 when ``r == 0``.
* ``NORM`` with ``l2`` (``layer_ops``; :func:`~golden.intops.l2norm_int` at ``frac = kda_unit_frac``):
  the same two passes; once per row ``ss = sum + eps_q`` (no mean), ``ss << e`` (``e`` the even
  pre-shift that gives it at least ``2P`` bits, ``P = frac + NORM_GUARD + 1``: a priority encoder,
  then a shifter), ``r = isqrt(ss << e)`` on the same bit-serial root, the reciprocal of ``r << z``
  to ``M = frac + NORM_GUARD`` bits on the same divider; pass 1 emits ``round_shift(a * recip,
  p + M - frac - e/2)`` (``p = R - 1 - z``, a run-time shift; no saturation: ``|y| <= 2**frac + 1``).
* ``MUL`` (``layer_ops``): ``o = saturate(round_shift(a * b, shift, rounding), out_width)``, ``b`` a
  signed factor of ``mul_factor_width`` bits (an RMSNorm weight, :func:`~golden.intops.rmsnorm_weight_int`, or a
  gate), one result per beat.
"""

from __future__ import annotations

import enum

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden import intops as I
from nanokpu.config import KpuConfig
from nanokpu.units.divider import SeqDivider
from nanokpu.units.pwl import round_shift, round_shift_by
from nanokpu.units.pwl import saturate as _sat

__all__ = ["VecOp", "VectorUnit", "vector_in_layout", "N_WIDTH"]

#: Width of the row length ``n`` of ``NORM``.
N_WIDTH = 16


class VecOp(enum.IntEnum):
    ADD = 0
    COMBINE = 1
    NORM = 2
    MUL = 3


def vector_in_layout(cfg: KpuConfig) -> data.StructLayout:
    """One input beat: ``a`` (act format), ``b`` (act format, an unsigned weight of
    ``weight_width`` bits for ``COMBINE``, a signed ``mul_factor_width``-bit factor for ``MUL``; held in
    ``max(act_width, weight_width + 1)`` signed bits, and ``mul_factor_width`` with ``layer_ops``),
    ``last`` (end of a ``COMBINE`` group or of a ``NORM`` pass)."""
    return data.StructLayout({"a": signed(cfg.act_width), "b": signed(_b_width(cfg)), "last": 1})


def _b_width(cfg: KpuConfig) -> int:
    return max(cfg.act_width, cfg.weight_width + 1, cfg.mul_factor_width if cfg.layer_ops else 0)


def _leading_zeros(value):
    """Leading zeros of the unsigned ``value`` (``len(value)`` when 0): a priority encoder, a tree
    of ``ceil(log2(len(value)))`` levels (the upper half's count, or its width plus the lower's)."""
    if len(value) == 1:
        return ~value[0]
    half = len(value) // 2
    upper, lower = value[half:], value[:half]
    return Mux(upper.any(), _leading_zeros(upper), len(upper) + _leading_zeros(lower))


def _trailing_zeros(value):
    """Trailing zeros of the unsigned ``value`` (0 when 0): a priority encoder."""
    z = 0
    for i in reversed(range(len(value))):
        z = Mux(value[i], i, z)
    return z


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
    l2 : In(1)
        ``NORM`` is the l2norm (``layer_ops`` only), held like ``op``.
    dot : In(1)
        ``COMBINE`` is a dot product (``layer_ops`` only), held like ``op``.
    shift : In(unsigned(6))
        The right shift of ``MUL`` (``layer_ops`` only), held like ``op``.
    eps : In(unsigned(2 * act_width))
        ``NORM``'s epsilon ``eps_q`` (``layer_ops`` only, held like ``op``; its reset value and,
        without ``layer_ops``, the constant: :func:`golden.intops.rms_eps_q`; the l2norm's default
        is :attr:`l2_eps_q`).
    i : In(stream.Signature(vector_in_layout(cfg)))
    o : Out(stream.Signature(signed(max(act_width, out_width))))
        (``max(act_width, out_width, acc_width)`` bits with ``layer_ops``)

    Timing: ``ADD``, ``COMBINE`` and ``MUL`` take one beat per cycle (backpressure stalls the input);
    an ``ADD`` result comes 1 cycle after its beat, a ``MUL`` result 3 cycles after it, a ``COMBINE``
    result 3 cycles after the group's ``last`` beat (the multiplier's operands registered, the product registered, then
    the registered output). ``NORM`` takes pass 0 at one beat per cycle, then at most
    :meth:`norm_row_cycles` - ``n`` cycles for the mean (or the l2norm's pre-shift), the square
    root and the reciprocal, then pass 1 at one beat per cycle, each result 3 cycles after its beat, like ``COMBINE``.
    """

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        self.eps_q = I.rms_eps_q(cfg)
        self.sum_width = 2 * cfg.act_width + N_WIDTH
        self.ms_width = 2 * cfg.act_width + 1          # ms + eps_q
        self.r_width = cfg.act_width + 1               # r = isqrt(ms + eps_q)
        self.recip_bits = I.norm_recip_bits(cfg)       # M
        self.recip_num = self.r_width - 1 + self.recip_bits   # recip = 2**recip_num // (r << z)
        self.div_width = max(self.sum_width, self.recip_num + 1)   # the one divider's dividend
        # quotient bits of the two divisions: the mean of squares of act_width-bit values is at
        # most 2**(2*act_width - 2); the reciprocal of an r << z >= 2**(r_width - 1) at most
        # 2**recip_bits
        self.mean_bits = 2 * cfg.act_width - 1
        self.recip_quot_bits = self.recip_bits + 1
        self.sq_width = self.ms_width                  # the square root's operand
        self.prod_width = cfg.act_width + self.recip_bits + 1   # |a * recip| (sign copies above)
        if cfg.layer_ops:
            # the l2norm: ss = sumsq + eps_q fits sum_width bits; ss << e has at most
            # max(sum_width, 2P + 1) bits; r = isqrt(ss << e) at most l2_r_width
            self.l2_eps_q = I.l2_eps_q(cfg)
            self.l2_frac = cfg.kda_unit_frac
            self.l2_p = self.l2_frac + I.NORM_GUARD + 1                     # P
            self.l2_sq_width = max(self.sum_width, 2 * self.l2_p + 1)
            self.l2_r_width = (self.l2_sq_width + 1) // 2                   # R
            self.l2_recip_bits = self.l2_frac + I.NORM_GUARD                # M
            self.l2_recip_num = self.l2_r_width - 1 + self.l2_recip_bits
            self.sq_width = max(self.sq_width, self.l2_sq_width)
            self.div_width = max(self.div_width, self.l2_recip_num + 1)
            self.prod_width = max(self.prod_width, cfg.act_width + self.l2_recip_bits + 1)
            if self.l2_frac + 2 > max(cfg.act_width, cfg.out_width):
                raise ValueError(f"kda_unit_frac = {self.l2_frac}: the l2norm's |y| <= 2**{self.l2_frac} + 1 "
                                 f"needs more than max(act_width, out_width) bits")
        for name, eps_q in (("rms_eps", self.eps_q), ("l2_eps", getattr(self, "l2_eps_q", 0))):
            if eps_q >= 1 << (2 * cfg.act_width):
                raise ValueError(f"{name} = {getattr(cfg, name)}: eps_q = {eps_q} too large for act_width")
        super().__init__({
            "op": In(VecOp),
            "n": In(unsigned(N_WIDTH)),
            **({"shift": In(unsigned(6)), "eps": In(unsigned(2 * cfg.act_width), init=self.eps_q), "l2": In(1),
                "dot": In(1)} if cfg.layer_ops else {}),
            "i": In(stream.Signature(vector_in_layout(cfg))),
            "o": Out(stream.Signature(signed(max(cfg.act_width, cfg.out_width,
                                                 cfg.acc_width if cfg.layer_ops else 0)))),
        })

    def norm_row_cycles(self, n: int, l2: bool = False) -> int:
        """Cycles of a ``NORM`` row of ``n`` values from its first beat of pass 0 to its first
        beat of pass 1, beats always offered and ``r != 0`` (``r == 0`` skips the reciprocal):
        pass 0 (``n`` beats, the last one's square summed: operands registered, the square
        registered, then summed), the mean (the divider's ``mean_bits`` steps, or a shift when
        ``n`` is a power of two; with ``l2`` the sum plus eps, then ``e``, then the shift), the
        square root (a result bit a cycle), ``r``'s leading zeros, the reciprocal (the divider's
        ``recip_quot_bits`` steps, with ``l2`` ``M + 1``)."""
        if l2:
            return n + 2 + 3 + (self.l2_sq_width + 1) // 2 + 2 + self.l2_recip_bits + 1 + 1
        mean = 1 if n & (n - 1) == 0 else self.mean_bits + 2   # a shift, or the divider
        return n + 2 + mean + (self.ms_width + 1) // 2 + 2 + self.recip_quot_bits + 1

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
        # the multiplier's operands in flip-flops (stage q), selected by op a cycle before the
        # product (stage p): no operand select or op decode between a register and the multiplier
        q_valid = Signal()
        q_last = Signal()
        p_valid = Signal()
        p_last = Signal()
        prod = Signal(signed(max(len(beat.a) + len(beat.b), self.prod_width)))
        # One product serves NORM (a * a) and COMBINE (a * b): b is an unsigned weight of
        # weight_width bits, its top bit taken as a shifted copy of a, so that the multiplier is
        # act_width x act_width signed (one SB_MAC16 at act_width 16).
        hi = cfg.weight_width - 1
        scale_pass = Signal()               # NORM pass 1: multiply by the row's reciprocal
        layer_ops = cfg.layer_ops
        recip_bits = max(self.recip_bits, self.l2_recip_bits if layer_ops else 0)
        recip = Signal(recip_bits + 1)
        q_a = Signal.like(beat.a)
        q_b = Signal(signed(max(act, recip_bits + 2, hi + 1, cfg.mul_factor_width if layer_ops else 0)))
        q_top = Signal.like(beat.a)         # COMBINE: a when b's top bit is set; else 0
        dot = self.dot if layer_ops else Const(0)    # COMBINE as a dot product: b a signed factor, as MUL's
        q_b_next = Mux(self.op == VecOp.NORM, Mux(scale_pass, recip, beat.a),
                       Mux((self.op == VecOp.MUL) | dot, beat.b, beat.b[:hi]) if layer_ops else beat.b[:hi])
        q_top_next = Mux((self.op == VecOp.COMBINE) & ~dot & beat.b[hi], beat.a, 0)
        mul = q_a * q_b
        combined = Cat(mul[:hi], mul[hi:].as_signed() + q_top).as_signed()   # mul, but COMBINE
        take = [q_a.eq(beat.a), q_b.eq(q_b_next), q_top.eq(q_top_next)]

        # -- NORM --------------------------------------------------------------------------
        # One divider serves the row's two divisions (the mean, then the reciprocal).
        r_width = max(self.r_width, self.l2_r_width if layer_ops else 0)
        m.submodules.div = div = SeqDivider(self.div_width, max(N_WIDTH, r_width))
        sumsq = Signal(self.sum_width)
        rem = Signal(self.sq_width)         # isqrt: remainder
        root = Signal(self.sq_width)        # isqrt: result (shifted)
        bit = Signal(self.sq_width)         # isqrt: current bit
        r = Signal(r_width)                 # isqrt(ms + eps_q), or the l2norm's isqrt(ss << e)
        z = Signal(range(r_width + 1))      # leading zeros of r (in r_width or l2_r_width bits)
        # n a power of two: the mean is sumsq >> n_log2 (registered from n, held by the caller)
        n_pow2 = Signal()
        n_log2 = Signal(range(N_WIDTH))
        m.d.sync += [n_pow2.eq(self.n.any() & ((self.n & (self.n - 1)) == 0)), n_log2.eq(_trailing_zeros(self.n))]
        top = 1 << (2 * ((self.ms_width - 1) // 2))
        scale_shift = self.recip_num - cfg.norm_frac
        # |a * recip| < 2**(act_width - 1 + recip_bits): the bits above are sign copies
        prod_width = cfg.act_width + self.recip_bits + 1
        shifted = (prod[:prod_width].as_signed() << z)[:prod_width + self.r_width - 1].as_signed()
        scaled = _sat(round_shift(shifted, scale_shift, cfg.rounding), cfg.out_width)
        if layer_ops:
            l2 = self.l2
            eh = Signal(range(self.l2_p + 1))               # e / 2
            l2_shift = Signal(6)                            # p + M - frac - e/2 = C - z - e/2
            l2_const = self.l2_r_width - 1 + self.l2_recip_bits - self.l2_frac
            l2_scaled = round_shift_by(prod[:self.prod_width].as_signed(), l2_shift, cfg.rounding)
            scaled = Mux(l2, l2_scaled[:len(o_data)].as_signed(), scaled)
        else:
            l2 = Const(0)

        with m.Switch(self.op):
            with m.Case(VecOp.ADD):
                m.d.comb += i.ready.eq(free)
                with m.If(i.valid & free):
                    m.d.sync += [o_valid.eq(1), o_data.eq(_sat(beat.a + beat.b, act))]
            with m.Case(VecOp.COMBINE):
                # three stages: the operands registered, the product registered, then accumulated
                p_free = ~p_valid | free
                q_free = ~q_valid | p_free
                m.d.comb += i.ready.eq(q_free)
                with m.If(q_free):
                    m.d.sync += [q_valid.eq(i.valid), q_last.eq(beat.last)] + take
                with m.If(p_free):
                    m.d.sync += [p_valid.eq(q_valid), prod.eq(combined), p_last.eq(q_last)]
                total = acc + prod
                with m.If(p_valid & free):
                    with m.If(p_last):
                        combined_out = _sat(round_shift(total, cfg.weight_frac, cfg.rounding), act)
                        if layer_ops:
                            combined_out = Mux(dot, total[:cfg.acc_width].as_signed(), combined_out)
                        m.d.sync += [acc.eq(0), o_valid.eq(1), o_data.eq(combined_out)]
                    with m.Else():
                        m.d.sync += acc.eq(total)
            if cfg.layer_ops:
                with m.Case(VecOp.MUL):
                    # three stages as COMBINE: a and b registered, a * b registered, then shifted,
                    # rounded and saturated
                    p_free = ~p_valid | free
                    q_free = ~q_valid | p_free
                    m.d.comb += i.ready.eq(q_free)
                    with m.If(q_free):
                        m.d.sync += [q_valid.eq(i.valid)] + take
                    with m.If(p_free):
                        m.d.sync += [p_valid.eq(q_valid), prod.eq(mul)]
                    with m.If(p_valid & free):
                        m.d.sync += [o_valid.eq(1),
                                     o_data.eq(_sat(round_shift_by(prod, self.shift, cfg.rounding), cfg.out_width))]
            with m.Case(VecOp.NORM):
                with m.FSM():
                    with m.State("SUM"):
                        # three stages as COMBINE: a and a registered, a * a registered, then
                        # summed; after the last beat is taken no more are until the row's
                        # reciprocal is known
                        held = (q_valid & q_last) | (p_valid & p_last)
                        m.d.comb += i.ready.eq(~held)
                        m.d.sync += [q_valid.eq(i.valid & ~held), q_last.eq(beat.last),
                                     p_valid.eq(q_valid), prod.eq(combined), p_last.eq(q_last)] + take
                        with m.If(p_valid):
                            m.d.sync += sumsq.eq(sumsq + prod)
                        with m.If(p_valid & p_last):
                            m.next = "MEAN"
                    def sqrt_of(ms):
                        eps = self.eps if self.cfg.layer_ops else self.eps_q
                        return [rem.eq(ms + eps), root.eq(0), bit.eq(top), sumsq.eq(0)]

                    with m.State("MEAN"):
                        with m.If(l2):
                            if layer_ops:   # the l2norm: ss = sumsq + eps_q, no mean
                                m.d.sync += [rem.eq(sumsq + self.eps), sumsq.eq(0)]
                                m.next = "L2_E"
                        with m.Elif(n_pow2):
                            m.d.sync += sqrt_of((sumsq >> n_log2)[:self.ms_width])
                            m.next = "SQRT"
                        with m.Else():
                            # floor(sumsq / n) in mean_bits steps: sumsq >> mean_bits < n
                            q1 = self.mean_bits
                            m.d.comb += [div.start.eq(1), div.den.eq(self.n), div.bits.eq(q1),
                                         div.rem_in.eq(sumsq[q1:]),
                                         div.num.eq(sumsq[:q1] << (self.div_width - q1))]
                            m.next = "MEAN_WAIT"
                    with m.State("MEAN_WAIT"):
                        with m.If(~div.busy):
                            m.d.sync += sqrt_of(div.quot)
                            m.next = "SQRT"
                    if layer_ops:
                        with m.State("L2_E"):
                            # e = max(0, 2P - bit_length(ss)) rounded up to even, as e / 2
                            d = _leading_zeros(rem[:self.l2_sq_width]) + (2 * self.l2_p - self.l2_sq_width)
                            m.d.sync += eh.eq(Mux(d > 0, (d + 1) >> 1, 0))
                            m.next = "L2_SHIFT"
                        with m.State("L2_SHIFT"):
                            m.d.sync += [rem.eq(rem << Cat(0, eh)), root.eq(0),
                                         bit.eq(1 << (2 * ((self.l2_sq_width - 1) // 2)))]
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
                        z_now = _leading_zeros(root[:self.r_width])
                        if layer_ops:
                            z_now = Mux(l2, _leading_zeros(root[:self.l2_r_width]), z_now)
                        m.d.sync += [r.eq(root), z.eq(z_now), recip.eq(0)]
                        m.next = "NORMALISE"
                    with m.State("NORMALISE"):
                        with m.If(r == 0):
                            m.next = "SCALE"            # r == 0: recip stays 0, every y is 0
                        with m.Else():
                            # 2**recip_num // (r << z) in recip_quot_bits steps, from the
                            # partial remainder 2**(recip_num - recip_quot_bits) < r << z
                            q2 = self.recip_quot_bits
                            m.d.comb += [div.start.eq(1), div.num.eq(0), div.bits.eq(q2),
                                         div.rem_in.eq(1 << (self.recip_num - q2)),
                                         div.den.eq((r << z)[:self.r_width])]
                            if layer_ops:
                                # the l2norm: 2**(R-1+M) // (r << z) in M + 1 steps
                                q2 = self.l2_recip_bits + 1
                                with m.If(l2):
                                    m.d.comb += [div.bits.eq(q2), div.rem_in.eq(1 << (self.l2_recip_num - q2)),
                                                 div.den.eq((r << z)[:self.l2_r_width])]
                                m.d.sync += l2_shift.eq(l2_const - z - eh)
                            m.next = "RECIP_WAIT"
                    with m.State("RECIP_WAIT"):
                        with m.If(~div.busy):
                            m.d.sync += recip.eq(div.quot)
                            m.next = "SCALE"
                    with m.State("SCALE"):
                        # three stages as COMBINE: a and recip registered, a * recip registered,
                        # then shifted and rounded; after the last beat is taken no more are until
                        # it is emitted
                        m.d.comb += scale_pass.eq(1)
                        held = (q_valid & q_last) | (p_valid & p_last)
                        p_free = ~p_valid | free
                        q_free = ~q_valid | p_free
                        m.d.comb += i.ready.eq(q_free & ~held)
                        with m.If(q_free):
                            m.d.sync += [q_valid.eq(i.valid & ~held), q_last.eq(beat.last)] + take
                        with m.If(p_free):
                            m.d.sync += [p_valid.eq(q_valid), prod.eq(combined), p_last.eq(q_last)]
                        with m.If(p_valid & free):
                            m.d.sync += [o_valid.eq(1), o_data.eq(scaled)]
                            with m.If(p_last):
                                m.d.sync += p_valid.eq(0)
                                m.next = "SUM"
        return m
