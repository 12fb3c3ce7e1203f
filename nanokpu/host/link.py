"""Programs placed one after another in one instruction memory and one host image.

Each part is a compiled program (``instrs`` ending in ``HALT``, a host ``image``, its ``symbols``:
byte offsets of its buffers). :func:`link` drops every part's ``HALT`` but the last, moves each
part's jump targets (``JUMP``, ``EXPERT``) by the instructions before it and its host addresses
(the ops whose :data:`~nanokpu.isa.OP_RULES` entry moves host bytes) by the image bytes before it,
and binds buffers: an input buffer of a later part named in ``binds`` is read from an earlier
part's output buffer instead (the same words: a ``STORE`` of int32 words, a ``LOAD`` of ``width``
4). The parts share the scratchpad in time: each part's buffers are dead when the next starts, so
they may overlap.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nanokpu.isa import OP_RULES, Op

__all__ = ["Part", "Linked", "link"]


@dataclass(frozen=True)
class Part:
    """A compiled program to link: ``name`` (the prefix of its symbols), ``instrs``, ``image``,
    ``symbols``."""

    name: str
    instrs: list
    image: bytes
    symbols: dict


@dataclass
class Linked:
    """The linked program: ``instrs``, ``image``, ``symbols`` (``"<part>.<buffer>"`` -> byte offset)."""

    instrs: list
    image: bytearray
    symbols: dict


def link(parts, binds: dict | None = None, align: int = 4) -> Linked:
    """Link ``parts`` (a list of :class:`Part`) in order; ``binds`` maps ``"<part>.<buffer>"`` of a
    later part to ``"<part>.<buffer>"`` of an earlier one: every host address of the first in the
    later part's instructions becomes the second's. ``align``: the bus's bytes (every image is
    padded to it). ``ValueError`` naming the part or symbol when a part does not end in ``HALT``, a
    name repeats, or a bind names an unknown buffer or one of a later part."""
    binds = dict(binds or {})
    names = [p.name for p in parts]
    if len(set(names)) != len(names) or not parts:
        raise ValueError(f"parts: names {names} must be distinct and at least one")
    bases, symbols, order, at = [], {}, {}, 0
    for index, part in enumerate(parts):
        if not part.instrs or part.instrs[-1].op != Op.HALT:
            raise ValueError(f"part {part.name!r}: its program must end in HALT")
        bases.append(at)
        for sym, offset in part.symbols.items():
            symbols[f"{part.name}.{sym}"], order[f"{part.name}.{sym}"] = at + offset, index
        at += len(part.image) + (-len(part.image) % align)
    for later, earlier in binds.items():
        if later not in symbols or earlier not in symbols:
            raise ValueError(f"binds: {later!r} -> {earlier!r}: unknown buffer (known: {sorted(symbols)})")
        if order[earlier] >= order[later]:
            raise ValueError(f"binds: {later!r} -> {earlier!r}: the buffer bound to must be of an earlier part")
    instrs, image = [], bytearray()
    for index, part in enumerate(parts):
        base_pc, base = len(instrs), bases[index]
        image += bytes(part.image) + bytes(-len(part.image) % align)
        local = {offset: f"{part.name}.{sym}" for sym, offset in part.symbols.items()}
        for ins in part.instrs if index == len(parts) - 1 else part.instrs[:-1]:
            rule = OP_RULES.get(ins.op)
            changes = {}
            if rule is not None and rule.target:
                changes["target"] = ins.target + base_pc
            if rule is not None and rule.host:
                bound = binds.get(local.get(ins.host, ""))
                changes["host"] = ins.host + base if bound is None else symbols[bound]
            instrs.append(dataclasses.replace(ins, **changes) if changes else ins)
    return Linked(instrs, image, symbols)
