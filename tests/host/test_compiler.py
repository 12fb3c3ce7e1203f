"""The block compiler: program structure, memory images and its ValueErrors."""

import dataclasses

import numpy as np
import pytest

from golden import k3
from golden.block import quantize_latent_moe
from nanokpu.config import profile
from nanokpu.host.compiler import check_tokens, compile_block, max_tokens
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
    with pytest.raises(ValueError, match=f"tokens = 17: .* {field} = 128 \\(at most 16 tokens"):
        compile_block(*_block(cfg, 17), cfg)
    compile_block(*_block(cfg, 16), cfg)     # 16 tokens fit
    assert max_tokens(cfg) == 16


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_max_tokens_is_the_largest_block_that_compiles(name):
    """check_tokens, from sizes alone, agrees with compiling real blocks at the limit."""
    cfg = profile(name)
    t = max_tokens(cfg)
    assert t >= 16
    compile_block(*_block(cfg, t), cfg)
    with pytest.raises(ValueError, match=f"tokens = {t + 1}: the block needs .* dmem_depth"):
        compile_block(*_block(cfg, t + 1), cfg)


def test_check_tokens_refuses_without_making_weights():
    with pytest.raises(ValueError, match="tokens = 1: the block needs 140,224 scratchpad words.*at most 0 tokens"):
        check_tokens(profile("k3"), 1)
    with pytest.raises(ValueError, match="tokens = 0: must be a positive integer"):
        check_tokens(profile("tiny"), 0)


def test_program_too_long_for_imem():
    cfg = profile("tiny", imem_depth=16)
    Q, xq = _block(cfg, 4)
    with pytest.raises(ValueError, match="imem_depth"):
        compile_block(Q, xq, cfg)


def test_bad_batch_shape():
    cfg = profile("tiny")
    Q, xq = _block(cfg, 4)
    with pytest.raises(ValueError, match="x_r"):
        compile_block(Q, xq[:, :-1], cfg)


def test_wide_router_operands_within_router_qmax():
    """With router_width = 16 the block input and W_r are two int8 digits each: values beyond
    golden.block.router_qmax = 127 * 256 are refused, naming the tensor; the router's digit
    GEMMs take M = 2T."""
    cfg = profile("tiny", router_width=16)
    Q, x_r = _block(cfg, 4)
    prog = compile_block(Q, x_r, cfg)
    assert [(i.m, i.k, i.n, i.width) for i in prog.instrs if i.op == Op.GEMM][:2] == [(8, 32, 8, 0)] * 2
    assert [Op(i.op).name for i in prog.instrs[:3]] == ["LOAD", "REQUANT", "SPLIT"]
    with pytest.raises(ValueError, match=r"x_r: values must be within \+-32512"):
        compile_block(Q, np.where(x_r == x_r.max(), 32513, x_r), cfg)
    with pytest.raises(ValueError, match=r"Q.W_r: values must be within \+-32512"):
        compile_block(dataclasses.replace(Q, W_r=Q.W_r * 2), x_r, cfg)
