"""nanokpu.host.layer: the FFN half of a dense K3 layer (Attention Residuals, the weighted RMSNorm as
NORM and MUL, the SiTU-GLU FFN, the residual add) lowered to one program, run on FuncSim, equal to
golden.layer.ffn_sublayer_int (the RTL run: tests/kpu/test_top.py)."""

import numpy as np
import pytest

from golden import fidelity, k3
from golden import layer as LY
from nanokpu.config import profile
from nanokpu.host.funcsim import FuncSim
from nanokpu.host.layer import compile_ffn_sublayer
from nanokpu.isa import Err, Op

LAYER = profile("tiny", layer_ops=True)
SCHEMES = {"tensor": LAYER, "after": fidelity.scheme(LAYER, fidelity.AFTER)}


def dense_case(cfg, tokens, n_blocks, seed):
    return LY.random_dense_ffn_case(cfg, tokens, n_blocks, np.random.default_rng(seed))


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


def test_bad_arguments_are_refused():
    Q, P, Bl = dense_case(LAYER, 4, 1, 4)
    with pytest.raises(ValueError, match="layer_ops"):
        compile_ffn_sublayer(P, Bl, Q, profile("tiny"))
    with pytest.raises(ValueError, match="Bl: empty"):
        compile_ffn_sublayer(P, [], Q, LAYER)
    with pytest.raises(ValueError, match="Q.ffn: QuantLatentMoE"):
        rng = np.random.default_rng(5)
        Qm, _, _ = LY.quantize_layer(1, k3.init_layer(1, LAYER, rng), rng.standard_normal((4, LAYER.d_model)),
                                     [rng.standard_normal((4, LAYER.d_model))], LAYER)
        compile_ffn_sublayer(P, Bl, Qm, LAYER)
    with pytest.raises(ValueError, match="P: shape"):
        compile_ffn_sublayer(P[:, :-1], [b[:, :-1] for b in Bl], Q, LAYER)
    with pytest.raises(ValueError, match="scratchpad words"):
        compile_ffn_sublayer(P, Bl, Q, LAYER.replace(dmem_depth=1024))
