"""``nanokpu fault-campaign``: soak and fault-inject the whole nano-KPU on Verilator; docs/fault_campaign.md.

Runs the cocotb bench ``sim/bench_fault.py`` (its docstring lists the episodes: valid blocks
bit-exact to the golden model, fuzzed programs checked against :class:`~nanokpu.host.funcsim.FuncSim`,
random register and instruction-memory writes, hard and soft resets mid-run, all under random
AXI idle and backpressure with a watchdog on every program and every bus access), in
``--runs`` independent runs of ``--episodes`` episodes (seeds ``--seed .. --seed + runs - 1``),
and writes the totals to ``--out`` as a Markdown summary with the command that made it.
Returns 0 when no episode failed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nanokpu.commands import ROOT
from nanokpu.commands.args import fraction, int_in, out_file, seed
from nanokpu.commands.progress import Progress, add_quiet
from nanokpu.config import PROFILES, profile
from nanokpu.host.compiler import check_tokens

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
             work: Path, progress=None) -> dict:
    """Run the campaign on the nano-KPU of ``profile_name``; returns ``{"counts": totals,
    "failures": [...], "seeds": [...]}``; ``progress``, a
    :class:`~nanokpu.commands.progress.Progress`, shows each run as a stage and a step of its bar."""
    from nanokpu.kpu.top import NanoKPU
    from sim.lib.kpu_launch import kpu_build_name, run_kpu_bench
    from sim.runner import BenchFailure

    cfg = profile(profile_name)
    name = kpu_build_name(cfg)
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
                run_kpu_bench(cfg, "bench_fault", seed=run_seed, dut=dut,
                              params={"episodes": episodes, "tokens": tokens, "pause": pause, "summary": str(out)})
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


def summary_markdown(result: dict, command: str, profile_name: str) -> str:
    counts = result["counts"]
    lines = [
        "# Fault campaign",
        "",
        f"Made by `{command}`",
        f"(profile `{profile_name}`, seeds {result['seeds'][0]}..{result['seeds'][-1]}).",
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
    parser.add_argument("--runs", type=int_in(1), default=4, help="independent runs (one seed each)")
    parser.add_argument("--episodes", type=int_in(1), default=60, help="episodes per run")
    parser.add_argument("--seed", type=seed, default=1, help="seed of the first run")
    parser.add_argument("--tokens", type=int_in(1), default=4, help="max tokens of a valid block")
    parser.add_argument("--pause", type=fraction, default=0.2, help="AXI idle/backpressure probability")
    parser.add_argument("--out", type=out_file, default=ROOT / "docs" / "fault_campaign.md",
                        help="Markdown summary (default: docs/fault_campaign.md)")
    add_quiet(parser)


def run(args) -> int:
    check_tokens(profile(args.profile), args.tokens)
    result = campaign(args.profile, runs=args.runs, episodes=args.episodes, seed=args.seed,
                      tokens=args.tokens, pause=args.pause, work=ROOT / "sim_build" / "fault_campaign",
                      progress=Progress(quiet=args.quiet))
    command = (f"nanokpu fault-campaign --profile {args.profile} --runs {args.runs} "
               f"--episodes {args.episodes} --seed {args.seed} --tokens {args.tokens} --pause {args.pause}")
    text = summary_markdown(result, command, args.profile)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text, end="")
    if result["failures"]:
        print(f"nanokpu fault-campaign: {len(result['failures'])} failed episodes", file=sys.stderr)
        return 1
    return 0
