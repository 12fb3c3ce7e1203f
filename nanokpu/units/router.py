"""The top-k routing engine: biased top-k selection, renormalised weights, per-expert load counters.

Bit-exact to :func:`golden.intops.route_int`. Design (``E = n_experts``, ``L = route_lanes``,
``k = top_k``, ``B = ceil(E / L)`` beats per token, ``R = weight_frac + score_frac + 1``)::

    scores (L per beat) --> [P1] --> L sorted insertion lists --> snapshot --> k-cycle merge
       bias banks (L x B) --/         (lane j: experts j, j+L, ...)    (ties: lower index)
                                                                              |
    routes (index, weight, last) <-- 1 multiplier <-- divider floor(2**R / S) <--/
                                                    load counters (RAM, E words) <-- merge

1. **Insertion.** Lane ``j`` of beat ``b`` carries expert ``b*L + j``. Its bias comes from bank
   ``j`` (a RAM of ``B`` words written by the host, read ahead at the beat of the next
   transfer), and ``key = score + bias`` is registered with the scores ([P1]). The key enters
   a sorted list of depth ``D = min(k, B)`` per lane; a newcomer passes an entry only on a
   strictly larger key, so equal keys keep index order (the lane sees its experts in
   ascending order). One beat per cycle.
2. **Merge.** When a token's last beat is inserted, the ``L`` lists are copied to a snapshot
   in one cycle and the lists take the next token at once. The merge pops, ``k`` times, the
   best lane head (larger key; on equal keys the lower expert index), records ``(index,
   score)`` and sums the unbiased score into ``S``; each pop increments that expert's load
   counter (a read-modify-write pipeline on a RAM with a transparent read port). A pop takes
   two cycles, the comparison tree over the lane heads split in halves: the lower half runs
   in the pop cycle on the heads left by the pop (registered), the upper half in the next
   cycle (its winner registered, popped in the cycle after).
3. **Weights.** A :class:`~nanokpu.units.renorm.Renormaliser` computes ``recip = floor(2**R / S)``
   (a sequential divider, ``R + 1`` cycles), then its multiplier gives ``w_i = round_shift(s_i *
   recip, score_frac + 1, rounding)`` per output beat. ``S = 0`` means every selected score is 0,
   so every weight is 0 whatever the divider returns: no special case.

Widths (``k3`` values in brackets): scores ``score_frac + 1`` bits unsigned [13]; bias
``bias_width`` signed [16]; key ``max(score_frac + 2, bias_width) + 1`` signed [17]; expert
index ``ceil(log2 E)`` [10]; a list entry stores valid, key, beat number ``ceil(log2 B)`` [6]
and score [13]; ``S`` ``bit_length(k * (2**(score_frac+1) - 1))`` [17]; reciprocal
``R + 1`` [29]; product ``score x reciprocal`` [42]; weight ``weight_frac + 1`` [16]; load
counters ``load_width`` [16]. Storage: ``2 * L * D`` list entries in flip-flops
(16 x 16 x 2 at ``k3``), ``L`` bias banks of ``B`` words, one counter RAM of ``E`` words.

The three stages run concurrently on consecutive tokens, so a token costs
:attr:`TopKRouter.cycles_per_token` = ``max(B, 2 * k + 1, R + k + 2)`` cycles in steady state
(``B`` when the scores are the bottleneck: 56 at the ``k3`` shape with 16 lanes). Host
interface: the bias write port (``bias_we``, ``bias_addr`` = expert index, ``bias_data``),
load counter reads (``load_addr`` -> ``load_data`` one cycle later) and clear
(``load_clear``).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from nanokpu.config import KpuConfig
from nanokpu.units.renorm import Renormaliser

__all__ = ["TopKRouter", "cycles_per_token", "latency"]


def cycles_per_token(cfg: KpuConfig) -> int:
    """Steady-state cycles per token of :class:`TopKRouter` without idle or backpressure:
    ``max(B, 2 * top_k + 1, R + top_k + 2)`` for the input (``B = ceil(n_experts / route_lanes)``
    beats), the merge (hand-over, then two cycles per pop) and the divide-and-emit stage
    (``R = weight_frac + score_frac + 1``)."""
    beats = -(-cfg.n_experts // cfg.route_lanes)
    recip_bits = cfg.weight_frac + cfg.score_frac + 1
    return max(beats, 2 * cfg.top_k + 1, recip_bits + cfg.top_k + 2)


def latency(cfg: KpuConfig) -> int:
    """Cycles from the transfer of a token's last score beat to its first route beat being
    valid, in an otherwise empty :class:`TopKRouter`: ``2 * top_k + R + 6`` (insert 1,
    hand-over 1, merge ``2 * top_k``, hand-over 1, divide ``R + 1``, start 2)."""
    return 2 * cfg.top_k + cfg.weight_frac + cfg.score_frac + 1 + 6


def _bits(n: int) -> int:
    """Width of an unsigned counter or index holding values ``0 .. n - 1`` (at least 1)."""
    return max(1, (n - 1).bit_length())


class TopKRouter(wiring.Component):
    """Top-k routing engine of one config (see the module docstring for the design).

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``n_experts``, ``top_k``, ``route_lanes``, ``score_frac``, ``bias_width``,
        ``weight_frac``, ``rounding`` and ``load_width``.

    Members
    -------
    scores : In(stream.Signature(ArrayLayout(unsigned(score_frac + 1), route_lanes)))
        One token is ``B = ceil(n_experts / route_lanes)`` consecutive beats; lane ``j`` of
        beat ``b`` is the score of expert ``b * route_lanes + j`` (lanes past the last
        expert are ignored). Tokens follow each other without gaps.
    routes : Out(stream.Signature(StructLayout(index, weight, last)))
        ``top_k`` beats per token in rank order: ``index`` the expert, ``weight`` its
        renormalised weight (``weight_frac`` fractional bits, unsigned), ``last`` on the
        ``top_k``-th beat.
    bias_we, bias_addr, bias_data : In
        Host write of ``bias[bias_addr] = bias_data`` (signed, ``bias_width`` bits, score
        format). Addresses ``>= n_experts`` are ignored. Write between batches: a token
        whose beats are in flight may see either value.
    load_addr : In(index width)
    load_data : Out(load_width)
        Tokens that chose expert ``load_addr`` since the last clear (saturating at
        ``2**load_width - 1``), one cycle after ``load_addr``. A token counts when its
        selection is merged, before its weights leave.
    load_clear : In(1)
        Zeroes every counter: the merge pauses, pending increments land, then a sweep
        writes ``n_experts`` zeros (``n_experts + 2`` cycles). Selections merged up to the
        cycle of the request are cleared; later ones count. The counters start at zero
        (RAM initial value) and ``rst`` does not clear them.
    load_clearing : Out(1)
        High from the cycle after ``load_clear`` until the sweep is done.
    idle : Out(1)
        No token in flight and no pending counter update: the counters are final.
    """

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"TopKRouter takes a KpuConfig, not {type(cfg).__name__}")
        self.cfg = cfg
        n, route_lanes, top_k = cfg.n_experts, cfg.route_lanes, cfg.top_k
        self.beats = -(-n // route_lanes)
        self.depth = min(top_k, self.beats)
        self.recip_bits = cfg.weight_frac + cfg.score_frac + 1
        self.index_width = _bits(n)
        self.key_shape = signed(max(cfg.score_width + 1, cfg.bias_width) + 1)
        self.sum_width = (top_k * (2 ** cfg.score_width - 1)).bit_length()
        self.route_layout = data.StructLayout({
            "index": unsigned(self.index_width),
            "weight": unsigned(cfg.weight_width),
            "last": unsigned(1),
        })
        super().__init__({
            "scores": In(stream.Signature(data.ArrayLayout(unsigned(cfg.score_width), route_lanes))),
            "routes": Out(stream.Signature(self.route_layout)),
            "bias_we": In(1),
            "bias_addr": In(self.index_width),
            "bias_data": In(signed(cfg.bias_width)),
            "load_addr": In(self.index_width),
            "load_data": Out(cfg.load_width),
            "load_clear": In(1),
            "load_clearing": Out(1),
            "idle": Out(1),
        })

    # -- timing contract (checked cycle-exactly by tests/test_router.py) ------------------
    @property
    def cycles_per_token(self) -> int:
        """Steady-state cycles per token: :func:`cycles_per_token` of the config."""
        return cycles_per_token(self.cfg)

    @property
    def latency(self) -> int:
        """Last score beat to first route beat: :func:`latency` of the config."""
        return latency(self.cfg)

    # ------------------------------------------------------------------------------------
    def elaborate(self, platform):
        cfg = self.cfg
        m = Module()
        n, route_lanes, top_k, depth = cfg.n_experts, cfg.route_lanes, cfg.top_k, self.depth
        beat_w = _bits(self.beats)

        entry_layout = data.StructLayout({"valid": 1, "key": self.key_shape, "beat": beat_w,
                                          "score": cfg.score_width})

        def entry(name):
            return Signal(entry_layout, name=name)

        # ---- stage 1: bias lookup and insertion -----------------------------------------
        beat = Signal(range(self.beats))          # beat number of the next input transfer
        p1_valid = Signal()
        p1_beat = Signal(beat_w)
        p1_scores = Signal(data.ArrayLayout(unsigned(cfg.score_width), route_lanes))
        p1_keys = Signal(data.ArrayLayout(self.key_shape, route_lanes))
        lists = [[entry(f"l{j}_{i}") for i in range(depth)] for j in range(route_lanes)]
        lists_full = Signal()                     # the lists hold a complete token
        take = Signal()                           # the merge copies the lists this cycle
        advance = Signal()                        # P1 inserts this cycle
        in_xfer = self.scores.valid & self.scores.ready

        m.d.comb += [
            advance.eq(p1_valid & ~(lists_full & ~take)),
            self.scores.ready.eq(~p1_valid | advance),
        ]
        next_beat = Mux(beat == self.beats - 1, 0, beat + 1)
        with m.If(in_xfer):
            m.d.sync += [p1_scores.eq(self.scores.payload), p1_beat.eq(beat), p1_valid.eq(1),
                         beat.eq(next_beat)]
        with m.Elif(advance):
            m.d.sync += p1_valid.eq(0)
        last_insert = advance & (p1_beat == self.beats - 1)
        m.d.sync += lists_full.eq(last_insert | (lists_full & ~take))

        pow2 = route_lanes & (route_lanes - 1) == 0
        bank_sel = self.bias_addr[:(route_lanes - 1).bit_length()] if pow2 else self.bias_addr % route_lanes
        bank_row = self.bias_addr >> (route_lanes - 1).bit_length() if pow2 else self.bias_addr // route_lanes
        fresh = p1_beat == 0
        for j in range(route_lanes):
            bank = Memory(shape=signed(cfg.bias_width), depth=self.beats, init=[])
            m.submodules[f"bias{j}"] = bank
            wp = bank.write_port()
            # the read port follows the beat of the next transfer (the bias is ready when the
            # scores arrive, and the key is registered with them); it sees a write of the
            # previous cycle
            rp = bank.read_port(domain="sync", transparent_for=(wp,))
            m.d.comb += [
                wp.addr.eq(bank_row), wp.data.eq(self.bias_data),
                wp.en.eq(self.bias_we & (bank_sel == j) & (self.bias_addr < n)),
                rp.addr.eq(Mux(in_xfer, next_beat, beat)),
            ]
            with m.If(in_xfer):
                m.d.sync += p1_keys[j].eq(self.scores.payload[j] + rp.data)
            new = Signal(entry_layout, name=f"new{j}")
            m.d.comb += [new.valid.eq(1), new.key.eq(p1_keys[j]), new.beat.eq(p1_beat),
                         new.score.eq(p1_scores[j])]
            # lanes past the last expert exist only in the last beat (never the fresh one)
            lane_ok = (p1_beat != self.beats - 1) if j >= n - (self.beats - 1) * route_lanes else Const(1)
            lst = lists[j]
            cur_valid = [e.valid & ~fresh for e in lst]
            gt = [~cv | (new.key > e.key) for cv, e in zip(cur_valid, lst, strict=True)]
            with m.If(advance & lane_ok):
                for i, e in enumerate(lst):
                    if i == 0:
                        with m.If(gt[0]):
                            m.d.sync += e.eq(new)
                        continue
                    with m.If(gt[i] & gt[i - 1]):
                        m.d.sync += [e.eq(lst[i - 1]), e.valid.eq(cur_valid[i - 1])]
                    with m.Elif(gt[i]):
                        m.d.sync += e.eq(new)

        # ---- stage 2: k-cycle merge of the lane heads ------------------------------------
        snap = [[entry(f"s{j}_{i}") for i in range(depth)] for j in range(route_lanes)]
        merging = Signal()
        merge_done = Signal()
        merge_count = Signal(range(top_k))
        res_index = [Signal(self.index_width, name=f"res_index{r}") for r in range(top_k)]
        res_score = [Signal(cfg.score_width, name=f"res_score{r}") for r in range(top_k)]
        res_sum = Signal(self.sum_width)
        c_take = Signal()
        clearing = Signal()
        m.d.comb += take.eq(lists_full & (~(merging | merge_done) | (merge_done & c_take)))

        # comparison tree over the lane heads: valid first, then the larger key, then the
        # lower expert index, i.e. the lower (beat, lane). One unsigned comparison of ``rank``
        # (valid, key in unsigned order, ~beat, ~lane; MSB first) decides a node.
        lane_w = Shape.cast(range(route_lanes)).width
        cand_layout = data.StructLayout({"rank": 1 + self.key_shape.width + beat_w + lane_w,
                                         "index": self.index_width, "score": cfg.score_width,
                                         "sel": route_lanes})  # one-hot lane

        def reduce(cands, levels, tag):
            for level in range(levels):
                nxt = []
                for p in range(0, len(cands) - 1, 2):
                    a, b = cands[p], cands[p + 1]
                    win = Signal(cand_layout, name=f"{tag}{level}_{p // 2}")
                    m.d.comb += win.eq(Mux(a.rank > b.rank, a, b))
                    nxt.append(win)
                if len(cands) % 2:
                    nxt.append(cands[-1])
                cands = nxt
            return cands

        # A pop takes two cycles, the tree split over them: in the pop cycle the lower half of
        # the tree runs on the next cycle's lane heads (``nhead``: the popped lane's second
        # entry, or the lists on a hand-over) into ``mid``; in the next cycle the upper half
        # picks the winner into ``best`` (valid when ``picked``), popped in the cycle after.
        best = Signal(cand_layout)
        picked = Signal()
        pop = picked & ~clearing  # picked implies merging
        leaves = []
        for j in range(route_lanes):
            nhead = entry(f"nhead{j}")
            with m.If(take):
                m.d.comb += nhead.eq(lists[j][0])
            with m.Elif(pop & best.sel[j]):
                if depth > 1:  # else the lane is empty after its pop
                    m.d.comb += nhead.eq(snap[j][1])
            with m.Else():
                m.d.comb += nhead.eq(snap[j][0])
            cand = Signal(cand_layout, name=f"head{j}")
            key = nhead.key
            ordered = Cat(key[:-1], ~key[-1]) if self.key_shape.signed else key  # as unsigned
            m.d.comb += [cand.rank.eq(Cat(Const(route_lanes - 1 - j, lane_w), ~nhead.beat, ordered, nhead.valid)),
                         cand.index.eq(nhead.beat * route_lanes + j), cand.score.eq(nhead.score),
                         cand.sel.eq(1 << j)]
            leaves.append(cand)
        levels = (route_lanes - 1).bit_length()
        mid = []
        for i, cand in enumerate(reduce(leaves, levels // 2, "low")):
            mid.append(Signal(cand_layout, name=f"mid{i}"))
            m.d.sync += mid[-1].eq(cand)
        with m.If(merging & ~picked):
            m.d.sync += [best.eq(reduce(mid, levels - levels // 2, "high")[0]), picked.eq(1)]
        with m.If(pop):
            m.d.sync += picked.eq(0)

        inc1_valid = Signal()
        inc1_index = Signal(self.index_width)
        m.d.sync += [inc1_valid.eq(pop), inc1_index.eq(best.index)]
        with m.If(take):
            for j in range(route_lanes):
                m.d.sync += [dst.eq(src) for dst, src in zip(snap[j], lists[j], strict=True)]
            m.d.sync += [merging.eq(1), merge_done.eq(0), merge_count.eq(0), res_sum.eq(0)]
        with m.Elif(pop):
            for j in range(route_lanes):
                with m.If(best.sel[j]):
                    m.d.sync += [dst.eq(src) for dst, src in zip(snap[j], snap[j][1:] + [0], strict=True)]
            m.d.sync += [res_index[-1].eq(best.index), res_score[-1].eq(best.score),
                         res_sum.eq(res_sum + best.score), merge_count.eq(merge_count + 1)]
            m.d.sync += [res_index[r].eq(res_index[r + 1]) for r in range(top_k - 1)]
            m.d.sync += [res_score[r].eq(res_score[r + 1]) for r in range(top_k - 1)]
            with m.If(merge_count == top_k - 1):
                m.d.sync += [merging.eq(0), merge_done.eq(1)]
        with m.Elif(c_take):
            m.d.sync += merge_done.eq(0)

        # ---- load counters: read-modify-write pipeline and clear sweep -------------------
        loads = Memory(shape=unsigned(cfg.load_width), depth=n, init=[])
        m.submodules.loads = loads
        lw = loads.write_port()
        lr = loads.read_port(domain="sync", transparent_for=(lw,))
        lh = loads.read_port(domain="sync")
        inc2_valid = Signal()
        inc2_index = Signal(self.index_width)
        sweep = Signal(range(n))
        sweep_write = clearing & ~inc1_valid & ~inc2_valid
        top = 2 ** cfg.load_width - 1
        m.d.sync += [inc2_valid.eq(inc1_valid), inc2_index.eq(inc1_index)]
        m.d.comb += [lr.addr.eq(inc1_index), lh.addr.eq(self.load_addr),
                     self.load_data.eq(lh.data), self.load_clearing.eq(clearing)]
        with m.If(inc2_valid):
            m.d.comb += [lw.addr.eq(inc2_index), lw.en.eq(1),
                         lw.data.eq(Mux(lr.data == top, top, lr.data + 1))]
        with m.Elif(sweep_write):
            m.d.comb += [lw.addr.eq(sweep), lw.data.eq(0), lw.en.eq(1)]
        with m.If(self.load_clear):
            m.d.sync += [clearing.eq(1), sweep.eq(0)]
        with m.Elif(sweep_write):
            m.d.sync += sweep.eq(sweep + 1)
            with m.If(sweep == n - 1):
                m.d.sync += clearing.eq(0)

        # ---- stage 3: reciprocal, then one weight per output beat -------------------------
        m.submodules.renorm = renorm = Renormaliser(cfg, top_k * (2 ** cfg.score_width - 1))
        dividing = Signal()
        emitting = Signal()
        out_count = Signal(range(top_k))
        out_index = [Signal(self.index_width, name=f"out_index{r}") for r in range(top_k)]
        out_score = [Signal(cfg.score_width, name=f"out_score{r}") for r in range(top_k)]
        out_xfer = self.routes.valid & self.routes.ready
        out_last = out_count == top_k - 1
        m.d.comb += [
            c_take.eq(merge_done & (~(dividing | emitting) | (out_xfer & out_last))),
            renorm.total.eq(res_sum), renorm.start.eq(c_take), renorm.score.eq(out_score[0]),
            self.routes.valid.eq(emitting),
            self.routes.payload.index.eq(out_index[0]),
            self.routes.payload.weight.eq(renorm.weight),
            self.routes.payload.last.eq(out_last),
        ]
        with m.If(c_take):
            m.d.sync += [dividing.eq(1), emitting.eq(0), out_count.eq(0)]
            m.d.sync += [dst.eq(src) for dst, src in zip(out_index, res_index, strict=True)]
            m.d.sync += [dst.eq(src) for dst, src in zip(out_score, res_score, strict=True)]
        with m.Elif(dividing & ~renorm.busy):
            m.d.sync += [dividing.eq(0), emitting.eq(1)]
        with m.Elif(out_xfer):
            m.d.sync += [dst.eq(src) for dst, src in zip(out_index, out_index[1:], strict=False)]
            m.d.sync += [dst.eq(src) for dst, src in zip(out_score, out_score[1:], strict=False)]
            m.d.sync += out_count.eq(out_count + 1)
            with m.If(out_last):
                m.d.sync += emitting.eq(0)

        m.d.comb += self.idle.eq(~p1_valid & (beat == 0) & ~lists_full & ~merging & ~merge_done
                                 & ~dividing & ~emitting & ~inc1_valid & ~inc2_valid & ~clearing)
        return m
