"""The nano-KPU instruction set and host interface: the ONE place both the compiler and the RTL read.

Machine model
-------------
* **Scratchpad** (``spad``): ``cfg.dmem_depth`` words of :func:`word_width` bits (signed, one
  element per word, whatever its format). Every compute instruction reads its operands from
  the scratchpad and writes its result back to it; addresses are word indices.
* **Host memory**: byte addressed, reached through the AXI4 master port (``m_axi``, data
  :func:`bus_bytes` wide), only inside the window ``[HOST_BASE, HOST_BASE + HOST_SIZE)`` set by
  the host. ``LOAD``/``STORE`` move elements of ``width`` bytes (little endian, sign-extended on
  load); every host address must be a multiple of :func:`bus_bytes`.
* **Weights are never resident**: ``GEMM`` streams its B operand (a weight matrix ``W [n, k]``,
  ``in_width = 8``) from host memory straight into the GEMM engine, pre-tiled by the compiler
  into ``cols``-wide panels (:func:`weight_panels`): one bus beat is one panel word. With
  :data:`F_B_SPAD` (built with ``layer_ops``) the B operand is an activation matrix in the
  scratchpad instead (attention's ``q K^T``).
* **Expert iterator**: ``ROUTE`` resets it; ``EXPERT`` advances it to the next expert chosen by at
  least one token and sets the registers ``expert`` (index), ``count`` (its tokens) and
  ``offset`` (where its tokens start in the dispatch lists). Instructions flagged
  :data:`F_M_COUNT` take ``m = count``; :data:`F_HOST_EXPERT` adds ``expert * stride`` to the host
  address; :data:`F_RQ_EXPERT` reads the requantiser constants from a per-expert table.
* **Requantiser tables** (at ``b``; an entry is two words, ``mult`` (its low ``mult_width``
  bits taken), then ``shift`` (its low 6 bits)): with :data:`F_RQ_EXPERT` alone one entry per
  expert, entry ``expert`` taken (``REQUANT``, ``GEMM``, ``REQUANT_WIDE``); with
  :data:`F_RQ_CHANNEL` (``GEMM``, ``REQUANT_WIDE`` and, with ``layer_ops``, ``REQUANT``: other ops
  ignore it) one entry per output column ``j < n``, and with both flags one per column and
  expert. The entry of column ``j`` starts at word ``b + 2*(j*E + e)``, ``E = n_experts`` and ``e = expert`` with
  :data:`F_RQ_EXPERT`, else ``E = 1``, ``e = 0``: columns outer, experts inner, so the walk over
  the columns steps by the constant ``2*E``.

Encoding
--------
An instruction is :data:`INSTR_BITS` = 256 bits, the :data:`INSTR_LAYOUT` structure (first field
in the least significant bits), written to the instruction memory as 8 little-endian 32-bit words
(word ``w`` of instruction ``i`` at byte offset ``IMEM_BASE + 32 * i + 4 * w`` of the register
bank). Fields::

    op 6 | flags 10 | m 16 | k 16 | n 16 | a 24 | b 24 | c 24 | host 32 | stride 32 | mult 32
    | shift 6 | width 6 | target 12

The fields ``m``, ``n``, ``k`` are each op's shape letters: ``GEMM`` ``A [m, k] @ W [n, k]^T``
(a result ``[m, n]``); ``COMBINE`` ``a [m, k, n]``; ``ROUTE`` scores ``[m, n]`` -> the top ``k``
per row (``k`` must be ``top_k``); the element-wise ops and ``LOAD``/``STORE`` ``[m, n]``.

Semantics (``len = m * n``; ``x[i]`` is scratchpad word ``x + i``):

================  ==============================================================================
``HALT``          stop; status ``done``.
``LOAD``          ``c[i] = sext(host element i)`` for ``i < len``; element ``width`` in {1, 2, 4} bytes,
                  host byte address ``host (+ expert * stride)``, 4-byte aligned.
``STORE``         host element ``i = a[i]`` for ``i < len``; ``width`` must be 4.
``GEMM``          ``c[i*n + j] = wrap_acc(sum_kk a[i*k + kk] * W[j, kk])``, ``i < m``, ``j < n`` (``A [m, k] @ W[n,
                  k]^T``, :func:`golden.intops.matmul_int`), requantised like ``REQUANT`` when ``width != 0`` (fused:
                  the GEMM engine's requantiser, then saturation to ``width``; :data:`F_RQ_EXPERT` as for ``REQUANT``;
                  with :data:`F_RQ_CHANNEL` column ``j`` takes ``mult``, ``shift`` from its table entry, ``b[2*(j*E +
                  e)]`` and ``b[2*(j*E + e) + 1]``, ``2*n*E`` words); ``W`` from host ``host (+ expert * stride)`` in
                  :func:`weight_panels` layout. Limits of the GEMM engine (else ``BAD_SHAPE``): ``k <=
                  spad_b_depth/2``, ``ceil(m/rows)*k <= spad_a_depth``, ``ceil(m/rows)*n <= spad_c_depth``. With
                  :data:`F_B_SPAD` ``W[j, kk] = b[j*k + kk]`` (``n*k`` words, ``in_width`` bits of each, row-major,
                  e.g. attention's keys ``K [n, k]``), with :data:`F_B_T` too ``W[j, kk] = b[kk*n + j]`` (``W^T [k,
                  n]`` row-major, e.g. the values ``V`` of ``p V``), no host access; only where ``layer_ops`` built it
                  and not with :data:`F_RQ_EXPERT`, :data:`F_RQ_CHANNEL` or :data:`F_HOST_EXPERT` (``b`` is the
                  operand, not a table), else ``BAD_SHAPE``; :data:`F_B_T` without :data:`F_B_SPAD` is ``BAD_SHAPE``
                  too. The executor reads ``B`` a word a cycle: a panel of ``k`` beats in ``k*cols`` cycles.
``REQUANT``       ``c[i] = requantize(a[i], mult, shift, width)``, ``2 <= width <= acc_width``; with
                  :data:`F_RQ_EXPERT`, ``mult = b[2*expert]`` and ``shift = b[2*expert + 1]``; with
                  :data:`F_RQ_CHANNEL` (built with ``layer_ops``, else ``BAD_SHAPE``) column ``j = i mod n``'s
                  entry of the per-column table, as ``GEMM``'s (a value every few cycles: KDA's ``W_f``
                  projection after its bias, the conv's per-channel scales).
``SIGMOID``       ``c[i] = sigmoid_q(a[i])`` of logits ``Q<logit_width>.<logit_frac>``; records
                  ``(c, len)`` as the scores region.
``SITU``          ``c[i] = situ_q(a[i], b[i])``.
``ADD``           ``c[i] = add_sat(a[i], b[i], act_width)``; with :data:`F_ACC` (built with ``layer_ops``, else
                  ``BAD_SHAPE``) ``add_sat(a[i], b[i], acc_width)``: a bias added to raw ``GEMM`` sums.
``ROUTE``         scores ``a [m=T, n=E]`` (must be the region the last ``SIGMOID`` wrote), bias
                  ``b [E]``, ``k = top_k``. Writes the route table at ``c`` (see :func:`route_table`):
                  ``idx [T*k]``, ``weights [T*k]``, ``counts [E]``, ``offsets [E]``, ``list_p [T*k]``
                  (slot ``t*k + s`` of each choice, grouped per expert in expert order, tokens
                  ascending) and ``list_t [T*k]`` (its token ``t``). Resets the expert iterator.
``EXPERT``        counts at ``a`` (``n = E`` experts, offsets at ``a + n``): advance to the next expert
                  with a non-zero count, else jump to ``target``; ``NO_ROUTE`` before any ``ROUTE``.
``GATHER``        ``c[i*n + j] = a[t*n + j]``, ``t = b[offset + i]``, ``i < count``; ``t < m`` checked.
``SCATTER``       ``c[p*n + j] = a[i*n + j]``, ``p = b[offset + i]``, ``i < count``; ``p < m`` checked.
``COMBINE``       ``c[t*n + j] = combine_int`` of ``e = a [m, k, n]`` and ``w = b [m, k]``.
``NORM``          ``c[t*n:(t+1)*n] = rmsnorm_int(a[t*n:(t+1)*n])``, ``t < m``; with :data:`F_L2`
                  ``l2norm_int(a[t*n:(t+1)*n], kda_unit_frac)`` instead (KDA's ``q`` and ``k`` per head,
                  in the unit format ``Q<act_width>.<act_width - 2>``); with :data:`F_EPS` its epsilon
                  ``eps_q`` is word ``b[0]`` (its low ``2*act_width`` bits, unsigned) instead of
                  :func:`golden.intops.rms_eps_q` (:func:`golden.intops.l2_eps_q`): rows in another
                  format's units, e.g. KDA's ``o`` in ``Q<act_width>.<o_frac>``. Both flags only where
                  ``layer_ops`` built them, else ``BAD_SHAPE``.
``JUMP``          continue at ``target``.
``SPLIT``         ``c[i], c[len + i] = split_digits(a[i], in_width)`` (:func:`golden.intops.split_digits`:
                  ``a[i] = c[i] * 2**in_width + c[len + i]``, the low digit balanced), ``i < len``: the
                  digits of a two-digit operand as two ``[m, n]`` blocks, e.g. ``A = [Xh; Xl]`` ``[2m, n]``.
``REQUANT_WIDE``  ``c[i] = requantize(v, mult, shift, width)``, ``v = join_partials(a[i], a[len + i],
                  a[2*len + i], a[3*len + i], in_width, router_acc_width)`` (:func:`golden.intops.join_partials`:
                  ``(P_hh << 2D) + ((P_lh + P_hl) << D) + P_ll``, the four digit GEMMs of a two-digit product,
                  ``[m, n]`` each), ``2 <= width <= acc_width``; ``mult``, ``shift`` as for ``GEMM`` (the
                  instruction's, :data:`F_RQ_EXPERT`, or with :data:`F_RQ_CHANNEL` column ``j = i mod n``'s).
``CONV``          ``c[t*n:(t+1)*n] = short_conv_int(a, W)[t]``, ``t < m - k + 1``: the causal depthwise
                  convolution (:func:`golden.intops.short_conv_int`) of the act-format rows ``a [m, n]``
                  (the ``k - 1`` rows of history first: KDA's conv tail) with the kernels ``W [n, k]``
                  (``W[ch, j] = b[ch*k + j]``, ``in_width`` bits), the sums raw in ``acc_width`` bits,
                  wrapping as ``GEMM``'s (a ``REQUANT`` takes them to the act format); ``k <= m``
                  (built with ``layer_ops``).
``KDA_STEP``      KDA's recurrent state update (:func:`golden.kda.kda_head_step_int`) for ``m`` tokens and
                  ``n`` heads of ``k = kda_head_dim``: the state ``S [n, k, k]`` at ``a`` (``2*act_width``
                  bits, updated in place, token after token), the vector planes at ``b``: ``q``, ``k`` (unit
                  format), ``v`` (act format), ``decay`` (unsigned ``score_width``) ``[m, n, k]`` each at ``b
                  + {0, 1, 2, 3}*m*n*k``, ``beta [m, n]`` at ``b + 4*m*n*k`` (:func:`kda_vectors`);
                  ``c[(t*n + h)*k + j] = requantize(r[j], mult, shift, width)`` of the read-out ``r = S^T
                  q`` (golden ``rq_read``); ``a`` must not overlap ``b`` (built with ``layer_ops``).
``ATTEND``        MLA's gated causal read-out of one head (:func:`golden.mla.attend_int`): the act-format
                  scores ``a [m, k]`` of ``m`` queries, the last ``m`` of ``k`` positions (query ``t`` attends
                  keys ``0 .. k - m + t``), the gate ``g [m, n]`` at ``b`` (unsigned ``score_width``) and the
                  values ``V [k, n]`` at ``b + m*n`` (``in_width`` bits); ``c[t*n + j] = gate_int(o[t, j], g[t,
                  j])``, ``o`` the online softmax (:func:`golden.mla.online_softmax_int`: keys in order, one
                  reciprocal per row). ``m <= k <=`` :attr:`~nanokpu.config.KpuConfig.mla_max_tokens`, ``n <=
                  v_head_dim`` (the accumulators), else ``BAD_SHAPE`` (built with ``layer_ops``).
``SILU``          ``c[i] = silu_q(a[i])`` (act format in and out; built with ``layer_ops``).
``DECAY``         ``c[i] = decay_q(a[i])``: the KDA decay ``exp(kda_gate_min sigmoid(a[i]))`` of act-format
                  gate logits, unsigned, ``score_frac`` bits (built with ``layer_ops``).
``SOFTMAX``       ``c[t*n:(t+1)*n] = softmax_int(a[t*n:(t+1)*n])``, ``t < m``: act-format logits to
                  unsigned weights of ``weight_frac`` bits (the format ``COMBINE`` takes), a row of
                  ``n <= attnres_candidates`` (built with ``layer_ops``).
``MUL``           ``c[t*n + j] = saturate(round_shift(a[t*n + j] * b[j], shift), out_width)``, ``t < m``,
                  ``j < n``: act-format ``a`` times a row ``b [n]`` of signed factors of
                  :attr:`~nanokpu.config.KpuConfig.mul_factor_width` bits
                  (repeated for every row; ``m = 1`` multiplies element by element), rounded by
                  ``cfg.rounding``: an RMSNorm's weight (:func:`golden.intops.rmsnorm_weight_int`) or a
                  sigmoid gate (built with ``layer_ops``).
================  ==============================================================================

Every range is checked before an instruction starts; a failed check stops the controller with
an :class:`Err` code and nothing of that instruction is written. The result region (``c``) must
not overlap an operand region (``a``, ``b``, a requantiser table) - the units stream, so
an overlap would make results depend on timing - except exactly (same base and size) for the
element-wise ops ``REQUANT``, ``SIGMOID``, ``SITU``, ``ADD``, ``NORM``, ``SILU``, ``DECAY``,
``SOFTMAX`` and ``MUL``, which may run in place; otherwise ``OVERLAP``. Gather/scatter indices are
checked as they are read: the rows before a bad one are written, inside the checked region.
Operands enter units at the units' port widths (``act_width`` for activations, ``router_logit_width``
(``logit_width``, the act format's width when None) for the logits of ``SIGMOID``, ``acc_width`` for
``REQUANT`` and ``REQUANT_WIDE``, ``2 * in_width`` for ``SPLIT``, ``in_width`` for ``GEMM`` A and ``CONV``'s kernels,
unsigned ``score_width``/``weight_width`` for scores and routing weights): the upper bits of a
wider word are ignored, in the RTL and in :class:`~nanokpu.host.funcsim.FuncSim` alike.

Rules
-----
The per-op rules of the checks above are ONE table, :data:`OP_RULES`, an :class:`OpRule` per opcode:
its executor (the busy counter), the scratchpad words it reads at ``a`` and ``b`` and writes at
``c`` and the host bytes it moves, each a name of :data:`SIZES` (``"m*n"``, ``"m*k"``, ``"m*k*n"``,
``"n"``, ``"2*n"``, ``"2*m*n"``, ``"4*m*n"``, ``"count*n"``, ``"list"`` = ``offset + count``,
``"rq"`` (a requantiser table) = ``2 * n * E`` with :data:`F_RQ_CHANNEL`, else ``2 * n_experts``
with :data:`F_RQ_EXPERT`, else 0, ``"gemm_b"`` = ``n*k`` with :data:`F_B_SPAD`, else ``"rq"``,
``"eps"`` = 1 with :data:`F_EPS` else 0, ``"k*n"``, ``"(m-k+1)*n"``, ``"route"`` =
``4*m*top_k + 2*n_experts``; host ``"m*n*width"``, ``"panels"`` (0 with :data:`F_B_SPAD`: no host
access)), whether it may run in place, its shape rules (the letters that must be ``>= 1``, ``n =
n_experts``, ``k = top_k``, the allowed ``width`` values, the GEMM engine's limits, ``CONV``'s
taps, ``ATTEND``'s keys), and whether it reads the scores, needs a
``ROUTE`` or a current expert, or jumps. For example::

    Op.GEMM: OpRule("gemm", a="m*k", b="gemm_b", c="m*n", host="panels", positive="mnk",
                    widths=(0, RQ_WIDTHS), engine=True, b_spad=True),
    Op.ADD:  OpRule("vector", a="m*n", b="m*n", c="m*n", in_place=True, positive="mn"),

The RTL's decode (:class:`~nanokpu.kpu.top.NanoKPU`: each size name maps to a signal of its
product lane) and :class:`~nanokpu.host.funcsim.FuncSim` (each name through :data:`SIZES`) build
their checks from it; :data:`OP_EXECUTOR` and :data:`IN_PLACE_OPS` are views of it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

import numpy as np
from amaranth.lib import data

from nanokpu.config import KpuConfig

__all__ = ["Op", "Err", "WIDE_ROUTER_OPS", "built_ops", "Reg", "F_M_COUNT", "F_HOST_EXPERT", "F_RQ_EXPERT",
           "F_RQ_CHANNEL", "F_B_SPAD", "F_B_T", "F_EPS", "F_L2", "F_ACC", "FIELDS", "INSTR_BITS",
           "INSTR_WORDS", "INSTR_LAYOUT", "IN_PLACE_OPS", "IMEM_BASE", "LOADS_BASE", "ADDR_WIDTH",
           "OP_EXECUTOR", "EXECUTORS", "OP_RULES", "OpRule", "RQ_WIDTHS", "SIZES", "SizeArgs",
           "CTRL_LAYOUT", "STATUS_LAYOUT", "ctrl_word", "status_fields",
           "Instr", "word_width", "kda_vectors", "bus_bytes", "weight_panels", "route_table", "encode_program"]


class Op(enum.IntEnum):
    """Opcodes (6 bits)."""

    HALT = 0
    LOAD = 1
    STORE = 2
    GEMM = 3
    REQUANT = 4
    SIGMOID = 5
    SITU = 6
    ADD = 7
    ROUTE = 8
    EXPERT = 9
    GATHER = 10
    SCATTER = 11
    COMBINE = 12
    NORM = 13
    JUMP = 14
    SPLIT = 15
    REQUANT_WIDE = 16
    SILU = 17
    DECAY = 18
    SOFTMAX = 19
    MUL = 20
    CONV = 21
    KDA_STEP = 22
    ATTEND = 23


#: The ops built only with a wide router (:attr:`~nanokpu.config.KpuConfig.wide_router`).
WIDE_ROUTER_OPS = (Op.SPLIT, Op.REQUANT_WIDE)
#: The K3 layer's ops, built only with :attr:`~nanokpu.config.KpuConfig.layer_ops`.
LAYER_OPS = (Op.SILU, Op.DECAY, Op.SOFTMAX, Op.MUL, Op.CONV, Op.KDA_STEP, Op.ATTEND)


def built_ops(cfg: KpuConfig) -> tuple[Op, ...]:
    """The ops the nano-KPU of ``cfg`` executes; any other opcode is :attr:`Err.BAD_OPCODE`."""
    return tuple(o for o in Op if (cfg.wide_router or o not in WIDE_ROUTER_OPS)
                 and (cfg.layer_ops or o not in LAYER_OPS))


class Err(enum.IntEnum):
    """Error codes in ``STATUS[15:8]``; the controller stops on the first."""

    NONE = 0
    BAD_OPCODE = 1      # opcode not in :func:`built_ops` (:class:`Op`, less WIDE_ROUTER_OPS without a wide
    #                     router, less LAYER_OPS without layer_ops)
    SPAD_RANGE = 2      # a scratchpad region (or a gathered/scattered row) out of range
    BAD_SHAPE = 3       # a zero or inconsistent dimension, bad width, k != top_k, n != n_experts,
    #                     a GEMM beyond the GEMM engine's scratchpads
    NO_SCORES = 4       # ROUTE before a SIGMOID wrote its scores region
    HOST_RANGE = 5      # host address outside the window or not bus_bytes aligned
    PC_RANGE = 6        # program counter or jump target beyond the instruction memory
    BUS_ERROR = 7       # the AXI4 slave answered SLVERR/DECERR
    NO_ROUTE = 8        # EXPERT/GATHER/SCATTER or an expert-indexed operand without a ROUTE
    OVERLAP = 9         # the result region overlaps an operand region (other than exactly in place)


#: Flag bits.
F_M_COUNT = 1 << 0
F_HOST_EXPERT = 1 << 1
F_RQ_EXPERT = 1 << 2
F_RQ_CHANNEL = 1 << 3
F_B_SPAD = 1 << 4
F_B_T = 1 << 5
F_EPS = 1 << 6
F_L2 = 1 << 7
F_ACC = 1 << 8

#: (name, width) of every instruction field, least significant first.
FIELDS = (("op", 6), ("flags", 10), ("m", 16), ("k", 16), ("n", 16), ("a", 24), ("b", 24),
          ("c", 24), ("host", 32), ("stride", 32), ("mult", 32), ("shift", 6), ("width", 6),
          ("target", 12))
INSTR_BITS = sum(w for _, w in FIELDS)
INSTR_WORDS = INSTR_BITS // 32
assert INSTR_BITS == 256
INSTR_LAYOUT = data.StructLayout({name: width for name, width in FIELDS})


class Reg(enum.IntEnum):
    """AXI4-Lite register byte offsets (32-bit registers)."""

    CTRL = 0x00         # W: CTRL_LAYOUT (start, soft reset, clear the routing load counters)
    STATUS = 0x04       # R: STATUS_LAYOUT (busy, done, error, Err code, pc)
    CYCLES = 0x08       # R: cycles of the current/last run
    HOST_BASE = 0x0C    # RW: host window base (bytes)
    HOST_SIZE = 0x10    # RW: host window size (bytes)
    INSTRS = 0x14       # R: instructions retired in the current/last run
    BUSY = 0x20         # R: BUSY + 4*u: busy cycles of executor EXECUTORS[u]
    INFO = 0x40         # R: dmem_depth
    INFO_IMEM = 0x44    # R: imem_depth


#: ``CTRL`` (write-only): ``start`` runs the program from pc 0; ``soft_reset`` stops a run and
#: clears ``done``, the error and the expert iterator; ``clear_loads`` zeroes the routing load
#: counters. Bits may be combined in one write. :func:`ctrl_word` builds a value.
CTRL_LAYOUT = data.StructLayout({"start": 1, "soft_reset": 1, "clear_loads": 1})

#: ``STATUS`` (read-only): ``busy`` while a program runs; ``done`` after ``HALT`` or an error;
#: ``error`` when ``code`` (an :class:`Err`) is not ``NONE``; ``pc`` of the instruction running or
#: stopped at. :func:`status_fields` decodes a value.
STATUS_LAYOUT = data.StructLayout({"busy": 1, "done": 1, "error": 1, "reserved": 5, "code": 8, "pc": 16})


def ctrl_word(**bits: int) -> int:
    """A ``CTRL`` value with the named :data:`CTRL_LAYOUT` bits set, e.g. ``ctrl_word(start=1)``."""
    return CTRL_LAYOUT.const(bits).as_bits()


def status_fields(word: int) -> data.Const:
    """A ``STATUS`` value's :data:`STATUS_LAYOUT` fields as ints (``.busy``, ``.code``, ``.pc``, ...)."""
    return STATUS_LAYOUT.from_bits(word)


#: The executors, the kinds of work an instruction does, each with a busy counter (in register order).
EXECUTORS = ("dma", "gemm", "act", "route", "vector", "move")

#: Instruction memory window and routing load counters (expert j at LOADS_BASE + 4*j); the
#: register bank decodes ADDR_WIDTH address bits.
ADDR_WIDTH = 20
IMEM_BASE = 0x80000
LOADS_BASE = 0x40000

#: An :attr:`OpRule.widths` entry: the requantiser's output widths, ``2 <= width <= acc_width``.
RQ_WIDTHS = "2..acc_width"


@dataclass(frozen=True)
class OpRule:
    """The rules of one opcode, checked before it starts (see :data:`OP_RULES`).

    ``executor``
        The :data:`EXECUTORS` entry whose busy counter counts its cycles, or ``None``.
    ``a``, ``b``, ``c``
        Scratchpad words read at ``a`` and ``b`` and written at ``c``, each a :data:`SIZES` name
        (``None``: no region; a size of 0 is no region either). Every region must lie in the
        scratchpad (``SPAD_RANGE``), ``c`` must not overlap ``a`` or ``b`` (``OVERLAP``) ...
    ``in_place``
        ... except exactly (same base, same size): the op may run in place.
    ``host``
        Host bytes it moves, a :data:`SIZES` name (``None``: no host access), in whole bus
        beats from ``host (+ expert * stride)``, inside the host window (``HOST_RANGE``).
    ``positive``
        The shape letters (of ``m``, ``n``, ``k``) that must be ``>= 1`` (``BAD_SHAPE``, as
        are the next four).
    ``n_experts``, ``top_k``
        ``n`` must be ``n_experts``; ``k`` must be ``top_k``.
    ``softmax_row``
        ``n`` must be at most :attr:`~nanokpu.config.KpuConfig.attnres_candidates` (the softmax
        unit's row buffer).
    ``widths``
        The allowed ``width`` values (ints, or :data:`RQ_WIDTHS` for the range ``[2,
        acc_width]``); empty: ``width`` is not read.
    ``engine``
        The GEMM engine's scratchpad limits: ``k <= spad_b_depth/2``, ``ceil(m/rows)*k <=
        spad_a_depth``, ``ceil(m/rows)*n <= spad_c_depth``.
    ``b_spad``
        :data:`F_B_SPAD` may take the B operand from the scratchpad: ``BAD_SHAPE`` unless the
        config has ``layer_ops`` and no :data:`F_RQ_EXPERT`, :data:`F_RQ_CHANNEL` or
        :data:`F_HOST_EXPERT` is set; :data:`F_B_T` (B transposed) only with it (:meth:`b_spad_ok`).
    ``layer_flags``
        The flags this op takes only where the config has ``layer_ops``, else ``BAD_SHAPE``
        (:meth:`layer_flags_ok`): ``NORM``'s :data:`F_EPS` and :data:`F_L2`, ``ADD``'s :data:`F_ACC`,
        ``REQUANT``'s :data:`F_RQ_CHANNEL`.
    ``taps``
        ``k <= m`` (a result of ``m - k + 1`` rows).
    ``head_dim``
        ``k`` must be :attr:`~nanokpu.config.KpuConfig.kda_head_dim`.
    ``keys``
        ``m <= k <=`` :attr:`~nanokpu.config.KpuConfig.mla_max_tokens` and ``n <=``
        :attr:`~nanokpu.config.KpuConfig.v_head_dim` (``ATTEND``).
    ``a_written``
        The op writes its ``a`` region too (in place): ``a`` must not overlap ``b`` (``OVERLAP``).
    ``scores``
        ``a`` (``m*n`` words) must be the region the last ``SIGMOID`` wrote (``NO_SCORES``).
    ``route``, ``expert``
        It needs a ``ROUTE`` before / a current expert (``NO_ROUTE``). Every op flagged
        :data:`F_M_COUNT`, :data:`F_HOST_EXPERT` or :data:`F_RQ_EXPERT` needs a current expert too.
    ``target``
        ``target`` must be inside the instruction memory (``PC_RANGE``).
    """

    executor: str | None = None
    a: str | None = None
    b: str | None = None
    c: str | None = None
    in_place: bool = False
    host: str | None = None
    positive: str = ""
    n_experts: bool = False
    top_k: bool = False
    softmax_row: bool = False
    widths: tuple = ()
    engine: bool = False
    b_spad: bool = False
    layer_flags: int = 0
    taps: bool = False
    head_dim: bool = False
    keys: bool = False
    a_written: bool = False
    scores: bool = False
    route: bool = False
    expert: bool = False
    target: bool = False

    def b_spad_ok(self, flags: int, cfg: KpuConfig) -> bool:
        """:data:`F_B_SPAD` (and :data:`F_B_T`) not set, or allowed (:attr:`b_spad`)."""
        if not self.b_spad or not flags & (F_B_SPAD | F_B_T):
            return True
        return bool(flags & F_B_SPAD and cfg.layer_ops and not flags & (F_RQ_EXPERT | F_RQ_CHANNEL | F_HOST_EXPERT))

    def layer_flags_ok(self, flags: int, cfg: KpuConfig) -> bool:
        """None of :attr:`layer_flags` set, or the config has ``layer_ops``."""
        return not flags & self.layer_flags or cfg.layer_ops

    def width_ok(self, width: int, cfg: KpuConfig) -> bool:
        """``width`` is one of :attr:`widths` (always true when they are empty)."""
        return not self.widths or any(2 <= width <= cfg.acc_width if w == RQ_WIDTHS else width == w
                                      for w in self.widths)


#: The per-opcode rules, the one table the RTL (:class:`~nanokpu.kpu.top.NanoKPU`'s decode),
#: :class:`~nanokpu.host.funcsim.FuncSim` and the tests read; the checks run in :class:`Err` order
#: of the module docstring (``NO_ROUTE``, ``PC_RANGE``, ``BAD_SHAPE``, ``NO_SCORES``,
#: ``SPAD_RANGE``, ``OVERLAP``, ``HOST_RANGE``).
OP_RULES: dict[Op, OpRule] = {
    Op.HALT: OpRule(),
    Op.LOAD: OpRule("dma", c="m*n", host="m*n*width", positive="mn", widths=(1, 2, 4)),
    Op.STORE: OpRule("dma", a="m*n", host="m*n*width", positive="mn", widths=(4,)),
    Op.GEMM: OpRule("gemm", a="m*k", b="gemm_b", c="m*n", host="panels", positive="mnk", widths=(0, RQ_WIDTHS),
                    engine=True, b_spad=True),
    Op.REQUANT: OpRule("act", a="m*n", b="rq", c="m*n", in_place=True, positive="mn", widths=(RQ_WIDTHS,),
                       layer_flags=F_RQ_CHANNEL),
    Op.SIGMOID: OpRule("act", a="m*n", c="m*n", in_place=True, positive="mn"),
    Op.SITU: OpRule("act", a="m*n", b="m*n", c="m*n", in_place=True, positive="mn"),
    Op.ADD: OpRule("vector", a="m*n", b="m*n", c="m*n", in_place=True, positive="mn", layer_flags=F_ACC),
    Op.ROUTE: OpRule("route", a="m*n", b="n", c="route", positive="m", n_experts=True, top_k=True, scores=True),
    Op.EXPERT: OpRule(a="2*n", n_experts=True, route=True, target=True),
    Op.GATHER: OpRule("move", a="m*n", b="list", c="count*n", positive="mn", expert=True),
    Op.SCATTER: OpRule("move", a="count*n", b="list", c="m*n", positive="mn", expert=True),
    Op.COMBINE: OpRule("vector", a="m*k*n", b="m*k", c="m*n", positive="mnk"),
    Op.NORM: OpRule("vector", a="m*n", b="eps", c="m*n", in_place=True, positive="mn",
                    layer_flags=F_EPS | F_L2),
    Op.JUMP: OpRule(target=True),
    Op.SPLIT: OpRule("act", a="m*n", c="2*m*n", positive="mn"),
    Op.REQUANT_WIDE: OpRule("act", a="4*m*n", b="rq", c="m*n", positive="mn", widths=(RQ_WIDTHS,)),
    Op.SILU: OpRule("act", a="m*n", c="m*n", in_place=True, positive="mn"),
    Op.DECAY: OpRule("act", a="m*n", c="m*n", in_place=True, positive="mn"),
    Op.SOFTMAX: OpRule("act", a="m*n", c="m*n", in_place=True, positive="mn", softmax_row=True),
    Op.MUL: OpRule("vector", a="m*n", b="n", c="m*n", in_place=True, positive="mn"),
    Op.CONV: OpRule("vector", a="m*n", b="k*n", c="(m-k+1)*n", positive="mnk", taps=True),
    Op.KDA_STEP: OpRule("vector", a="n*k*k", b="m*n*(4k+1)", c="m*n*k", positive="mnk", widths=(RQ_WIDTHS,),
                        head_dim=True, a_written=True),
    Op.ATTEND: OpRule("vector", a="m*k", b="(k+m)*n", c="m*n", positive="mnk", keys=True),
}
assert set(OP_RULES) == set(Op)
assert all(r.executor in (None, *EXECUTORS) for r in OP_RULES.values())

#: The executor that runs an opcode (its busy counter counts the cycles): from :data:`OP_RULES`.
OP_EXECUTOR = {op: r.executor for op, r in OP_RULES.items() if r.executor}

#: Element-wise ops whose result region may be exactly an operand region (run in place): from
#: :data:`OP_RULES`.
IN_PLACE_OPS = tuple(op for op, r in OP_RULES.items() if r.in_place)


@dataclass(frozen=True)
class SizeArgs:
    """What a :data:`SIZES` entry is a function of: an instruction's fields (``m`` the effective
    one: ``count`` with :data:`F_M_COUNT`), the expert iterator's ``count`` and ``offset``, the config."""

    m: int
    n: int
    k: int
    flags: int
    width: int
    count: int
    offset: int
    cfg: KpuConfig

    @classmethod
    def of(cls, ins: Instr, cfg: KpuConfig, count: int = 0, offset: int = 0) -> SizeArgs:
        m = count if ins.flags & F_M_COUNT else ins.m
        return cls(m, ins.n, ins.k, ins.flags, ins.width, count, offset, cfg)


#: The sizes :data:`OP_RULES` names: scratchpad words of a region (``a``, ``b``, ``c``) or host
#: bytes (``host``, before rounding up to whole bus beats), as functions of :class:`SizeArgs`.
SIZES = {
    "m*n": lambda s: s.m * s.n,
    "m*k": lambda s: s.m * s.k,
    "m*k*n": lambda s: s.m * s.k * s.n,
    "n": lambda s: s.n,
    "2*n": lambda s: 2 * s.n,                                       # counts and offsets of n experts
    "2*m*n": lambda s: 2 * s.m * s.n,                               # SPLIT's two digits
    "4*m*n": lambda s: 4 * s.m * s.n,                               # REQUANT_WIDE's four partials
    "count*n": lambda s: s.count * s.n,                             # the current expert's rows
    "list": lambda s: s.offset + s.count,                           # the dispatch list up to its tokens
    "rq": lambda s: (2 * (s.n if s.flags & F_RQ_CHANNEL else 1) * (s.cfg.n_experts if s.flags & F_RQ_EXPERT else 1)
                     if s.flags & (F_RQ_CHANNEL | F_RQ_EXPERT) else 0),   # (mult, shift) per column and/or expert
    "gemm_b": lambda s: s.n * s.k if s.flags & F_B_SPAD else SIZES["rq"](s),   # GEMM's B, or its table
    "eps": lambda s: 1 if s.flags & F_EPS else 0,                   # NORM's epsilon word
    "k*n": lambda s: s.k * s.n,                                     # CONV's kernels
    "(m-k+1)*n": lambda s: max(s.m - s.k + 1, 0) * s.n,             # CONV's result rows
    "(k+m)*n": lambda s: (s.k + s.m) * s.n,                         # ATTEND's gate and values
    "n*k*k": lambda s: s.n * s.k * s.k,                             # KDA_STEP's state
    "m*n*(4k+1)": lambda s: s.m * s.n * (4 * s.k + 1),              # ... its vectors
    "m*n*k": lambda s: s.m * s.n * s.k,                             # ... its read-out
    "route": lambda s: route_table(0, s.m, s.cfg)["end"],           # 4*m*top_k + 2*n_experts
    "m*n*width": lambda s: s.m * s.n * s.width,                     # host bytes: LOAD/STORE elements
    "panels": lambda s: 0 if s.flags & F_B_SPAD else -(-s.n // s.cfg.cols) * s.k * bus_bytes(s.cfg),   # GEMM's W
}
assert {getattr(r, f) for r in OP_RULES.values() for f in ("a", "b", "c", "host")} <= {None, *SIZES}


def kda_vectors(q, k, v, decay, beta) -> np.ndarray:
    """``KDA_STEP``'s vector planes, as its ``b`` operand: ``q``, ``k``, ``v``, ``decay`` (``[m, n, K]``
    each), then ``beta [m, n]``, each flattened (``m*n*(4K + 1)`` words)."""
    return np.concatenate([np.ravel(x) for x in (q, k, v, decay, beta)])


def bus_bytes(cfg: KpuConfig) -> int:
    """Bytes of an AXI4 data beat: one weight panel word, ``cols * in_width / 8``."""
    return cfg.cols * cfg.in_width // 8


def weight_panels(W, cfg: KpuConfig):
    """A weight matrix ``W [n, k]`` (int8) as the GEMM engine's B panels: ``[ceil(n/cols), k,
    cols]`` int8, panel ``nb`` word ``kk`` lane ``j`` = ``W[nb*cols + j, kk]`` (0 past ``n``)."""
    W = np.asarray(W, dtype=np.int64)
    n, k = W.shape
    nb = -(-n // cfg.cols)
    padded = np.zeros((nb * cfg.cols, k), dtype=np.int64)
    padded[:n] = W
    return padded.reshape(nb, cfg.cols, k).transpose(0, 2, 1)


def word_width(cfg: KpuConfig) -> int:
    """Bits of a scratchpad word: ``max(32, acc_width)``."""
    return max(32, cfg.acc_width)


def route_table(c: int, T: int, cfg: KpuConfig) -> dict:
    """Word addresses of the parts of a ``ROUTE`` table written at ``c`` for ``T`` tokens."""
    tk, E = T * cfg.top_k, cfg.n_experts
    return {"idx": c, "weights": c + tk, "counts": c + 2 * tk, "offsets": c + 2 * tk + E,
            "list_p": c + 2 * tk + 2 * E, "list_t": c + 3 * tk + 2 * E, "end": c + 4 * tk + 2 * E}


@dataclass(frozen=True)
class Instr:
    """One instruction; unused fields stay 0. ``encode()`` packs it into :data:`INSTR_LAYOUT`."""

    op: int
    flags: int = 0
    m: int = 0
    k: int = 0
    n: int = 0
    a: int = 0
    b: int = 0
    c: int = 0
    host: int = 0
    stride: int = 0
    mult: int = 0
    shift: int = 0
    width: int = 0
    target: int = 0

    def __post_init__(self):
        widths = dict(FIELDS)
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or not 0 <= value < 1 << widths[f.name]:
                raise ValueError(f"Instr.{f.name} = {value!r}: must be an integer in "
                                 f"[0, 2**{widths[f.name]})")

    def encode(self) -> int:
        word, pos = 0, 0
        for name, width in FIELDS:
            word |= getattr(self, name) << pos
            pos += width
        return word

    def words(self) -> list[int]:
        """The 8 little-endian 32-bit words of :meth:`encode`."""
        v = self.encode()
        return [(v >> (32 * i)) & 0xFFFF_FFFF for i in range(INSTR_WORDS)]

    @classmethod
    def decode(cls, word: int) -> Instr:
        values, pos = {}, 0
        for name, width in FIELDS:
            values[name] = (word >> pos) & ((1 << width) - 1)
            pos += width
        return cls(**values)

    def __str__(self) -> str:
        try:
            name = Op(self.op).name
        except ValueError:
            name = f"op{self.op}"
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)[1:] if getattr(self, f.name)]
        return f"{name:8s} " + " ".join(parts)


def encode_program(instrs) -> bytes:
    """The instruction memory image: :data:`INSTR_WORDS` little-endian words per instruction."""
    return b"".join(w.to_bytes(4, "little") for ins in instrs for w in ins.words())
