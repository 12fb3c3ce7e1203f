"""Where a synthesized design's resources go: its cells attributed to the design's parts.

Yosys' ``flatten`` keeps a cell's hierarchical path in its name (``gemm.array.pe_0_0.acc...``),
and the cells that technology mapping creates are named after the nets they drive, which carry
the same path. So the first component of a cell's name is the submodule of the unit it belongs
to; a cell without one is the unit's own logic. Attribution by name is approximate at the
edges (a LUT that joins two parts' nets is named after one of them) and exact for flip-flops,
block RAMs and DSPs of a part.

The unit's own logic is broken down further by signal (:func:`own_logic`): technology mapping
names a cell after a net it is connected to, plus the path to it (``busy_act[10]_SB_DFFSR_Q``:
the flip-flop of ``busy_act[10]``; ``busy_act[10]_SB_DFFSR_Q_D_SB_LUT4_O``: the LUT4 driving
its D input), so the signal at the front of the name is the register or net the cell computes
or, for a cell named after one of its inputs (``beat[0]_LUT4_C``), reads.

On iCE40 a part's logic cells (``lc``) are estimated the way nextpnr packs them: each LUT4
takes a cell; a flip-flop shares its LUT4's cell when that LUT4 drives its D input and nothing
else, and takes its own otherwise (fed by a flip-flop, a RAM, a DSP or a LUT4 with other loads);
a carry shares the cell of a LUT4 on the same two inputs, else takes its own. The sum over the
parts comes within a few per cent of nextpnr's count (exact for the flip-flops; the packer also
merges some LUT4s into carry cells and adds cells to legalise carry chains).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

__all__ = ["TOP", "UNNAMED", "breakdown", "markdown_parts", "own_logic"]

#: Part of the cells of the unit's own logic (not in a submodule).
TOP = "(top level)"

#: Signal of the unit's own cells that carry no signal name (``$abc$...``).
UNNAMED = "(unnamed)"
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
    module = _module(Path(netlist), top)

    def part(name):
        match = _PART.match(name)
        return match.group(1) if match else TOP

    return _count(module, part, cells, carry_luts, logic_cells)


def own_logic(netlist: Path, top: str, cells: dict[str, tuple[str, ...]], carry_luts: int = 0,
              logic_cells: bool = False, limit: int = 12) -> dict[str, dict[str, int]]:
    """The cells of the :data:`TOP` part of :func:`breakdown` (same arguments) by the signal
    at the front of their names (the module docstring), :data:`UNNAMED` for those without one:
    the ``limit`` signals with the most LUTs, largest first, then ``"(N others)"`` with the rest
    (when there are any)."""
    module = _module(Path(netlist), top)
    types = sorted({c["type"] for c in module["cells"].values()}, key=len, reverse=True)
    front = re.compile(r"\\?(.+?)(?:\[|_(?:" + "|".join(map(re.escape, types)) + r")(?:_|$)|$)")

    def signal(name):
        if _PART.match(name):
            return None
        return UNNAMED if name.startswith("$") else front.match(name).group(1)

    signals = _count(module, signal, cells, carry_luts, logic_cells)
    names = list(signals)
    if len(names) <= limit:
        return signals
    shown = {n: signals[n] for n in names[:limit]}
    rest: dict[str, int] = {}
    for n in names[limit:]:
        for kind, count in signals[n].items():
            rest[kind] = rest.get(kind, 0) + count
    shown[f"({len(names) - limit} others)"] = rest
    return shown


def _module(netlist: Path, top: str) -> dict:
    """Module ``top`` of the Yosys JSON ``netlist``, parsed once for :func:`breakdown` and
    :func:`own_logic` of the same file (a netlist can take 20 MB)."""
    stat = netlist.stat()
    return _parse(netlist.resolve(), stat.st_mtime_ns, stat.st_size)["modules"][top]


@functools.lru_cache(maxsize=1)
def _parse(netlist: Path, mtime_ns: int, size: int) -> dict:
    return json.loads(netlist.read_text())


def _count(module: dict, group, cells: dict[str, tuple[str, ...]], carry_luts: int,
           logic_cells: bool) -> dict[str, dict[str, int]]:
    """``{group(cell name): {kind: count}}`` over the counted cells of ``module`` (``group``
    returning ``None`` skips a cell), largest LUT count first (:func:`breakdown`'s kinds)."""
    kind_of = {t: kind for kind, types in cells.items() for t in types}
    shares = _sharing_cells(module) if logic_cells else set()
    groups: dict[str, dict[str, int]] = {}
    for name, cell in module["cells"].items():
        t = cell["type"]
        kind = "ff" if t.startswith("SB_DFF") or t == "TRELLIS_FF" else kind_of.get(t)
        key = None if kind is None else group(name)
        if key is None:
            continue
        counts = groups.setdefault(key, {})
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "carry" and carry_luts:
            counts["lut"] = counts.get("lut", 0) + carry_luts
        if logic_cells and kind in ("lut", "ff", "carry") and name not in shares:
            counts["lc"] = counts.get("lc", 0) + 1
    return dict(sorted(groups.items(), key=lambda kv: -kv[1].get("lut", 0)))


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
    """A table of ``report["parts"]`` (from :func:`breakdown`) against the unit's totals, then
    one of ``report["own_logic"]`` (:func:`own_logic`) against its own logic, or ``""`` when
    the report has no parts."""
    parts = report.get("parts")
    if not parts:
        return ""
    where = f"`{report['name']}` ({report.get('profile', '-')}, {report['target']})"
    text = _table(f"part of {where}", parts, "**all**")
    own = report.get("own_logic")
    if own and len(parts) > 1:
        text += "\n" + _table(f"own logic of {where}, by signal", own, f"**{TOP}**")
    return text


def _table(title: str, groups: dict[str, dict[str, int]], total_name: str) -> str:
    kinds = [k for k in ("lut", "lc", "carry", "ff", "dsp", "bram", "spram") if any(k in p for p in groups.values())]
    total = {k: sum(p.get(k, 0) for p in groups.values()) for k in kinds}
    lines = [f"| {title} | " + " | ".join(k.upper() for k in kinds) + " |",
             "|---|" + "---:|" * len(kinds)]
    for name, counts in groups.items():
        cols = [f"{counts.get(k, 0)} ({100 * counts.get(k, 0) / total[k]:.0f}%)" if total[k] else "0" for k in kinds]
        lines.append(f"| {name} | " + " | ".join(cols) + " |")
    lines.append(f"| {total_name} | " + " | ".join(f"**{total[k]}**" for k in kinds) + " |")
    return "\n".join(lines) + "\n"
