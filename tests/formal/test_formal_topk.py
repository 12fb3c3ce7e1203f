"""Formal proof of the top-k routing engine at 8 experts, top-3 (nanokpu/formal/topk.py).

For every bias set and every score vector, the k routes are the experts of rank 0..k-1 by
biased key with the stable tie rule; a sign bug in the key comparison must be caught. The
reciprocal behind the weights is proven on the divider (nanokpu/formal/divider.py).
"""

from __future__ import annotations

from nanokpu.config import profile
from nanokpu.formal import mutants
from nanokpu.formal.divider import DividerProof, divider_depth
from nanokpu.formal.sby import run_sby
from nanokpu.formal.topk import TopKProof, topk_depth
from nanokpu.units.divider import SeqDivider
from nanokpu.units.router import TopKRouter


def _cfg(lanes: int):
    return profile("tiny", n_experts=8, top_k=3, route_lanes=lanes, score_frac=2, bias_width=4,
                   weight_frac=3, load_width=2)


def _prove(router, name):
    return run_sby(TopKProof(router, fixed_schedule=True), name, mode="bmc", depth=topk_depth(router))


def test_topk_selection_8_lanes():
    result = _prove(TopKRouter(_cfg(8)), "topk_lanes8")
    assert result.passed, result.summary()


def test_topk_selection_2_lanes():
    """Two lanes: the insertion lists (depth 3, four beats per token) and the merge."""
    result = _prove(TopKRouter(_cfg(2)), "topk_lanes2")
    assert result.passed, result.summary()


def test_twin_sign_bug_caught():
    result = _prove(mutants.SignBugRouter(_cfg(8)), "topk_twin_signbug")
    assert result.status == "FAIL", f"the broken twin was not caught:\n{result.summary()}"
    assert any("topk.py" in a for a in result.failed_assertions()), result.summary()


def test_divider_reciprocal():
    """The reciprocal divider of this shape: ``weight_frac + score_frac + 2`` by ``sum_width`` bits."""
    cfg = _cfg(8)
    recip_bits = cfg.weight_frac + cfg.score_frac + 1
    sum_width = (cfg.top_k * (2 ** cfg.score_width - 1)).bit_length()
    divider = SeqDivider(recip_bits + 1, sum_width)
    result = run_sby(DividerProof(divider), "divider", mode="bmc", depth=divider_depth(divider))
    assert result.passed, result.summary()


def test_twin_stuck_quotient_caught():
    divider = mutants.StuckQuotientDivider(7, 5)  # the shape of test_divider_reciprocal
    result = run_sby(DividerProof(divider), "divider_twin", mode="bmc", depth=divider_depth(divider))
    assert result.status == "FAIL", f"the broken twin was not caught:\n{result.summary()}"
