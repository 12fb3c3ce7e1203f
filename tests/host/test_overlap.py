"""nanokpu.host.overlap: the queue model's schedules, exact on small hand-made traces, and the
FuncSim trace it reads."""

import numpy as np
import pytest

from golden.block import random_block
from nanokpu.commands.bench_block import overlap
from nanokpu.config import profile
from nanokpu.host.compiler import compile_block
from nanokpu.host.funcsim import Access, FuncSim
from nanokpu.host.overlap import Machine, schedule
from nanokpu.isa import OP_RULES, Op


def ins(op, reads=(), writes=(), scanned=0):
    """An Access of ``op`` on scratchpad intervals ``(lo, hi)``; host intervals as ``("host", lo, hi)``."""
    def tag(iv):
        return iv if len(iv) == 3 else ("spad", *iv)
    return Access(0, op, OP_RULES[op].executor, tuple(map(tag, reads)), tuple(map(tag, writes)), scanned)


def cycles_of(trace, cycles, **machine):
    return schedule(trace, cycles, Machine(**machine))


def test_independent_queues_overlap():
    """LOAD enters its queue after a cycle of issue, ADD a cycle later: both run at once."""
    s = cycles_of([ins(Op.LOAD, writes=[(0, 10)]), ins(Op.ADD, [(100, 110)], [(200, 210)])], [10, 20])
    assert (s.starts, s.ends, s.cycles) == ([1, 2], [11, 22], 22)
    assert s.busy["load"] == 10 and s.busy["compute"] == 20


@pytest.mark.parametrize("hazard, first, second", [
    ("raw", ins(Op.LOAD, writes=[(0, 10)]), ins(Op.ADD, [(5, 6)], [(200, 210)])),
    ("war", ins(Op.ADD, [(0, 10)], [(200, 210)]), ins(Op.LOAD, writes=[(9, 12)])),
    ("waw", ins(Op.ADD, [(50, 60)], [(0, 10)]), ins(Op.LOAD, writes=[(0, 1)])),
    ("raw", ins(Op.ADD, [(50, 60)], [(0, 10)]), ins(Op.STORE, [(0, 10), ("host", 0, 40)], [("host", 0, 40)])),
])
def test_each_hazard_orders_two_queues(hazard, first, second):
    dependent = cycles_of([first, second], [10, 20])
    assert dependent.starts[1] == dependent.ends[0] and dependent.cycles == 31
    queue = "compute" if second.op == Op.ADD else second.op.name.lower()
    assert dependent.stalls[queue] == {"dependency": dependent.ends[0] - 2, "resource": 0}
    if hazard != "raw":   # renamed away: the two overlap
        assert cycles_of([first, second], [10, 20], hazards=("raw",)).cycles == 22


def test_touching_intervals_do_not_conflict():
    s = cycles_of([ins(Op.LOAD, writes=[(0, 10)]), ins(Op.ADD, [(10, 20)], [(200, 210)])], [10, 20])
    assert s.starts[1] == 2


def test_host_and_scratchpad_are_separate_spaces():
    s = cycles_of([ins(Op.LOAD, [("host", 0, 10)], [(0, 10)]), ins(Op.ADD, [(100, 110)], [("host", 0, 10)])],
                  [10, 20])
    assert s.starts[1] == 11          # the host interval is written after LOAD read it (WAR)
    s = cycles_of([ins(Op.LOAD, [("host", 0, 10)], [(0, 10)]), ins(Op.ADD, [(100, 110)], [(500, 510)])], [10, 20])
    assert s.starts[1] == 2


def test_read_channel_is_shared_by_load_and_gemm():
    """GEMM's weights and LOAD's data share the AXI4 read channel; STORE has its own."""
    trace = [ins(Op.LOAD, writes=[(0, 10)]), ins(Op.GEMM, [(100, 110)], [(200, 210)]),
             ins(Op.STORE, [(300, 310)])]
    s = cycles_of(trace, [10, 20, 30])
    assert (s.starts, s.stalls["gemm"]["resource"]) == ([1, 11, 3], 9)


def test_a_queue_keeps_its_order_unless_reordered():
    """The second ADD is independent but behind one that waits for the LOAD."""
    trace = [ins(Op.LOAD, writes=[(0, 10)]), ins(Op.ADD, [(0, 10)], [(100, 110)]),
             ins(Op.NORM, [(200, 210)], [(300, 310)])]
    assert cycles_of(trace, [50, 10, 10]).starts == [1, 51, 61]
    assert cycles_of(trace, [50, 10, 10], in_order=False).starts == [1, 51, 3]


def test_reordered_work_fills_the_first_gap():
    """Out of order, an instruction takes the first gap of its executor long enough for it."""
    trace = [ins(Op.ADD, [(0, 1)], [(10, 11)]), ins(Op.LOAD, writes=[(20, 30)]),
             ins(Op.NORM, [(20, 30)], [(40, 50)]), ins(Op.SITU, [(60, 61)], [(70, 71)])]
    s = cycles_of(trace, [5, 40, 5, 20], in_order=False)
    assert s.starts == [1, 2, 42, 6]


def test_front_end_waits_for_a_full_queue():
    """Depth 1: the third GEMM enters only when the second has started."""
    trace = [ins(Op.GEMM, [(0, 1)], [(10 * i + 100, 10 * i + 101)]) for i in range(3)]
    trace.append(ins(Op.ADD, [(500, 501)], [(600, 601)]))
    deep, shallow = cycles_of(trace, [10, 10, 10, 5]), cycles_of(trace, [10, 10, 10, 5], depth=1)
    assert deep.starts == [1, 11, 21, 4]
    assert shallow.starts == [1, 11, 21, 13]


def test_expert_waits_for_its_table_and_scans():
    """EXPERT runs in the front end: after ROUTE wrote the table it reads, 3 cycles an expert."""
    trace = [ins(Op.LOAD, writes=[(0, 10)]), ins(Op.EXPERT, [(0, 4)], scanned=3),
             ins(Op.ADD, [(100, 110)], [(200, 210)])]
    s = cycles_of(trace, [10, 0, 5])
    assert (s.starts, s.ends) == ([1, 11, 21], [11, 20, 26])


def test_bad_machines_and_traces_are_refused():
    with pytest.raises(ValueError, match="Machine.depth"):
        Machine(depth=0)
    with pytest.raises(ValueError, match="Machine.issue_cycles"):
        Machine(issue_cycles=True)
    with pytest.raises(ValueError, match="Machine.hazards"):
        Machine(hazards=("war",))
    with pytest.raises(ValueError, match="cycles: 1 entries for 2"):
        schedule([ins(Op.LOAD), ins(Op.ADD)], [1])


def test_funcsim_trace_is_the_decode_intervals():
    """A tiny block's trace: an Access per retired instruction with OP_RULES' intervals, the
    EXPERTs scanning each expert once; overlap() refuses an RTL trace of other instructions."""
    cfg = profile("tiny")
    Q, xq, _, _ = random_block(cfg, 8, np.random.default_rng(1))
    prog = compile_block(Q, xq, cfg)
    res = FuncSim(cfg, prog.image).run(prog.instrs)
    assert len(res.trace) == res.retired
    assert sum(a.scanned for a in res.trace if a.op == Op.EXPERT) == cfg.n_experts
    load = next(a for a in res.trace if a.op == Op.LOAD)
    i = prog.instrs[load.pc]
    assert load.writes == (("spad", i.c, i.c + i.m * i.n),) and load.reads[0][0] == "host"
    gemm = next(a for a in res.trace if a.op == Op.GEMM)
    i = prog.instrs[gemm.pc]
    assert gemm.reads[0] == ("spad", i.a, i.a + i.m * i.k) and gemm.writes == (("spad", i.c, i.c + i.m * i.n),)
    executors = [a for a in res.trace if a.executor]
    busy = [(["dma", "gemm", "act", "route", "vector", "move"].index(a.executor), 1) for a in executors]
    assert overlap(res.trace, busy)["queues"].cycles > 0
    with pytest.raises(ValueError, match="executor instructions"):
        overlap(res.trace, busy[1:])
