"""cocotb bench of nanokpu.units.kda_state.KdaStateUpdate on Verilator, bit-exact against
:func:`golden.kda.kda_head_step_int`; the step generators the Amaranth tests share.

:class:`KdaStateBench` puts the units of several configs side by side in one Verilog top (one
Verilator build serves every config here). The bench ``kda_state_steps`` (parameters
``NANOKPU_PARAMS``: ``key``, ``seed``, ``n_random``) runs, on the ``key`` unit:

- the directed steps (:func:`directed_steps`) and ``n_random`` random ones (:func:`random_steps`),
  each from its own state, at full rate (checking the cycle counts of
  :class:`~nanokpu.units.kda_state.KdaStateUpdate`), then again with random idle on the input and
  backpressure on both outputs (30 % each);
- 4 tokens chained, each step's input state the unit's output state of the step before, against
  the golden recurrence, with idle and backpressure.

Every result is checked bit for bit; the seed is in every failure message.
"""

from __future__ import annotations

import functools
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from golden import intops as I
from golden.kda import kda_head_step_int, state_width, unit_frac
from nanokpu.config import KpuConfig, profile
from nanokpu.units.kda_state import KdaStateUpdate, kda_row_layout
from sim.lib.side_by_side import SideBySide
from sim.runner import bench_config, bench_params

__all__ = ["KdaStateBench", "Step", "directed_steps", "random_steps", "token_steps", "golden_chain", "BENCH_CONFIGS",
           "run"]

#: One step's inputs: ``(S [K, K], decay [K], k [K], v [K], beta, q [K])``, the argument order of
#: :func:`golden.kda.kda_head_step_int`.
Step = tuple


class KdaStateBench(SideBySide):
    """The KDA state units of several configs in one simulation top (no logic of its own).

    Members
    -------
    <key>_i, <key>_o, <key>_r : the :class:`~nanokpu.units.kda_state.KdaStateUpdate` streams of the
        ``key`` config.
    """

    def __init__(self, cfgs: dict[str, KpuConfig]):
        super().__init__({key: KdaStateUpdate(cfg) for key, cfg in cfgs.items()}, ("i", "o", "r"))


# ----------------------------------------------------------------------------------------
# Steps
# ----------------------------------------------------------------------------------------
def _ranges(cfg: KpuConfig):
    """``(state, act, score)``: the ``(lo, hi)`` of each port's values."""
    w, a = state_width(cfg), cfg.act_width
    return ((-(1 << (w - 1)), (1 << (w - 1)) - 1), (-(1 << (a - 1)), (1 << (a - 1)) - 1),
            (0, (1 << cfg.score_width) - 1))


def random_steps(cfg: KpuConfig, rng: np.random.Generator, n: int) -> list[Step]:
    """``n`` random steps over the ports' whole ranges: each value drawn uniformly, then shifted
    right by a random amount (magnitudes of every size); per step, ``decay`` and ``beta`` either in
    ``[0, 1.0]`` or over the whole port, ``k`` and ``q`` either l2-normalised (as the mixer's) or
    any ``act_width``-bit values."""
    K, U = cfg.kda_head_dim, unit_frac(cfg)
    (s_lo, s_hi), (a_lo, a_hi), (_, sc_hi) = _ranges(cfg)
    one = 1 << cfg.score_frac

    def spread(lo, hi, shape):
        return rng.integers(lo, hi + 1, shape) >> rng.integers(0, (hi - lo).bit_length(), shape)

    steps = []
    for _ in range(n):
        S = spread(s_lo, s_hi, (K, K))
        top = sc_hi if rng.random() < 0.3 else one
        decay, beta = rng.integers(0, top + 1, K), int(rng.integers(0, top + 1))
        if rng.random() < 0.5:
            k, q = (I.l2norm_int(spread(a_lo, a_hi, K), U, cfg) for _ in range(2))
        else:
            k, q = spread(a_lo, a_hi, K), spread(a_lo, a_hi, K)
        steps.append((S, decay, k, spread(a_lo, a_hi, K), beta, q))
    return steps


def directed_steps(cfg: KpuConfig, rng: np.random.Generator) -> list[Step]:
    """The edge cases, in order: the delta rule saturating high, then low; the state forgotten
    (decay 0, beta 1.0, ``k`` one-hot 1.0); kept (decay 1.0, beta 0); the ports' extremes (decay
    and beta ``2**score_width - 1``, ``k``, ``q``, ``S`` and ``v`` at their ends, both signs); ``k``
    and ``q`` at the unit format's +-1.0; ties at every rounding site (three steps: ``decay``, ``k``,
    ``beta`` and ``q`` of 0.5 against odd operands); all zero."""
    K, U, w = cfg.kda_head_dim, unit_frac(cfg), state_width(cfg)
    (s_lo, s_hi), (a_lo, a_hi), (_, sc_hi) = _ranges(cfg)
    one, unit = 1 << cfg.score_frac, 1 << U
    z = np.zeros(K, dtype=np.int64)

    def full(v, shape=(K,)):
        return np.full(shape, v, dtype=np.int64)

    def hot(*rows, value=unit):
        x = z.copy()
        x[list(rows)] = value
        return x

    rand_s = rng.integers(s_lo >> 4, (s_hi >> 4) + 1, (K, K))
    rand_v = rng.integers(a_lo, a_hi + 1, K)
    second = min(1, K - 1)
    steps = [
        # S = min, k two-hot: S'^T k = 2 min, e = 2**W + (v << act_frac) > 0, S'' = min + e > max
        (full(s_lo, (K, K)), full(one), hot(0, second), full(a_hi), one, hot(0)),
        (full(s_hi, (K, K)), full(one), hot(0, second), full(a_lo), one, hot(0)),
        (rand_s, z, hot(0), rand_v, one, hot(0)),
        (rand_s, full(one), rng.integers(a_lo, a_hi + 1, K), rand_v, 0, rng.integers(a_lo, a_hi + 1, K)),
        (full(s_lo, (K, K)), full(sc_hi), full(a_lo), full(a_hi), sc_hi, full(a_lo)),
        (full(s_hi, (K, K)), full(sc_hi), full(a_hi), full(a_lo), sc_hi, full(a_hi)),
        (full(s_lo, (K, K)), full(sc_hi), full(a_hi), full(a_hi), sc_hi, full(a_lo)),
        (rand_s, full(one), np.where(np.arange(K) % 2, -unit, unit), rand_v, one,
         np.where(np.arange(K) % 2, unit, -unit)),
    ]
    # ties. S odd; row 0 kept (decay 1.0), the others halved (decay 0.5: S' ties); k = 1.0 on row 0
    # (S'^T k = S'_0, odd: e odd); beta 0.5 (bk_0 = 0.5: bk_0 e_j ties); q = 0.5 on row 0 and -1.0 on
    # row 1 (r = S''_0 / 2 - S''_1 ties for odd S''_0, either sign)
    odd = rng.integers(-(1 << (w // 2)), 1 << (w // 2), (K, K)) * 2 + 1
    decay = full(one >> 1)
    decay[0] = one
    q = hot(second, value=-unit)
    q[0] = unit >> 1
    steps.append((odd, decay, hot(0), rand_v, one >> 1, q))
    # S odd on row 0 only, decay 1.0; k = 0.5 on row 0 (S'^T k = S_0 / 2 ties) and odd on the others
    # (beta 0.5: bk ties); q = -0.5 on the last row
    k = rng.integers(-(unit >> 2), unit >> 2, K) * 2 + 1
    k[0] = unit >> 1
    one_row = np.zeros((K, K), dtype=np.int64)
    one_row[0] = odd[0]
    steps.append((one_row, full(one), k, rand_v, one >> 1, hot(K - 1, value=-(unit >> 1))))
    # the read-out alone (decay 1.0, beta 0: S'' = S): q = 0.5 on row 0, S_0j = 1, 3, -1, -3 mod 8
    # (r ties with quotients of either parity and sign)
    S = odd.copy()
    S[0] = np.resize([1, 3, -1, -3], K) + 8 * rng.integers(-(1 << (w // 2)), 1 << (w // 2), K)
    steps.append((S, full(one), rand_v, rand_v, 0, hot(0, value=unit >> 1)))
    steps.append((np.zeros((K, K), dtype=np.int64), z, z, z, 0, z))
    return steps


def token_steps(steps: list[Step], T: int, H: int):
    """``T * H`` steps as ``T`` tokens of ``H`` heads (token-major): ``(S [H, K, K], decay [T, H, K],
    k, v [T, H, K], beta [T, H], q [T, H, K])``, ``S`` the first token's states (a ``KDA_STEP``
    carries the state from token to token)."""
    def field(i):
        return np.array([st[i] for st in steps[:T * H]]).reshape(T, H, *np.shape(steps[0][i]))

    return (np.stack([st[0] for st in steps[:H]]), *(field(i) for i in (1, 2, 3, 4, 5)))


def golden_steps(steps: list[Step], cfg: KpuConfig) -> tuple[np.ndarray, np.ndarray]:
    """Each step from its own state: ``(S'' [n, K, K], r [n, K])``."""
    out = [kda_head_step_int(*step, cfg) for step in steps]
    return np.array([s for s, _ in out]), np.array([r for _, r in out])


def golden_chain(S0, steps: list[Step], cfg: KpuConfig) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence from ``S0`` over ``steps`` (their own states ignored): ``(S [n, K, K], r [n, K])``."""
    S, states, reads = S0, [], []
    for step in steps:
        S, r = kda_head_step_int(S, *step[1:], cfg)
        states.append(S)
        reads.append(r)
    return np.array(states), np.array(reads)


def beat_fields(step: Step, row: int, S_row=None) -> dict:
    """Beat ``row`` of ``step`` as field values (``S_row`` in place of the step's own row)."""
    S, decay, k, v, beta, q = step
    s = S[row] if S_row is None else S_row
    return {"s": [int(x) for x in s], "decay": int(decay[row]), "k": int(k[row]), "q": int(q[row]),
            "v": int(v[row]), "beta": int(beta)}


def pack_beat(cfg: KpuConfig, fields: dict) -> int:
    """The input payload word of a beat (:func:`beat_fields`), as the Verilog port holds it."""
    word = 0
    for name, field in kda_row_layout(cfg):
        values = fields[name] if name == "s" else [fields[name]]
        width = state_width(cfg) if name == "s" else field.width
        for j, value in enumerate(values):
            word |= (value & ((1 << width) - 1)) << (field.offset + j * width)
    return word


def unpack_lanes(word: int, width: int, K: int) -> list[int]:
    """``K`` signed ``width``-bit lanes of ``word``, lane 0 low."""
    lanes = [(word >> (j * width)) & ((1 << width) - 1) for j in range(K)]
    return [x - (1 << width) if x >> (width - 1) else x for x in lanes]


def _check(name, got, want, seed):
    got, want = np.asarray(got), np.asarray(want)
    bad = np.flatnonzero(np.any(got != want, axis=tuple(range(1, got.ndim))))
    assert bad.size == 0, (f"{name}: {bad.size} of {len(got)} steps differ from golden.kda.kda_head_step_int "
                           f"(seed {seed}); first at step {bad[0]}: got {got[bad[0]].tolist()} "
                           f"expected {want[bad[0]].tolist()}")


# ----------------------------------------------------------------------------------------
# The bench
# ----------------------------------------------------------------------------------------
class _Driver:
    """Streams steps through the ``key`` unit: beats offered with probability ``p_valid`` (held
    until taken), ``o`` and ``r`` ready with probability ``p_ready``; with ``chain``, row ``i`` of
    step ``t`` carries row ``i`` of the unit's output state of step ``t - 1``."""

    def __init__(self, dut, key: str, cfg: KpuConfig):
        self.dut, self.cfg, self.K = dut, cfg, cfg.kda_head_dim
        self.port = {name: getattr(dut, f"{key}_{name}") for name in
                     ("i__valid", "i__ready", "i__payload", "o__valid", "o__ready", "o__payload",
                      "r__valid", "r__ready", "r__payload")}
        self.r_width = len(self.port["r__payload"]) // self.K

    async def run(self, steps, rand: random.Random, p_valid: float, p_ready: float, chain=False):
        p, K, w = self.port, self.K, state_width(self.cfg)
        n = len(steps) * K
        rows, reads, events = [], [], {"take": [], "o": [], "r": []}
        beat, holding, cycle = 0, False, 0
        while len(rows) < n or len(reads) < len(steps):
            t, i = divmod(beat, K)
            if not holding and beat < n and (not chain or t == 0 or len(rows) > (t - 1) * K + i) \
                    and rand.random() < p_valid:
                S_row = rows[(t - 1) * K + i] if chain and t > 0 else None
                p["i__payload"].value = pack_beat(self.cfg, beat_fields(steps[t], i, S_row))
                p["i__valid"].value = 1
                holding = True
            o_ready, r_ready = rand.random() < p_ready, rand.random() < p_ready
            p["o__ready"].value, p["r__ready"].value = int(o_ready), int(r_ready)
            await RisingEdge(self.dut.clk)
            cycle += 1
            if holding and int(p["i__ready"].value):
                events["take"].append(cycle)
                beat, holding = beat + 1, False
                p["i__valid"].value = 0
            if o_ready and int(p["o__valid"].value):
                events["o"].append(cycle)
                rows.append(unpack_lanes(int(p["o__payload"].value), w, K))
            if r_ready and int(p["r__valid"].value):
                events["r"].append(cycle)
                reads.append(unpack_lanes(int(p["r__payload"].value), self.r_width, K))
            assert cycle < 200 * (n + 10), f"{len(rows)} of {n} rows, {len(reads)} reads after {cycle} cycles (hang)"
        p["o__ready"].value = p["r__ready"].value = 0
        return np.array(rows).reshape(len(steps), K, K), np.array(reads), events


def check_cycles(unit: KdaStateUpdate, events: dict, n_steps: int, seed: int):
    """At full rate: step ``t``'s first beat is taken ``t * step_cycles`` edges after the first, and
    its rows and ``r`` ``row_latency(i)`` and ``r_latency`` edges after its first beat."""
    K = unit.cfg.kda_head_dim
    first = np.array(events["take"][::K])
    want_o = first[:, None] + np.array([unit.row_latency(i) for i in range(K)])
    assert list(np.diff(first)) == [unit.step_cycles] * (n_steps - 1), f"step starts {first} (seed {seed})"
    assert np.array_equal(np.array(events["o"]).reshape(n_steps, K), want_o), f"o at {events['o']} (seed {seed})"
    assert list(events["r"]) == list(first + unit.r_latency), f"r at {events['r']} (seed {seed})"


@cocotb.test()
async def kda_state_steps(dut):
    """Directed and random steps at full rate (cycles checked) and with idle and backpressure; a
    4-token chain fed back; bit for bit against golden.kda.kda_head_step_int."""
    params = bench_params()
    key, cfg, seed = params["key"], bench_config(), int(params["seed"])
    rng, rand = np.random.default_rng(seed), random.Random(seed)
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    drv = _Driver(dut, key, cfg)
    for name in ("i__valid", "o__ready", "r__ready"):
        drv.port[name].value = 0
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    steps = directed_steps(cfg, rng) + random_steps(cfg, rng, int(params.get("n_random", 200)))
    S_want, r_want = golden_steps(steps, cfg)
    half = len(steps) // 2
    S_got, r_got, events = await drv.run(steps[:half], rand, 1.0, 1.0)
    check_cycles(KdaStateUpdate(cfg), events, half, seed)
    S2, r2, _ = await drv.run(steps[half:], rand, 0.7, 0.7)
    _check("S''", np.concatenate([S_got, S2]), S_want, seed)
    _check("r", np.concatenate([r_got, r2]), r_want, seed)
    chain = random_steps(cfg, rng, 4)
    S_got, r_got, _ = await drv.run(chain, rand, 0.7, 0.7, chain=True)
    S_want, r_want = golden_chain(chain[0][0], chain, cfg)
    _check("chained S''", S_got, S_want, seed)
    _check("chained r", r_got, r_want, seed)
    dut._log.info("kda_state %s: %d steps and a 4-token chain bit-exact (seed %d)", key, len(steps), seed)


# ----------------------------------------------------------------------------------------
# pytest side
# ----------------------------------------------------------------------------------------
#: The configs on Verilator: tiny (K = 8, Q16.8, score_frac 12, half_even) and a generic K = 4 in
#: Q12.6 with score_frac 10 and half_up rounding.
BENCH_CONFIGS: dict[str, KpuConfig] = {
    "tiny": profile("tiny"),
    "k4": profile("tiny", kda_head_dim=4, act_width=12, act_frac=6, score_frac=10, rounding="half_up"),
}


@functools.cache
def _bench() -> KdaStateBench:
    """One bench top per process: the runner converts it to Verilog once."""
    return KdaStateBench(BENCH_CONFIGS)


def run(key: str, seed: int, **params):
    """Run ``kda_state_steps`` on the ``key`` unit of ``KdaStateBench(BENCH_CONFIGS)``."""
    from sim.runner import FAST_BUILD, run_bench

    return run_bench(_bench(), "kda_state", "bench_kda_state", testcase="kda_state_steps", seed=seed,
                     config=BENCH_CONFIGS[key], params={"key": key, "seed": seed, **params},
                     build_args=FAST_BUILD)
