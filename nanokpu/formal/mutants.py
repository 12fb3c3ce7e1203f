"""Deliberately broken twins of the units, one small mutation each: every proof must catch its twin.

A proof that passes on a broken design is vacuous (an over-strong assumption, a check that
never fires); ``tests/test_formal_*.py`` run each proof on its twin and require a failure.

* :class:`DroppedReadySigmoid` - ``i.ready`` loses its ``~o.valid | o.ready`` term: a transfer
  accepted while the pipeline is stalled is lost (caught by the conservation check).
* :class:`DroppedReadyRouter` - ``scores.ready`` tied high: beats are lost while the insertion
  stage is busy (caught by the conservation check).
* :class:`RetractingValid` - the output ``valid`` of any stream unit drops every other cycle,
  also while the sink stalls (caught by the handshake rules).
* :func:`silent_status` / :func:`hanging_bus_after_error` - a nano-KPU whose STATUS reads lose
  the error bits / whose AXI4-Lite reads stop answering after an error (caught by the
  controller proof). These and :class:`RetractingValid` are :class:`PortMutant` s: one output
  port of an unchanged unit replaced by a broken value.
* :class:`SignBugRouter` - the router compares keys as unsigned (negative biased keys rank
  above positive ones: a flipped comparison) (caught by the top-k proof).
* :class:`OvershootSitu` - the up-branch table's top breakpoint overshoots ``beta2`` by 1/8
  (caught by the SiTU bound proof).
* :class:`StuckQuotientDivider` - the divider's quotient LSB reads as 0 (caught by the
  divider proof).
"""

from __future__ import annotations

import dataclasses

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import wiring

from nanokpu.units.divider import SeqDivider
from nanokpu.units.router import TopKRouter
from nanokpu.units.sigmoid import Sigmoid
from nanokpu.units.situ import Situ

__all__ = ["DroppedReadySigmoid", "DroppedReadyRouter", "PortMutant", "RetractingValid", "SignBugRouter",
           "OvershootSitu", "StuckQuotientDivider", "silent_status", "hanging_bus_after_error"]


class DroppedReadySigmoid(Sigmoid):
    """:class:`Sigmoid` whose ``i.ready`` is always high (the stall term dropped)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.i.ready.eq(1)
        return m


class DroppedReadyRouter(TopKRouter):
    """:class:`TopKRouter` whose ``scores.ready`` is always high."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.scores.ready.eq(1)
        return m


class SignBugRouter(TopKRouter):
    """:class:`TopKRouter` whose biased keys are unsigned: every key comparison is wrong for
    negative keys."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.key_shape = unsigned(self.key_shape.width)


class OvershootSitu(Situ):
    """:class:`Situ` whose up table ends 1/8 above ``beta2`` (a mis-fitted table)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        values = list(self.up_table.values)
        values[-1] += values[-1] // 8
        self.up_table = dataclasses.replace(self.up_table, values=tuple(values))


class StuckQuotientDivider(SeqDivider):
    """:class:`SeqDivider` whose ``quot`` output has its least significant bit stuck at 0."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = SeqDivider(self.num_width, self.den_width)
        m.d.comb += [inner.start.eq(self.start), inner.num.eq(self.num), inner.den.eq(self.den),
                     self.busy.eq(inner.busy), self.rem.eq(inner.rem),
                     self.quot.eq(inner.quot & ~1)]
        return m


class PortMutant(wiring.Component):
    """``unit`` with one output port replaced by ``mutate(m, value, unit)`` (same ports as ``unit``).

    Parameters
    ----------
    unit : wiring.Component
        The unit (a fresh instance).
    path : tuple
        Path of the output port in ``unit.signature.flatten`` (e.g. ``("o", "valid")``).
    mutate : callable
        ``mutate(m, value, unit) -> value``: the broken value, built in module ``m``.
    """

    def __init__(self, unit: wiring.Component, path: tuple, mutate):
        self.unit = unit
        self.path = tuple(path)
        self.mutate = mutate
        super().__init__(dict(unit.signature.members))
        if not any(p == self.path and mem.flow == wiring.Out for p, mem, _ in self.signature.flatten(self)):
            raise ValueError(f"{self.path} is not an output port of {type(unit).__name__}")

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self.unit
        for (path, member, outer), (_, _, inner) in zip(self.signature.flatten(self),
                                                        unit.signature.flatten(unit), strict=True):
            if member.flow == wiring.In:
                m.d.comb += inner.eq(outer)
            elif path == self.path:
                m.d.comb += outer.eq(self.mutate(m, inner, unit))
            else:
                m.d.comb += outer.eq(inner)
        return m


def _every_other_cycle(m, value, unit):
    phase = Signal()
    m.d.sync += phase.eq(~phase)
    return value & phase


class RetractingValid(PortMutant):
    """``unit`` with the ``valid`` of its output stream ``port`` dropped every other cycle."""

    def __init__(self, unit: wiring.Component, port: str):
        super().__init__(unit, (port, "valid"), _every_other_cycle)


def silent_status(kpu) -> PortMutant:
    """A nano-KPU whose register reads lose bits 2..15 (STATUS never shows an error)."""
    return PortMutant(kpu, ("s_axil", "rdata"), lambda m, value, unit: value & ~0xFFFC)


def hanging_bus_after_error(kpu) -> PortMutant:
    """A nano-KPU whose AXI4-Lite read responses stop once ``irq`` is high (the bus hangs)."""
    return PortMutant(kpu, ("s_axil", "rvalid"), lambda m, value, unit: value & ~unit.irq)
