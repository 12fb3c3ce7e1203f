"""``nanokpu fault-campaign``: soak and fault-inject the whole nano-KPU on Verilator; docs/fault_campaign.md.

Runs the cocotb bench ``sim/bench_fault.py`` (its docstring lists the episodes: valid blocks
bit-exact to the golden model, fuzzed programs checked against :class:`~nanokpu.host.funcsim.FuncSim`,
random register and instruction-memory writes, hard and soft resets mid-run, all under random
AXI idle and backpressure with a watchdog on every program and every bus access), in
``--runs`` independent runs of ``--episodes`` episodes (seeds ``--seed .. --seed + runs - 1``),
and writes the totals to ``--out`` as a Markdown summary with the command that made it. With
``--dsp ice40`` it runs the design as built for the UP5K (SB_MAC16, the data scratchpad in
SPRAM, Yosys' models; default summary docs/fault_campaign_ice40.md). Returns 0 when no episode
failed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nanokpu.commands import ROOT
from nanokpu.commands.progress import Progress, add_quiet
from nanokpu.config import PROFILES, profile

__all__ = ["add_arguments", "run", "campaign", "summary_markdown"]


#: Rows of the summary: (count key, label).
ROWS = (
    ("episodes", "episodes"),
    ("valid_programs", "valid programs run (bit-exact checks)"),
    ("compiler_refusals", "random blocks the quantiser refused (not run)"),
    ("fuzz_programs", "fuzzed programs"),
    ("fuzz_instructions", "fuzzed instructions"),
    ("fuzz_errors", "fuzzed programs that must stop with an error"),
    ("fuzz_nonterminating", "fuzzed programs that loop (stopped by a soft reset)"),
    ("fuzz_dumps", "fuzzed programs that ran to the end (their scratchpad compared too)"),
    ("bus_bursts", "bursts of random register/instruction-memory writes"),
    ("bus_writes", "random bus writes"),
    ("hard_resets", "hard resets (rst) mid-run"),
    ("soft_resets", "soft resets (CTRL.bit1)"),
    ("cycles", "clock cycles simulated"),
)
FAILURE_ROWS = (
    ("failures", "failed episodes"),
    ("hangs", "hangs (program watchdog)"),
    ("bus_hangs", "bus hangs (access watchdog)"),
    ("wrong_outputs", "wrong outputs (RTL != golden / FuncSim)"),
    ("status_mismatches", "wrong stop (error code, pc, done != FuncSim)"),
    ("writes_outside", "host writes outside the program's window"),
)


def campaign(profile_name: str, *, runs: int, episodes: int, seed: int, tokens: int, pause: float,
             work: Path, dsp: str = "generic", progress=None) -> dict:
    """Run the campaign on the design built with ``KpuConfig.dsp = dsp`` (``ice40``: as built for
    the UP5K, on Yosys' SB_MAC16 and SB_SPRAM256KA models); returns ``{"counts": totals,
    "failures": [...], "seeds": [...]}``; ``progress``, a
    :class:`~nanokpu.commands.progress.Progress`, shows each run as a stage and a step of its bar."""
    from nanokpu.kpu.top import NanoKPU
    from sim.runner import BenchFailure, run_bench, vendor_build_args, vendor_name

    cfg = profile(profile_name, dsp=dsp)
    name = vendor_name(f"kpu_{profile_name}", dsp)
    build_args = vendor_build_args(dsp)
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    totals: dict[str, int] = {}
    failures: list[str] = []
    dut = NanoKPU(cfg)
    progress = progress or Progress(quiet=True)
    progress.start(runs, "runs")
    for run_seed in range(seed, seed + runs):
        out = work / f"fault-{name}-{run_seed}.json"
        out.unlink(missing_ok=True)
        try:
            with progress.stage(f"run {run_seed - seed + 1}/{runs} (seed {run_seed}, {episodes} episodes)"):
                run_bench(dut, name, "bench_fault", seed=run_seed, build_args=build_args,
                          params={"profile": profile_name, "overrides": {"dsp": dsp}, "seed": run_seed,
                                  "episodes": episodes, "tokens": tokens, "pause": pause, "summary": str(out)})
        except BenchFailure as exc:
            if not out.exists():
                raise
            failures.append(str(exc))
        result = json.loads(out.read_text())
        for key, value in result["counts"].items():
            totals[key] = totals.get(key, 0) + value
        failures += [f"seed {run_seed}: {f}" for f in result["failures"]]
        progress.advance(f"seed {run_seed}: {len(result['failures'])} failed episodes")
    progress.close()
    return {"counts": totals, "failures": failures, "seeds": list(range(seed, seed + runs))}


def summary_markdown(result: dict, command: str, profile_name: str, dsp: str = "generic") -> str:
    counts = result["counts"]
    built = "" if dsp == "generic" else (f", built with `dsp = \"{dsp}\"`: the design as built for the UP5K, "
                                         "on Yosys' SB_MAC16 and SB_SPRAM256KA models")
    lines = [
        "# Fault campaign",
        "",
        f"Made by `{command}`",
        f"(profile `{profile_name}`{built}, seeds {result['seeds'][0]}..{result['seeds'][-1]}).",
        "The episodes are described in `sim/bench_fault.py`: valid blocks",
        "bit-exact to `golden.block.latent_moe_int`, fuzzed programs whose stop (error code, pc,",
        "done) and host memory must equal `FuncSim`'s (an epilogue stores the scratchpad words they",
        "use, so results no instruction stored are compared too), random register/instruction-memory writes,",
        "hard and soft resets at random points mid-run; random idle and backpressure on every AXI",
        "channel; a watchdog on every program and every bus access; a canary region outside the",
        "program's host window checked after every episode; a valid block after every fault.",
        "",
        "| tried | count |",
        "| --- | ---: |",
        *[f"| {label} | {counts.get(key, 0)} |" for key, label in ROWS],
        "",
        "| failed | count |",
        "| --- | ---: |",
        *[f"| {label} | {counts.get(key, 0)} |" for key, label in FAILURE_ROWS],
        "",
        "Lost or duplicated stream beats would show as wrong outputs here; the stream proofs of",
        "`docs/formal.md` rule them out for every unit.",
        "",
        "Every opcode is fuzzed (`sim/bench_fault.py`, `FUZZ_OPS`); well-formed `EXPERT`s also step the",
        "expert iterator over the route table a `ROUTE` just wrote.",
    ]
    if result["failures"]:
        lines += ["", "## Failures", "", *[f"- {f}" for f in result["failures"]]]
    return "\n".join(lines) + "\n"


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    parser.add_argument("--dsp", default="generic", choices=("generic", "ice40"),
                        help="KpuConfig.dsp: ice40 runs the design as built for the UP5K (SB_MAC16, SPRAM)")
    parser.add_argument("--runs", type=int, default=4, help="independent runs (one seed each)")
    parser.add_argument("--episodes", type=int, default=60, help="episodes per run")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first run")
    parser.add_argument("--tokens", type=int, default=4, help="max tokens of a valid block")
    parser.add_argument("--pause", type=float, default=0.2, help="AXI idle/backpressure probability")
    parser.add_argument("--out", type=Path, default=None,
                        help="Markdown summary (default: docs/fault_campaign.md, docs/fault_campaign_ice40.md)")
    add_quiet(parser)


def run(args) -> int:
    for name in ("runs", "episodes", "tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} = {getattr(args, name)}: must be a positive integer")
    if not 0 <= args.pause < 1:
        raise ValueError(f"--pause = {args.pause}: must be in [0, 1)")
    result = campaign(args.profile, runs=args.runs, episodes=args.episodes, seed=args.seed,
                      tokens=args.tokens, pause=args.pause, work=ROOT / "sim_build" / "fault_campaign",
                      dsp=args.dsp, progress=Progress(quiet=args.quiet))
    dsp_flag = "" if args.dsp == "generic" else f" --dsp {args.dsp}"
    command = (f"nanokpu fault-campaign --profile {args.profile}{dsp_flag} --runs {args.runs} "
               f"--episodes {args.episodes} --seed {args.seed} --tokens {args.tokens} --pause {args.pause}")
    text = summary_markdown(result, command, args.profile, args.dsp)
    out = args.out or ROOT / "docs" / ("fault_campaign.md" if args.dsp == "generic" else
                                       f"fault_campaign_{args.dsp}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text, end="")
    if result["failures"]:
        print(f"nanokpu fault-campaign: {len(result['failures'])} failed episodes", file=sys.stderr)
        return 1
    return 0
