"""The KDA state update of one head and one token, bit-exact to :func:`golden.kda.kda_head_step_int`.

Per step (``K = kda_head_dim``, ``U = act_width - 2``, ``W = 2 act_width`` the state width, every
shift rounded by ``cfg.rounding``)::

    S'  = round_shift(decay[:, None] S, score_frac)         row i scaled by decay_i
    e   = (v << act_frac) - round_shift(S'^T k, U)
    bk  = round_shift(beta k, score_frac)
    S'' = saturate(S' + round_shift(bk e^T, U), W)          the delta rule
    r   = round_shift(S''^T q, U)

Microarchitecture: the state streams in row by row and out row by row, in two passes of ``K`` rows.

* Pass 1 (``LOAD``) takes row ``i`` of ``S`` with ``decay_i``, ``k_i``, ``q_i``, ``v_i`` and ``beta``
  in one beat: ``K`` lanes scale the row (``S'_i = round_shift(decay_i S_i, score_frac)``) and write
  it to a ``K``-row memory, ``K`` more lanes accumulate ``acc_j += S'_ij k_i``; one lane forms
  ``bk_i``; ``q_i``, ``v_i`` and ``bk_i`` land in ``K``-word register files. Four stages: the beat
  registered (the multipliers' input registers), ``decay_i S_ij`` registered, ``S'_ij`` registered
  (and written), ``S'_ij k_i`` registered, then accumulated.
* ``SOLVE`` (one cycle): ``e_j = (v_j << act_frac) - round_shift(acc_j, U)``.
* Pass 2 (``EMIT``) reads the memory row by row: ``bk_i e_j`` registered, then ``S''_i`` into the
  output register; a side pipeline takes each row as it enters the output register, registers
  ``S''_ij q_i`` and accumulates it; after the last row, ``r`` is rounded into its own output
  register. Pass 2 stalls as a whole on the output's backpressure (:func:`~nanokpu.units.pwl.stall_pipeline`
  rule: every stage moves when the output register is empty or being taken).

The next step's pass 1 starts as soon as pass 2 has read the last row (it overlaps the drain of
the rows in flight and of ``r``); its ``SOLVE`` waits until the previous ``r`` is in its register.

``4K + 1`` products (``decay_i S_ij``, ``S'_ij k_i``, ``bk_i e_j``, ``S''_ij q_i`` in ``K`` lanes each,
``beta k_i``), inferred ``a * b``: the state operand is ``W`` = 32 bits at ``act_width`` 16, wider
than :class:`nanokpu.units.dsp.Multiplier`'s 18-bit limit, and Yosys splits them over DSP blocks.

Widths (:func:`kda_state_ranges`): every register holds the exact range of its value over *all*
inputs of the ports (the full ``W``-bit state, ``score_width``-bit ``decay`` and ``beta`` up to
``2**(score_frac+1) - 1``, and ``act_width``-bit ``k``, ``q``, ``v``), by interval arithmetic on
the golden expressions (products at the corners of their operands, sums of ``K`` products, each
rounding monotone): the golden model sums in int64 without saturating except in the delta rule,
and so does the unit, so nothing wraps. At ``tiny`` (``act_width`` 16, ``score_frac`` 12, ``K`` 8):
``S'`` 33 bits, ``acc`` 51, ``e`` 37, ``bk`` 17, ``bk e`` 53, ``S''`` 32, the read-out sum 51,
``r`` 37 (``small``, ``K`` 16: one bit more for ``acc``, ``e``, ``bk e``, the sum and ``r``).
"""

from __future__ import annotations

from amaranth import Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from golden import intops as I
from nanokpu.config import KpuConfig
from nanokpu.units.memport import unchecked_read_port
from nanokpu.units.pwl import range_shape, round_shift, saturate

__all__ = ["KdaStateUpdate", "kda_row_layout", "kda_state_ranges"]


def kda_row_layout(cfg: KpuConfig) -> data.StructLayout:
    """One input beat, row ``i`` of a step: ``s`` (row ``i`` of ``S``, ``K`` state-format words),
    ``decay`` (``decay_i``, unsigned ``score_width`` bits), ``k``, ``q`` (``k_i``, ``q_i``, unit
    format), ``v`` (``v_i``, act format) and ``beta`` (the head's, unsigned ``score_width`` bits)."""
    K, a = cfg.kda_head_dim, cfg.act_width
    return data.StructLayout({"s": data.ArrayLayout(signed(cfg.kda_state_width), K), "decay": cfg.score_width,
                              "k": signed(a), "q": signed(a), "v": signed(a), "beta": cfg.score_width})


def _mul(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    corners = [x * y for x in a for y in b]
    return min(corners), max(corners)


def kda_state_ranges(cfg: KpuConfig) -> dict[str, tuple[int, int]]:
    """``(min, max)`` of every intermediate of a step over all port inputs (module docstring): ``s1``
    (``S'``), ``acc`` (``S'^T k``), ``e``, ``bk``, ``delta`` (``bk_i e_j``, before rounding), ``s2``
    (``S''``), ``racc`` (``S''^T q``), ``r``; and ``widest``, the largest magnitude of them all.
    ``ValueError`` naming the field when ``cfg`` has no unit format or the golden int64 would
    overflow."""
    a, sf, K, u, w = cfg.act_width, cfg.score_frac, cfg.kda_head_dim, cfg.kda_unit_frac, cfg.kda_state_width
    if u < 0:
        raise ValueError(f"KpuConfig.act_width = {a}: must be at least 2 (the unit format Q<act_width>.<act_width-2>)")
    state = (-(1 << (w - 1)), (1 << (w - 1)) - 1)
    act = (-(1 << (a - 1)), (1 << (a - 1)) - 1)
    score = (0, (1 << cfg.score_width) - 1)
    p_s1 = _mul(state, score)
    widest = max(-p_s1[0], p_s1[1])

    def rs(r, shift):   # round_shift is monotone: the range's ends map to the result's
        nonlocal widest
        widest = max(widest, -r[0], r[1])
        if widest >= 1 << 62:
            raise ValueError(f"KpuConfig.kda_head_dim = {K} with act_width = {a}: a step's sums reach "
                             f"2**{widest.bit_length()}, beyond the golden model's int64")
        lo, hi = I.round_shift([r[0], r[1]], shift, cfg.rounding)
        return int(lo), int(hi)

    s1 = rs(p_s1, sf)
    acc = tuple(K * x for x in _mul(s1, act))
    pred = rs(acc, u)
    shift_v = cfg.kda_state_frac - cfg.act_frac
    e = ((act[0] << shift_v) - pred[1], (act[1] << shift_v) - pred[0])
    bk = rs(_mul(score, act), sf)
    delta = _mul(bk, e)
    rs(delta, u)
    racc = tuple(K * x for x in _mul(state, act))
    r = rs(racc, u)
    return {"s1": s1, "acc": acc, "e": e, "bk": bk, "delta": delta, "s2": state, "racc": racc, "r": r,
            "widest": (-widest, widest)}


class KdaStateUpdate(wiring.Component):
    """One head's KDA state update per step, the state streamed in and out row by row.

    Parameters
    ----------
    cfg : KpuConfig
        Reads ``kda_head_dim`` (``K``), ``act_width``/``act_frac``, ``score_frac``, ``rounding``.

    Members
    -------
    i : In(stream.Signature(kda_row_layout(cfg)))
        ``K`` beats per step, row ``i`` in beat ``i`` (``i = 0 .. K-1``). ``bk_i`` is formed from
        beat ``i``'s ``beta``: send the head's ``beta`` on every beat.
    o : Out(stream.Signature(ArrayLayout(signed(2 act_width), K)))
        ``K`` beats per step: row ``i`` of the new state ``S''`` in beat ``i``.
    r : Out(stream.Signature(ArrayLayout(shapes["r"], K)))
        One beat per step, after its last ``o`` row has entered the output register: the read-out
        ``r = round_shift(S''^T q, U)`` (state format, not saturated).
    ranges : dict[str, tuple[int, int]]
        :func:`kda_state_ranges` of ``cfg``.
    shapes : dict[str, Shape]
        The narrowest shape of each of those ranges (the registers' shapes).

    Timing (beats always offered, ``o`` and ``r`` always ready; counted in clock edges from the
    edge that takes the step's first beat): the next step's first beat is taken :attr:`step_cycles`
    ``= 2K + 5`` edges later, row ``i`` of ``o`` :meth:`row_latency` ``= K + 8 + i`` edges later and
    ``r`` :attr:`r_latency` ``= 2K + 10`` edges later. Under backpressure pass 2 stalls; the next
    step's ``K`` beats are still taken, and its ``SOLVE`` waits until the previous step's ``r`` is in
    the ``r`` output register.
    """

    def __init__(self, cfg: KpuConfig):
        if not isinstance(cfg, KpuConfig):
            raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
        self.cfg = cfg
        self.ranges = kda_state_ranges(cfg)
        self.shapes = {name: range_shape(*rng) for name, rng in self.ranges.items() if name != "widest"}
        K, w = cfg.kda_head_dim, cfg.kda_state_width
        super().__init__({
            "i": In(stream.Signature(kda_row_layout(cfg))),
            "o": Out(stream.Signature(data.ArrayLayout(signed(w), K))),
            "r": Out(stream.Signature(data.ArrayLayout(self.shapes["r"], K))),
        })

    @property
    def step_cycles(self) -> int:
        """Edges per step at full rate: ``K`` beats, 3 more until the last ``S'_i k_i`` is summed,
        ``SOLVE``, ``K`` rows read in ``EMIT``."""
        return 2 * self.cfg.kda_head_dim + 5

    def row_latency(self, i: int) -> int:
        """Edges from the one taking the step's first beat to the one taking row ``i`` of ``o`` (full
        rate): ``K + 4`` to ``SOLVE``'s, then the read, ``bk e``, the output register and the transfer."""
        return self.cfg.kda_head_dim + 8 + i

    @property
    def r_latency(self) -> int:
        """Edges from the one taking the step's first beat to the one taking ``r`` (full rate): the last
        row in the output register, ``S''_i q_i`` registered, summed, ``r`` rounded, the transfer."""
        return 2 * self.cfg.kda_head_dim + 10

    def elaborate(self, platform):
        m = Module()
        cfg, sh = self.cfg, self.shapes
        K, a, w, u, sf = cfg.kda_head_dim, cfg.act_width, cfg.kda_state_width, cfg.kda_unit_frac, cfg.score_frac
        mode = cfg.rounding
        idx = range(K + 1)

        def lanes(shape, name):
            return Signal(data.ArrayLayout(shape, K), name=name)

        # -- K-word register files of q_i, v_i, bk_i; the memory of S' rows --------------
        q_rf, v_rf, bk_rf = lanes(signed(a), "q_rf"), lanes(signed(a), "v_rf"), lanes(sh["bk"], "bk_rf")
        m.submodules.rows = rows = Memory(shape=data.ArrayLayout(sh["s1"], K), depth=K, init=[],
                                          attrs={"no_rw_check": 1})
        # pass 2 reads only in EMIT, after pass 1 wrote its last row (LOAD drains before SOLVE)
        wr, rd = rows.write_port(), unchecked_read_port(m, rows, "rows")

        # -- pass 1: beat -> a (operands) -> b (products) -> c (S', written) -> d (S' k) -> acc --
        n1 = Signal(idx)                       # beats taken this step
        va, vb, vc, vd = (Signal(name=f"v{s}") for s in "abcd")
        s_a, dec_a = lanes(signed(w), "s_a"), Signal(cfg.score_width)
        k_a, beta_a, i_a = Signal(signed(a)), Signal(cfg.score_width), Signal(range(K))
        p_b, bkp_b = lanes(signed(w + cfg.score_width + 1), "p_b"), Signal(signed(a + cfg.score_width + 1))
        k_b, i_b = Signal(signed(a)), Signal(range(K))
        s1_c, k_c, i_c = lanes(sh["s1"], "s1_c"), Signal(signed(a)), Signal(range(K))
        pk_d = lanes(signed(len(s1_c[0]) + a), "pk_d")
        acc = lanes(sh["acc"], "acc")
        beat = self.i.payload
        take = self.i.valid & self.i.ready
        m.d.sync += [va.eq(take), vb.eq(va), vc.eq(vb), vd.eq(vc)]
        with m.If(take):
            m.d.sync += [s_a.eq(beat.s), dec_a.eq(beat.decay), k_a.eq(beat.k), beta_a.eq(beat.beta),
                         i_a.eq(n1), q_rf[n1].eq(beat.q), v_rf[n1].eq(beat.v), n1.eq(n1 + 1)]
        m.d.sync += [p_b[j].eq(s_a[j] * dec_a) for j in range(K)]
        m.d.sync += [bkp_b.eq(k_a * beta_a), k_b.eq(k_a), i_b.eq(i_a)]
        m.d.sync += [s1_c[j].eq(round_shift(p_b[j], sf, mode)) for j in range(K)]
        m.d.sync += [k_c.eq(k_b), i_c.eq(i_b)]
        with m.If(vb):
            m.d.sync += bk_rf[i_b].eq(round_shift(bkp_b, sf, mode))
        m.d.comb += [wr.addr.eq(i_c), wr.data.eq(s1_c), wr.en.eq(vc)]
        m.d.sync += [pk_d[j].eq(s1_c[j] * k_c) for j in range(K)]
        with m.If(vd):
            m.d.sync += [acc[j].eq(acc[j] + pk_d[j]) for j in range(K)]

        # -- SOLVE: e ---------------------------------------------------------------------
        e = lanes(sh["e"], "e")
        shift_v = cfg.kda_state_frac - cfg.act_frac

        # -- pass 2: read (1) -> bk e (2) -> S'' in the output register (3) -----------------
        advance = Signal()
        o_valid = Signal()
        m.d.comb += [advance.eq(~o_valid | self.o.ready), self.o.valid.eq(o_valid), rd.en.eq(advance)]
        n2 = Signal(idx)                       # rows read this step
        issue = Signal()
        v1, v2, last1, last2, last3 = (Signal(name=n) for n in ("v1", "v2", "last1", "last2", "last3"))
        bk_1, q_1, q_2, q_3 = Signal(sh["bk"]), Signal(signed(a)), Signal(signed(a)), Signal(signed(a))
        pd_2, s1_2 = lanes(sh["delta"], "pd_2"), lanes(sh["s1"], "s1_2")
        o_row = lanes(sh["s2"], "o_row")
        m.d.comb += [rd.addr.eq(n2), self.o.payload.eq(o_row)]
        with m.If(advance):
            m.d.sync += [v1.eq(issue), last1.eq(n2 == K - 1), bk_1.eq(bk_rf[n2]), q_1.eq(q_rf[n2]),
                         v2.eq(v1), last2.eq(last1), q_2.eq(q_1), s1_2.eq(rd.data),
                         o_valid.eq(v2), last3.eq(last2), q_3.eq(q_2)]
            m.d.sync += [pd_2[j].eq(bk_1 * e[j]) for j in range(K)]
            m.d.sync += [o_row[j].eq(saturate(s1_2[j] + round_shift(pd_2[j], u, mode), w)) for j in range(K)]
            with m.If(issue):
                m.d.sync += n2.eq(n2 + 1)

        # -- the read-out: each row as it enters the output register, times q_i, summed -----
        loaded, loaded_last, pr_valid, pr_last = (Signal(name=n) for n in ("loaded", "loaded_last",
                                                                           "pr_valid", "pr_last"))
        pr = lanes(signed(w + a), "pr")
        racc = lanes(sh["racc"], "racc")
        done = Signal()                        # racc holds the step's whole sum
        r_pending = Signal()                   # a step in EMIT or after whose r is not in its register
        r_valid, r_row = Signal(), lanes(sh["r"], "r_row")
        m.d.comb += [self.r.valid.eq(r_valid), self.r.payload.eq(r_row)]
        m.d.sync += [loaded.eq(advance & v2), loaded_last.eq(advance & v2 & last2),
                     pr_valid.eq(loaded), pr_last.eq(loaded & loaded_last)]
        m.d.sync += [pr[j].eq(o_row[j] * q_3) for j in range(K)]
        with m.If(pr_valid):
            m.d.sync += [racc[j].eq(racc[j] + pr[j]) for j in range(K)]
            m.d.sync += done.eq(pr_last)
        with m.If(self.r.ready):
            m.d.sync += r_valid.eq(0)
        with m.If(done & (~r_valid | self.r.ready)):
            m.d.sync += [r_valid.eq(1), done.eq(0), r_pending.eq(0)]
            m.d.sync += [r_row[j].eq(round_shift(racc[j], u, mode)) for j in range(K)]
            m.d.sync += [racc[j].eq(0) for j in range(K)]

        with m.FSM():
            with m.State("LOAD"):
                m.d.comb += self.i.ready.eq(n1 != K)
                # the last S'_i k_i is summed at this edge (vd) and read by SOLVE in the next cycle
                with m.If((n1 == K) & ~(va | vb | vc) & ~r_pending):
                    m.next = "SOLVE"
            with m.State("SOLVE"):
                m.d.sync += [e[j].eq((v_rf[j] << shift_v) - round_shift(acc[j], u, mode)) for j in range(K)]
                m.d.sync += [acc[j].eq(0) for j in range(K)] + [n1.eq(0), n2.eq(0), r_pending.eq(1)]
                m.next = "EMIT"
            with m.State("EMIT"):
                m.d.comb += issue.eq(n2 != K)
                with m.If(advance & (n2 == K - 1)):
                    m.next = "LOAD"
        return m
