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
