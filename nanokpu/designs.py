"""The units the flows build by name: ``nanokpu generate``, ``nanokpu synth`` and the board builds
all read :data:`UNITS` and :func:`resolve_unit`.

A unit here is a factory ``KpuConfig -> wiring.Component``: a gateware unit of
:mod:`nanokpu.units` or the whole nano-KPU (``kpu``). A new unit adds one line to :data:`UNITS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from amaranth.lib import wiring

from golden.fidelity import AFTER, scheme
from nanokpu.config import KpuConfig
from nanokpu.kpu.top import NanoKPU
from nanokpu.units.gemm import GemmEngine
from nanokpu.units.kda_state import KdaStateUpdate
from nanokpu.units.pwl_functions import Decay, Exp, Silu
from nanokpu.units.router import TopKRouter
from nanokpu.units.sigmoid import Sigmoid
from nanokpu.units.situ import Situ
from nanokpu.units.softmax import Softmax

__all__ = ["UNITS", "TOP_UNIT", "kpu_after", "resolve_unit", "top_name"]

Factory = Callable[[KpuConfig], wiring.Component]

#: unit name -> factory.
UNITS: dict[str, Factory] = {
    "router": TopKRouter,
    "gemm": GemmEngine,
    "sigmoid": Sigmoid,
    "situ": Situ,
    "exp": Exp,
    "silu": Silu,
    "decay": Decay,
    "softmax": Softmax,
    "kda_state": KdaStateUpdate,
    "kpu": NanoKPU,
}

#: The unit that is the whole design (the nano-KPU top level).
TOP_UNIT = "kpu"


def kpu_after(cfg: KpuConfig) -> NanoKPU:
    """The whole nano-KPU at issue 26's after scheme over ``cfg`` (:data:`golden.fidelity.AFTER`:
    the 16-bit router, Q20.16 logits, 16-bit scores, 20-bit bias, per-channel scales), for its
    cost: ``nanokpu synth --unit nanokpu.designs:kpu_after``."""
    return NanoKPU(scheme(cfg, AFTER))


def resolve_unit(unit: str) -> Factory:
    """The factory of a registered unit name or of a ``module:factory`` path (for example
    ``nanokpu.units.gemm:kpu_engine``); ``ValueError`` naming ``unit`` when it is neither, or
    when the path does not import."""
    if unit in UNITS:
        return UNITS[unit]
    if unit.count(":") != 1:
        raise ValueError(f"unit = {unit!r}: must be one of {sorted(UNITS)} or 'module:factory'")
    module, attr = unit.split(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"unit = {unit!r}: {exc}") from None
    if not callable(factory):
        raise ValueError(f"unit = {unit!r}: {attr} is not a factory KpuConfig -> Component")
    return factory


def top_name(unit: str) -> str:
    """The module name a unit's netlist gets (``nanokpu_<unit>``)."""
    return f"nanokpu_{unit.split(':')[-1].lower()}"
