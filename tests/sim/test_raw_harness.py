# amaranth: UnusedElaboratable=no
"""sim.lib.raw_run: the C++ harness replays the tiny block's cocotb run on the same Verilog, exactly.

One cocotb run of the block benchmark's tiny case (seed 1, 8 tokens, no bus stalls) records its
replay; the harness must end with the same ``CYCLES`` (as tests/kpu/test_top.py
asserts), the same register reads and host memory, whose outputs are golden's. A harness that
diverges (another memory timing or content) fails these, and the check itself is shown to fail
on a changed image or register value.
"""

import json
import shutil

import numpy as np
import pytest

from golden.block import latent_moe_int, random_block
from nanokpu.config import profile
from nanokpu.host.compiler import compile_block
from nanokpu.isa import Reg
from nanokpu.kpu.top import NanoKPU
from sim.lib.kpu_launch import kpu_build, run_kpu_bench
from sim.lib.raw_run import ReplayMismatch, replay
from sim.runner import FAST_BUILD

SEED, TOKENS = 1, 8

# one xdist worker: the module's tests share one cocotb run (the fixture)
pytestmark = pytest.mark.xdist_group("raw_harness")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """``(replay directory, cocotb build directory)`` of the tiny block run under cocotb."""
    cfg = profile("tiny")
    directory = tmp_path_factory.mktemp("replay")
    dut = NanoKPU(cfg)
    # fast (-O0), as tests/kpu/test_top.py: the same cocotb build, and a quick harness build
    run_kpu_bench(cfg, "bench_top", testcase="test_block", seed=SEED, fast=True, dut=dut,
                  params={"tokens": TOKENS, "seeds": 1, "pause": 0.0, "replay": str(directory)})
    return directory, kpu_build(cfg, fast=True, dut=dut)


def test_harness_replays_the_tiny_block(recorded):
    directory, build = recorded
    out = replay(directory, build, FAST_BUILD)
    assert out["cycles"] == 8424
    cfg = profile("tiny")
    Q, xq, _, _ = random_block(cfg, TOKENS, np.random.default_rng(SEED))
    prog = compile_block(Q, xq, cfg)
    got, ref = prog.outputs((directory / "raw_final.bin").read_bytes()), latent_moe_int(xq, Q, cfg)
    for key in ("y", "idx", "weights", "loads"):
        assert np.array_equal(got[key], ref[key]), f"{key} of the harness's run differs from latent_moe_int"
    assert out["beats"] > 0
    for run in (out["cocotb"], out["raw"]):
        assert run["clocks"] >= out["cycles"] and run["cycles_per_s"] > 0


def test_a_changed_image_is_a_mismatch(recorded, tmp_path):
    """A weight byte changed before the harness runs: its results differ from the cocotb run's."""
    directory, build = recorded
    changed = shutil.copytree(directory, tmp_path / "replay")
    image = bytearray((changed / "image.bin").read_bytes())
    image[len(image) // 2] ^= 0x5A
    (changed / "image.bin").write_bytes(bytes(image))
    with pytest.raises(ReplayMismatch):
        replay(changed, build, FAST_BUILD)


def test_a_changed_cycle_count_is_a_mismatch(recorded, tmp_path):
    """The cocotb run's CYCLES off by one: the harness's read no longer matches."""
    directory, build = recorded
    changed = shutil.copytree(directory, tmp_path / "replay")
    cocotb = json.loads((changed / "cocotb.json").read_text())
    cocotb["reads"] = [[addr, value + (addr == Reg.CYCLES)] for addr, value in cocotb["reads"]]
    (changed / "cocotb.json").write_text(json.dumps(cocotb))
    with pytest.raises(ReplayMismatch, match="CYCLES"):
        replay(changed, build, FAST_BUILD)
