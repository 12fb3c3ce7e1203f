"""The nano-KPU's executors: one component per kind of work, each with the same handshake
(:func:`executor_signature`): the controller raises ``start`` for one cycle with the decoded
instruction on ``ins`` (held until ``done``); the executor raises ``done`` for one cycle when the
instruction has finished, with ``error`` (an :class:`~nanokpu.isa.Err`, 0 for none) valid in that
cycle. Between ``done`` and the next ``start`` it drives nothing: its scratchpad port's enables,
its stream handshakes and its strobes are low.
"""

from __future__ import annotations

from amaranth import Cat, Mux, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.gemm_layout import SHIFT_WIDTH
from nanokpu.isa import bus_bytes
from nanokpu.kpu.decoded import decoded_layout
from nanokpu.kpu.spad import spad_client_signature

__all__ = ["executor_signature", "dma_client_signature", "requantiser_signature", "saturate_to_width",
           "lanes_now"]


def executor_signature(cfg: KpuConfig) -> wiring.Signature:
    """``start``, ``ins`` in; ``done``, ``error`` and the scratchpad client port ``spad`` out."""
    return wiring.Signature({"start": In(1), "ins": In(decoded_layout(cfg)), "done": Out(1), "error": Out(8),
                             "spad": Out(spad_client_signature(cfg))})


def dma_client_signature(cfg: KpuConfig) -> wiring.Signature:
    """An executor's side of the AXI4 master (:class:`~nanokpu.kpu.axi_master.AxiMaster`), whose
    addresses and beat counts come from the decode: start a burst read or write, take the read
    beats, give the write beats (data and byte strobes)."""
    bits = 8 * bus_bytes(cfg)
    wr_layout = data.StructLayout({"data": bits, "strb": bits // 8})
    return wiring.Signature({
        "rd_start": Out(1), "rd_data": In(stream.Signature(bits)), "rd_busy": In(1),
        "wr_start": Out(1), "wr_data": Out(stream.Signature(wr_layout)), "wr_busy": In(1),
        "error": In(1),
    })


def requantiser_signature(cfg: KpuConfig) -> wiring.Signature:
    """The GEMM engine's requantiser as ``REQUANT`` borrows it: ``rows`` accumulators a word in,
    the requantised word out (:class:`~nanokpu.units.gemm.GemmEngine`'s ``rq_in``, ``c_out``,
    ``rq_mult``, ``rq_shift``), directions seen from the borrower."""
    word = data.ArrayLayout(signed(cfg.acc_width), cfg.rows)
    return wiring.Signature({"mult": Out(unsigned(cfg.mult_width)), "shift": Out(unsigned(SHIFT_WIDTH)),
                             "i": Out(stream.Signature(word)), "o": In(stream.Signature(word))})


def saturate_to_width(value, width, acc_width: int):
    """Signed ``value`` (``acc_width`` bits) saturated to ``width`` bits, ``width`` a signal in
    ``[2, acc_width]``: the bound ``2**(width-1) - 1`` built bit by bit (no shifter)."""
    hi = Cat(*[width > i + 1 for i in range(acc_width - 1)], 0).as_signed()
    return Mux(value > hi, hi, Mux(value < ~hi, ~hi, value))


def lanes_now(to_end, left, lanes: int):
    """The lanes of a wide scratchpad access: ``min(lanes, to_end, left)`` (``to_end``: lanes to
    the end of the word or beat being filled or emptied, ``left``: elements left to move)."""
    return Mux((to_end < lanes) & (to_end < left), to_end, Mux(left < lanes, left, lanes))
