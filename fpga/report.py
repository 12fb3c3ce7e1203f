"""Synthesis reports as data (JSON), as a table (Markdown) and as a picture (bar chart PNG).

Input: the report dicts of :func:`fpga.flow.synthesize`, one per unit and target.
"""

from __future__ import annotations

import json
from pathlib import Path

from fpga.breakdown import markdown_parts

__all__ = ["total_row", "markdown_table", "critical_path_text", "peak_macs", "format_rate", "write_reports",
           "write_chart", "read_baseline", "compare_table"]

_KINDS = ("lut", "lc", "ff", "dsp", "bram")
_XMAX = 125  # % of the device shown; longer bars are cut


def total_row(reports: list[dict]) -> dict:
    """Sum of the units' resources on one target (the design until a single top level exists)."""
    first = reports[0]
    keys = sorted({k for r in reports for k in r["resources"]})
    return {"name": "all units (sum)", "profile": first.get("profile", "-"), "target": first["target"],
            "family": first["family"],
            "totals": first["totals"],
            "resources": {k: sum(r["resources"].get(k, 0) for r in reports) for k in keys},
            "latches": sum(r["latches"] for r in reports),
            "unmapped": {t: n for r in reports for t, n in r["unmapped"].items()}}


def _frac(used: int, total: int) -> str:
    return f"{used}/{total} ({100 * used / total:.0f}%)" if total else str(used)


def critical_path_text(p: dict | None) -> str:
    """A nextpnr critical path (``report["pnr"]["critical_path"]``) as Markdown: start -> end,
    delay split into logic and routing; ``""`` for none."""
    if not p:
        return ""
    return (f"`{p['start']}` → `{p['end']}` ({p['delay_ns']:.1f} ns: "
            f"{p['logic_ns']:.1f} logic, {p['routing_ns']:.1f} routing)")


def peak_macs(report: dict) -> float | None:
    """Peak multiply-accumulates per second of a placed and routed unit with a systolic array:
    its ``macs_per_cycle`` (exact) times the measured Fmax; ``None`` for other units."""
    fmax = (report.get("pnr") or {}).get("fmax_mhz")
    macs = report.get("macs_per_cycle")
    return macs * fmax * 1e6 if macs and fmax else None


def format_rate(per_s: float | None) -> str:
    """Operations per second as ``"524 M"`` or ``"6.53 G"``; ``"-"`` for ``None``."""
    if per_s is None:
        return "-"
    return f"{per_s / 1e9:.2f} G" if per_s >= 1e9 else f"{per_s / 1e6:.0f} M"


def markdown_table(reports: list[dict]) -> str:
    """One row per report: resources against the part, Fmax against the goal, peak MAC/s (units
    with an array), the timing flow and the nextpnr seed of the result, critical path."""
    lines = ["| unit | profile | target | LUT4 | logic cells | FF | DSP | BRAM | SPRAM | latches | unmapped "
             "| Fmax (MHz) | goal | peak MAC/s | timing flow | seed | critical path |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        res, tot = r["resources"], r["totals"]
        pnr = r.get("pnr") or {}
        fmax = pnr.get("fmax_mhz")
        met = "" if not pnr else ("met" if pnr.get("met") else "**missed**")
        spram = _frac(res.get("spram", 0), tot["spram"]) if tot.get("spram") else "-"
        lc = _frac(res["lc"], tot["lc"]) if "lc" in tot and "lc" in res else "-"
        lines.append(
            f"| {r['name']} | {r.get('profile', '-')} | {r['target']} | {_frac(res['lut'], tot['lut'])} | {lc} | "
            f"{_frac(res['ff'], tot['ff'])} | {_frac(res['dsp'], tot['dsp'])} | "
            f"{_frac(res['bram'], tot['bram'])} | {spram} | {r['latches']} | "
            f"{sum(r['unmapped'].values())} | {fmax if fmax is not None else '-'} | "
            f"{pnr.get('goal_mhz', '-')} {met} | {format_rate(peak_macs(r))} | {pnr.get('flow', '-')} | "
            f"{pnr['seed'] if pnr.get('seed') is not None else '-'} | "
            f"{critical_path_text(pnr.get('critical_path')) or pnr.get('error', '').replace('|', '&#124;')} |")
    return "\n".join(lines) + "\n"


def write_chart(reports: list[dict], path: Path, title: str) -> Path:
    """Horizontal bars: each unit's LUT/LC (iCE40 logic cells)/FF/DSP/BRAM use as a percentage of
    the part."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{r['name']} ({r.get('profile', '-')}, {r['target']})" for r in reports]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.3 * len(reports) * len(_KINDS) / 2), layout="constrained")
    height = 0.8 / len(_KINDS)
    for k, kind in enumerate(_KINDS):
        pct = [100 * r["resources"].get(kind, 0) / r["totals"][kind] if r["totals"].get(kind) else 0
               for r in reports]
        ys = [i + k * height for i in range(len(reports))]
        bars = ax.barh(ys, [min(p, _XMAX) for p in pct], height=height, label=kind.upper())
        for bar, r, p in zip(bars, reports, pct, strict=True):  # over the device: bar cut, text bold
            if kind not in r["resources"] or not r["totals"].get(kind):
                continue  # LC: iCE40 only
            ax.text(min(bar.get_width(), _XMAX - 12) + 0.5, bar.get_y() + height / 2,
                    f"{r['resources'][kind]}/{r['totals'][kind]}", va="center", fontsize=7,
                    fontweight="bold" if p > 100 else "normal", in_layout=False)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(reports))], names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, _XMAX)
    ax.axvline(100, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("% of the device")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_reports(reports: list[dict], out_dir: Path, stem: str, command: str,
                  whole: str | None = "kpu") -> list[Path]:
    """``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` in ``out_dir``; returns the paths.

    Each (profile, target) group of units gets a :func:`total_row` unless it holds the unit named
    ``whole`` (the top level, which is the whole design itself). The Markdown ends with the
    :func:`~fpga.breakdown.markdown_parts` tables of every unit made of submodules.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple, list[dict]] = {}
    for r in reports:
        groups.setdefault((r.get("profile"), r["target"]), []).append(r)
    rows = []
    for group in groups.values():
        rows += group
        if len(group) > 1 and not any(r["name"] == whole for r in group):
            rows.append(total_row(group))
    js = out_dir / f"{stem}.json"
    js.write_text(json.dumps({"command": command, "reports": reports}, indent=1) + "\n")
    md = out_dir / f"{stem}.md"
    png = write_chart(rows, out_dir / f"{stem}.png", stem)
    parts = [markdown_parts(r) for r in reports if len(r.get("parts", {})) > 1]
    where = ("\n## Where the resources go\n\nEach unit's cells by the submodule whose name they carry "
             "(`fpga.breakdown`; \"(top level)\": the unit's own logic), share of the unit in brackets; "
             "then the unit's own logic by the signal at the front of the cells' names (the register "
             "or net a cell computes, or reads), its largest signals first.\n\n"
             + "\n".join(parts)) if parts else ""
    md.write_text(f"# Synthesis: {stem}\n\nMade by `{command}`.\n\n" + markdown_table(rows)
                  + f"\n![resource use]({png.name})\n\nLogs: `fpga/build/<profile>-<target>-<unit>/`"
                  " (Yosys `*.yosys.log`, nextpnr `*.nextpnr.log`, one per seed tried, `report.json`).\n" + where)
    return [js, md, png]


def read_baseline(path: Path) -> list[dict]:
    """The report dicts of a ``<stem>.json`` that :func:`write_reports` wrote; raises
    ``ValueError`` naming ``against`` (the ``nanokpu synth`` flag) when it is missing or not one."""
    try:
        return json.loads(Path(path).read_text())["reports"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"against = {str(path)!r}: not a synthesis report JSON ({exc})") from exc


def _unit_key(report: dict) -> tuple:
    return report["name"], report.get("profile"), report["target"]


def _change(new: float | None, old: float | None, digits: int = 0) -> str:
    if new is None:
        return "-"
    text = f"{new:.{digits}f}" if digits else f"{new}"
    if old is None or round(new - old, digits) == 0:
        return text
    return f"{text} ({new - old:+.{digits}f})" if digits else f"{text} ({new - old:+})"


def compare_table(reports: list[dict], baseline: list[dict], *, parts: int = 6) -> str:
    """Markdown: each unit of ``reports`` with its LUTs, logic cells (iCE40), FFs, DSPs, block
    RAMs and Fmax, the change against the report of the same unit, profile and target in
    ``baseline`` in brackets (``new`` when it has none); then, per unit whose submodules
    changed, the ``parts`` largest changes of their logic cells (iCE40) or LUTs
    (:func:`fpga.breakdown.breakdown`)."""
    before = {_unit_key(r): r for r in baseline}
    lines = ["| unit | profile | target | LUT | LC | FF | DSP | BRAM | Fmax (MHz) | against |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    moved = []
    for r in reports:
        old = before.get(_unit_key(r))
        res, was = r["resources"], (old or {}).get("resources", {})
        cells = [_change(res.get(k), was.get(k)) if k in res else "-" for k in _KINDS]
        fmax = _change((r.get("pnr") or {}).get("fmax_mhz"), ((old or {}).get("pnr") or {}).get("fmax_mhz"), 2)
        same = old is not None and all(res.get(k) == was.get(k) for k in _KINDS) and "(" not in fmax
        status = "new" if old is None else "unchanged" if same else "changed"
        lines.append(f"| {r['name']} | {r.get('profile', '-')} | {r['target']} | " + " | ".join(cells)
                     + f" | {fmax} | {status} |")
        if old is None:
            continue
        kind = "lc" if "lc" in res else "lut"
        names = set(r.get("parts", {})) | set(old.get("parts", {}))
        deltas = {n: r.get("parts", {}).get(n, {}).get(kind, 0) - old.get("parts", {}).get(n, {}).get(kind, 0)
                  for n in names}
        changed = sorted((n for n in deltas if deltas[n]), key=lambda n: (-abs(deltas[n]), n))
        if changed:
            moved.append(f"- `{r['name']}` ({r.get('profile', '-')}, {r['target']}), {kind.upper()} by part: "
                         + ", ".join(f"{n} {deltas[n]:+}" for n in changed[:parts])
                         + (f" ({len(changed) - parts} more)" if len(changed) > parts else ""))
    return "\n".join(lines + ([""] + moved if moved else [])) + "\n"
