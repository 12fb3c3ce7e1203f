"""``nanokpu bench-bridge``: what a block costs on the iCEBreaker build's serial line.

Runs ``nanokpu board-run --board icebreaker --tokens T`` on Verilator against the board design
as built for the UP5K (the GEMM engine of ``tiny`` in a :class:`~nanokpu.board.uart_bridge.UartBridge`,
SB_MAC16 by Yosys' model), the PC client talking to it over a simulated serial line
(sim/bench_uart_gemm.py ``test_block_over_uart``; the block is checked bit for bit against
:func:`golden.block.latent_moe_int`). The line counts the bytes each way and the round trips
(:class:`sim.serial_model.SerialModel`: reads that waited for the board and got their answer
with nothing left to send). From those it gives the line time at a few bit rates and the time with a USB serial
adapter's latency per round trip (:data:`LATENCIES_MS`). Writes ``docs/bench/bridge.md``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from nanokpu.commands import DOCS
from nanokpu.commands.args import int_in, out_file, seed
from nanokpu.commands.progress import add_quiet

__all__ = ["BAUDS", "LATENCIES_MS", "run_uart_gemm_bench", "measure", "bridge_table", "add_arguments", "run"]

DOC = DOCS / "bench" / "bridge.md"

#: Bit rates of the table: the default of ``nanokpu synth --board icebreaker`` and 1 Mbaud
#: (12 MHz / 12, exact on the iCEBreaker).
BAUDS = (115_200, 1_000_000)

#: Round-trip latencies of a USB serial adapter, in ms: the FTDI latency timer set to 1 ms
#: (``/sys/bus/usb-serial/devices/ttyUSB*/latency_timer``) and at its default, 16 ms.
LATENCIES_MS = (1, 16)

#: Clock cycles per bit on the simulated line (the bench's clock is 100 MHz).
DIVISOR = 4


def run_uart_gemm_bench(dsp: str = "ice40", testcase=None, *, seed: int = 3, **params) -> Path:
    """Run the cocotb module sim/bench_uart_gemm.py on the iCEBreaker board design of ``tiny``
    built with ``dsp`` (:data:`DIVISOR` cycles a bit); ``params`` reach the bench. Raises
    :class:`sim.runner.BenchFailure` if a bench test fails."""
    from nanokpu.board.uart_bridge import UartBridge
    from nanokpu.config import profile
    from nanokpu.units.gemm import kpu_engine
    from sim.runner import FAST_BUILD, run_bench, vendor_build_args, vendor_name

    cfg = profile("tiny", dsp=dsp)
    return run_bench(UartBridge(kpu_engine(cfg), clk_freq=DIVISOR * 1_000_000, baud=1_000_000),
                     vendor_name("uart_gemm_tiny", dsp), "bench_uart_gemm", config=cfg,
                     params={"seed": seed, "divisor": DIVISOR, **params},
                     testcase=testcase, seed=seed, build_args=FAST_BUILD + vendor_build_args(dsp))


def measure(tokens: int, seed: int = 3) -> dict:
    """The line's traffic for a ``tokens``-token block: ``bytes_out``, ``bytes_in``, ``waits``,
    ``round_trips``, ``cycles`` (simulated, :data:`DIVISOR` a bit), ``tokens``, ``seed``."""
    from nanokpu.config import profile
    from nanokpu.host.compiler import check_tokens

    check_tokens(profile("tiny"), tokens)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "traffic.json"
        run_uart_gemm_bench("ice40", "test_block_over_uart", seed=seed, tokens=tokens, out=str(out))
        return json.loads(out.read_text())


def bridge_table(rows: list[dict]) -> str:
    """Markdown table of measured ``rows`` (:func:`measure`): traffic, then for each bit rate of
    :data:`BAUDS` the line time (``bytes_out`` x 10 bits) and that plus ``round_trips`` x each
    latency of :data:`LATENCIES_MS`."""
    head = ["tokens", "bytes to the board", "bytes back", "round trips"]
    for baud in BAUDS:
        head += [f"line @ {baud:,}"] + [f"+ {ms} ms a trip" for ms in LATENCIES_MS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in rows:
        cells = [r["tokens"], f"{r['bytes_out']:,}", f"{r['bytes_in']:,}", f"{r['round_trips']:,}"]
        for baud in BAUDS:
            line_s = r["bytes_out"] * 10 / baud
            cells += [f"{line_s:.2f} s"] + [f"{line_s + r['round_trips'] * ms / 1000:.2f} s" for ms in LATENCIES_MS]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--tokens", type=int_in(1), nargs="+", default=[2, 8],
                        help="block sizes to run (default: 2 8)")
    parser.add_argument("--seed", type=seed, default=3, help="random block")
    parser.add_argument("--out", type=out_file, default=DOC, help="Markdown report path")
    add_quiet(parser)


def run(args) -> int:
    from nanokpu.commands.progress import Progress
    from nanokpu.config import profile
    from nanokpu.host.compiler import check_tokens

    for tokens in args.tokens:   # all of them before the first (minutes-long) run
        check_tokens(profile("tiny"), tokens)
    rows = []
    progress = Progress(quiet=args.quiet)
    progress.start(len(args.tokens), "blocks")
    for tokens in args.tokens:
        with progress.stage(f"{tokens}-token block over the simulated line (Verilator; minutes)"):
            row = measure(tokens, args.seed)
        progress.advance(f"{tokens}-token block done")
        print(f"  {row['bytes_out']:,} bytes to the board, {row['bytes_in']:,} back, "
              f"{row['round_trips']:,} round trips", flush=True)
        rows.append(row)
    lines = [
        "# The iCEBreaker build's serial line: what a block costs",
        "",
        f"Generated by `nanokpu bench-bridge --tokens {' '.join(map(str, args.tokens))} --seed {args.seed}` "
        "(nanokpu/commands/bench_bridge.py).",
        "",
        "`nanokpu board-run --board icebreaker --tokens T` runs a `tiny` LatentMoE block with every "
        "GEMM on the board's GEMM engine and the rest on the PC. Measured here on Verilator: the "
        "board design as built for the UP5K (SB_MAC16 by Yosys' model) and the unchanged PC "
        "client on a simulated serial line (sim/bench_uart_gemm.py `test_block_over_uart`), the "
        "block checked bit for bit against `golden.block.latent_moe_int`. The line counts bytes "
        "and round trips (`sim.serial_model.SerialModel`: reads that waited for the board and whose "
        "answer came with nothing left to send, so the line idled until the client had it).",
        "",
        bridge_table(rows),
        "",
        "Line time: the bytes to the board at 10 bits each (8N1), the busier direction. A USB "
        "serial adapter adds its latency to each round trip: FTDI chips (the iCEBreaker's "
        "FT2232H) wait up to their latency timer, 16 ms by default, 1 ms when set "
        "(`echo 1 > /sys/bus/usb-serial/devices/ttyUSB1/latency_timer` on Linux). The PC's own "
        "work (compiling, the non-GEMM instructions in `nanokpu.host.funcsim`) is not counted.",
        "",
        "## Why these numbers",
        "",
        "The bridge (`nanokpu/board/uart_bridge.py`) queues what it receives (one block RAM) and moves "
        "stream beats in hardware: a burst command (`B`) carries a stream transfer as its payload "
        "bytes alone and holds each beat's `valid` until `ready`, so the client sends a whole "
        "transfer without waiting for answers. It waits for the board only when it needs a value (the engine's "
        "answer to a GEMM command, the result words), at the end of each transfer (a status "
        "read that also reports a wait that ran out or lost bytes), and to keep at most a "
        "queue's worth of bytes unanswered (a status request every half queue; at 115,200 baud "
        "half a queue takes 22 ms on the line, longer than the adapter's latency, so these "
        "reads rarely leave the line idle). A GEMM costs a few round trips whatever its size. "
        "Most bytes are the A and B operand words, one byte per byte of payload (and the "
        "stream's `valid` byte); each result word costs a wait for `valid`, its reads (2 bytes "
        "per byte) and a one-beat burst on `ready`.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0
