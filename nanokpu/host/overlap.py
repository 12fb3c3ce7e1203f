"""A cycle-approximate model of decoupled execution: a program's instructions in in-order queues
that overlap, dependencies tracked by comparing operand intervals.

The input is a run's :attr:`~nanokpu.host.funcsim.RunResult.trace` (what each retired
instruction reads and writes, as the decode's checks compute it) and each instruction's cycles
on its executor as the serial RTL measured them (its ``BUSY`` cycles). :func:`schedule` replays
them on the machine that :class:`Machine` describes:

* a front end that takes the instructions in program order, ``issue_cycles`` each, into the
  queue of their kind (:data:`QUEUES`); it waits while that queue holds ``depth`` instructions
  not started yet. ``EXPERT`` and ``JUMP`` run in the front end (``EXPERT``: 3 cycles per expert
  it scans, as the controller's FSM; it waits for the writers of the table it reads);
* each queue starts its instructions in order, one at a time, each when the one before it in
  the queue is done, every older instruction it conflicts with is done, and the bus channel it
  needs is free;
* conflict: an older instruction writes what it reads (RAW), reads what it writes (WAR) or
  writes what it writes (WAW); intervals of the scratchpad and of host memory, the decode's
  (a reservation station's compare);
* the AXI4 master's read channel is one resource (``LOAD``'s data, ``GEMM``'s weights), its
  write channel another (``STORE``), each held for the instruction's whole run;
* ``Machine(in_order=False)`` lifts the queues' order (a perfectly reordered program), and
  ``Machine(hazards=("raw",))`` ignores WAR and WAW (every such buffer renamed): bounds of what
  the compiler's scheduling can add.

Each instruction keeps its serial cycle count: the model knows nothing of scratchpad port
contention between executors that run at once (each executor's port set of today), so it is
the bound the queues can reach with today's executors and scratchpad ports, not a prediction
of a particular implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanokpu.host.funcsim import Access
from nanokpu.isa import Op

__all__ = ["QUEUES", "Machine", "Schedule", "queue_of", "schedule"]

#: The queues of decoupled execution, by the ops they take (everything else: ``compute``).
QUEUES = ("load", "gemm", "compute", "store")

#: Cycles an ``EXPERT`` spends on each expert it scans (read, wait, check).
EXPERT_SCAN_CYCLES = 3


def queue_of(access: Access) -> str | None:
    """The queue an instruction goes to; ``None`` for the front end's ``JUMP`` and ``EXPERT``."""
    if access.executor is None:
        return None
    return {Op.LOAD: "load", Op.STORE: "store", Op.GEMM: "gemm"}.get(access.op, "compute")


def bus_channel(access: Access) -> str | None:
    """The AXI4 master channel an instruction holds: ``"read"`` (``LOAD``, ``GEMM``'s weights),
    ``"write"`` (``STORE``) or ``None``."""
    return {Op.LOAD: "read", Op.GEMM: "read", Op.STORE: "write"}.get(access.op)


def _overlaps(xs, ys) -> bool:
    return any(s == t and lo < hi2 and lo2 < hi for s, lo, hi in xs for t, lo2, hi2 in ys)


#: The hazards a machine can track: read after write, write after read, write after write.
HAZARDS = ("raw", "war", "waw")


def conflicts(older: Access, newer: Access, hazards=HAZARDS) -> bool:
    """Whether ``newer`` depends on ``older`` by one of ``hazards`` (their intervals overlap)."""
    return (("raw" in hazards and _overlaps(older.writes, newer.reads))
            or ("war" in hazards and _overlaps(older.reads, newer.writes))
            or ("waw" in hazards and _overlaps(older.writes, newer.writes)))


def _first_fit(busy: list, ready: int, length: int) -> int:
    """The first start ``>= ready`` at which ``[start, start + length)`` misses every interval of
    ``busy`` (sorted ``(begin, end)`` pairs)."""
    start = ready
    for begin, end in busy:
        if start + length <= begin:
            break
        start = max(start, end)
    return start


@dataclass(frozen=True)
class Machine:
    """The decoupled machine the model replays: ``depth`` instructions a queue holds before
    they start, ``issue_cycles`` the front end spends on each instruction, the ``hazards`` it
    respects (:data:`HAZARDS`; RAW alone: as if every buffer a WAR or WAW separates were
    renamed, the compiler's ping-pong buffers), and ``in_order``: each queue starts its
    instructions in order; ``False``: at the first cycle its executor and bus channel are free
    and its dependencies done, as if the compiler had reordered the program perfectly (a list
    schedule of the dependency graph, in program order of priority; ``depth`` is then not a
    limit)."""

    depth: int = 4
    issue_cycles: int = 1
    hazards: tuple = HAZARDS
    in_order: bool = True

    def __post_init__(self):
        for name in ("depth", "issue_cycles"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Machine.{name} = {value!r}: must be an integer >= 1")
        if not self.hazards or not set(self.hazards) <= set(HAZARDS) or "raw" not in self.hazards:
            raise ValueError(f"Machine.hazards = {self.hazards!r}: a subset of {HAZARDS} with 'raw'")


@dataclass
class Schedule:
    """:func:`schedule`'s result: ``cycles`` (the last instruction's end), per queue its ``busy``
    cycles and the cycles its instructions waited between entering it and starting, by cause
    (``stalls[queue][cause]``): ``"dependency"`` (an older instruction they depend on still
    running), ``"resource"`` (then the queue's executor, in-order turn or bus channel);
    ``starts``/``ends`` per instruction of the trace (front-end instructions: their front-end
    cycles)."""

    cycles: int
    busy: dict
    stalls: dict
    starts: list = field(default_factory=list)
    ends: list = field(default_factory=list)


def schedule(trace: list[Access], cycles: list[int], machine: Machine = Machine()) -> Schedule:
    """Replay ``trace`` (a :class:`~nanokpu.host.funcsim.Access` per retired instruction) with
    ``cycles[i]`` the executor cycles of instruction ``i`` (ignored for ``JUMP`` and
    ``EXPERT``) on ``machine``; see the module docstring."""
    if len(cycles) != len(trace):
        raise ValueError(f"cycles: {len(cycles)} entries for {len(trace)} instructions")
    starts, ends = [0] * len(trace), [0] * len(trace)
    busy = {q: 0 for q in QUEUES}
    stalls = {q: {"dependency": 0, "resource": 0} for q in QUEUES}
    occupied = {name: [] for name in (*QUEUES, "read", "write")}   # sorted (begin, end) per resource
    queue_starts = {q: [] for q in QUEUES}         # its instructions' starts, in program order
    front = 0                                      # the front end's next free cycle
    for i, acc in enumerate(trace):
        deps = max((ends[j] for j in range(i) if conflicts(trace[j], acc, machine.hazards)), default=0)
        q = queue_of(acc)
        if q is None:
            begin = max(front, deps)
            spent = EXPERT_SCAN_CYCLES * acc.scanned if acc.op == Op.EXPERT else machine.issue_cycles
            starts[i], ends[i] = begin, begin + spent
            front = ends[i]
            continue
        held, channel = queue_starts[q], bus_channel(acc)
        resources = [occupied[q]] + ([occupied[channel]] if channel else [])
        if machine.in_order:
            # the front end waits while the queue holds `depth` instructions not started
            room = held[-machine.depth] if len(held) >= machine.depth else 0
            front = max(front, room) + machine.issue_cycles
            start = max([front, deps] + [r[-1][1] for r in resources if r])
        else:
            front += machine.issue_cycles
            start = max(front, deps)
            while True:      # the first gap every resource has
                fits = [_first_fit(r, start, cycles[i]) for r in resources]
                if max(fits) == start:
                    break
                start = max(fits)
        stalls[q]["dependency"] += max(deps - front, 0)
        stalls[q]["resource"] += start - max(front, deps)
        starts[i], ends[i] = start, start + cycles[i]
        held.append(start)
        busy[q] += cycles[i]
        if cycles[i]:
            for r in resources:
                r.append((start, ends[i]))
                r.sort()
    return Schedule(max(ends, default=0), busy, stalls, starts, ends)
