"""``nanokpu mutate``: mutation testing of the rounding sites, comparators and address generators.

Each :class:`Mutant` is one small textual change to a gateware unit (``nanokpu/units/``) or to
the golden model (``golden/intops.py``, ``golden/block.py``) and the behavioural tests that
must fail on it (its killers: Amaranth-simulator, Verilator and golden tests; never the
stale-RTL text check of ``tests/commands/test_generate.py``, which a regenerated ``rtl/``
silences). A mutant runs in a copy of the tree (``nanokpu``, ``golden``, ``sim``, ``fpga``,
``tests``, ``pyproject.toml``) in a temporary folder::

    python -m pytest -q -x -p no:cacheprovider -n 0 <killers>

with ``PYTHONPATH`` set to the copy and ``NANOKPU_SIM_BUILD`` set to this tree's ``sim_build``
(Verilator builds are keyed by a hash of the Verilog, so a mutant gets its own). Exit status
1 (a test failed) kills the mutant; 0 means it survived; anything else (a collection error,
a node id that does not exist) is an error of the mutant list, never a kill. An equivalent
mutant (no input can tell it apart) carries the reason instead of killers and is not run.

Writes ``docs/mutation.md``: every mutant, the test that killed it or why it is equivalent,
and the score over the non-equivalent mutants. ``tests/test_mutants.py`` runs every mutant
and requires it killed, so a weakened test fails the suite.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from nanokpu.commands import DOCS, ROOT
from nanokpu.commands.args import out_file

__all__ = ["Mutant", "MUTANTS", "Result", "mutated", "apply", "run_mutant", "render", "add_arguments", "run"]

DOC = DOCS / "mutation.md"

#: What a mutant's copy of the tree holds.
TREE = ("nanokpu", "golden", "sim", "fpga", "tests", "pyproject.toml")

#: Seconds a mutant's killers may run before the mutant counts as an error (a hang).
TIMEOUT = 900


@dataclass(frozen=True)
class Mutant:
    """One mutation: ``find`` (occurring exactly once in ``file``) replaced by ``replace``.

    ``killers`` are pytest node ids (relative to the repository root) of which at least one
    must fail; an equivalent mutant has none and says why in ``equivalent``.
    """

    id: str
    file: str
    find: str
    replace: str
    killers: tuple[str, ...] = ()
    equivalent: str = ""
    what: str = ""

    def __post_init__(self):
        if bool(self.killers) == bool(self.equivalent):
            raise ValueError(f"mutant {self.id}: give killers or an equivalence reason, not both or neither")


_REQ = "tests/units/test_requant.py::test_requant_matches_golden"
_VEC = "tests/units/test_vector.py"
_RTR = "tests/units/test_router.py::test_router_amaranth"
_SMX = "tests/units/test_softmax.py::test_softmax_matches_golden_with_idle_and_backpressure"
_PWL = "tests/units/test_pwl.py"
_GEMM = "tests/units/test_gemm.py::test_reads_of_a_row_written_in_the_same_cycle_are_never_used"
_INT = "tests/golden/test_intops.py"
_KDA = "tests/units/test_kda_state.py"

MUTANTS: tuple[Mutant, ...] = (
    # -- the requantiser ---------------------------------------------------------------
    Mutant("requant-half-even-tie", "nanokpu/units/requant.py",
           "inc = half & (sticky | q[0])", "inc = half & (sticky | ~q[0])",
           (f"{_REQ}[8-half_even-generic]",), what="half_even: ties to odd"),
    Mutant("requant-half-even-sticky", "nanokpu/units/requant.py",
           "inc = half & (sticky | q[0])", "inc = half & q[0]",
           (f"{_REQ}[8-half_even-generic]",), what="half_even: the sticky bits ignored"),
    Mutant("requant-half-up", "nanokpu/units/requant.py",
           "inc = half\n", "inc = half & sticky\n",
           (f"{_REQ}[8-half_up-generic]",), what="half_up: ties round down"),
    Mutant("requant-floor", "nanokpu/units/requant.py",
           "inc = 0\n", "inc = half & sticky\n",
           (f"{_REQ}[8-floor-generic]",), what="floor: rounds above half up"),
    Mutant("requant-sat-hi", "nanokpu/units/requant.py",
           "Mux(rounded > hi, hi, rounded)", "Mux(rounded > hi + 1, hi, rounded)",
           (f"{_REQ}[8-half_even-generic]",), what="a value rounded up past the top is not saturated"),
    Mutant("requant-sat-lo", "nanokpu/units/requant.py",
           "Mux(neg, -hi - 1, hi)", "Mux(neg, -hi, hi)",
           (f"{_REQ}[8-half_even-generic]",), what="the negative bound one too high"),
    Mutant("requant-overflow-mask", "nanokpu/units/requant.py",
           "Cat(Const(0, ow), ~below[:width + 1 - ow])", "Cat(Const(0, ow + 1), ~below[:width - ow])",
           (f"{_REQ}[8-half_even-generic]",), what="overflow check one bit too high"),
    # -- the vector unit ---------------------------------------------------------------
    Mutant("norm-half-even", "nanokpu/units/vector.py",
           "round_shift(shifted, scale_shift, cfg.rounding)", "round_shift(shifted, scale_shift, \"floor\")",
           (f"{_VEC}::test_norm_ties_amaranth[half_even]",), what="NORM floors instead of rounding"),
    Mutant("norm-half-up", "nanokpu/units/vector.py",
           "round_shift(shifted, scale_shift, cfg.rounding)", "round_shift(shifted, scale_shift, \"half_even\")",
           (f"{_VEC}::test_norm_ties_amaranth[half_up]",), what="NORM half_up: ties to even"),
    Mutant("norm-normalise", "nanokpu/units/vector.py",
           "len(upper) + _leading_zeros(lower)", "len(upper) - 1 + _leading_zeros(lower)",
           (f"{_VEC}::test_norm_ties_amaranth[half_even]",),
           what="NORM: r normalised one bit short when its upper half is zero (a reciprocal twice too large)"),
    Mutant("norm-mean-shift", "nanokpu/units/vector.py",
           "sqrt_of((sumsq >> n_log2)[:self.ms_width])", "sqrt_of((sumsq >> (n_log2 + 1))[:self.ms_width])",
           (f"{_VEC}::test_norm_ties_amaranth[half_even]",),
           what="NORM: the mean of a power-of-two row halved"),
    Mutant("norm-last-held", "nanokpu/units/vector.py",
           "q_valid.eq(i.valid & ~held), q_last.eq(beat.last)] + take",
           "q_valid.eq(i.valid), q_last.eq(beat.last)] + take",
           (f"{_VEC}::test_vector_unit_amaranth[1]",),
           what="NORM: the next row's first beat taken as pass 1 while the last result waits"),
    Mutant("norm-isqrt", "nanokpu/units/vector.py",
           "with m.If(rem >= trial):", "with m.If(rem > trial):",
           (f"{_VEC}::test_norm_ties_amaranth[half_even]",), what="NORM: square root misses exact squares"),
    Mutant("combine-rounding", "nanokpu/units/vector.py",
           "round_shift(total, cfg.weight_frac, cfg.rounding)", "round_shift(total, cfg.weight_frac, \"floor\")",
           (f"{_VEC}::test_combine_ties_amaranth[half_even]",), what="COMBINE floors instead of rounding"),
    # -- the KDA state update ----------------------------------------------------------
    Mutant("kda-delta-saturation", "nanokpu/units/kda_state.py",
           "o_row[j].eq(saturate(s1_2[j] + round_shift(pd_2[j], u, mode), w))",
           "o_row[j].eq(s1_2[j] + round_shift(pd_2[j], u, mode))",
           (f"{_KDA}::test_directed_steps[half_even]",), what="the delta rule wraps instead of saturating"),
    Mutant("kda-prediction-rounding", "nanokpu/units/kda_state.py",
           "(v_rf[j] << shift_v) - round_shift(acc[j], u, mode)",
           "(v_rf[j] << shift_v) - round_shift(acc[j], u, \"floor\")",
           (f"{_KDA}::test_directed_steps[half_even]",), what="S'^T k floored instead of rounded"),
    Mutant("kda-read-last-row", "nanokpu/units/kda_state.py",
           "last1.eq(n2 == K - 1)", "last1.eq(n2 == K - 2)",
           (f"{_KDA}::test_random_steps[1]",), what="the read-out r formed before the last row is summed"),
    # -- the routing engine ------------------------------------------------------------
    Mutant("router-insert-tie", "nanokpu/units/router.py",
           "(new.key > e.key)", "(new.key >= e.key)",
           (f"{_RTR}[tiny]",), what="insertion: on equal keys the higher index wins"),
    Mutant("router-merge-lane-tie", "nanokpu/units/router.py",
           "Const(route_lanes - 1 - j, lane_w)", "Const(j, lane_w)",
           (f"{_RTR}[tiny-lanes4]",), what="merge: on equal keys the higher lane wins"),
    Mutant("router-merge-beat-tie", "nanokpu/units/router.py",
           "~nhead.beat, ordered", "nhead.beat, ordered",
           (f"{_RTR}[tiny-lanes4]",), what="merge: on equal keys the later beat wins"),
    Mutant("router-merge-sign", "nanokpu/units/router.py",
           "Cat(key[:-1], ~key[-1])", "Cat(key[:-1], key[-1])",
           (f"{_RTR}[tiny-lanes4]",), what="merge: negative keys rank above positive ones"),
    Mutant("router-merge-ge", "nanokpu/units/router.py",
           "Mux(a.rank > b.rank, a, b)", "Mux(a.rank >= b.rank, a, b)",
           equivalent="Two candidates never have equal ranks: the lowest bits of a rank are its lane's "
                      "number, and the two inputs of every node of the comparison tree come from disjoint "
                      "sets of lanes, so `>` and `>=` pick the same winner.",
           what="merge: `>` -> `>=`"),
    Mutant("router-lane-ok", "nanokpu/units/router.py",
           "if j >= n - (self.beats - 1) * route_lanes", "if j > n - (self.beats - 1) * route_lanes",
           (f"{_RTR}[tiny-lanes3]",), what="a lane past the last expert takes part"),
    # -- the renormaliser (the router's and the softmax's reciprocal and weights) ---------
    Mutant("renorm-recip", "nanokpu/units/renorm.py",
           "div.den.eq(self.total)", "div.den.eq(self.total + 1)",
           (f"{_RTR}[tiny]", f"{_SMX}[tiny]"), what="reciprocal of S + 1"),
    Mutant("renorm-weight-shift", "nanokpu/units/renorm.py",
           "cfg.score_frac + 1, cfg.rounding)", "cfg.score_frac, cfg.rounding)",
           (f"{_RTR}[tiny]", f"{_SMX}[tiny]"), what="weight product shifted one bit short"),
    Mutant("renorm-weight-round", "nanokpu/units/renorm.py",
           "cfg.score_frac + 1, cfg.rounding)", "cfg.score_frac + 1, \"floor\")",
           (f"{_RTR}[tiny]", f"{_SMX}[tiny]"), what="weights floored instead of rounded"),
    # -- the softmax -----------------------------------------------------------------------
    Mutant("softmax-saturate", "nanokpu/units/softmax.py",
           "diff.eq(Mux(d < -(1 << (cfg.act_width - 1)), -(1 << (cfg.act_width - 1)), d))", "diff.eq(d)",
           (f"{_SMX}[tiny]",), what="s - m not saturated at act_width (wraps to a large positive x)"),
    Mutant("softmax-max-reset", "nanokpu/units/softmax.py",
           "Mux((count == 0) | (logit > peak), logit, peak)", "Mux(logit > peak, logit, peak)",
           (f"{_SMX}[tiny]",), what="the running max carried over from the previous row"),
    # -- the PWL evaluator (sigmoid, SiTU, exp, SiLU, decay), its stream unit, the RTL rounding shift
    Mutant("pwl-interp-round", "nanokpu/units/pwl.py",
           "value3 + (product3 >> t.seg_shift)", "value3 + ((product3 + (1 << t.seg_shift >> 1)) >> t.seg_shift)",
           (f"{_PWL}::test_evaluator_matches_golden_on_arbitrary_tables[generic-3-half_even--20-2]",),
           what="interpolation rounded instead of floored"),
    Mutant("pwl-top", "nanokpu/units/pwl.py",
           "at_top.eq(offset >= top)", "at_top.eq(offset > top)",
           (f"{_PWL}::test_evaluator_matches_golden_on_arbitrary_tables[generic-3-half_even--20-2]",),
           what="the last breakpoint read from the table"),
    Mutant("pwl-clip-low", "nanokpu/units/pwl.py",
           "Mux(offset < 0, 0,", "Mux(offset <= 0, 0,",
           equivalent="At offset = 0 both branches give 0 (the clip to 0 or the offset itself).",
           what="clip `<` -> `<=`"),
    Mutant("pwl-round-half-even", "nanokpu/units/pwl.py",
           "(below_half | q[0])", "(below_half | ~q[0])",
           (f"{_PWL}::test_round_shift_matches_golden_exhaustively",), what="RTL round_shift: ties to odd"),
    Mutant("pwl-round-half-up", "nanokpu/units/pwl.py",
           "return q + half_bit\n", "return q\n",
           (f"{_PWL}::test_round_shift_matches_golden_exhaustively",), what="RTL round_shift half_up floors"),
    Mutant("situ-product-round", "nanokpu/units/situ.py",
           "h.eq(round_shift(product, self.shift, cfg.rounding))", "h.eq(round_shift(product, self.shift, \"floor\"))",
           ("tests/units/test_situ.py::test_situ_narrow_format_with_idle_and_backpressure[1-half_even-4]",),
           what="SiTU-GLU product floored"),
    Mutant("pwl-out-range-top", "nanokpu/units/pwl.py",
           "-half, half - 1)", "-half, half)",
           (f"{_PWL}::test_out_range_is_exact", f"{_PWL}::test_out_range_of_silu_ends_at_the_largest_input"),
           what="out range counts a last breakpoint past the largest input (SiLU's 17 bits)"),
    Mutant("pwl-stream-lane", "nanokpu/units/pwl_stream.py",
           "self.o.payload[lane].eq(pwl.y[lane])", "self.o.payload[lane].eq(pwl.y[0])",
           ("tests/units/test_pwl_functions.py::test_narrow_format_with_idle_and_backpressure[silu-half_even]",),
           what="table stream (sigmoid, exp, SiLU, decay): every lane shows lane 0"),
    # -- the GEMM engine's address generators --------------------------------------------
    Mutant("gemm-a-load-end", "nanokpu/units/gemm.py",
           "with m.If(a_wptr + 1 == a_lim):", "with m.If(a_wptr + 2 == a_lim):",
           (_GEMM,), what="A loader stops one word early"),
    Mutant("gemm-b-panel-end", "nanokpu/units/gemm.py",
           "with m.If(b_k == k_m1):", "with m.If(b_k == k_m1 + 1):",
           (_GEMM,), what="B panels one word long"),
    Mutant("gemm-last-k", "nanokpu/units/gemm.py",
           "last_k.eq(k + 1 == k_m1)", "last_k.eq(k + 2 == k_m1)",
           (_GEMM,), what="a tile's last K step one early"),
    Mutant("gemm-last-row", "nanokpu/units/gemm.py",
           "last_row.eq(rows_c <= 2 * R)", "last_row.eq(rows_c < 2 * R)",
           (_GEMM,), what="last row block missed when M is a multiple of 2 R"),
    Mutant("gemm-b-read", "nanokpu/units/gemm.py",
           "b_rd.addr.eq(Mux(rbuf, half, 0) + k)", "b_rd.addr.eq(Mux(rbuf, half, 0) + k + 1)",
           (_GEMM,), what="B read one word ahead"),
    Mutant("gemm-drain-cols", "nanokpu/units/gemm.py",
           "(cur_col < cur_cols)", "(cur_col <= cur_cols)",
           (_GEMM,), what="the drain writes one column past N"),
    Mutant("gemm-store-row", "nanokpu/units/gemm.py",
           "with m.If(s_n == cmd.n - 1):", "with m.If(s_n == cmd.n):",
           (_GEMM,), what="store row mask one word late"),
    Mutant("gemm-store-early-read", "nanokpu/units/gemm.py",
           "(s_tile < tiles_written)", "(s_tile <= tiles_written)",
           (_GEMM,), what="the store under the compute reads a tile before it is written"),
    Mutant("gemm-store-panel", "nanokpu/units/gemm.py",
           "s_tile.eq(s_tile + blocks)", "s_tile.eq(s_tile + 1)",
           (_GEMM,), what="the store's tile of the next panel counted as the next row block's"),
    Mutant("gemm-store-drain-add", "nanokpu/units/gemm.py",
           "w_word[i] + Mux(early, 0, c_q[i])", "w_word[i] + c_q[i]",
           (_GEMM,), what="the drain adds the store's word to the column it writes"),
    # -- the executors -------------------------------------------------------------------
    Mutant("gemm-result-mask", "nanokpu/kpu/executors/gemm_feed.py",
           "*(gc_col >= j for j in range(1, B))", "*(gc_col > j for j in range(1, B))",
           ("tests/kpu/test_elementwise_gemm.py::test_gemm_matches_funcsim[shape0-8]",),
           what="GEMM: a group's last column not written"),
    Mutant("gemm-bspad-lane-step", "nanokpu/kpu/executors/gemm_feed.py",
           "bs_lstep.eq(Mux(transposed, 1, k_g))", "bs_lstep.eq(Mux(transposed, 1, 1))",
           ("tests/kpu/test_elementwise_gemm.py::test_gemm_with_b_from_the_scratchpad_matches_funcsim[shape0-K]",),
           what="F_B_SPAD: a beat's lanes read along W's row instead of down its column"),
    Mutant("gemm-bspad-t-beat-step", "nanokpu/kpu/executors/gemm_feed.py",
           "bs_bstep.eq(Mux(transposed, n_g, 1))", "bs_bstep.eq(Mux(transposed, k_g, 1))",
           ("tests/kpu/test_elementwise_gemm.py::test_gemm_with_b_from_the_scratchpad_matches_funcsim[shape0-V]",),
           what="F_B_T: from beat to beat (a row of V) by k words instead of n"),
    Mutant("decode-bt-alone", "nanokpu/kpu/decode.py",
           ", b_flag | ((ins.flags & F_B_T) == 0)]", "]",
           ("tests/kpu/test_decode.py::test_gemm_b_from_the_scratchpad_decodes_only_with_layer_ops",),
           what="the decode takes F_B_T without F_B_SPAD (B from the bus, the flag ignored)"),
    Mutant("vec-l2-even-e", "nanokpu/units/vector.py",
           "m.d.sync += eh.eq(Mux(d > 0, (d + 1) >> 1, 0))", "m.d.sync += eh.eq(Mux(d > 0, d >> 1, 0))",
           (f"{_VEC}::test_l2norm_amaranth[half_even]",),
           what="the l2norm's pre-shift e rounded down to even (ss << e one bit short of 2P)"),
    Mutant("vec-l2-eps", "nanokpu/units/vector.py",
           "m.d.sync += [rem.eq(sumsq + self.eps), sumsq.eq(0)]", "m.d.sync += [rem.eq(sumsq), sumsq.eq(0)]",
           ("tests/kpu/test_elementwise_gemm.py::test_l2norm_matches_funcsim[False]",),
           what="the l2norm leaves its epsilon out of the sum of squares"),
    Mutant("elementwise-l2-flag", "nanokpu/kpu/executors/elementwise.py",
           "m.d.sync += [l2.eq(l2_now), ", "m.d.sync += [l2.eq(0), ",
           ("tests/kpu/test_elementwise_gemm.py::test_l2norm_matches_funcsim[False]",),
           what="NORM with F_L2 runs the RMSNorm"),
    Mutant("elementwise-rq-table-wait", "nanokpu/kpu/executors/elementwise.py",
           "with m.If(~blocked):\n                    m.next = \"RQ_TABLE2\"",
           "with m.If(1):\n                    m.next = \"RQ_TABLE2\"",
           ("tests/kpu/test_elementwise_gemm.py::test_per_expert_entry_waits_for_its_reads[REQUANT]",),
           what="REQUANT with F_RQ_EXPERT takes its entry from a read the scratchpad did not serve"),
    Mutant("gemm-rq-table-wait", "nanokpu/kpu/executors/gemm_feed.py",
           "with m.If(~blocked):\n                    m.next = \"RQ_TABLE2\"",
           "with m.If(1):\n                    m.next = \"RQ_TABLE2\"",
           ("tests/kpu/test_elementwise_gemm.py::test_per_expert_entry_waits_for_its_reads[GEMM]",),
           what="GEMM with F_RQ_EXPERT takes its entry from a read the scratchpad did not serve"),
    Mutant("conv-channel-step", "nanokpu/kpu/executors/elementwise.py",
           "walk(ins.k, ins.n, ins.m - ins.k + 1, ins.n, 1, ins.n, 1, ins.k, 0)",
           "walk(ins.k, ins.n, ins.m - ins.k + 1, ins.n, 1, ins.n, 1, 1, 0)",
           ("tests/kpu/test_elementwise_gemm.py::test_conv_matches_funcsim[False-5-4]",),
           what="CONV steps the kernels a tap, not a channel, from one channel to the next"),
    Mutant("conv-results", "nanokpu/kpu/executors/elementwise.py",
           "Mux(is_conv_now, ln - ins.p2 + ins.n, ln)", "Mux(is_conv_now, ln - ins.p2, ln)",
           ("tests/kpu/test_elementwise_gemm.py::test_conv_matches_funcsim[False-5-4]",),
           what="CONV is done a result row early (m - k rows)"),
    Mutant("vec-dot-wrap", "nanokpu/units/vector.py",
           "Mux(dot, total[:cfg.acc_width].as_signed(), combined_out)",
           "Mux(dot, _sat(total, cfg.acc_width), combined_out)",
           (f"{_VEC}::test_dot_amaranth",),
           what="the dot product saturates at acc_width where GEMM's sums (and golden's) wrap"),
    Mutant("decode-conv-taps", "nanokpu/kpu/decode.py",
           "terms.append(ins.k <= m_eff)", "pass",
           ("tests/kpu/test_decode.py::test_conv_decodes_only_with_layer_ops",),
           what="the decode takes a CONV with more taps than rows"),
    Mutant("rqc-expert-step", "nanokpu/kpu/executors/elementwise.py",
           "t_addr.eq(Mux(last_col, t_base, t_addr + t_step))", "t_addr.eq(Mux(last_col, t_base, t_addr + 2))",
           ("tests/kpu/test_elementwise_gemm.py::test_requant_per_column_matches_funcsim[channel-expert-24]",),
           what="REQUANT with F_RQ_CHANNEL and F_RQ_EXPERT steps a column's entry, not all experts' (2*E)"),
    Mutant("rqc-column-wrap", "nanokpu/kpu/executors/elementwise.py",
           "last_col = t_col + 1 == ins.n", "last_col = t_col == ins.n",
           ("tests/kpu/test_elementwise_gemm.py::test_requant_per_column_matches_funcsim[channel-8]",),
           what="REQUANT with F_RQ_CHANNEL goes back to column 0 a value late"),
    Mutant("rqc-shift-wait", "nanokpu/kpu/executors/elementwise.py",
           "with m.If(~blocked):\n                        m.next = \"RQC_SHIFT2\"",
           "with m.If(1):\n                        m.next = \"RQC_SHIFT2\"",
           ("tests/kpu/test_elementwise_gemm.py::test_requant_per_column_matches_funcsim[channel-8]",),
           what="REQUANT with F_RQ_CHANNEL takes a shift the scratchpad did not serve"),
    Mutant("acc-add-width", "nanokpu/kpu/executors/elementwise.py",
           "saturate(a_word[:accw].as_signed() + b_word[:accw].as_signed(), accw)",
           "saturate(a_word[:act].as_signed() + b_word[:act].as_signed(), act)",
           ("tests/kpu/test_elementwise_gemm.py::test_add_at_acc_width_matches_funcsim[False]",),
           what="ADD with F_ACC adds at act_width (the plain ADD)"),
    Mutant("kda-beta-addr", "nanokpu/kpu/executors/kda_step.py",
           "bt.eq(bt + 1)]", "bt.eq(bt)]",
           ("tests/kpu/test_elementwise_gemm.py::test_kda_step_matches_funcsim_and_golden[2-2-False-False]",),
           what="KDA_STEP reads head 0's beta for every head"),
    Mutant("kda-plane-stride", "nanokpu/kpu/executors/kda_step.py",
           "p = times_const(ins.len, K)", "p = times_const(ins.n, K)",
           ("tests/kpu/test_elementwise_gemm.py::test_kda_step_matches_funcsim_and_golden[3-1-False-True]",),
           what="KDA_STEP's vector planes one token long (the layout of a single decode step)"),
    Mutant("kda-read-wait", "nanokpu/kpu/executors/kda_step.py",
           "issue = gathering & ~beat_valid & ~blocked & (col < K)", "issue = gathering & ~beat_valid & (col < K)",
           ("tests/kpu/test_elementwise_gemm.py::test_kda_step_matches_funcsim_and_golden[2-2-False-False]",),
           what="KDA_STEP takes words from reads the scratchpad did not serve"),
    Mutant("kda-state-carry", "nanokpu/kpu/executors/kda_step.py",
           "[t.eq(t + 1), s_rd.eq(ins.a), s_wr.eq(ins.a)]", "[t.eq(t + 1), s_wr.eq(ins.a)]",
           ("tests/kpu/test_elementwise_gemm.py::test_kda_step_matches_funcsim_and_golden[3-1-False-True]",),
           what="KDA_STEP's next token reads past the state instead of the state it wrote"),
    Mutant("attend-first-key", "nanokpu/kpu/executors/attend.py",
           "old = Mux(first, 0, acc_rd.data)", "old = acc_rd.data",
           ("tests/kpu/test_elementwise_gemm.py::test_attend_matches_funcsim_and_golden[4-4-3-True-True]",),
           what="ATTEND's query starts from the last query's accumulators (exact when its first key zeroes them)"),
    Mutant("attend-causal", "nanokpu/kpu/executors/attend.py",
           "keys.eq(ins.k - ins.m)", "keys.eq(ins.k - 1)",
           ("tests/kpu/test_elementwise_gemm.py::test_attend_matches_funcsim_and_golden[3-5-8-False-False]",),
           what="ATTEND lets every query see every key (no causal mask)"),
    Mutant("attend-value-wait", "nanokpu/kpu/executors/attend.py",
           "with m.If(~blocked):\n                    m.d.sync += [v_valid.eq(1)",
           "with m.If(1):\n                    m.d.sync += [v_valid.eq(1)",
           ("tests/kpu/test_elementwise_gemm.py::test_attend_matches_funcsim_and_golden[3-5-8-False-False]",),
           what="ATTEND takes values the scratchpad did not serve"),
    Mutant("decode-attend-keys", "nanokpu/kpu/decode.py",
           "ins.k <= cfg.mla_max_tokens, ins.n <= cfg.v_head_dim]", "ins.k <= cfg.mla_max_tokens]",
           ("tests/kpu/test_decode.py::test_attend_decodes_only_with_layer_ops",),
           what="the decode takes an ATTEND with more values per key than its accumulators hold"),
    Mutant("decode-kda-state-on-vectors", "nanokpu/kpu/decode.py",
           "overlaps(ins.b, wb) | a_on_b)", "overlaps(ins.b, wb))",
           ("tests/kpu/test_decode.py::test_kda_step_decodes_only_with_layer_ops",),
           what="the decode takes a KDA_STEP whose state (written) overlaps its vectors"),
    Mutant("norm-eps-word", "nanokpu/kpu/executors/elementwise.py",
           "m.d.sync += eps.eq(rd0.data[:2 * act])", "m.d.sync += eps.eq(vec.eps_q)",
           ("tests/kpu/test_elementwise_gemm.py::test_norm_with_its_eps_word_matches_funcsim[False]",),
           what="NORM with F_EPS keeps the config's epsilon instead of its word's"),
    Mutant("decode-layer-flags", "nanokpu/kpu/decode.py",
           "terms.append((ins.flags & r.layer_flags) == 0)", "pass",
           ("tests/kpu/test_decode.py::test_norm_eps_word_decodes_only_with_layer_ops",),
           what="the decode takes NORM's F_EPS and F_L2 (any layer_ops flag) where layer_ops did not build them"),
    Mutant("gemm-bspad-full-wait", "nanokpu/kpu/executors/gemm_feed.py",
           "go = bs_on & ~blocked & (~bs_full | b_taken)", "go = bs_on & ~blocked",
           ("tests/kpu/test_elementwise_gemm.py::test_gemm_with_b_from_the_scratchpad_matches_funcsim[shape4-V]",),
           what="F_B_SPAD: the reader gathers on while the engine has not taken the last beat"),
    Mutant("decode-bspad-host", "nanokpu/kpu/decode.py",
           "uses_host = any_op(lambda r: r.host) & ~b_on", "uses_host = any_op(lambda r: r.host)",
           ("tests/kpu/test_decode.py::test_gemm_b_from_the_scratchpad_decodes_only_with_layer_ops",),
           what="the decode checks a host window for a GEMM whose B is in the scratchpad"),
    Mutant("move-lane-mask", "nanokpu/kpu/executors/move.py",
           "wr.upper_en[j - 1].eq(wn > j)", "wr.upper_en[j - 1].eq(wn >= j)",
           ("tests/kpu/test_move_executor.py::test_rows_back_to_back[33-7-10]",),
           what="GATHER/SCATTER write a word past a row's end"),
    Mutant("load-lane-mask", "nanokpu/kpu/executors/loadstore.py",
           "spad.wr.upper_en[j - 1].eq(n_now > j)", "spad.wr.upper_en[j - 1].eq(n_now >= j)",
           ("tests/kpu/test_loadstore.py::test_load[8-1-1]",),
           what="LOAD writes an element past the beat's or the instruction's end"),
    Mutant("store-lane-mask", "nanokpu/kpu/executors/loadstore.py",
           "with m.If((j >= p_lane) & (src < p_k)):", "with m.If((j >= p_lane) & (src <= p_k)):",
           ("tests/kpu/test_loadstore.py::test_store[2-16-3-7]",),
           what="STORE sends a lane past the instruction's end"),
    Mutant("requant-read-step", "nanokpu/kpu/executors/elementwise.py",
           "[pa.eq(pa + r_k), q_read.eq(q_read + r_k)", "[pa.eq(pa + B), q_read.eq(q_read + r_k)",
           ("tests/kpu/test_elementwise_gemm.py::test_requant_with_fewer_banks_than_rows[13-False]",),
           what="REQUANT steps a full read after a word's short last read"),
    Mutant("layer-table-output", "nanokpu/kpu/executors/elementwise.py",
           "out_valid.eq(t.o.valid), out_data.eq(t.o.payload[0])]",
           "out_valid.eq(t.o.valid), out_data.eq(sig.o.payload[0])]",
           ("tests/kpu/test_elementwise_gemm.py::test_layer_table_ops_match_funcsim[SILU-False]",),
           what="SILU and DECAY write the sigmoid's output"),
    Mutant("softmax-row-end", "nanokpu/kpu/executors/elementwise.py",
           "smx.i.payload.last.eq(h_last)", "smx.i.payload.last.eq(0)",
           ("tests/kpu/test_elementwise_gemm.py::test_softmax_matches_funcsim[False]",),
           what="SOFTMAX rows end only at the unit's buffer length"),
    Mutant("decode-softmax-row", "nanokpu/kpu/decode.py",
           "terms += [ins.n <= cfg.attnres_candidates] if r.softmax_row else []", "",
           ("tests/kpu/test_decode.py::test_layer_ops_decode_only_with_layer_ops",),
           what="the decode takes SOFTMAX rows longer than the unit's buffer"),
    Mutant("mul-sticky", "nanokpu/units/pwl.py",
           "half_bit & ((x.as_unsigned() & below).any() | q[0])", "half_bit & q[0]",
           ("tests/kpu/test_elementwise_gemm.py::test_mul_matches_funcsim[False]",),
           what="MUL's half-even rounding ignores the bits below the half bit"),
    Mutant("mul-factor-row", "nanokpu/kpu/executors/elementwise.py",
           "m.d.sync += walk(ins.n, 1, ins.m, 1, 0, ins.n, 1, 0, 0)",
           "m.d.sync += walk(ins.n, 1, ins.m, 1, 0, ins.n, 1, 0, ins.n)",
           ("tests/kpu/test_elementwise_gemm.py::test_mul_matches_funcsim[False]",),
           what="MUL walks on through b after the first row instead of repeating it"),
    Mutant("mul-factor-width", "nanokpu/kpu/executors/elementwise.py",
           "act_b = Mux(vec_op == VecOp.MUL, b_word[:cfg.mul_factor_width].as_signed(),",
           "act_b = Mux(vec_op == VecOp.MUL, b_word[:cfg.mul_factor_width - 1].as_signed(),",
           ("tests/kpu/test_elementwise_gemm.py::test_mul_matches_funcsim[False]",),
           what="MUL takes its factor one bit narrow"),
    # -- the golden model ----------------------------------------------------------------
    Mutant("golden-round-half-even", "golden/intops.py",
           "((r == half) & ((q & 1) == 1))", "((r == half) & ((q & 1) == 0))",
           (f"{_INT}::test_round_shift_ties[half_even]",), what="round_shift half_even: ties to odd"),
    Mutant("golden-round-half-up", "golden/intops.py",
           "return q + (r >= half)", "return q + (r > half)",
           (f"{_INT}::test_round_shift_ties[half_up]",), what="round_shift half_up: ties down"),
    Mutant("golden-requantize-sat", "golden/intops.py",
           "shift, mode), out_width)", "shift, mode), out_width + 1)",
           (f"{_INT}::test_requantize_saturates_both_ends",), what="requantize saturates one bit wide"),
    Mutant("golden-rmsnorm-mean", "golden/intops.py",
           "keepdims=True) // n", "keepdims=True) // (n + 1)",
           (f"{_VEC}::test_vector_unit_amaranth[1]",), what="rmsnorm_int: mean over n + 1"),
    Mutant("golden-rmsnorm-round", "golden/intops.py",
           "p + bits - cfg.norm_frac, cfg.rounding)", "p + bits - cfg.norm_frac, \"floor\")",
           (f"{_VEC}::test_vector_unit_amaranth[1]",), what="rmsnorm_int floors"),
    Mutant("golden-rmsnorm-recip", "golden/intops.py",
           "recip = (1 << (p + bits)) // rt", "recip = (1 << (p + bits)) // rt + 1",
           (f"{_VEC}::test_norm_ties_amaranth[half_even]",), what="rmsnorm_int: reciprocal one too large"),
    Mutant("golden-combine-round", "golden/intops.py",
           "round_shift(acc, cfg.weight_frac, cfg.rounding)", "round_shift(acc, cfg.weight_frac, \"floor\")",
           (f"{_INT}::test_combine_int_matches_float_within_half_lsb",), what="combine_int floors"),
    Mutant("golden-route-recip", "golden/intops.py",
           "(np.int64(1) << r_bits) // np.maximum(total, 1)", "(np.int64(1) << r_bits) // (total + 1)",
           (f"{_INT}::test_route_weights_within_one_lsb",), what="route_weights_int: reciprocal of S + 1"),
    Mutant("golden-route-weight-round", "golden/intops.py",
           "r_bits - cfg.weight_frac, cfg.rounding)", "r_bits - cfg.weight_frac, \"floor\")",
           (f"{_RTR}[tiny]",), what="route_weights_int floors"),
    Mutant("golden-topk-tie", "golden/intops.py",
           "np.argsort(-keys, axis=-1, kind=\"stable\")",
           "(keys.shape[-1] - 1 - np.argsort(-keys[..., ::-1], axis=-1, kind=\"stable\"))",
           (f"{_INT}::test_topk_int_stable_ties",), what="topk_int: on ties the higher index wins"),
    Mutant("golden-route-bias", "golden/intops.py",
           "topk_int(scores + _i64(bias)[None, :], cfg.top_k)", "topk_int(scores, cfg.top_k)",
           (f"{_INT}::test_route_int_selection_uses_bias_weights_do_not",), what="route_int ignores the bias"),
    Mutant("golden-pwl-interp", "golden/intops.py",
           "* f) >> self.seg_shift)", "* f + (1 << self.seg_shift >> 1)) >> self.seg_shift)",
           (f"{_PWL}::test_evaluator_matches_golden_on_arbitrary_tables[generic-3-half_even--20-2]",),
           what="PwlTable: interpolation rounded instead of floored"),
    Mutant("golden-shared-gain", "golden/block.py",
           "float(np.max(np.abs(h_s))), 1.0, cfg)", "float(np.max(np.abs(h_s))), 0.95, cfg)",
           ("tests/golden/test_quantiser.py::test_each_stage_tracks_float[0-tiny]",),
           what="the shared expert's output gain 5 % low"),
    # -- the layer compiler ----------------------------------------------------------------
    Mutant("layer-candidate-row", "nanokpu/host/layer.py",
           "host=h_v + 4 * (t * N + N - 1) * d", "host=h_v + 4 * (t * N + N - 2) * d",
           ("tests/host/test_layer_program.py::test_kda_layers_on_funcsim_are_the_golden_ones[tensor]",),
           what="the mixer's P stored over the last finished block's row instead of its own"),
    Mutant("layer-block-start", "nanokpu/host/layer.py",
           "starts = L % cfg.attnres_block == 0", "starts = L == 0",
           ("tests/host/test_layer_program.py::test_kda_layers_on_funcsim_are_the_golden_ones[tensor]",),
           what="only layer 0 starts a block: layer 4's P never joins Bl"),
)


@dataclass
class Result:
    """Outcome of one mutant: ``killed``, ``survived``, ``error`` or ``equivalent``."""

    mutant: Mutant
    status: str
    killer: str = ""
    seconds: float = 0.0
    detail: str = field(default="", repr=False)


def mutated(mutant: Mutant, root: Path = ROOT) -> str:
    """The text of ``mutant.file`` under ``root`` with the mutation applied; ValueError unless
    ``find`` occurs exactly once."""
    text = (root / mutant.file).read_text()
    count = text.count(mutant.find)
    if count != 1:
        raise ValueError(f"mutant {mutant.id}: {mutant.find!r} occurs {count} times in {mutant.file}, not once")
    return text.replace(mutant.find, mutant.replace)


def apply(mutant: Mutant, root: Path) -> None:
    """Apply ``mutant`` to the tree at ``root`` (:func:`mutated`)."""
    (root / mutant.file).write_text(mutated(mutant, root))


def copy_tree(dest: Path, root: Path = ROOT) -> None:
    """The parts of the tree a mutant's tests need, without build outputs and caches."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "sim_build", ".pytest_cache")
    for name in TREE:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


def run_mutant(mutant: Mutant, root: Path = ROOT, timeout: float = TIMEOUT) -> Result:
    """Run ``mutant``'s killers on a mutated copy of the tree at ``root``."""
    if mutant.equivalent:
        mutated(mutant, root)  # the text still occurs once
        return Result(mutant, "equivalent")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"nanokpu-mutant-{mutant.id}-") as tmp:
        copy_tree(Path(tmp), root)
        apply(mutant, Path(tmp))
        env = dict(os.environ, PYTHONPATH=tmp, NANOKPU_SIM_BUILD=str(root / "sim_build"),
                   PYTHONDONTWRITEBYTECODE="1")
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0", *mutant.killers]
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result(mutant, "error", seconds=time.monotonic() - start, detail=f"timed out after {timeout} s")
    seconds = time.monotonic() - start
    out = proc.stdout + proc.stderr
    if proc.returncode == 1:
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.MULTILINE)
        return Result(mutant, "killed", failed[0] if failed else mutant.killers[0], seconds, out)
    if proc.returncode == 0:
        return Result(mutant, "survived", seconds=seconds, detail=out)
    return Result(mutant, "error", seconds=seconds, detail=f"pytest exit status {proc.returncode}\n{out}")


def score(results: list[Result]) -> tuple[int, int]:
    """``(killed, non-equivalent)`` mutants."""
    live = [r for r in results if r.status != "equivalent"]
    return sum(r.status == "killed" for r in live), len(live)


def _code(text: str) -> str:
    text = text.replace("\n", " ").strip().replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def render(results: list[Result], command: str) -> str:
    killed, live = score(results)
    total = sum(r.seconds for r in results)
    parts = ["# Mutation testing", "",
             f"Made by `{command}`. Each mutant is one small change to a gateware unit or to the "
             "golden model, run on a copy of the tree against its killers: behavioural tests (the "
             "Amaranth simulator and the golden model's tests kill every one here; a Verilator bench "
             "is named only where nothing faster kills a mutant), never the stale-RTL text check. A "
             "mutant is killed when a killer fails (pytest exit status 1). "
             "`tests/test_mutants.py` runs every mutant and requires it killed; the list lives in "
             "`nanokpu/commands/mutate.py`.", "",
             f"**Score: {killed} of {live} non-equivalent mutants killed ({killed / max(live, 1):.0%})**, "
             f"{len(results) - live} equivalent, {len(results)} in all; the killers ran "
             f"{total:.0f} s.", "",
             "| mutant | file | change | what it breaks | result | killed by / why equivalent | s |",
             "|---|---|---|---|---|---|---:|"]
    for r in results:
        m = r.mutant
        why = r.killer if r.status == "killed" else (m.equivalent if r.status == "equivalent" else r.status)
        why = _code(why) if r.status == "killed" else why
        parts.append(f"| {m.id} | `{m.file}` | {_code(m.find)} -> {_code(m.replace)} | {m.what} | {r.status} "
                     f"| {why} | {r.seconds:.1f} |")
    return "\n".join(parts) + "\n"


def add_arguments(parser) -> None:
    parser.add_argument("--only", action="append", choices=[m.id for m in MUTANTS], metavar="ID",
                        help="run only this mutant (repeatable); the report is then not written")
    parser.add_argument("--out", type=out_file, default=DOC)


def run(args) -> int:
    chosen = [m for m in MUTANTS if not args.only or m.id in args.only]
    results = []
    for n, mutant in enumerate(chosen, 1):
        result = run_mutant(mutant)
        results.append(result)
        print(f"[{n}/{len(chosen)}] {mutant.id}: {result.status}"
              + (f" by {result.killer}" if result.killer else "") + f" ({result.seconds:.1f} s)", flush=True)
        if result.status in ("survived", "error"):
            print("\n".join(result.detail.splitlines()[-15:]), flush=True)
    killed, live = score(results)
    print(f"score: {killed}/{live} non-equivalent mutants killed")
    if not args.only:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render(results, "nanokpu " + " ".join(getattr(args, "argv", ["mutate"]))))
        print(f"wrote {args.out}")
    return 0 if killed == live else 1
