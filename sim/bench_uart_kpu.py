"""cocotb bench of the board design (nanokpu.board.uart_axil.UartKpu) on Verilator, through its serial line only.

The PC client :class:`nanokpu.host.client.KpuClient`, unchanged, runs in a ``cocotb`` bridge thread on
a serial port model that sends and receives the bits on ``rx``/``tx`` (``divisor`` clock cycles
a bit, as the design was built). :meth:`KpuClient.run_block` loads a compiled random block into
the on-chip host memory and the instruction memory, starts it, polls ``STATUS`` and reads the
outputs back; they must equal :func:`golden.block.latent_moe_int` bit for bit.

The nano-KPU's config comes from :func:`sim.runner.bench_config` (``run_bench(..., config=cfg)``:
the board design has no ``cfg``). Parameters (``NANOKPU_PARAMS``): ``tokens``, ``seed``, ``divisor``.
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.task import bridge

from golden.block import latent_moe_int, random_block
from nanokpu.host.client import KpuClient
from nanokpu.host.compiler import compile_block
from sim.runner import bench_config, bench_params
from sim.serial_model import open_line


@cocotb.test()
async def test_block_over_uart(dut):
    p = bench_params()
    cfg = bench_config()
    seed, tokens = int(p.get("seed", 1)), int(p.get("tokens", 4))
    dut._log.info(f"profile {cfg.name}, {tokens} tokens, seed {seed}")
    port = await open_line(dut, int(p["divisor"]))
    Q, xq, _, _ = random_block(cfg, tokens, np.random.default_rng(seed))
    prog = compile_block(Q, xq, cfg)

    @bridge
    def run():
        return KpuClient(port).run_block(prog, poll=0)

    result = await run()
    ref = latent_moe_int(xq, Q, cfg)
    for key in ("y", "idx", "weights", "loads"):
        assert np.array_equal(result["outputs"][key], ref[key]), f"seed {seed}: {key} differs from latent_moe_int"
    assert np.array_equal(result["loads"], np.minimum(ref["loads"], (1 << cfg.load_width) - 1)), \
        f"seed {seed}: load counters {result['loads']} != {ref['loads']}"
    assert int(dut.irq.value) == 1
    dut._log.info(f"seed {seed}: bit-exact over the UART, {result['cycles']} cycles, {result['instrs']} instructions")
