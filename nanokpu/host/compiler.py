"""Compile a quantised LatentMoE block and its input batch into a nano-KPU program and memory images.

:func:`compile_block` lowers :class:`golden.block.QuantLatentMoE` and its input batch ``x_r [T, d]``
(int8, or ``router_operand_width`` bits: :func:`golden.block.quantize_input`) to a
:class:`Program`: the instructions (:mod:`nanokpu.isa`), the host memory image the nano-KPU reads
through its AXI4 master port (inputs, weights, constants; room for the outputs) and the
scratchpad map. The program follows the dataflow of :mod:`golden.block`, the router first so
that routing can start early and the shared expert (which needs only ``x``) next to it::

    LOAD x; (LOAD rq tables: per-channel weight scales); GEMM W_r (+ requantiser); SIGMOID -> scores
    LOAD bias, (rq tables: per-tensor); ROUTE; GEMM W_down_lat (+ requantiser) -> z
    shared expert on x -> y_s (constants in the instructions)
    loop: EXPERT (next expert with tokens, else exit)
          GATHER z rows of its tokens; (LOAD its rq tables: per-channel); GEMM W_gate_j
          (host + j*stride, m = count, per-expert requantiser constants or its tables); GEMM
          W_up_j; SITU; REQUANT h; GEMM W_down_j;
          SCATTER into e [T, k, l]; JUMP loop
    COMBINE; NORM; GEMM W_up_lat -> y_r; ADD -> y; STORE y, route table; HALT

With a wide router (``cfg.wide_router``) the first steps are instead::

    LOAD x_r (2 bytes an element); REQUANT x_r -> x (mult 1, shift r - in_width, width in_width:
    golden.block.input_int8); SPLIT x_r -> [Xh; Xl] [2T, d]; (LOAD rq tables)
    GEMM [Xh; Xl] @ Wh^T, [Xh; Xl] @ Wl^T (raw, width 0) -> [P_hh; P_lh; P_hl; P_ll] [4T, E]
    REQUANT_WIDE -> router logits (the router's requantiser: its table with per-channel scales)

the router GEMM as four byte-sliced digit GEMMs (:func:`golden.intops.split_digits`, ``W_r``'s
digits ``Wh``, ``Wl`` split here, on the host) whose partial sums ``REQUANT_WIDE`` joins exactly
(:func:`golden.intops.join_partials`, ``router_acc_width`` bits) and requantises.

Routing is data-dependent and done on chip: the compiler never looks at the scores. Experts no
token chose are skipped by ``EXPERT``; tokens are grouped per expert by ``ROUTE``'s lists.

Host image layout (byte offsets in :attr:`Program.symbols`, every buffer aligned to
:func:`~nanokpu.isa.bus_bytes`): ``x`` int8 (int16 with a wide router; int32 with ``x_words``), then the weights as GEMM
panels (:func:`~nanokpu.isa.weight_panels`): ``w_down_lat``, ``w_r`` (with a wide router its high
digit, then ``w_r_lo``), ``experts`` (per expert: gate, up,
down, with ``weight_scales = "channel"`` then their per-column tables as int32 words
(:func:`expert_rq_tables`), ``expert_stride`` bytes apart), ``w_up_lat``, shared
``ws_gate``/``ws_up``/``ws_down``; then ``bias`` and ``rq`` (int32 words: the resident requantiser
tables of :func:`rq_tables`, the per-expert ``(mult, shift)`` of gate, up, h and out, ``[4, E,
2]`` with ``"tensor"``; with ``"channel"`` h's per expert and the other GEMMs' per-column tables,
in the :mod:`nanokpu.isa` layout, each loaded scratchpad table the ``b`` of a GEMM flagged
``F_RQ_CHANNEL``), then the outputs ``y`` [T, d]
and ``route`` (the route table, :func:`nanokpu.isa.route_table`) as int32 words.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from golden import intops as I
from golden.block import QuantExpert, QuantLatentMoE, Requant, router_qmax
from nanokpu.config import KpuConfig
from nanokpu.isa import (
    F_HOST_EXPERT,
    F_M_COUNT,
    F_RQ_CHANNEL,
    F_RQ_EXPERT,
    Instr,
    Op,
    bus_bytes,
    route_table,
    weight_panels,
)

__all__ = ["HostImage", "Program", "RowsProgram", "SpadMap", "check_requant", "compile_block", "gemm_over_limit",
           "glu_steps", "load_tables", "rq_fields", "rq_words"]


@dataclass
class Program:
    """A compiled block.

    Members
    -------
    instrs : list of Instr
    image : bytearray
        Host memory image (inputs and weights filled in, outputs zero).
    symbols : dict
        Byte offset of every host buffer.
    spad : dict
        Word address of every scratchpad buffer; ``spad["end"]`` words are used.
    T : int
        Tokens of the batch.
    cfg : KpuConfig
    """

    instrs: list
    image: bytearray
    symbols: dict
    spad: dict
    T: int
    cfg: KpuConfig
    notes: list = field(default_factory=list)

    def outputs(self, host) -> dict:
        """Decode the outputs from a host memory (``bytes``-like): ``y [T, d]``, ``idx``,
        ``weights [T, k]``, ``loads [E]`` (the per-expert counts of the route table)."""
        cfg, T = self.cfg, self.T
        buf = np.frombuffer(bytes(host), dtype="<i4")
        y = buf[self.symbols["y"] // 4:][:T * cfg.d_model].astype(np.int64).reshape(T, cfg.d_model)
        rt = route_table(0, T, cfg)
        table = buf[self.symbols["route"] // 4:][:rt["end"]].astype(np.int64)
        tk = T * cfg.top_k
        return {"y": y, "idx": table[:tk].reshape(T, -1), "weights": table[tk:2 * tk].reshape(T, -1),
                "loads": table[rt["counts"]:rt["offsets"]]}


@dataclass
class RowsProgram:
    """A compiled program whose result is ``[T, d_model]`` act-format rows stored as int32 words at
    the host symbol ``out``: ``instrs``, the host ``image``, ``symbols`` (byte offsets), ``T``
    tokens, ``cfg``, ``out``, ``spad`` (word address of each scratchpad buffer, where one layout
    serves the whole program)."""

    instrs: list
    image: bytearray
    symbols: dict
    T: int
    cfg: KpuConfig
    out: str
    spad: dict = field(default_factory=dict)

    def outputs(self, host) -> np.ndarray:
        """The result ``[T, d_model]`` (act format) from a host memory after the run."""
        d = self.cfg.d_model
        buf = np.frombuffer(bytes(host), dtype="<i4")
        return buf[self.symbols[self.out] // 4:][:self.T * d].astype(np.int64).reshape(self.T, d)


class HostImage:
    """Host image builder: buffers aligned to ``align`` bytes."""

    def __init__(self, align: int):
        self.image = bytearray()
        self.symbols = {}
        self.align = align

    def put(self, name: str, data: bytes) -> int:
        offset = len(self.image)
        self.symbols[name] = offset
        self.image += data + bytes(-len(data) % self.align)
        return offset

    def int8(self, name: str, arr) -> int:
        return self.put(name, np.asarray(arr, dtype=np.int64).astype(np.int8).tobytes())

    def int32(self, name: str, arr) -> int:
        return self.put(name, np.asarray(arr, dtype=np.int64).astype("<i4").tobytes())

    def act(self, name: str, arr, words: bool = False) -> int:
        """Act-format values: int16 (``LOAD`` width 2), or int32 words with ``words`` (width 4: a
        buffer another linked program stores, :mod:`nanokpu.host.link`)."""
        return self.int32(name, arr) if words else self.put(name, np.asarray(arr, dtype=np.int64)
                                                              .astype("<i2").tobytes())


class SpadMap:
    """Scratchpad buffers placed one after another: ``map`` from name to first word, ``top`` the
    next free word."""

    def __init__(self, depth: int):
        self.depth = depth
        self.map = {}
        self.top = 0

    def alloc(self, name: str, words: int) -> int:
        self.map[name] = self.top
        self.top += words
        return self.map[name]


def check_requant(rq: Requant, cfg: KpuConfig, what: str):
    """ValueError naming ``what`` when ``rq``'s multiplier or shift does not fit the instruction fields."""
    mult, shift = np.asarray(rq.mult), np.asarray(rq.shift)
    if np.any(mult < 0) or np.any(mult >= 1 << 31) or np.any(shift < 0) or np.any(shift >= 64):
        raise ValueError(f"{what}: requantiser mult={rq.mult} shift={rq.shift} out of range")


def rq_fields(rq: Requant, table: int | None, cfg: KpuConfig, what: str) -> dict:
    """A requantising instruction's fields (``GEMM``, ``REQUANT``): ``rq``'s constants (checked,
    ``ValueError`` naming ``what``), or with per-column scales :data:`~nanokpu.isa.F_RQ_CHANNEL` and
    its table at the scratchpad word ``table`` (:func:`rq_words`)."""
    if rq.per_column:
        return dict(flags=F_RQ_CHANNEL, b=table, width=rq.width)
    check_requant(rq, cfg, what)
    return dict(mult=rq.mult, shift=rq.shift, width=rq.width)


def load_tables(tables: dict[str, np.ndarray], host: int, spad: SpadMap) -> tuple[dict[str, int], Instr]:
    """Int32 ``tables`` kept in the scratchpad (requantiser tables, norm weights, ...), their host buffer
    at ``host`` (their concatenation in order): one region ``"tables"`` allocated in ``spad``, each
    table's scratchpad word address by name, and the one ``LOAD`` that brings them all in."""
    base = spad.alloc("tables", sum(t.size for t in tables.values()))
    addr, at = {}, base
    for name, t in tables.items():
        addr[name], at = at, at + t.size
    return addr, Instr(Op.LOAD, m=1, n=at - base, c=base, host=host, width=4)


#: The routed expert's GEMMs whose per-column tables (``weight_scales = "channel"``) sit in each
#: expert's host region and are loaded with its weights' expert (:func:`expert_rq_tables`).
EXPERT_GEMMS = ("gate", "up", "out")


def rq_tables(cfg: KpuConfig) -> dict[str, int]:
    """The requantiser tables of a block in the ``rq`` buffer, in order: name -> words. Per
    tensor, per expert (``F_RQ_EXPERT``) ``gate``, ``up``, ``h``, ``out``: ``2*E`` words each.
    With ``weight_scales = "channel"``: ``h`` per expert (``2*E``), then the per-column tables
    of the other GEMMs: ``down_lat``, ``router``, ``up_lat``, ``s_gate``, ``s_up``, ``s_down``
    (``2*n`` words each), then room for one expert's :func:`expert_rq_tables` (loaded per
    expert, ``F_HOST_EXPERT``)."""
    E, lat, d, ds = cfg.n_experts, cfg.d_latent, cfg.d_model, cfg.d_shared
    if cfg.weight_scales != "channel":
        return {"gate": 2 * E, "up": 2 * E, "h": 2 * E, "out": 2 * E}
    return {"h": 2 * E, "down_lat": 2 * lat, "router": 2 * E, "up_lat": 2 * d, "s_gate": 2 * ds,
            "s_up": 2 * ds, "s_down": 2 * d} | expert_rq_tables(cfg)


def expert_rq_tables(cfg: KpuConfig) -> dict[str, int]:
    """With ``weight_scales = "channel"``, one routed expert's per-column tables, in order:
    name (:data:`EXPERT_GEMMS`) -> words (``2*n``); empty per tensor."""
    if cfg.weight_scales != "channel":
        return {}
    return {"gate": 2 * cfg.d_expert, "up": 2 * cfg.d_expert, "out": 2 * cfg.d_latent}


def rq_words(rqs) -> np.ndarray:
    """The table of the :class:`Requant` ``rqs`` (one, or one per expert) in the :mod:`nanokpu.isa`
    layout: ``[n, len(rqs), 2]`` per column, ``[len(rqs), 2]`` per tensor, flattened."""
    mult = np.array([r.mult for r in rqs], dtype=np.int64)       # [E] or [E, n]
    shift = np.array([r.shift for r in rqs], dtype=np.int64)
    return np.stack([mult.T, shift.T], axis=-1).ravel()


#: The scratchpad buffers of a block, in address order (:func:`spad_layout`).
SPAD_BUFFERS = ("x", "z", "logit", "scores", "bias", "rq", "route", "zg", "g", "u", "h", "h8", "eo", "e",
                "combined", "norm", "y_r", "y_s", "y")

#: The wide router's buffers (``cfg.wide_router``; empty otherwise), in address
#: order from ``zg`` on: its input ``x_r``, its digits ``[Xh; Xl]`` and the digit GEMMs' sums. All
#: are read before ``ROUTE`` and the buffers from ``zg`` on are first written after it, so they share
#: those words.
WIDE_BUFFERS = ("x_r", "digits", "partials")


def spad_layout(cfg: KpuConfig, tokens: int) -> SpadMap:
    """Where :func:`compile_block` puts the buffers of a ``tokens``-token block in the scratchpad:
    ``map`` from each :data:`SPAD_BUFFERS` and :data:`WIDE_BUFFERS` name (and ``end``) to its first word."""
    T, d, lat, E, k = tokens, cfg.d_model, cfg.d_latent, cfg.n_experts, cfg.top_k
    hid = max(cfg.d_expert, cfg.d_shared)
    words = {"x": T * d, "z": T * lat, "logit": T * E, "scores": T * E, "bias": E, "rq": sum(rq_tables(cfg).values()),
             "route": route_table(0, T, cfg)["end"], "zg": T * lat, "g": T * hid, "u": T * hid, "h": T * hid,
             "h8": T * hid, "eo": T * lat, "e": T * k * lat, "combined": T * lat, "norm": T * lat,
             "y_r": T * d, "y_s": T * d, "y": T * d}
    sp = SpadMap(cfg.dmem_depth)
    for name in SPAD_BUFFERS:
        sp.alloc(name, words[name])
    top, sp.top = sp.top, sp.map["zg"]
    wide = cfg.wide_router
    for name, size in zip(WIDE_BUFFERS, (T * d, 2 * T * d, 4 * T * E), strict=True):
        sp.alloc(name, wide * size)
    sp.top = max(top, sp.top)
    sp.map["end"] = sp.top
    return sp


def block_gemms(cfg: KpuConfig, tokens: int) -> list[tuple[str, int, int, int]]:
    """``(name, M, K, N)`` of the GEMMs of one LatentMoE block (``shared/k3-spec.md``); the routed
    experts' M is the mean tokens per expert (at least 1; a real expert takes 0 to ``tokens``).
    With a wide router its GEMM is two digit GEMMs of ``M = 2 * tokens`` (``[Xh; Xl]`` by ``Wh``,
    then by ``Wl``), listed once."""
    per_expert = max(1, tokens * cfg.top_k // cfg.n_experts)
    d, lat = cfg.d_model, cfg.d_latent
    return [
        ("router x W_r^T", tokens * (2 if cfg.wide_router else 1), d, cfg.n_experts),
        ("down-projection to latent", tokens, d, lat),
        ("expert gate / up", per_expert, lat, cfg.d_expert),
        ("expert down", per_expert, cfg.d_expert, lat),
        ("up-projection from latent", tokens, lat, d),
        ("shared expert gate / up", tokens, d, cfg.d_shared),
        ("shared expert down", tokens, cfg.d_shared, d),
    ]


def _over_limit(cfg: KpuConfig, tokens: int) -> str | None:
    """Why a ``tokens``-token block of ``cfg`` does not fit the nano-KPU, or None."""
    need = spad_layout(cfg, tokens).top
    if need > cfg.dmem_depth:
        return f"the block needs {need:,} scratchpad words, dmem_depth = {cfg.dmem_depth:,}"
    for name, _, kk, n in block_gemms(cfg, tokens):
        why = gemm_over_limit(cfg, name, tokens, kk, n)
        if why:
            return why
    return None


def gemm_over_limit(cfg: KpuConfig, name: str, m: int, k: int, n: int) -> str | None:
    """Why the GEMM ``name`` of ``m x k x n`` exceeds the GEMM engine's scratchpads, or None."""
    mb = -(-m // cfg.rows)
    for depth, words in (("spad_a_depth", mb * k), ("spad_b_depth", 2 * k), ("spad_c_depth", mb * n)):
        if words > getattr(cfg, depth):
            return (f"the {name} GEMM ({m} x {k} x {n}) needs {words:,} words in the GEMM engine, "
                    f"{depth} = {getattr(cfg, depth):,}")
    return None


def check_tokens(cfg: KpuConfig, tokens: int) -> None:
    """``ValueError`` naming ``tokens`` and the size it exceeds unless a ``tokens``-token block of
    ``cfg`` fits the nano-KPU: its buffers the scratchpad (``dmem_depth``), each GEMM (any expert
    may take every token) the GEMM engine's scratchpads. Cheap: no weights are made."""
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ValueError(f"tokens = {tokens!r}: must be a positive integer")
    why = _over_limit(cfg, tokens)
    if why:
        raise ValueError(f"tokens = {tokens}: {why} (at most {max_tokens(cfg)} tokens for profile {cfg.name!r})")


def max_tokens(cfg: KpuConfig) -> int:
    """The most tokens a block of ``cfg`` can have (:func:`check_tokens`); 0 if none fits."""
    lo, hi = 0, cfg.dmem_depth   # a block of lo tokens fits (or lo = 0); a token takes a word at least
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _over_limit(cfg, mid) is None else (lo, mid - 1)
    return lo


def glu_steps(ex: QuantExpert, T: int, x: int, bufs, out: int, hosts, tables, cfg: KpuConfig) -> list:
    """The instructions of :func:`golden.block.expert_int` (a SiTU-GLU expert, every token) on the
    ``T`` int8 rows at scratchpad word ``x``: GEMM gate, GEMM up (into ``bufs`` ``g``, ``u``), SITU
    (``h``), REQUANT (``h8``), GEMM down (into ``out``, act format). ``hosts``: the host offsets of
    the gate, up and down weight panels; ``tables``: the scratchpad words of their per-column
    requantiser tables (``F_RQ_CHANNEL``), or None for the constants of ``ex`` (checked)."""
    f, d_in, d_out = ex.W_gate.shape[0], ex.W_gate.shape[1], ex.W_down.shape[0]
    g, u, h, h8 = bufs

    def gemm(a, host, c, k, n, r: Requant, table):
        if table is not None:
            return Instr(Op.GEMM, flags=F_RQ_CHANNEL, m=T, k=k, n=n, a=a, b=table, c=c, host=host, width=r.width)
        check_requant(r, cfg, "requantiser")
        return Instr(Op.GEMM, m=T, k=k, n=n, a=a, c=c, host=host, mult=r.mult, shift=r.shift, width=r.width)

    tables = tables or (None, None, None)
    check_requant(ex.rq_h, cfg, "requantiser")
    return [
        gemm(x, hosts[0], g, d_in, f, ex.rq_gate, tables[0]),
        gemm(x, hosts[1], u, d_in, f, ex.rq_up, tables[1]),
        Instr(Op.SITU, m=T, n=f, a=g, b=u, c=h),
        Instr(Op.REQUANT, m=T, n=f, a=h, c=h8, mult=ex.rq_h.mult, shift=ex.rq_h.shift, width=ex.rq_h.width),
        gemm(h8, hosts[2], out, f, d_out, ex.rq_out, tables[2]),
    ]


def compile_block(Q: QuantLatentMoE, x_r, cfg: KpuConfig, x_words: bool = False) -> Program:
    """Lower the block ``Q`` on the batch ``x_r [T, d]`` (:func:`golden.block.quantize_input`: int8,
    or ``router_operand_width`` bits within :func:`golden.block.router_qmax`) to a :class:`Program`.
    ``x_words``: ``x`` in host memory as int32 words (a buffer another program stores,
    :mod:`nanokpu.host.link`), else int8 (int16 with a wide router).

    Raises
    ------
    ValueError
        If the batch has the wrong shape, a value or constant does not fit its field, or the
        block does not fit the nano-KPU (:func:`check_tokens`).
    """
    x_r = np.asarray(x_r, dtype=np.int64)
    d, lat, E, k = cfg.d_model, cfg.d_latent, cfg.n_experts, cfg.top_k
    dx = cfg.d_expert
    if x_r.ndim != 2 or x_r.shape[1] != d or x_r.shape[0] < 1:
        raise ValueError(f"x_r: shape {x_r.shape} must be [T, d_model={d}] with T >= 1")
    T = x_r.shape[0]
    wide = cfg.wide_router
    if wide:    # two in_width-bit digits each
        lim = router_qmax(cfg)
        for name, v in (("x_r", x_r), ("Q.W_r", Q.W_r)):
            if np.abs(v).max() > lim:
                raise ValueError(f"{name}: values must be within +-{lim} (golden.block.router_qmax)")
    elif x_r.min() < -(1 << (cfg.in_width - 1)) or x_r.max() >= 1 << (cfg.in_width - 1):
        raise ValueError(f"x_r: values must fit int{cfg.in_width}")
    if len(Q.experts) != E:
        raise ValueError(f"Q.experts: {len(Q.experts)} experts, config has n_experts={E}")

    if cfg.in_width != 8 or bus_bytes(cfg) % 4:
        raise ValueError(f"in_width = {cfg.in_width}, cols = {cfg.cols}: the compiler needs int8 "
                         "operands and cols a multiple of 4 (whole 32-bit bus words)")
    host = HostImage(bus_bytes(cfg))

    def panels(name, W):
        return host.int8(name, weight_panels(W, cfg))

    if x_words:
        h_x = host.int32("x", x_r)
    else:
        h_x = host.put("x", x_r.astype("<i2").tobytes()) if wide else host.int8("x", x_r)
    x_width = 4 if x_words else 2 if wide else 1
    h_dl = panels("w_down_lat", Q.W_down_lat)
    w_digits = I.split_digits(Q.W_r, cfg.in_width) if wide else (Q.W_r,)
    h_r = [panels(name, w) for name, w in zip(("w_r", "w_r_lo"), w_digits, strict=False)]
    per_col = cfg.weight_scales == "channel"
    offs = {}
    for j, ex in enumerate(Q.experts):
        start = len(host.image)
        for part in ("W_gate", "W_up", "W_down"):
            off = panels(f"e{j}_{part}", getattr(ex, part))
            offs[part] = off - start
        if per_col:     # the expert's per-column tables, loaded with it
            off = host.int32(f"e{j}_rq", np.concatenate([rq_words([getattr(ex, f"rq_{name}")])
                                                          for name in expert_rq_tables(cfg)]))
            offs["rq"] = off - start
        if j == 0:
            h_e = start
        stride = len(host.image) - start
    host.symbols["experts"] = h_e
    host.symbols["expert_stride"] = stride
    h_ul = panels("w_up_lat", Q.W_up_lat)
    h_sg = panels("ws_gate", Q.shared.W_gate)
    h_su = panels("ws_up", Q.shared.W_up)
    h_sd = panels("ws_down", Q.shared.W_down)
    h_b = host.int32("bias", Q.bias)
    for j, ex in enumerate(Q.experts):
        for part in ("rq_gate", "rq_up", "rq_h", "rq_out"):
            check_requant(getattr(ex, part), cfg, f"expert {j} {part}")
    table_of = {name: [getattr(ex, f"rq_{name}") for ex in Q.experts] for name in ("gate", "up", "h", "out")}
    table_of |= {"down_lat": [Q.rq_down_lat], "router": [Q.rq_router], "up_lat": [Q.rq_up_lat],
                 "s_gate": [Q.shared.rq_gate], "s_up": [Q.shared.rq_up], "s_down": [Q.shared.rq_out]}
    resident = {name: words for name, words in rq_tables(cfg).items() if name not in expert_rq_tables(cfg)}
    tables = [rq_words(table_of[name]) for name in resident]
    assert [w.size for w in tables] == list(resident.values()), "the block's requantisers per column?"
    h_rq = host.int32("rq", np.concatenate(tables))
    rt = route_table(0, T, cfg)
    h_y = host.int32("y", np.zeros(T * d))
    h_route = host.int32("route", np.zeros(rt["end"]))

    check_tokens(cfg, T)
    sp = spad_layout(cfg, T)
    s_x, s_z, s_logit, s_score, s_bias, s_rq, s_rt, s_zg, s_g, s_u, s_h, s_h8, s_eo, s_e, s_uc, s_n, s_yr, s_ys, \
        s_y = (sp.map[name] for name in SPAD_BUFFERS)
    s_xr, s_xd, s_part = (sp.map[name] for name in WIDE_BUFFERS)
    rts = route_table(s_rt, T, cfg)
    s_tab, at = {}, s_rq
    for name, words in rq_tables(cfg).items():
        s_tab[name], at = at, at + words

    def rq(a, c, m, n, r: Requant, flags=0, b=0, op=Op.REQUANT):
        if not flags:
            check_requant(r, cfg, "requantiser")
        return Instr(op, flags=flags, m=m, n=n, a=a, b=b, c=c,
                     mult=0 if flags else r.mult, shift=0 if flags else r.shift, width=r.width)

    shapes = {(kk, n) for _, _, kk, n in block_gemms(cfg, T)}   # the ones check_tokens checked

    def gemm(a, host_addr, c, m, kk, n, r: Requant, flags=0, table=None):
        """A GEMM with its requantiser fused: ``r``'s constants, or the table ``table`` of
        :func:`rq_tables` (with F_RQ_EXPERT; with per-channel weight scales always, F_RQ_CHANNEL)."""
        assert (kk, n) in shapes, f"a {kk} x {n} GEMM missing from block_gemms"
        if per_col:
            flags |= F_RQ_CHANNEL
        elif not flags & F_RQ_EXPERT:
            check_requant(r, cfg, "requantiser")
        fixed = not flags & (F_RQ_EXPERT | F_RQ_CHANNEL)
        b = 0 if fixed else s_tab[table]
        return Instr(Op.GEMM, flags=flags, m=m, k=kk, n=n, a=a, b=b, c=c, host=host_addr,
                     stride=stride if flags & F_HOST_EXPERT else 0, mult=r.mult if fixed else 0,
                     shift=r.shift if fixed else 0, width=r.width)

    ex0 = Q.experts[0]  # the widths of the per-expert requantisers (constants come from the table)
    cnt, rqx = F_M_COUNT, F_M_COUNT | F_RQ_EXPERT
    hx = F_M_COUNT | F_HOST_EXPERT
    load_rq = [Instr(Op.LOAD, m=1, n=sum(resident.values()), c=s_rq, host=h_rq, width=4)]
    # with per-channel scales, the expert's own tables (F_RQ_CHANNEL alone), loaded with it
    ex_rq = F_HOST_EXPERT if per_col else F_RQ_EXPERT
    load_ex_rq = [Instr(Op.LOAD, flags=F_HOST_EXPERT, m=1, n=sum(expert_rq_tables(cfg).values()),
                        c=s_tab["gate"], host=h_e + offs["rq"], stride=stride, width=4)] if per_col else []
    if wide:    # x_r's digits through the array twice (raw sums), joined and requantised
        load_x = [Instr(Op.LOAD, m=T, n=d, c=s_xr, host=h_x, width=x_width),
                  rq(s_xr, s_x, T, d, Requant(1, cfg.router_operand_width - cfg.in_width, cfg.in_width)),
                  Instr(Op.SPLIT, m=T, n=d, a=s_xr, c=s_xd)]
        router = [*(Instr(Op.GEMM, m=2 * T, k=d, n=E, a=s_xd, c=s_part + 2 * T * E * i, host=h)
                    for i, h in enumerate(h_r)),
                  rq(s_part, s_logit, T, E, Q.rq_router, F_RQ_CHANNEL if per_col else 0,
                     s_tab["router"] if per_col else 0, Op.REQUANT_WIDE)]
    else:
        load_x = [Instr(Op.LOAD, m=T, n=d, c=s_x, host=h_x, width=x_width)]
        router = [gemm(s_x, h_r[0], s_logit, T, d, E, Q.rq_router, table="router")]
    prog = [
        *load_x,
        *(load_rq if per_col else []),     # the first GEMMs' tables
        *router,
        Instr(Op.SIGMOID, m=T, n=E, a=s_logit, c=s_score),
        Instr(Op.LOAD, m=1, n=E, c=s_bias, host=h_b, width=4),
        *([] if per_col else load_rq),
        Instr(Op.ROUTE, m=T, n=E, k=k, a=s_score, b=s_bias, c=s_rt),
        gemm(s_x, h_dl, s_z, T, d, lat, Q.rq_down_lat, table="down_lat"),
        *glu_steps(Q.shared, T, s_x, (s_g, s_u, s_h, s_h8), s_ys, (h_sg, h_su, h_sd),
                   tuple(s_tab[t] for t in ("s_gate", "s_up", "s_down")) if per_col else None, cfg),
    ]
    loop = len(prog)
    body = [
        Instr(Op.GATHER, m=T, n=lat, a=s_z, b=rts["list_t"], c=s_zg),
        *load_ex_rq,
        gemm(s_zg, h_e + offs["W_gate"], s_g, 0, lat, dx, ex0.rq_gate, hx | ex_rq, "gate"),
        gemm(s_zg, h_e + offs["W_up"], s_u, 0, lat, dx, ex0.rq_up, hx | ex_rq, "up"),
        Instr(Op.SITU, flags=cnt, n=dx, a=s_g, b=s_u, c=s_h),
        rq(s_h, s_h8, 0, dx, ex0.rq_h, rqx, s_tab["h"]),
        gemm(s_h8, h_e + offs["W_down"], s_eo, 0, dx, lat, ex0.rq_out, hx | ex_rq, "out"),
        Instr(Op.SCATTER, m=T * k, n=lat, a=s_eo, b=rts["list_p"], c=s_e),
        Instr(Op.JUMP, target=loop),
    ]
    end = loop + 1 + len(body)
    prog += [Instr(Op.EXPERT, n=E, a=rts["counts"], target=end)] + body
    prog += [
        Instr(Op.COMBINE, m=T, k=k, n=lat, a=s_e, b=rts["weights"], c=s_uc),
        Instr(Op.NORM, m=T, n=lat, a=s_uc, c=s_n),
        gemm(s_n, h_ul, s_yr, T, lat, d, Q.rq_up_lat, table="up_lat"),
        Instr(Op.ADD, m=T, n=d, a=s_yr, b=s_ys, c=s_y),
        Instr(Op.STORE, m=T, n=d, a=s_y, host=h_y, width=4),
        Instr(Op.STORE, m=1, n=rt["end"], a=s_rt, host=h_route, width=4),
        Instr(Op.HALT),
    ]
    if len(prog) > cfg.imem_depth:
        raise ValueError(f"imem_depth = {cfg.imem_depth}: the program needs {len(prog)} instructions")
    return Program(prog, host.image, host.symbols, sp.map, T, cfg)
