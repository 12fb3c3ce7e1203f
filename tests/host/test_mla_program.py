"""nanokpu.host.mla: MLA (golden mla_int) as one program on FuncSim, its latent KV cache carried in
host memory from call to call; the argument errors (the RTL runs: tests/kpu/test_top.py)."""

import numpy as np
import pytest

from golden import fidelity, k3
from golden import mla as M
from nanokpu.config import profile
from nanokpu.host.funcsim import FuncSim
from nanokpu.host.mla import compile_mla, read_cache
from nanokpu.isa import Err, Op

LAYER = profile("tiny", layer_ops=True, imem_depth=128)
SCHEMES = {"tensor": LAYER, "channel": LAYER.replace(weight_scales="channel"),
           "after": fidelity.scheme(LAYER, fidelity.AFTER)}


def _case(cfg, tokens, seed):
    rng = np.random.default_rng(seed)
    return M.quantize_mla(k3.init_mla(cfg, rng), rng.standard_normal((tokens, cfg.d_model)), cfg)


def _run(prog):
    sim = FuncSim(prog.cfg, prog.image)
    res = sim.run(prog.instrs)
    assert res.error == Err.NONE, res
    return prog.outputs(sim.host), read_cache(prog, sim.host)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_mla_on_funcsim_is_the_golden_one(scheme):
    """A prefill of 4 tokens, then 3 decode steps of a token, each compiled with the cache the last
    left in host memory: each y and cache == mla_int's with its cache carried; the per-head
    program of 2 heads is 39 instructions without a cache, 41 with one (the README's figure)."""
    cfg = SCHEMES[scheme]
    Q, x_q = _case(cfg, 7, 3)
    cache = want_cache = None
    sizes = []
    for lo, hi in ((0, 4), (4, 5), (5, 6), (6, 7)):
        prog = compile_mla(x_q[lo:hi], Q, cfg, cache)
        y, cache = _run(prog)
        want, want_cache = M.mla_int(x_q[lo:hi], Q, cfg, want_cache)
        assert np.array_equal(y, want), (scheme, lo)
        assert np.array_equal(cache.n_kv, want_cache.n_kv) and np.array_equal(cache.k_r, want_cache.k_r)
        assert [i.op for i in prog.instrs].count(Op.ATTEND) == cfg.n_heads
        sizes.append(len(prog.instrs))
    assert sizes == [39, 41, 41, 41]


def test_mla_refuses_what_does_not_fit():
    Q, x_q = _case(LAYER, 2, 4)
    with pytest.raises(ValueError, match="layer_ops"):
        compile_mla(x_q, Q, profile("tiny"))
    with pytest.raises(ValueError, match=r"^x_q: \[T, 5\], must be \[T, d_model = 32\]"):
        compile_mla(x_q[:, :5], Q, LAYER)
    bad = M.MLACache(np.zeros((3, LAYER.kv_lora_rank)), np.zeros((2, LAYER.qk_rope_dim)))
    with pytest.raises(ValueError, match="^cache: n_kv"):
        compile_mla(x_q, Q, LAYER, bad)
    long = M.MLACache(np.zeros((4094, LAYER.kv_lora_rank)), np.zeros((4094, LAYER.qk_rope_dim)))
    with pytest.raises(ValueError, match="^cache: 4094 tokens \\+ 2 new exceed mla_max_tokens = 4095"):
        compile_mla(x_q, Q, LAYER, long)
    with pytest.raises(ValueError, match="^acc_width = 22: the score's q . k of 128 terms could wrap"):
        compile_mla(x_q, Q, LAYER.replace(acc_width=22, qk_nope_dim=124))     # 128 * 2**14 = 2**21
    with pytest.raises(ValueError, match="^imem_depth = 32: MLA needs 39 instructions"):
        compile_mla(x_q, Q, LAYER.replace(imem_depth=32))
    with pytest.raises(ValueError, match="^x_q: 12 tokens after 0 cached need 2,488 scratchpad words, dmem_depth"):
        compile_mla(np.zeros((12, 32), np.int64), Q, LAYER.replace(dmem_depth=1024))
    with pytest.raises(ValueError, match=r"^x_q: 40 tokens after 0 cached: the W_qa GEMM \(40 x 32 x 16\) needs 320"):
        compile_mla(np.zeros((40, 32), np.int64), Q, LAYER)
