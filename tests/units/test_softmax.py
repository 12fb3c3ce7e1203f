# amaranth: UnusedElaboratable=no
"""nanokpu.units.softmax: the softmax normaliser, bit-exact to golden.intops.softmax_int, and its
cycle contract (Amaranth simulator; then every key of sim/bench_softmax.py on Verilator)."""

import numpy as np
import pytest
from amaranth import Shape, signed, unsigned
from amaranth.sim import Simulator

from nanokpu.config import profile
from nanokpu.units.softmax import Softmax, cycles_per_row
from sim import bench_softmax
from sim.bench_softmax import check_rows, softmax_rows

NARROW = {"act_width": 8, "act_frac": 4, "score_frac": 7, "weight_frac": 9}


def simulate(dut, rows, seed, p_valid=0.7, p_ready=0.7, lasts=None):
    """Send ``rows`` (``last`` on each row's end, or the flags ``lasts``) through ``dut`` with
    random idle (a raised ``i.valid`` holds until taken) and backpressure. Returns the
    ``(weight, last)`` pairs, the cycle of every input transfer and the cycle in which each
    output row's first weight became valid; checks that a raised ``o.valid`` holds its payload."""
    rng = np.random.default_rng(seed)
    items = [(int(v), int(j == len(row) - 1)) for row in rows for j, v in enumerate(row)]
    if lasts is not None:
        items = [(v, int(f)) for (v, _), f in zip(items, lasts, strict=True)]
    got, in_cycles, first_valid = [], [], []

    async def tb(ctx):
        k, holding, pending, cycle, row_start = 0, False, None, 0, True
        while len(got) < len(items):
            if not holding and k < len(items) and rng.random() < p_valid:
                ctx.set(dut.i.payload, {"logit": items[k][0], "last": items[k][1]})
                ctx.set(dut.i.valid, 1)
                holding = True
            ready = bool(rng.random() < p_ready)
            ctx.set(dut.o.ready, ready)
            _, _, i_ready, o_valid, out = await ctx.tick().sample(dut.i.ready, dut.o.valid, dut.o.payload)
            if holding and i_ready:
                in_cycles.append(cycle)
                k += 1
                holding = False
                ctx.set(dut.i.valid, 0)
            if o_valid:
                word = (out.weight, out.last)
                assert pending is None or pending == word, f"o.payload changed before its transfer (seed {seed})"
                pending = None if ready else word
                if row_start:
                    first_valid.append(cycle)
                    row_start = False
                if ready:
                    got.append(word)
                    row_start = bool(out.last)
            cycle += 1
            assert cycle < 200 * len(items) + 1000, f"hang after {len(got)} weights (seed {seed})"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return got, in_cycles, first_valid


@pytest.mark.parametrize("cfg,max_n", [
    (profile("tiny"), 5),
    (profile("tiny", **NARROW), 4),
    (profile("tiny", **NARROW, rounding="half_up"), 4),
    (profile("tiny", **NARROW, rounding="floor"), 4),
], ids=["tiny", "narrow-half_even", "narrow-half_up", "narrow-floor"])
def test_softmax_matches_golden_with_idle_and_backpressure(cfg, max_n):
    """Directed rows (ties, the saturation of s - m, the extreme logits, n = 1) and random rows,
    bit for bit against softmax_int under random idle and backpressure."""
    seed = 2812
    rows = softmax_rows(cfg, max_n, n_random=400, seed=seed)
    got, _, _ = simulate(Softmax(cfg, max_n), rows, seed)
    check_rows(rows, got, cfg, seed)


@pytest.mark.parametrize("max_n", [1, 6])
def test_cycles_per_row_and_latency_at_full_rate(max_n):
    """Rows of every length 1 .. max_n back to back: the next row's first logit is taken exactly
    cycles_per_row(n) = 3 n + weight_frac + 7 cycles after this row's, the first weight is valid
    latency(n) = n + weight_frac + 8 cycles after the last logit."""
    cfg = profile("tiny")
    seed = 2813
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.permutation(np.repeat(np.arange(1, max_n + 1), 3))]
    rows = [rng.integers(-300, 300, n) for n in lengths]
    dut = Softmax(cfg, max_n)
    got, in_cycles, first_valid = simulate(dut, rows, seed, p_valid=1.0, p_ready=1.0)
    check_rows(rows, got, cfg, seed)
    starts = np.cumsum([0] + lengths)
    for r, n in enumerate(lengths):
        assert dut.cycles_per_row(n) == cycles_per_row(cfg, n) == 3 * n + cfg.weight_frac + 7
        assert dut.latency(n) == n + cfg.weight_frac + 8
        assert first_valid[r] - in_cycles[starts[r] + n - 1] == dut.latency(n), f"row {r}, n = {n}"
        if r + 1 < len(rows):
            assert in_cycles[starts[r + 1]] - in_cycles[starts[r]] == dut.cycles_per_row(n), f"row {r}, n = {n}"


def test_the_max_n_th_logit_ends_a_row():
    """Rows of max_n logits without ``last`` (and a unit of max_n = 1 whose every logit is a row)."""
    cfg = profile("tiny", **NARROW)
    seed = 2814
    rng = np.random.default_rng(seed)
    for max_n in (1, 3):
        rows = [rng.integers(-128, 128, max_n) for _ in range(20)]
        got, _, _ = simulate(Softmax(cfg, max_n), rows, seed, lasts=[0] * (20 * max_n))
        check_rows(rows, got, cfg, seed)


def test_ports_and_default_length():
    cfg = profile("small")
    dut = Softmax(cfg)
    assert dut.max_n == cfg.attnres_candidates == 4
    assert profile("k3").attnres_candidates == 9 and profile("tiny").attnres_candidates == 3
    i, o = dut.i.payload.shape(), dut.o.payload.shape()
    assert Shape.cast(i["logit"].shape) == signed(cfg.act_width) and Shape.cast(i["last"].shape) == unsigned(1)
    assert Shape.cast(o["weight"].shape) == unsigned(cfg.weight_frac + 1) and Shape.cast(o["last"].shape) == unsigned(1)


@pytest.mark.parametrize("max_n", [0, -3, True, 2.0, "4"])
def test_bad_lengths_name_max_n(max_n):
    with pytest.raises(ValueError, match="max_n"):
        Softmax(profile("tiny"), max_n)


def test_rejects_a_non_config():
    with pytest.raises(TypeError, match="KpuConfig"):
        Softmax({"act_width": 16}, 4)


@pytest.mark.parametrize("key", sorted(bench_softmax.BENCH_CONFIGS))
def test_softmax_on_verilator(key):
    """Thousands of random rows and the directed ones through the RTL (one build for every key):
    bit-exact, cycle-exact at full rate, then under random idle and backpressure."""
    bench_softmax.run(key, seed=2815, n_random=1000 if key == "small" else 3000)
