"""Instruction-level functional simulator of the nano-KPU (NumPy), bit-exact to the RTL.

:class:`FuncSim` executes a program of :mod:`nanokpu.isa` instructions on a scratchpad and a
byte-addressed host memory, with the same range checks, the same error codes and the same
operand widths as the RTL (an operand is wrapped to the width of the unit port it enters, as the
hardware's wires do); the checks' per-op rules are :data:`~nanokpu.isa.OP_RULES`, the RTL's
too. Each instruction is one vectorised call of :mod:`golden.intops`, so a ``small`` block runs
in well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from golden import intops as I
from golden.kda import kda_head_step_int
from golden.mla import attend_int
from nanokpu.config import KpuConfig
from nanokpu.isa import (
    F_ACC,
    F_B_SPAD,
    F_B_T,
    F_EPS,
    F_HOST_EXPERT,
    F_L2,
    F_M_COUNT,
    F_RQ_CHANNEL,
    F_RQ_EXPERT,
    OP_RULES,
    SIZES,
    Err,
    Instr,
    Op,
    SizeArgs,
    built_ops,
    bus_bytes,
    word_width,
)

__all__ = ["Access", "FuncSim", "RunResult", "KpuError", "check"]


class KpuError(Exception):
    """An instruction failed a check; ``code`` is its :class:`~nanokpu.isa.Err`."""

    def __init__(self, code: Err, msg: str = ""):
        super().__init__(f"{code.name}: {msg}")
        self.code = code


@dataclass
class RunResult:
    """Outcome of :meth:`FuncSim.run`: ``error`` (:class:`Err`), ``pc`` where it stopped,
    ``retired`` instructions, ``op_counts`` (executions per opcode) and ``macs`` (multiply-
    accumulates of the executed GEMMs, ``sum m*k*n``), ``gemms`` (their ``(m, k, n)``),
    ``trace`` (an :class:`Access` per retired instruction, in order)."""

    error: Err
    pc: int
    retired: int
    op_counts: dict
    macs: int = 0
    gemms: list = field(default_factory=list)
    trace: list = field(default_factory=list)


@dataclass(frozen=True)
class Access:
    """What one executed instruction touches, as the decode's checks see it (:data:`OP_RULES`):
    ``reads`` and ``writes`` are half-open ``(space, lo, hi)`` intervals, ``space`` ``"spad"``
    (words) or ``"host"`` (bytes, whole bus beats). ``executor`` is its :data:`OP_RULES`
    executor (``None``: the controller's ``JUMP``, ``EXPERT``); ``scanned``: the experts an
    ``EXPERT`` looked at."""

    pc: int
    op: Op
    executor: str | None
    reads: tuple = ()
    writes: tuple = ()
    scanned: int = 0


def check(cond: bool, code: Err, msg: str = ""):
    if not cond:
        raise KpuError(code, msg)


class FuncSim:
    """The nano-KPU's architectural state and an interpreter for its programs.

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``dmem_depth``, ``imem_depth``, ``n_experts``, ``top_k``, the formats and rounding.
    host : bytes-like
        Initial host memory (addresses start at 0); :attr:`host` is a mutable copy.
    host_base, host_size : int
        The host window the program may touch (default: the whole host memory).
    gemm : callable, optional
        The GEMM engine: ``gemm(a, b, mult, shift)`` for int8 ``a`` ``[M, K]`` and ``b``
        ``[K, N]`` returns ``requantize(matmul_int(a, b, acc_width), mult, shift, acc_width)``
        ``[M, N]`` (:func:`~nanokpu.units.gemm.kpu_engine`'s contract; ``mult = 1``, ``shift = 0``
        for raw accumulators); a ``GEMM`` instruction saturates it to its ``width``. The
        default computes it with :mod:`golden.intops`; ``nanokpu board-run --board
        icebreaker`` passes the iCEBreaker build's engine (:func:`nanokpu.host.bridge_client.run_gemm`).

    Members
    -------
    spad : np.ndarray
        ``dmem_depth`` int64 words (values wrapped to :func:`~nanokpu.isa.word_width` bits).
    loads : np.ndarray
        The routing load counters (saturating at ``2**load_width - 1``).
    """

    def __init__(self, cfg: KpuConfig, host=b"", host_base: int = 0, host_size: int | None = None,
                 gemm=None):
        self.cfg = cfg
        self.ops = {int(o) for o in built_ops(cfg)}
        self.gemm = gemm or self._gemm
        self.host = bytearray(host)
        self.host_base = host_base
        self.host_size = len(self.host) - host_base if host_size is None else host_size
        self.spad = np.zeros(cfg.dmem_depth, dtype=np.int64)
        self.loads = np.zeros(cfg.n_experts, dtype=np.int64)
        self.ww = word_width(cfg)

    # -- helpers ---------------------------------------------------------------------------
    def _gemm(self, a, b, mult: int, shift: int) -> np.ndarray:
        acc = self.cfg.acc_width
        return I.requantize(I.matmul_int(a, b, acc), mult, shift, acc, self.cfg.rounding)

    def _region(self, addr: int, words: int):
        check(addr + words <= self.cfg.dmem_depth, Err.SPAD_RANGE,
              f"[{addr}, {addr + words}) beyond dmem_depth={self.cfg.dmem_depth}")

    def _read(self, addr: int, words: int, width: int | None = None) -> np.ndarray:
        v = self.spad[addr:addr + words]
        return I.wrap(v, width) if width else v.copy()

    def _write(self, addr: int, values):
        v = np.asarray(values, dtype=np.int64).ravel()
        self.spad[addr:addr + v.size] = I.wrap(v, self.ww)

    def _need_expert(self):
        check(self.route_done and 0 <= self.expert < self.cfg.n_experts, Err.NO_ROUTE,
              "no current expert (no ROUTE/EXPERT before)")

    # -- execution -------------------------------------------------------------------------
    def run(self, instrs, max_steps: int = 1_000_000) -> RunResult:
        """Run from pc 0 until ``HALT`` or an error; instructions beyond ``imem_depth`` are
        outside the instruction memory (``PC_RANGE``)."""
        instrs = list(instrs)
        self.route_done, self.expert, self.count, self.offset = False, -1, 0, 0
        self.scores = None
        pc, retired, counts = 0, 0, {}
        self.macs, self.gemms, self.trace = 0, [], []
        for _ in range(max_steps):
            try:
                check(pc < self.cfg.imem_depth, Err.PC_RANGE, f"pc {pc}")
                ins = instrs[pc] if pc < len(instrs) else Instr(Op.HALT)
                check(ins.op in self.ops, Err.BAD_OPCODE, f"opcode {ins.op} at pc {pc}")
                op = Op(ins.op)
                if op == Op.HALT:
                    return RunResult(Err.NONE, pc, retired, counts, self.macs, self.gemms, self.trace)
                nxt = self.step(ins, op, pc)
            except KpuError as exc:
                return RunResult(exc.code, pc, retired, counts, self.macs, self.gemms, self.trace)
            counts[op.name] = counts.get(op.name, 0) + 1
            self.trace.append(self.access)
            retired += 1
            pc = nxt
        raise RuntimeError(f"no HALT within {max_steps} instructions")

    def step(self, ins: Instr, op: Op, pc: int) -> int:
        """Execute one instruction; returns the next pc or raises :class:`KpuError`."""
        cfg = self.cfg
        E = cfg.n_experts
        rule = OP_RULES[op]
        if ins.flags & (F_M_COUNT | F_HOST_EXPERT | F_RQ_EXPERT) or rule.expert:
            self._need_expert()
        if rule.route:
            check(self.route_done, Err.NO_ROUTE, f"{op.name} without a ROUTE before")
        size = SizeArgs.of(ins, cfg, self.count, self.offset)
        m, n, k, a, b, c = size.m, ins.n, ins.k, ins.a, ins.b, ins.c
        ln = m * n
        if rule.target:
            check(ins.target < cfg.imem_depth, Err.PC_RANGE, f"target {ins.target}")
        self.access = Access(pc, op, rule.executor)
        if op == Op.JUMP:
            return ins.target
        # -- shapes (OP_RULES)
        letters = {"m": m, "n": n, "k": k}
        check(all(letters[x] >= 1 for x in rule.positive), Err.BAD_SHAPE,
              f"{op.name} needs {', '.join(rule.positive)} >= 1")
        check(not rule.n_experts or n == E, Err.BAD_SHAPE, f"{op.name} needs n = n_experts")
        check(not rule.top_k or k == cfg.top_k, Err.BAD_SHAPE, f"{op.name} needs k = top_k")
        check(not rule.softmax_row or n <= cfg.attnres_candidates, Err.BAD_SHAPE,
              f"{op.name} needs n <= attnres_candidates = {cfg.attnres_candidates}")
        check(rule.width_ok(ins.width, cfg), Err.BAD_SHAPE, f"{op.name} width {ins.width} not in {rule.widths}")
        check(rule.b_spad_ok(ins.flags, cfg), Err.BAD_SHAPE,
              f"{op.name} with F_B_SPAD needs layer_ops and no F_RQ_EXPERT, F_RQ_CHANNEL or F_HOST_EXPERT;"
              " F_B_T needs F_B_SPAD")
        check(not rule.taps or k <= m, Err.BAD_SHAPE, f"{op.name} needs k <= m")
        check(not rule.head_dim or k == cfg.kda_head_dim, Err.BAD_SHAPE, f"{op.name} needs k = kda_head_dim")
        check(not rule.keys or m <= k <= cfg.mla_max_tokens and n <= cfg.v_head_dim, Err.BAD_SHAPE,
              f"{op.name} needs m <= k <= mla_max_tokens = {cfg.mla_max_tokens}, n <= v_head_dim = {cfg.v_head_dim}")
        check(rule.layer_flags_ok(ins.flags, cfg), Err.BAD_SHAPE,
              f"{op.name} with flags {ins.flags & rule.layer_flags:#x} needs layer_ops")
        if rule.engine:
            mb = -(-m // cfg.rows)
            check(k <= cfg.spad_b_depth // 2 and mb * k <= cfg.spad_a_depth
                  and mb * n <= cfg.spad_c_depth, Err.BAD_SHAPE, "GEMM beyond the engine's scratchpads")
        if rule.scores:
            check(self.scores == (a, ln), Err.NO_SCORES, f"{op.name} before SIGMOID wrote its scores")
        # -- scratchpad regions (OP_RULES; a size of 0 is no region): the operands', then the result's
        def region(addr, name):
            words = SIZES[name](size) if name else 0
            return (addr, words) if words else None

        operands = [r for r in (region(a, rule.a), region(b, rule.b)) if r]
        result = region(c, rule.c)
        for addr, words in operands + ([result] if result else []):
            self._region(addr, words)
        if rule.a_written and len(operands) == 2:
            (xa, wa), (xb, wb) = operands
            check(not (xa < xb + wb and xb < xa + wa), Err.OVERLAP,
                  f"{op.name}'s a [{xa}, {xa + wa}) (written) overlaps b [{xb}, {xb + wb})")
        if result:
            rc, wc = result
            for addr, words in operands:
                in_place = rule.in_place and (addr, words) == result
                check(not (words and wc and addr < rc + wc and rc < addr + words) or in_place,
                      Err.OVERLAP, f"result [{rc}, {rc + wc}) overlaps operand [{addr}, {addr + words})")
        # -- host window (a size of 0 is no host access)
        host = rule.host and SIZES[rule.host](size)
        if host:
            addr = ins.host + (self.expert * ins.stride if ins.flags & F_HOST_EXPERT else 0)
            bb = bus_bytes(cfg)
            nbytes = -(-host // bb) * bb  # whole bus beats
            check(addr % bb == 0 and self.host_base <= addr
                  and addr + nbytes <= self.host_base + self.host_size
                  and addr + nbytes <= len(self.host), Err.HOST_RANGE,
                  f"host [{addr:#x}, {addr + nbytes:#x}) outside the window")
        spad = [("spad", addr, addr + words) for addr, words in operands]
        reads, writes = spad, [("spad", result[0], result[0] + result[1])] if result else []
        if host:
            (writes if op == Op.STORE else reads).append(("host", addr, addr + nbytes))
        self.access = Access(pc, op, rule.executor, tuple(reads), tuple(writes))
        # -- execute
        act, ww = cfg.act_width, self.ww
        if op == Op.LOAD:
            dtype = {1: "<i1", 2: "<i2", 4: "<i4"}[ins.width]
            self._write(c, np.frombuffer(bytes(self.host[addr:addr + ln * ins.width]), dtype=dtype))
        elif op == Op.STORE:
            self.host[addr:addr + ln * 4] = I.wrap(self._read(a, ln), 32).astype("<i4").tobytes()
        elif op == Op.GEMM:
            A = self._read(a, m * k, cfg.in_width).reshape(m, k)
            if ins.flags & F_B_SPAD:
                B = self._read(b, n * k, cfg.in_width)
                B = B.reshape(k, n) if ins.flags & F_B_T else B.reshape(n, k).T
            else:
                panels = np.frombuffer(bytes(self.host[addr:addr + nbytes]), dtype=np.int8)
                B = panels.reshape(-1, k, cfg.cols).transpose(1, 0, 2).reshape(k, -1)[:, :n]
            if ins.width and ins.flags & F_RQ_CHANNEL:   # the raw accumulators, requantised per column
                out = I.requantize(self.gemm(A, B, 1, 0), *self._rq_columns(ins), cfg.acc_width, cfg.rounding)
            else:
                out = self.gemm(A, B, *(self._rq_consts(ins) if ins.width else (1, 0)))
            self._write(c, I.saturate(out, ins.width) if ins.width else out)
            self.macs += m * k * n
            self.gemms.append((m, k, n))
        elif op == Op.REQUANT:
            v = self._read(a, ln, cfg.acc_width).reshape(m, n)
            rq = self._rq_columns(ins) if ins.flags & F_RQ_CHANNEL else self._rq_consts(ins)
            self._write(c, I.requantize(v, *rq, ins.width, cfg.rounding))
        elif op == Op.SPLIT:
            self._write(c, I.split_digits(self._read(a, ln, 2 * cfg.in_width), cfg.in_width))
        elif op == Op.REQUANT_WIDE:
            v = I.join_partials(*self._read(a, 4 * ln, cfg.acc_width).reshape(4, m, n), cfg.in_width,
                                cfg.router_acc_width)
            rq = self._rq_columns(ins) if ins.flags & F_RQ_CHANNEL else self._rq_consts(ins)
            self._write(c, I.requantize(v, *rq, ins.width, cfg.rounding))
        elif op == Op.SIGMOID:
            self._write(c, I.sigmoid_q(self._read(a, ln, cfg.router_logit_width), cfg))
            self.scores = (c, ln)
        elif op == Op.SILU:
            self._write(c, I.silu_q(self._read(a, ln, act), cfg))
        elif op == Op.DECAY:
            self._write(c, I.decay_q(self._read(a, ln, act), cfg))
        elif op == Op.SOFTMAX:
            self._write(c, I.softmax_int(self._read(a, ln, act).reshape(m, n), cfg))
        elif op == Op.MUL:
            prod = self._read(a, ln, act).reshape(m, n) * self._read(b, n, cfg.mul_factor_width)
            self._write(c, I.saturate(I.round_shift(prod, ins.shift, cfg.rounding), cfg.out_width))
        elif op == Op.KDA_STEP:
            self._kda_step(ins, m, n, k)
        elif op == Op.ATTEND:
            g = self._read(b, ln) & ((1 << cfg.score_width) - 1)
            self._write(c, attend_int(self._read(a, m * k, act).reshape(m, k),
                                      self._read(b + ln, k * n, cfg.in_width).reshape(k, n), g.reshape(m, n), cfg))
        elif op == Op.CONV:
            W = self._read(b, n * k, cfg.in_width).reshape(n, k)
            self._write(c, I.short_conv_int(self._read(a, ln, act).reshape(m, n), W, cfg.acc_width))
        elif op == Op.SITU:
            self._write(c, I.situ_q(self._read(a, ln, act), self._read(b, ln, act), cfg))
        elif op == Op.ADD:
            w = cfg.acc_width if ins.flags & F_ACC else act
            self._write(c, I.add_sat(self._read(a, ln, w), self._read(b, ln, w), w))
        elif op == Op.NORM:
            eps_q = int(self.spad[b]) & ((1 << 2 * act) - 1) if ins.flags & F_EPS else None
            rows = self._read(a, ln, act).reshape(m, n)
            if ins.flags & F_L2:
                self._write(c, I.l2norm_int(rows, cfg.kda_unit_frac, cfg, eps_q))
            else:
                self._write(c, I.rmsnorm_int(rows, cfg, eps_q))
        elif op == Op.COMBINE:
            e = self._read(a, m * k * n, act).reshape(m, k, n)
            w = (self._read(b, m * k) & ((1 << cfg.weight_width) - 1)).reshape(m, k)
            self._write(c, I.combine_int(e, w, cfg))
        elif op == Op.ROUTE:
            self._route(a, b, c, m)
        elif op == Op.EXPERT:
            counts = self._read(a, n)
            nz = [j for j in range(self.expert + 1, E) if counts[j] != 0]
            scanned = (nz[0] + 1 if nz else E) - max(self.expert + 1, 0)
            self.access = Access(pc, op, None, self.access.reads, scanned=max(scanned, 0))
            if not nz:
                self.expert = E
                return ins.target
            self.expert = nz[0]
            self.count = int(counts[self.expert])
            self.offset = int(self.spad[a + n + self.expert])
        elif op in (Op.GATHER, Op.SCATTER):
            lst = self._read(b + self.offset, self.count, ww)
            for i, r in enumerate(lst):
                check(0 <= r < m, Err.SPAD_RANGE, f"{op.name} row {r} >= m = {m}")
                if op == Op.GATHER:
                    self._write(c + i * n, self._read(a + int(r) * n, n))
                else:
                    self._write(c + int(r) * n, self._read(a + i * n, n))
        return pc + 1

    def _rq_consts(self, ins: Instr) -> tuple[int, int]:
        """``(mult, shift)`` of a requantiser: the instruction's, or with :data:`F_RQ_EXPERT` the
        current expert's from the table at ``b`` (``mult_width`` and 6 bits taken)."""
        if ins.flags & F_RQ_EXPERT:
            mult, shift = (int(v) for v in self._read(ins.b + 2 * self.expert, 2))
        else:
            mult, shift = ins.mult, ins.shift
        return mult & ((1 << self.cfg.mult_width) - 1), shift & 63

    def _kda_step(self, ins: Instr, m: int, n: int, K: int):
        """``KDA_STEP``: golden :func:`~golden.kda.kda_head_step_int` token after token, the state at
        ``a`` written back after each (as the executor does), the read-out requantised to ``c``."""
        cfg, act, sw = self.cfg, self.cfg.act_width, self.cfg.score_width
        S = self._read(ins.a, n * K * K, cfg.kda_state_width).reshape(n, K, K)
        P = m * n * K
        q, k, v = (self._read(ins.b + i * P, P, act).reshape(m, n, K) for i in range(3))
        decay = (self._read(ins.b + 3 * P, P) & ((1 << sw) - 1)).reshape(m, n, K)
        beta = (self._read(ins.b + 4 * P, m * n) & ((1 << sw) - 1)).reshape(m, n)
        for t in range(m):
            S, r = kda_head_step_int(S, decay[t], k[t], v[t], beta[t], q[t], cfg)
            self._write(ins.a, S)
            self._write(ins.c + t * n * K, I.requantize(r, ins.mult & ((1 << cfg.mult_width) - 1), ins.shift,
                                                       ins.width, cfg.rounding))

    def _rq_columns(self, ins: Instr) -> tuple[np.ndarray, np.ndarray]:
        """``(mult [n], shift [n])`` of a ``GEMM`` with :data:`F_RQ_CHANNEL`: column ``j``'s entry
        of the table at ``b``, ``2*(j*E + e)`` (:mod:`nanokpu.isa`), masked like :meth:`_rq_consts`."""
        E, e = (self.cfg.n_experts, self.expert) if ins.flags & F_RQ_EXPERT else (1, 0)
        table = self._read(ins.b, 2 * ins.n * E).reshape(ins.n, E, 2)[:, e]
        return table[:, 0] & ((1 << self.cfg.mult_width) - 1), table[:, 1] & 63

    def _route(self, a: int, b: int, c: int, T: int):
        cfg = self.cfg
        E = cfg.n_experts
        scores = (self._read(a, T * E) & ((1 << cfg.score_width) - 1)).reshape(T, E)
        bias = self._read(b, E, cfg.bias_width)
        idx, w, loads = I.route_int(scores, bias, cfg)
        flat = idx.ravel()
        order = np.argsort(flat, kind="stable")
        counts = np.bincount(flat, minlength=E)
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        table = np.concatenate([flat, w.ravel(), counts, offsets, order, order // cfg.top_k])
        self._write(c, table)
        self.loads = np.minimum(self.loads + loads, (1 << cfg.load_width) - 1)
        self.route_done, self.expert, self.count, self.offset = True, -1, 0, 0
