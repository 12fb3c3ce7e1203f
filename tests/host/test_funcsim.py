"""The functional simulator: bit-exact to golden.block.latent_moe_int; every error code."""

import numpy as np
import pytest

from golden import k3
from golden.block import latent_moe_int, quantize_latent_moe
from nanokpu.config import profile
from nanokpu.host.compiler import compile_block
from nanokpu.host.funcsim import FuncSim
from nanokpu.isa import F_M_COUNT, Err, Instr, Op


def _compiled(name, T, seed):
    cfg = profile(name)
    rng = np.random.default_rng(seed)
    P = k3.init_latent_moe(cfg, rng)
    x = rng.standard_normal((T, cfg.d_model)) * rng.uniform(0.1, 3.0)
    Q, xq = quantize_latent_moe(P, x, cfg)
    return cfg, Q, xq, compile_block(Q, xq, cfg)


def _check_block(name, T, seed):
    cfg, Q, xq, prog = _compiled(name, T, seed)
    sim = FuncSim(cfg, prog.image)
    res = sim.run(prog.instrs)
    assert res.error == Err.NONE, f"seed {seed}: {res}"
    out, ref = prog.outputs(sim.host), latent_moe_int(xq, Q, cfg)
    for key in ("y", "idx", "weights", "loads"):
        assert np.array_equal(out[key], ref[key]), f"{name} seed {seed}: {key} differs"
    assert np.array_equal(sim.loads, ref["loads"])
    # experts nobody chose are skipped
    assert res.op_counts["GATHER"] == int(np.count_nonzero(ref["loads"]))


@pytest.mark.parametrize("seed", range(20))
def test_tiny_block_bit_exact(seed):
    _check_block("tiny", 1 + seed % 9, seed)


@pytest.mark.parametrize("seed", range(3))
def test_small_block_bit_exact(seed):
    _check_block("small", 16, 100 + seed)


def test_gemms_run_on_the_engine_passed_in():
    """``FuncSim(gemm=...)`` (the iCEBreaker build's engine in ``board-run``) gets every GEMM with
    its operands, requantiser constants of the instruction or its expert's table, and the block
    is made of what it returns: bit-exact with an engine that keeps the contract, not with one
    that is off by one."""
    from golden import intops as I
    cfg, Q, xq, prog = _compiled("tiny", 3, 5)
    calls = []

    def engine(a, b, mult, shift):
        calls.append(((*a.shape, b.shape[1]), mult, shift))
        assert a.min() >= -128 and a.max() <= 127 and b.min() >= -128 and b.max() <= 127
        return I.requantize(I.matmul_int(a, b, cfg.acc_width), mult, shift, cfg.acc_width, cfg.rounding)

    sim = FuncSim(cfg, prog.image, gemm=engine)
    res = sim.run(prog.instrs)
    ref = latent_moe_int(xq, Q, cfg)
    assert res.error == Err.NONE and [shape for shape, _, _ in calls] == res.gemms
    assert {(mult, shift) for _, mult, shift in calls} - {(1, 0)}, "no requantising GEMM in the block"
    for key in ("y", "idx", "weights", "loads"):
        assert np.array_equal(prog.outputs(sim.host)[key], ref[key]), key
    off = FuncSim(cfg, prog.image, gemm=lambda a, b, mult, shift: engine(a, b, mult, shift) + 1)
    assert off.run(prog.instrs).error == Err.NONE
    assert not np.array_equal(prog.outputs(off.host)["y"], ref["y"])


# -- bad programs ------------------------------------------------------------------------
def _run(instrs, cfg=None, host=bytes(64)):
    cfg = cfg or profile("tiny")
    sim = FuncSim(cfg, host)
    before = sim.spad.copy()
    return sim.run(instrs), sim, before


@pytest.mark.parametrize("instrs,code", [
    ([Instr(63)], Err.BAD_OPCODE),
    ([Instr(Op.GEMM, m=2, k=2, n=2, c=8191)], Err.SPAD_RANGE),
    ([Instr(Op.GEMM, m=1, k=65, n=2)], Err.BAD_SHAPE),
    ([Instr(Op.GEMM, m=1, k=8, n=2, c=100, host=60)], Err.HOST_RANGE),
    ([Instr(Op.ADD, m=1, n=4, a=0, b=10, c=2)], Err.OVERLAP),
    ([Instr(Op.ADD, m=1, n=4, a=10, b=2, c=2)], Err.NONE),    # in place on b: allowed
    ([Instr(Op.NORM, m=2, n=4, a=0, c=0)], Err.NONE),            # in place: allowed
    ([Instr(Op.NORM, m=2, n=4, a=0, c=4)], Err.OVERLAP),         # row 1 would read row 0's result
    ([Instr(Op.GEMM, m=1, k=4, n=2, a=0, c=3, host=0)], Err.OVERLAP),
    ([Instr(Op.COMBINE, m=1, k=2, n=2, a=0, b=8, c=0)], Err.OVERLAP),   # not element-wise
    ([Instr(Op.SIGMOID, m=2, n=8, a=0, c=16), Instr(Op.ROUTE, m=2, n=8, k=2, a=16, b=100, c=20)],
     Err.OVERLAP),                                               # the table over the scores
    ([Instr(Op.GEMM, m=0, k=2, n=2)], Err.BAD_SHAPE),
    ([Instr(Op.LOAD, m=1, n=4, width=3)], Err.BAD_SHAPE),
    ([Instr(Op.ROUTE, m=2, n=8, k=2, a=0, b=100, c=200)], Err.NO_SCORES),
    ([Instr(Op.SIGMOID, m=2, n=8, a=0, c=16), Instr(Op.ROUTE, m=2, n=8, k=2, a=0, b=100, c=200)],
     Err.NO_SCORES),
    ([Instr(Op.LOAD, m=1, n=128, width=1)], Err.HOST_RANGE),
    ([Instr(Op.LOAD, m=1, n=4, width=1, host=2)], Err.HOST_RANGE),
    ([Instr(Op.JUMP, target=64)], Err.PC_RANGE),
    ([Instr(Op.GEMM, flags=F_M_COUNT, k=2, n=2)], Err.NO_ROUTE),
    ([Instr(Op.GATHER, m=2, n=2)], Err.NO_ROUTE),
    ([Instr(Op.EXPERT, n=8, a=0, target=0)], Err.NO_ROUTE),
])
def test_bad_program_stops_with_code(instrs, code):
    res, sim, before = _run(instrs + [Instr(Op.HALT)])
    assert res.error == code
    assert res.pc == len(instrs) - (code != Err.NONE)
    if len(instrs) == 1 and code != Err.NONE:
        assert np.array_equal(sim.spad, before)  # nothing written


def test_running_off_the_end_of_imem():
    res, _, _ = _run([Instr(Op.JUMP, target=63)] + [Instr(Op.ADD, m=1, n=1)] * 63)
    assert res.error == Err.PC_RANGE and res.pc == 64


def test_gather_index_out_of_range_stops_midway():
    from sim.bench_top import gather_out_of_range
    cfg = profile("tiny")
    instrs = gather_out_of_range(cfg)
    res, sim, _ = _run(instrs, cfg, host=(1000).to_bytes(4, "little") + bytes(60))
    assert res.error == Err.SPAD_RANGE and res.pc == len(instrs) - 1
    assert not sim.spad[1000:1008].any()  # the bad row was not copied
