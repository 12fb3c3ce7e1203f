# amaranth: UnusedElaboratable=no
"""nanokpu.units.kda_state: the KDA state update, bit for bit against golden.kda.kda_head_step_int
(Amaranth simulator and Verilator), its cycle counts, its widths and its config checks."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from golden import intops as I
from golden.kda import kda_head_step_int, state_width, unit_frac
from nanokpu.config import ROUNDING_MODES, profile
from nanokpu.units.kda_state import KdaStateUpdate, kda_state_ranges
from sim import bench_kda_state as B

#: A generic head: K = 4, Q12.6, score_frac 10.
K4 = dict(kda_head_dim=4, act_width=12, act_frac=6, score_frac=10)


def run_amaranth(dut, steps, seed, p_valid=0.7, p_ready=0.7, chain=False):
    """Stream ``steps`` through ``dut`` (the driver of the Verilator bench, in the Amaranth
    simulator): ``(S'' [n, K, K], r [n, K], events)``, ``events`` the cycles of the transfers. Also
    checks that a raised ``o.valid`` or ``r.valid`` holds its payload until taken."""
    rand = np.random.default_rng(seed)
    K = dut.cfg.kda_head_dim
    n = len(steps) * K
    rows, reads, events = [], [], {"take": [], "o": [], "r": []}

    async def tb(ctx):
        beat, holding, cycle, held = 0, False, 0, {}
        while len(rows) < n or len(reads) < len(steps):
            t, i = divmod(beat, K)
            if not holding and beat < n and (not chain or t == 0 or len(rows) > (t - 1) * K + i) \
                    and rand.random() < p_valid:
                S_row = rows[(t - 1) * K + i] if chain and t > 0 else None
                ctx.set(dut.i.payload, B.beat_fields(steps[t], i, S_row))
                ctx.set(dut.i.valid, 1)
                holding = True
            ready = {"o": bool(rand.random() < p_ready), "r": bool(rand.random() < p_ready)}
            ctx.set(dut.o.ready, ready["o"])
            ctx.set(dut.r.ready, ready["r"])
            _, _, i_ready, *outs = await ctx.tick().sample(dut.i.ready, dut.o.valid, dut.o.payload,
                                                            dut.r.valid, dut.r.payload)
            cycle += 1
            if holding and i_ready:
                events["take"].append(cycle)
                beat, holding = beat + 1, False
                ctx.set(dut.i.valid, 0)
            for name, valid, payload, got in (("o", *outs[:2], rows), ("r", *outs[2:], reads)):
                if valid:
                    value = [payload[j] for j in range(K)]
                    assert held.get(name, value) == value, f"{name}.payload changed before its transfer"
                    held[name] = value
                    if ready[name]:
                        got.append(value)
                        events[name].append(cycle)
                        del held[name]
            assert cycle < 200 * (n + 10), "hang"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return np.array(rows).reshape(len(steps), K, K), np.array(reads), events


def check(dut, steps, seed, **kwargs):
    S_want, r_want = B.golden_steps(steps, dut.cfg)
    S_got, r_got, _ = run_amaranth(dut, steps, seed, **kwargs)
    np.testing.assert_array_equal(S_got, S_want, err_msg=f"S'' seed {seed}")
    np.testing.assert_array_equal(r_got, r_want, err_msg=f"r seed {seed}")


# ---------------------------------------------------------------------------------------
# (a) Amaranth simulator, bit for bit
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_directed_steps(rounding):
    """Saturation of the delta rule both ways, decay 0 and 1.0, beta 0 and 1.0, the ports' and
    the unit format's extremes, ties at every rounding site; random idle and backpressure."""
    cfg = profile("tiny", rounding=rounding)
    seed = 11
    check(KdaStateUpdate(cfg), B.directed_steps(cfg, np.random.default_rng(seed)), seed)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_steps(seed):
    """Random states and vectors over the ports' whole ranges (tiny), idle and backpressure."""
    cfg = profile("tiny")
    check(KdaStateUpdate(cfg), B.random_steps(cfg, np.random.default_rng(seed), 24), seed)


@pytest.mark.parametrize("rounding", ROUNDING_MODES)
def test_generic_head(rounding):
    """K = 4 in Q12.6, score_frac 10: directed and random steps."""
    cfg = profile("tiny", rounding=rounding, **K4)
    rng = np.random.default_rng(21)
    check(KdaStateUpdate(cfg), B.directed_steps(cfg, rng) + B.random_steps(cfg, rng, 16), 21)


@pytest.mark.parametrize("seed", [3, 4])
def test_chained_steps(seed):
    """4 tokens, each step's input state the unit's output state of the one before, against the
    golden recurrence (the first state random, the others ignored)."""
    cfg = profile("tiny")
    steps = B.random_steps(cfg, np.random.default_rng(seed), 4)
    S_got, r_got, _ = run_amaranth(KdaStateUpdate(cfg), steps, seed, chain=True)
    S_want, r_want = B.golden_chain(steps[0][0], steps, cfg)
    np.testing.assert_array_equal(S_got, S_want, err_msg=f"chained S'' seed {seed}")
    np.testing.assert_array_equal(r_got, r_want, err_msg=f"chained r seed {seed}")


def _sites(step, cfg):
    """The values each rounding shift of a step sees, by shift, and the delta rule's sum before
    its saturation."""
    S, decay, k, v, beta, q = step
    u, sf, mode = unit_frac(cfg), cfg.score_frac, cfg.rounding
    p1 = decay[:, None] * S
    S1 = I.round_shift(p1, sf, mode)
    acc = k @ S1
    e = (v << cfg.act_frac) - I.round_shift(acc, u, mode)
    bkp = beta * k
    delta = I.round_shift(bkp, sf, mode)[:, None] * e[None, :]
    pre = S1 + I.round_shift(delta, u, mode)
    S2 = I.saturate(pre, state_width(cfg))
    return {"S'": (p1, sf), "S'^T k": (acc, u), "bk": (bkp, sf), "bk e": (delta, u), "r": (q @ S2, u)}, pre


def test_directed_steps_hit_ties_and_saturation():
    """The directed steps do what they say: exact halves at all five rounding sites (odd and even
    quotients, positive and negative values), and the delta rule's sum above and below the state format."""
    for cfg, seed in ((profile("tiny"), 11), (profile("tiny", **K4), 21)):
        w = state_width(cfg)
        steps = B.directed_steps(cfg, np.random.default_rng(seed))
        ties = {}
        hi = lo = False
        for step in steps:
            sites, pre = _sites(step, cfg)
            for name, (x, s) in sites.items():
                tie = (x & ((1 << s) - 1)) == 1 << (s - 1)
                quot = x[tie] >> s
                ties.setdefault(name, set()).update(zip((quot & 1).tolist(), (quot < 0).tolist(), strict=True))
            hi |= bool((pre > (1 << (w - 1)) - 1).any())
            lo |= bool((pre < -(1 << (w - 1))).any())
        for name, seen in ties.items():   # odd and even quotients, positive and negative ties
            assert {p for p, _ in seen} == {0, 1} and {n for _, n in seen} == {False, True}, \
                (cfg.kda_head_dim, name, seen)
        assert hi and lo, cfg.kda_head_dim


# ---------------------------------------------------------------------------------------
# (c) cycles
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [{}, K4], ids=["tiny", "k4"])
def test_cycles_per_step(overrides):
    """Beats always offered, outputs always ready: the next step's first beat is taken exactly
    2K + 5 edges after this one's; rows and r exactly at row_latency and r_latency."""
    cfg = profile("tiny", **overrides)
    dut = KdaStateUpdate(cfg)
    K = cfg.kda_head_dim
    assert dut.step_cycles == 2 * K + 5 and dut.r_latency == 2 * K + 10 and dut.row_latency(0) == K + 8
    steps = B.random_steps(cfg, np.random.default_rng(5), 3)
    S_got, r_got, events = run_amaranth(dut, steps, 5, p_valid=1.0, p_ready=1.0)
    B.check_cycles(dut, events, len(steps), 5)
    S_want, r_want = B.golden_steps(steps, cfg)
    np.testing.assert_array_equal(S_got, S_want, err_msg="seed 5")
    np.testing.assert_array_equal(r_got, r_want, err_msg="seed 5")


# ---------------------------------------------------------------------------------------
# widths and config
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [{}, K4, {"kda_head_dim": 16}], ids=["tiny", "k4", "k16"])
def test_ranges_hold_every_value(overrides):
    """The ranges the registers are sized by hold every value the golden step forms on the directed
    and random steps (the ports' extremes among them), and the read-out's top is reached."""
    cfg = profile("tiny", **overrides)
    ranges = kda_state_ranges(cfg)
    rng = np.random.default_rng(8)
    names = {"S'^T k": "acc", "bk e": "delta", "r": "racc"}
    for step in B.directed_steps(cfg, rng) + B.random_steps(cfg, rng, 50):
        sites, _ = _sites(step, cfg)
        u, sf, mode = unit_frac(cfg), cfg.score_frac, cfg.rounding
        values = {names[n]: x for n, (x, _) in sites.items() if n in names}
        values["s1"] = I.round_shift(sites["S'"][0], sf, mode)
        values["bk"] = I.round_shift(sites["bk"][0], sf, mode)
        values["r"] = I.round_shift(sites["r"][0], u, mode)
        for name, x in values.items():
            lo, hi = ranges[name]
            assert lo <= x.min() and x.max() <= hi, (name, x.min(), x.max(), ranges[name])
    (s_lo, _), (a_lo, a_hi), _ = B._ranges(cfg)
    K = cfg.kda_head_dim
    _, r = kda_head_step_int(np.full((K, K), s_lo), np.full(K, 1 << cfg.score_frac), np.zeros(K, dtype=np.int64),
                             np.full(K, a_hi), 0, np.full(K, a_lo), cfg)
    assert r.max() == ranges["r"][1]


def test_config_checks():
    with pytest.raises(TypeError, match="KpuConfig"):
        KdaStateUpdate("tiny")
    with pytest.raises(ValueError, match="kda_head_dim"):
        KdaStateUpdate(profile("tiny", act_width=24, act_frac=8, kda_head_dim=4096))


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_verilog_generates(name):
    from amaranth.back import verilog

    assert "module" in verilog.convert(KdaStateUpdate(profile(name)), name="kda_state", emit_src=False)


# ---------------------------------------------------------------------------------------
# (b) Verilator
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", sorted(B.BENCH_CONFIGS))
def test_kda_state_verilator(key):
    """The directed steps and 400 random ones at full rate (cycle counts checked) and with idle and
    backpressure, then a 4-token chain fed back; one Verilator build for both configs."""
    B.run(key, seed=61, n_random=400)
