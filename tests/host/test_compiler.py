"""The block compiler: program structure, memory images and its ValueErrors."""

import numpy as np
import pytest

from golden import k3
from golden.block import quantize_latent_moe
from nanokpu.config import profile
from nanokpu.host.compiler import compile_block
from nanokpu.isa import Op, weight_panels


def _block(cfg, T, seed=0):
    rng = np.random.default_rng(seed)
    P = k3.init_latent_moe(cfg, rng)
    return quantize_latent_moe(P, rng.standard_normal((T, cfg.d_model)), cfg)


def test_program_shape_tiny():
    cfg = profile("tiny")
    Q, xq = _block(cfg, 8)
    prog = compile_block(Q, xq, cfg)
    ops = [Op(i.op) for i in prog.instrs]
    assert ops[-1] == Op.HALT and ops.count(Op.ROUTE) == 1 and ops.count(Op.EXPERT) == 1
    assert ops.index(Op.SIGMOID) < ops.index(Op.ROUTE) < ops.index(Op.EXPERT) < ops.index(Op.COMBINE)
    assert len(prog.image) % 4 == 0 and all(v % 4 == 0 for v in prog.symbols.values())
    assert prog.spad["end"] <= cfg.dmem_depth
    # the input batch and the first expert's gate weights sit where the symbols say
    x = np.frombuffer(bytes(prog.image[:xq.size]), dtype=np.int8).reshape(xq.shape)
    assert np.array_equal(x, xq)
    off = prog.symbols["e0_W_gate"]
    W = Q.experts[0].W_gate
    panels = weight_panels(W, cfg)
    w = np.frombuffer(bytes(prog.image[off:off + panels.size]), dtype=np.int8).reshape(panels.shape)
    assert np.array_equal(w, panels)
    # panel nb, word kk, lane j holds W[nb*cols + j, kk]
    assert w[1, 3, 2] == W[cfg.cols + 2, 3]
    assert prog.symbols["e1_W_gate"] - prog.symbols["e0_W_gate"] == prog.symbols["expert_stride"]


def test_too_many_tokens_for_dmem():
    cfg = profile("tiny", dmem_depth=1024)
    Q, xq = _block(cfg, 8)
    with pytest.raises(ValueError, match="dmem_depth"):
        compile_block(Q, xq, cfg)


@pytest.mark.parametrize("field, overrides", [
    ("spad_c_depth", {"spad_c_depth": 128}), ("spad_a_depth", {"spad_a_depth": 128})])
def test_too_many_tokens_for_the_gemm_engine(field, overrides):
    cfg = profile("tiny", **overrides)
    with pytest.raises(ValueError, match=f"{field} = .*T=17 tokens"):
        compile_block(*_block(cfg, 17), cfg)
    compile_block(*_block(cfg, 16), cfg)     # 16 tokens fit


def test_program_too_long_for_imem():
    cfg = profile("tiny", imem_depth=16)
    Q, xq = _block(cfg, 4)
    with pytest.raises(ValueError, match="imem_depth"):
        compile_block(Q, xq, cfg)


def test_bad_batch_shape():
    cfg = profile("tiny")
    Q, xq = _block(cfg, 4)
    with pytest.raises(ValueError, match="x_q"):
        compile_block(Q, xq[:, :-1], cfg)
