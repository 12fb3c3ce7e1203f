"""nanokpu.host.attn_res: Attention Residuals lowered to NORM, GEMM, SOFTMAX and COMBINE, run on
FuncSim, equal to golden.attn_res.attn_res_int (the RTL run: tests/kpu/test_top.py)."""

import numpy as np
import pytest

from golden import attn_res as A
from nanokpu.config import profile
from nanokpu.host.attn_res import compile_attn_res
from nanokpu.host.funcsim import FuncSim
from nanokpu.isa import Err


def _inputs(cfg, n_cand, tokens, rng):
    lo, hi = -(1 << (cfg.act_width - 1)), (1 << (cfg.act_width - 1)) - 1
    V = rng.integers(lo, hi + 1, (n_cand, tokens, cfg.d_model)) >> rng.integers(0, 12, (n_cand, 1, 1))
    V[0, 0] = lo                   # a row at the format's ends (its RMS saturates nothing: one value)
    V[-1, 1, ::2] = hi
    q = 2.0 * rng.standard_normal(cfg.d_model) / np.sqrt(cfg.d_model)
    return V[-1], list(V[:-1]), A.quantize_attn_res(q, cfg)


def _run(P, Bl, Q, cfg):
    prog = compile_attn_res(P, Bl, Q, cfg)
    sim = FuncSim(cfg, prog.image)
    assert sim.run(prog.instrs).error == Err.NONE
    return prog.outputs(sim.host)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_attn_res_on_funcsim_is_the_golden_one(name):
    """Every candidate count up to attnres_candidates, random candidates of varied scale."""
    cfg = profile(name, layer_ops=True)
    rng = np.random.default_rng(7)
    for n_cand in range(1, cfg.attnres_candidates + 1):
        P, Bl, Q = _inputs(cfg, n_cand, 8, rng)
        assert np.array_equal(_run(P, Bl, Q, cfg), A.attn_res_int(P, Bl, Q, cfg)), (name, n_cand)


def test_equal_candidates_and_one_candidate():
    """Equal candidates (the softmax's ties, every weight the same rounded third) and a single
    candidate (h = P exactly), both ends of the act format in the rows."""
    cfg = profile("tiny", layer_ops=True)
    P, _, Q = _inputs(cfg, 1, 6, np.random.default_rng(2))
    assert np.array_equal(_run(P, [], Q, cfg), P)
    assert np.array_equal(_run(P, [P, P], Q, cfg), A.attn_res_int(P, [P, P], Q, cfg))


def test_bad_inputs_name_the_argument():
    cfg = profile("tiny", layer_ops=True)
    P, Bl, Q = _inputs(cfg, 2, 4, np.random.default_rng(3))
    with pytest.raises(ValueError, match="layer_ops"):
        compile_attn_res(P, Bl, Q, profile("tiny"))
    with pytest.raises(ValueError, match="Bl: 4 candidates"):
        compile_attn_res(P, Bl * 3, Q, cfg)
    with pytest.raises(ValueError, match="P: shape"):
        compile_attn_res(P[:, :4], [b[:, :4] for b in Bl], Q, cfg)
    with pytest.raises(ValueError, match="act format"):
        compile_attn_res(P + (1 << 15), Bl, Q, cfg)
    with pytest.raises(ValueError, match="GEMM engine"):
        compile_attn_res(np.zeros((200, cfg.d_model), dtype=np.int64), [], Q, cfg)
