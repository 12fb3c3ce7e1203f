"""Fixed-point sigmoid for the router scores, ``act_lanes`` per cycle."""

from __future__ import annotations

from amaranth import Module, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.intops import sigmoid_table
from nanokpu.config import KpuConfig
from nanokpu.units.pwl import PwlEvaluator, error_bound, stall_pipeline

__all__ = ["Sigmoid"]


class Sigmoid(wiring.Component):
    """Streamed fixed-point sigmoid, bit-exact to :func:`golden.intops.sigmoid_q`.

    Parameters
    ----------
    cfg : KpuConfig
        Reads the logit format :attr:`~nanokpu.config.KpuConfig.router_logit_width` /
        :attr:`~nanokpu.config.KpuConfig.router_logit_frac` (``logit_width``/``logit_frac``,
        the act format when they are None), ``score_frac`` (scores), ``pwl_guard``, ``rounding``,
        ``act_lanes`` and ``dsp`` (how the interpolation product is built). The table is
        :func:`golden.intops.sigmoid_table`.

    Members
    -------
    i : In(stream.Signature(ArrayLayout(signed(router_logit_width), act_lanes)))
        Logits in ``Q<logit_width>.<logit_frac>``.
    o : Out(stream.Signature(ArrayLayout(unsigned(score_width), act_lanes)))
        Scores in ``[0, 2**score_frac]`` (``score_frac`` fractional bits, 1.0 included).

    One transfer per cycle; :attr:`latency` cycles from an ``i`` transfer to its result on
    ``o`` when ``o`` is not stalled. Backpressure on ``o`` stalls the whole pipeline.
    Every score is within :attr:`error_bound` (1.5 LSB) of the real sigmoid of its input.
    """

    latency = PwlEvaluator.latency

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        self.table = sigmoid_table(cfg)
        #: Largest error against the real sigmoid, in real units.
        self.error_bound = error_bound(self.table)
        lanes = cfg.act_lanes
        super().__init__({
            "i": In(stream.Signature(data.ArrayLayout(signed(cfg.router_logit_width), lanes))),
            "o": Out(stream.Signature(data.ArrayLayout(unsigned(cfg.score_width), lanes))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.pwl = pwl = PwlEvaluator(self.table, self.cfg.act_lanes, dsp=self.cfg.dsp)
        # The table's outputs lie in [0, 2**score_frac]: the cast drops only zero bits.
        assert not pwl.out_shape.signed and pwl.out_shape.width <= self.cfg.score_width
        advance = stall_pipeline(m, self.i, self.o, self.latency)
        m.d.comb += [
            pwl.en.eq(advance),
            pwl.x.eq(self.i.payload),
        ]
        for lane in range(self.cfg.act_lanes):
            m.d.comb += self.o.payload[lane].eq(pwl.y[lane])
        return m
