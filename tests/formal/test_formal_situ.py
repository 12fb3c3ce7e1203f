"""Formal proof that the SiTU-GLU output never exceeds beta1*beta2 (nanokpu/formal/situ_bound.py)."""

from __future__ import annotations

from nanokpu.config import profile
from nanokpu.formal import mutants
from nanokpu.formal.sby import run_sby
from nanokpu.formal.situ_bound import SituBoundProof, situ_depth, situ_limit
from nanokpu.units.situ import Situ

CFG = profile("tiny")


def test_situ_limit_is_the_format_bound():
    assert situ_limit(CFG) == 100 * 2 ** CFG.h_frac  # beta1 * beta2 = 4 * 25 for K3


def test_situ_bound_proven():
    unit = Situ(CFG)
    result = run_sby(SituBoundProof(unit), "situ_bound", mode="bmc", depth=situ_depth(unit))
    assert result.passed, result.summary()


def test_twin_overshooting_table_caught():
    unit = mutants.OvershootSitu(CFG)
    result = run_sby(SituBoundProof(unit), "situ_bound_twin", mode="bmc", depth=situ_depth(unit))
    assert result.status == "FAIL", f"the broken twin was not caught:\n{result.summary()}"
    assert any("situ_bound.py" in a for a in result.failed_assertions()), result.summary()
