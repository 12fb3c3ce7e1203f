"""Resources per part of a synthesized unit (fpga/breakdown.py), on a small two-MAC design."""

import json

import pytest
from amaranth import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from fpga.breakdown import TOP, UNNAMED, breakdown, markdown_parts, own_logic
from fpga.flow import BUILD_DIR, synthesize
from fpga.report import write_reports


class Mac(wiring.Component):
    """``acc <= acc + a*b`` with registered operands and a registered output: the multiplier
    and the accumulator are inside (a register driving a port takes the parent's net name)."""

    def __init__(self):
        super().__init__({"a": In(signed(8)), "b": In(signed(8)), "acc": Out(signed(32))})

    def elaborate(self, platform):
        m = Module()
        ra, rb, prod, acc = Signal(signed(8)), Signal(signed(8)), Signal(signed(16)), Signal(signed(32))
        m.d.comb += prod.eq(ra * rb)
        m.d.sync += [ra.eq(self.a), rb.eq(self.b), acc.eq(acc + prod), self.acc.eq(acc)]
        return m


class TwoMacs(wiring.Component):
    """Two MACs (submodules ``left`` and ``right``) and an adder of their own."""

    def __init__(self):
        super().__init__({"a": In(signed(8)), "b": In(signed(8)), "sum": Out(signed(33))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.left = left = Mac()
        m.submodules.right = right = Mac()
        total = Signal(signed(33))
        m.d.comb += [left.a.eq(self.a), left.b.eq(self.b), right.a.eq(self.b), right.b.eq(self.b)]
        m.d.sync += total.eq(left.acc + right.acc)
        m.d.comb += self.sum.eq(total)
        return m


def test_breakdown_attributes_cells_by_hierarchical_name(tmp_path):
    netlist = {"modules": {"top": {"cells": {
        "gemm.array.pe_0_0.acc_SB_DFF_Q": {"type": "SB_DFF"},
        "gemm.x_SB_LUT4_O": {"type": "SB_LUT4"},
        "gemm.x_SB_CARRY_CO": {"type": "SB_CARRY"},
        "\\router.bias.0.0": {"type": "SB_RAM40_4K"},
        "$abc$12$auto$lut": {"type": "SB_LUT4"},
        "pc[3]_SB_DFFESR_Q": {"type": "SB_DFFESR"},
        "gemm.$scopeinfo": {"type": "$scopeinfo"},          # bookkeeping: not counted
    }}}}
    path = tmp_path / "n.json"
    path.write_text(json.dumps(netlist))
    cells = {"lut": ("SB_LUT4",), "carry": ("SB_CARRY",), "bram": ("SB_RAM40_4K",)}
    parts = breakdown(path, "top", cells)
    assert parts == {"gemm": {"ff": 1, "lut": 1, "carry": 1}, TOP: {"lut": 1, "ff": 1}, "router": {"bram": 1}}
    assert list(parts) == ["gemm", TOP, "router"]        # largest LUT count first
    table = markdown_parts({"name": "kpu", "profile": "tiny", "target": "up5k", "parts": parts})
    assert "| part of `kpu` (tiny, up5k) | LUT | CARRY | FF | BRAM |" in table
    assert "| gemm | 1 (50%) | 1 (100%) | 1 (50%) | 0 (0%) |" in table
    assert "| **all** | **2** | **1** | **2** | **1** |" in table
    assert markdown_parts({"name": "x", "target": "up5k"}) == ""


def test_own_logic_groups_the_top_level_cells_by_signal(tmp_path):
    """A cell's signal is its name up to the first bit index or cell type: the register a
    flip-flop holds, the net a LUT4 computes (through the path in its name) or reads; cells
    of submodules are not the unit's own."""
    netlist = {"modules": {"top": {"cells": {
        "busy_act[0]_SB_DFFSR_Q": {"type": "SB_DFFSR"},
        "busy_act[10]_SB_DFFSR_Q_D_SB_LUT4_O": {"type": "SB_LUT4"},
        "busy_act_SB_CARRY_CO": {"type": "SB_CARRY"},
        "a_in__valid_SB_LUT4_I2_O_SB_LUT4_O": {"type": "SB_LUT4"},
        "a_in__valid_SB_LUT4_I1": {"type": "SB_LUT4"},
        "lane_x": {"type": "SB_DFF"},
        "$abc$12$auto$lut": {"type": "SB_LUT4"},
        "gemm.x_SB_LUT4_O": {"type": "SB_LUT4"},             # the gemm part's
    }}}}
    path = tmp_path / "n.json"
    path.write_text(json.dumps(netlist))
    cells = {"lut": ("SB_LUT4",), "carry": ("SB_CARRY",)}
    own = own_logic(path, "top", cells)
    assert own == {"a_in__valid": {"lut": 2}, "busy_act": {"ff": 1, "lut": 1, "carry": 1},
                   UNNAMED: {"lut": 1}, "lane_x": {"ff": 1}}
    assert list(own)[0] == "a_in__valid"                  # largest LUT count first
    assert own_logic(path, "top", cells, limit=2) == {
        "a_in__valid": {"lut": 2}, "busy_act": {"ff": 1, "lut": 1, "carry": 1}, "(2 others)": {"lut": 1, "ff": 1}}
    parts = breakdown(path, "top", cells)
    assert {k: sum(g.get(k, 0) for g in own.values()) for k in parts[TOP]} == parts[TOP]
    table = markdown_parts({"name": "kpu", "target": "up5k", "parts": parts, "own_logic": own})
    assert "| own logic of `kpu` (-, up5k), by signal | LUT | CARRY | FF |" in table
    assert "| busy_act | 1 (25%) | 1 (100%) | 1 (50%) |" in table
    assert "| **(top level)** | **4** | **1** | **2** |" in table


@pytest.mark.parametrize("target", ["up5k", "ecp5-25f"])
def test_parts_of_a_synthesized_unit_add_up_to_its_resources(target, tmp_path):
    report = synthesize(TwoMacs(), "test_two_macs", target, build_dir=BUILD_DIR / f"test-{target}-two-macs")
    parts = report["parts"]
    assert parts["left"]["dsp"] == parts["right"]["dsp"] == 1, parts
    assert TOP in parts and "dsp" not in parts[TOP], parts      # the final adder is the top level's
    for kind in ("lut", "ff", "dsp"):
        assert sum(p.get(kind, 0) for p in parts.values()) == report["resources"][kind], kind
    if target == "up5k":  # the estimated logic cells against nextpnr's packer
        lc = sum(p.get("lc", 0) for p in parts.values())
        assert lc >= report["resources"]["lut"] and abs(lc - report["resources"]["lc"]) <= 2, (lc, report)
    else:
        assert not any("lc" in p for p in parts.values())
    write_reports([report], tmp_path, "two", "test")
    md = (tmp_path / "two.md").read_text()
    assert "## Where the resources go" in md and f"| part of `test_two_macs` (-, {target}) |" in md
    own = report["own_logic"]     # the final adder's register and its carry chain
    assert "total" in own and own["total"]["ff"] == 33, own
    for kind, count in parts[TOP].items():
        assert sum(g.get(kind, 0) for g in own.values()) == count, (kind, own)
    assert f"| own logic of `test_two_macs` (-, {target}), by signal |" in md


def test_reused_report_without_parts_gets_them_from_its_netlist():
    build = BUILD_DIR / "test-up5k-two-macs-reuse"
    first = synthesize(TwoMacs(), "test_two_macs", "up5k", build_dir=build)
    on_disk = json.loads((build / "report.json").read_text())
    del on_disk["parts"], on_disk["own_logic"]      # a report written before they existed
    (build / "report.json").write_text(json.dumps(on_disk))
    again = synthesize(TwoMacs(), "test_two_macs", "up5k", build_dir=build, reuse=True)
    assert again["elapsed_s"] == first["elapsed_s"] and again["parts"] == first["parts"]
    assert again["own_logic"] == first["own_logic"]


def test_logic_cells_follow_the_packing_rule(tmp_path):
    """A flip-flop shares the cell of the LUT4 that drives only it; a carry shares the cell of a
    LUT4 on its two inputs; everything else takes a cell of its own."""
    def cell(t, **conn):
        dirs = {p: "output" if p in ("O", "Q", "CO") else "input" for p in conn}
        return {"type": t, "connections": {p: [b] for p, b in conn.items()}, "port_directions": dirs}

    netlist = {"modules": {"top": {"ports": {"q": {"direction": "output", "bits": [7]}}, "cells": {
        "a.lut": cell("SB_LUT4", I0=1, I1=2, I2=3, I3=4, O=5),
        "a.ff": cell("SB_DFF", D=5, Q=6),             # shares a.lut's cell: its only load
        "a.copy": cell("SB_DFF", D=6, Q=7),           # fed by a flip-flop: a cell of its own
        "b.lut": cell("SB_LUT4", I0=1, I1=2, I2=3, I3=4, O=8),
        "b.ff": cell("SB_DFF", D=8, Q=9),             # b.lut also drives b.other: its own cell
        "b.other": cell("SB_LUT4", I0=8, I1=1, I2=1, I3=1, O=10),
        "c.carry": cell("SB_CARRY", I0=2, I1=3, CI=11, CO=12),   # on a.lut's I1, I2: shares
        "c.cmp": cell("SB_CARRY", I0=6, I1=9, CI=12, CO=13),     # a comparison: its own cell
    }}}}
    path = tmp_path / "n.json"
    path.write_text(json.dumps(netlist))
    cells = {"lut": ("SB_LUT4",), "carry": ("SB_CARRY",)}
    parts = breakdown(path, "top", cells, logic_cells=True)
    assert {k: v["lc"] for k, v in parts.items()} == {"a": 2, "b": 3, "c": 1}
    assert all("lc" not in v for v in breakdown(path, "top", cells).values())
