"""cocotb bench of the iCEBreaker board design (the GEMM engine in a UartBridge) through its serial line.

The PC client :func:`nanokpu.host.bridge_client.run_gemm`, unchanged, runs in a ``cocotb`` bridge
thread on :class:`sim.serial_model.SerialModel`: random GEMMs with edge tiles, the extreme
operands with saturating and rounding requantiser settings, each checked bit for bit against
:func:`golden.intops.requantize` of :func:`golden.intops.matmul_int`; then a command the engine
must refuse (K beyond a B panel), which the client must report by its error code; a client
that stops in the middle of a GEMM, after which a new client (its break resets the bridge and
the engine) runs one bit-exact; and what ``nanokpu board-run --board icebreaker`` runs, a
``tokens``-token block whose GEMMs all run on the bench's engine
(:func:`nanokpu.host.bridge_client.run_block`, checked against :func:`golden.block.latent_moe_int`;
``test_block_over_uart``, which writes the line's traffic to ``out``).

The engine's config (its ``dsp`` included) comes from :func:`sim.runner.bench_config`
(``run_bench(..., config=cfg)``: the bridge has no ``cfg``). Parameters (``NANOKPU_PARAMS``):
``seed``, ``divisor``, ``tokens`` (default 2), ``out`` (a JSON path, optional).
"""

from __future__ import annotations

import json

import cocotb
import numpy as np
from cocotb.simtime import get_sim_time
from cocotb.task import bridge

from golden.block import latent_moe_int, random_block
from golden.intops import matmul_int, requantize
from nanokpu.gemm_layout import a_words, command_word
from nanokpu.host.bridge_client import BridgeClient, run_block, run_gemm
from nanokpu.host.compiler import compile_block
from nanokpu.units.gemm import kpu_engine
from sim.runner import bench_config, bench_params
from sim.serial_model import open_line

#: Wall-clock seconds a stream may stall in the client (the simulation is slower than a board).
TIMEOUT_S = 120.0


@cocotb.test()
async def test_gemms_over_uart(dut):
    p = bench_params()
    cfg = bench_config()
    seed = int(p.get("seed", 1))
    rng = np.random.default_rng(seed)
    dut._log.info(f"profile {cfg.name}, dsp {cfg.dsp}, seed {seed}")
    port = await open_line(dut, int(p["divisor"]))
    client = await bridge(lambda: BridgeClient(port, kpu_engine(cfg)))()   # it starts with a break
    out_width = client.outputs["c_out.payload"][1] // cfg.rows
    top = (1 << cfg.mult_width) - 1   # 8 * 128**2 * top overflows the acc_width-bit output
    cases = [  # (a, b, mult, shift, what)
        (rng.integers(-128, 128, (5, 9)), rng.integers(-128, 128, (9, 6)), 1 << 12, 18, "edge tiles"),
        (rng.integers(-128, 128, (3, 16)), rng.integers(-128, 128, (16, 2)), 3, 7, "one row block"),
        (np.full((4, 8), -128), np.full((8, 4), -128), top, 0, "extremes: saturates high"),
        (np.full((4, 8), -128), np.full((8, 4), 127), top, 0, "extremes: saturates low"),
        (np.full((4, 8), -128), np.full((8, 4), -128), 1, 0, "extremes: raw accumulators"),
        (rng.integers(-128, 128, (4, 4)), rng.integers(-128, 128, (4, 4)), 1, 1, "halves: rounding ties"),
    ]
    for a, b, mult, shift, what in cases:
        @bridge
        def gemm(a=a, b=b, mult=mult, shift=shift):
            return run_gemm(client, cfg, a, b, mult=mult, shift=shift, timeout=TIMEOUT_S)

        got = await gemm()
        want = requantize(matmul_int(a, b, cfg.acc_width), mult, shift, out_width, cfg.rounding)
        assert np.array_equal(got, want), f"seed {seed}, {what}: got\n{got}\nwant\n{want}"
        dut._log.info(f"{what}: {a.shape} @ {b.shape} bit-exact over the UART")

    k_big = cfg.spad_b_depth // 2 + 1

    @bridge
    def refused():
        try:
            run_gemm(client, cfg, np.zeros((1, k_big), int), np.zeros((k_big, 1), int), timeout=TIMEOUT_S)
        except RuntimeError as exc:
            return str(exc)
        return None

    message = await refused()
    assert message is not None and message.endswith("K_TOO_LARGE"), f"seed {seed}: {message!r}"

    a, b = rng.integers(-128, 128, (8, 8)), rng.integers(-128, 128, (8, 8))

    @bridge
    def abandoned():
        """A client that stops in the middle of a GEMM (the command taken, half of A sent, a
        wait for a result that never comes queued with a write behind it), then a new client
        on the same line: its break must clear all that."""
        client.set("cmd.payload", command_word(cfg, m=8, k=8, n=8, mult=1, shift=0,
                                               load_a=1, compute=1, store=1))
        client.handshake("cmd.valid", "cmd.ready")
        words = a_words(cfg, a)
        client.send("a_in", words[:len(words) // 2])
        client.until("c_out.valid")
        client.set("b_in.payload", 0x5A5A)
        return run_gemm(BridgeClient(port, kpu_engine(cfg)), cfg, a, b, timeout=TIMEOUT_S)

    got = await abandoned()
    want = requantize(matmul_int(a, b, cfg.acc_width), 1, 0, out_width, cfg.rounding)
    assert np.array_equal(got, want), f"seed {seed}, after a client stopped mid-GEMM: got\n{got}\nwant\n{want}"
    dut._log.info("a new client's break cleared a GEMM left half done")


@cocotb.test()
async def test_block_over_uart(dut):
    """``board-run --tokens T``: the block bit-exact, every GEMM on the bench's engine; the
    traffic on the line (bytes each way, reads that waited for the design) logged and, with
    ``out``, written as JSON."""
    p = bench_params()
    seed, tokens = int(p.get("seed", 1)), int(p.get("tokens", 2))
    cfg = bench_config()
    Q, xq, _, _ = random_block(cfg, tokens, np.random.default_rng(seed))
    prog = compile_block(Q, xq, cfg)
    port = await open_line(dut, int(p["divisor"]))
    t0 = get_sim_time("ns")
    result = await bridge(lambda: run_block(BridgeClient(port, kpu_engine(cfg)), cfg, prog))()
    ref = latent_moe_int(xq, Q, cfg)
    for key in ("y", "idx", "weights", "loads"):
        assert np.array_equal(result["outputs"][key], ref[key]), \
            f"seed {seed}, {tokens} tokens: {key} differs from golden.block.latent_moe_int"
    cycles = round((get_sim_time("ns") - t0) / 10)
    traffic = {**port.traffic, "tokens": tokens, "seed": seed, "divisor": int(p["divisor"]), "cycles": cycles}
    dut._log.info(f"the {tokens}-token block over the line: {traffic}")
    if p.get("out"):
        with open(p["out"], "w") as f:
            json.dump(traffic, f)
