"""Formal proof on the whole tiny nano-KPU: a bad opcode stops the controller with BAD_OPCODE
at pc 0 within a bound, STATUS keeps reporting it, irq rises, and the AXI4-Lite bus answers
every transaction within a bound (nanokpu/formal/controller.py); two broken twins must fail."""

from __future__ import annotations

import pytest

from nanokpu.config import profile
from nanokpu.formal import mutants
from nanokpu.formal.controller import ControllerProof, controller_depth
from nanokpu.formal.sby import run_sby
from nanokpu.kpu.top import NanoKPU


def _run(kpu, name):
    # the scratchpad stays an array for the solver: mapped to registers it would be 256k flops
    return run_sby(ControllerProof(kpu), name, mode="bmc", depth=controller_depth(), memory_map=False)


@pytest.mark.slow(90)
def test_bad_opcode_stops_with_error_and_bus_answers():
    result = _run(NanoKPU(profile("tiny")), "controller")
    assert result.passed, result.summary()


@pytest.mark.slow(50)
@pytest.mark.parametrize("twin", [mutants.silent_status, mutants.hanging_bus_after_error])
def test_twins_caught(twin):
    result = _run(twin(NanoKPU(profile("tiny"))), f"controller_twin_{twin.__name__}")
    assert result.status == "FAIL", f"the broken twin was not caught:\n{result.summary()}"
    assert any("controller.py" in a for a in result.failed_assertions()), result.summary()
