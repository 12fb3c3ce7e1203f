"""Signed multipliers mapped by hand onto the FPGA DSP blocks (generic ``a * b`` for simulation).

Yosys infers DSPs from ``a * b`` but leaves two things on the table: on iCE40 it maps
SB_MAC16 in 16x16 mode only (one int8 product per block, where the dual 8x8 mode gives two),
and on ECP5 it never packs the MULT18X18D input/output registers into the block (the
registers stay in the fabric and the multiplier's 4 ns sit between two routed nets).
:class:`Multiplier` instantiates the blocks itself.
"""

from __future__ import annotations

from amaranth import Cat, ClockSignal, Const, Instance, Module, ResetSignal, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from nanokpu.config import DSP_TARGETS

__all__ = ["DSP_TARGETS", "Multiplier"]

#: Widest operand of each mapping.
_MAX_WIDTH = {"generic": 18, "ice40": 8, "ecp5": 18}


class Multiplier(wiring.Component):
    """``lanes`` independent signed products ``p[i] = a[i] * b[i]``, ``latency`` cycles late.

    Parameters
    ----------
    width : int
        Operand width (signed), 2..8 on ``ice40``, 2..18 otherwise. Products are
        ``2 * width`` bits and exact.
    lanes : int
        Independent products. On ``ice40`` lanes ``2k`` and ``2k+1`` share one SB_MAC16
        (bottom and top 8x8 multipliers), so ``ceil(lanes / 2)`` blocks; on ``ecp5`` one
        MULT18X18D per lane.
    latency : int
        1 or 2 register stages, all inside the DSP blocks:

        ======== ================================== ======================================
        latency  ``ice40`` (SB_MAC16)               ``ecp5`` (MULT18X18D)
        ======== ================================== ======================================
        1        8x8 product registers              output register
        2        A/B input + 8x8 product registers  input A/B + output registers
        ======== ================================== ======================================

        ``generic`` puts the same stages in the fabric (the product register after
        ``a * b``; latency 2 adds input registers).
    target : str
        One of :data:`DSP_TARGETS`. ``ice40`` and ``ecp5`` instantiate vendor primitives
        (Yosys' simulation model of SB_MAC16 exists; MULT18X18D is a black box): simulate
        with ``generic``.

    Members
    -------
    a, b : In(signed(width)).array(lanes)
        Operands.
    en : In(1, init=1)
        Clock enable of every stage (the DSP ``CE``); the pipeline holds while low.
    p : Out(signed(2 * width)).array(lanes)
        Products: ``p[i]`` in cycle ``t`` is ``a[i] * b[i]`` of the ``latency``-th enabled
        cycle before ``t``; every stage resets to 0 with the domain reset.
    """

    def __init__(self, width: int, lanes: int = 1, *, latency: int = 1, target: str = "generic"):
        if target not in DSP_TARGETS:
            raise ValueError(f"target = {target!r}: must be one of {DSP_TARGETS}")
        if not isinstance(width, int) or not 2 <= width <= _MAX_WIDTH[target]:
            raise ValueError(f"width = {width!r}: must be an integer in [2, {_MAX_WIDTH[target]}] "
                             f"for target {target!r}")
        if not isinstance(lanes, int) or lanes < 1:
            raise ValueError(f"lanes = {lanes!r}: must be a positive integer")
        if latency not in (1, 2):
            raise ValueError(f"latency = {latency!r}: must be 1 or 2")
        self.width, self.lanes, self.latency, self.target = width, lanes, latency, target
        super().__init__({
            "a": In(signed(width)).array(lanes), "b": In(signed(width)).array(lanes),
            "en": In(1, init=1), "p": Out(signed(2 * width)).array(lanes),
        })

    @property
    def blocks(self) -> int:
        """DSP blocks used (0 for ``generic``: Yosys decides)."""
        return {"generic": 0, "ice40": (self.lanes + 1) // 2, "ecp5": self.lanes}[self.target]

    def elaborate(self, platform):
        m = Module()
        {"generic": self._generic, "ice40": self._ice40, "ecp5": self._ecp5}[self.target](m)
        return m

    def _generic(self, m):
        for i in range(self.lanes):
            a, b = self.a[i], self.b[i]
            if self.latency == 2:
                a, b = Signal.like(self.a[i], name=f"a{i}_r"), Signal.like(self.b[i], name=f"b{i}_r")
                with m.If(self.en):
                    m.d.sync += [a.eq(self.a[i]), b.eq(self.b[i])]
            with m.If(self.en):
                m.d.sync += self.p[i].eq(a * b)

    def _ice40(self, m):
        rst = ResetSignal(allow_reset_less=True)  # board domains may have no reset
        for k in range((self.lanes + 1) // 2):
            pair = tuple(range(2 * k, min(2 * k + 2, self.lanes)))
            # The bottom 8x8 multiplier takes bits 7:0 of A and B, the top one bits 15:8.
            a = Cat(*(_sext(self.a[i], 8) for i in pair))
            b = Cat(*(_sext(self.b[i], 8) for i in pair))
            out = Signal(32, name=f"mac{k}_o")
            in_reg = Const(self.latency == 2, 1)
            m.submodules[f"mac{k}"] = Instance(
                "SB_MAC16",
                p_NEG_TRIGGER=Const(0, 1), p_C_REG=Const(0, 1), p_A_REG=in_reg, p_B_REG=in_reg,
                p_D_REG=Const(0, 1), p_TOP_8x8_MULT_REG=Const(1, 1), p_BOT_8x8_MULT_REG=Const(1, 1),
                p_PIPELINE_16x16_MULT_REG1=Const(0, 1), p_PIPELINE_16x16_MULT_REG2=Const(0, 1),
                p_TOPOUTPUT_SELECT=Const(2, 2), p_TOPADDSUB_LOWERINPUT=Const(0, 2),
                p_TOPADDSUB_UPPERINPUT=Const(0, 1), p_TOPADDSUB_CARRYSELECT=Const(0, 2),
                p_BOTOUTPUT_SELECT=Const(2, 2), p_BOTADDSUB_LOWERINPUT=Const(0, 2),
                p_BOTADDSUB_UPPERINPUT=Const(0, 1), p_BOTADDSUB_CARRYSELECT=Const(0, 2),
                p_MODE_8x8=Const(1, 1), p_A_SIGNED=Const(1, 1), p_B_SIGNED=Const(1, 1),
                i_CLK=ClockSignal(), i_CE=self.en, i_A=_sext(a, 16), i_B=_sext(b, 16),
                i_C=Const(0, 16), i_D=Const(0, 16), i_AHOLD=0, i_BHOLD=0, i_CHOLD=0, i_DHOLD=0,
                i_IRSTTOP=rst, i_IRSTBOT=rst, i_ORSTTOP=0, i_ORSTBOT=0,
                i_OLOADTOP=0, i_OLOADBOT=0, i_ADDSUBTOP=0, i_ADDSUBBOT=0, i_OHOLDTOP=0, i_OHOLDBOT=0,
                i_CI=0, i_ACCUMCI=0, i_SIGNEXTIN=0,
                o_O=out,
            )
            for half, i in enumerate(pair):
                m.d.comb += self.p[i].eq(out[16 * half:16 * half + 2 * self.width].as_signed())

    def _ecp5(self, m):
        rst = ResetSignal(allow_reset_less=True)
        # a tuple, not a set: the parameter order, hence the netlist and its cache key, is fixed
        regs = ("OUTPUT",) + (("INPUTB", "INPUTA") if self.latency == 2 else ())
        params = {f"p_REG_{r}_{sig}": val for r in regs
                  for sig, val in (("CLK", "CLK0"), ("CE", "CE0"), ("RST", "RST0"))}
        for i in range(self.lanes):
            a, b, prod = _sext(self.a[i], 18), _sext(self.b[i], 18), Signal(36, name=f"mult{i}_p")
            bits = {f"i_A{n}": a[n] for n in range(18)} | {f"i_B{n}": b[n] for n in range(18)}
            bits |= {f"i_C{n}": 0 for n in range(18)} | {f"o_P{n}": prod[n] for n in range(36)}
            m.submodules[f"mult{i}"] = Instance(
                "MULT18X18D",
                p_GSR="DISABLED", p_RESETMODE="SYNC", p_SOURCEB_MODE="B_SHIFT",
                p_MULT_BYPASS="DISABLED", p_CAS_MATCH_REG="FALSE", **params,
                i_SIGNEDA=1, i_SIGNEDB=1, i_SOURCEA=0, i_SOURCEB=0,
                i_CLK0=ClockSignal(), i_CE0=self.en, i_RST0=rst,
                **{f"i_{sig}{n}": 0 for sig in ("CLK", "CE", "RST") for n in (1, 2, 3)},
                **bits,
            )
            m.d.comb += self.p[i].eq(prod[:2 * self.width].as_signed())


def _sext(value, width: int):
    """``value`` (signed) sign-extended to ``width`` bits, as a plain bit vector."""
    v = value.as_value() if hasattr(value, "as_value") else value
    return Cat(v, *([v[-1]] * (width - len(v))))
