"""cocotb benches of the activation units (SiTU-GLU, sigmoid and their PWL factor tables; exp, SiLU
and the KDA decay).

:class:`ActivationBench` puts the units of several configs side by side in one Verilog top
(one Verilator build serves every bench here).

Benches (``testcase``), all checked bit for bit against :mod:`golden.intops`:

- ``factors_exhaustive``: every ``act_width``-bit input through the gate and up tables,
  with random stalls of ``en`` (probability ``1 - p_en``).
- ``sigmoid_exhaustive``: every logit (``router_logit_width`` bits) through the sigmoid stream.
- ``function_exhaustive``: every act-format input through the stream of the :data:`FUNCTIONS`
  unit named by the parameter ``unit`` (built for the keys of :data:`FUNCTION_KEYS`).
- ``situ_random``: the SiTU stream on the corner grid of the input format, ``n_random``
  random pairs and, with ``sweep``, every ``g`` with a random ``u`` and every ``u`` with a
  random ``g``.

Stream benches run their inputs in two halves: at full rate, then with random idle on the
source (``p_valid``) and backpressure on the sink (``p_ready``). Parameters come from
``NANOKPU_PARAMS``: ``key`` (the units under test), ``seed`` and the names above; the
config of the ``key`` units from :func:`sim.runner.bench_config` (:func:`run` passes it: the
bench top has no ``cfg`` of its own). Per
cycle, Python only writes prepacked integers and reads raw words; packing, unpacking and
the golden comparison are bulk NumPy.
"""

from __future__ import annotations

import functools
import random

import cocotb
import numpy as np
from amaranth import Module, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from golden.intops import decay_q, exp_q, gate_q, gate_table, sigmoid_q, silu_q, situ_q, up_q, up_table
from nanokpu.config import KpuConfig, profile
from nanokpu.units.pwl import PwlEvaluator, out_range, range_shape
from nanokpu.units.pwl_functions import Decay, Exp, Silu
from nanokpu.units.sigmoid import Sigmoid
from nanokpu.units.situ import Situ
from sim.runner import bench_config, bench_params

__all__ = ["ActivationBench", "FUNCTIONS", "FUNCTION_KEYS", "pack", "unpack"]

#: The table units of :mod:`nanokpu.units.pwl_functions` by bench name: (unit, golden function, the
#: output lane shape of a config).
FUNCTIONS = {
    "exp": (Exp, exp_q, lambda cfg: unsigned(cfg.score_width)),
    "silu": (Silu, silu_q, lambda cfg: signed(cfg.act_width)),
    "decay": (Decay, decay_q, lambda cfg: unsigned(cfg.score_width)),
}


class ActivationBench(wiring.Component):
    """The activation units of several configs in one simulation top (no logic of its own).

    Parameters
    ----------
    cfgs : dict[str, KpuConfig]
        Configs by key (a Verilog identifier); every port below exists once per key, named
        ``<key>_<port>``. One top for all configs means one Verilator build for all benches.
    functions : Collection[str]
        The keys whose configs also get the :data:`FUNCTIONS` units (their tables do not
        depend on the SiTU betas: a few keys cover them).

    Members
    -------
    <key>_situ_i, <key>_situ_o : the :class:`~nanokpu.units.situ.Situ` streams.
    <key>_sig_i, <key>_sig_o : the :class:`~nanokpu.units.sigmoid.Sigmoid` streams.
    <key>_x, <key>_en : In; <key>_gate_y, <key>_up_y : Out
        A gate and an up :class:`~nanokpu.units.pwl.PwlEvaluator` built from the same tables as
        the SiTU unit's, sharing ``x`` and ``en``.
    <key>_<name>_i, <key>_<name>_o : the streams of the :data:`FUNCTIONS` unit ``name``
        (``exp``, ``silu``, ``decay``), for the keys of ``functions``.
    """

    def __init__(self, cfgs: dict[str, KpuConfig], functions=()):
        if not set(functions) <= set(cfgs):
            raise ValueError(f"functions: {sorted(set(functions) - set(cfgs))} are not keys of cfgs")
        self.units = {}
        self.functions = {}
        members = {}
        for key, cfg in cfgs.items():
            situ, sigmoid = Situ(cfg), Sigmoid(cfg)
            gate = PwlEvaluator(situ.gate_table, cfg.act_lanes, dsp=cfg.dsp)
            up = PwlEvaluator(situ.up_table, cfg.act_lanes, dsp=cfg.dsp)
            self.units[key] = (situ, sigmoid, gate, up)
            members.update({
                f"{key}_situ_i": situ.signature.members["i"],
                f"{key}_situ_o": situ.signature.members["o"],
                f"{key}_sig_i": sigmoid.signature.members["i"],
                f"{key}_sig_o": sigmoid.signature.members["o"],
                f"{key}_x": In(gate.x.shape()),
                f"{key}_en": In(1),
                f"{key}_gate_y": Out(gate.y.shape()),
                f"{key}_up_y": Out(up.y.shape()),
            })
            if key in functions:
                self.functions[key] = {name: unit(cfg) for name, (unit, _, _) in FUNCTIONS.items()}
                for name, unit in self.functions[key].items():
                    members[f"{key}_{name}_i"] = unit.signature.members["i"]
                    members[f"{key}_{name}_o"] = unit.signature.members["o"]
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        for key, (situ, sigmoid, gate, up) in self.units.items():
            def port(name, key=key):
                return getattr(self, f"{key}_{name}")
            m.submodules[f"{key}_situ"] = situ
            m.submodules[f"{key}_sigmoid"] = sigmoid
            m.submodules[f"{key}_gate"] = gate
            m.submodules[f"{key}_up"] = up
            wiring.connect(m, wiring.flipped(port("situ_i")), situ.i)
            wiring.connect(m, situ.o, wiring.flipped(port("situ_o")))
            wiring.connect(m, wiring.flipped(port("sig_i")), sigmoid.i)
            wiring.connect(m, sigmoid.o, wiring.flipped(port("sig_o")))
            for unit in (gate, up):
                m.d.comb += [unit.x.eq(port("x")), unit.en.eq(port("en"))]
            m.d.comb += [port("gate_y").eq(gate.y), port("up_y").eq(up.y)]
            for name, unit in self.functions.get(key, {}).items():
                m.submodules[f"{key}_{name}"] = unit
                wiring.connect(m, wiring.flipped(port(f"{name}_i")), unit.i)
                wiring.connect(m, unit.o, wiring.flipped(port(f"{name}_o")))
        return m


# ----------------------------------------------------------------------------------------
# Bulk packing
# ----------------------------------------------------------------------------------------
def pack(fields, width: int) -> list[int]:
    """Rows of ``fields`` (``[n, k]`` integers) as words of ``k`` ``width``-bit fields, field 0 low."""
    fields = np.asarray(fields, dtype=np.int64)
    words = np.zeros(fields.shape[0], dtype=object)
    for j in range(fields.shape[1]):
        words += np.asarray(fields[:, j] & ((1 << width) - 1), dtype=object) << (width * j)
    return [int(w) for w in words]


def unpack(words, width: int, k: int, is_signed: bool) -> np.ndarray:
    """Inverse of :func:`pack`: ``[n, k]`` int64 fields of ``words``."""
    words = np.asarray(words, dtype=object)
    out = np.empty((len(words), k), dtype=np.int64)
    for j in range(k):
        out[:, j] = ((words >> (width * j)) & ((1 << width) - 1)).astype(np.int64)
    if is_signed:
        out -= (out >> (width - 1)) << width
    return out


# ----------------------------------------------------------------------------------------
# Drivers
# ----------------------------------------------------------------------------------------
def _params():
    """``(key, cfg, seed, params)`` of this run."""
    params = bench_params()
    return params["key"], bench_config(), int(params.get("seed", 0)), params


def _all_inputs(width: int) -> np.ndarray:
    """Every signed ``width``-bit integer, ascending."""
    return np.arange(-(1 << (width - 1)), 1 << (width - 1), dtype=np.int64)


def _lanes(values: np.ndarray, lanes: int) -> np.ndarray:
    """``values`` padded (with their first element) to a multiple of ``lanes``, as ``[n, lanes]``."""
    pad = (-len(values)) % lanes
    return np.concatenate([values, np.repeat(values[:1], pad, axis=0)]).reshape(-1, lanes, *values.shape[1:])


async def _start(dut, key: str):
    """Start the clock, idle the ports of ``key`` and reset."""
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    streams = ("situ", "sig", *(FUNCTIONS if key in FUNCTION_KEYS else ()))
    for name in ("en", *(f"{s}_i__valid" for s in streams), *(f"{s}_o__ready" for s in streams)):
        getattr(dut, f"{key}_{name}").value = 0
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0


async def _stream(dut, prefix: str, words: list[int], p_valid: float, p_ready: float,
                  rand: random.Random, latency: int) -> list[int]:
    """Send ``words`` on ``<prefix>_i`` and collect as many words from ``<prefix>_o``.

    Values read right after a rising edge are those the edge sampled, so the handshakes
    decided at that edge are read back directly. At full rate, checks that the first result
    arrives ``latency`` cycles after its input and that the unit takes one transfer per cycle.
    """
    i_valid, i_ready, i_payload = (getattr(dut, f"{prefix}_i__{s}") for s in ("valid", "ready", "payload"))
    o_valid, o_ready, o_payload = (getattr(dut, f"{prefix}_o__{s}") for s in ("valid", "ready", "payload"))
    edge = RisingEdge(dut.clk)
    outs: list[int] = []
    n, k, holding, cycle, first_in, first_out = len(words), 0, False, 0, None, None
    limit = 20 * n + 100 * latency + 1000
    while len(outs) < n:
        if not holding and k < n and (p_valid >= 1 or rand.random() < p_valid):
            i_payload.value = words[k]
            i_valid.value = 1
            holding = True
        ready = p_ready >= 1 or rand.random() < p_ready
        o_ready.value = ready
        await edge
        cycle += 1
        if holding and int(i_ready.value):
            first_in = cycle if first_in is None else first_in
            k += 1
            holding = False
            i_valid.value = 0
        if ready and int(o_valid.value):
            first_out = cycle if first_out is None else first_out
            outs.append(int(o_payload.value))
        assert cycle < limit, f"{prefix}: {len(outs)} of {n} results after {cycle} cycles (hang)"
    o_ready.value = 0
    if p_valid >= 1 and p_ready >= 1:
        assert first_out - first_in == latency, \
            f"{prefix}: first result {first_out - first_in} cycles after its input, expected {latency}"
        assert cycle == n + latency, f"{prefix}: {n} transfers took {cycle} cycles at full rate"
    return outs


async def _stream_both_ways(dut, prefix, words, params, rand, latency) -> list[int]:
    """First half at full rate, second half with random idle and backpressure."""
    half = len(words) // 2
    outs = await _stream(dut, prefix, words[:half], 1.0, 1.0, rand, latency)
    outs += await _stream(dut, prefix, words[half:], params.get("p_valid", 0.7),
                          params.get("p_ready", 0.7), rand, latency)
    return outs


def _check(name: str, inputs, got, expected, seed: int):
    bad = np.flatnonzero(np.any(np.asarray(got) != np.asarray(expected),
                                axis=tuple(range(1, np.ndim(got)))))
    assert bad.size == 0, (f"{name}: {bad.size} of {len(got)} words differ from the golden model "
                           f"(seed {seed}); first: "
                           + "; ".join(f"in {inputs[b].tolist()} got {np.asarray(got)[b].tolist()} "
                                       f"expected {np.asarray(expected)[b].tolist()}" for b in bad[:4]))


# ----------------------------------------------------------------------------------------
# Benches
# ----------------------------------------------------------------------------------------
@cocotb.test()
async def factors_exhaustive(dut):
    """Every input through the gate and up tables, random stalls on ``en``."""
    key, cfg, seed, params = _params()
    rand = random.Random(seed)
    lanes, latency = cfg.act_lanes, PwlEvaluator.latency
    x, en_port, gate_y, up_y = (getattr(dut, f"{key}_{name}") for name in ("x", "en", "gate_y", "up_y"))
    xs = _lanes(_all_inputs(cfg.act_width), lanes)
    words = pack(xs, cfg.act_width)
    p_en = params.get("p_en", 0.8)
    await _start(dut, key)
    edge = RisingEdge(dut.clk)
    gate_words, up_words = [], []
    issued = 0
    while len(gate_words) < len(words):
        en = issued >= len(words) or rand.random() < p_en
        if en and issued < len(words):
            x.value = words[issued]
        en_port.value = en
        await edge
        if en:
            # The j-th enabled edge (1-based) shows the result of input j - latency - 1.
            if issued >= latency:
                gate_words.append(int(gate_y.value))
                up_words.append(int(up_y.value))
            issued += 1
    en_port.value = 0
    gate_w, up_w = (range_shape(*out_range(table(cfg))) for table in (gate_table, up_table))
    gate = unpack(gate_words, gate_w.width, lanes, gate_w.signed)
    up = unpack(up_words, up_w.width, lanes, up_w.signed)
    _check("gate", xs, gate, gate_q(xs, cfg), seed)
    _check("up", xs, up, up_q(xs, cfg), seed)
    dut._log.info("gate and up: %d inputs bit-exact (seed %d)", xs.size, seed)


@cocotb.test()
async def sigmoid_exhaustive(dut):
    """Every input through the sigmoid stream, shuffled, with and without idle/backpressure."""
    key, cfg, seed, params = _params()
    rand = random.Random(seed)
    rng = np.random.default_rng(seed)
    width = cfg.router_logit_width
    xs = _lanes(rng.permutation(_all_inputs(width)), cfg.act_lanes)
    await _start(dut, key)
    outs = await _stream_both_ways(dut, f"{key}_sig", pack(xs, width), params, rand, Sigmoid.latency)
    got = unpack(outs, cfg.score_width, cfg.act_lanes, False)
    _check("sigmoid", xs, got, sigmoid_q(xs, cfg), seed)
    dut._log.info("sigmoid: %d inputs bit-exact (seed %d)", xs.size, seed)


@cocotb.test()
async def function_exhaustive(dut):
    """Every act-format input through the stream of the ``unit`` parameter's :data:`FUNCTIONS` unit,
    shuffled, with and without idle/backpressure."""
    key, cfg, seed, params = _params()
    name = params["unit"]
    unit, golden, out_shape = FUNCTIONS[name]
    rand = random.Random(seed)
    rng = np.random.default_rng(seed)
    xs = _lanes(rng.permutation(_all_inputs(cfg.act_width)), cfg.act_lanes)
    await _start(dut, key)
    outs = await _stream_both_ways(dut, f"{key}_{name}", pack(xs, cfg.act_width), params, rand, unit.latency)
    shape = out_shape(cfg)
    got = unpack(outs, shape.width, cfg.act_lanes, shape.signed)
    _check(name, xs, got, golden(xs, cfg), seed)
    dut._log.info("%s: %d inputs bit-exact (seed %d)", name, xs.size, seed)


def situ_pairs(cfg: KpuConfig, seed: int, n_random: int, sweep: bool) -> np.ndarray:
    """``[n, 2]`` ``(g, u)`` pairs: the corner grid, ``n_random`` random pairs, the sweeps."""
    rng = np.random.default_rng(seed)
    lo, hi = -(1 << (cfg.act_width - 1)), (1 << (cfg.act_width - 1)) - 1
    corners = np.array([lo, lo + 1, -(1 << cfg.act_frac), -1, 0, 1, 1 << cfg.act_frac, hi - 1, hi])
    grid = np.stack(np.meshgrid(corners, corners), axis=-1).reshape(-1, 2)
    parts = [grid, rng.integers(lo, hi + 1, size=(n_random, 2))]
    if sweep:
        everything = _all_inputs(cfg.act_width)
        partner = rng.integers(lo, hi + 1, size=everything.size)
        parts += [np.stack([everything, partner], axis=1), np.stack([partner, everything], axis=1)]
    return rng.permutation(np.concatenate(parts))


@cocotb.test()
async def situ_random(dut):
    """Corner grid, random pairs and (optionally) sweeps through the SiTU stream."""
    key, cfg, seed, params = _params()
    rand = random.Random(seed)
    pairs = _lanes(situ_pairs(cfg, seed, int(params.get("n_random", 4096)), bool(params.get("sweep"))),
                   cfg.act_lanes)                     # [n, lanes, 2]
    words = pack(pairs.reshape(len(pairs), -1), cfg.act_width)  # g low, u high in each lane
    await _start(dut, key)
    outs = await _stream_both_ways(dut, f"{key}_situ", words, params, rand, Situ.latency)
    got = unpack(outs, cfg.h_width, cfg.act_lanes, True)
    _check("situ", pairs, got, situ_q(pairs[..., 0], pairs[..., 1], cfg), seed)
    dut._log.info("situ: %d pairs bit-exact (seed %d)", pairs.shape[0] * cfg.act_lanes, seed)


# ----------------------------------------------------------------------------------------
# pytest side
# ----------------------------------------------------------------------------------------
#: The configs the default suite runs on Verilator: K3's betas and 2/8, one and four lanes; the
#: PWL products in the logic; router logits in issue 26's Q20.16 with 16-bit scores (a 512-segment
#: sigmoid table, 2**20 inputs: four lanes).
BENCH_CONFIGS: dict[str, KpuConfig] = {
    f"b{b1}x{b2}_l{lanes}": profile("tiny", beta1=float(b1), beta2=float(b2), act_lanes=lanes)
    for b1, b2 in ((4, 25), (2, 8)) for lanes in (1, 4)
} | {"b4x25_l1_ecp5": profile("tiny", act_lanes=1, dsp="ecp5"),
     "logit20_l4": profile("tiny", act_lanes=4, logit_width=20, logit_frac=16, score_frac=16, bias_width=20)}

#: The keys whose configs also get the :data:`FUNCTIONS` units: the tiny profile (one lane) and the
#: small profile's four lanes.
FUNCTION_KEYS = ("b4x25_l1", "b4x25_l4")


@functools.cache
def _bench() -> ActivationBench:
    """One bench top per process: the runner converts it to Verilog once."""
    return ActivationBench(BENCH_CONFIGS, FUNCTION_KEYS)


def run(key: str, testcase: str, seed: int, **params):
    """Run one bench of this module on the ``key`` units of ``ActivationBench(BENCH_CONFIGS, FUNCTION_KEYS)``."""
    from sim.runner import run_bench

    return run_bench(_bench(), "activation", "bench_activation", testcase=testcase, seed=seed,
                     config=BENCH_CONFIGS[key], params={"key": key, "seed": seed, **params})


def amaranth_stream(dut, payloads: list, seed: int, p_valid: float = 0.7, p_ready: float = 0.7) -> list:
    """Run ``payloads`` through the ``i``/``o`` streams of ``dut`` in the Amaranth simulator with
    random idle and backpressure; returns the output payloads (lists of lane values) in order.
    Also checks the stream rule that a raised ``o.valid`` holds its payload until taken."""
    from amaranth.sim import Simulator

    rng = np.random.default_rng(seed)
    lanes = dut.o.payload.shape().length
    got = []

    async def tb(ctx):
        k, pending = 0, None
        while len(got) < len(payloads):
            valid = k < len(payloads) and rng.random() < p_valid
            ctx.set(dut.i.valid, valid)
            if valid:
                ctx.set(dut.i.payload, payloads[k])
            ready = bool(rng.random() < p_ready)
            ctx.set(dut.o.ready, ready)
            _, _, i_ready, o_valid, out = await ctx.tick().sample(dut.i.ready, dut.o.valid, dut.o.payload)
            out = [out[j] for j in range(lanes)]
            if o_valid:
                assert pending is None or pending == out, "o.payload changed before its transfer"
                pending = None if ready else out
                if ready:
                    got.append(out)
            if valid and i_ready:
                k += 1

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return got
