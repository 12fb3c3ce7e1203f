"""``nanokpu bench-block``: a whole LatentMoE block on the nano-KPU RTL, cycles and utilization.

For each case of :data:`CASES` (``tiny`` with 8 tokens, ``small`` with 16, each with the
default per-tensor scheme and issue 26's ``after`` scheme, ``tiny`` per channel too) one
random block runs on Verilator through the AXI buses
(:func:`nanokpu.commands.simulate.simulate`, bit-exact checked). Reported: cycles, the ideal
``MACs / (rows * cols)`` (every GEMM multiply-accumulate of the block on a fully busy array,
nothing else), utilization = ideal / cycles, and each unit's busy share (cycles its instructions
ran / all cycles). The same run is then replayed on the same Verilog by a C++ harness with no
Python per cycle (:func:`sim.lib.raw_run.replay`; a different cycle count, register value or
host memory byte is an error): reported are the simulated cycles per second of the run phase
under cocotb and on the harness, and their ratio. Then K3 layers on ``tiny`` (:data:`LAYERS`):
the FFN half of the dense layer 0 and the LatentMoE layer 1, and a layer of each kind whole (a call of 8
tokens, then decode steps): cycles, MACs, utilization, busy shares. Written to
``docs/bench/block.md``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from golden.fidelity import AFTER
from nanokpu.commands import DOCS
from nanokpu.commands.args import out_file, seed
from nanokpu.commands.progress import add_quiet
from nanokpu.config import profile
from nanokpu.host.overlap import QUEUES, Machine, schedule
from nanokpu.isa import EXECUTORS

DOC = DOCS / "bench" / "block.md"
#: The quantisation schemes measured (docs/fidelity.md): KpuConfig fields over the profile's
SCHEMES = {"": {}, "per-channel": {"weight_scales": "channel"}, "after": AFTER}
#: (profile, tokens, scheme): one design, each scheme another program (``after`` also another
#: router requantiser's and sigmoid's widths: the 16-bit router, Q20.16 logits, per-channel scales)
CASES = (("tiny", 8, ""), ("tiny", 8, "per-channel"), ("tiny", 8, "after"), ("small", 16, ""),
         ("small", 16, "after"))


def label(name: str, scheme: str) -> str:
    """The profile's name, and the scheme's unless it is the default."""
    return f"{name} {scheme}".strip()


def add_arguments(parser) -> None:
    parser.add_argument("--profile", action="append", choices=sorted({c[0] for c in CASES}),
                        help="profile to run (repeatable; default: tiny and small)")
    parser.add_argument("--seed", type=seed, default=1)
    parser.add_argument("--out", type=out_file, default=DOC, help=f"Markdown report (default {DOC})")
    add_quiet(parser)


def gemm_tiles(cfg, tokens: int, seed: int) -> dict:
    """The block's GEMMs as the functional simulator runs them: ``tile_cycles`` = sum of
    ``ceil(m/rows) * ceil(n/cols) * k`` (the GEMM engine's compute steps, one per cycle),
    ``rows_used`` = the share of array rows holding a real token in those steps; ``trace``:
    the run's :attr:`~nanokpu.host.funcsim.RunResult.trace`."""
    import numpy as np

    from golden.block import random_block
    from nanokpu.host.compiler import compile_block
    from nanokpu.host.funcsim import FuncSim
    Q, xq, _, _ = random_block(cfg, tokens, np.random.default_rng(seed))
    prog = compile_block(Q, xq, cfg)
    res = FuncSim(cfg, prog.image).run(prog.instrs)
    tiles = sum(-(-m // cfg.rows) * -(-n // cfg.cols) * k for m, k, n in res.gemms)
    return {"tile_cycles": tiles, "rows_used": res.macs / (tiles * cfg.rows * cfg.cols),
            "gemms": len(res.gemms), "expert_rows": [m for m, k, n in res.gemms], "trace": res.trace}


#: The decoupled machines of :mod:`nanokpu.host.overlap` the benchmark replays each block on.
MACHINES = {"queues": Machine(), "queues, reordered, renamed": Machine(hazards=("raw",), in_order=False)}


def overlap(trace: list, busy_trace: list) -> dict:
    """Each of :data:`MACHINES`' :class:`~nanokpu.host.overlap.Schedule` of a block: ``trace``
    its FuncSim trace, ``busy_trace`` the RTL's ``(executor index, cycles)`` per executor
    instruction (:func:`~nanokpu.commands.simulate.simulate` with ``trace``); ``ValueError``
    when the two runs' executor instructions differ."""
    executed = [acc for acc in trace if acc.executor is not None]
    if [EXECUTORS[x] for x, _ in busy_trace] != [acc.executor for acc in executed]:
        raise ValueError(f"the RTL ran {len(busy_trace)} executor instructions, FuncSim {len(executed)}, "
                         "or their executors differ")
    it = iter(c for _, c in busy_trace)
    cycles = [next(it) if acc.executor is not None else 0 for acc in trace]
    return {name: schedule(trace, cycles, machine) for name, machine in MACHINES.items()}


def overlap_table(rows: list[tuple]) -> str:
    lines = ["| profile | serial cycles (RTL) | machine | cycles | utilization | share of the roofline | "
             + " | ".join(f"{q} busy" for q in QUEUES) + " | waiting on a dependency | waiting on a resource |",
             "|---|---:|---|---:|---:|---:|" + "---:|" * (len(QUEUES) + 2)]
    for cfg, r in rows:
        ideal = r["macs"] / (cfg.rows * cfg.cols)
        _, bound = roofline(cfg, r)
        for name, s in r["overlap"].items():
            waits = {cause: sum(q[cause] for q in s.stalls.values()) for cause in ("dependency", "resource")}
            lines.append(f"| {r['label']} | {r['cycles']} | {name} | {s.cycles} | {ideal / s.cycles:.1%} | "
                         f"{bound / s.cycles:.1%} | " + " | ".join(f"{s.busy[q] / s.cycles:.1%}" for q in QUEUES)
                         + f" | {waits['dependency']} | {waits['resource']} |")
    return "\n".join(lines)


OVERLAP = """
## Decoupled execution: the queue model

The same blocks replayed on a model of decoupled execution (`nanokpu.host.overlap`): the
FuncSim trace (what each instruction reads and writes, the decode's intervals) and each
executor instruction's cycles as the RTL run above measured them (`BUSY`, per instruction),
scheduled on four in-order queues (load, GEMM, element-wise/route/move, store; depth 4, a
cycle of issue each) that respect RAW, WAR and WAW between the intervals and share the AXI4
master's read channel (`LOAD`, `GEMM`'s weights). *queues*: today's program on that machine;
*queues, reordered, renamed*: a list schedule of the RAW graph alone, as if the compiler had
reordered the program perfectly and renamed every buffer. Waiting: instruction-cycles between
entering a queue and starting, summed over the instructions. The roofline is the table above's.

{table}
"""


def table(rows: list[tuple]) -> str:
    head = ("| profile | tokens | array | instructions | cycles | MACs | ideal cycles | utilization | "
            + " | ".join(f"{u} busy" for u in EXECUTORS)
            + " | GEMM tile steps | array rows used in them | bit-exact | cosine vs float |")
    sep = "|" + "---|" * (12 + len(EXECUTORS))
    lines = [head, sep]
    for cfg, r in rows:
        ideal = r["macs"] / (cfg.rows * cfg.cols)
        lines.append(
            f"| {r['label']} | {r['tokens']} | {cfg.rows}x{cfg.cols} | {r['instructions']} | {r['cycles']} | "
            f"{r['macs']} | {ideal:.0f} | {ideal / r['cycles']:.1%} | "
            + " | ".join(f"{r[u] / r['cycles']:.1%}" for u in EXECUTORS)
            + f" | {r['tile_cycles']} | {r['rows_used']:.1%}"
            + f" | {'yes' if r['bit_exact'] else 'NO'} | {r['error']['cosine']:.4f} |")
    return "\n".join(lines)


#: The executors whose work can overlap with perfect scheduling: the busy counters of
#: isa.EXECUTORS grouped by the component that runs them (act and vector: the element-wise one).
COMPONENTS = {"load/store": ("dma",), "GEMM": ("gemm",), "element-wise": ("act", "vector"),
              "route": ("route",), "move": ("move",)}


def roofline(cfg, r) -> tuple[str, int]:
    """``(component, busy cycles)`` of the busiest executor: with the controller's cycles hidden
    and the executors overlapping perfectly, the block takes no fewer cycles."""
    busy = {name: sum(r[u] for u in units) for name, units in COMPONENTS.items()}
    name = max(busy, key=busy.get)
    return name, busy[name]


def roofline_table(rows: list[tuple]) -> str:
    lines = ["| profile | cycles | roofline cycles | binding executor | roofline utilization | "
             "share of the roofline reached | " + " | ".join(f"{n} busy" for n in COMPONENTS) + " |",
             "|---|---:|---:|---|---:|---:|" + "---:|" * len(COMPONENTS)]
    for cfg, r in rows:
        name, bound = roofline(cfg, r)
        ideal = r["macs"] / (cfg.rows * cfg.cols)
        lines.append(f"| {r['label']} | {r['cycles']} | {bound} | {name} | {ideal / bound:.1%} | "
                     f"{bound / r['cycles']:.1%} | "
                     + " | ".join(f"{sum(r[u] for u in units) / r['cycles']:.1%}" for units in COMPONENTS.values())
                     + " |")
    return "\n".join(lines)


LAYERS = """
## Parts of a K3 layer

The FFN half of a layer (`nanokpu.host.layer`: Attention Residuals over the finished blocks and
`P`, the weighted RMSNorm as NORM and MUL, the FFN, the residual ADD; three programs linked into
one) on `tiny` with issue 26's after scheme and `layer_ops`, 8 tokens, no bus stalls, each
bit-exact to `golden.layer.ffn_sublayer_int` (`sim/bench_top.py` `test_ffn_sublayer`, seed
{seed}). Layer 0's FFN is dense (SiTU-GLU, `d_dense` wide), layer 1's the LatentMoE block.

{table}

## Whole K3 layers

A whole layer of each kind (`nanokpu.host.layer.compile_layer`: the mixer's Attention Residuals
and RMSNorm, the KDA or MLA mixer, the residual add, then the FFN half above; six programs linked
into one) on `tiny` per tensor with `layer_ops` and a 128-instruction memory (the build of
`nanokpu sim --layer` and the main job), no bus stalls, from the zero state: 8 tokens in one
call, then 4 decode steps of a token each with the KDA state or the MLA cache read back from host
memory between calls, each call bit-exact to `golden.layer.layer_int` (`sim/bench_top.py`
`test_layers`, seed {seed}). A decode step's row is the mean of the 4 (an MLA step's cost grows
with its cache: each attends to one key more); the vector unit's share includes `KDA_STEP` and
`ATTEND`.

{whole}
"""

#: The parts of a layer measured (:data:`LAYERS`): the design (tiny, after scheme, layer_ops).
LAYER_CFG = {**AFTER, "layer_ops": True}


def layer_parts(seed: int) -> list[dict]:
    """Run ``test_ffn_sublayer`` on the tiny KPU of :data:`LAYER_CFG` without bus stalls; its rows."""
    import json

    from sim.lib.kpu_launch import run_kpu_bench
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "layers.json"
        run_kpu_bench(profile("tiny", **LAYER_CFG), "bench_top", testcase="test_ffn_sublayer", seed=seed,
                      params={"summary": str(summary), "pause": 0.0}, fast=True, tag="_after_layer")
        return json.loads(summary.read_text())


def whole_layers(seed: int) -> list[dict]:
    """Run ``test_layers`` (a layer of each kind, :func:`~nanokpu.commands.simulate.layer_kinds`: 8
    tokens, then 4 decode steps) on the layer build of tiny (per tensor: the build of ``nanokpu sim
    --layer`` and the main job) without bus stalls; the summary rows."""
    from nanokpu.commands.simulate import layer_kinds, simulate_layers

    r = simulate_layers(profile("tiny"), layer_kinds(profile("tiny")), 8, 4, seed, progress=False)
    if not r.get("bit_exact"):
        raise RuntimeError(f"whole layers: NOT bit-exact: {r.get('failure')}")
    return r["rows"]


def whole_layer_table(rows: list[dict]) -> str:
    """Per layer: its first call, and its decode steps' mean."""
    cfg = profile("tiny")
    lines = ["| layer | FFN | call | tokens | instructions (program) | instructions retired | cycles | MACs | "
             "ideal cycles | utilization | " + " | ".join(f"{u} busy" for u in EXECUTORS) + " |",
             "|" + "---|" * (10 + len(EXECUTORS))]
    for L in dict.fromkeys(r["layer"] for r in rows):
        mine = [r for r in rows if r["layer"] == L]
        kind = "dense" if L < cfg.dense_layers else "LatentMoE"
        for call, group in (("first", mine[:1]), (f"decode step (mean of {len(mine) - 1})", mine[1:])):
            if not group:
                continue
            mean = {k: sum(r[k] for r in group) / len(group) for k in ("cycles", "macs", "instructions", "static",
                                                                        *EXECUTORS)}
            ideal = mean["macs"] / (cfg.rows * cfg.cols)
            mixer = "MLA" if cfg.is_mla_layer(L) else "KDA"
            lines.append(f"| {L} ({mixer}) | {kind} | {call} | {group[0]['tokens']} | {mean['static']:.0f} | "
                         f"{mean['instructions']:.0f} | {mean['cycles']:,.0f} | {mean['macs']:.0f} | {ideal:.0f} | "
                         f"{ideal / mean['cycles']:.1%} | "
                         + " | ".join(f"{mean[u] / mean['cycles']:.1%}" for u in EXECUTORS) + " |")
    return "\n".join(lines)


def layer_table(rows: list[dict]) -> str:
    cfg = profile("tiny", **LAYER_CFG)
    head = ("| part | FFN | tokens | candidates | instructions | cycles | MACs | ideal cycles | utilization | "
            + " | ".join(f"{u} busy" for u in EXECUTORS) + " |")
    lines = [head, "|" + "---|" * (9 + len(EXECUTORS))]
    for r in rows:
        ideal = r["macs"] / (cfg.rows * cfg.cols)
        kind = "dense" if r["layer"] < cfg.dense_layers else "LatentMoE"
        lines.append(f"| FFN half of layer {r['layer']} | {kind} | {r['tokens']} | {r['candidates']} | "
                     f"{r['instructions']} | {r['cycles']} | {r['macs']} | {ideal:.0f} | {ideal / r['cycles']:.1%} | "
                     + " | ".join(f"{r[u] / r['cycles']:.1%}" for u in EXECUTORS) + " |")
    return "\n".join(lines)


ROOFLINE = """
## Roofline: what overlapping today's executors would give

The busiest executor's cycles bound the block from below once instructions overlap perfectly
(the controller's cycles hidden, every executor busy in parallel): the roofline. Its utilization is the
ideal cycles over it; the share reached is the roofline over the measured cycles.

{table}
"""


def speed_table(rows: list[tuple]) -> str:
    """Simulation speed of each profile's block: cocotb against the C++ harness (``r["speed"]``,
    :func:`sim.lib.raw_run.replay`)."""
    lines = ["| profile | cycles | AXI4 data beats per cycle | cocotb cycles/s | C++ harness cycles/s | "
             "cocotb / harness | same cycles, registers and host memory |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for _cfg, r in rows:
        s = r["speed"]
        lines.append(f"| {r['label']} | {s['cycles']} | {s['beats'] / s['raw']['clocks']:.2f} | "
                     f"{s['cocotb']['cycles_per_s']:,.0f} | {s['raw']['cycles_per_s']:,.0f} | {s['ratio']:.1%} | yes |")
    return "\n".join(lines)


SPEED = """
## Simulation speed

Each block above runs twice on the same Verilog: under the cocotb bench (Python bus models,
cocotbext-axi), then on a C++ harness (`sim/raw/harness.cpp`: a plain Verilator build, no Python,
no VPI) that replays the host's AXI4-Lite traffic and answers the KPU's AXI4 bursts with
cocotbext-axi's timing. Both runs end with the same `CYCLES`, the same register reads and the
same host memory (checked: a difference fails the command). Speeds are simulated clock cycles
per wall second of the run phase (from the start to the last poll of `STATUS`; no build, no
loading), measured once on a shared 2-core machine.

{table}

The ratio is the share of the bare model's speed that the Python bench keeps. Python does not
run between bus transfers (cocotb's C++ clock; the host sleeps until `irq` rises instead of
counting cycles). What is left is cocotbext-axi's Python for every data beat (its channel tasks
and the RAM's process wake on each), cocotb's work at every simulated time step, and the cocotb
build of the model itself (`--vpi --public-flat-rw` keep every signal visible, which makes the
model slower than the harness's plain build).
"""


EXPLANATION = """
## Where the cycles go

One instruction runs at a time; the busy counters (registers ``BUSY+4u``) count the cycles of
each executor's instructions, the rest is the controller's (measured below): the issue cycle
between two executors' instructions, ``JUMP`` and ``EXPERT``, and the fetch and decode that did
not overlap an executor's instruction (the next one is prefetched while it runs; not the first
one, nor after ``JUMP`` and ``EXPERT``, nor what a short instruction leaves: the fetch reads the 8
words of an instruction one per cycle, the decode computes the products of the instruction's
fields one after the other on one shift-add lane, 10 cycles plus a cycle per bit of each
multiplier, checks included). Utilization factors exactly into three measured terms:

    utilization = MACs / (rows*cols * cycles)
                = (GEMM busy / cycles) * (tile steps / GEMM busy) * (rows used in the tile steps)

{decomposition}

* **Rows used** is the big loss on `small`: after grouping, an expert sees 1-3 of the 16 tokens
  (64 slots over ~40 experts), so its GEMMs fill 1-3 of the 8 array rows while every weight
  beat is streamed in. This is the weight-bandwidth bound of MoE at small batch, the same on
  real hardware; more tokens per batch (or per expert) raise it directly.
* **Tile steps / GEMM busy** is what a GEMM costs besides its ``ceil(M/rows)*ceil(N/cols)*K``
  steps: the engine's checks, the array's drain and the store of ``ceil(M/rows)*N`` result words
  (a word a cycle), each GEMM's few cycles of issue. The scratchpad is banked (``B`` = the
  largest power of two ``<= rows`` banks, ``B`` consecutive words a read or write), so A is read
  ``B`` columns of a row a read (a word a cycle while a row block has at most ``B`` real rows)
  and a result row's ``B`` columns are one write; on `tiny` (K = 16-32) the fixed costs still
  weigh.
* **act** (sigmoid, SiTU, the requantiser of ``h``; the GEMMs' requantisers are fused into the
  GEMM engine's store phase) and **vector** (combine, RMSNorm, add) stream one element per cycle
  through the scratchpad, but ``REQUANT`` a word of ``rows`` values per cycle (one wide read, one
  wide write); RMSNorm reads each row twice and adds, per row, a mean (a shift when the row
  length is a power of two, else the sequential divider, a step per quotient bit), a square
  root (a step per two bits) and a reciprocal (the divider): 36 cycles on `tiny`.
  **route** is the bias load, the scores (one read per score), the routes written and counted,
  then the dispatch lists by a counting sort (3 cycles per expert, 4 per slot); **move** is
  gather/scatter, ``B`` words a read (``B`` = the scratchpad's banks; the next row's list word
  and address prepared under the copy, 5 + bit_length(r) cycles a row at least); **dma** is
  LOAD and STORE at a bus beat per cycle.

What would raise it, in order: overlapping the GEMM of one expert with the gather/activation
work of the next (today one instruction runs at a time), larger batches per expert, the
activation and vector units fed ``rows`` elements a cycle, a wider weight bus.
"""


def decomposition(rows: list[tuple]) -> str:
    lines = []
    for cfg, r in rows:
        g = r["gemm"] / r["cycles"]
        t = r["tile_cycles"] / r["gemm"]
        u = r["macs"] / (cfg.rows * cfg.cols * r["cycles"])
        ctrl = r["cycles"] - sum(r[unit] for unit in EXECUTORS)
        lines.append(f"* `{r['label']}`: {u:.1%} = {g:.1%} (GEMM busy) x {t:.1%} (tile steps) x "
                     f"{r['rows_used']:.1%} (rows used); the controller {ctrl / r['cycles']:.1%} of the "
                     f"cycles, {ctrl / r['instructions']:.1f} per instruction")
    return "\n".join(lines)


def run(args) -> int:
    from nanokpu.commands.progress import Progress
    from nanokpu.commands.simulate import simulate
    from sim.lib.raw_run import ReplayMismatch, replay
    wanted = args.profile or [c[0] for c in CASES]
    rows = []
    cases = [c for c in CASES if c[0] in wanted]
    with Progress(quiet=args.quiet) as progress:
        progress.start(len(cases), "blocks")
        for name, tokens, scheme in cases:
            cfg = profile(name, **SCHEMES[scheme])
            tag = label(name, scheme)
            with tempfile.TemporaryDirectory() as tmp:
                with progress.stage(f"[bench-block] {tag}: {tokens} tokens"):
                    r = simulate(cfg, tokens, args.seed, progress=False, replay=Path(tmp), trace=True)
                if not r.get("bit_exact"):
                    progress.close()
                    print(f"[bench-block] {tag}: NOT bit-exact: {r.get('failure')}")
                    return 1
                try:
                    with progress.stage(f"[bench-block] {tag}: the same run on the C++ harness"):
                        r["speed"] = replay(Path(tmp), Path(r["build"]))
                except ReplayMismatch as exc:
                    progress.close()
                    print(f"[bench-block] {tag}: the C++ harness diverged from the cocotb run: {exc}")
                    return 1
            r.update(gemm_tiles(cfg, tokens, args.seed), label=tag)
            r["overlap"] = overlap(r.pop("trace"), r.pop("busy_trace"))
            rows.append((cfg, r))
            progress.advance(f"{tag}: {r['cycles']:,} cycles")
        with progress.stage("[bench-block] the FFN half of layers 0 and 1 (tiny, after scheme, layer_ops)"):
            layers = layer_table(layer_parts(args.seed))
        with progress.stage("[bench-block] whole layers 0, 1 and 3 (tiny, layer_ops)"):
            whole = whole_layer_table(whole_layers(args.seed))
    text = table(rows)
    speeds = speed_table(rows)
    roof = roofline_table(rows)
    queues = overlap_table(rows)
    print(text)
    print(decomposition(rows))
    print(roof)
    print(queues)
    print(layers)
    print(whole)
    print(speeds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("# A whole LatentMoE block on the nano-KPU RTL\n\n"
                        "Generated by `nanokpu bench-block` (Verilator, through the AXI buses, "
                        f"seed {args.seed}, no bus stalls).\n\n" + text + "\n"
                        + ROOFLINE.format(table=roof)
                        + OVERLAP.format(table=queues)
                        + LAYERS.format(seed=args.seed, table=layers, whole=whole)
                        + SPEED.format(table=speeds)
                        + EXPLANATION.format(decomposition=decomposition(rows)))
    print(f"wrote {args.out}")
    return 0
