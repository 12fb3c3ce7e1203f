"""Several units in one simulation top, so that one Verilator build serves every config a bench
needs."""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import wiring

__all__ = ["SideBySide"]


class SideBySide(wiring.Component):
    """``units`` (by key, a Verilog identifier) side by side, no logic of their own: port ``p`` of
    the unit ``key`` (each of ``ports``) is the top's port ``<key>_<p>``, its direction kept."""

    def __init__(self, units: dict[str, wiring.Component], ports: tuple[str, ...]):
        self.units, self.ports = units, ports
        super().__init__({f"{key}_{port}": unit.signature.members[port]
                          for key, unit in units.items() for port in ports})

    def elaborate(self, platform):
        m = Module()
        for key, unit in self.units.items():
            m.submodules[key] = unit
            for port in self.ports:
                wiring.connect(m, wiring.flipped(getattr(self, f"{key}_{port}")), getattr(unit, port))
        return m
