"""Fixed-point SiTU-GLU ``h = gate(g) * up(u)``, ``act_lanes`` results per cycle."""

from __future__ import annotations

from amaranth import Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from golden import intops
from nanokpu.config import KpuConfig
from nanokpu.units.pwl import PwlEvaluator, error_bound, out_range, round_shift, stall_pipeline

__all__ = ["Situ", "situ_error_bound", "situ_h_range", "situ_pair_layout"]


def situ_pair_layout(cfg: KpuConfig) -> data.StructLayout:
    """One ``(g, u)`` input pair: two ``Q<act_width>.<act_frac>`` fields, ``g`` in the low bits."""
    return data.StructLayout({"g": signed(cfg.act_width), "u": signed(cfg.act_width)})


def situ_h_range(cfg: KpuConfig) -> tuple[int, int]:
    """``(min, max)`` of :func:`golden.intops.situ_q` over all input pairs, exact: the rounded
    product is monotone in the product, whose extremes are products of the factors' extremes."""
    gate, up = intops.gate_table(cfg), intops.up_table(cfg)
    corners = [a * b for a in out_range(gate) for b in out_range(up)]
    lo, hi = intops.round_shift([min(corners), max(corners)], 2 * cfg.situ_frac - cfg.h_frac, cfg.rounding)
    return int(lo), int(hi)


def situ_error_bound(cfg: KpuConfig) -> float:
    """Largest ``|h * 2**-h_frac - gate(g) up(u)|`` over all inputs, in real units.

    Each factor is within ``e = 1.5 * 2**-situ_frac`` of its real value
    (:func:`nanokpu.units.pwl.error_bound`), so ``|gq*uq - G*U| <= |gq| e + |U| e <=
    (beta1 + e) e + beta2 e``; the output rounding adds ``r * 2**-h_frac`` (``r`` = 0.5, or
    1 for ``floor``).
    """
    e = error_bound(intops.up_table(cfg))
    r = 1.0 if cfg.rounding == "floor" else 0.5
    return (cfg.beta1 + e) * e + cfg.beta2 * e + r * 2.0 ** -cfg.h_frac


class Situ(wiring.Component):
    """Streamed fixed-point SiTU-GLU, bit-exact to :func:`golden.intops.situ_q`.

    ``gate(g) = beta1 tanh(g/beta1) sigmoid(g)`` and ``up(u) = beta2 tanh(u/beta2)`` come
    from two :class:`~nanokpu.units.pwl.PwlEvaluator` tables (``situ_frac`` fractional bits), their
    product is rounded by ``2*situ_frac - h_frac`` bits into ``Q<h_width>.<h_frac>``. The
    output range is checked at construction from the tables' extremes: no saturation logic.

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``beta1``, ``beta2``, ``act_width``/``act_frac``, ``situ_frac``,
        ``h_width``/``h_frac``, ``pwl_guard``, ``rounding``, ``act_lanes`` and ``dsp`` (how the
        interpolation products are built).

    Members
    -------
    i : In(stream.Signature(ArrayLayout(situ_pair_layout(cfg), act_lanes)))
        ``(g, u)`` pairs in ``Q<act_width>.<act_frac>``.
    o : Out(stream.Signature(ArrayLayout(signed(h_width), act_lanes)))
        ``h`` in ``Q<h_width>.<h_frac>``; ``|h| <= beta1*beta2`` exactly when
        ``beta1 * 2**situ_frac``, ``beta2 * 2**situ_frac`` and ``beta1*beta2 * 2**h_frac`` are
        integers (else rounding may add a few LSB; :attr:`h_range` is exact either way).

    One transfer per cycle; :attr:`latency` cycles from an ``i`` transfer to its result on
    ``o`` when ``o`` is not stalled (factor tables 4, product 1, rounding 1). Backpressure
    on ``o`` stalls the whole pipeline.

    Attributes: :attr:`h_range` (:func:`situ_h_range`, checked against ``h_width``) and
    :attr:`error_bound` (:func:`situ_error_bound`, against the real ``gate(g) * up(u)``).

    Raises
    ------
    ValueError
        If ``h_width`` cannot hold the extreme products of the two tables.
    """

    latency = PwlEvaluator.latency + 2

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        self.gate_table = intops.gate_table(cfg)
        self.up_table = intops.up_table(cfg)
        self.shift = 2 * cfg.situ_frac - cfg.h_frac
        self.h_range = situ_h_range(cfg)
        self.error_bound = situ_error_bound(cfg)
        lo, hi = self.h_range
        limit = 1 << (cfg.h_width - 1)
        if lo < -limit or hi >= limit:
            raise ValueError(f"KpuConfig.h_width = {cfg.h_width}: h reaches [{lo}, {hi}] in "
                             f"Q{cfg.h_width}.{cfg.h_frac}, outside the signed {cfg.h_width}-bit range")
        lanes = cfg.act_lanes
        super().__init__({
            "i": In(stream.Signature(data.ArrayLayout(situ_pair_layout(cfg), lanes))),
            "o": Out(stream.Signature(data.ArrayLayout(signed(cfg.h_width), lanes))),
        })

    def elaborate(self, platform):
        cfg = self.cfg
        m = Module()
        lanes = cfg.act_lanes
        m.submodules.gate = gate = PwlEvaluator(self.gate_table, lanes, dsp=cfg.dsp)
        m.submodules.up = up = PwlEvaluator(self.up_table, lanes, dsp=cfg.dsp)
        advance = stall_pipeline(m, self.i, self.o, self.latency)
        m.d.comb += [gate.en.eq(advance), up.en.eq(advance)]
        for lane in range(lanes):
            m.d.comb += [
                gate.x[lane].eq(self.i.payload[lane].g),
                up.x[lane].eq(self.i.payload[lane].u),
            ]
            product = Signal(signed(gate.out_shape.width + up.out_shape.width), reset_less=True)
            h = Signal(signed(cfg.h_width), reset_less=True)
            m.d.comb += self.o.payload[lane].eq(h)
            with m.If(advance):
                m.d.sync += [
                    product.eq(gate.y[lane] * up.y[lane]),
                    h.eq(round_shift(product, self.shift, cfg.rounding)),
                ]
        return m
