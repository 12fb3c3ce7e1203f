"""``nanokpu bench-gemm``: LatentMoE-shaped GEMMs on the RTL GEMM engine (Verilator), timed.

For each profile the GEMMs of one LatentMoE block (``T`` tokens; the routed expert GEMMs
with the average ``T * top_k / n_experts`` tokens per expert) run through
``sim/bench_gemm.py::test_exact_cycles``: sources never idle, the sink never stalls, every
result is checked bit for bit against :mod:`golden.intops` and every cycle count against
:func:`nanokpu.units.gemm.gemm_cycles`. Per shape it reports cycles (command accepted
to ``done``, loading A and B and storing the results included), ideal cycles
``M*K*N / (rows*cols)``, utilisation = ideal / cycles (Gemmini's definition) and the
simulation speed in cycles per wall-clock second, and writes ``docs/bench/gemm.md``.

The profiles of :data:`ICE40` are timed a second time as built for the iCE40 UP5K (``dsp =
"ice40"``: the array's products in SB_MAC16 blocks, simulated with Yosys' own model, and the
bit-serial requantiser), each shape also without its store; that table gives MAC/cycle and,
when ``fpga/reports/<profile>-up5k.json`` holds a placed and routed GEMM engine, MAC/s at its
measured Fmax (:func:`up5k_fmax`).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from nanokpu.commands import DOCS
from nanokpu.commands.args import out_file, seed
from nanokpu.commands.progress import add_quiet
from nanokpu.config import KpuConfig, profile
from nanokpu.host.compiler import block_gemms
from nanokpu.units.requant import requant_interval

#: Tokens per block for each benchmarked profile.
TOKENS = {"tiny": 16, "small": 64}

#: Profiles also timed with ``dsp = "ice40"`` (their UP5K build).
ICE40 = ("tiny",)

DOC = DOCS / "bench" / "gemm.md"


def breakdown(cfg: KpuConfig, m: int, k: int, n: int) -> dict[str, int]:
    """Where the cycles of :func:`nanokpu.units.gemm.gemm_cycles` go (they sum to it)."""
    from nanokpu.units.gemm import store_tail, tile_gap
    from nanokpu.units.systolic import done_latency

    gap = tile_gap(cfg)
    mb, nb = -(-m // cfg.rows), -(-n // cfg.cols)
    tiles = mb * nb
    steps = tiles * k
    useful = m * k * n / (cfg.rows * cfg.cols)
    return {
        "useful": useful,
        "edge": steps - useful,                          # padded rows/columns of edge tiles
        "gap": (tiles - 1) * (max(k, gap) - k),          # tiles shorter than the drain rule
        "fill": (mb + 3) + 1,                            # command check + first words
        "drain": done_latency(cfg) + cfg.cols + 4,       # last step through array and drain
        "store": store_tail(cfg, m, k, n),               # results out after the compute
    }


def run_profile(name: str, seed: int, dsp: str = "generic") -> tuple[KpuConfig, list[dict]]:
    """Time the block's GEMMs of profile ``name`` built with ``dsp`` on Verilator (``ice40``:
    with Yosys' SB_MAC16 model, and each shape also without store, ``cycles_compute``)."""
    from nanokpu.units.gemm import GemmEngine
    from sim.runner import run_bench, vendor_build_args

    cfg = profile(name, dsp=dsp)
    gemms = block_gemms(cfg, TOKENS[name])
    params = {"seed": seed, "timing": [[m, k, n] for _, m, k, n in gemms]}
    if dsp == "ice40":
        params |= {"compute_only": True}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        run_bench(GemmEngine(cfg), "gemm", "bench_gemm", testcase="test_exact_cycles", seed=seed,
                  params={**params, "report": str(report)}, build_args=vendor_build_args(dsp))
        rows = json.loads(report.read_text())
    for (label, *_), row in zip(gemms, rows, strict=True):
        row["name"] = label
        row["ideal"] = row["m"] * row["k"] * row["n"] / (cfg.rows * cfg.cols)
        row["util"] = row["ideal"] / row["cycles"]
        row["rate"] = row["cycles"] / row["wall"]
        row["parts"] = breakdown(cfg, row["m"], row["k"], row["n"])
    return cfg, rows


def up5k_fmax(name: str) -> dict | None:
    """The measured Fmax of profile ``name``'s GEMM engine placed and routed on the UP5K, from
    ``fpga/reports/<name>-up5k.json`` (``nanokpu synth --profile <name> --target up5k --unit
    gemm``): ``mhz``, ``seed`` (nextpnr's, ``None`` if not recorded), ``flow``, ``command``,
    ``path`` and ``current`` (the report was made from the RTL benchmarked here,
    :func:`fpga.flow.made_from`); ``None`` when the report has no such result."""
    from fpga.flow import REPORT_DIR, ROOT, TARGETS, made_from
    from nanokpu.designs import resolve_unit, top_name

    path = REPORT_DIR / f"{name}-up5k.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    for r in data["reports"]:
        pnr = r.get("pnr") or {}
        if r["name"] == "gemm" and r.get("profile") == name and pnr.get("fmax_mhz"):
            engine = resolve_unit("gemm")(profile(name, dsp=TARGETS["up5k"].family))  # as nanokpu synth builds it
            return {"mhz": pnr["fmax_mhz"], "seed": pnr.get("seed"), "flow": pnr["flow"], "command": data["command"],
                    "path": str(path.relative_to(ROOT)), "current": made_from(r, engine, top_name("gemm"))}
    return None


def _rate(macs: int, cycles: int, fmax: dict) -> str:
    """MAC/s of ``macs`` in ``cycles`` at the measured Fmax ``fmax`` (:func:`up5k_fmax`)."""
    from fpga.report import format_rate
    return format_rate(macs / cycles * fmax["mhz"] * 1e6)


def ice40_table(name: str, cfg: KpuConfig, rows: list[dict], fmax: dict | None) -> str:
    """The ``dsp = "ice40"`` timings: cycles, utilisation, MAC/cycle and MAC/s at the measured
    Fmax, with and without store."""
    peak = cfg.rows * cfg.cols
    if fmax is None:
        source = (f"No MAC/s: `fpga/reports/{name}-up5k.json` has no placed and routed GEMM engine "
                  f"(`nanokpu synth --profile {name} --target up5k --unit gemm` makes one).")
    else:
        seed = f"nextpnr seed {fmax['seed']}" if fmax["seed"] is not None else "nextpnr seed not recorded"
        made = ("made from the RTL timed here" if fmax["current"] else
                "**made from an earlier RTL than the one timed here**: rerun that command")
        source = (f"MAC/s at **{fmax['mhz']} MHz**, the Fmax of this engine placed and routed on the UP5K, from "
                  f"`{fmax['path']}` (`{fmax['command']}`, {seed}, {fmax['flow']} flow; {made}). "
                  f"Peak: {peak} MAC/cycle, {_rate(peak, 1, fmax)} MAC/s.")
    lines = [f"### `{name}` as built for the UP5K (`dsp = \"ice40\"`): {cfg.rows}x{cfg.cols} array on "
             f"{peak // 2} SB_MAC16, {TOKENS[name]} tokens",
             "",
             "The array's products in SB_MAC16 blocks (Yosys' simulation model), the requantiser bit-serial "
             f"(`store` takes {requant_interval(cfg)} cycles per result word). *Compute only*: the same command "
             "without store, timed too (a GEMM that accumulates over several commands stores once, with the last). "
             + source,
             "",
             "| GEMM | M x K x N | cycles | utilisation | MAC/cycle | MAC/s | store | compute only: cycles "
             "| utilisation | MAC/cycle | MAC/s | sim cycles/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        macs = r["m"] * r["k"] * r["n"]
        cells = []
        for cycles in (r["cycles"], r["cycles_compute"]):
            rate = _rate(macs, cycles, fmax) if fmax else "-"
            cells.append(f"{cycles} | {100 * macs / (peak * cycles):.1f}% | {macs / cycles:.2f} | {rate}")
        lines.append(f"| {r['name']} | {r['m']} x {r['k']} x {r['n']} | {cells[0]} | {r['parts']['store']} "
                     f"| {cells[1]} | {r['rate']:.0f} |")
    return "\n".join(lines)


def table(name: str, cfg: KpuConfig, rows: list[dict]) -> str:
    lines = [f"### `{name}`: {cfg.rows}x{cfg.cols} array, {TOKENS[name]} tokens",
             "",
             "| GEMM | M x K x N | cycles | ideal | utilisation | edge | gap | fill | drain | store "
             "| sim cycles/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        p = r["parts"]
        lines.append(
            f"| {r['name']} | {r['m']} x {r['k']} x {r['n']} | {r['cycles']} | {r['ideal']:.0f} "
            f"| {100 * r['util']:.1f}% | {p['edge']:.0f} | {p['gap']} | {p['fill']} | {p['drain']} "
            f"| {p['store']} | {r['rate']:.0f} |")
    return "\n".join(lines)


EXPLANATION = """\
## Where the remaining cycles go

Cycles run from the accepted command to `done` and include loading A, streaming every B
panel and storing the requantised results; the engine overlaps all loading with the
compute (A streams in while the first B panel does; panel `nb + 1` streams into the other
half of scratchpad B while panel `nb` is multiplied with every A row block), so the
losses are only these, each column above in cycles (`useful + edge + gap + fill + drain +
store = cycles`, exactly; the bench asserts the total against `nanokpu.units.gemm.gemm_cycles`):

* **edge**: K steps spent on padded rows or columns of edge tiles (`M` not a multiple of
  `rows`, `N` not a multiple of `cols`): the array computes `rows x cols` MACs per step
  whatever the shape. The expert GEMMs of a block have only `T * top_k / n_experts`
  tokens, so most of their array sits idle: a property of routed experts at small batch,
  not of the engine (batching more tokens per expert is the fix).
* **gap**: a tile lasts at least `tile_gap = rows + 2*cols - 1` cycles (cols >= 4), the time the
  array needs to drain the previous tile's results through its shift chains before the
  result registers are written again. It costs only when `K < tile_gap`.
* **fill**: the command check (`ceil(M/rows) + 3` cycles) and one cycle for the first A
  and B words to land in the scratchpads; from then on a K step waits only for its own
  words, so the first tile follows the first B panel and A as they stream in.
* **drain**: after the last K step, 1 cycle into the feed register, `rows + cols` cycles
  through the skewed array and `cols + 3` to drain the last tile into scratchpad C (column
  registered, old word read and registered, added, written).
* **store**: what the store adds after the compute: the `ceil(M/rows) * N` result words go
  through the 6-stage requantiser under the compute, each once its tile is written (a word a
  cycle), so what is left is the last tile's words, any the store had not caught up with, the
  requantiser's latency and 5 cycles of scratchpad read and handshakes. The store sends the
  words row block by row block (`c_out`'s order) while the tiles come panel by panel, so
  with several row blocks and short tiles (the up-projection: `K` = 16 or 128 against `N`
  words a row block) most of the later row blocks are left for after the compute.

{headline}"""


def render(results, ice40_results=()) -> str:
    parts = ["# GEMM engine benchmark (RTL on Verilator)",
             "",
             "Generated by `nanokpu bench-gemm` (`nanokpu/commands/bench_gemm.py`). Utilisation = ideal /",
             "measured cycles, ideal = MACs / (rows * cols), loading and storing included (as in",
             "Gemmini's perf tests). Sources never idle and the sink never stalls; every result",
             "is bit-exact to `golden.intops`. `sim cycles/s` is the Verilator + cocotb speed",
             "with Python driving every stream each cycle.",
             ""]
    for name, cfg, rows in results:
        parts += [table(name, cfg, rows), ""]
    for name, cfg, rows, fmax in ice40_results:
        parts += [ice40_table(name, cfg, rows, fmax), ""]
    headline = ""
    for name, cfg, rows in results:
        for r in rows:
            if (r["m"], r["k"], r["n"]) == (64, 256, 256):
                headline = (f"The headline shape, the `{name}` GEMM 64 x 256 x 256 on the {cfg.rows}x{cfg.cols} "
                            f"array, runs at {100 * r['util']:.1f}% "
                            "(`tests/units/test_gemm.py::test_gemm_64x256x256_on_8x8_is_exact_and_busy` "
                            "asserts the exact cycle count).\n")
    parts.append(EXPLANATION.format(headline=headline))
    return "\n".join(parts)


def add_arguments(parser) -> None:
    parser.add_argument("--profile", action="append", choices=sorted(TOKENS),
                        help="profile to benchmark (repeatable; default: tiny and small)")
    parser.add_argument("--seed", type=seed, default=1)
    parser.add_argument("--out", type=out_file, default=DOC, help=f"markdown report (default: {DOC})")
    add_quiet(parser)


def run(args) -> int:
    from nanokpu.commands.progress import Progress
    results, ice40_results = [], []
    names = args.profile or sorted(TOKENS, key=list(TOKENS).index)
    progress = Progress(quiet=args.quiet)
    progress.start(len(names) + sum(n in ICE40 for n in names), "profiles")
    for name in names:
        start = time.perf_counter()
        with progress.stage(f"{name}: build and run the GEMMs on Verilator"):
            cfg, rows = run_profile(name, args.seed)
        progress.advance(f"{name} done")
        results.append((name, cfg, rows))
        print(f"{name}: {cfg.rows}x{cfg.cols} array ({time.perf_counter() - start:.0f} s with the build)")
        for r in rows:
            print(f"  {r['name']:28s} {r['m']:4d} x {r['k']:4d} x {r['n']:4d}: {r['cycles']:7d} cycles, "
                  f"ideal {r['ideal']:8.0f}, utilisation {100 * r['util']:5.1f}%, {r['rate']:7.0f} cycles/s")
        if name not in ICE40:
            continue
        start = time.perf_counter()
        with progress.stage(f"{name}, dsp=ice40: build and run the GEMMs on Verilator"):
            cfg, rows = run_profile(name, args.seed, dsp="ice40")
        progress.advance(f"{name}, dsp=ice40 done")
        fmax = up5k_fmax(name)
        ice40_results.append((name, cfg, rows, fmax))
        at = (f"MAC/s at {fmax['mhz']} MHz, {fmax['path']}{'' if fmax['current'] else ' (earlier RTL)'}"
              if fmax else "no UP5K Fmax")
        print(f"{name}, dsp=ice40 ({time.perf_counter() - start:.0f} s with the build; {at}):")
        for r in rows:
            macs = r["m"] * r["k"] * r["n"]
            line = " / ".join(
                f"{what} {c:6d} cycles, {macs / c:5.2f} MAC/cycle"
                + (f", {_rate(macs, c, fmax)} MAC/s" if fmax else "")
                for what, c in (("with store", r["cycles"]), ("compute only", r["cycles_compute"])))
            print(f"  {r['name']:28s} {r['m']:4d} x {r['k']:4d} x {r['n']:4d}: {line}")
    progress.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(results, ice40_results))
    print(f"wrote {args.out}")
    return 0
