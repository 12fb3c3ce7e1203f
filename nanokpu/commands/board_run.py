"""``nanokpu board-run``: a random block (or one GEMM) on a board build over its UART, checked bit
for bit.

The command compiles a random block, runs it on a board and checks the result bit for bit
against :func:`golden.block.latent_moe_int`. On the ULX3S builds (``ulx3s``, ``ulx3s-45f``) the
whole nano-KPU runs it (:class:`nanokpu.host.client.KpuClient`). On the iCEBreaker build (the
GEMM engine behind the register bridge) the PC sequences the program in
:class:`~nanokpu.host.funcsim.FuncSim` and every ``GEMM`` runs on the board
(:func:`nanokpu.host.bridge_client.run_block`), the other instructions on the PC. ``--gemm M K N``
runs one random GEMM on the iCEBreaker instead, checked against :func:`golden.intops.requantize`
of :func:`golden.intops.matmul_int`::

    nanokpu board-run --port /dev/ttyUSB0 --tokens 8 --seed 1
    nanokpu board-run --board icebreaker --port /dev/ttyUSB1 --tokens 8 --seed 1
    nanokpu board-run --board icebreaker --port /dev/ttyUSB1 --gemm 16 32 16 --seed 1
"""

from __future__ import annotations

import time

from fpga.boards import BOARDS
from nanokpu.commands.args import int_in, seed
from nanokpu.config import PROFILES
from nanokpu.designs import TOP_UNIT
from nanokpu.host.bridge_client import BridgeClient, run_block, run_gemm
from nanokpu.host.client import KpuClient, serial_port
from nanokpu.units.gemm import kpu_engine


def add_arguments(parser) -> None:
    parser.add_argument("--port", required=True, help="serial port of the board (e.g. /dev/ttyUSB0, COM3)")
    parser.add_argument("--baud", type=int_in(1), default=115200)
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES),
                        help="the profile the board was built with")
    whole = " or ".join(b for b, spec in BOARDS.items() if spec.unit == TOP_UNIT)
    parts = " or ".join(b for b, spec in BOARDS.items() if spec.unit != TOP_UNIT)
    parser.add_argument("--board", default="ulx3s", choices=sorted(BOARDS),
                        help=f"the board build: {whole} (the whole nano-KPU runs the block) or {parts} "
                             "(the GEMM engine runs the block's GEMMs, the PC the rest)")
    parser.add_argument("--tokens", type=int_in(1), default=8, help="tokens of the block")
    parser.add_argument("--gemm", type=int_in(1), nargs=3, default=None, metavar=("M", "K", "N"),
                        help="icebreaker: run one random GEMM of this shape instead of a block")
    parser.add_argument("--seed", type=seed, default=1, help="random block and batch, or GEMM operands")


def run(args) -> int:
    import numpy as np

    from golden.block import latent_moe_int, random_block
    from nanokpu.config import profile
    from nanokpu.host.compiler import check_tokens, compile_block

    cfg = profile(args.profile)
    whole_kpu = BOARDS[args.board].unit == TOP_UNIT
    if args.gemm is not None:
        if whole_kpu:
            raise ValueError(f"gemm: one GEMM runs on a GEMM engine build (icebreaker), not on {args.board}")
        return _run_gemm(args, cfg)
    check_tokens(cfg, args.tokens)
    Q, xq, _, _ = random_block(cfg, args.tokens, np.random.default_rng(args.seed))
    prog = compile_block(Q, xq, cfg)
    t0 = time.monotonic()
    if not whole_kpu:
        result = run_block(BridgeClient(serial_port(args.port, args.baud), kpu_engine(cfg)), cfg, prog)
        where = (f"{result['gemms']} GEMMs ({result['macs']} MACs) on the board, the rest on the PC; "
                 f"{_traffic_text(result['traffic'])}")
    else:
        result = KpuClient.open(args.port, args.baud).run_block(prog)
        where = f"{result['cycles']} cycles on the board"
    ref = latent_moe_int(xq, Q, cfg)
    exact = all(np.array_equal(result["outputs"][k], ref[k]) for k in ("y", "idx", "weights", "loads"))
    print(f"{args.profile} block, {args.tokens} tokens, seed {args.seed}: {result['instrs']} instructions, "
          f"{where} ({time.monotonic() - t0:.1f} s with the UART transfers); "
          f"bit-exact with golden.block.latent_moe_int: {'yes' if exact else 'NO'}")
    return 0 if exact else 1


def _traffic_text(traffic: dict) -> str:
    """``BridgeClient.traffic`` as a user reads it."""
    return (f"{traffic['bytes_out']:,} bytes to the board, {traffic['bytes_in']:,} back, "
            f"{traffic['waits']:,} waits for its answer")


def _run_gemm(args, cfg) -> int:
    """``board-run --board icebreaker --gemm M K N``: one random GEMM on the board, checked bit for bit."""
    import numpy as np

    from golden.intops import matmul_int, requantize
    m, k, n = args.gemm
    rng = np.random.default_rng(args.seed)
    a, b = rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, n))
    shift = max((k << 14).bit_length() - 8, 0)   # |a @ b| < k * 2**14: the result spans int8
    client = BridgeClient(serial_port(args.port, args.baud), kpu_engine(cfg))
    t0 = time.monotonic()
    got = run_gemm(client, cfg, a, b, mult=1, shift=shift)
    out_width = client.outputs["c_out.payload"][1] // cfg.rows
    want = requantize(matmul_int(a, b, cfg.acc_width), 1, shift, out_width, cfg.rounding)
    exact = np.array_equal(got, want)
    print(f"{cfg.name} GEMM [{m}, {k}] @ [{k}, {n}] >> {shift}, seed {args.seed}, on the board "
          f"({time.monotonic() - t0:.1f} s with the UART transfers; {_traffic_text(client.traffic)}): bit-exact with "
          f"golden.intops.requantize(matmul_int(...)): {'yes' if exact else 'NO'}")
    return 0 if exact else 1
