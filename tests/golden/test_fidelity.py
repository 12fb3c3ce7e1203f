"""Routing fidelity of the golden integer path (golden.fidelity, issue 26): with the AFTER scheme
(per-channel weight scales, a 16-bit router GEMM, Q20.16 logits, 16-bit scores and bias) the
integer router picks the float model's expert set, and with today's scheme (BEFORE) it does not.

Bounds: the issue's (same set >= 99 %, block cosine >= 0.99 on every seed) and, tighter, ones
from the values measured on these seeds (docs/fidelity.md has the 1024-token rows):

=====================  ================  ==========================  =================
row                    draws             AFTER measured -> bound     BEFORE measured
=====================  ================  ==========================  =================
K3 router shape        32 seeds x 32     same 99.80 % -> >= 99.5 %   66.4 % (4 seeds)
tiny blocks (8)        20 seeds x 2      same 100 % -> >= 99.6 %,    98.75 %,
                                         cosine min 0.9994 -> 0.999  cosine min 0.908
small blocks (16)      20 seeds x 1      same 100 % -> >= 99.6 %,    92.2 %,
                                         cosine min 0.9994 -> 0.999  cosine min 0.963
=====================  ================  ==========================  =================

BEFORE is asserted worse (same set and cosine), so the test fails if the new fields are ignored.
Failures name the seeds that fell short.
"""

import numpy as np
import pytest

from golden import block, fidelity
from golden import intops as I
from nanokpu.config import profile

K3_SAME_MIN = 0.995          #: measured 0.9980 (2 of 1024 tokens differ, both float near-ties < 1.1e-5)
BLOCK_SAME_MIN = 0.996       #: measured 1.0 on 320 tokens per profile (one flip would pass)
BLOCK_COSINE_MIN = 0.999     #: measured 0.9994 (tiny and small), every seed
#: BEFORE must stay below these (measured: K3 0.664, tiny 0.9875, small 0.9219; cosine min 0.908 / 0.963)
BEFORE_SAME_MAX = {"k3": 0.80, "tiny": 0.99, "small": 0.95}
BEFORE_COSINE_MIN_MAX = 0.99

BLOCKS = {"tiny": (2, 8), "small": (1, 16)}   #: blocks per seed, tokens per block


def _short(fid: fidelity.Fidelity, bound: float) -> list:
    return [(s, round(r, 4)) for s, r in zip(fid.seeds, fid.seed_same, strict=True) if r < bound]


def test_k3_router_shape_picks_the_float_expert_set():
    cfg = fidelity.scheme(profile("k3"), fidelity.AFTER)
    (fid,) = fidelity.router_fidelity([cfg], range(32), 32)
    assert fid.tokens == 1024
    assert fid.same_rate >= K3_SAME_MIN, (
        f"K3 router: same expert set {fid.same_rate:.4f} < {K3_SAME_MIN}; seeds short of 1: {_short(fid, 1.0)}")
    assert fid.swapped_mean <= 2 * (1 - K3_SAME_MIN)


def test_k3_router_shape_before_is_worse():
    (fid,) = fidelity.router_fidelity([profile("k3")], range(4), 32)
    assert fid.same_rate <= BEFORE_SAME_MAX["k3"], f"K3 router BEFORE: {fid.same_rate:.4f}, seeds {fid.seeds}"


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_blocks_route_like_float_and_keep_cosine(name):
    base = profile(name)
    before, after = fidelity.block_fidelity([base, fidelity.scheme(base, fidelity.AFTER)], range(20),
                                            *BLOCKS[name])
    assert after.same_rate >= BLOCK_SAME_MIN, (
        f"{name} AFTER: same expert set {after.same_rate:.4f} < {BLOCK_SAME_MIN}; seeds: {_short(after, 1.0)}")
    low = [(s, round(c, 5)) for s, c in zip(after.seeds, after.cosine, strict=True) if not c >= BLOCK_COSINE_MIN]
    assert not low, f"{name} AFTER: block cosine < {BLOCK_COSINE_MIN} on (seed, cosine) {low}"
    # today's scheme is measurably worse on the same draws
    assert before.same_rate <= BEFORE_SAME_MAX[name], f"{name} BEFORE: same expert set {before.same_rate:.4f}"
    assert min(before.cosine) <= BEFORE_COSINE_MIN_MAX, f"{name} BEFORE: cosine min {min(before.cosine):.4f}"


def test_after_scheme_sigmoid_table_within_one_lsb_of_correct_rounding():
    """The Q20.16 -> 16-bit sigmoid table: every input within 1 LSB of the correctly rounded score
    (fit_pwl checks it exhaustively) and 1.5 LSB of the real sigmoid."""
    cfg = fidelity.scheme(profile("k3"), fidelity.AFTER)
    table = I.sigmoid_table(cfg)
    assert (table.in_width, table.out_frac) == (20, 16)
    x = np.arange(-(1 << 19), 1 << 19, dtype=np.int64)
    err = np.abs(table(x) - 2.0 ** 16 / (1.0 + np.exp(-x / 2.0 ** 16)))
    assert err.max() <= 1.5


def test_wide_router_input_and_its_int8_view():
    """x_r at router_width bits; the int8 operand of the other GEMMs is x_r rounded by 8 bits,
    within one LSB of the direct int8 quantisation, never past +-127; the router GEMM
    accumulates in acc_width + 16 bits."""
    cfg = fidelity.scheme(profile("tiny"), fidelity.AFTER)
    assert cfg.router_acc_width == cfg.acc_width + 16
    x = np.random.default_rng(3).standard_normal((16, cfg.d_model))
    x_r, x_scale = block.quantize_input(x, cfg)
    assert np.abs(x_r).max() == 127 << 8
    x8 = block.input_int8(x_r, cfg)
    direct, scale = block.quantize_tensor(x, cfg.in_width)
    assert scale == x_scale and np.abs(x8 - direct).max() <= 1 and np.abs(x8).max() == 127
    assert np.array_equal(block.input_int8(direct, profile("tiny")), direct)   # default: the same tensor


