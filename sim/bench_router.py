"""cocotb bench of :class:`nanokpu.units.router.TopKRouter`, bit-exact against :func:`golden.intops.route_int`.

The router's config comes from :func:`sim.runner.bench_config`. Parameters (``NANOKPU_PARAMS``): ``seed``,
``tokens`` (batch size of the random tests), ``cycles_per_token`` and ``latency`` (the
component's timing contract, checked by ``throughput``), ``out`` (a JSON file receiving the
measured timing of ``throughput`` or the per-step loads of ``qb_loop``), and for ``qb_loop``:
``steps`` and ``fresh``. ``path_scores`` routes the integer scores of the golden path
(:func:`golden.block.router_int`) at the config's shape and scheme. Run through
:func:`nanokpu.commands.bench_router.run_router_bench`.
"""

from __future__ import annotations

import json

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from golden import block
from golden.block import skewed_scores
from golden.fidelity import router_draws
from golden.intops import quantize_bias, route_int
from golden.k3 import quantile_balance
from sim.runner import bench_config, bench_params

PARAMS = bench_params()


class TB:
    """Clock, reset and the host/stream drivers of one router instance."""

    def __init__(self, dut, name: str):
        self.dut = dut
        self.cfg = cfg = bench_config()
        self.seed = int(PARAMS.get("seed", 1)) * 1000 + sum(map(ord, name))
        self.rng = np.random.default_rng(self.seed)
        self.n, self.lanes, self.k = cfg.n_experts, cfg.route_lanes, cfg.top_k
        self.beats = -(-self.n // self.lanes)
        self.index_width = max(1, (self.n - 1).bit_length())
        self.full = 1 << cfg.score_frac  # the score 1.0
        self.bias_lo, self.bias_hi = -(1 << (cfg.bias_width - 1)), (1 << (cfg.bias_width - 1)) - 1
        self.cycle = 0
        self.expected_loads = np.zeros(self.n, dtype=np.int64)

    def fail(self, msg: str):
        raise AssertionError(f"{msg} (profile {self.cfg.name}, seed {self.seed})")

    async def start(self):
        dut = self.dut
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        for sig in (dut.scores__valid, dut.routes__ready, dut.bias_we, dut.load_clear):
            sig.value = 0
        dut.rst.value = 1
        for _ in range(2):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        await RisingEdge(dut.clk)

    async def write_bias(self, bias):
        dut = self.dut
        mask = (1 << self.cfg.bias_width) - 1
        for j, b in enumerate(bias):
            dut.bias_we.value, dut.bias_addr.value, dut.bias_data.value = 1, j, int(b) & mask
            await RisingEdge(dut.clk)
        dut.bias_we.value = 0
        self.bias = np.asarray(bias, dtype=np.int64)

    async def wait_idle(self):
        while True:
            await RisingEdge(self.dut.clk)
            await ReadOnly()
            if int(self.dut.idle.value):
                break
        await RisingEdge(self.dut.clk)

    async def clear_loads(self):
        self.dut.load_clear.value = 1
        await RisingEdge(self.dut.clk)
        self.dut.load_clear.value = 0
        await self.wait_idle()
        self.expected_loads[:] = 0

    async def read_loads(self) -> np.ndarray:
        dut = self.dut
        out = []
        dut.load_addr.value = 0
        for j in range(1, self.n + 1):
            await RisingEdge(dut.clk)
            if j < self.n:
                dut.load_addr.value = j
            await ReadOnly()
            out.append(int(dut.load_data.value))
        await RisingEdge(dut.clk)
        return np.array(out, dtype=np.int64)

    def pack(self, scores) -> list[int]:
        """Score beats of a ``[T, E]`` batch, lane 0 in the low bits."""
        width = self.cfg.score_width
        padded = np.zeros((scores.shape[0], self.beats * self.lanes), dtype=np.int64)
        padded[:, :self.n] = scores
        beats = []
        for row in padded.reshape(-1, self.lanes):
            word = 0
            for lane, value in enumerate(row):
                word |= int(value) << (lane * width)
            beats.append(word)
        return beats

    async def stream(self, scores, idle: float = 0.0, backpressure: float = 0.0,
                     clear_at: int | None = None):
        """Route a batch; returns ``(beats, in_cycles, out_cycles)``. One loop drives the
        score source (random idle) and the route sink (random backpressure); ``clear_at``
        pulses ``load_clear`` in that cycle (counted from the start of the batch)."""
        dut, rng = self.dut, self.rng
        words = self.pack(scores)
        total = scores.shape[0] * self.k
        outs, in_cycles, out_cycles = [], [], []
        pos, holding = 0, False
        start = self.cycle
        limit = self.cycle + 200 + 4 * (len(words) + total) * max(1, self.beats) * 40
        while len(outs) < total:
            dut.load_clear.value = int(clear_at is not None and self.cycle - start == clear_at)
            if not holding and pos < len(words) and rng.random() >= idle:
                dut.scores__payload.value = words[pos]
                holding = True
            dut.scores__valid.value = int(holding)
            ready = rng.random() >= backpressure
            dut.routes__ready.value = int(ready)
            await ReadOnly()
            if holding and int(dut.scores__ready.value):
                in_cycles.append(self.cycle)
                pos, holding = pos + 1, False
            if ready and int(dut.routes__valid.value):
                outs.append(int(dut.routes__payload.value))
                out_cycles.append(self.cycle)
            await RisingEdge(dut.clk)
            self.cycle += 1
            if self.cycle > limit:
                self.fail(f"timeout: {pos}/{len(words)} beats in, {len(outs)}/{total} routes out")
        dut.scores__valid.value = 0
        dut.routes__ready.value = 0
        dut.load_clear.value = 0
        return outs, in_cycles, out_cycles

    def check(self, scores, outs):
        """Compare the routes with the golden engine; accumulate the expected loads."""
        idx, weights, loads = route_int(scores, self.bias, self.cfg)
        iw, ww = self.index_width, self.cfg.weight_width
        for t in range(scores.shape[0]):
            for r in range(self.k):
                word = outs[t * self.k + r]
                got = (word & ((1 << iw) - 1), (word >> iw) & ((1 << ww) - 1), word >> (iw + ww))
                want = (int(idx[t, r]), int(weights[t, r]), int(r == self.k - 1))
                if got != want:
                    self.fail(f"token {t} rank {r}: (index, weight, last) = {got}, golden {want}; "
                              f"scores {scores[t].tolist()} bias {self.bias.tolist()}")
        self.expected_loads += loads

    async def check_loads(self):
        await self.wait_idle()
        got = await self.read_loads()
        want = np.minimum(self.expected_loads, (1 << self.cfg.load_width) - 1)
        if not np.array_equal(got, want):
            self.fail(f"load counters {got.tolist()} != golden {want.tolist()}")

    async def route_and_check(self, scores, bias, idle=0.3, backpressure=0.3):
        if not np.array_equal(bias, getattr(self, "bias", None)):
            await self.write_bias(bias)
        outs, _, _ = await self.stream(np.asarray(scores, dtype=np.int64), idle, backpressure)
        self.check(np.asarray(scores, dtype=np.int64), outs)

    def random_scores(self, tokens: int):
        return self.rng.integers(0, self.full + 1, size=(tokens, self.n))

    def random_bias(self, span: int):
        return self.rng.integers(-span, span + 1, size=self.n)


async def _setup(dut, name):
    tb = TB(dut, name)
    await tb.start()
    await tb.clear_loads()
    return tb


@cocotb.test()
async def random_tokens(dut):
    """Random scores and biases, random idle and backpressure; loads accumulate over two
    batches, then clear to zero and count again."""
    tb = await _setup(dut, "random_tokens")
    tokens = int(PARAMS.get("tokens", 16))
    await tb.route_and_check(tb.random_scores(tokens), tb.random_bias(tb.full // 2))
    await tb.route_and_check(tb.random_scores(tokens), tb.bias, idle=0.6, backpressure=0.1)
    await tb.check_loads()
    await tb.clear_loads()
    await tb.check_loads()
    await tb.route_and_check(tb.random_scores(tokens), tb.random_bias(tb.full), idle=0.1,
                             backpressure=0.6)
    await tb.check_loads()


@cocotb.test()
async def path_scores(dut):
    """Integer scores from the golden path at the bench's shape and scheme: a random router
    (:func:`golden.fidelity.router_draws`) through :func:`golden.block.router_int` (the router GEMM
    at ``router_width``, its requantiser to ``Q<logit_width>.<logit_frac>`` logits, the sigmoid
    table), with its bias; the RTL routes them bit for bit like ``router_int`` (random idle and
    backpressure)."""
    tb = await _setup(dut, "path_scores")
    cfg = tb.cfg
    W_r, bias, x = router_draws(cfg, tb.rng, int(PARAMS.get("tokens", 16)))
    x_r, x_scale = block.quantize_input(x, cfg)
    R = block.quantize_router(W_r, bias, x_scale, cfg)
    scores = block.router_int(x_r, R, cfg)[0]
    await tb.route_and_check(scores, R.bias)    # checked with route_int: router_int's routing step
    await tb.check_loads()
    cocotb.log.info(f"{scores.shape[0]} path tokens bit-exact (profile {cfg.name}, score_frac {cfg.score_frac}, "
                    f"bias_width {cfg.bias_width}, seed {tb.seed})")


@cocotb.test()
async def ties(dut):
    """Ties everywhere: all-equal scores, all-equal keys from unequal scores, one score
    different (above and below), and biases drawn from a two-value set."""
    tb = await _setup(dut, "ties")
    n, full = tb.n, tb.full
    zero = np.zeros(n, dtype=np.int64)
    equal = np.stack([np.full(n, v) for v in (0, 1, full // 3, full)])
    await tb.route_and_check(equal, zero)
    await tb.route_and_check(equal, np.full(n, -7))
    one = []
    for _ in range(6):
        row = np.full(n, int(tb.rng.integers(1, full)))
        row[tb.rng.integers(n)] += int(tb.rng.choice([-1, 1]))
        one.append(row)
    await tb.route_and_check(np.stack(one), zero)
    scores = tb.random_scores(4)
    await tb.route_and_check(scores[:1], full - scores[0])  # every key equal, weights not
    await tb.route_and_check(scores, tb.rng.choice([-3, 5], size=n))
    await tb.check_loads()


@cocotb.test()
async def bias_flip(dut):
    """Biases that replace the unbiased top-k by the k lowest-scored experts."""
    tb = await _setup(dut, "bias_flip")
    if tb.k == tb.n:
        return  # every expert is always selected: nothing to flip (the order still changes)
    scores = tb.random_scores(8)
    row = scores[0]
    low = np.argsort(row, kind="stable")[:tb.k]
    bias = np.zeros(tb.n, dtype=np.int64)
    bias[low] = 2 * tb.full
    unbiased = np.sort(route_int(scores[:1], np.zeros(tb.n, np.int64), tb.cfg)[0][0])
    biased = np.sort(route_int(scores[:1], bias, tb.cfg)[0][0])
    if np.array_equal(unbiased, biased):
        tb.fail("the flipping bias did not change the golden selection: the test data is weak")
    await tb.route_and_check(scores, bias)
    await tb.check_loads()


@cocotb.test()
async def extremes(dut):
    """Scores at 0 and 1.0 (2**score_frac), all-zero tokens (weight sum 0) and biases at
    the limits of bias_width."""
    tb = await _setup(dut, "extremes")
    n, full = tb.n, tb.full
    scores = tb.rng.choice([0, full], size=(12, n))
    scores[0] = 0
    scores[1] = full
    await tb.route_and_check(scores, tb.rng.choice([tb.bias_lo, tb.bias_hi], size=n))
    await tb.route_and_check(scores, np.full(n, tb.bias_hi))
    await tb.route_and_check(scores, np.full(n, tb.bias_lo))
    await tb.check_loads()


@cocotb.test()
async def clear_midstream(dut):
    """``load_clear`` while tokens flow: routing is undisturbed, and the counters hold exactly
    the selections merged after the clear, i.e. a suffix of the (token, rank) sequence."""
    tb = await _setup(dut, "clear_midstream")
    for _ in range(3):
        tokens = 12
        scores = tb.random_scores(tokens)
        await tb.write_bias(tb.random_bias(tb.full // 2))
        clear_at = int(tb.rng.integers(0, tokens * max(tb.beats, 30)))
        outs, _, _ = await tb.stream(scores, 0.2, 0.2, clear_at=clear_at)
        tb.check(scores, outs)
        await tb.wait_idle()
        got = await tb.read_loads()
        flat = route_int(scores, tb.bias, tb.cfg)[0].ravel()
        suffixes = [p for p in range(flat.size + 1)
                    if np.array_equal(np.bincount(flat[p:], minlength=tb.n), got)]
        if not suffixes:
            tb.fail(f"counters after a clear in cycle {clear_at} are no suffix of the selections: "
                    f"{got.tolist()}")
        await tb.clear_loads()


@cocotb.test()
async def throughput(dut):
    """Back-to-back tokens, no idle, no backpressure: every token takes exactly
    ``cycles_per_token`` cycles in steady state and the first one ``latency`` cycles."""
    tb = await _setup(dut, "throughput")
    tokens = int(PARAMS.get("tokens", 16))
    scores = tb.random_scores(tokens)
    await tb.write_bias(tb.random_bias(tb.full // 4))
    outs, in_cycles, out_cycles = await tb.stream(scores)
    tb.check(scores, outs)
    first_in = np.array(in_cycles[::tb.beats])
    first_out = np.array(out_cycles[::tb.k])
    latency = out_cycles[0] - in_cycles[tb.beats - 1]
    # outputs are periodic from the first token; inputs once the buffers have filled
    periods = sorted(set(np.diff(first_out).tolist()) | set(np.diff(first_in[tokens // 2:]).tolist()))
    cocotb.log.info(f"cycles/token {periods}, latency {latency}")
    if "out" in PARAMS:
        with open(PARAMS["out"], "w") as f:
            json.dump({"periods": periods, "latency": latency, "tokens": tokens,
                       "first_out": first_out.tolist()}, f)
    if periods != [int(PARAMS["cycles_per_token"])] or latency != int(PARAMS["latency"]):
        tb.fail(f"periods {periods} and latency {latency}: expected {PARAMS['cycles_per_token']} "
                f"and {PARAMS['latency']}")
    await tb.check_loads()


@cocotb.test(skip="steps" not in PARAMS)
async def qb_loop(dut):
    """Closed loop: route a skewed batch, read the counters (checked against golden), run
    the golden Quantile Balancing step, quantise and write the new biases, repeat."""
    tb = await _setup(dut, "qb_loop")
    cfg, scale = tb.cfg, float(tb.full)
    rng = np.random.default_rng(int(PARAMS["seed"]))
    scores = skewed_scores(cfg, int(PARAMS["tokens"]), rng)
    bias = np.zeros(tb.n, dtype=np.int64)
    history = []
    for step in range(int(PARAMS["steps"]) + 1):
        if step and PARAMS.get("fresh"):
            scores = skewed_scores(cfg, int(PARAMS["tokens"]), rng)
        await tb.clear_loads()
        await tb.route_and_check(scores, bias, idle=0.0, backpressure=0.0)
        await tb.check_loads()
        loads = await tb.read_loads()
        history.append({"step": step, "loads": loads.tolist(), "bias": bias.tolist(),
                        "cycles": tb.cycle})
        bias = quantize_bias(quantile_balance(scores / scale, bias / scale, tb.k), cfg)
    with open(PARAMS["out"], "w") as f:
        json.dump(history, f)
