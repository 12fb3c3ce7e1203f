"""Stream-protocol proofs: handshake rules on every stream port and conservation of transfers.

:class:`StreamProof` wraps one unit (any ``wiring.Component`` with ``lib.stream`` ports): it
has the unit's own signature, so every input of the unit is a free input of the proof (the
solver picks any value in every cycle) and every output is observable. Around the unit it
states, for each stream port:

* on the unit's **inputs** (the environment's side) it *assumes* the stream rules of
  ``amaranth.lib.stream``: once ``valid`` is high it stays high, with the same payload,
  until the transfer;
* on the unit's **outputs** it *asserts* the same rules;
* between one input and one output stream it asserts that no transfer is created or lost:
  with ``in_per_unit`` input beats making ``out_per_unit`` output beats (1:1 for a pipeline;
  ``B`` score beats to ``top_k`` route beats for the router), the output never runs ahead
  of the input, at most ``capacity`` units are in flight, and while the sink is ready a
  unit in flight leaves within ``response`` cycles (a lost transfer would leave the
  in-flight count stuck above zero). An optional ``last`` field of the output payload must
  mark exactly the last beat of each unit.

Reset is not exercised (``rst`` is assumed low): every register starts at its reset value.
"""

from __future__ import annotations

from amaranth.hdl import Assert, Assume, Module, Mux, ResetSignal, Signal, Value
from amaranth.lib import wiring

__all__ = ["StreamProof", "stream_rules", "Flow"]


def stream_rules(m: Module, port, check, tag: str):
    """Add the stream rules of ``port`` as ``check`` (``Assume`` or ``Assert``) statements.

    Returns the transfer signal (``valid & ready``).
    """
    xfer = Signal(name=f"{tag}_xfer")
    held = Signal(name=f"{tag}_held")            # last cycle: valid & ~ready
    payload = Value.cast(port.payload).as_unsigned()   # a signed payload compares as bits
    past_payload = Signal(len(payload), name=f"{tag}_past_payload")
    m.d.comb += xfer.eq(port.valid & port.ready)
    m.d.sync += [held.eq(port.valid & ~port.ready), past_payload.eq(payload)]
    with m.If(held):
        m.d.comb += [check(port.valid, f"{tag}: valid retracted before the transfer"),
                     check(payload == past_payload, f"{tag}: payload changed while stalled")]
    return xfer


class Flow:
    """Conservation between one input and one output stream of a unit.

    Parameters
    ----------
    src, dst : str
        Names of the input and output stream members.
    in_per_unit, out_per_unit : int
        Beats of one unit of work on each side (e.g. ``B`` score beats make ``top_k`` routes).
    capacity : int
        Units the design may hold at once.
    response : int
        While units are in flight and ``dst.ready`` stays high, an output beat comes within
        this many cycles.
    last : str, optional
        Payload field of ``dst`` that must be high on exactly the last beat of each unit.
    """

    def __init__(self, src: str, dst: str, *, capacity: int, response: int, in_per_unit: int = 1,
                 out_per_unit: int = 1, last: str | None = None):
        for name, value in (("capacity", capacity), ("response", response),
                            ("in_per_unit", in_per_unit), ("out_per_unit", out_per_unit)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Flow.{name} = {value!r}: must be a positive integer")
        self.src, self.dst = src, dst
        self.capacity, self.response = capacity, response
        self.in_per_unit, self.out_per_unit = in_per_unit, out_per_unit
        self.last = last


class StreamProof(wiring.Component):
    """Formal wrapper of ``unit``: stream rules on every stream port and the given :class:`Flow`s.

    Parameters
    ----------
    unit : wiring.Component
        The design under proof (owned by this wrapper: pass a fresh instance).
    flows : list of Flow
        Conservation properties between its streams.
    stable : list of str
        Plain input members the environment holds constant (e.g. the requantiser's
        ``mult``/``shift``, held while words are in flight).
    assume : callable, optional
        ``assume(m, proof)`` adds further environment assumptions (e.g. no ``load_clear``
        while a clear runs).
    """

    def __init__(self, unit: wiring.Component, flows=(), stable=(), assume=None):
        self.unit = unit
        self.flows = list(flows)
        self.stable = list(stable)
        self.extra_assume = assume
        self.streams = [name for name, member in unit.signature.members.items()
                        if member.is_signature and {"valid", "ready", "payload"} <= set(member.signature.members)]
        if not self.streams:
            raise ValueError(f"{type(unit).__name__} has no stream ports to prove")
        names = set(unit.signature.members)
        for flow in self.flows:
            for port in (flow.src, flow.dst):
                if port not in self.streams:
                    raise ValueError(f"Flow port {port!r} is not a stream of {type(unit).__name__}")
        for name in self.stable:
            if name not in names:
                raise ValueError(f"stable member {name!r} is not a port of {type(unit).__name__}")
        super().__init__(dict(unit.signature.members))

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self.unit
        for (_path, member, outer), (_, _, inner) in zip(self.signature.flatten(self),
                                                        unit.signature.flatten(unit), strict=True):
            if member.flow == wiring.In:
                m.d.comb += inner.eq(outer)
            else:
                m.d.comb += outer.eq(inner)
        m.d.comb += Assume(~ResetSignal())
        for name in self.stable:
            port = getattr(self, name)
            past = Signal.like(port, name=f"{name}_past")
            started = Signal(name=f"{name}_started")
            m.d.sync += [past.eq(port), started.eq(1)]
            with m.If(started):
                m.d.comb += Assume(port == past)
        xfers = {}
        for name in self.streams:
            is_input = unit.signature.members[name].flow == wiring.In
            xfers[name] = stream_rules(m, getattr(self, name), Assume if is_input else Assert, name)
        for n, flow in enumerate(self.flows):
            self._conservation(m, n, flow, xfers[flow.src], xfers[flow.dst])
        if self.extra_assume is not None:
            self.extra_assume(m, self)
        return m

    def _conservation(self, m, n, flow, in_xfer, out_xfer):
        dst = getattr(self, flow.dst)
        in_beat = Signal(range(flow.in_per_unit), name=f"flow{n}_in_beat")
        out_beat = Signal(range(flow.out_per_unit), name=f"flow{n}_out_beat")
        inflight = Signal(range(flow.capacity + 2), name=f"flow{n}_inflight")  # completed inputs - outputs
        wait = Signal(range(flow.response + 2), name=f"flow{n}_wait")
        unit_in = in_xfer & (in_beat == flow.in_per_unit - 1)
        unit_out = out_xfer & (out_beat == flow.out_per_unit - 1)
        with m.If(in_xfer):
            m.d.sync += in_beat.eq(Mux(in_beat == flow.in_per_unit - 1, 0, in_beat + 1))
        with m.If(out_xfer):
            m.d.sync += out_beat.eq(Mux(out_beat == flow.out_per_unit - 1, 0, out_beat + 1))
        m.d.sync += inflight.eq(inflight + unit_in - unit_out)
        # nothing created: an output beat needs a unit that has fully entered
        m.d.comb += Assert(~out_xfer | (inflight != 0), f"{flow.dst}: output beat without a unit in flight")
        # bounded occupancy
        m.d.comb += Assert(inflight <= flow.capacity,
                           f"{flow.src}->{flow.dst}: more than {flow.capacity} units in flight")
        # nothing lost: with the sink ready, a unit in flight produces a beat within `response`
        with m.If((inflight != 0) & dst.ready & ~out_xfer):
            m.d.sync += wait.eq(wait + 1)
        with m.Else():
            m.d.sync += wait.eq(0)
        m.d.comb += Assert(wait <= flow.response, f"{flow.dst}: no beat for {flow.response} ready cycles (lost)")
        if flow.last is not None:
            with m.If(dst.valid):
                m.d.comb += Assert(getattr(dst.payload, flow.last) == (out_beat == flow.out_per_unit - 1),
                                    f"{flow.dst}.{flow.last}: not on the last beat of a unit")
