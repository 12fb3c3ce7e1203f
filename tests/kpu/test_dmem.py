# amaranth: UnusedElaboratable=no
"""The data scratchpad (nanokpu.kpu.dmem.DataMemory): its contract on the Amaranth simulator
(``generic`` 2R1W and ``ecp5`` true-dual-port block RAM) and how many RAM blocks it maps to."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from fpga.flow import BUILD_DIR, synthesize
from nanokpu.config import profile
from nanokpu.kpu.dmem import DataMemory, writes_block_reads
from nanokpu.kpu.top import NanoKPU
from sim.lib.dmem_model import DmemModel, random_ops


@pytest.mark.parametrize("dsp, seed", [("generic", 1), ("generic", 2), ("ecp5", 3)])
def test_contract(dsp, seed):
    """Two read ports and a write port, the write performed an edge after it is issued; data
    holds while en is low; a read of a row while it is being written is undefined (generic,
    not checked) or not performed (ecp5)."""
    cfg = profile("tiny", dmem_depth=64, dsp=dsp)
    dut = DataMemory(cfg)
    model = DmemModel(writes_block_reads=writes_block_reads(cfg))
    ops = random_ops(cfg.dmem_depth, 32, 1500, np.random.default_rng(seed))

    async def tb(ctx):
        ports = (dut.rd0, dut.rd1)
        for n, (reads, write) in enumerate(ops):
            for (en, addr), port in zip(reads, ports, strict=True):
                ctx.set(port.en, en)
                ctx.set(port.addr, addr)
            ctx.set(dut.wr.en, write[0])
            ctx.set(dut.wr.addr, write[1])
            ctx.set(dut.wr.data, write[2])
            assert ctx.get(dut.writing) == model.writing, f"seed {seed} cycle {n}: writing"
            await ctx.tick()
            model.edge(reads, write)
            if n > 8:
                got = [ctx.get(port.data) if want is not None else None
                       for port, want in zip(ports, model.data, strict=True)]
                assert got == model.data, f"seed {seed} cycle {n}: {got} != {model.data} ({reads}, {write})"

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
