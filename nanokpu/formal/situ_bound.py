"""Proof that the SiTU-GLU unit's output never exceeds the bound of its format.

K3's SiTU-GLU guarantees ``|h| <= beta1 * beta2``; in ``Q<h_width>.<h_frac>`` that is
:func:`situ_limit` ``= floor(beta1 * beta2 * 2**h_frac)``. :class:`SituBoundProof` wraps a
:class:`~nanokpu.units.situ.Situ` (with the stream rules of
:class:`~nanokpu.formal.streams.StreamProof`) and asserts ``|h| <= limit`` on every lane of
every valid output beat, for any input pairs, idle and backpressure.

The unit is a feed-forward pipeline of :attr:`Situ.latency` stages whose registers start at
zero: every output is a function of one input pair, so a bounded check of depth
``latency + 3`` from reset covers every input pair (:func:`situ_depth`).
"""

from __future__ import annotations

import math

from amaranth.hdl import Assert

from nanokpu.config import KpuConfig
from nanokpu.formal.streams import StreamProof
from nanokpu.units.situ import Situ

__all__ = ["SituBoundProof", "situ_limit", "situ_depth"]


def situ_limit(cfg: KpuConfig) -> int:
    """``floor(beta1 * beta2 * 2**h_frac)``: the largest ``|h|`` the format's bound allows."""
    return math.floor(cfg.situ_bound * 2 ** cfg.h_frac)


def situ_depth(unit: Situ) -> int:
    """BMC depth that lets any input pair reach the output: ``latency + 3``."""
    return unit.latency + 3


class SituBoundProof(StreamProof):
    """Formal wrapper of ``unit`` asserting ``|h| <= situ_limit(cfg)`` on every valid lane.

    Parameters
    ----------
    unit : Situ
        The design under proof (a fresh instance).
    """

    def __init__(self, unit: Situ):
        if not isinstance(unit, Situ):
            raise TypeError(f"SituBoundProof takes a Situ, not {type(unit).__name__}")
        super().__init__(unit)

    def elaborate(self, platform):
        m = super().elaborate(platform)
        limit = situ_limit(self.unit.cfg)
        with m.If(self.o.valid):
            for lane in range(self.unit.cfg.act_lanes):
                h = self.o.payload[lane]
                m.d.comb += Assert((h <= limit) & (h >= -limit), f"o[{lane}]: |h| > {limit}")
        return m
