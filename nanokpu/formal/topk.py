"""Functional proof of the top-k routing engine: exactly the k largest biased keys, in rank order.

:class:`TopKProof` wraps a :class:`~nanokpu.units.router.TopKRouter` (the stream rules of
:class:`~nanokpu.formal.streams.StreamProof` included) and a shadow model that restates the
contract independently of the RTL:

* the environment writes any biases (any ``bias_addr``, any ``bias_data``) while no token is
  in flight, then sends one token of any scores, with any idle and backpressure;
* with ``key[e] = score[e] + bias[e]`` and ``rank[e]`` the number of experts ``j`` with
  ``key[j] > key[e]`` or ``key[j] == key[e] and j < e`` (the stable tie rule), the ``r``-th
  output beat must name the expert of rank ``r`` (so the ``k`` beats are exactly the ``k``
  largest keys, in rank order);
* nothing is emitted before the token has fully entered, and nothing after its ``top_k``
  beats.

Run as a bounded check (``mode bmc``) from reset: the depth must cover the bias writes, the
token and the engine's latency (see :func:`topk_depth`), so every bias set and every score
vector is covered. The weights are not part of this proof (a sequential divider against a
reference division does not solve in CI time); :class:`~nanokpu.formal.divider.DividerProof`
proves the reciprocal, and the benches check every weight against the golden model.
"""

from __future__ import annotations

from amaranth.hdl import Array, Assert, Assume, Mux, Signal, signed, unsigned

from nanokpu.formal.streams import Flow, StreamProof
from nanokpu.units.router import TopKRouter

__all__ = ["TopKProof", "topk_depth", "router_flow"]


def router_flow(router: TopKRouter) -> Flow:
    """Conservation of the router's streams: ``B`` score beats make ``top_k`` route beats.

    At most 4 tokens are in flight (the input register, the insertion lists, the merge
    snapshot and the weight stage); with the sink ready, a token in flight produces a route
    beat within its latency plus one load-counter clear sweep (``n_experts`` cycles) plus
    one divider run.
    """
    cfg = router.cfg
    return Flow("scores", "routes", in_per_unit=router.beats, out_per_unit=cfg.top_k, last="last",
                capacity=4, response=router.latency + cfg.n_experts + router.recip_bits + 4)


def router_env(m, proof):
    """Host contract assumed by the router's stream proofs: at most one ``load_clear`` in the
    run (a clear pauses the merge for a sweep of ``n_experts`` cycles, so a host that clears
    back to back can starve the output for as long as it likes)."""
    cleared = Signal()
    with m.If(proof.load_clear):
        m.d.sync += cleared.eq(1)
    m.d.comb += Assume(~proof.load_clear | ~cleared)


def topk_depth(router: TopKRouter) -> int:
    """BMC depth covering ``n_experts`` bias writes, one token, its latency and its beats."""
    cfg = router.cfg
    return cfg.n_experts + router.beats + router.latency + cfg.top_k + 4


class TopKProof(StreamProof):
    """Formal wrapper of ``router`` checking the experts routed for one token.

    Parameters
    ----------
    router : TopKRouter
        The design under proof (a fresh instance; a small shape such as 8 experts, top-3).
    fixed_schedule : bool
        Fix the timing (bias ``e`` written in cycle ``e``, then the token without idle, the
        sink always ready) and leave only the data free: the functional check then solves
        in seconds; the timing freedom is covered by :class:`StreamProof` and the benches.
    """

    def __init__(self, router: TopKRouter, *, fixed_schedule: bool = False):
        self.fixed_schedule = fixed_schedule
        if not isinstance(router, TopKRouter):
            raise TypeError(f"TopKProof takes a TopKRouter, not {type(router).__name__}")
        super().__init__(router, flows=[router_flow(router)], assume=router_env)

    def elaborate(self, platform):
        m = super().elaborate(platform)
        router = self.unit
        cfg = router.cfg
        n, k, lanes = cfg.n_experts, cfg.top_k, cfg.route_lanes
        beats = router.beats

        # -- environment: biases while idle, then exactly one token ------------------------
        in_beat = Signal(range(beats))
        token_in = Signal()                     # the token has fully entered
        started = Signal()                      # its first beat has entered
        in_xfer = self.scores.valid & self.scores.ready
        with m.If(in_xfer):
            m.d.sync += [started.eq(1), in_beat.eq(Mux(in_beat == beats - 1, 0, in_beat + 1))]
            with m.If(in_beat == beats - 1):
                m.d.sync += token_in.eq(1)
        m.d.comb += [
            Assume(~self.scores.valid | ~token_in),
            Assume(~self.bias_we | (~started & ~self.scores.valid)),
            Assume(~self.load_clear),
        ]
        if self.fixed_schedule:
            cycle = Signal(range(n + 1))
            with m.If(cycle < n):
                m.d.sync += cycle.eq(cycle + 1)
            m.d.comb += [
                Assume(self.bias_we == (cycle < n)),
                Assume((cycle == n) | (self.bias_addr == cycle)),
                Assume(self.scores.valid == ((cycle == n) & ~token_in)),
                Assume(self.routes.ready),
            ]

        # -- shadow state: the biases written, the scores sent -----------------------------
        bias = Array(Signal(signed(cfg.bias_width), name=f"bias{e}") for e in range(n))
        score = Array(Signal(unsigned(cfg.score_width), name=f"score{e}") for e in range(n))
        with m.If(self.bias_we & (self.bias_addr < n)):
            m.d.sync += bias[self.bias_addr].eq(self.bias_data)
        with m.If(in_xfer):
            for b in range(beats):
                with m.If(in_beat == b):
                    for j in range(lanes):
                        if b * lanes + j < n:
                            m.d.sync += score[b * lanes + j].eq(self.scores.payload[j])

        # -- the contract ------------------------------------------------------------------
        key_shape = signed(max(cfg.score_width + 1, cfg.bias_width) + 1)
        keys = []
        for e in range(n):
            key = Signal(key_shape, name=f"key{e}")
            m.d.comb += key.eq(score[e] + bias[e])
            keys.append(key)
        rank = Array(Signal(range(n), name=f"rank{e}") for e in range(n))
        for e in range(n):
            before = [(keys[j] > keys[e]) | ((keys[j] == keys[e]) & (j < e)) for j in range(n) if j != e]
            m.d.comb += rank[e].eq(sum(before))
        out_count = Signal(range(k + 1))
        out_xfer = self.routes.valid & self.routes.ready
        with m.If(out_xfer):
            m.d.sync += out_count.eq(out_count + 1)
        index = self.routes.payload.index
        with m.If(self.routes.valid):
            m.d.comb += [
                Assert(token_in, "routes: a beat before the token has entered"),
                Assert(out_count < k, "routes: more than top_k beats for one token"),
                Assert(index < n, "routes: index out of range"),
                Assert(rank[index] == out_count, "routes: not the expert of this rank (top-k order or ties)"),
            ]
        return m
