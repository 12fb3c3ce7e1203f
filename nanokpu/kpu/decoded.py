"""The decoded instruction the controller hands to an executor: its layout and the widths of
the nano-KPU's address and size arithmetic."""

from __future__ import annotations

from typing import NamedTuple

from amaranth.lib import data
from amaranth.utils import ceil_log2

from nanokpu.config import KpuConfig
from nanokpu.isa import bus_bytes

__all__ = ["Widths", "widths", "decoded_layout"]


class Widths(NamedTuple):
    """Bit widths of the top level's arithmetic (see :func:`widths`)."""

    aw: int     #: scratchpad word addresses (the port's; address arithmetic is modulo 2**aw)
    sw: int     #: sizes, saturating: all ones stands for "2**sw - 1 or more"
    hw: int     #: host byte addresses (a window ends below 2**33 - 1, the saturated value)
    lbw: int    #: host bytes of a LOAD/STORE/GEMM (+ bus_bytes - 1), saturating like the sizes
    bw_log: int  #: log2 of bus_bytes


def widths(cfg: KpuConfig) -> Widths:
    """Sizes are wide enough that the saturated value lies beyond every size limit
    (``dmem_depth``, the GEMM engine's scratchpads, the beats of a GEMM that passed its shape
    checks); host byte counts hold ``k * bus_bytes`` and ``n * width`` unsaturated."""
    bw = bus_bytes(cfg)
    d = cfg.dmem_depth
    nbk_max = -(-cfg.spad_c_depth // cfg.cols) * (cfg.spad_b_depth // 2)
    sw = (max(d, cfg.spad_a_depth, cfg.spad_c_depth, nbk_max) + 1).bit_length()
    bw_log = bw.bit_length() - 1
    lbw = max((max(4 * d, nbk_max * bw) + bw).bit_length(), 16 + max(2, bw_log))
    return Widths(aw=ceil_log2(d), sw=sw, hw=33, lbw=lbw, bw_log=bw_log)


def decoded_layout(cfg: KpuConfig) -> data.StructLayout:
    """An instruction as the executors see it, once its checks passed: ``op``, ``width``, the
    scratchpad bases ``a``, ``b``, ``c`` (``aw`` bits), the shape ``m`` (the expert's token count
    with ``F_M_COUNT``), ``n``, ``k``, ``len`` = ``m * n`` and ``p2`` = ``k * n`` (``COMBINE``; ``sw``
    bits, exact), ``flags``, the requantiser's ``mult`` and ``shift``, and the current expert (after
    an ``EXPERT``): its number ``expert``, its ``count`` of tokens and ``offset`` in the ``ROUTE``
    lists."""
    w = widths(cfg)
    return data.StructLayout({"op": 6, "flags": 10, "width": 6, "a": w.aw, "b": w.aw, "c": w.aw,
                              "m": 16, "n": 16, "k": 16, "len": w.sw, "p2": w.sw, "mult": 32, "shift": 6,
                              "expert": 16, "count": 16, "offset": w.sw})
