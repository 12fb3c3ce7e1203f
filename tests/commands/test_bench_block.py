"""bench-block's utilization decomposition (pure Python; the RTL runs are in `nanokpu bench-block`)."""

import numpy as np

from golden.block import random_block
from nanokpu.commands.bench_block import (
    CASES,
    SCHEMES,
    decomposition,
    gemm_tiles,
    label,
    layer_table,
    roofline,
    roofline_table,
    whole_layer_table,
)
from nanokpu.commands.simulate import format_layers, format_summary
from nanokpu.config import profile
from nanokpu.host.compiler import compile_block
from nanokpu.host.funcsim import FuncSim
from nanokpu.host.layer import layer_config


def test_gemm_tiles_bound_the_macs():
    cfg = profile("tiny")
    g = gemm_tiles(cfg, 5, 3)
    Q, xq, _, _ = random_block(cfg, 5, np.random.default_rng(3))
    prog = compile_block(Q, xq, cfg)
    res = FuncSim(cfg, prog.image).run(prog.instrs)
    assert g["gemms"] == res.op_counts["GEMM"]
    assert g["tile_cycles"] * cfg.rows * cfg.cols >= res.macs > 0
    assert np.isclose(g["rows_used"], res.macs / (g["tile_cycles"] * cfg.rows * cfg.cols))


def test_decomposition_multiplies_out():
    cfg = profile("tiny")
    r = {"cycles": 1000, "gemm": 400, "tile_cycles": 200, "macs": 2400, "rows_used": 2400 / (200 * 16),
         "instructions": 10, "dma": 100, "act": 50, "route": 50, "vector": 300, "move": 50, "label": "tiny"}
    line = decomposition([(cfg, r)])
    assert "15.0% = 40.0% (GEMM busy) x 50.0% (tile steps) x 75.0% (rows used)" in line
    assert "the controller 5.0% of the cycles, 5.0 per instruction" in line


def test_cases_name_their_schemes():
    """Every case's scheme is a KpuConfig over its profile; the default scheme adds no words."""
    assert {label(name, scheme) for name, _, scheme in CASES} >= {"tiny", "tiny after", "small"}
    for name, _, scheme in CASES:
        cfg = profile(name, **SCHEMES[scheme])
        assert (cfg.router_operand_width == 16) == (scheme == "after")


def test_summary_of_a_failed_run_says_no():
    assert format_summary(profile("tiny"), {"bit_exact": False, "failure": "y differs"}).startswith(
        "bit-exact: NO")


def test_roofline_is_the_busiest_executor():
    """act and vector are one executor (they cannot overlap): their cycles add up."""
    cfg = profile("tiny")
    r = {"cycles": 1000, "macs": 3200, "dma": 100, "gemm": 250, "act": 150, "route": 50, "vector": 200,
         "move": 50, "label": "tiny"}
    assert roofline(cfg, r) == ("element-wise", 350)
    row = roofline_table([(cfg, r)]).splitlines()[-1]
    assert row.startswith("| tiny | 1000 | 350 | element-wise | 57.1% | 35.0% |")


def test_layer_rows_name_the_ffn_and_divide_by_the_array():
    """Layer 0's FFN is dense, layer 1's LatentMoE; utilization = MACs / (rows * cols) / cycles."""
    r = {"layer": 1, "candidates": 2, "tokens": 8, "instructions": 40, "cycles": 2000, "macs": 16000,
         "dma": 100, "gemm": 1000, "act": 300, "route": 50, "vector": 200, "move": 50}
    lines = layer_table([r | {"layer": 0}, r]).splitlines()
    assert lines[2].startswith("| FFN half of layer 0 | dense | 8 | 2 | 40 | 2000 | 16000 | 1000 | 50.0% | ")
    assert lines[3].startswith("| FFN half of layer 1 | LatentMoE |") and lines[3].endswith("| 2.5% |")


def test_whole_layer_rows_split_the_first_call_from_the_decode_steps_mean():
    """A layer's first call, then the mean of its decode steps; utilization over the array."""
    first = {"layer": 1, "tokens": 8, "static": 101, "instructions": 200, "cycles": 4000, "macs": 32000,
             "dma": 400, "gemm": 1000, "act": 300, "route": 50, "vector": 200, "move": 50}
    steps = [first | {"tokens": 1, "cycles": c, "macs": 16000, "instructions": 150, "static": 94} for c in (1000, 3000)]
    lines = whole_layer_table([first, *steps, first | {"layer": 3}]).splitlines()
    assert lines[4].startswith("| 3 (MLA) | LatentMoE | first | 8 |") and len(lines) == 5
    assert lines[2].startswith("| 1 (KDA) | LatentMoE | first | 8 | 101 | 200 | 4,000 | 32000 | 2000 | 50.0% | 10.0% |")
    assert lines[3].startswith("| 1 (KDA) | LatentMoE | decode step (mean of 2) | 1 | 94 | 150 | 2,000 | 16000 | "
                               "1000 | 50.0% | 20.0% |")


def test_layer_summary_names_the_kinds_and_the_decode_steps():
    """nanokpu sim --layer's summary: the layer's mixer and FFN, the first call, the decode steps'
    cycles (one figure when they agree), the float error; NO and the failure when not bit-exact."""
    cfg = layer_config(profile("tiny"))
    err = {"cosine": 0.99, "max_abs": 1.5, "rms_rel": 0.1}
    rows = [{"layer": 0, "tokens": 4, "cycles": 2000, "static": 70, "macs": 16000},
            *({"layer": 0, "tokens": 1, "cycles": c, "static": 66, "macs": 4000} for c in (700, 700)),
            {"layer": 1, "tokens": 4, "cycles": 4000, "static": 97, "macs": 16000},
            *({"layer": 1, "tokens": 1, "cycles": c, "static": 94, "macs": 4000} for c in (900, 902)),
            {"layer": 3, "tokens": 4, "cycles": 5000, "static": 100, "macs": 16000, "error": err}]
    rows[2]["error"] = rows[5]["error"] = err
    lines = format_layers({"bit_exact": True, "cfg": cfg, "seconds": 3.0, "rows": rows}).splitlines()
    assert lines[0] == ("layer 0 (KDA mixer, dense FFN), profile tiny with layer_ops: 4 tokens in 2,000 cycles "
                        "(70 instructions, utilization 50.0%), then 2 decode steps of 700 cycles each")
    assert lines[3].endswith("then 2 decode steps of 900-902 cycles each") and "LatentMoE FFN" in lines[3]
    assert lines[2] == "  error vs the float layer: cosine 0.99000, max abs 1.5000, rms relative 0.1000"
    assert lines[1].endswith("(each call; the KDA state carried in host memory)")
    assert lines[6].startswith("layer 3 (MLA mixer, LatentMoE FFN), profile tiny with layer_ops: 4 tokens in 5,000")
    assert lines[7].endswith("(each call; MLA's latent KV cache carried in host memory)")
    assert format_layers({"bit_exact": False, "failure": "P differs"}) == "bit-exact: NO\nP differs"
