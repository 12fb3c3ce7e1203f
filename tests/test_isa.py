"""The instruction encoding: the compiler's packing equals the RTL's StructLayout view."""

import numpy as np
import pytest

from nanokpu.isa import FIELDS, INSTR_BITS, INSTR_LAYOUT, Instr, Op, encode_program


def _random_instr(rng):
    return Instr(**{name: int(rng.integers(0, 1 << width)) for name, width in FIELDS})


def test_layout_is_256_bits_and_matches_fields():
    assert INSTR_BITS == 256 == INSTR_LAYOUT.size
    assert list(INSTR_LAYOUT.members) == [name for name, _ in FIELDS]


@pytest.mark.parametrize("seed", range(5))
def test_encode_equals_amaranth_layout_const(seed):
    rng = np.random.default_rng(seed)
    for _ in range(20):
        ins = _random_instr(rng)
        const = INSTR_LAYOUT.const({name: getattr(ins, name) for name, _ in FIELDS})
        assert const.as_value().value == ins.encode(), f"seed {seed}: {ins}"
        assert Instr.decode(ins.encode()) == ins


def test_words_little_endian():
    ins = Instr(Op.GEMM, m=3, k=5, n=7, a=1, b=2, c=3)
    words = ins.words()
    assert len(words) == 8
    assert sum(w << (32 * i) for i, w in enumerate(words)) == ins.encode()
    assert encode_program([ins, ins]) == b"".join(w.to_bytes(4, "little") for w in words * 2)


@pytest.mark.parametrize("field,value", [("op", 64), ("m", -1), ("a", 1 << 24), ("target", 4096)])
def test_out_of_range_field_names_it(field, value):
    with pytest.raises(ValueError, match=f"Instr.{field}"):
        Instr(**{"op": 0, field: value})


def test_register_layouts():
    """CTRL and STATUS bit positions are the host interface (firmware, nanokpu.h): pinned here."""
    from nanokpu.isa import CTRL_LAYOUT, STATUS_LAYOUT, Err, ctrl_word, status_fields

    assert (ctrl_word(start=1), ctrl_word(soft_reset=1), ctrl_word(clear_loads=1)) == (1, 2, 4)
    assert ctrl_word(soft_reset=1, clear_loads=1) == 6 and CTRL_LAYOUT.size == 3
    s = status_fields(0x0123_0000 | Err.OVERLAP << 8 | 0b110)
    assert (s.busy, s.done, s.error, s.code, s.pc) == (0, 1, 1, Err.OVERLAP, 0x123)
    assert STATUS_LAYOUT.size == 32 and STATUS_LAYOUT["code"].offset == 8 and STATUS_LAYOUT["pc"].offset == 16


def test_op_rules_cover_every_op_and_derive_the_views():
    """OP_RULES is the one table of per-op rules; OP_EXECUTOR and IN_PLACE_OPS are views of it."""
    from nanokpu.isa import EXECUTORS, IN_PLACE_OPS, OP_EXECUTOR, OP_RULES, SIZES

    assert set(OP_RULES) == set(Op)
    assert set(OP_EXECUTOR.values()) == set(EXECUTORS)
    assert OP_EXECUTOR == {op: r.executor for op, r in OP_RULES.items() if r.executor}
    assert set(IN_PLACE_OPS) == {Op.REQUANT, Op.SIGMOID, Op.SITU, Op.ADD, Op.NORM, Op.SILU, Op.DECAY, Op.SOFTMAX,
                                Op.MUL}
    named = {getattr(r, f) for r in OP_RULES.values() for f in ("a", "b", "c", "host")} - {None}
    assert named == set(SIZES), "a size nobody names, or a name without a size"
    for r in OP_RULES.values():
        assert set(r.positive) <= set("mnk")
        assert not (r.in_place and not r.c), "in place without a result region"
        assert not (r.engine and not r.host)


def test_sizes_are_the_semantics():
    from nanokpu.config import profile
    from nanokpu.isa import (
        F_B_SPAD,
        F_EPS,
        F_M_COUNT,
        F_RQ_CHANNEL,
        F_RQ_EXPERT,
        SIZES,
        SizeArgs,
        bus_bytes,
        route_table,
    )

    cfg = profile("tiny")
    E, K = cfg.n_experts, cfg.top_k
    s = SizeArgs.of(Instr(Op.COMBINE, m=3, k=2, n=5, width=4), cfg, count=7, offset=11)
    assert {name: f(s) for name, f in SIZES.items()} == {
        "m*n": 15, "m*k": 6, "m*k*n": 30, "n": 5, "2*n": 10, "count*n": 35, "list": 18, "rq": 0,
        "gemm_b": 0, "eps": 0, "k*n": 10, "(m-k+1)*n": 10, "(k+m)*n": 25, "n*k*k": 20, "m*n*(4k+1)": 135, "m*n*k": 30,
        "2*m*n": 30, "4*m*n": 60, "route": route_table(0, 3, cfg)["end"],
        "m*n*width": 60, "panels": -(-5 // cfg.cols) * 2 * bus_bytes(cfg)}
    assert SIZES["route"](s) == 4 * 3 * K + 2 * E
    flagged = SizeArgs.of(Instr(Op.GEMM, flags=F_M_COUNT | F_RQ_EXPERT, m=3, n=5), cfg, count=7)
    assert (flagged.m, SIZES["rq"](flagged)) == (7, 2 * E)
    # per column: 2 words a column, and with F_RQ_EXPERT a column's entries of every expert
    for flags, words in ((F_RQ_CHANNEL, 2 * 5), (F_RQ_CHANNEL | F_RQ_EXPERT, 2 * 5 * E)):
        s = SizeArgs.of(Instr(Op.GEMM, flags=flags, m=3, n=5), cfg)
        assert SIZES["rq"](s) == words
        assert SIZES["gemm_b"](s) == words
    # B from the scratchpad: its n*k words at b, no host bytes
    s = SizeArgs.of(Instr(Op.GEMM, flags=F_B_SPAD, m=3, k=4, n=5), cfg)
    assert (SIZES["gemm_b"](s), SIZES["panels"](s)) == (20, 0)
    # NORM's epsilon word
    assert SIZES["eps"](SizeArgs.of(Instr(Op.NORM, flags=F_EPS, m=3, n=5), cfg)) == 1
    # CONV: k taps over m rows give m - k + 1 result rows (none when k > m: BAD_SHAPE first)
    assert [SIZES["(m-k+1)*n"](SizeArgs.of(Instr(Op.CONV, m=m, k=4, n=5), cfg)) for m in (3, 4, 9)] == [0, 5, 30]


def test_op_rule_widths():
    from nanokpu.config import profile
    from nanokpu.isa import OP_RULES

    cfg = profile("tiny")
    allowed = {op: [w for w in range(64) if r.width_ok(w, cfg)] for op, r in OP_RULES.items()}
    rq = list(range(2, cfg.acc_width + 1))
    assert allowed[Op.LOAD] == [1, 2, 4] and allowed[Op.STORE] == [4]
    assert allowed[Op.REQUANT] == rq and allowed[Op.GEMM] == [0, *rq] and allowed[Op.REQUANT_WIDE] == rq
    assert allowed[Op.ADD] == list(range(64))     # width not read
