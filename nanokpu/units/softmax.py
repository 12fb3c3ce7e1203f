"""The softmax normaliser: rows of act-format logits -> unsigned weights, bit-exact to
:func:`golden.intops.softmax_int`.

A row of ``n <= max_n`` logits is buffered in one memory of ``max_n`` words, then read twice::

    load   (n cycles)        s_j -> buf[j],  m = running max
    exp    (n + 5 cycles)    buf[j] -> d_j = saturate(s_j - m, act_width) -> PwlEvaluator(exp_table)
                             -> e_j -> buf[j],  S = sum e_j
    recip  (weight_frac + 2) Renormaliser: recip = floor(2**R / S), R = weight_frac + score_frac + 1
    emit   (n cycles)        buf[j] -> w_j = round_shift(e_j * recip, score_frac + 1, rounding)

The exp pass reads ``buf[0]`` already in the cycle of the last load (the read port is
transparent), so the passes add up to :func:`cycles_per_row` ``= 3 n + weight_frac + 7`` cycles
per row. The largest logit's ``e`` is exactly ``2**score_frac`` (:func:`golden.intops.exp_table`
is 1.0 at 0), so ``2**score_frac <= S <= n * 2**score_frac``: the reciprocal has at most
``weight_frac + 2`` bits (one divider cycle each) and every weight is ``<= 2**weight_frac``.
One row at a time: the input waits while a row is in the exp, recip or emit pass.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from golden.intops import exp_table
from nanokpu.config import KpuConfig
from nanokpu.units.pwl import PwlEvaluator
from nanokpu.units.renorm import Renormaliser

__all__ = ["Softmax", "cycles_per_row"]

#: Stages from a buffer read to its ``e``: the read, the registered ``s - m``, the PwlEvaluator.
EXP_STAGES = 2 + PwlEvaluator.latency

#: Cycles of the exp pass after the load: one per logit and the stages, less the read of
#: ``buf[0]`` in the last load cycle.
EXP_DELAY = EXP_STAGES - 1


def cycles_per_row(cfg: KpuConfig, n: int) -> int:
    """Cycles from a row's first input transfer to the next row's first input transfer without
    idle or backpressure: ``3 n + weight_frac + 7`` (load ``n``, exp ``n + 5``, the reciprocal
    ``weight_frac + 2``, emit ``n``)."""
    return 3 * n + EXP_DELAY + cfg.weight_frac + 2


class Softmax(wiring.Component):
    """Streamed softmax over rows of up to ``max_n`` logits (see the module docstring).

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``act_width``/``act_frac`` (logits), ``score_frac`` (the exponentials),
        ``weight_frac``, ``pwl_guard``, ``rounding`` and ``dsp``.
    max_n : int or None
        The longest row, ``>= 1`` (the buffer depth); None: :attr:`~nanokpu.config.KpuConfig.attnres_candidates`.

    Members
    -------
    i : In(stream.Signature(StructLayout({"logit": signed(act_width), "last": 1})))
        One logit per transfer, in the act format; ``last`` ends the row. The ``max_n``-th
        logit of a row ends it whether ``last`` is set or not.
    o : Out(stream.Signature(StructLayout({"weight": unsigned(weight_frac + 1), "last": 1})))
        The row's weights in input order (``weight_frac`` fractional bits, ``<= 2**weight_frac``),
        ``last`` on the row's last one.

    Timing (a row of ``n`` logits, output ready): the input takes a transfer per cycle while
    loading; the first weight is valid :attr:`latency` ``= n + weight_frac + 8`` cycles after
    the last logit's transfer, then one weight per cycle; the next row's first logit is taken
    in the cycle after the row's last weight transfer, :func:`cycles_per_row` after the row's
    first logit at full rate. Backpressure on ``o`` holds the current weight (nothing is
    lost); ``i.ready`` is low from the cycle after a row's last logit is taken to the cycle of its
    last weight's transfer.
    """

    def __init__(self, cfg: KpuConfig, max_n: int | None = None):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        if max_n is None:
            max_n = cfg.attnres_candidates
        if not isinstance(max_n, int) or isinstance(max_n, bool) or max_n < 1:
            raise ValueError(f"max_n = {max_n!r}: must be a positive integer")
        self.cfg = cfg
        self.max_n = max_n
        self.table = exp_table(cfg)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"logit": signed(cfg.act_width), "last": 1}))),
            "o": Out(stream.Signature(data.StructLayout({"weight": unsigned(cfg.weight_width), "last": 1}))),
        })

    def cycles_per_row(self, n: int) -> int:
        """:func:`cycles_per_row` of the config for a row of ``n`` logits."""
        return cycles_per_row(self.cfg, n)

    def latency(self, n: int) -> int:
        """Cycles from the transfer of a row's last logit (of ``n``) to its first weight being
        valid: ``n + weight_frac + 8``."""
        return cycles_per_row(self.cfg, n) - 2 * n + 1

    def elaborate(self, platform):
        cfg, max_n = self.cfg, self.max_n
        m = Module()
        m.submodules.exp = exp = PwlEvaluator(self.table, 1, dsp=cfg.dsp)
        # The table's outputs lie in [0, 2**score_frac]: the cast drops only zero bits.
        assert not exp.out_shape.signed and exp.out_shape.width <= cfg.score_width
        # exp(0) = 1.0 exactly: the row sum is at least 2**score_frac (the divider's min_total).
        assert int(self.table(0)) == 1 << cfg.score_frac
        m.submodules.renorm = renorm = Renormaliser(cfg, max_n << cfg.score_frac, 1 << cfg.score_frac)

        # One word per logit: s (signed act_width bits) while loading, then e (score_width bits).
        buf = Memory(shape=max(cfg.act_width, cfg.score_width), depth=max_n, init=[])
        m.submodules.buf = buf
        wp = buf.write_port()
        rp = buf.read_port(domain="sync", transparent_for=(wp,))

        loading, emitting = Signal(init=1), Signal()   # neither: the exp pass
        count = Signal(range(max_n))          # load: logits taken; emit: weights sent
        last_j = Signal(range(max_n))         # the row's last index, n - 1
        peak = Signal(signed(cfg.act_width))  # the running max
        issue_j = Signal(range(max_n))        # exp pass: the next buffer read
        issuing = Signal()
        write_j = Signal(range(max_n))        # exp pass: the next e written back
        total = Signal(range((max_n << cfg.score_frac) + 1))
        diff = Signal(signed(cfg.act_width))  # saturate(s - m, act_width), registered
        in_flight = Signal(EXP_STAGES)        # bit k: a buffer read k + 1 cycles ago

        # -- load: buffer the row and track its max --------------------------------------
        in_xfer = self.i.valid & self.i.ready
        logit = self.i.payload.logit
        in_last = self.i.payload.last | (count == max_n - 1)
        m.d.comb += self.i.ready.eq(loading)
        with m.If(loading):
            m.d.comb += [wp.addr.eq(count), wp.data.eq(logit), wp.en.eq(in_xfer)]
        with m.If(in_xfer):
            m.d.sync += [count.eq(count + 1), peak.eq(Mux((count == 0) | (logit > peak), logit, peak))]
            with m.If(in_last):
                m.d.sync += [count.eq(0), last_j.eq(count), loading.eq(0),
                             issue_j.eq(1), issuing.eq(count != 0), write_j.eq(0), total.eq(0)]

        # -- exp: read s back (buf[0] in the last load cycle), e = exp_q(s - m) written back -
        issue = Mux(loading, in_xfer & in_last, issuing)
        out_xfer = self.o.valid & self.o.ready
        m.d.comb += rp.addr.eq(Mux(loading, 0, Mux(emitting, Mux(out_xfer, count + 1, count), issue_j)))
        with m.If(issuing):
            m.d.sync += issue_j.eq(issue_j + 1)
            with m.If(issue_j == last_j):
                m.d.sync += issuing.eq(0)
        s = rp.data[:cfg.act_width].as_signed()
        d = s - peak                          # <= 0: only the lower bound can be passed
        m.d.sync += [in_flight.eq((in_flight << 1) | issue),
                     diff.eq(Mux(d < -(1 << (cfg.act_width - 1)), -(1 << (cfg.act_width - 1)), d))]
        m.d.comb += [exp.en.eq(1), exp.x[0].eq(diff)]
        e = exp.y[0]
        e_valid = in_flight[-1]
        row_sum = total + e
        with m.If(e_valid):
            m.d.comb += [wp.addr.eq(write_j), wp.data.eq(e), wp.en.eq(1)]
            m.d.sync += [write_j.eq(write_j + 1), total.eq(row_sum)]
            with m.If(write_j == last_j):
                m.d.sync += emitting.eq(1)
        m.d.comb += [renorm.start.eq(e_valid & (write_j == last_j)), renorm.total.eq(row_sum)]

        # -- recip, then emit: buf[count] is on the read port while the reciprocal is computed -
        out_last = count == last_j
        m.d.comb += [
            renorm.score.eq(rp.data[:cfg.score_width]),
            self.o.valid.eq(emitting & ~renorm.busy),
            self.o.payload.weight.eq(renorm.weight),
            self.o.payload.last.eq(out_last),
        ]
        with m.If(out_xfer):
            m.d.sync += count.eq(count + 1)
            with m.If(out_last):
                m.d.sync += [count.eq(0), emitting.eq(0), loading.eq(1)]
        return m
