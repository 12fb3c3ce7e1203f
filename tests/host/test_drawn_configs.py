"""Property test: for any valid small config (Hypothesis draws the shapes, widths, rounding and
sizes), a random block compiles, and the functional simulator runs it bit-exactly to the golden
integer block; two drawn configs also run on the RTL (Verilator), bit-exact the same way.

Hypothesis prints the falsifying config and seed on failure.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from golden.block import latent_moe_int, random_block
from nanokpu.config import KpuConfig
from nanokpu.host.compiler import compile_block, max_tokens
from nanokpu.host.funcsim import FuncSim
from nanokpu.isa import Err


@st.composite
def configs(draw) -> KpuConfig:
    """A valid config the nano-KPU can run: the top level needs int8 operands and an AXI data
    width of cols * 8 in {32, 64} bits; everything else drawn across its range (the router logits
    in the act format or a format of their own, at most 20 bits: each format fits a sigmoid table
    over all its inputs)."""
    d_latent = draw(st.sampled_from([4, 8, 16]))
    n_experts = draw(st.integers(2, 12))
    rows = draw(st.integers(1, 8))
    logit_width = draw(st.sampled_from([None, 12, 16, 20]))
    logit_frac = None if logit_width is None else draw(st.integers(2, logit_width - 4))
    return KpuConfig(
        name="drawn",
        d_latent=d_latent, d_model=d_latent * draw(st.integers(1, 4)),
        n_experts=n_experts, top_k=draw(st.integers(1, min(4, n_experts))),
        d_expert=draw(st.sampled_from([4, 8, 16, 24])), d_shared=draw(st.sampled_from([8, 16, 32])),
        rows=rows, cols=draw(st.sampled_from([4, 8])),
        acc_width=draw(st.integers(22, 32)),
        rounding=draw(st.sampled_from(["half_even", "half_up", "floor"])),
        score_frac=draw(st.integers(6, 14)), weight_frac=draw(st.integers(8, 16)),
        route_lanes=draw(st.integers(1, n_experts)), act_lanes=draw(st.integers(1, 4)),
        spad_a_depth=256, spad_b_depth=128, spad_c_depth=256,
        dmem_depth=draw(st.sampled_from([4096, 8192])), imem_depth=64,
        logit_width=logit_width, logit_frac=logit_frac,
    )


def check_block(cfg: KpuConfig, seed: int) -> None:
    tokens = min(1 + seed % 8, max_tokens(cfg))
    assert tokens >= 1, f"{cfg}: no block fits"
    Q, xq, _, _ = random_block(cfg, tokens, np.random.default_rng(seed))
    prog = compile_block(Q, xq, cfg)
    sim = FuncSim(cfg, prog.image)
    res = sim.run(prog.instrs)
    assert res.error == Err.NONE, f"seed {seed}: {res}"
    out, ref = prog.outputs(sim.host), latent_moe_int(xq, Q, cfg)
    for key in ("y", "idx", "weights", "loads"):
        assert np.array_equal(out[key], ref[key]), f"seed {seed}: {key} differs"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), seed=st.integers(0, 2 ** 16))
def test_drawn_configs_run_bit_exact_on_funcsim(cfg, seed):
    check_block(cfg, seed)


#: Two configs drawn once (Hypothesis' example database is not kept in CI, so fixed here: a
#: non-square 3x8 array with half_up and 5 of 11 experts, a 1x4 one with floor, one expert
#: per token and Q12.9 router logits) for the RTL.
RTL_CONFIGS = [
    KpuConfig(name="drawn_a", d_latent=8, d_model=24, n_experts=11, top_k=3, d_expert=24, d_shared=16, rows=3,
              cols=8, acc_width=26, rounding="half_up", score_frac=9, weight_frac=11, route_lanes=5, act_lanes=3),
    KpuConfig(name="drawn_b", d_latent=4, d_model=16, n_experts=3, top_k=1, d_expert=8, d_shared=32, rows=1,
              cols=4, acc_width=22, rounding="floor", score_frac=13, weight_frac=16, route_lanes=2, act_lanes=2,
              logit_width=12, logit_frac=9),
]


@pytest.mark.slow(55)
@pytest.mark.parametrize("cfg", RTL_CONFIGS, ids=[c.name for c in RTL_CONFIGS])
def test_drawn_configs_run_bit_exact_on_the_rtl(cfg):
    from sim.lib.kpu_launch import run_kpu_bench

    check_block(cfg, seed=3)   # the golden side first
    run_kpu_bench(cfg, "bench_top", testcase="test_block", seed=3, fast=True,
                  params={"tokens": min(6, max_tokens(cfg)), "seeds": 3, "vary_tokens": True, "pause": 0.2})
