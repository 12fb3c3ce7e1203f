"""Tests of :class:`nanokpu.units.router.TopKRouter`: cocotb benches on Verilator (sim/bench_router.py),
bit-exact against :func:`golden.intops.route_int`, with random idle and backpressure."""

from __future__ import annotations

import pytest

from nanokpu.commands.bench_router import run_router_bench
from nanokpu.config import profile
from nanokpu.units.router import cycles_per_token, latency
from sim.runner import FAST_BUILD

SEED = 20261202


@pytest.mark.parametrize("cfg", [
    profile("tiny"),
    profile("small"),
    profile("tiny", top_k=1, route_lanes=3, load_width=4),   # k = 1, E % lanes != 0, saturation
    profile("tiny", top_k=8, route_lanes=8),                 # k = E, one beat per token
], ids=["tiny", "small", "tiny-k1-lanes3", "tiny-kE-lanes8"])
def test_bench(cfg):
    # unoptimised C++ builds faster; only the small build (shared with the closed loop,
    # 200k cycles) is worth optimising
    run_router_bench(cfg, tokens=20, seed=SEED, build_args=() if cfg.name == "small" else FAST_BUILD)


def test_bench_k3():
    """The full K3 shape (896 experts, top-16, 16 lanes): a random multi-token batch with
    idle and backpressure, and the cycle-exact throughput of 56 = 896/16 cycles per token."""
    run_router_bench(profile("k3"), testcase=["random_tokens", "throughput"], tokens=6,
                     seed=SEED, build_args=FAST_BUILD)


@pytest.mark.parametrize("name,lanes,expected", [
    ("k3", 16, 56), ("k3", 4, 224), ("k3", 1, 896), ("small", 4, 34), ("tiny", 1, 32),
])
def test_cycles_per_token(name, lanes, expected):
    """The timing contract (the benches check it cycle-exactly): max(beats, 2k + 1, R + k + 2)
    cycles per token; at the k3 shape the score input is the bottleneck, within 896/lanes + 32."""
    cfg = profile(name, route_lanes=lanes)
    assert cycles_per_token(cfg) == expected
    if name == "k3":
        assert cycles_per_token(cfg) <= cfg.n_experts / lanes + 32
    assert latency(cfg) == 2 * cfg.top_k + cfg.weight_frac + cfg.score_frac + 1 + 6


@pytest.mark.slow
@pytest.mark.parametrize("lanes", [1, 4])
def test_bench_k3_lanes(lanes):
    """The other lane counts of the benchmark at the K3 shape: bit-exact and cycle-exact
    (896 / lanes cycles per token)."""
    run_router_bench(profile("k3", route_lanes=lanes), testcase=["random_tokens", "throughput"],
                     tokens=4, seed=SEED, build_args=FAST_BUILD)
