"""Fixed-point sigmoid for the router scores, ``act_lanes`` per cycle."""

from __future__ import annotations

from amaranth import unsigned

from golden.intops import sigmoid_table
from nanokpu.config import KpuConfig
from nanokpu.units.pwl_stream import PwlStream

__all__ = ["Sigmoid"]


class Sigmoid(PwlStream):
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
    ``o`` when ``o`` is not stalled. Backpressure on ``o`` stalls the whole pipeline (the
    :class:`~nanokpu.units.pwl_stream.PwlStream` of the table). Every score is within
    :attr:`error_bound` (1.5 LSB) of the real sigmoid of its input.
    """

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        super().__init__(sigmoid_table(cfg), cfg.act_lanes, unsigned(cfg.score_width), dsp=cfg.dsp)
