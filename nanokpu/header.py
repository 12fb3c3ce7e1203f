"""The C header of a nano-KPU (``nanokpu.h``): its host interface and its config, for firmware and other tools.

``nanokpu generate`` writes it next to the Verilog (``rtl/<profile>/nanokpu.h``). Every macro is
read from :mod:`nanokpu.isa` and the :class:`~nanokpu.config.KpuConfig`, one table each: a new
register, opcode, error code, flag, instruction field, executor or config field appears in the
header without a change here. The names (all prefixed ``NANOKPU_``):

* ``REG_<REG>``: the AXI4-Lite register byte offsets of :class:`~nanokpu.isa.Reg`;
  ``REG_BUSY_<EXECUTOR>`` the busy counter of each executor, ``EXECUTOR_<EXECUTOR>`` its index,
  ``N_EXECUTORS``; ``IMEM_BASE``, ``LOADS_BASE``, ``ADDR_WIDTH``.
* ``STATUS_<FIELD>_SHIFT`` / ``_WIDTH`` / ``_MASK`` (in place) and ``STATUS_<FIELD>(s)`` (the
  field's value) for the fields of :data:`~nanokpu.isa.STATUS_LAYOUT` (``reserved*`` left out);
  ``CTRL_<BIT>`` the bits of :data:`~nanokpu.isa.CTRL_LAYOUT`.
* ``OP_<OP>``, ``ERR_<ERR>``, ``F_<FLAG>``.
* ``INSTR_BITS``, ``INSTR_WORDS``, ``INSTR_BYTES`` and ``INSTR_<FIELD>_SHIFT`` / ``_WIDTH``: bit
  ``SHIFT`` of the 256-bit instruction is bit ``SHIFT % 32`` of its little-endian 32-bit word
  ``SHIFT / 32`` (a field may straddle two words).
* ``<FIELD>`` for every field of the config (integers, strings as string literals, reals as
  double literals) and a few derived sizes (``BUS_BYTES``, ``WORD_WIDTH``, ...).

The output is a function of the config alone (no date, no path): ``tests/commands/test_generate.py``
compares the committed headers with fresh ones.
"""

from __future__ import annotations

import dataclasses
import json

from nanokpu import isa
from nanokpu.config import KpuConfig

__all__ = ["PREFIX", "DERIVED", "RESOLVED", "c_header", "config_value"]

PREFIX = "NANOKPU_"

#: (name, function of the config) of the derived sizes in the header.
DERIVED = (("bus_bytes", isa.bus_bytes), ("word_width", isa.word_width),
           ("score_width", lambda cfg: cfg.score_width), ("weight_width", lambda cfg: cfg.weight_width))

_COLUMN = 40


def _int(value: int, hexa: bool = False) -> str:
    """A C integer literal (``u`` past ``INT_MAX``, parenthesised when negative)."""
    text = f"0x{value:02X}" if hexa and value >= 0 else str(value)
    if value > 0x7FFF_FFFF:
        text += "u"
    return f"({text})" if value < 0 else text


def _mask(shift: int, width: int) -> str:
    return f"0x{((1 << width) - 1) << shift:08X}u"


#: The fields whose ``None`` stands for a value derived from other fields: the property giving it.
RESOLVED = {"router_width": "router_operand_width", "logit_width": "router_logit_width",
            "logit_frac": "router_logit_frac"}


def config_value(cfg: KpuConfig, name: str):
    """Field ``name`` of ``cfg`` as the hardware sees it: a ``None`` resolved (:data:`RESOLVED`)."""
    value = getattr(cfg, name)
    return getattr(cfg, RESOLVED[name]) if value is None and name in RESOLVED else value


def _value(name: str, value) -> str:
    """A config value as a C literal."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return _int(value)
    if isinstance(value, float):
        text = repr(value)
        return f"({text})" if value < 0 else text
    if isinstance(value, str):
        return json.dumps(value)    # ASCII with C-compatible escapes
    raise TypeError(f"KpuConfig.{name} = {value!r}: no C literal for {type(value).__name__}")


def _sections(cfg: KpuConfig):
    """(title, [(macro name without the prefix, C text)]) of each part of the header."""
    regs = [(f"REG_{r.name}", _int(r.value, hexa=True)) for r in isa.Reg]
    regs += [(f"REG_BUSY_{e.upper()}", _int(isa.Reg.BUSY + 4 * i, hexa=True)) for i, e in enumerate(isa.EXECUTORS)]
    regs += [("IMEM_BASE", _int(isa.IMEM_BASE, hexa=True)), ("LOADS_BASE", _int(isa.LOADS_BASE, hexa=True)),
             ("ADDR_WIDTH", _int(isa.ADDR_WIDTH))]
    yield "AXI4-Lite register map (byte offsets); the instruction memory and the routing load counters", regs
    yield "executors, in busy counter order", (
        [(f"EXECUTOR_{e.upper()}", _int(i)) for i, e in enumerate(isa.EXECUTORS)]
        + [("N_EXECUTORS", _int(len(isa.EXECUTORS)))])
    status = []
    for name, field_ in isa.STATUS_LAYOUT:
        if name.startswith("reserved"):
            continue
        shift, width, field = field_.offset, field_.width, f"STATUS_{name.upper()}"
        status += [(f"{field}_SHIFT", _int(shift)), (f"{field}_WIDTH", _int(width)),
                   (f"{field}_MASK", _mask(shift, width)),
                   (f"{field}(s)", f"(((s) >> {shift}) & {_mask(0, width)})")]
    yield "STATUS fields", status
    yield "CTRL bits", [(f"CTRL_{name.upper()}", _mask(f.offset, f.width)) for name, f in isa.CTRL_LAYOUT]
    yield "opcodes", [(f"OP_{op.name}", _int(op.value)) for op in isa.Op]
    yield f"error codes ({PREFIX}STATUS_CODE)", [(f"ERR_{err.name}", _int(err.value)) for err in isa.Err]
    yield "instruction flags", [(name, _int(value, hexa=True)) for name, value in vars(isa).items()
                                if name.startswith("F_") and isinstance(value, int)]
    layout = [("INSTR_BITS", _int(isa.INSTR_BITS)), ("INSTR_WORDS", _int(isa.INSTR_WORDS)),
              ("INSTR_BYTES", _int(4 * isa.INSTR_WORDS))]
    for name, field in isa.INSTR_LAYOUT:
        layout += [(f"INSTR_{name.upper()}_SHIFT", _int(field.offset)),
                   (f"INSTR_{name.upper()}_WIDTH", _int(field.width))]
    yield ("instruction layout: bit SHIFT of instruction i is bit SHIFT % 32 of the 32-bit word at\n"
           f"   {PREFIX}IMEM_BASE + {PREFIX}INSTR_BYTES * i + 4 * (SHIFT / 32)"), layout
    yield f"config '{cfg.name}' (KpuConfig)", [
        (f.name.upper(), _value(f.name, config_value(cfg, f.name))) for f in dataclasses.fields(cfg)]
    yield "derived sizes", [(name.upper(), _int(fn(cfg))) for name, fn in DERIVED]


def c_header(cfg: KpuConfig, command: str) -> str:
    """The text of ``nanokpu.h`` for ``cfg``; ``command`` (e.g. ``nanokpu generate --profile tiny``)
    is named in its first comment."""
    guard = f"{PREFIX}H"
    lines = [f"/* nanokpu.h: generated by `{command}`; do not edit. */",
             "/* The host interface of the nano-KPU and the config its RTL was built from. */",
             "", f"#ifndef {guard}", f"#define {guard}"]
    seen: set[str] = set()
    for title, macros in _sections(cfg):
        lines += ["", f"/* {title} */"]
        for name, text in macros:
            key = name.split("(")[0]
            if key in seen:
                raise ValueError(f"{PREFIX}{key} is defined twice in the header")
            seen.add(key)
            lines.append(f"#define {PREFIX + name:<{_COLUMN}} {text}".rstrip())
    lines += ["", f"#endif /* {guard} */", ""]
    return "\n".join(lines)
