"""Where a synthesized design's resources go: its cells attributed to the design's parts.

Yosys' ``flatten`` keeps a cell's hierarchical path in its name (``gemm.array.pe_0_0.acc...``),
and the cells that technology mapping creates are named after the nets they drive, which carry
the same path. So the first component of a cell's name is the submodule of the unit it belongs
to; a cell without one is the unit's own logic. Attribution by name is approximate at the
edges (a LUT that joins two parts' nets is named after one of them) and exact for flip-flops,
block RAMs and DSPs of a part.

On iCE40 a part's logic cells (``lc``) are estimated the way nextpnr packs them: each LUT4
takes a cell; a flip-flop shares its LUT4's cell when that LUT4 drives its D input and nothing
else, and takes its own otherwise (fed by a flip-flop, a RAM, a DSP or a LUT4 with other loads);
a carry shares the cell of a LUT4 on the same two inputs, else takes its own. The sum over the
parts comes within a few per cent of nextpnr's count (exact for the flip-flops; the packer also
merges some LUT4s into carry cells and adds cells to legalise carry chains).
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
              carry_luts: int = 0, logic_cells: bool = False) -> dict[str, dict[str, int]]:
    """Resources per part of the Yosys JSON ``netlist`` of module ``top`` (the unit, synthesized
    alone).

    ``cells`` maps a resource kind to the cell types counted as it (``fpga.flow._CELLS`` of the
    family); flip-flops (``ff``) are the SB_DFF* / TRELLIS_FF cells; a ``carry`` cell also
    counts as ``carry_luts`` LUTs (2 for ECP5's CCU2C, which nextpnr packs as two LUT4s). With
    ``logic_cells`` (iCE40), each part also gets ``lc``, its estimated logic cells (see the
    module docstring). Returns ``{part: {kind: count}}`` for every part with at least one
    counted cell, the top level's under :data:`TOP`, largest LUT count first. A kind a part does
    not use is absent from its dict.
    """
    kind_of = {t: kind for kind, types in cells.items() for t in types}
    module = json.loads(netlist.read_text())["modules"][top]
    shares = _sharing_cells(module) if logic_cells else set()
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
        if logic_cells and kind in ("lut", "ff", "carry") and name not in shares:
            counts["lc"] = counts.get("lc", 0) + 1
    return dict(sorted(parts.items(), key=lambda kv: -kv[1].get("lut", 0)))


def _sharing_cells(module: dict) -> set[str]:
    """Names of the iCE40 flip-flops and carries that share a LUT4's logic cell (the module
    docstring's rule)."""
    cells = module["cells"]
    driver, loads = {}, {}
    for name, cell in cells.items():
        for port, bits in cell["connections"].items():
            output = cell.get("port_directions", {}).get(port) == "output"
            for bit in bits:
                if isinstance(bit, int):
                    if output:
                        driver[bit] = name
                    else:
                        loads[bit] = loads.get(bit, 0) + 1
    for port in module.get("ports", {}).values():  # a module output is a load too
        if port["direction"] == "output":
            for bit in port["bits"]:
                if isinstance(bit, int):
                    loads[bit] = loads.get(bit, 0) + 1
    lut_inputs = {frozenset((c["connections"]["I1"][0], c["connections"]["I2"][0]))
                  for c in cells.values() if c["type"] == "SB_LUT4"}
    shared = set()
    for name, cell in cells.items():
        if cell["type"].startswith("SB_DFF"):
            d = cell["connections"]["D"][0]
            if loads.get(d) == 1 and cells.get(driver.get(d), {}).get("type") == "SB_LUT4":
                shared.add(name)
        elif cell["type"] == "SB_CARRY":
            if frozenset((cell["connections"]["I0"][0], cell["connections"]["I1"][0])) in lut_inputs:
                shared.add(name)
    return shared


def markdown_parts(report: dict) -> str:
    """A table of ``report["parts"]`` (from :func:`breakdown`) against the unit's totals, or
    ``""`` when the report has no parts."""
    parts = report.get("parts")
    if not parts:
        return ""
    kinds = [k for k in ("lut", "lc", "carry", "ff", "dsp", "bram", "spram") if any(k in p for p in parts.values())]
    total = {k: sum(p.get(k, 0) for p in parts.values()) for k in kinds}
    lines = [f"| part of `{report['name']}` ({report.get('profile', '-')}, {report['target']}) | "
             + " | ".join(k.upper() for k in kinds) + " |",
             "|---|" + "---:|" * len(kinds)]
    for name, counts in parts.items():
        cols = [f"{counts.get(k, 0)} ({100 * counts.get(k, 0) / total[k]:.0f}%)" if total[k] else "0" for k in kinds]
        lines.append(f"| {name} | " + " | ".join(cols) + " |")
    lines.append("| **all** | " + " | ".join(f"**{total[k]}**" for k in kinds) + " |")
    return "\n".join(lines) + "\n"
