"""``nanokpu bench-router``: throughput and size of the top-k routing engine at the K3 shape.

For each ``route_lanes`` value it builds :class:`nanokpu.units.router.TopKRouter` on Verilator, streams
back-to-back tokens with no idle and no backpressure (sim/bench_router.py ``throughput``,
bit-exact against the golden router), measures the cycles between consecutive tokens and
the latency of the first, and synthesizes the unit for the ECP5-85F with Yosys
(:func:`fpga.flow.synthesize`). Tokens per second are quoted at a reference clock of
:data:`REFERENCE_MHZ` (the ECP5 timing goal of :data:`fpga.flow.TARGETS`; a reference, not a
measured Fmax). Writes ``docs/bench/router.md``. ``--scheme after`` measures the router at issue 26's
score and bias formats (:data:`golden.fidelity.AFTER`: ``score_frac`` 16, ``bias_width`` 20).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from nanokpu.commands import DOCS
from nanokpu.commands.args import int_in, out_file
from nanokpu.commands.progress import add_quiet
from nanokpu.config import PROFILES, KpuConfig, profile

__all__ = ["REFERENCE_MHZ", "SCHEMES", "run_router_bench", "measure", "add_arguments", "run"]

#: ``--scheme`` choices: the fidelity report's schemes (:mod:`golden.fidelity`) by name.
SCHEMES = ("before", "after")

#: Reference clock of the tokens-per-second figures, in MHz.
REFERENCE_MHZ = 100.0

DOC = DOCS / "bench" / "router.md"


def run_router_bench(cfg: KpuConfig, testcase=None, *, tokens: int = 16, seed: int = 1,
                     build_args: tuple[str, ...] = (), **extra) -> Path:
    """Run the cocotb module sim/bench_router.py on the router of ``cfg``.

    The bench gets ``cfg`` itself (:func:`sim.runner.bench_config`); the build is named after
    its profile and the fields that differ from it (a custom name is taken relative to ``tiny``).
    ``extra`` entries reach the bench in ``NANOKPU_PARAMS``. Raises ValueError if ``tokens < 1``
    and :class:`sim.runner.BenchFailure` if a bench test fails.
    """
    from nanokpu.units.router import TopKRouter
    from sim.runner import run_bench

    if tokens < 1:
        raise ValueError(f"tokens = {tokens}: must be >= 1")
    base = PROFILES.get(cfg.name, PROFILES["tiny"])
    overrides = {k: v for k, v in cfg.as_dict().items() if v != getattr(base, k)}
    dut = TopKRouter(cfg)
    params = {"seed": seed, "tokens": tokens,
              "cycles_per_token": dut.cycles_per_token, "latency": dut.latency, **extra}
    tag = "".join(f"_{k}{v}" for k, v in sorted(overrides.items()))
    return run_bench(dut, f"router_{base.name}{tag}", "bench_router", params=params,
                     testcase=testcase, seed=seed, build_args=build_args)


def measure(cfg: KpuConfig, tokens: int = 8, seed: int = 1) -> dict:
    """Measured timing of back-to-back tokens on the RTL: ``periods`` (the distinct cycle
    counts between consecutive tokens; one value in steady state) and ``latency``."""
    from sim.runner import FAST_BUILD

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "timing.json"
        run_router_bench(cfg, "throughput", tokens=tokens, seed=seed, out=str(out),
                         build_args=FAST_BUILD if cfg.n_experts > 64 else ())
        return json.loads(out.read_text())


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="k3", choices=sorted(PROFILES))
    parser.add_argument("--scheme", default="before", choices=SCHEMES,
                        help="the profile's score and bias formats (before, the default) or issue 26's "
                             "(after: golden.fidelity.AFTER)")
    parser.add_argument("--route-lanes", type=int_in(1), nargs="+", default=[1, 4, 16],
                        help="route_lanes values to measure (default: 1 4 16)")
    parser.add_argument("--tokens", type=int_in(1), default=8, help="tokens per measurement")
    parser.add_argument("--no-synth", action="store_true", help="skip the Yosys resource count")
    parser.add_argument("--out", type=out_file, default=DOC, help="Markdown report path")
    add_quiet(parser)


def _config(args, **overrides) -> KpuConfig:
    """The profile of ``args`` with ``overrides`` and the ``--scheme`` applied."""
    from golden import fidelity
    changes = {"before": fidelity.BEFORE, "after": fidelity.AFTER}[args.scheme]
    return fidelity.scheme(profile(args.profile, **overrides), changes)


def run(args) -> int:
    from nanokpu.commands.progress import Progress
    from nanokpu.units.router import TopKRouter
    rows = []
    progress = Progress(quiet=args.quiet)
    progress.start(len(args.route_lanes), "route_lanes values")
    for lanes in args.route_lanes:
        cfg = _config(args, route_lanes=lanes)
        with progress.stage(f"route_lanes {lanes}: router on Verilator"):
            timing = measure(cfg, args.tokens)
        (period,) = timing["periods"]
        row = {"lanes": lanes, "cycles": period, "latency": timing["latency"],
               "bound": cfg.n_experts / lanes + 32, "beats": -(-cfg.n_experts // lanes),
               "tps": REFERENCE_MHZ * 1e6 / period}
        if not args.no_synth:
            from fpga.flow import synthesize
            tag = "" if args.scheme == "before" else f"_{args.scheme}"
            rep = synthesize(TopKRouter(cfg), f"router_{cfg.name}{tag}_l{lanes}", "ecp5-85f", progress=progress)
            row["res"] = rep["resources"]
        rows.append(row)
        progress.advance(f"route_lanes {lanes} done")
        print(f"route_lanes {lanes:2d}: {period} cycles/token (bound {row['bound']:g}), "
              f"latency {row['latency']}, {row['tps'] / 1e6:.3f} M tokens/s at {REFERENCE_MHZ:g} MHz"
              + (f", ECP5 LUT {row['res']['lut']} FF {row['res']['ff']} DSP {row['res']['dsp']} "
                 f"BRAM {row['res']['bram']}" if "res" in row else ""))
    cfg = _config(args)
    recip = cfg.weight_frac + cfg.score_frac + 1
    lines = [
        "# Top-k routing engine: throughput and size",
        "",
        f"Generated by `nanokpu bench-router --profile {args.profile}"
        + ("" if args.scheme == "before" else f" --scheme {args.scheme}") + " --route-lanes "
        f"{' '.join(map(str, args.route_lanes))}` (nanokpu/commands/bench_router.py).",
        "",
        f"Shape `{cfg.name}`: {cfg.n_experts} experts, top-{cfg.top_k}, scores "
        f"Q1.{cfg.score_frac} unsigned, bias Q{cfg.bias_width}.{cfg.score_frac}, weights "
        f"{cfg.weight_frac} fractional bits, load counters {cfg.load_width} bits. Cycles are "
        f"measured on Verilator (sim/bench_router.py `throughput`): {args.tokens} tokens back to "
        "back, no idle, no backpressure, every route checked bit for bit against "
        f"`golden.intops.route_int`. Tokens per second at a reference clock of "
        f"{REFERENCE_MHZ:g} MHz (the ECP5 timing goal of fpga/flow.py; not a measured Fmax). "
        "Resources: Yosys `synth_ecp5` for the ECP5-85F (fpga/flow.py `synthesize`).",
        "",
        "| route_lanes | beats/token | cycles/token | bound E/lanes + 32 | latency (cycles) "
        "| tokens/s @ ref | LUT | FF | DSP | BRAM |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        res = r.get("res", {})
        lines.append(f"| {r['lanes']} | {r['beats']} | {r['cycles']} | {r['bound']:g} | {r['latency']} "
                     f"| {r['tps'] / 1e6:.3f} M | {res.get('lut', '-')} | {res.get('ff', '-')} "
                     f"| {res.get('dsp', '-')} | {res.get('bram', '-')} |")
    lines += [
        "",
        "## Why these numbers",
        "",
        "The engine is three concurrent stages (nanokpu/units/router.py): insertion of "
        "`route_lanes` scores per cycle into per-lane sorted lists, a merge of the lane heads "
        "into the top-k (two cycles per pop: the comparison tree over the lane heads is split "
        "over two pipeline stages), and a divide-and-emit stage (one sequential reciprocal "
        f"of R + 1 = {recip + 1} cycles, then one weight per cycle). A token costs "
        "`max(ceil(E / lanes), 2k + 1, R + k + 2)` cycles in steady state "
        f"(R = weight_frac + score_frac + 1 = {recip}). At the K3 shape the score input is "
        f"the bottleneck for every lane count measured: ceil({cfg.n_experts} / lanes) beats, "
        f"against 2k + 1 = {2 * cfg.top_k + 1} for the merge and R + k + 2 = {recip + cfg.top_k + 2} "
        "for the weights, so the cycles per token equal 896 / lanes exactly, with no "
        "constant (the merge and the division of one token overlap the scoring of the next). "
        "The latency of a token, from its last score beat to its first route beat, is "
        f"2k + R + 6 = {2 * cfg.top_k + recip + 6} cycles. The bench behind every row asserts "
        "that the measured cycles equal this model (`nanokpu.units.router.cycles_per_token`); "
        "tests/test_router.py does so on the RTL for the default k3 row in the default suite.",
        "",
        "Size: the lists and their snapshot hold `lanes x min(k, ceil(E / lanes))` entries "
        "each (key, beat, score, valid), so flip-flops and comparators grow with "
        "`lanes x min(k, E / lanes)`: 16 x 16 entries at 16 lanes against 1 x 16 at one lane; "
        "their insertion muxes and comparators, and the lane-head comparison tree of the "
        "merge, are most of the LUTs. The load counters (E words) sit in block RAM, and so do "
        "the bias banks (one per lane, ceil(E / lanes) words) when they are deep; the "
        "56-word banks at 16 lanes go to distributed RAM. The two DSPs are the weight "
        "multiplier (13-bit score x 29-bit reciprocal).",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0
