"""Formal stream-protocol proofs of every streaming unit, and their broken twins.

Each unit is proven twice with SymbiYosys (nanokpu/formal/streams.py):
* handshake rules (valid held until the transfer, payload stable while stalled) by
  k-induction (``mode prove``: unbounded);
* conservation (no transfer created or lost, bounded occupancy, bounded response) by a
  bounded check from reset of the stated depth (the in-flight counter is not inductive
  without the units' internals).
Every proof has a twin with one mutation that must FAIL.
"""

from __future__ import annotations

import gc

import pytest
from amaranth.hdl import Fragment

from nanokpu.config import profile
from nanokpu.formal import mutants
from nanokpu.formal.sby import run_sby
from nanokpu.formal.streams import Flow, StreamProof
from nanokpu.formal.topk import router_env, router_flow
from nanokpu.units.gemm import GemmEngine
from nanokpu.units.requant import Requantiser
from nanokpu.units.router import TopKRouter
from nanokpu.units.sigmoid import Sigmoid
from nanokpu.units.situ import Situ
from nanokpu.units.vector import VectorUnit

#: Small shapes: the proofs are about control, not width (8 experts, top-3, one beat per token).
CFG = profile("tiny", n_experts=8, top_k=3, route_lanes=8, score_frac=2, bias_width=4, weight_frac=3,
              load_width=2, acc_width=16, spad_b_depth=2, mult_width=8)


def _pipeline(make):
    unit = make()
    flow = Flow("i", "o", capacity=unit.latency, response=unit.latency)
    return unit, flow


UNITS = {
    "sigmoid": lambda: _pipeline(lambda: Sigmoid(CFG)),
    "situ": lambda: _pipeline(lambda: Situ(CFG)),
    "requant": lambda: _pipeline(lambda: Requantiser(CFG, lanes=1)),
    "router": lambda: (lambda r: (r, router_flow(r)))(TopKRouter(CFG)),
}
STABLE = {"requant": ["mult", "shift"]}
ENV = {"router": router_env}



def _check(result, expect_pass: bool):
    if expect_pass:
        assert result.passed, result.summary()
    else:
        assert result.status == "FAIL", f"the broken twin was not caught:\n{result.summary()}"
        assert result.failed_assertions(), result.summary()


@pytest.mark.parametrize("name", sorted(UNITS))
def test_handshake_rules_proven(name):
    unit, _ = UNITS[name]()
    proof = StreamProof(unit, stable=STABLE.get(name, ()), assume=ENV.get(name))
    _check(run_sby(proof, f"streams_{name}_handshake", mode="prove", depth=unit.latency + 4), True)


def _flow_depth(flow) -> int:
    """Depth that lets a unit enter, stall and exceed the response bound if it was lost."""
    return flow.response + 3 * flow.in_per_unit + 8


@pytest.mark.parametrize("name", sorted(n for n in UNITS if n != "router"))
def test_conservation_bounded(name):
    unit, flow = UNITS[name]()
    depth = _flow_depth(flow)
    proof = StreamProof(unit, [flow], stable=STABLE.get(name, ()), assume=ENV.get(name))
    _check(run_sby(proof, f"streams_{name}_flow", mode="bmc", depth=depth), True)


def test_conservation_router_short():
    """The router at a depth that covers a few tokens but not its whole response window
    (the full depth is the slow test below): nothing created, occupancy, ``last``."""
    unit, flow = UNITS["router"]()
    depth = unit.latency + 3 * flow.in_per_unit + 6
    _check(run_sby(StreamProof(unit, [flow], assume=router_env), "streams_router_flow_short",
                   mode="bmc", depth=depth), True)


@pytest.mark.slow(125)
def test_conservation_router_full():
    unit, flow = UNITS["router"]()
    _check(run_sby(StreamProof(unit, [flow], assume=router_env), "streams_router_flow",
                   mode="bmc", depth=_flow_depth(flow)), True)


#: A 2x2 GEMM engine with small scratchpads: its control, at a size the solver handles.
GEMM_CFG = profile("tiny", rows=2, cols=2, spad_a_depth=16, spad_b_depth=8, spad_c_depth=16, acc_width=18,
                   mult_width=8)


def test_gemm_handshake_rules_proven():
    """cmd, a_in, b_in (assumed) and c_out (asserted); its transfer counts depend on the
    command (tiles), so conservation is left to the bit-exact benches."""
    _check(run_sby(StreamProof(GemmEngine(GEMM_CFG)), "streams_gemm_handshake", mode="prove", depth=6), True)


def test_vector_handshake_rules_bounded():
    """The vector unit's NORM runs long internal passes: its handshake rules are not inductive
    from the ports alone, so this is a bounded check (40 cycles: two NORM rows of 4)."""
    proof = StreamProof(VectorUnit(profile("tiny")), stable=["op", "n"])
    _check(run_sby(proof, "streams_vector_handshake", mode="bmc", depth=40), True)


def test_twin_retracting_valid_caught():
    unit = Sigmoid(CFG)
    proof = StreamProof(mutants.RetractingValid(unit, "o"))
    _check(run_sby(proof, "streams_twin_retract", mode="prove", depth=unit.latency + 4), False)


def test_twin_dropped_ready_caught():
    unit = mutants.DroppedReadySigmoid(CFG)
    proof = StreamProof(unit, [Flow("i", "o", capacity=unit.latency, response=unit.latency)])
    _check(run_sby(proof, "streams_twin_dropready", mode="bmc", depth=2 * unit.latency + 8), False)


def test_twin_router_dropped_ready_caught():
    unit = mutants.DroppedReadyRouter(CFG)
    flow = router_flow(unit)
    proof = StreamProof(unit, [flow], assume=router_env)
    _check(run_sby(proof, "streams_twin_router_dropready", mode="bmc", depth=flow.response + 8), False)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_stream_proof_rejects_bad_setup():
    unit = Sigmoid(CFG)
    with pytest.raises(ValueError, match="capacity"):
        Flow("i", "o", capacity=0, response=1)
    with pytest.raises(ValueError, match="not a stream"):
        StreamProof(unit, [Flow("i", "x", capacity=1, response=1)])
    with pytest.raises(ValueError, match="stable member"):
        StreamProof(unit, stable=["mult"])
    proof = StreamProof(unit)
    with pytest.raises(ValueError, match="mode"):
        run_sby(proof, "bad", mode="magic")
    Fragment.get(proof, None)  # elaborated: no UnusedElaboratable warning
    gc.collect()  # the half-built wrappers above warn UnusedElaboratable here, not in a later test
