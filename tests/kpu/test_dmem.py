# amaranth: UnusedElaboratable=no
"""The data scratchpad (nanokpu.kpu.dmem.DataMemory): its contract on the Amaranth simulator
(``generic`` 2R1W and ``ecp5`` true-dual-port block RAM) and how many RAM blocks it maps to."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from fpga.flow import BUILD_DIR, synthesize
from nanokpu.config import profile
from nanokpu.kpu.dmem import DataMemory, banks, writes_block_reads
from nanokpu.kpu.top import NanoKPU
from sim.lib.dmem_model import DmemModel, random_ops


@pytest.mark.parametrize("dsp, rows, seed", [("generic", 4, 1), ("generic", 4, 2), ("ecp5", 4, 3), ("ecp5", 4, 4),
                                             ("generic", 8, 5), ("ecp5", 3, 6), ("generic", 1, 7), ("ecp5", 1, 8)])
def test_contract(dsp, rows, seed):
    """A wide read port (B lanes at any alignment), a narrow one and a masked wide write port,
    the write performed an edge after it is issued; data holds while en is low; a read of a
    word while it is being written is undefined (generic, not checked) or not performed
    (ecp5); addresses wrap."""
    cfg = profile("tiny", dmem_depth=64, dsp=dsp, rows=rows)
    dut = DataMemory(cfg)
    B = banks(cfg)
    assert B == {1: 1, 3: 2, 4: 4, 8: 8}[rows]
    model = DmemModel(writes_block_reads(cfg), B, cfg.dmem_depth)
    ops = random_ops(cfg.dmem_depth, B, 32, 1500, np.random.default_rng(seed))

    async def tb(ctx):
        ports = (dut.rd0, dut.rd1)
        for n, (reads, (wr_en, wr_addr, lanes)) in enumerate(ops):
            for (en, addr), port in zip(reads, ports, strict=True):
                ctx.set(port.en, en)
                ctx.set(port.addr, addr)
            ctx.set(dut.wr.en, wr_en)
            ctx.set(dut.wr.addr, wr_addr)
            ctx.set(dut.wr.data, lanes[0])
            for i, v in enumerate(lanes[1:]):
                ctx.set(dut.wr.upper[i], v or 0)
            ctx.set(dut.wr.upper_en, sum(1 << i for i, v in enumerate(lanes[1:]) if v is not None))
            assert ctx.get(dut.writing) == model.writing, f"seed {seed} cycle {n}: writing"
            await ctx.tick()
            model.edge(reads, (wr_en, wr_addr, lanes))
            got = [[ctx.get(dut.rd0.lanes[i]) for i in range(B)], [ctx.get(dut.rd1.data)]]
            assert ctx.get(dut.rd0.data) == got[0][0]
            got = [[g if w is not None else None for g, w in zip(gp, wp, strict=True)]
                   for gp, wp in zip(got, model.data, strict=True)]
            assert got == model.data, f"seed {seed} cycle {n}: {got} != {model.data} ({reads}, {lanes})"

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()


def test_the_whole_kpu_is_not_built_for_ice40():
    """The UP5K carries the units alone: a whole nano-KPU with dsp = 'ice40' is refused."""
    with pytest.raises(ValueError, match="KpuConfig.dsp = 'ice40': the whole nano-KPU is built for ECP5"):
        NanoKPU(profile("tiny", dsp="ice40"))


def test_ecp5_one_true_dual_port_copy():
    """8192 x 32 bits: 16 DP16KD as one copy (the write on port A with rd0), 32 as two."""
    blocks = {dsp: synthesize(DataMemory(profile("tiny", dsp=dsp)), "nanokpu_dmem", "ecp5-25f",
                              build_dir=BUILD_DIR / f"test-ecp5-dmem-{dsp}")["resources"]["bram"]
              for dsp in ("ecp5", "generic")}
    assert blocks == {"ecp5": 16, "generic": 32}
