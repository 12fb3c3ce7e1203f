"""Fixed-point exp, SiLU and KDA decay, ``act_lanes`` per cycle: the table functions of a K3 layer
beside the sigmoid.

Each unit is a :class:`~nanokpu.units.pwl_stream.PwlStream` of one :mod:`golden.intops` table and
differs from the others only in that table and its output shape, so the three share this file
(and the stream unit's contract, latency and error bound).
"""

from __future__ import annotations

from amaranth import signed, unsigned

from golden.intops import decay_table, exp_table, silu_table
from nanokpu.config import KpuConfig
from nanokpu.units.pwl_stream import PwlStream

__all__ = ["Decay", "Exp", "Silu"]


class Exp(PwlStream):
    """Streamed ``exp(min(x, 0))``, bit-exact to :func:`golden.intops.exp_q` (the softmax's exp).

    Parameters
    ----------
    cfg : KpuConfig
        Reads the act format, ``score_frac``, ``pwl_guard``, ``rounding``, ``act_lanes`` and
        ``dsp``; the table is :func:`golden.intops.exp_table`.

    Members
    -------
    i : In(stream.Signature(ArrayLayout(signed(act_width), act_lanes)))
        Inputs in the act format (``x >= 0`` gives 1.0).
    o : Out(stream.Signature(ArrayLayout(unsigned(score_width), act_lanes)))
        Values in ``[0, 2**score_frac]`` (``score_frac`` fractional bits, 1.0 included).

    :attr:`latency` (4) cycles, one transfer per cycle, backpressure stalls the pipeline; every
    value within :attr:`error_bound` (1.5 LSB) of ``exp(min(x, 0))``.
    """

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        super().__init__(exp_table(cfg), cfg.act_lanes, unsigned(cfg.score_width), dsp=cfg.dsp)


class Silu(PwlStream):
    """Streamed SiLU ``x sigmoid(x)``, bit-exact to :func:`golden.intops.silu_q` (KDA's q, k, v).

    Parameters
    ----------
    cfg : KpuConfig
        Reads the act format, ``pwl_guard``, ``rounding``, ``act_lanes`` and ``dsp``; the table
        is :func:`golden.intops.silu_table`.

    Members
    -------
    i : In(stream.Signature(ArrayLayout(signed(act_width), act_lanes)))
        Inputs in the act format.
    o : Out(stream.Signature(ArrayLayout(signed(act_width), act_lanes)))
        ``silu(x)`` in the act format.

    :attr:`latency` (4) cycles, one transfer per cycle, backpressure stalls the pipeline; every
    value within :attr:`error_bound` (1.5 LSB) of ``silu(x)``.
    """

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        super().__init__(silu_table(cfg), cfg.act_lanes, signed(cfg.act_width), dsp=cfg.dsp)


class Decay(PwlStream):
    """Streamed KDA decay ``exp(kda_gate_min * sigmoid(z))``, bit-exact to :func:`golden.intops.decay_q`.

    Parameters
    ----------
    cfg : KpuConfig
        Reads the act format, ``kda_gate_min``, ``score_frac``, ``pwl_guard``, ``rounding``,
        ``act_lanes`` and ``dsp``; the table is :func:`golden.intops.decay_table`.

    Members
    -------
    i : In(stream.Signature(ArrayLayout(signed(act_width), act_lanes)))
        Gate logits ``z`` in the act format.
    o : Out(stream.Signature(ArrayLayout(unsigned(score_width), act_lanes)))
        Decays in ``[exp(kda_gate_min), 1]`` (``score_frac`` fractional bits, 1.0 included).

    :attr:`latency` (4) cycles, one transfer per cycle, backpressure stalls the pipeline; every
    value within :attr:`error_bound` (1.5 LSB) of ``exp(kda_gate_min * sigmoid(z))``.
    """

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        super().__init__(decay_table(cfg), cfg.act_lanes, unsigned(cfg.score_width), dsp=cfg.dsp)
