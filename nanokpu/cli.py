"""The ``nanokpu`` command line.

Each subcommand lives in its own module of :mod:`nanokpu.commands` that exposes
``add_arguments(parser)`` and ``run(args) -> int``; :data:`COMMANDS` maps the subcommand name
to that module.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand -> (module of :mod:`nanokpu.commands`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "flow": ("flow", "the main job: golden model, generate, simulate and synthesize a nano-KPU"),
    "demo": ("demo", "run a K3 LatentMoE block through the golden model and summarise it"),
    "generate": ("generate", "write the generated Verilog of a profile"),
    "bench-router": ("bench_router", "router cycles/token (Verilator) and ECP5 size at the k3 shape"),
    "qb-demo": ("qb_demo", "Quantile Balancing in closed loop with the router RTL; docs/qb_loop.*"),
    "bench-gemm": ("bench_gemm", "time LatentMoE GEMMs on the RTL GEMM engine, write docs/bench/gemm.md"),
    "sim": ("simulate", "run a LatentMoE block on the nano-KPU RTL (Verilator) via its AXI buses"),
    "bench-block": ("bench_block", "block cycles, utilization, busy shares on the RTL; docs/bench/block.md"),
    "bench-bridge": ("bench_bridge", "bytes and round trips of a block on the iCEBreaker serial line; "
                     "docs/bench/bridge.md"),
    "board-run": ("board_run", "run a compiled block on the board design over its UART and check it bit for bit"),
    "synth": ("synth", "synthesize, place and route units for iCE40/ECP5; reports and bitstreams"),
    "report-errors": ("report_errors", "regenerate docs/errors.md, the integer-vs-float error table"),
    "fault-campaign": ("fault_campaign", "soak and fault-inject the nano-KPU RTL; docs/fault_campaign.md"),
    "report-activation": ("report_activation", "regenerate docs/activation.md and its gate plot"),
    "report-fidelity": ("report_fidelity", "routing fidelity of the integer path vs float, before/after "
                        "issue 26; docs/fidelity.md"),
    "mutate": ("mutate", "mutation testing: run each mutant's killer tests, write docs/mutation.md"),
    "sweep": ("sweep", "design-space sweep on Dask: configs x targets x seeds -> table and Pareto plot"),
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the flag (``--help`` gives the usage)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="nanokpu",
        description="nano-KPU: generate, simulate and synthesize a Kimi K3 inference accelerator.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(f"nanokpu.commands.{module}")
        mod.add_arguments(cmd)
        cmd.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or argparse's one line naming the bad flag
        return exc.code
    args.argv = argv   # the command line as given, for the reports that record what made them
    try:
        return int(args._run(args) or 0)
    except ValueError as exc:  # invalid configs and inputs: one clear line, no traceback
        print(f"nanokpu {args.command}: error: {exc}", file=sys.stderr)
    except (OSError, ImportError, MemoryError) as exc:  # a path, a missing extra, a size too big
        print(f"nanokpu {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
