"""Where a synthesized design's resources go: its cells attributed to the design's parts.

Yosys' ``flatten`` keeps a cell's hierarchical path in its name (``gemm.array.pe_0_0.acc...``),
and the cells that technology mapping creates are named after the nets they drive, which carry
the same path. So the first component of a cell's name is the submodule of the unit it belongs
to; a cell without one is the unit's own logic. Attribution by name is approximate at the
edges (a LUT that joins two parts' nets is named after one of them) and exact for flip-flops,
block RAMs and DSPs of a part.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["TOP", "breakdown", "markdown_parts"]

#: Part of the cells of the unit's own logic (not in a submodule).
TOP = "(top level)"
_PART = re.compile(r"\\?([A-Za-z_][A-Za-z0-9_]*)\.")


def breakdown(netlist: Path, top: str, cells: dict[str, tuple[str, ...]],
              carry_luts: int = 0) -> dict[str, dict[str, int]]:
    """Resources per part of the Yosys JSON ``netlist`` of module ``top`` (the unit, synthesized
    alone).

    ``cells`` maps a resource kind to the cell types counted as it (``fpga.flow._CELLS`` of the
    family); flip-flops (``ff``) are the SB_DFF* / TRELLIS_FF cells; a ``carry`` cell also
    counts as ``carry_luts`` LUTs (2 for ECP5's CCU2C, which nextpnr packs as two LUT4s). Returns ``{part: {kind:
    count}}`` for every part with at least one counted cell, the top level's under :data:`TOP`,
    largest LUT count first. A kind a part does not use is absent from its dict.
    """
    kind_of = {t: kind for kind, types in cells.items() for t in types}
    module = json.loads(netlist.read_text())["modules"][top]
    parts: dict[str, dict[str, int]] = {}
    for name, cell in module["cells"].items():
        t = cell["type"]
        kind = "ff" if t.startswith("SB_DFF") or t == "TRELLIS_FF" else kind_of.get(t)
        if kind is None:
            continue
        match = _PART.match(name)
        counts = parts.setdefault(match.group(1) if match else TOP, {})
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "carry" and carry_luts:
            counts["lut"] = counts.get("lut", 0) + carry_luts
    return dict(sorted(parts.items(), key=lambda kv: -kv[1].get("lut", 0)))


def markdown_parts(report: dict) -> str:
    """A table of ``report["parts"]`` (from :func:`breakdown`) against the unit's totals, or
    ``""`` when the report has no parts."""
    parts = report.get("parts")
    if not parts:
        return ""
    kinds = [k for k in ("lut", "carry", "ff", "dsp", "bram", "spram") if any(k in p for p in parts.values())]
    total = {k: sum(p.get(k, 0) for p in parts.values()) for k in kinds}
    lines = [f"| part of `{report['name']}` ({report.get('profile', '-')}, {report['target']}) | "
             + " | ".join(k.upper() for k in kinds) + " |",
             "|---|" + "---:|" * len(kinds)]
    for name, counts in parts.items():
        cols = [f"{counts.get(k, 0)} ({100 * counts.get(k, 0) / total[k]:.0f}%)" if total[k] else "0" for k in kinds]
        lines.append(f"| {name} | " + " | ".join(cols) + " |")
    lines.append("| **all** | " + " | ".join(f"**{total[k]}**" for k in kinds) + " |")
    return "\n".join(lines) + "\n"
