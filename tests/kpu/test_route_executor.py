"""The route executor alone with the routing engine (Amaranth simulator): the ROUTE table (indices,
weights, counts, offsets, slot and token lists) equals FuncSim's, bit for bit, with the scratchpad
of either build (generic, or ECP5's one write port: a cycle that performs a write performs no
read), on random scores, scores that tie, and tokens that all pick the same experts."""

import numpy as np
import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from nanokpu.config import profile
from nanokpu.host.funcsim import FuncSim
from nanokpu.isa import Err, Op, route_table
from nanokpu.kpu.executors.route import Route
from nanokpu.units.router import TopKRouter
from sim.lib.executor_model import run_instruction, serve_scratchpad


class _Pair(Elaboratable):
    def __init__(self, cfg):
        self.router = TopKRouter(cfg)
        self.route = Route(cfg, self.router.route_layout)

    def elaborate(self, platform):
        m = Module()
        m.submodules.router, m.submodules.route = r, x = self.router, self.route
        wiring.connect(m, x.scores, r.scores)
        wiring.connect(m, r.routes, x.routes)
        m.d.comb += [r.bias_we.eq(x.bias.we), r.bias_addr.eq(x.bias.addr), r.bias_data.eq(x.bias.data)]
        return m


def _run(cfg, scores, bias, one_write_port):
    T, E = scores.shape
    a, b, c = 3, 3 + T * E + 5, 3 + T * E + 5 + E + 7
    spad = {a + i: int(v) for i, v in enumerate(scores.ravel())} | {b + j: int(v) for j, v in enumerate(bias)}
    ref = FuncSim(cfg)
    for addr, v in spad.items():
        ref.spad[addr] = v
    ref._route(a, b, c, T)
    end = route_table(c, T, cfg)["end"]
    expect = [int(v) for v in ref.spad[c:end]]

    dut = _Pair(cfg)
    x = dut.route
    out = {}

    async def scratchpad(ctx):
        await serve_scratchpad(ctx, x.spad, spad, one_write_port)

    async def controller(ctx):
        out.update(await run_instruction(ctx, x, {"op": Op.ROUTE, "a": a, "b": b, "c": c, "m": T, "n": E,
                                                  "k": cfg.top_k, "len": T * E}))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(scratchpad)
    sim.add_testbench(controller)
    sim.run()
    got = [spad.get(i) for i in range(c, end)]
    return got, expect, out


def _cases(cfg, rng):
    E, hi = cfg.n_experts, 1 << cfg.score_frac
    rand = rng.integers(0, hi + 1, (5, E))
    ties = np.full((4, E), hi // 2)                      # every score equal: the lowest indices win
    same = np.tile(rng.integers(0, hi + 1, E), (3, 1))   # every token the same experts
    bias = rng.integers(-(hi >> 3), hi >> 3, E)
    return [("random", rand, bias), ("ties", ties, np.zeros(E, dtype=np.int64)), ("same", same, bias)]


@pytest.mark.parametrize("name", ["tiny", "small"])
@pytest.mark.parametrize("one_write_port", [False, True])
def test_route_table_matches_funcsim(name, one_write_port):
    cfg = profile(name)
    rng = np.random.default_rng(11)
    for case, scores, bias in _cases(cfg, rng):
        got, expect, out = _run(cfg, scores, bias, one_write_port)
        assert got == expect, f"{name} {case}"
        assert out["error"] == Err.NONE


def test_dispatch_is_linear_in_slots():
    """The counting sort: the whole ROUTE of T tokens takes the bias (E + 1 cycles), the score
    beats (a read per lane, a capture, a handshake), 3 cycles per expert and 4 per slot, not
    E*T*top_k compare steps (8,192 here)."""
    cfg = profile("small")
    rng = np.random.default_rng(2)
    T, E = 8, cfg.n_experts
    _got, _expect, out = _run(cfg, rng.integers(0, 1 << cfg.score_frac, (T, E)), np.zeros(E, dtype=np.int64), False)
    beats = T * (E // cfg.route_lanes)
    assert out["cycles"] <= E + 1 + beats * (cfg.route_lanes + 2) + 3 * E + 4 * T * cfg.top_k + 60, out
