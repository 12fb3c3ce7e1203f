"""nanokpu.host.layer: the FFN half of a K3 layer (Attention Residuals, the weighted RMSNorm as NORM
and MUL, the dense SiTU-GLU FFN or the LatentMoE block, the residual add) lowered to one linked
program, run on FuncSim, equal to golden.layer.ffn_sublayer_int (the RTL run: tests/kpu/test_top.py);
nanokpu.host.link's relocation, binds and errors."""

import numpy as np
import pytest

from golden import fidelity
from golden import layer as LY
from nanokpu.config import profile
from nanokpu.host.funcsim import FuncSim
from nanokpu.host.layer import compile_ffn_sublayer
from nanokpu.host.link import Part, link
from nanokpu.isa import Err, Instr, Op

LAYER = profile("tiny", layer_ops=True)
SCHEMES = {"tensor": LAYER, "after": fidelity.scheme(LAYER, fidelity.AFTER)}


def dense_case(cfg, tokens, n_blocks, seed):
    return LY.random_ffn_case(cfg, 0, tokens, n_blocks, np.random.default_rng(seed))


def run_funcsim(prog):
    sim = FuncSim(prog.cfg, prog.image)
    res = sim.run(prog.instrs)
    assert res.error == Err.NONE, res
    return prog.outputs(sim.host)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_ffn_sublayer_on_funcsim_is_the_golden_one(scheme):
    """Every candidate count (1, 2 finished blocks), 1 and 8 tokens, both weight-scale schemes."""
    cfg = SCHEMES[scheme]
    for tokens, n_blocks, seed in ((8, 1, 1), (1, 1, 2), (8, 2, 3)):
        Q, P, Bl = dense_case(cfg, tokens, n_blocks, seed)
        prog = compile_ffn_sublayer(P, Bl, Q, cfg)
        assert [i.op for i in prog.instrs].count(Op.MUL) == 1
        assert np.array_equal(run_funcsim(prog), LY.ffn_sublayer_int(P, Bl, Q, cfg)), (tokens, n_blocks)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_latent_moe_ffn_sublayer_on_funcsim_is_the_golden_one(scheme):
    """Layer 1 (LatentMoE): the block's program linked between the norm and the add, its expert loop's
    jumps moved; with the AFTER scheme's wide router x widened on chip (REQUANT by 2**8)."""
    cfg = SCHEMES[scheme]
    for tokens, n_blocks, seed in ((8, 1, 6), (3, 2, 7)):
        Q, P, Bl = LY.random_ffn_case(cfg, 1, tokens, n_blocks, np.random.default_rng(seed))
        prog = compile_ffn_sublayer(P, Bl, Q, cfg)
        ops = [i.op for i in prog.instrs]
        assert Op.EXPERT in ops and ops.count(Op.HALT) == 1 and ops[-1] == Op.HALT
        assert (Op.REQUANT in ops[:ops.index(Op.STORE)]) == cfg.wide_router
        assert np.array_equal(run_funcsim(prog), LY.ffn_sublayer_int(P, Bl, Q, cfg)), (tokens, n_blocks)


def test_link_relocates_targets_and_host_addresses_and_binds():
    a = Part("a", [Instr(Op.STORE, m=1, n=4, a=0, host=32, width=4), Instr(Op.HALT)], bytes(48), {"in": 0, "out": 32})
    b = Part("b", [Instr(Op.LOAD, m=1, n=4, c=0, host=16, width=4), Instr(Op.JUMP, target=2),
                   Instr(Op.LOAD, m=1, n=4, c=0, host=0, width=4), Instr(Op.HALT)], bytes(20), {"w": 0, "x": 16})
    out = link([a, b], {"b.x": "a.out"}, align=16)
    assert len(out.image) == 48 + 32 and out.symbols == {"a.in": 0, "a.out": 32, "b.w": 48, "b.x": 64}
    assert [(i.op, i.host, i.target) for i in out.instrs] == [
        (Op.STORE, 32, 0), (Op.LOAD, 32, 0), (Op.JUMP, 0, 3), (Op.LOAD, 48, 0), (Op.HALT, 0, 0)]
    with pytest.raises(ValueError, match="earlier part"):
        link([a, b], {"a.in": "b.x"})
    with pytest.raises(ValueError, match="unknown buffer"):
        link([a, b], {"b.y": "a.out"})
    with pytest.raises(ValueError, match="end in HALT"):
        link([Part("c", a.instrs[:1], bytes(4), {}), b])
    with pytest.raises(ValueError, match="distinct"):
        link([a, a])


def test_bad_arguments_are_refused():
    Q, P, Bl = dense_case(LAYER, 4, 1, 4)
    with pytest.raises(ValueError, match="layer_ops"):
        compile_ffn_sublayer(P, Bl, Q, profile("tiny"))
    with pytest.raises(ValueError, match="Bl: empty"):
        compile_ffn_sublayer(P, [], Q, LAYER)
    with pytest.raises(ValueError, match="P: shape"):
        compile_ffn_sublayer(P[:, :-1], [b[:, :-1] for b in Bl], Q, LAYER)
    with pytest.raises(ValueError, match="scratchpad words"):
        compile_ffn_sublayer(P, Bl, Q, LAYER.replace(dmem_depth=1024))
