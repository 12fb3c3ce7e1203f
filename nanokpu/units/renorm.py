"""Renormalisation of a row of scores by one reciprocal: the RTL of :func:`golden.intops.route_weights_int`.

With ``S`` the row sum and ``R = weight_frac + score_frac + 1``::

    recip = floor(2**R / S)                                   a SeqDivider, once per row
    w     = round_shift(s * recip, score_frac + 1, rounding)  one multiply per score

Used by the routing engine (:class:`~nanokpu.units.router.TopKRouter`, the top-k scores of a
token) and the softmax (:class:`~nanokpu.units.softmax.Softmax`, the exponentials of a row).
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.units.divider import SeqDivider
from nanokpu.units.pwl import round_shift

__all__ = ["Renormaliser"]


class Renormaliser(wiring.Component):
    """One reciprocal ``floor(2**R / S)`` per row, then the weight of any score of the row.

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``score_frac``, ``weight_frac`` and ``rounding``.
    max_total : int
        The largest row sum ``S`` (``>= 1``); sets the width of ``total``.
    min_total : int
        The smallest row sum the caller guarantees (``0 <= min_total <= max_total``). The
        reciprocal then has at most :attr:`quot_bits` ``= bit_length(2**R // max(min_total, 1))``
        bits, and the division takes one cycle per bit (``R + 1`` cycles when ``min_total <= 1``;
        ``weight_frac + 2`` for a softmax, whose sum is at least ``2**score_frac``). A sum
        below ``min_total`` gives a wrong reciprocal.

    Members
    -------
    start : In(1)
        Starts a row's division with ``total`` (sampled in the same cycle) when ``busy`` is low.
    total : In(range(max_total + 1))
        The row sum ``S``. ``S = 0`` (possible only when ``min_total = 0``) gives an undefined
        reciprocal: the weights of its all-zero scores are 0 whatever it is.
    busy : Out(1)
        High for exactly :attr:`latency` cycles from the cycle after ``start``.
    score : In(unsigned(score_frac + 1))
        A score of the row (``<= S``), any cycle while ``busy`` is low after a division.
    weight : Out(unsigned(weight_frac + 1))
        Its weight ``round_shift(score * recip, score_frac + 1, rounding)``, combinational
        from ``score`` (one multiplier); ``<= 2**weight_frac`` since ``score <= S``.
    """

    def __init__(self, cfg: KpuConfig, max_total: int, min_total: int = 0):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        if not isinstance(max_total, int) or isinstance(max_total, bool) or max_total < 1:
            raise ValueError(f"max_total = {max_total!r}: must be a positive integer")
        if not isinstance(min_total, int) or isinstance(min_total, bool) or not 0 <= min_total <= max_total:
            raise ValueError(f"min_total = {min_total!r}: must be an integer in [0, max_total={max_total}]")
        self.cfg = cfg
        self.max_total = max_total
        self.min_total = min_total
        #: ``R``: the reciprocal is ``floor(2**R / S)``.
        self.recip_bits = cfg.weight_frac + cfg.score_frac + 1
        #: Bits of the largest reciprocal, ``floor(2**R / max(min_total, 1))``.
        self.quot_bits = ((1 << self.recip_bits) // max(min_total, 1)).bit_length()
        super().__init__({
            "start": In(1),
            "total": In(range(max_total + 1)),
            "busy": Out(1),
            "score": In(cfg.score_width),
            "weight": Out(cfg.weight_width),
        })

    @property
    def latency(self) -> int:
        """Cycles ``busy`` stays high after ``start``: one per reciprocal bit, :attr:`quot_bits`."""
        return self.quot_bits

    def elaborate(self, platform):
        cfg = self.cfg
        m = Module()
        # The division of 2**R shortened to quot_bits quotient bits (SeqDivider's recipe): the
        # dividend bits above them start as the partial remainder (< min_total <= S).
        num = 1 << self.recip_bits
        m.submodules.divider = div = SeqDivider(self.quot_bits, len(self.total))
        m.d.comb += [
            div.num.eq(num % (1 << self.quot_bits)),
            div.rem_in.eq(num >> self.quot_bits),
            div.den.eq(self.total),
            div.start.eq(self.start),
            self.busy.eq(div.busy),
            self.weight.eq(round_shift(self.score * div.quot, cfg.score_frac + 1, cfg.rounding)),
        ]
        return m
