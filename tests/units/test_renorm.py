# amaranth: UnusedElaboratable=no
"""nanokpu.units.renorm: the reciprocal and the weights of golden.intops.route_weights_int, with the
division shortened by ``min_total`` (Amaranth simulator)."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from golden.intops import round_shift
from nanokpu.config import profile
from nanokpu.units.renorm import Renormaliser

CFG = profile("tiny", score_frac=5, weight_frac=6)   # R = 12


@pytest.mark.parametrize("min_total,quot_bits", [(0, 13), (1, 13), (3, 11), (32, 8), (100, 6)])
@pytest.mark.parametrize("rounding", ["half_even", "half_up", "floor"])
def test_weights_match_golden(min_total, quot_bits, rounding):
    """Totals from min_total (and the extremes), scores up to the total: ``busy`` exactly
    quot_bits cycles, then every weight ``round_shift(s * floor(2**R / S), score_frac + 1)``."""
    cfg = profile("tiny", score_frac=5, weight_frac=6, rounding=rounding)
    max_total = 4 * (2 ** cfg.score_width - 1)
    dut = Renormaliser(cfg, max_total, min_total)
    assert dut.quot_bits == dut.latency == quot_bits
    seed = 2816
    rng = np.random.default_rng(seed)
    lo = max(min_total, 1)
    totals = [lo, lo + 1, max_total, *rng.integers(lo, max_total + 1, 12).tolist()]
    r_bits = cfg.weight_frac + cfg.score_frac + 1

    async def tb(ctx):
        for total in totals:
            ctx.set(dut.total, total)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            busy = 0
            while ctx.get(dut.busy):
                busy += 1
                await ctx.tick()
            assert busy == dut.latency, f"busy {busy} cycles (S = {total}, seed {seed})"
            recip = (1 << r_bits) // total
            for score in sorted({0, 1, min(total, 2 ** cfg.score_width - 1), *rng.integers(0, min(total, 63) + 1, 16)}):
                ctx.set(dut.score, int(score))
                want = int(round_shift(score * recip, cfg.score_frac + 1, rounding))
                assert ctx.get(dut.weight) == want, f"S = {total}, s = {score} (seed {seed})"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("max_total,min_total", [(0, 0), (True, 0), (10, -1), (10, 11), (10, 2.0)])
def test_bad_totals_name_the_field(max_total, min_total):
    with pytest.raises(ValueError, match="max_total" if max_total in (0, True) else "min_total"):
        Renormaliser(CFG, max_total, min_total)


def test_rejects_a_non_config():
    with pytest.raises(TypeError, match="KpuConfig"):
        Renormaliser({"score_frac": 5}, 10)
