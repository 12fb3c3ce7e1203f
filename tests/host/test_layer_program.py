"""nanokpu.host.layer: the FFN half of a K3 layer (Attention Residuals, the weighted RMSNorm as NORM
and MUL, the dense SiTU-GLU FFN or the LatentMoE block, the residual add) and a whole KDA or MLA layer (the
mixer's half before it) lowered to one linked program, run on FuncSim, equal to
golden.layer.ffn_sublayer_int and layer_int (the RTL runs: tests/kpu/test_top.py);
nanokpu.host.link's relocation, binds and errors."""

import numpy as np
import pytest

from golden import fidelity
from golden import layer as LY
from golden.mla import MLACache
from nanokpu.config import profile
from nanokpu.host.funcsim import FuncSim
from nanokpu.host.kda import read_state
from nanokpu.host.layer import compile_ffn_sublayer, compile_layer, layer_config
from nanokpu.host.link import Part, link
from nanokpu.host.mla import read_cache
from nanokpu.isa import Err, Instr, Op

LAYER = profile("tiny", layer_ops=True)
SCHEMES = {"tensor": LAYER, "after": fidelity.scheme(LAYER, fidelity.AFTER)}
WHOLE = {name: layer_config(cfg) for name, cfg in SCHEMES.items()}


def dense_case(cfg, tokens, n_blocks, seed):
    return LY.random_ffn_case(cfg, 0, tokens, n_blocks, np.random.default_rng(seed))


def run_funcsim(prog, with_host=False):
    sim = FuncSim(prog.cfg, prog.image)
    res = sim.run(prog.instrs)
    assert res.error == Err.NONE, res
    return (prog.outputs(sim.host), sim.host) if with_host else prog.outputs(sim.host)


def layer_case(cfg, L, tokens, seed):
    return LY.random_layer_case(cfg, L, tokens, np.random.default_rng(seed))[:4]


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


@pytest.mark.parametrize("scheme", WHOLE)
def test_kda_layers_on_funcsim_are_the_golden_ones(scheme):
    """Layer 0 (dense FFN, no finished block: the mixer's norm on P alone, P starts Bl), 1 and 2
    (LatentMoE inside a block) and 4 (starts the second block: P joins Bl before the FFN half), from
    a random state: the layer's P and the state after it == golden layer_int's, both schemes."""
    cfg = WHOLE[scheme]
    sizes = {}
    for L, tokens in ((0, 4), (1, 8), (2, 1), (4, 3)):
        Q, P, Bl, state = layer_case(cfg, L, tokens, L + 10)
        P_next, _, after = LY.layer_int(L, P, Bl, Q, cfg, state)
        prog = compile_layer(L, P, Bl, Q, cfg, state)
        got, host = run_funcsim(prog, with_host=True)
        assert np.array_equal(got, P_next), (L, tokens)
        carried = read_state(prog, host, part="kda")
        assert np.array_equal(carried.S, after.S) and np.array_equal(carried.conv, after.conv), L
        assert [i.op for i in prog.instrs].count(Op.KDA_STEP) == 1 and prog.instrs[-1].op == Op.HALT
        sizes[L] = len(prog.instrs)
    # the README's figures: a LatentMoE layer of 8 tokens (the after scheme's wide router: SPLIT,
    # four digit GEMMs, REQUANT_WIDE, and the widening REQUANT)
    assert sizes[1] == {"tensor": 101, "after": 107}[scheme]


def test_small_kda_layers_on_funcsim_are_the_golden_ones():
    """small (d_model 256, 64 experts, top-4) layers 0 and 1 on 3 tokens from a random state, built
    as nanokpu sim --layer builds it: P and the state == layer_int's."""
    cfg = layer_config(profile("small"))
    for L in (0, 1):
        Q, P, Bl, state = layer_case(cfg, L, 3, 30 + L)
        P_next, _, after = LY.layer_int(L, P, Bl, Q, cfg, state)
        prog = compile_layer(L, P, Bl, Q, cfg, state)
        got, host = run_funcsim(prog, with_host=True)
        carried = read_state(prog, host, part="kda")
        assert np.array_equal(got, P_next) and np.array_equal(carried.S, after.S), L


def test_kda_layer_decode_steps_carry_the_state():
    """4 decode steps of layer 1, a token each, the state read back from host memory after each and
    compiled into the next: each P == layer_int's token by token, == one call of the 4 tokens."""
    cfg = WHOLE["tensor"]
    Q, P, Bl, _ = layer_case(cfg, 1, 4, 21)
    whole, _, _ = LY.layer_int(1, P, Bl, Q, cfg)
    state = None
    for t in range(4):
        prog = compile_layer(1, P[t:t + 1], [b[t:t + 1] for b in Bl], Q, cfg, state)
        got, host = run_funcsim(prog, with_host=True)
        assert np.array_equal(got, whole[t:t + 1]), t
        state = read_state(prog, host, part="kda")


@pytest.mark.parametrize("scheme", WHOLE)
def test_mla_layers_on_funcsim_are_the_golden_ones(scheme):
    """Layers 3 (MLA inside a block) and 7 (MLA, the last layer) on 8 and 3 tokens, then 3 decode
    steps of layer 3, the cache read back from host memory after each and compiled into the next:
    P and the cache == golden layer_int's (the decode steps == one call of the 11 tokens)."""
    cfg = WHOLE[scheme]
    sizes = {}
    for L, tokens in ((3, 8), (7, 3)):
        Q, P, Bl = layer_case(cfg, L, tokens, L + 40)[:3]
        P_next, _, after = LY.layer_int(L, P, Bl, Q, cfg)
        prog = compile_layer(L, P, Bl, Q, cfg)
        got, host = run_funcsim(prog, with_host=True)
        assert np.array_equal(got, P_next), (L, tokens)
        carried = read_cache(prog, host, part="mla")
        assert np.array_equal(carried.n_kv, after.n_kv) and np.array_equal(carried.k_r, after.k_r), L
        sizes[L] = len(prog.instrs)
    # the README's figure: an MLA + LatentMoE layer of 8 tokens
    assert sizes[3] == {"tensor": 100, "after": 106}[scheme]
    Q, P, Bl = layer_case(cfg, 3, 11, 50)[:3]
    whole, _, _ = LY.layer_int(3, P, Bl, Q, cfg)
    prog = compile_layer(3, P[:8], [b[:8] for b in Bl], Q, cfg)
    cache = read_cache(prog, run_funcsim(prog, with_host=True)[1], part="mla")
    for t in range(8, 11):
        prog = compile_layer(3, P[t:t + 1], [b[t:t + 1] for b in Bl], Q, cfg, cache)
        got, host = run_funcsim(prog, with_host=True)
        assert np.array_equal(got, whole[t:t + 1]), t
        cache = read_cache(prog, host, part="mla")
        assert len(cache.n_kv) == t + 1


def test_small_mla_layer_on_funcsim_is_the_golden_one():
    """small's layer 3 (MLA of 4 heads, kv_lora_rank 32) on 3 tokens, built as nanokpu sim --layer
    builds it: P == layer_int's."""
    cfg = layer_config(profile("small"))
    Q, P, Bl = layer_case(cfg, 3, 3, 33)[:3]
    assert np.array_equal(run_funcsim(compile_layer(3, P, Bl, Q, cfg)), LY.layer_int(3, P, Bl, Q, cfg)[0])


def test_bad_layers_are_refused():
    cfg = WHOLE["tensor"]
    Q, P, Bl, state = layer_case(cfg, 1, 8, 2)
    with pytest.raises(ValueError, match="^Q: layer 3 of profile 'tiny' needs QuantMLA, got QuantKDA"):
        compile_layer(3, P, Bl, Q, cfg)
    with pytest.raises(ValueError, match="^state: layer 1 of profile 'tiny' carries KDAState, got MLACache"):
        compile_layer(1, P, Bl, Q, cfg, MLACache(np.zeros((1, 8)), np.zeros((1, 4))))
    with pytest.raises(ValueError, match="^L = 8: must be in"):
        compile_layer(8, P, Bl, Q, cfg)
    with pytest.raises(ValueError, match="^Q: layer 0 of profile 'tiny' needs QuantExpert, got QuantLatentMoE"):
        compile_layer(0, P, [], Q, cfg)
    with pytest.raises(ValueError, match="^imem_depth = 64: the program needs 101 instructions"):
        compile_layer(1, P, Bl, Q, cfg.replace(imem_depth=64))
    with pytest.raises(ValueError, match="layer_ops"):
        compile_layer(1, P, Bl, Q, profile("tiny", imem_depth=128))


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
