"""cocotb bench of :class:`nanokpu.units.softmax.Softmax`, bit-exact against :func:`golden.intops.softmax_int`.

:class:`SoftmaxBench` puts the softmax units of several configs side by side in one Verilog top
(one Verilator build serves every key). The bench ``rows`` sends :func:`softmax_rows` (the
directed rows, then random ones), the first half at full rate, where every row must take
exactly :func:`~nanokpu.units.softmax.cycles_per_row` cycles and its first weight come
:meth:`~nanokpu.units.softmax.Softmax.latency` cycles after its last logit, the second half
with random idle on the source (``p_valid``) and backpressure on the sink (``p_ready``), a
raised ``o.valid`` holding its payload until taken. Parameters (``NANOKPU_PARAMS``): ``key``,
``max_n``, ``seed``, ``n_random``, ``p_valid``, ``p_ready``; the config from
:func:`sim.runner.bench_config`.
"""

from __future__ import annotations

import functools
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from golden.intops import softmax_int
from nanokpu.config import KpuConfig, profile
from nanokpu.units.softmax import Softmax, cycles_per_row
from sim.lib.side_by_side import SideBySide
from sim.runner import bench_config, bench_params

__all__ = ["SoftmaxBench", "softmax_rows", "check_rows", "BENCH_CONFIGS", "run"]


class SoftmaxBench(SideBySide):
    """Softmax units of several configs in one simulation top (no logic of its own).

    Parameters
    ----------
    cfgs : dict[str, tuple[KpuConfig, int]]
        ``(config, max_n)`` by key (a Verilog identifier); the unit's ``i`` and ``o`` streams
        are the ports ``<key>_i`` and ``<key>_o``.
    """

    def __init__(self, cfgs: dict[str, tuple[KpuConfig, int]]):
        super().__init__({key: Softmax(cfg, max_n) for key, (cfg, max_n) in cfgs.items()}, ("i", "o"))


def softmax_rows(cfg: KpuConfig, max_n: int, n_random: int, seed: int) -> list[np.ndarray]:
    """Directed rows, then ``n_random`` random ones (lengths ``1 .. max_n``).

    Directed: ties (every length, rows of one value: the minimum, 0, the maximum, random),
    the maximum with the rest at the minimum (``s - m`` saturates at ``act_width``) in every
    position, the extremes ``-2**(act_width-1)``, ``2**(act_width-1) - 1`` with random values,
    and ``n = 1``. Random rows spread their logits over ``2**k`` LSB (``k`` random), so that
    many have several non-zero weights.
    """
    rng = np.random.default_rng(seed)
    lo, hi = -(1 << (cfg.act_width - 1)), (1 << (cfg.act_width - 1)) - 1

    def rand(n, a=lo, b=hi):
        return rng.integers(a, b + 1, n)

    rows = [np.array([v]) for v in (lo, lo + 1, -1, 0, 1, hi - 1, hi)]
    for n in range(2, max_n + 1):
        rows += [np.full(n, v) for v in (lo, 0, hi, int(rand(1)[0]))]
        top = np.full(n, lo)
        top[rng.integers(0, n)] = hi
        rows += [top, np.r_[hi, np.full(n - 1, lo)], np.r_[np.full(n - 1, lo), hi]]
        mixed = rand(n)
        mixed[rng.permutation(n)[:2]] = (lo, hi)
        rows += [mixed, np.r_[rand(n - 1, lo, lo + 64), lo], np.r_[rand(n - 1, hi - 64, hi), hi]]
    for _ in range(n_random):
        n = int(rng.integers(1, max_n + 1))
        spread = 1 << int(rng.integers(0, cfg.act_width))
        base = int(rand(1)[0])
        rows.append(np.clip(base + rng.integers(-spread, spread + 1, n), lo, hi))
    return rows


def check_rows(rows, got, cfg: KpuConfig, seed: int):
    """``got``: the ``(weight, last)`` pairs of ``rows`` in order; asserts them bit for bit."""
    k = 0
    for r, row in enumerate(rows):
        want = softmax_int(row, cfg)
        part = np.array(got[k:k + len(row)]).reshape(-1, 2)
        k += len(row)
        np.testing.assert_array_equal(part[:, 0], want, err_msg=f"row {r} {row.tolist()}: weights (seed {seed})")
        np.testing.assert_array_equal(part[:, 1], np.arange(len(row)) == len(row) - 1,
                                      err_msg=f"row {r} {row.tolist()}: last (seed {seed})")
    assert k == len(got), f"{len(got) - k} weights beyond the rows (seed {seed})"


# ----------------------------------------------------------------------------------------
# cocotb side
# ----------------------------------------------------------------------------------------
async def _stream(dut, key: str, cfg: KpuConfig, rows, p_valid: float, p_ready: float,
                  rand: random.Random, seed: int) -> list[tuple[int, int]]:
    """Send ``rows`` on ``<key>_i`` and collect their weights from ``<key>_o``. At full rate,
    checks every row's cycles and latency."""
    i_valid, i_ready, i_payload = (getattr(dut, f"{key}_i__{s}") for s in ("valid", "ready", "payload"))
    o_valid, o_ready, o_payload = (getattr(dut, f"{key}_o__{s}") for s in ("valid", "ready", "payload"))
    aw, ww = cfg.act_width, cfg.weight_width
    words = [(int(v) & ((1 << aw) - 1)) | (int(j == len(row) - 1) << aw) for row in rows for j, v in enumerate(row)]
    firsts = [int(f) for f in np.cumsum([0] + [len(row) for row in rows])[:-1]]
    is_first = set(firsts)
    total = len(words)
    full_rate = p_valid >= 1 and p_ready >= 1
    edge = RisingEdge(dut.clk)
    got, in_cycles, first_valid = [], [], []
    k, holding, cycle, pending = 0, False, 0, None
    limit = 10 * sum(cycles_per_row(cfg, len(row)) for row in rows) + 100
    while len(got) < total:
        if not holding and k < total and (p_valid >= 1 or rand.random() < p_valid):
            i_payload.value = words[k]
            i_valid.value = 1
            holding = True
        ready = p_ready >= 1 or rand.random() < p_ready
        o_ready.value = ready
        await edge
        if holding and int(i_ready.value):
            in_cycles.append(cycle)
            k += 1
            holding = False
            i_valid.value = 0
        if int(o_valid.value):
            word = int(o_payload.value)
            assert pending is None or pending == word, f"{key}: o.payload changed before its transfer (seed {seed})"
            pending = None if ready else word
            if len(got) in is_first and (not first_valid or first_valid[-1][0] != len(got)):
                first_valid.append((len(got), cycle))
            if ready:
                got.append((word & ((1 << ww) - 1), word >> ww))
        cycle += 1
        assert cycle < limit, f"{key}: {len(got)} of {total} weights after {cycle} cycles (hang, seed {seed})"
    o_ready.value = 0
    if full_rate:
        starts = [in_cycles[f] for f in firsts]
        for r, row in enumerate(rows[:-1]):
            assert starts[r + 1] - starts[r] == cycles_per_row(cfg, len(row)), (
                f"{key}: row {r} (n = {len(row)}) took {starts[r + 1] - starts[r]} cycles, "
                f"expected {cycles_per_row(cfg, len(row))} (seed {seed})")
        for r, (row, (_, cyc)) in enumerate(zip(rows, first_valid, strict=True)):
            lat = cyc - in_cycles[firsts[r] + len(row) - 1]
            want = cycles_per_row(cfg, len(row)) - 2 * len(row) + 1
            assert lat == want, f"{key}: row {r} (n = {len(row)}): latency {lat}, expected {want} (seed {seed})"
    return got


@cocotb.test()
async def rows(dut):
    """Directed and random rows: the first half at full rate (cycle-exact), the second with
    random idle and backpressure; every weight bit-exact."""
    params = bench_params()
    key, seed, max_n = params["key"], int(params["seed"]), int(params["max_n"])
    cfg = bench_config()
    rand = random.Random(seed)
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    getattr(dut, f"{key}_i__valid").value = 0
    getattr(dut, f"{key}_o__ready").value = 0
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    all_rows = softmax_rows(cfg, max_n, int(params.get("n_random", 2000)), seed)
    half = len(all_rows) // 2
    got = await _stream(dut, key, cfg, all_rows[:half], 1.0, 1.0, rand, seed)
    got += await _stream(dut, key, cfg, all_rows[half:], params.get("p_valid", 0.7),
                         params.get("p_ready", 0.7), rand, seed)
    check_rows(all_rows, got, cfg, seed)
    dut._log.info("%s: %d rows, %d weights bit-exact (seed %d)", key, len(all_rows), len(got), seed)


# ----------------------------------------------------------------------------------------
# pytest side
# ----------------------------------------------------------------------------------------
#: The configs of the one Verilator build: ``tiny`` at its Attention Residuals length (3),
#: ``small`` at 64 (MLA-like rows), and a narrow format (Q8.4 logits, 7-bit exponentials,
#: 9-bit weights, half_up) at K3's 9 candidates.
BENCH_CONFIGS: dict[str, tuple[KpuConfig, int]] = {
    "tiny": (profile("tiny"), 3),
    "small": (profile("small"), 64),
    "narrow": (profile("tiny", act_width=8, act_frac=4, score_frac=7, weight_frac=9, rounding="half_up"), 9),
}


@functools.cache
def _bench() -> SoftmaxBench:
    """One bench top per process: the runner converts it to Verilog once."""
    return SoftmaxBench(BENCH_CONFIGS)


def run(key: str, seed: int, **params):
    """Run the ``rows`` bench on the ``key`` unit of ``SoftmaxBench(BENCH_CONFIGS)``."""
    from sim.runner import run_bench

    cfg, max_n = BENCH_CONFIGS[key]
    return run_bench(_bench(), "softmax", "bench_softmax", testcase="rows", seed=seed, config=cfg,
                     params={"key": key, "seed": seed, "max_n": max_n, **params})
