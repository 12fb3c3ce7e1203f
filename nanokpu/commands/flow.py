"""``nanokpu flow``: the main job. It generates, simulates and synthesizes one nano-KPU.

The steps, each printed as it runs:

1. golden: one LatentMoE block on the float and the integer path (:mod:`nanokpu.commands.demo`);
2. generate: the Verilog of every unit into ``rtl/<profile>/`` (:mod:`nanokpu.commands.generate`);
3. simulate: a block on the nano-KPU RTL on Verilator through its AXI interfaces, checked bit
   for bit against the golden integer block, then a layer of each kind (the dense one, KDA and
   LatentMoE, MLA and LatentMoE: :func:`~nanokpu.commands.simulate.layer_kinds`) on the profile
   built with ``layer_ops``, each a call and decode steps checked against the golden integer layer
   (:mod:`nanokpu.commands.simulate`);
4. synthesize: the whole nano-KPU with Yosys and nextpnr for the profile's FPGA
   (:data:`nanokpu.commands.synth.DEFAULT_TARGET`: ``tiny`` on the ECP5-25F, ``small`` on the
   ECP5-85F), placed and routed with its Fmax. Reports land in ``fpga/build/flow/``.

It ends with a summary of what it did and where the outputs are. It exits non-zero if the RTL
is not bit-exact or the design has latches or unmapped cells.
"""

from __future__ import annotations

import time

import numpy as np

from fpga.flow import TARGETS
from nanokpu.commands import ROOT
from nanokpu.commands.args import seed
from nanokpu.commands.progress import Progress, add_quiet
from nanokpu.config import profile

#: Where the main job's synthesis reports go (git-ignored, beside the tools' build directories).
FLOW_DIR = ROOT / "fpga" / "build" / "flow"


def _step(n: int, title: str) -> float:
    print(f"\n== [{n}/4] {title}", flush=True)
    return time.perf_counter()


def _synthesize(cfg, target: str, seed: int, progress=None, pnr: bool = True) -> dict:
    """The ``kpu`` of ``cfg`` through Yosys and (with ``pnr``) nextpnr on ``target``; the report is
    written to :data:`FLOW_DIR` (JSON, Markdown, PNG) next to the tools' logs."""
    from fpga.report import write_reports
    from nanokpu.commands import synth

    r = synth.run_units(cfg.name, target, ["kpu"], pnr=pnr, seed=seed, progress=progress)[0]  # prints its summary
    print(f"  tool logs: {r['build_dir']}/")
    for path in write_reports([r], FLOW_DIR, f"{cfg.name}-{target}", f"nanokpu flow --profile {cfg.name}"):
        print(f"  wrote {path}")
    return r


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--seed", type=seed, default=1)
    parser.add_argument("--target", default=None, choices=sorted(TARGETS),
                        help="FPGA target (default: the profile's own)")
    parser.add_argument("--no-synth", action="store_true", help="skip step 4 (Yosys and nextpnr)")
    parser.add_argument("--no-pnr", action="store_true",
                        help="step 4 runs Yosys only (resources, fit against the part): no place and route, no Fmax")
    add_quiet(parser)


#: Decode steps after the call of LAYER_TOKENS tokens of each whole layer the main job runs (step 3).
FLOW_STEPS = 2


def run(args) -> int:
    from fpga.flow import summary_line
    from nanokpu.commands import demo, generate, simulate, synth

    cfg = profile(args.profile)
    done: list[str] = []
    t_all = time.perf_counter()
    progress = Progress(quiet=args.quiet)
    progress.start(4 - args.no_synth, "steps")

    t0 = _step(1, f"golden model: one LatentMoE block of profile '{cfg.name}'")
    for line in demo.block_summary(cfg, 32, np.random.default_rng(args.seed)):
        print(line)
    done.append(f"golden block ran on the float and integer paths ({time.perf_counter() - t0:.1f} s)")
    progress.advance("golden model done")

    t0 = _step(2, "generate Verilog")
    paths = generate.generate(cfg.name, generate.RTL_DIR / cfg.name)
    for path in paths:
        print(f"  wrote {path.relative_to(generate.RTL_DIR.parent)} ({path.stat().st_size:,} bytes)")
    verilog = sum(path.suffix == ".v" for path in paths)
    done.append(f"generated {verilog} Verilog files, config.json and the C header nanokpu.h in rtl/{cfg.name}/ "
                f"({time.perf_counter() - t0:.1f} s)")
    progress.advance("generate done")

    layers = simulate.layer_kinds(cfg)
    names = ", ".join(str(L) for L in layers)
    t0 = _step(3, f"simulate a block and layers {names} on the RTL (Verilator, cocotb, AXI)")
    tokens = simulate.DEFAULT_TOKENS.get(cfg.name, 8)
    result = simulate.simulate(cfg, tokens, args.seed, pause=0.2, progress=not args.quiet)
    print(simulate.format_summary(cfg, result))
    exact = bool(result.get("bit_exact"))
    done.append(f"simulated {tokens} tokens on the RTL: "
                + (f"{result['cycles']:,} cycles, bit-exact with the golden integer block"
                   if exact else "NOT bit-exact"))
    layer = simulate.simulate_layers(cfg, layers, simulate.LAYER_TOKENS, FLOW_STEPS, args.seed, pause=0.2,
                                     progress=not args.quiet)
    print(simulate.format_layers(layer))
    layer_exact = bool(layer.get("bit_exact"))
    for L in layers:
        rows = [r for r in layer.get("rows", []) if r["layer"] == L]
        state = "the MLA cache" if cfg.is_mla_layer(L) else "the KDA state"
        done.append(f"simulated layer {L} ({simulate.layer_name(cfg, L)}; built with layer_ops) on the RTL: "
                    f"{simulate.LAYER_TOKENS} tokens, then {FLOW_STEPS} decode steps carrying {state}: "
                    + (f"{sum(r['cycles'] for r in rows):,} cycles, bit-exact with the golden integer layer "
                       f"(cosine {rows[-1]['error']['cosine']:.5f} against the float layer)"
                       if layer_exact else "NOT bit-exact"))
    exact &= layer_exact
    progress.advance("simulate done")

    status = 0 if exact else 1
    if args.no_synth:
        done.append("synthesis skipped (--no-synth)")
    else:
        target = args.target or synth.DEFAULT_TARGET[cfg.name]
        tools = "Yosys" if args.no_pnr else "Yosys, nextpnr"
        t0 = _step(4, f"synthesize the nano-KPU for {target} ({tools}; takes minutes)")
        r = _synthesize(cfg, target, args.seed, progress, pnr=not args.no_pnr)
        progress.advance("synthesize done")
        status |= bool(r["latches"] or r["unmapped"] or r.get("over"))
        done.append(f"synthesized for {target}: {summary_line(r)} ({time.perf_counter() - t0:.0f} s)")
        if args.no_pnr:
            done.append("place and route skipped (--no-pnr): no Fmax; synthesis reports in fpga/build/flow/")
        else:
            done.append(f"synthesis reports in fpga/build/flow/ (Fmax of nextpnr seed {args.seed}: placements "
                        "differ by about 10 % from seed to seed; fpga/reports/summary.md gives the committed figures "
                        "and seeds)")

    progress.close()
    print(f"\n== nanokpu flow, profile '{cfg.name}': done in {time.perf_counter() - t_all:.0f} s")
    for line in done:
        print(f"  - {line}")
    return status

