"""``nanokpu sim``: one LatentMoE block of a profile on the nano-KPU RTL (Verilator), end to end;
with ``--layer L [L ...]`` whole K3 layers instead (:func:`simulate_layers`).

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
#: ``--layer`` runs: the first call's tokens and the decode steps after it, by default.
LAYER_TOKENS, LAYER_STEPS = 4, 4


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    parser.add_argument("--tokens", type=int_in(1), default=None,
                        help="tokens in the batch (default: 8 for tiny, 16 for small; at most what the "
                             "profile's scratchpad holds)")
    parser.add_argument("--layer", type=int_in(0), nargs="+", default=None, metavar="L",
                        help="run whole K3 layers L instead of a block (KDA or MLA by the K3 pattern; the "
                             "profile built with layer_ops and a 128-instruction memory): a call of --tokens "
                             "tokens (default 4), then --steps decode steps carrying the KDA state or MLA cache")
    parser.add_argument("--steps", type=int_in(0), default=LAYER_STEPS,
                        help=f"with --layer: decode steps of a token after the first call (default {LAYER_STEPS})")
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


def layer_kinds(cfg) -> list[int]:
    """One layer of each kind of ``cfg`` by the K3 pattern: the first with a dense FFN, the first KDA
    layer with the LatentMoE FFN, the first MLA layer (``tiny``, ``small``: 0, 1, 3)."""
    kinds = {}
    for L in range(cfg.n_layers):
        kinds.setdefault((cfg.is_mla_layer(L), L < cfg.dense_layers), L)
    return sorted(kinds[k] for k in ((False, True), (False, False), (True, False)) if k in kinds)


def layer_name(cfg, L: int) -> str:
    """``"<mixer> mixer, <FFN> FFN"`` of layer ``L``."""
    mixer = "MLA" if cfg.is_mla_layer(L) else "KDA"
    return f"{mixer} mixer, " + ("dense FFN" if L < cfg.dense_layers else "LatentMoE FFN")


def check_layers(cfg, layers, tokens: int, steps: int) -> None:
    """``ValueError`` naming the argument when a layer of ``layers`` cannot run on the layer build
    of ``cfg`` (:func:`nanokpu.host.layer.layer_config`) with ``tokens`` then ``steps`` calls of
    one token: out of range, or a program beyond the scratchpad or instruction memory (each
    layer's first call and, for an MLA layer, its last decode step, the longest cache, compiled on a
    random case)."""
    import numpy as np

    from golden.layer import random_layer_case
    from golden.mla import MLACache
    from nanokpu.host.layer import compile_layer, layer_config

    lcfg = layer_config(cfg)
    for L in layers:
        if not 0 <= L < cfg.n_layers:
            raise ValueError(f"layer = {L}: profile {cfg.name!r} has layers 0 .. {cfg.n_layers - 1}")
        Q, P, Bl, _, _ = random_layer_case(lcfg, L, tokens + steps, np.random.default_rng(0))
        try:
            compile_layer(L, P[:tokens], [b[:tokens] for b in Bl], Q, lcfg)
            if steps and cfg.is_mla_layer(L):
                S0 = tokens + steps - 1
                cache = MLACache(np.zeros((S0, cfg.kv_lora_rank), np.int64), np.zeros((S0, cfg.qk_rope_dim), np.int64))
                compile_layer(L, P[-1:], [b[-1:] for b in Bl], Q, lcfg, cache)
        except ValueError as exc:
            raise ValueError(f"tokens = {tokens}, steps = {steps}: layer {L}: {exc}") from None


def simulate_layers(cfg, layers, tokens: int, steps: int, seed: int, pause: float = 0.0, waves: bool = False,
                    progress: bool = True) -> dict:
    """Run whole layers on the RTL (``sim/bench_top.py`` ``test_layers`` on the layer build of
    ``cfg``): each of ``layers`` on a call of ``tokens`` tokens from the zero state, then ``steps``
    decode steps. Returns ``bit_exact``, ``rows`` (each call's counters, ``instructions``
    retired, ``static`` instructions, ``macs``, ``layer``, ``tokens``; a layer's last row has
    ``error``, against the float layer), ``waves``, ``seconds``, ``build``, ``cfg`` (the layer
    build's config)."""
    from nanokpu.host.layer import layer_config
    from nanokpu.kpu.top import NanoKPU
    from sim.lib.kpu_launch import kpu_build, kpu_build_name, run_kpu_bench
    from sim.runner import BenchFailure, waves_file

    check_layers(cfg, layers, tokens, steps)
    if not 0 <= pause < 1:
        raise ValueError(f"pause = {pause}: must be in [0, 1)")
    lcfg = layer_config(cfg)
    t0 = time.time()
    stages = Progress(quiet=not progress)
    dut = NanoKPU(lcfg)
    with stages.stage(f"[nanokpu sim] build {kpu_build_name(lcfg, '_layer')} on Verilator (cached under sim_build/)"):
        build_dir = kpu_build(lcfg, waves=waves, tag="_layer", dut=dut)
    names = ", ".join(str(L) for L in layers)
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        params = {"layers": ",".join(str(L) for L in layers), "tokens": tokens, "steps": steps, "pause": pause,
                  "summary": str(summary)}
        try:
            with stages.stage(f"[nanokpu sim] run layer {names} ({tokens} tokens, then {steps} decode steps, "
                              f"seed {seed})"):
                run_kpu_bench(lcfg, "bench_top", testcase="test_layers", seed=seed, params=params, waves=waves,
                              tag="_layer", dut=dut)
        except BenchFailure as exc:
            return {"bit_exact": False, "failure": str(exc), "seconds": time.time() - t0, "cfg": lcfg}
        rows = json.loads(summary.read_text())
    return {"bit_exact": True, "rows": rows, "waves": str(waves_file(build_dir)) if waves else None,
            "seconds": time.time() - t0, "build": str(build_dir), "cfg": lcfg}


def format_layers(r: dict) -> str:
    """The summary of :func:`simulate_layers`: per layer its calls' cycles and the float error."""
    if not r.get("bit_exact"):
        return f"bit-exact: NO\n{r.get('failure', '')}"
    cfg = r["cfg"]
    lines = []
    for L in dict.fromkeys(row["layer"] for row in r["rows"]):
        rows = [row for row in r["rows"] if row["layer"] == L]
        kind = layer_name(cfg, L)
        first, steps = rows[0], rows[1:]
        ideal = first["macs"] / (cfg.rows * cfg.cols)
        spread = sorted({s["cycles"] for s in steps})
        each = f"{spread[0]:,}" + (f"-{spread[-1]:,}" if len(spread) > 1 else "") if steps else ""
        lines.append(f"layer {L} ({kind}), profile {cfg.name} with layer_ops: {first['tokens']} tokens in "
                     f"{first['cycles']:,} cycles ({first['static']} instructions, utilization "
                     f"{ideal / first['cycles']:.1%})"
                     + (f", then {len(steps)} decode steps of {each} cycles each" if steps else ""))
        state = "MLA's latent KV cache" if cfg.is_mla_layer(L) else "the KDA state"
        lines.append(f"  bit-exact with golden.layer.layer_int: yes (each call; {state} carried in host memory)")
        e = rows[-1]["error"]
        lines.append(f"  error vs the float layer: cosine {e['cosine']:.5f}, max abs {e['max_abs']:.4f}, "
                     f"rms relative {e['rms_rel']:.4f}")
    lines.append(f"({r['seconds']:.1f} s wall)")
    if r.get("waves"):
        lines.append(f"waves: {r['waves']}")
    return "\n".join(lines)


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
    if args.layer is not None:
        tokens = LAYER_TOKENS if args.tokens is None else args.tokens
        r = simulate_layers(cfg, args.layer, tokens, args.steps, args.seed, args.pause, args.waves,
                            progress=not args.quiet)
        print(format_layers(r))
        return 0 if r.get("bit_exact") else 1
    tokens = DEFAULT_TOKENS.get(args.profile, 8) if args.tokens is None else args.tokens
    check_tokens(cfg, tokens)   # before anything is built: the block must fit the scratchpads
    r = simulate(cfg, tokens, args.seed, args.pause, args.waves, progress=not args.quiet)
    print(format_summary(cfg, r))
    return 0 if r.get("bit_exact") else 1
