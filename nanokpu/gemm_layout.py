"""Host side of :class:`nanokpu.units.gemm.GemmEngine`: its command word and the stream words of A, B, C.

The benches and the board client build a GEMM's words here, from NumPy matrices, by the layout
the engine's docstring gives (``R = rows``, ``C = cols``): A in row blocks (word ``mb*K + k``
holds ``A[mb*R + i, k]`` in lane ``i``), B in panels (word ``nb*K + k`` holds ``B[k, nb*C + j]``
in lane ``j``), results in the A layout (word ``mb*N + n`` holds ``C[mb*R + i, n]``). A lane is
``in_width`` (operands) or ``out_width`` (results) bits, lane 0 in the low bits.
"""

from __future__ import annotations

import enum

import numpy as np
from amaranth import unsigned
from amaranth.lib import data

from nanokpu.config import KpuConfig

__all__ = ["SHIFT_WIDTH", "GemmError", "dim_width", "command_layout",
           "pack", "unpack", "command_word", "a_words", "b_words", "c_matrix"]


#: Bits of the requantiser's right shift (0..63).
SHIFT_WIDTH = 6


class GemmError(enum.IntEnum):
    """Why a command was refused (``error_code``); nothing is read, written or streamed."""

    NONE = 0
    NO_PHASE = 1      #: none of load_a, compute, store is set
    ZERO_SHAPE = 2    #: M = 0, or K = 0 with load_a/compute, or N = 0 with compute/store
    K_TOO_LARGE = 3   #: compute with K > spad_b_depth / 2 (a B panel must fit one half)
    A_RANGE = 4       #: a_addr + ceil(M/rows) * K > spad_a_depth (load_a or compute)
    C_RANGE = 5       #: c_addr + ceil(M/rows) * N > spad_c_depth (compute or store)


def dim_width(cfg: KpuConfig) -> int:
    depth = max(cfg.spad_a_depth, cfg.spad_b_depth, cfg.spad_c_depth)
    return depth.bit_length() + max(cfg.rows, cfg.cols).bit_length()


def command_layout(cfg: KpuConfig) -> data.StructLayout:
    """The command word of :class:`GemmEngine` (fields in this order from bit 0).

    ``m, k, n``: the GEMM shape ``[M, K] @ [K, N]``, ``dim_width`` bits each (enough for
    any shape the scratchpads can hold, and for shapes they cannot, which are refused);
    ``a_addr``, ``c_addr``: first word of A and of the result in their scratchpads
    (``depth.bit_length()`` bits, so an address past the end is representable and refused);
    ``mult``, ``shift``: the requantiser's unsigned multiplier and right shift (0..63);
    ``load_a``, ``compute``, ``accumulate``, ``store``: the phases and the accumulate flag.
    """
    dim = dim_width(cfg)
    return data.StructLayout({
        "m": unsigned(dim), "k": unsigned(dim), "n": unsigned(dim),
        "a_addr": unsigned(cfg.spad_a_depth.bit_length()),
        "c_addr": unsigned(cfg.spad_c_depth.bit_length()),
        "mult": unsigned(cfg.mult_width), "shift": unsigned(SHIFT_WIDTH),
        "load_a": 1, "compute": 1, "accumulate": 1, "store": 1,
    })


def pack(values, width: int) -> int:
    """Lanes -> one integer, lane 0 in the low bits (Amaranth's ``ArrayLayout``)."""
    mask = (1 << width) - 1
    return sum((int(v) & mask) << (i * width) for i, v in enumerate(values))


def unpack(word: int, width: int, lanes: int) -> list[int]:
    """One integer -> ``lanes`` signed lanes of ``width`` bits (inverse of :func:`pack`)."""
    out = []
    for i in range(lanes):
        v = (word >> (i * width)) & ((1 << width) - 1)
        out.append(v - (1 << width) if v >> (width - 1) else v)
    return out


def command_word(cfg: KpuConfig, **fields) -> int:
    """The command of :func:`nanokpu.units.gemm.command_layout` with ``fields`` (names of the layout,
    0 when left out) as one integer; raises ``ValueError`` naming a field that does not fit."""
    layout = command_layout(cfg)
    unknown = set(fields) - {name for name, _ in layout}
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: not a field of the GEMM command")
    word = 0
    for name, field in layout:
        value = int(fields.get(name, 0))
        if not 0 <= value < 1 << field.width:
            raise ValueError(f"{name} = {value}: does not fit its {field.width} bits")
        word |= value << field.offset
    return word


def a_words(cfg: KpuConfig, a, pad_rng: np.random.Generator | None = None) -> list[int]:
    """Row blocks of the ``[M, K]`` operand A; lanes of rows ``>= M`` are 0, or random int8
    from ``pad_rng`` (the engine must ignore them)."""
    R = cfg.rows
    m, k = a.shape
    mb = -(-m // R)
    pad = np.zeros((mb * R, k), dtype=np.int64) if pad_rng is None else pad_rng.integers(-128, 128, (mb * R, k))
    pad[:m] = a
    return [pack(pad[b * R:(b + 1) * R, kk], cfg.in_width) for b in range(mb) for kk in range(k)]


def b_words(cfg: KpuConfig, b, pad_rng: np.random.Generator | None = None) -> list[int]:
    """Panels of the ``[K, N]`` operand B; lanes of columns ``>= N`` are 0, or random int8
    from ``pad_rng``."""
    C = cfg.cols
    k, n = b.shape
    nb = -(-n // C)
    pad = np.zeros((k, nb * C), dtype=np.int64) if pad_rng is None else pad_rng.integers(-128, 128, (k, nb * C))
    pad[:, :n] = b
    return [pack(pad[kk, p * C:(p + 1) * C], cfg.in_width) for p in range(nb) for kk in range(k)]


def c_matrix(cfg: KpuConfig, words, m: int, n: int, out_width: int) -> np.ndarray:
    """The ``[M, N]`` result from its ``ceil(M/R) * N`` stored words; raises ``ValueError`` when
    a lane of a row ``>= M`` is not 0 (the engine zeroes them)."""
    R = cfg.rows
    out = np.zeros((-(-m // R) * R, n), dtype=np.int64)
    for w, word in enumerate(words):
        b, col = divmod(w, n)
        out[b * R:(b + 1) * R, col] = unpack(word, out_width, R)
    if out[m:].any():
        raise ValueError(f"words: lanes of rows >= M = {m} are not 0")
    return out[:m]
