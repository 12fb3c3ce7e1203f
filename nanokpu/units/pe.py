"""One processing element of the output-stationary systolic array."""

from __future__ import annotations

from amaranth import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig

__all__ = ["ProcessingElement"]


class ProcessingElement(wiring.Component):
    """An output-stationary multiply-accumulate cell: ``acc += a * b`` over one tile's K.

    Operands flow through: ``a`` (with the ``valid``/``first``/``last`` tags of its K step)
    enters on the left and leaves registered on the right; ``b`` enters on top and leaves
    registered below. The product comes in registered on ``prod`` from a multiplier outside
    the PE (the PE's lane of the array's :class:`~nanokpu.units.dsp.Multiplier`, a DSP block with
    its output register on an FPGA). On a ``valid`` step tagged ``first`` the accumulator restarts
    from the product; on ``last`` the finished sum is copied into ``res``, which belongs to
    a left-going shift chain (``res <- res_in`` while ``shift``) used to drain the tile
    while the next one accumulates.

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``in_width`` (signed operands) and ``acc_width`` (wrapping accumulator).

    Members
    -------
    a_in, b_in : In(signed(in_width))
        Operands of this K step.
    valid_in, first_in, last_in : In(1)
        Tags of the K step travelling with ``a``.
    prod : In(signed(2 * in_width))
        ``a_in * b_in`` of the previous cycle (a multiplier of latency 1).
    a_out, b_out, valid_out, first_out, last_out : Out
        The inputs, registered (1 cycle), for the right (``a``, tags) and lower (``b``)
        neighbours.
    res : Out(signed(acc_width))
        The result register. Written 2 cycles after a ``last`` step enters (the sum
        includes that step); otherwise shifts in ``res_in`` when ``shift`` is high.
    res_in : In(signed(acc_width))
        The right neighbour's ``res`` (0 at the right edge).
    shift : In(1)
        Drain enable: ``res <- res_in``. Never asserted in the cycle ``res`` is written.
    done : Out(1)
        High for one cycle, the first cycle ``res`` holds a finished tile (2 cycles after
        the ``last`` step entered).

    Latency: 1 cycle for the operand pass-through, 2 cycles from a ``last`` step at the
    inputs to its sum in ``res``; the accumulator wraps at ``acc_width`` bits
    (:func:`golden.intops.matmul_int`).
    """

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        op, acc = signed(cfg.in_width), signed(cfg.acc_width)
        super().__init__({
            "a_in": In(op), "b_in": In(op), "prod": In(signed(2 * cfg.in_width)),
            "valid_in": In(1), "first_in": In(1), "last_in": In(1),
            "a_out": Out(op), "b_out": Out(op),
            "valid_out": Out(1), "first_out": Out(1), "last_out": Out(1),
            "res": Out(acc), "res_in": In(acc), "shift": In(1), "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.d.sync += [
            self.a_out.eq(self.a_in), self.b_out.eq(self.b_in),
            self.valid_out.eq(self.valid_in), self.first_out.eq(self.first_in),
            self.last_out.eq(self.last_in),
        ]
        # Stage 1: the tags of the product registered outside (``prod``).
        p_valid = Signal()
        p_last = Signal()
        m.d.sync += [p_valid.eq(self.valid_in), p_last.eq(self.last_in)]
        # Stage 2: accumulate (wrapping), hand the finished sum to the drain chain. A step
        # tagged ``first`` clears the accumulator as it enters (its product arrives one cycle
        # later and adds to 0), so the adder takes ``acc`` as is: the clear is the
        # flip-flops' synchronous reset, not a multiplexer in front of the adder.
        acc = Signal(signed(cfg.acc_width))
        total = Signal(signed(cfg.acc_width))
        m.d.comb += total.eq(acc + self.prod)
        with m.If(self.valid_in & self.first_in):
            m.d.sync += acc.eq(0)
        with m.Elif(p_valid):
            m.d.sync += acc.eq(total)
        with m.If(p_valid & p_last):
            m.d.sync += self.res.eq(total)
        with m.Elif(self.shift):
            m.d.sync += self.res.eq(self.res_in)
        m.d.sync += self.done.eq(p_valid & p_last)
        return m
