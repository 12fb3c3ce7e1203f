"""Fault campaign on the whole nano-KPU (nanokpu.kpu.top.NanoKPU), through its buses only.

One long cocotb test, :func:`campaign`, runs a random mix of episodes on one design, with
random idle and backpressure on every AXI channel (:class:`sim.lib.kpu_tb.TB`):

* ``valid`` - a random LatentMoE block (1..``tokens`` tokens) compiled and run end to end;
  it must stop with ``done`` at its ``HALT``, and its outputs, routes, weights and the load
  counters must be bit-exact to ``golden.block.latent_moe_int``.
* ``fuzz`` - a random program mixing well-formed instructions (every field in range, so both
  models execute them) and random ones (bad opcodes, random shapes, addresses, widths, flags,
  jump targets), after a prologue that loads the first ``SPAD_WORDS`` scratchpad words from
  host memory so that the state is known, and before an epilogue that stores them back (to
  ``DUMP``), so that results no instruction stored are compared too.
  :class:`nanokpu.host.funcsim.FuncSim` runs the same program: when it stops (``HALT`` or an error)
  the RTL must stop with the same error code, pc and done flag, and leave the host window byte
  for byte as FuncSim does; when it does not stop (a jump loop) the RTL must still be running
  and the bus answering, and a soft reset stops it.
* ``bus`` - a burst of random AXI4-Lite writes (registers, including random CTRL bits that may
  start whatever the instruction memory holds, instruction memory, the load counters' read-only
  window, unmapped addresses), idle or mid-run; the bus must keep answering, a soft reset must
  bring the controller to idle.
* ``reset`` - a valid block started, then a hard reset (``rst``) or a soft reset (``CTRL.bit1``)
  at a random cycle of its run.

After every episode: host memory outside the program's window (a canary region) is unchanged,
and every bus access answers within ``BUS_TIMEOUT`` cycles; a program that does not stop within
its watchdog is a hang. After every fault (fuzz, bus, reset) the next episode is a valid block,
so recovery is checked bit for bit. Failures are counted, not raised at once (after one the
design is hard-reset and the campaign goes on); the test fails at the end if any occurred.

The design's config comes from :func:`sim.runner.bench_config`. Parameters (``NANOKPU_PARAMS``):
``seed``, ``episodes``, ``tokens`` (max per valid block), ``pause`` (idle/backpressure
probability), ``summary`` (JSON path for the counts). Run through
:func:`sim.lib.kpu_launch.run_kpu_bench`.
"""

from __future__ import annotations

import json
import random

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, with_timeout
from cocotb.utils import get_sim_time

from golden.block import latent_moe_int, random_block
from nanokpu.host.compiler import compile_block
from nanokpu.host.funcsim import FuncSim
from nanokpu.isa import (
    IMEM_BASE,
    INSTR_WORDS,
    LOADS_BASE,
    Err,
    Instr,
    Op,
    Reg,
    ctrl_word,
    encode_program,
    route_table,
    status_fields,
)
from sim.lib.kpu_tb import TB, stop_status
from sim.runner import bench_params

#: Cycles any single AXI4-Lite access may take before the bus counts as hung.
BUS_TIMEOUT = 20_000
#: Watchdog of a fuzz program (they are short: at most a few hundred elements per instruction).
FUZZ_WATCHDOG = 200_000
#: Watchdog of a valid block.
BLOCK_WATCHDOG = 5_000_000
#: Host bytes the fuzzed instructions address (random bytes), then a canary region that must
#: never change.
WINDOW = 4096
CANARY = 4096
#: Scratchpad words loaded by the fuzz prologue; fuzz addresses stay below SPAD_WORDS - 64 or
#: are out of range, so every word a fuzz program can read is known.
SPAD_WORDS = 512
#: A fuzz program's host window: WINDOW, then DUMP, where its epilogue stores the first
#: SPAD_WORDS scratchpad words (so results no instruction stored are compared too).
DUMP = WINDOW
HOST_END = WINDOW + 4 * SPAD_WORDS
#: Opcodes of fuzzed instructions: all but HALT (it ends the program).
FUZZ_OPS = [op for op in Op if op != Op.HALT]
#: FuncSim steps after which a fuzz program counts as non-terminating (a jump loop).
FUZZ_STEPS = 64


def _busy_or_error(status: int) -> bool:
    """Whether a STATUS word says busy or holds an error (a reset must clear both)."""
    s = status_fields(status)
    return bool(s.busy or s.error or s.code)


class BusHang(Exception):
    """An AXI4-Lite access did not complete within BUS_TIMEOUT cycles."""


class Campaign:
    def __init__(self, tb: TB):
        self.tb = tb
        self.cfg = tb.cfg
        self.rng = random.Random(tb.seed)
        self.counts = {k: 0 for k in (
            "episodes", "valid_programs", "fuzz_programs", "fuzz_instructions", "fuzz_errors", "fuzz_nonterminating",
            "fuzz_dumps", "bus_bursts", "bus_writes", "hard_resets", "soft_resets", "failures", "hangs", "bus_hangs",
            "wrong_outputs", "writes_outside", "status_mismatches", "compiler_refusals")}
        self.failures: list[str] = []

    # -- bus access with a watchdog ------------------------------------------------------------
    async def rd(self, addr: int) -> int:
        try:
            return await with_timeout(self.tb.rd(addr), BUS_TIMEOUT * 10, "ns")
        except cocotb.triggers.SimTimeoutError:
            raise BusHang(f"read {addr:#x}") from None

    async def wr(self, addr: int, value: int):
        try:
            await with_timeout(self.tb.wr(addr, value), BUS_TIMEOUT * 10, "ns")
        except cocotb.triggers.SimTimeoutError:
            raise BusHang(f"write {addr:#x}") from None

    async def wait_stop(self, limit: int):
        """Poll STATUS until not busy: ``(err, pc, done)``, or None after ``limit`` cycles."""
        waited = 0
        while waited < limit:
            stopped = stop_status(await self.rd(Reg.STATUS))
            if stopped is not None:
                return stopped
            poll = min(2000, 10 + waited // 4)
            await ClockCycles(self.tb.dut.clk, poll)
            waited += poll
        return None

    async def soft_reset(self):
        await self.wr(Reg.CTRL, ctrl_word(soft_reset=1))
        self.counts["soft_resets"] += 1
        if await self.wait_stop(BUS_TIMEOUT) is None:
            raise AssertionError("still busy after a soft reset")
        status = await self.rd(Reg.STATUS)
        assert not _busy_or_error(status), f"status {status:#x} after a soft reset"

    # -- canary outside the program's window ---------------------------------------------------
    def set_canary(self, start: int):
        self.canary_at = start
        self.canary = bytes(self.rng.randrange(256) for _ in range(CANARY))
        self.tb.ram.write(start, self.canary)

    def check_canary(self):
        if self.tb.ram.read(self.canary_at, CANARY) != self.canary:
            self.counts["writes_outside"] += 1
            raise AssertionError(f"host memory written outside the window (at {self.canary_at:#x}+)")

    # -- episodes ------------------------------------------------------------------------------
    def block(self):
        """A random block that the compiler accepts: ``(seed, tokens, Q, xq, program)``.

        The quantiser refuses some random blocks (a requantiser scale beyond ``mult_width``):
        those are counted and another seed is drawn."""
        while True:
            seed = self.rng.randrange(1 << 30)
            tokens = self.rng.randint(1, int(self.tb.p.get("tokens", 4)))
            try:
                Q, xq, _, _ = random_block(self.cfg, tokens, np.random.default_rng(seed))
                return seed, tokens, Q, xq, compile_block(Q, xq, self.cfg)
            except ValueError as exc:
                self.counts["compiler_refusals"] += 1
                self.tb.dut._log.info(f"block seed {seed} refused by the compiler: {exc}")

    async def valid(self):
        tb, cfg = self.tb, self.cfg
        seed, tokens, Q, xq, prog = self.block()
        ref = latent_moe_int(xq, Q, cfg)
        self.set_canary(len(prog.image))
        await self.wr(Reg.CTRL, ctrl_word(clear_loads=1))                                      # clear the load counters
        await tb.load(prog.instrs, prog.image)
        await self.wr(Reg.CTRL, ctrl_word(start=1))
        got = await self.wait_stop(BLOCK_WATCHDOG)
        if got is None:
            self.counts["hangs"] += 1
            raise AssertionError(f"valid block seed {seed}: no stop within {BLOCK_WATCHDOG} cycles")
        out = prog.outputs(tb.ram.read(0, len(prog.image)))
        loads = np.array([await self.rd(LOADS_BASE + 4 * j) for j in range(cfg.n_experts)])
        wrong = [key for key in ("y", "idx", "weights", "loads") if not np.array_equal(out[key], ref[key])]
        if not np.array_equal(loads, np.minimum(ref["loads"], (1 << cfg.load_width) - 1)):
            wrong.append("load counters")
        if got != (Err.NONE, len(prog.instrs) - 1, True) or wrong:
            self.counts["wrong_outputs"] += 1
            raise AssertionError(f"valid block seed {seed} ({tokens} tokens): stopped with {Err(got[0]).name} "
                                 f"at pc {got[1]}, done {got[2]}; differs from latent_moe_int in {wrong}")
        self.counts["valid_programs"] += 1
        self.check_canary()

    def fuzz_instr(self) -> Instr:
        r, cfg = self.rng, self.cfg
        D = cfg.dmem_depth
        if r.random() < 0.12:
            return Instr(r.randrange(len(Op), 64))                       # unknown opcode
        op = r.choice(FUZZ_OPS)
        small = [0, 1, 2, 3, 4, 5, 8, 16, cfg.n_experts, cfg.top_k]
        dims = {f: r.choice(small + [r.randrange(1 << 16)] * (r.random() < 0.05)) for f in ("m", "k", "n")}
        addr = {f: r.choice([r.randrange(SPAD_WORDS - 320), r.randrange(SPAD_WORDS - 320),
                             D - r.randrange(1, 4), D + r.randrange(64), (1 << 24) - 1])
                for f in ("a", "b", "c")}
        host = r.choice([4 * r.randrange(WINDOW // 4), 4 * r.randrange(WINDOW // 4), HOST_END - 4,
                         HOST_END + 4 * r.randrange(64), r.randrange(WINDOW) | 1, (1 << 32) - 4])
        return Instr(op, flags=r.choice([0, 0, 0, 1, 2, 4, r.randrange(1 << 10)]), **dims, **addr, host=host,
                     stride=r.choice([0, 4, 64, r.randrange(1 << 32)]), mult=r.randrange(1 << 32),
                     shift=r.randrange(64), width=r.choice([0, 1, 2, 3, 4, 4, 8, r.randrange(64)]),
                     target=r.choice([r.randrange(cfg.imem_depth), r.randrange(cfg.imem_depth, 1 << 12)]))

    def wellformed_instr(self) -> list[Instr]:
        """One instruction (or SIGMOID + ROUTE, maybe + EXPERT) whose every field is in range, so that
        FuncSim and the RTL both execute it; operands within the first SPAD_WORDS words."""
        r, cfg = self.rng, self.cfg
        m, n, k = r.randint(1, 4), r.randint(1, 16), r.randint(1, 4)
        # regions: disjoint (a < 40 holds up to 256 words, b < 30 up to 64 from 300, c from 400),
        # else random (overlaps stop with OVERLAP), sometimes in place (c = a)
        a, b, c = r.randrange(40), 300 + r.randrange(30), 400 + r.randrange(40)
        if r.random() < 0.3:
            a, b, c = (r.randrange(256) for _ in range(3))
        elif r.random() < 0.2:
            c = a

        def host(nbytes):
            return 4 * r.randrange((WINDOW - nbytes) // 4 + 1)

        op = r.choice([Op.LOAD, Op.STORE, Op.GEMM, Op.REQUANT, Op.SIGMOID, Op.SITU, Op.ADD, Op.COMBINE,
                       Op.NORM, Op.ROUTE])
        if op == Op.LOAD:
            width = r.choice([1, 2, 4])
            return [Instr(op, m=m, n=n, c=c, host=host(m * n * width), width=width)]
        if op == Op.STORE:
            return [Instr(op, m=m, n=n, a=a, host=host(m * n * 4), width=4)]
        if op == Op.GEMM:
            panel_bytes = -(-n // cfg.cols) * k * cfg.cols * cfg.in_width // 8
            return [Instr(op, m=m, k=k, n=n, a=a, c=c, host=host(panel_bytes), width=r.choice([0, 8, 16]),
                          mult=r.randrange(1 << cfg.mult_width), shift=r.randrange(32))]
        if op == Op.REQUANT:
            return [Instr(op, m=m, n=n, a=a, c=c, width=r.choice([8, 16]), mult=r.randrange(1 << cfg.mult_width),
                          shift=r.randrange(32))]
        if op == Op.ROUTE:
            t, e, table = r.randint(1, 4), cfg.n_experts, r.choice([a, r.randrange(256)])   # over the logits
            route = [Instr(Op.SIGMOID, m=t, n=e, a=a, c=c), Instr(Op.ROUTE, m=t, n=e, k=cfg.top_k, a=c, b=b, c=table)]
            if r.random() < 0.5:     # then step the expert iterator over the table just written
                route.append(Instr(Op.EXPERT, n=e, a=route_table(table, t, cfg)["counts"],
                                   target=r.randrange(cfg.imem_depth)))
            return route
        return [Instr(op, m=m, k=k, n=n, a=a, b=b, c=c)]

    async def fuzz(self):
        r, tb = self.rng, self.tb
        body = []
        for _ in range(r.randint(1, 6)):
            body += self.wellformed_instr() if r.random() < 0.6 else [self.fuzz_instr()]
        prog = [Instr(Op.LOAD, m=1, n=SPAD_WORDS, c=0, host=0, width=4), *body,
                Instr(Op.STORE, m=1, n=SPAD_WORDS, a=0, host=DUMP, width=4)]
        prog += [Instr(Op.HALT)] * (self.cfg.imem_depth - len(prog))    # no stale instruction left
        image = bytes(r.randrange(256) for _ in range(HOST_END))
        tb.ram.write(0, image)
        self.set_canary(HOST_END)
        sim = FuncSim(self.cfg, image, 0, HOST_END)
        try:
            expected = sim.run(prog, max_steps=FUZZ_STEPS)
        except RuntimeError:
            expected = None                                               # a jump loop
        await tb.axil.write(IMEM_BASE, encode_program(prog))
        await self.wr(Reg.HOST_BASE, 0)
        await self.wr(Reg.HOST_SIZE, HOST_END)
        await self.wr(Reg.CTRL, ctrl_word(start=1))
        self.counts["fuzz_programs"] += 1
        self.counts["fuzz_instructions"] += len(body)
        self.counts["fuzz_errors"] += expected is not None and expected.error != Err.NONE
        desc = f"fuzz program [{'; '.join(str(i) for i in body)}]"
        if expected is None:
            self.counts["fuzz_nonterminating"] += 1
            await ClockCycles(tb.dut.clk, r.randrange(100, 3000))
            await self.rd(Reg.HOST_SIZE)                                  # the bus answers mid-loop
            await self.soft_reset()
            self.check_canary()
            return
        got = await self.wait_stop(FUZZ_WATCHDOG)
        if got is None:
            self.counts["hangs"] += 1
            status, retired = await self.rd(Reg.STATUS), await self.rd(Reg.INSTRS)
            raise AssertionError(f"{desc}: no stop within {FUZZ_WATCHDOG} cycles, STATUS {status:#x}, "
                                 f"{retired} instructions retired "
                                 f"(FuncSim: {expected.error.name} at pc {expected.pc})")
        want = (int(expected.error), expected.pc, expected.error == Err.NONE)
        if got != want:
            self.counts["status_mismatches"] += 1
            raise AssertionError(f"{desc}: RTL stopped with {Err(got[0]).name} at pc {got[1]} done {got[2]}, "
                                 f"FuncSim {expected.error.name} at pc {expected.pc}")
        self.check_canary()
        # the run ended at the HALT after the epilogue: the dump was compared
        self.counts["fuzz_dumps"] += expected.error == Err.NONE and expected.pc == len(body) + 2
        got_host, want_host = tb.ram.read(0, HOST_END), bytes(sim.host[:HOST_END])
        if got_host != want_host:
            self.counts["wrong_outputs"] += 1
            first = next(i for i, (g, w) in enumerate(zip(got_host, want_host, strict=True)) if g != w)
            where = (f"scratchpad word {(first - DUMP) // 4} (the epilogue's dump)" if first >= DUMP
                     else f"host byte {first:#x}")
            raise AssertionError(f"{desc}: host window differs from FuncSim's, first at {where}")
        await self.soft_reset()

    async def bus(self):
        r, tb, cfg = self.rng, self.tb, self.cfg
        self.counts["bus_bursts"] += 1
        for _ in range(r.randint(1, 24)):
            kind = r.random()
            if kind < 0.35:
                addr = 4 * r.randrange(0x50 // 4)                          # the register bank
            elif kind < 0.7:
                addr = IMEM_BASE + 4 * r.randrange(INSTR_WORDS * (cfg.imem_depth + 2))
            elif kind < 0.85:
                addr = LOADS_BASE + 4 * r.randrange(cfg.n_experts + 4)      # read-only counters
            else:
                addr = 4 * r.randrange(1 << 18)                            # anywhere
            value = r.randrange(1 << 32)
            if addr == Reg.CTRL and r.random() < 0.5:
                value &= ~1                                                # start less often
            await self.wr(addr, value)
            self.counts["bus_writes"] += 1
            if r.random() < 0.2:
                await ClockCycles(tb.dut.clk, r.randrange(1, 500))
        await self.rd(Reg.STATUS)
        await self.rd(Reg.HOST_SIZE)
        await self.rd(LOADS_BASE)
        await self.soft_reset()

    async def reset(self, hard: bool | None = None):
        """A valid block started, then a hard or soft reset (``hard``; None: either, at random)
        at a random point of its run."""
        r, tb = self.rng, self.tb
        prog = self.block()[-1]
        self.set_canary(len(prog.image))
        await tb.load(prog.instrs, prog.image)
        await self.wr(Reg.CTRL, ctrl_word(start=1))
        await ClockCycles(tb.dut.clk, r.randrange(1, 20_000))
        if r.random() < 0.5 if hard is None else hard:
            self.counts["hard_resets"] += 1
            await tb.reset()
        else:
            await self.soft_reset()
        status = await self.rd(Reg.STATUS)
        assert not _busy_or_error(status), f"status {status:#x} after a reset mid-run"
        self.check_canary()

    async def hard_reset(self):
        await self.reset(hard=True)

    async def soft_reset_mid_run(self):
        await self.reset(hard=False)

    async def recover(self):
        """After a failure: hard reset, so the campaign goes on from a known state."""
        await self.tb.reset()
        self.counts["hard_resets"] += 1

    async def run(self, episodes: int):
        kinds = ["valid", "fuzz", "fuzz", "fuzz", "bus", "reset"]
        first = ["valid", "fuzz", "bus", "hard_reset", "soft_reset_mid_run"]   # every kind once, then at random
        after_fault = False
        for i in range(episodes):
            kind = "valid" if after_fault else first.pop(0) if first else self.rng.choice(kinds)
            self.counts["episodes"] += 1
            try:
                await getattr(self, kind)()
            except (AssertionError, BusHang) as exc:
                self.counts["failures"] += 1
                if isinstance(exc, BusHang):
                    self.counts["bus_hangs"] += 1
                self.failures.append(f"episode {i} ({kind}): {exc}")
                self.tb.dut._log.error(f"seed {self.tb.seed} episode {i} ({kind}): {exc}")
                await self.recover()
            after_fault = kind != "valid"
        self.counts["cycles"] = int(get_sim_time("ns") // 10)


@cocotb.test()
async def campaign(dut):
    """The random episode mix of the module docstring; fails if any episode failed."""
    tb = TB(dut)
    await tb.reset()
    p = bench_params()
    camp = Campaign(tb)
    await camp.run(int(p.get("episodes", 20)))
    dut._log.info(f"fault campaign: {camp.counts}")
    if p.get("summary"):
        with open(p["summary"], "w") as f:
            json.dump({"counts": camp.counts, "failures": camp.failures, "seed": tb.seed}, f, indent=1)
    assert not camp.failures, f"seed {tb.seed}: {len(camp.failures)} failed episodes: {camp.failures[:5]}"
