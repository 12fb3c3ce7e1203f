"""Systolic array: skewed feed, output-stationary tiles back to back, column-by-column drain."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from golden.intops import matmul_int
from nanokpu.config import profile
from nanokpu.units.systolic import SystolicArray


def run_array(cfg, tiles, seed, bubbles=0.25):
    """Feed ``tiles`` ((A [R, K], B [K, C]) pairs) as tightly as the drain rule allows, with
    random bubbles; drain each tile on ``done``. Returns the drained tiles and the cycles of
    their ``last`` steps and ``done`` pulses."""
    dut = SystolicArray(cfg)
    rng = np.random.default_rng(seed)
    drained, last_at, done_at = [], [], []

    async def feed(ctx):
        cycle, prev_last = 0, -10 ** 6
        for a, b in tiles:
            k_len = a.shape[1]
            k = 0
            while k < k_len:
                last = k == k_len - 1
                ok = rng.random() >= bubbles and (not last or cycle - prev_last >= dut.min_tile_cycles)
                ctx.set(dut.valid, ok)
                ctx.set(dut.first, k == 0)
                ctx.set(dut.last, last)
                ctx.set(dut.a, [int(v) for v in a[:, k]] if ok else
                        [int(v) for v in rng.integers(-128, 128, cfg.rows)])
                ctx.set(dut.b, [int(v) for v in b[k, :]] if ok else
                        [int(v) for v in rng.integers(-128, 128, cfg.cols)])
                if ok and last:
                    last_at.append(cycle)
                    prev_last = cycle
                k += ok
                await ctx.tick()
                cycle += 1
        ctx.set(dut.valid, 0)

    async def drain(ctx):
        cycle, column, tile = 0, None, None
        while len(drained) < len(tiles):
            if ctx.get(dut.done):
                assert column is None, f"seed {seed}: a tile finished while draining"
                done_at.append(cycle)
                column, tile = 0, np.zeros((cfg.rows, cfg.cols), dtype=np.int64)
            ctx.set(dut.shift, column is not None)
            if column is not None:
                tile[:, column] = [int(v) for v in ctx.get(dut.out)]
                column += 1
                if column == cfg.cols:
                    drained.append(tile)
                    column = None
            await ctx.tick()
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(feed)
    sim.add_testbench(drain)
    sim.run()
    return drained, last_at, done_at, dut.min_tile_cycles


def random_tiles(cfg, rng, ks):
    tiles = []
    for k in ks:
        a = rng.integers(-128, 128, (cfg.rows, k))
        b = rng.integers(-128, 128, (k, cfg.cols))
        tiles.append((a, b))
    return tiles


@pytest.mark.parametrize("rows, cols", [(2, 2), (2, 4), (4, 4), (3, 2)])
def test_array_tiles_match_the_golden(rows, cols):
    seed = 100 * rows + cols
    cfg = profile("tiny", rows=rows, cols=cols)
    rng = np.random.default_rng(seed)
    tiles = random_tiles(cfg, rng, [5, 1, 1, 3, 9])
    # extremes: -128 * -128 summed over K
    tiles.append((np.full((rows, 6), -128), np.full((6, cols), -128)))
    drained, last_at, done_at, _ = run_array(cfg, tiles, seed)
    for n, ((a, b), got) in enumerate(zip(tiles, drained, strict=True)):
        np.testing.assert_array_equal(got, matmul_int(a, b, cfg.acc_width), err_msg=f"seed {seed} tile {n}")
    assert [d - t for t, d in zip(last_at, done_at, strict=True)] == [rows + cols] * len(tiles)


def test_array_back_to_back_without_bubbles_wraps_at_acc_width():
    """K = 1 tiles at the minimum spacing, with a 16-bit accumulator that wraps (the array takes
    any K: a config whose GEMM engine takes one product per sum allows 16 bits)."""
    seed = 5
    cfg = profile("tiny", rows=2, cols=3, acc_width=16, spad_b_depth=2)
    rng = np.random.default_rng(seed)
    tiles = random_tiles(cfg, rng, [1, 1, 2, 1])
    tiles.append((np.full((2, 4), -128), np.full((4, 3), -128)))  # 4 * 16384 wraps to 0
    tiles.append((np.full((2, 2), -128), np.full((2, 3), 127)))
    drained, last_at, _, min_gap = run_array(cfg, tiles, seed, bubbles=0.0)
    for n, ((a, b), got) in enumerate(zip(tiles, drained, strict=True)):
        np.testing.assert_array_equal(got, matmul_int(a, b, 16), err_msg=f"seed {seed} tile {n}")
    gaps = np.diff(last_at)
    assert gaps.min() == min_gap
