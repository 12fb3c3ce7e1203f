"""``nanokpu synth``: Yosys + nextpnr runs of a profile's units, with reports and bitstreams.

Examples
--------
``nanokpu synth --profile tiny --target up5k --unit gemm``
    Synthesis and core-only place and route of one unit; the tables land in ``fpga/reports/``.
``nanokpu synth --all``
    The benchmark (:data:`BENCHMARK`): each profile's whole nano-KPU on its own target, the
    ``tiny`` units on the UP5K, the ``small`` ones on the ECP5-85F; the table lands in
    ``fpga/reports/summary.md``.
``nanokpu synth --board ulx3s``
    A bitstream of a board build (:mod:`fpga.boards`): the whole nano-KPU behind the UART host
    bridge on the ULX3S, one unit behind the UART register bridge on the iCEBreaker.
``nanokpu synth --all --reuse --against fpga/reports/summary.json``
    The benchmark again (units whose RTLIL has not changed reused), and what changed since the
    summary it rewrites: each unit's resources and Fmax with the difference in brackets, and
    the submodules whose logic cells (iCE40) or LUTs moved.
``nanokpu synth --all --seed 2 --seed-tries 3 --pnr-timeout 15``
    Every nextpnr run starts with seed 2; a run that takes longer than 15 minutes or fails is
    stopped and retried with seed 3, then 4, and so is one that misses its Fmax goal by 10% or
    less (:data:`fpga.flow.NEAR_MISS`): the fastest seed is kept. The reports record the seed
    of each result and every attempt.

A unit is a name of :data:`nanokpu.designs.UNITS` or a ``module:factory`` path whose factory
takes a :class:`~nanokpu.config.KpuConfig`.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from fpga.boards import BOARDS
from fpga.flow import PNR_TIMEOUT_MIN, SEED_TRIES, TARGETS
from nanokpu.commands.args import in_file, int_in, out_dir, positive_float, seed
from nanokpu.commands.progress import Progress, add_quiet
from nanokpu.config import PROFILES, profile
from nanokpu.designs import TOP_UNIT, UNITS, resolve_unit, top_name

#: Default target of each profile: the part its whole nano-KPU is built for (``tiny``: the
#: ECP5-25F of the OrangeCrab 25F).
DEFAULT_TARGET = {"tiny": "ecp5-25f", "small": "ecp5-85f", "k3": "ecp5-85f"}

#: The units an iCE40 part carries: each alone (the iCEBreaker board build carries the GEMM
#: engine); the whole nano-KPU is not built for iCE40 (it does not fit the UP5K).
UP5K_UNITS = tuple(u for u in UNITS if u != TOP_UNIT)

#: ``nanokpu synth --all``: (profile, target, units or None for every registered unit): every
#: profile's whole nano-KPU on its own target, ``tiny`` also on the ECP5-85F (ULX3S), and the
#: ``tiny`` units on the UP5K and ``small`` ones on the ECP5-85F.
BENCHMARK = [("tiny", "up5k", UP5K_UNITS), ("tiny", "ecp5-25f", (TOP_UNIT,)), ("small", "ecp5-85f", None),
             ("tiny", "ecp5-85f", (TOP_UNIT,))]


def run_units(profile_name: str, target: str, units: list[str], *, pnr: bool = True,
              freq: float | None = None, seed: int = 1, seed_tries: int | None = None,
              pnr_timeout: float | None = None, reuse: bool = False, progress=None) -> list[dict]:
    """Synthesize each unit of ``profile_name`` on ``target``; returns the report dicts.

    ``progress`` is called with each stage's line (default: printed; a
    :class:`~nanokpu.commands.progress.Progress` puts them above its bar, or drops them quietly).

    ``seed``, ``seed_tries`` and ``pnr_timeout`` (minutes) are those of
    :func:`fpga.flow.synthesize` (``None``: its defaults).

    The units are built with ``dsp`` set to the target's family (``ice40`` or ``ecp5``), so
    the reports measure the hand-instantiated DSP blocks of :class:`nanokpu.units.dsp.Multiplier`
    (simulation and the committed Verilog use ``generic``)."""
    from fpga.flow import BUILD_DIR, PNR_TIMEOUT_MIN, SEED_TRIES, TARGETS, check_pnr_options, synthesize
    cfg = profile(profile_name, dsp=TARGETS[target].family)  # the hand-mapped DSP blocks
    seed_tries = SEED_TRIES if seed_tries is None else seed_tries
    pnr_timeout = PNR_TIMEOUT_MIN if pnr_timeout is None else pnr_timeout
    check_pnr_options(seed_tries, pnr_timeout, freq)  # before a unit is built: an unused one warns
    reports = []
    for unit in units:
        name = unit.split(":")[-1].lower()
        component = resolve_unit(unit)(cfg)
        report = synthesize(component, top_name(unit), target, pnr=pnr, freq=freq, seed=seed,
                            seed_tries=seed_tries, pnr_timeout=pnr_timeout,
                            build_dir=BUILD_DIR / f"{profile_name}-{target}-{name}", reuse=reuse,
                            progress=progress or (lambda line: print(line, flush=True)))
        report["name"] = name
        report["profile"] = profile_name
        report["macs_per_cycle"] = getattr(component, "macs_per_cycle", None)  # units with an array
        reports.append(report)
    return reports


def _unit(text: str) -> str:
    """``--unit``: a registered name or a ``module:factory`` that imports."""
    try:
        resolve_unit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    parser.add_argument("--target", default=None, choices=sorted(TARGETS),
                        help=f"{', '.join(TARGETS)} (default: the profile's own, "
                             + ", ".join(f"{p} {t}" for p, t in DEFAULT_TARGET.items()) + ")")
    parser.add_argument("--unit", action="append", default=None, type=_unit,
                        help="unit name or module:factory (repeatable; default: all registered units)")
    parser.add_argument("--all", action="store_true",
                        help="benchmark: each profile's kpu on its own target, the tiny kpu on ecp5-85f, the tiny "
                             "units on up5k and the small ones on ecp5-85f -> summary.md")
    parser.add_argument("--board", default=None, choices=sorted(BOARDS), help="board build with a bitstream")
    parser.add_argument("--baud", type=int_in(1), default=None,
                        help="bit rate of a board build's UART (default 115200; the same for nanokpu board-run --baud)")
    parser.add_argument("--no-pnr", action="store_true", help="Yosys only (resource counts, no Fmax)")
    parser.add_argument("--freq", type=positive_float, default=None,
                        help="nextpnr target in MHz, > 0 (default: the goal; not for --board)")
    parser.add_argument("--seed", type=seed, default=1,
                        help="first nextpnr placer seed (the next ones follow a timeout, a failure or a miss of the "
                             "Fmax goal by 10%% or less: --seed-tries)")
    parser.add_argument("--seed-tries", type=int_in(1), default=SEED_TRIES,
                        help=f"seeds to try per nextpnr run: --seed, --seed + 1, ... (default {SEED_TRIES})")
    parser.add_argument("--pnr-timeout", type=float, default=PNR_TIMEOUT_MIN, metavar="MINUTES",
                        help=f"time limit of one nextpnr run; past it the run is stopped and the next seed "
                             f"tried (default {PNR_TIMEOUT_MIN:g}; 0: no limit)")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse a unit's last report when its RTLIL and the options are unchanged")
    parser.add_argument("--out", type=out_dir, default=None, help="report directory (default: fpga/reports)")
    parser.add_argument("--against", type=in_file, default=None, metavar="JSON",
                        help="print each unit's change in resources and Fmax against the reports of an "
                             "earlier run (a <stem>.json, read before this run rewrites it)")
    add_quiet(parser)


def _recorded(argv: list[str]) -> list[str]:
    """A command line as the reports record it: without ``--against`` (it only prints)."""
    out, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--against="):
            skip = False
            continue
        if arg == "--against":
            skip = True
            continue
        out.append(arg)
    return out


def run(args) -> int:
    from fpga.flow import REPORT_DIR, TARGETS, ToolError
    from fpga.report import compare_table, read_baseline, write_reports

    out = args.out or REPORT_DIR
    command = shlex.join(["nanokpu", *_recorded(args.argv)])
    if args.baud is not None and not args.board:
        raise ValueError(f"baud = {args.baud}: only a board build (--board) has a UART")
    if args.freq is not None and args.board:
        raise ValueError(f"freq = {args.freq}: a board build's goal is its board's clock")
    if args.against is not None and args.board:
        raise ValueError(f"against = {str(args.against)!r}: a board build has no unit reports to compare")
    baseline = read_baseline(args.against) if args.against is not None else None
    if args.board:
        from fpga.boards import BAUD, build_board
        build_board(args.board, profile_name=args.profile, unit=(args.unit or [None])[0],
                    baud=BAUD if args.baud is None else args.baud, seed=args.seed,
                    seed_tries=args.seed_tries, pnr_timeout=args.pnr_timeout,
                    progress=Progress(quiet=args.quiet), out=out)
        return 0
    if args.all:
        jobs = BENCHMARK
    else:
        target = args.target or DEFAULT_TARGET[args.profile]
        ice40_default = TARGETS[target].family == "ice40" and not args.unit
        jobs = [(args.profile, target, UP5K_UNITS if ice40_default else None)]
    units = args.unit or sorted(UNITS, key=lambda u: (u == TOP_UNIT, u))  # the whole design last
    if not units:
        raise ValueError("unit: no unit is registered in nanokpu.designs.UNITS; name one with --unit")
    stem = "summary" if args.all else f"{args.profile}-{jobs[0][1]}"
    reports = []
    runs = [(unit, profile_name, target) for unit in units for profile_name, target, only in jobs
            if only is None or unit in only]
    try:
        # Unit by unit across the targets, the tables rewritten after each: an interrupted
        # benchmark still leaves a consistent (partial) table.
        with Progress(quiet=args.quiet) as progress:
            progress.start(len(runs), "synthesis runs")
            for unit, profile_name, target in runs:
                reports += run_units(profile_name, target, [unit], pnr=not args.no_pnr, freq=args.freq,
                                     seed=args.seed, seed_tries=args.seed_tries, pnr_timeout=args.pnr_timeout,
                                     reuse=args.reuse, progress=progress)
                paths = write_reports(reports, out, stem, command)
                progress.advance(f"{unit} ({profile_name}) on {target} done")
    except ToolError as exc:
        print(f"nanokpu synth: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(f"wrote {path}")
    if baseline is not None:
        print(f"\nChange against {args.against}:\n\n{compare_table(reports, baseline)}")
    bad = [r["name"] for r in reports if r["latches"] or r["unmapped"]]
    if bad:
        print(f"latches or unmapped cells in: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0
