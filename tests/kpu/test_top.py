"""The nano-KPU top level on Verilator through its AXI interfaces (sim/bench_top.py)."""

import json

import pytest

import nanokpu.kpu.dmem as dmem_module
from golden import fidelity
from nanokpu.commands.bench_block import gemm_tiles, overlap
from nanokpu.config import profile
from nanokpu.host.layer import layer_config
from nanokpu.units.memport import inverting_read_port
from sim.lib.kpu_launch import run_kpu_bench


def _bench(name, testcase, tag="", seed=1, overrides=None, **params):
    # fast (-O0): the C++ compile dominates on tiny; on small the optimised model runs 3.4x faster
    # but its compile takes ~270 CPU-seconds on 2 cores against ~60 at -O0: more CPU in all, and
    # the CI's two workers share the cores
    run_kpu_bench(profile(name, **(overrides or {})), "bench_top", testcase=testcase, seed=seed, params=params,
                  fast=True, tag=tag)


@pytest.mark.slow(50)
def test_tiny_blocks_10_seeds():
    """10 random blocks (1..8 tokens), RTL == latent_moe_int == FuncSim bit for bit."""
    _bench("tiny", "test_block", tokens=8, seed=1, seeds=10, vary_tokens=True)


@pytest.mark.parametrize("overrides", [{"weight_scales": "tensor"}, {"weight_scales": "channel"},
                                       {"weight_scales": "channel", "router_width": 16}],
                         ids=["tensor", "channel", "channel-router16"])
@pytest.mark.slow(85)
def test_tiny_blocks_one_write_port(monkeypatch, overrides):
    """The scratchpad as ECP5 builds it (one true-dual-port copy: a cycle that writes reads
    nothing, so reads wait for writes), with the generic multipliers (the ECP5 MULT18X18D has
    no simulation model): 4 random blocks under bus stalls, bit for bit; per tensor and per
    channel (every GEMM requantised by its per-column table, F_RQ_CHANNEL: the same design,
    another program), and per channel with the 16-bit router (SPLIT and REQUANT_WIDE waiting
    on the blocked reads)."""
    import nanokpu.kpu.spad as spad_module

    for module in (dmem_module, spad_module):
        monkeypatch.setattr(module, "writes_block_reads", lambda cfg: True)
    tag = "_one_write_port" + ("_router16" if "router_width" in overrides else "")
    _bench("tiny", "test_block", tag=tag, tokens=8, seed=30, seeds=4, vary_tokens=True, pause=0.3, overrides=overrides)


@pytest.mark.slow(75)
def test_tiny_blocks_wide_router():
    """router_width = 16 alone (the router GEMM as byte-sliced passes: SPLIT, two raw digit GEMMs,
    REQUANT_WIDE with the instruction's constants): random blocks under bus stalls, bit for bit."""
    _bench("tiny", "test_block", tag="_router16", tokens=8, seed=50, seeds=4, vary_tokens=True, pause=0.3,
           overrides={"router_width": 16})


#: Issue 26's AFTER scheme with the K3 layer's ops built too: one build for both tests below.
AFTER_LAYER = {**fidelity.AFTER, "layer_ops": True}


@pytest.mark.slow(85)
def test_tiny_blocks_after_scheme():
    """Issue 26's AFTER scheme, all of it: per-channel scales (REQUANT_WIDE per column too), the
    16-bit router GEMM, router logits in Q20.16 (requantised to 20 bits, the sigmoid's 512-segment
    table over them), 16-bit scores, 20-bit bias; 4 random blocks under bus stalls, RTL ==
    latent_moe_int == FuncSim bit for bit."""
    _bench("tiny", "test_block", tag="_after_layer", tokens=8, seed=50, seeds=4, vary_tokens=True, pause=0.3,
           overrides=AFTER_LAYER)


def test_attn_res_on_the_whole_kpu():
    """Attention Residuals lowered to NORM, GEMM, SOFTMAX and COMBINE on the whole nano-KPU, every
    candidate count, bus stalls: h == golden attn_res_int, host memory == FuncSim's
    (sim/bench_top.py test_attn_res)."""
    _bench("tiny", "test_attn_res", tag="_after_layer", seed=5, pause=0.2, overrides=AFTER_LAYER)


def test_ffn_sublayer_on_the_whole_kpu():
    """The FFN half of a K3 layer (Attention Residuals, NORM and MUL by the RMSNorm weight, the dense
    SiTU-GLU FFN or the LatentMoE block with the wide router, per-channel scales, the residual ADD)
    on the whole nano-KPU under bus stalls: y == golden ffn_sublayer_int, host memory == FuncSim's
    (sim/bench_top.py test_ffn_sublayer)."""
    _bench("tiny", "test_ffn_sublayer", tag="_after_layer", seed=7, pause=0.2, overrides=AFTER_LAYER)


def test_kda_decode_steps_on_the_whole_kpu():
    """KDA_STEP as 4 decode steps in a row on the whole nano-KPU under bus stalls, the state carried
    in the scratchpad: the state and read-outs == golden kda_head_step_int token after token, host
    memory == FuncSim's (sim/bench_top.py test_kda_decode_steps)."""
    _bench("tiny", "test_kda_decode_steps", tag="_after_layer", seed=5, pause=0.2, overrides=AFTER_LAYER)


def test_kda_mixer_decode_steps_on_the_whole_kpu():
    """The KDA mixer (nanokpu.host.kda) as 4 decode steps in a row on the whole nano-KPU under bus
    stalls, the state carried in host memory: each y == golden kda_int's, host memory == FuncSim's,
    the state after them golden's (sim/bench_top.py test_kda_mixer)."""
    _bench("tiny", "test_kda_mixer", tag="_after_layer", seed=6, pause=0.2, overrides=AFTER_LAYER)


def test_attention_scores_on_the_whole_kpu():
    """GEMMs with B from the scratchpad (F_B_SPAD): q K^T of 2 heads, requantised and raw, then p V
    (F_B_T: V as it lies) on the whole nano-KPU under bus stalls: == golden matmul_int (and
    requantize), host memory == FuncSim's (sim/bench_top.py test_attention_scores)."""
    _bench("tiny", "test_attention_scores", tag="_after_layer", seed=4, pause=0.2, overrides=AFTER_LAYER)


def test_layer_ops_on_the_whole_kpu():
    """SILU and DECAY on the whole nano-KPU (layer_ops), through the AXI buses under stalls,
    extremes and random inputs, in place too, then NORM with its epsilon word (F_EPS) and the
    l2norm (F_L2, with and without it), then CONV and REQUANT (KDA's short convolution): host memory ==
    FuncSim's (sim/bench_top.py test_layer_ops)."""
    _bench("tiny", "test_layer_ops", tag="_after_layer", seed=3, pause=0.2, overrides=AFTER_LAYER)


@pytest.mark.slow(55)
def test_reads_of_a_row_being_written_are_never_used(monkeypatch):
    """The data scratchpad's reads of the row it is writing are undefined (generic: no collision
    logic, ``nanokpu.units.memport.unchecked_read_port``): with the bits of such a read inverted, random
    blocks under bus stalls stay bit for bit."""
    monkeypatch.setattr(dmem_module, "unchecked_read_port", inverting_read_port)
    _bench("tiny", "test_block", tag="_inverting", tokens=8, seed=40, seeds=4, vary_tokens=True, pause=0.3)


def test_requant_every_length():
    _bench("tiny", "test_requant_lengths", seed=7)


def test_bad_programs_stop_with_codes():
    _bench("tiny", "test_bad_programs", seed=3)


def test_prefetch_is_invisible():
    _bench("tiny", "test_prefetch_is_invisible", seed=8)


def test_bus_errors_stop_with_bus_error():
    _bench("tiny", "test_bus_errors", seed=6)


def test_soft_reset_mid_run():
    _bench("tiny", "test_soft_reset_mid_run", seed=4)


@pytest.mark.slow(65)
def test_tiny_blocks_heavy_stalls():
    _bench("tiny", "test_block", tokens=16, seed=100, seeds=2, pause=0.5)


@pytest.mark.slow(60)
def test_layers_on_the_whole_kpu():
    """Whole K3 layers on tiny built with layer_ops (nanokpu.host.layer.layer_config, the build
    ``nanokpu sim --layer`` and the main job use): the dense layer 0, the KDA + LatentMoE layer 1 and
    the MLA + LatentMoE layer 3, each on 4 tokens from the zero state then 4 decode steps with the
    KDA state or the MLA cache read back from host memory between calls, under bus stalls: every
    call's P == golden layer_int's, the host memory FuncSim's, the state after the last call
    golden's (sim/bench_top.py test_layers)."""
    run_kpu_bench(layer_config(profile("tiny")), "bench_top", testcase="test_layers", seed=3, tag="_layer",
                  params={"layers": "0,1,3", "tokens": 4, "steps": 4, "pause": 0.2})


@pytest.mark.slow(300)
def test_small_layers_on_the_whole_kpu():
    """small (8x8 array, 64 experts, top-4, 4 heads) built with layer_ops: the dense layer 0, the KDA +
    LatentMoE layer 1 and the MLA + LatentMoE layer 3, each on a token then a decode step carrying the
    KDA state or the MLA cache, under bus stalls: every call's P == golden layer_int's, the host memory
    FuncSim's (sim/bench_top.py test_layers). Layers 1 and 3 run small's LatentMoE block on one row of
    an 8-row tile (16 tokens, two full tiles: nanokpu bench-block)."""
    run_kpu_bench(layer_config(profile("small")), "bench_top", testcase="test_layers", seed=4, tag="_layer",
                  params={"layers": "0,1,3", "tokens": 1, "steps": 1, "pause": 0.1})


@pytest.mark.slow(130)
def test_small_block_after_scheme():
    """Issue 26's after scheme on small (1 token: one row of an 8-row tile; 8x8 array, 48-bit
    router accumulator, bus stalls): RTL == latent_moe_int == FuncSim bit for bit (16 tokens:
    nanokpu bench-block)."""
    _bench("small", "test_block", tag="_after", tokens=1, seed=6, seeds=1, pause=0.1, overrides=fidelity.AFTER)


def test_layer_cycles_are_exact(tmp_path):
    """The block benchmark's whole-layer rows (docs/bench/block.md, the README; seed 1, no bus
    stalls): layers 0, 1 and 3 on the layer build of tiny, 8 tokens then 4 decode steps, each call's
    cycles and program size exact."""
    summary = tmp_path / "summary.json"
    run_kpu_bench(layer_config(profile("tiny")), "bench_top", testcase="test_layers", seed=1, tag="_layer",
                  params={"layers": "0,1,3", "tokens": 8, "steps": 4, "pause": 0.0, "summary": str(summary)})
    rows = json.loads(summary.read_text())
    assert [r["cycles"] for r in rows] == [26850, 6570, 6570, 6570, 6570, 34456, 8015, 8013, 8015, 8015,
                                           26549, 7375, 7424, 7479, 7531]   # MLA: each step's cache a key longer
    assert [r["static"] for r in rows] == [75, 68, 68, 68, 68, 101, 94, 94, 94, 94, 100, 95, 95, 95, 95]


def test_block_cycles_are_exact(tmp_path):
    """The block benchmark's cycle count of tiny (docs/bench/block.md, seed 1, no bus stalls),
    exact: a change that costs or saves a cycle anywhere in a block shows here. The per-instruction
    BUSY trace (the bench checks its sums against the counters) replayed on the queue model
    (docs/bench/block.md's decoupled-execution table): exact too."""
    summary = tmp_path / "summary.json"
    _bench("tiny", "test_block", seed=1, tokens=8, seeds=1, pause=0.0, summary=str(summary), trace=1)
    got = json.loads(summary.read_text())[0]
    assert got["cycles"] == 8424
    model = overlap(gemm_tiles(profile("tiny"), 8, 1)["trace"], got["busy_trace"])
    assert {name: s.cycles for name, s in model.items()} == {"queues": 7319, "queues, reordered, renamed": 6541}


def test_wide_router_block_cycles_are_exact(tmp_path):
    """The same block (seed 1, 8 tokens, no bus stalls) with router_width = 16: 10,536 cycles, 2,112
    more than at int8: the two digit GEMMs of 16 rows (GEMM busy 5,049), REQUANT of x_r, SPLIT
    (two a cycle) and REQUANT_WIDE (16 a logit) among the element-wise executor's 2,498."""
    summary = tmp_path / "summary.json"
    _bench("tiny", "test_block", tag="_router16", seed=1, tokens=8, seeds=1, pause=0.0, summary=str(summary),
           overrides={"router_width": 16, "weight_scales": "tensor"})
    got = json.loads(summary.read_text())[0]
    assert (got["cycles"], got["gemm"], got["act"]) == (10536, 5049, 2498)
