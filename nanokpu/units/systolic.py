"""The R x C output-stationary systolic array with skewed feed and a shift-chain drain."""

from __future__ import annotations

from amaranth import Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.units.dsp import Multiplier
from nanokpu.units.pe import ProcessingElement

__all__ = ["SystolicArray", "broadcast_operands", "done_latency", "min_tile_cycles"]


def broadcast_operands(cfg: KpuConfig) -> bool:
    """Whether the array broadcasts each step to all PEs at once instead of skewing it
    (``dsp = "ice40"``: the UP5K's 4x4 array has no logic cells to spare for the skew and
    pass-through registers, and a fan-out of ``rows`` or ``cols`` is cheap at its clock)."""
    return cfg.dsp == "ice40"


def done_latency(cfg: KpuConfig) -> int:
    """Cycles from a ``last`` step at the array's inputs to its ``done`` pulse: ``rows + cols``
    (skewed), or 2 (broadcast, :func:`broadcast_operands`)."""
    return 2 if broadcast_operands(cfg) else cfg.rows + cfg.cols


def min_tile_cycles(cfg: KpuConfig) -> int:
    """Minimum cycles between the ``last`` steps of two consecutive tiles (the drain rule):
    ``done_latency + cols - 1``."""
    return done_latency(cfg) + cfg.cols - 1


class SystolicArray(wiring.Component):
    """A ``rows x cols`` grid of :class:`~nanokpu.units.pe.ProcessingElement`, output-stationary.

    Dataflow: output-stationary. PE ``(i, j)`` owns the result ``C[i, j]`` of one tile and
    accumulates ``A[i, k] * B[k, j]`` over the whole reduction ``K`` without moving partial
    sums. K3's GEMMs are reductions over long axes (``d = 7168``, ``l = 3584``, expert width
    3072) with few tokens per call, so a tile stays in the array for ``K >> rows + cols``
    cycles: the partial sums never leave the PEs (no int32 read-modify-write traffic per K
    step, unlike weight-stationary, whose utilisation also depends on the number of
    tokens streamed per preloaded weight tile), and the ``cols``-cycle drain of one tile
    hides under the next tile's ``K`` cycles.

    Feed: one unskewed K step per cycle, ``a`` = column ``k`` of the A tile (``rows``
    operands), ``b`` = row ``k`` of the B tile (``cols`` operands), with ``valid``,
    ``first`` (k = 0) and ``last`` (k = K-1) tags. The array skews them internally (row
    ``i`` and column ``j`` are delayed by ``i`` and ``j`` registers), or, with
    :func:`broadcast_operands` (``dsp = "ice40"``), feeds the step to every PE in the same
    cycle (no skew or pass-through registers; the PEs' operand outputs are left unused). Steps may have
    bubbles (``valid`` low) anywhere; tiles may follow each other back to back as long as
    the drain rule below holds.

    Drain: every PE copies its sum into a result register on ``last``; the result
    registers of a row form a left-going shift chain. ``done`` rises when the whole tile
    sits in the result registers; ``out`` is then column 0 of the tile, and each cycle with
    ``shift`` high moves the next column in, so ``cols`` cycles of ``shift`` read the tile
    column by column with no read-out multiplexer.

    Multipliers: one :class:`~nanokpu.units.dsp.Multiplier` of ``rows * cols`` lanes (latency 1,
    ``target = cfg.dsp``), lane ``i * cols + j`` feeding PE ``(i, j)``: on ``ice40`` lanes
    ``2q`` and ``2q + 1`` (neighbours in a row when ``cols`` is even) share one SB_MAC16,
    ``ceil(rows * cols / 2)`` blocks; on ``ecp5`` each PE has a MULT18X18D with its output
    register.

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``rows``, ``cols``, ``in_width``, ``acc_width``, ``dsp``.

    Members
    -------
    a : In(ArrayLayout(signed(in_width), rows))
    b : In(ArrayLayout(signed(in_width), cols))
    valid, first, last : In(1)
    shift : In(1)
        Drain the result registers by one column.
    out : Out(ArrayLayout(signed(acc_width), rows))
        Column 0 of the result registers.
    done : Out(1)
        One-cycle pulse, :attr:`done_latency` cycles after a ``last`` step entered.

    Timing: with the ``last`` step of a tile at the inputs in cycle ``t``, ``done`` is high
    in cycle ``t + L`` (``L`` = :attr:`done_latency`: ``rows + cols``, or 2 when broadcast)
    and ``out`` shows column ``s`` in cycle ``t + L + s`` if ``shift`` is held high from
    ``done`` on. The result registers must not be written while draining: the ``last``
    step of the next tile may enter no earlier than ``t + L + cols - 1``
    (:attr:`min_tile_cycles` after ``t``; ``rows + 2*cols - 1`` skewed).
    """

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        op = signed(cfg.in_width)
        super().__init__({
            "a": In(data.ArrayLayout(op, cfg.rows)),
            "b": In(data.ArrayLayout(op, cfg.cols)),
            "valid": In(1), "first": In(1), "last": In(1),
            "shift": In(1),
            "out": Out(data.ArrayLayout(signed(cfg.acc_width), cfg.rows)),
            "done": Out(1),
        })

    @property
    def done_latency(self) -> int:
        """Cycles from a ``last`` step at the inputs to ``done``."""
        return done_latency(self.cfg)

    @property
    def min_tile_cycles(self) -> int:
        """Minimum cycles between the ``last`` steps of two consecutive tiles."""
        return min_tile_cycles(self.cfg)

    def elaborate(self, platform):
        m = Module()
        rows, cols = self.cfg.rows, self.cfg.cols
        broadcast = broadcast_operands(self.cfg)

        def delayed(sig, n, name):
            for stage in range(n):
                reg = Signal.like(sig, name=f"{name}_d{stage}")
                m.d.sync += reg.eq(sig)
                sig = reg
            return sig

        pes = [[ProcessingElement(self.cfg) for _ in range(cols)] for _ in range(rows)]
        m.submodules.mul = mul = Multiplier(self.cfg.in_width, rows * cols, target=self.cfg.dsp)
        for i in range(rows):
            for j in range(cols):
                pe = pes[i][j]
                m.submodules[f"pe_{i}_{j}"] = pe
                lane = i * cols + j
                m.d.comb += [mul.a[lane].eq(pe.a_in), mul.b[lane].eq(pe.b_in), pe.prod.eq(mul.p[lane])]
                if j > 0:
                    m.d.comb += pes[i][j - 1].res_in.eq(pe.res)
                if broadcast:  # the step reaches every PE in the same cycle
                    m.d.comb += [pe.a_in.eq(self.a[i]), pe.b_in.eq(self.b[j]), pe.valid_in.eq(self.valid),
                                 pe.first_in.eq(self.first), pe.last_in.eq(self.last)]
                elif j == 0:
                    m.d.comb += [
                        pe.a_in.eq(delayed(self.a[i], i, f"a{i}")),
                        pe.valid_in.eq(delayed(self.valid, i, f"valid{i}")),
                        pe.first_in.eq(delayed(self.first, i, f"first{i}")),
                        pe.last_in.eq(delayed(self.last, i, f"last{i}")),
                    ]
                else:
                    left = pes[i][j - 1]
                    m.d.comb += [pe.a_in.eq(left.a_out), pe.valid_in.eq(left.valid_out),
                                 pe.first_in.eq(left.first_out), pe.last_in.eq(left.last_out)]
                if not broadcast:
                    m.d.comb += pe.b_in.eq(delayed(self.b[j], j, f"b{j}") if i == 0 else pes[i - 1][j].b_out)
                m.d.comb += pe.shift.eq(self.shift)
            m.d.comb += self.out[i].eq(pes[i][0].res)
        m.d.comb += self.done.eq(pes[rows - 1][cols - 1].done)
        return m
