"""``nanokpu sim``: one LatentMoE block of a profile on the nano-KPU RTL (Verilator), end to end.

Compiles a random block (:mod:`nanokpu.host.compiler`), builds the top level on Verilator (cached in
``sim_build/``), and runs ``sim/bench_top.py``: the host image goes into an AXI RAM model, the
program in through AXI4-Lite, the block runs, the results come back and are compared bit for
bit with :func:`golden.block.latent_moe_int` (and the functional simulator) and against the
float block. Prints progress while it runs and a summary: cycles, each unit's busy share,
bit-exact yes/no, the error against the float block. ``--waves`` writes an FST file (VCD where
``lz4.h``, Debian's ``liblz4-dev``, is missing: Verilator's FST writer needs it).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from nanokpu.commands.args import fraction, int_in, seed
from nanokpu.commands.progress import Progress, add_quiet
from nanokpu.config import PROFILES, profile
from nanokpu.host.compiler import check_tokens

#: Default batch size per profile.
DEFAULT_TOKENS = {"tiny": 8, "small": 16}


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    parser.add_argument("--tokens", type=int_in(1), default=None,
                        help="tokens in the batch (default: 8 for tiny, 16 for small; at most what the "
                             "profile's scratchpad holds)")
    parser.add_argument("--seed", type=seed, default=1, help="random block and batch")
    parser.add_argument("--pause", type=fraction, default=0.0,
                        help="probability in [0, 1) of an idle/backpressure cycle on every AXI channel")
    parser.add_argument("--waves", action="store_true", help="write a waveform (FST, or VCD without lz4.h)")
    add_quiet(parser)


def simulate(cfg, tokens: int, seed: int, pause: float = 0.0, waves: bool = False,
             progress: bool = True, replay: Path | None = None, trace: bool = False) -> dict:
    """Run one block on the RTL; returns the bench's summary (cycles, busy counters, error,
    ``bit_exact``, ``macs``, the run phase's ``run_clocks`` and ``run_seconds``) plus ``waves``
    (the FST/VCD path or None), ``seconds`` and ``build`` (the Verilator build directory).
    With ``replay`` (a directory) the bench also writes the run there for the C++ harness
    (:func:`sim.lib.raw_run.replay`); with ``trace`` the summary has ``busy_trace`` (each
    executor instruction's cycles, :mod:`sim.bench_top`)."""
    from nanokpu.kpu.top import NanoKPU
    from sim.lib.kpu_launch import kpu_build, kpu_build_name, run_kpu_bench
    from sim.runner import BenchFailure, waves_file

    check_tokens(cfg, tokens)
    if not 0 <= pause < 1:  # 1 would stall every AXI channel for ever
        raise ValueError(f"pause = {pause}: must be in [0, 1)")
    t0 = time.time()
    stages = Progress(quiet=not progress)
    dut = NanoKPU(cfg)
    with stages.stage(f"[nanokpu sim] build {kpu_build_name(cfg)} on Verilator (cached under sim_build/)"):
        build_dir = kpu_build(cfg, waves=waves, dut=dut)
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        params = {"tokens": tokens, "seeds": 1, "pause": pause, "summary": str(summary), "progress": progress}
        if replay is not None:
            params["replay"] = str(replay)
        if trace:
            params["trace"] = 1
        try:
            with stages.stage(f"[nanokpu sim] run the block ({tokens} tokens, seed {seed})"):
                run_kpu_bench(cfg, "bench_top", testcase="test_block", seed=seed, params=params, waves=waves,
                              dut=dut)
        except BenchFailure as exc:
            return {"bit_exact": False, "failure": str(exc), "seconds": time.time() - t0}
        result = json.loads(summary.read_text())[0]
    result["waves"] = str(waves_file(build_dir)) if waves else None
    result["seconds"] = time.time() - t0
    result["build"] = str(build_dir)
    return result


def format_summary(cfg, r: dict) -> str:
    if not r.get("bit_exact"):
        return f"bit-exact: NO\n{r.get('failure', '')}"
    from nanokpu.isa import EXECUTORS
    cycles = r["cycles"]
    ideal = r["macs"] / (cfg.rows * cfg.cols)
    lines = [
        f"profile {cfg.name}: {r['tokens']} tokens, {r['instructions']} instructions, "
        f"{cycles} cycles ({r['seconds']:.1f} s wall)",
        f"GEMM work: {r['macs']} MACs; ideal {ideal:.0f} cycles on the {cfg.rows}x{cfg.cols} array; "
        f"utilization {ideal / cycles:.1%}",
        "busy share per executor: " + ", ".join(f"{u} {r[u] / cycles:.1%}" for u in EXECUTORS),
        "bit-exact with golden.block.latent_moe_int: yes",
        f"error vs the float block: cosine {r['error']['cosine']:.5f}, max abs {r['error']['max_abs']:.4f}, "
        f"rms relative {r['error']['rms_rel']:.4f}",
    ]
    if r.get("waves"):
        lines.append(f"waves: {r['waves']}")
    return "\n".join(lines)


def run(args) -> int:
    cfg = profile(args.profile)
    tokens = DEFAULT_TOKENS.get(args.profile, 8) if args.tokens is None else args.tokens
    check_tokens(cfg, tokens)   # before anything is built: the block must fit the scratchpads
    r = simulate(cfg, tokens, args.seed, args.pause, args.waves, progress=not args.quiet)
    print(format_summary(cfg, r))
    return 0 if r.get("bit_exact") else 1
