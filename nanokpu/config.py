"""The single source of truth for a nano-KPU: model shapes, hardware sizes and fixed-point formats.

One frozen :class:`KpuConfig` feeds the Amaranth generator, the golden model (float and
integer paths), the compiler and the benches. Nothing downstream repeats a width or a
format as a literal; it reads it from here.

Fixed-point formats are written ``Q<width>.<frac>``: a two's complement integer of
``width`` bits whose real value is ``int / 2**frac``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

__all__ = ["DSP_TARGETS", "KpuConfig", "ONLINE_WIDTH", "PROFILES", "ROUNDING_MODES", "WEIGHT_SCALES",
           "config_from_dict", "config_to_dict", "profile"]

#: Rounding modes understood by :func:`golden.intops.round_shift` and the RTL requantiser.
ROUNDING_MODES = ("half_even", "half_up", "floor")

#: Multiplier mappings of :class:`nanokpu.units.dsp.Multiplier`: inferred ``a*b`` (simulation, any
#: FPGA), SB_MAC16 dual 8x8 (iCE40 UP), registered MULT18X18D (ECP5).
DSP_TARGETS = ("generic", "ice40", "ecp5")

#: Weight quantisation schemes of every GEMM (symmetric, zero point 0): one scale per tensor
#: (PyTorch ``per_tensor_symmetric``) or one per output channel (``per_channel_symmetric``, ONNX
#: ``QuantizeLinear`` with ``axis`` on the output channels and ``zero_point`` 0).
WEIGHT_SCALES = ("tensor", "channel")

#: Widest router GEMM operand (``router_width``): one 16-bit pass of an ECP5 MULT18X18D or an iCE40
#: SB_MAC16 in 16x16 mode, or two byte-sliced int8 passes per operand.
ROUTER_WIDTH_MAX = 16

#: Width of the online softmax registers of MLA's attention (:func:`golden.mla.online_softmax_int`,
#: ``ATTEND``): the running sum ``l`` (unsigned) and each numerator ``acc`` (signed).
ONLINE_WIDTH = 32

#: Widest router logit (``logit_width``): the sigmoid table is fitted and checked over every input.
LOGIT_WIDTH_MAX = 24


@dataclass(frozen=True)
class KpuConfig:
    """Validated, immutable configuration of one nano-KPU and the K3 layer it runs.

    Parameters
    ----------
    name : str
        Profile name (``tiny``, ``small``, ``k3`` or a user's own).

    Model shapes (see ``shared/k3-spec.md``)
    ----------------------------------------
    d_model : int
        Backbone width ``d``.
    d_latent : int
        Latent width ``l`` of the LatentMoE block; must divide ``d_model``.
    n_experts : int
        Routed experts ``E``.
    top_k : int
        Experts per token, ``1 <= top_k <= n_experts``.
    d_expert : int
        Hidden width of one routed expert (SiTU-GLU FFN in latent space).
    d_shared : int
        Hidden width of the fused shared expert (on the full-width ``x``).
    d_dense : int
        Hidden width of the dense SiTU-GLU FFN of the first layers.
    n_heads : int
        Attention heads (MLA and KDA).
    q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim : int
        MLA shapes. ``qk_rope_dim`` is the width of the shared (unrotated) key part.
    kda_head_dim, kda_conv : int
        KDA head dimension and short-convolution kernel length.
    kda_gate_min : float
        Lower bound of the KDA forget-gate log, ``g = kda_gate_min * sigmoid(...)``.
    n_layers, mla_period, dense_layers, attnres_block : int
        Layer pattern: MLA on every ``mla_period``-th layer (1-based) and the last,
        KDA elsewhere; the first ``dense_layers`` use the dense FFN; Attention
        Residuals block size in layers.
    beta1, beta2 : float
        SiTU bounds of the gate and up branches; ``|h| <= beta1 * beta2``.
    routed_scaling : float
        Routed scaling factor; the renormalised weights sum to it.
    rms_eps, l2_eps : float
        RMSNorm and l2-normalisation epsilons.

    Hardware
    --------
    rows, cols : int
        Systolic array size.
    in_width : int
        Operand width of the array (int8 by default).
    acc_width : int
        Accumulator width; must hold the largest GEMM sum exactly: ``spad_b_depth / 2``
        products of two ``-2**(in_width-1)`` operands.
    out_width : int
        Default requantiser output width (the next GEMM's operands).
    mult_width : int
        Width of the requantiser's unsigned integer multiplier.
    rounding : str
        Rounding mode of every right shift, one of :data:`ROUNDING_MODES`.
    dsp : str
        How the GEMM engine's multipliers are built, one of :data:`DSP_TARGETS`:
        ``generic`` (``a * b``, for simulation and the committed Verilog), ``ice40`` or
        ``ecp5`` (vendor DSP blocks instantiated by :class:`nanokpu.units.dsp.Multiplier`; the
        synthesis flow selects the target's family). On ``ice40`` the requantiser's product
        is bit-serial in the fabric (:class:`nanokpu.units.requant.Requantiser`).
    act_width, act_frac : int
        Format ``Q<act_width>.<act_frac>`` of the activation inputs: SiTU ``g`` and ``u``,
        and (unless ``logit_width``/``logit_frac`` say otherwise) the router logits fed to the
        sigmoid.
    situ_frac : int
        Fractional bits of the SiTU gate and up factors (signed).
    h_width, h_frac : int
        Format of the SiTU-GLU output ``h``; must hold ``+-beta1*beta2`` exactly.
    score_frac : int
        Fractional bits of the sigmoid scores (unsigned, ``score_frac + 1`` bits, 1.0 included).
    bias_width : int
        Width of the signed routing bias, in the score format (``score_frac`` fractional bits).
    weight_frac : int
        Fractional bits of the renormalised routing weights (unsigned, ``weight_frac + 1`` bits).
    norm_frac : int
        Fractional bits of the RMSNorm output (``Q<out_width>.<norm_frac>``, the operands of
        the up-projection).
    act_lanes : int
        Results per cycle of the activation units.
    route_lanes : int
        Scores per cycle taken by the top-k routing engine.
    load_width : int
        Width of the routing engine's per-expert load counters (tokens that chose an expert
        since the last clear; they saturate at ``2**load_width - 1``).
    pwl_guard : int
        Guard bits of the piecewise-linear tables below the output LSB.
    spad_a_depth : int
        Words of the GEMM engine's A scratchpad; a word is one column of an A tile
        (``rows`` operands of ``in_width`` bits). An ``M x K`` operand takes
        ``ceil(M/rows) * K`` words.
    spad_b_depth : int
        Words of the B scratchpad (a word: ``cols`` operands, one row of a B panel); even,
        split into two halves that double-buffer one ``K x cols`` panel each, so ``K <=
        spad_b_depth / 2``.
    spad_c_depth : int
        Words of the result scratchpad (a word: ``rows`` accumulators of ``acc_width`` bits,
        one column of a result tile). An ``M x N`` result takes ``ceil(M/rows) * N`` words.
    dmem_depth : int
        Words of the top level's data scratchpad (one element per word, see :mod:`nanokpu.isa`);
        at most ``2**24`` (the instruction address fields).
    imem_depth : int
        Instructions held by the top level's instruction memory; at most ``2**12``.

    Quantisation scheme and router precision
    ----------------------------------------
    The RTL and the compiler build every field below; the golden integer path defines them
    (issue 26, docs/fidelity.md).

    weight_scales : str
        One of :data:`WEIGHT_SCALES`: symmetric int weights with zero point 0 and one scale per
        tensor (``tensor``, the default) or per output channel (``channel``) in every GEMM; with
        ``channel`` each requantiser takes a multiplier and a shift per output column. Activations
        keep one scale per tensor (see :mod:`golden.block`).
    router_width : int or None
        Operand width of the router GEMM (the block input ``x`` and ``W_r``), in ``[in_width,
        min(16, 2*in_width)]``; ``None`` (default) means ``in_width``. A wider operand is two
        ``in_width``-bit digits: the RTL runs the router GEMM as byte-sliced passes on the array.
        The other GEMMs take ``x`` rounded to ``in_width`` bits. The router GEMM accumulates in
        :attr:`router_acc_width` bits.
    logit_width, logit_frac : int or None
        Format ``Q<logit_width>.<logit_frac>`` of the router logits (the router requantiser's
        output, the sigmoid's input); ``logit_width`` in ``[2, 24]`` (the sigmoid table is checked
        over every input) and at most ``acc_width`` (the requantiser's widest output); ``None``
        (default) means ``act_width`` / ``act_frac``.
    layer_ops : bool
        Whether the nano-KPU builds the K3 layer's element-wise ops (:data:`nanokpu.isa.LAYER_OPS`):
        ``SILU`` and ``DECAY`` (SiLU and the KDA decay, act format in, on their own tables beside
        the sigmoid's) and ``SOFTMAX`` (rows of up to :attr:`attnres_candidates` logits, the
        Attention Residuals' softmax over depth); without (the default), they are
        :attr:`~nanokpu.isa.Err.BAD_OPCODE`.
    """

    name: str = "custom"
    # -- model shapes -----------------------------------------------------------------
    d_model: int = 32
    d_latent: int = 16
    n_experts: int = 8
    top_k: int = 2
    d_expert: int = 16
    d_shared: int = 32
    d_dense: int = 64
    n_heads: int = 2
    q_lora_rank: int = 16
    kv_lora_rank: int = 8
    qk_nope_dim: int = 8
    qk_rope_dim: int = 4
    v_head_dim: int = 8
    kda_head_dim: int = 8
    kda_conv: int = 4
    kda_gate_min: float = -5.0
    n_layers: int = 8
    mla_period: int = 4
    dense_layers: int = 1
    attnres_block: int = 4
    beta1: float = 4.0
    beta2: float = 25.0
    routed_scaling: float = 1.0
    rms_eps: float = 1e-5
    l2_eps: float = 1e-6
    # -- hardware ---------------------------------------------------------------------
    rows: int = 4
    cols: int = 4
    in_width: int = 8
    acc_width: int = 32
    out_width: int = 8
    mult_width: int = 16
    rounding: str = "half_even"
    dsp: str = "generic"
    act_width: int = 16
    act_frac: int = 8
    situ_frac: int = 10
    h_width: int = 16
    h_frac: int = 8
    score_frac: int = 12
    bias_width: int = 16
    weight_frac: int = 15
    norm_frac: int = 5
    act_lanes: int = 1
    route_lanes: int = 1
    load_width: int = 16
    pwl_guard: int = 4
    spad_a_depth: int = 256
    spad_b_depth: int = 128
    spad_c_depth: int = 256
    dmem_depth: int = 8192
    imem_depth: int = 64
    # -- quantisation scheme and router precision ----------------------------------------------
    weight_scales: str = "tensor"
    router_width: int | None = None
    logit_width: int | None = None
    logit_frac: int | None = None
    # -- the K3 layer's ops ----------------------------------------------------------------
    layer_ops: bool = False

    def __post_init__(self):
        self._validate()

    # ------------------------------------------------------------------------------------
    def _need(self, cond, field_name, allowed):
        """Raise ``ValueError`` naming ``field_name``, its value and what is ``allowed``, unless ``cond``."""
        if not cond:
            value = getattr(self, field_name)
            raise ValueError(f"KpuConfig.{field_name} = {value!r}: must be {allowed}")

    def _validate(self):
        need = self._need
        need(isinstance(self.name, str) and self.name != "", "name", "a non-empty string")
        positive = (
            "d_model d_latent n_experts top_k d_expert d_shared d_dense n_heads q_lora_rank "
            "kv_lora_rank qk_nope_dim v_head_dim kda_head_dim kda_conv n_layers mla_period "
            "attnres_block rows cols in_width acc_width out_width mult_width act_width "
            "h_width bias_width act_lanes route_lanes spad_a_depth spad_b_depth spad_c_depth "
            "dmem_depth imem_depth"
        ).split()
        for name in positive:
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and value > 0,
                 name, "a positive integer")
        for name in ("qk_rope_dim", "dense_layers", "act_frac", "situ_frac", "h_frac",
                     "score_frac", "weight_frac", "norm_frac", "pwl_guard"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                 name, "a non-negative integer")
        def real(value) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        for name in ("beta1", "beta2", "routed_scaling", "rms_eps", "l2_eps"):
            value = getattr(self, name)
            need(real(value) and value > 0, name, "a finite positive number")
        need(real(self.kda_gate_min) and self.kda_gate_min < 0, "kda_gate_min",
             "a finite negative number (the forget gate lies in (kda_gate_min, 0))")
        need(self.top_k <= self.n_experts, "top_k", f"in [1, n_experts={self.n_experts}]")
        need(self.d_model % self.d_latent == 0, "d_latent",
             f"a divisor of d_model={self.d_model}")
        need(self.dense_layers <= self.n_layers, "dense_layers", f"in [0, n_layers={self.n_layers}]")
        need(self.rounding in ROUNDING_MODES, "rounding", f"one of {ROUNDING_MODES}")
        need(self.dsp in DSP_TARGETS, "dsp", f"one of {DSP_TARGETS}")
        need(self.dsp != "ice40" or self.in_width <= 8, "dsp",
             f"not 'ice40' with in_width = {self.in_width} (SB_MAC16 8x8 products take at most 8 bits)")
        need(2 <= self.in_width <= 18, "in_width", "in [2, 18] (one DSP multiplier operand)")
        need(2 * self.in_width <= self.acc_width <= 64, "acc_width",
             f"in [2*in_width={2 * self.in_width}, 64]")
        need(self.spad_b_depth % 2 == 0, "spad_b_depth", "even (two double-buffered B panels)")
        largest = (1 << (self.in_width - 1)) ** 2 * (self.spad_b_depth // 2)   # the largest GEMM sum
        need(largest < 1 << (self.acc_width - 1), "acc_width",
             f"at least {largest.bit_length() + 1}: a GEMM sums up to spad_b_depth/2 = {self.spad_b_depth // 2} "
             f"products of in_width = {self.in_width} bits, up to {largest} (or lower spad_b_depth)")
        need(2 <= self.out_width <= self.acc_width, "out_width", f"in [2, acc_width={self.acc_width}]")
        need(self.mult_width <= 32, "mult_width", "in [1, 32]")
        need(self.act_frac < self.act_width, "act_frac", f"less than act_width={self.act_width}")
        need(self.h_frac < self.h_width, "h_frac", f"less than h_width={self.h_width}")
        bound = self.beta1 * self.beta2
        need(bound * 2 ** self.h_frac <= 2 ** (self.h_width - 1) - 1, "h_width",
             f"wide enough for +-beta1*beta2 = +-{bound:g} in Q{self.h_width}.{self.h_frac} "
             f"(needs {bound * 2 ** self.h_frac:.0f} <= 2**(h_width-1)-1)")
        need(self.h_frac <= 2 * self.situ_frac, "h_frac",
             f"at most 2*situ_frac = {2 * self.situ_frac} (h is the product of two situ_frac factors)")
        need(self.score_frac <= 30, "score_frac", "in [0, 30]")
        need(self.weight_frac <= 30, "weight_frac", "in [0, 30]")
        need(self.bias_width >= self.score_frac + 2, "bias_width",
             f"at least score_frac + 2 = {self.score_frac + 2} (a sign and one integer bit)")
        need(self.norm_frac < self.out_width, "norm_frac", f"less than out_width={self.out_width}")
        need(self.act_lanes <= 64, "act_lanes", "in [1, 64]")
        for name in ("spad_a_depth", "spad_b_depth", "spad_c_depth"):
            need(getattr(self, name) <= 1 << 20, name, "at most 2**20 words")
        need(self.dmem_depth <= 1 << 24, "dmem_depth", "at most 2**24 words")
        need(self.imem_depth <= 1 << 12, "imem_depth", "at most 2**12 instructions")
        need(self.route_lanes <= self.n_experts, "route_lanes",
             f"in [1, n_experts={self.n_experts}]")
        need(isinstance(self.load_width, int) and not isinstance(self.load_width, bool)
             and 1 <= self.load_width <= 32, "load_width", "an integer in [1, 32]")
        self._validate_router()

    def _validate_router(self):
        need = self._need
        def int_or_none(value) -> bool:
            return value is None or (isinstance(value, int) and not isinstance(value, bool))

        need(self.weight_scales in WEIGHT_SCALES, "weight_scales", f"one of {WEIGHT_SCALES}")
        need(isinstance(self.layer_ops, bool), "layer_ops", "True or False")
        top = max(ROUTER_WIDTH_MAX, self.in_width)
        rw = self.router_width
        need(int_or_none(rw) and (rw is None or self.in_width <= rw <= top), "router_width",
             f"None (= in_width) or an integer in [in_width={self.in_width}, {top}]")
        need(rw is None or rw <= 2 * self.in_width, "router_width",
             f"at most 2*in_width = {2 * self.in_width}: a router operand is two in_width-bit digits "
             f"(byte-sliced passes on the array)")
        need(not self.wide_router or self.router_acc_width + self.mult_width <= 64, "router_width",
             f"at most {self.in_width + (64 - self.mult_width - self.acc_width) // 2}: the router accumulator "
             f"(acc_width + 2 * (router_width - in_width) bits) times the requantiser multiplier "
             f"(mult_width = {self.mult_width} bits) must fit 64 bits")
        need(int_or_none(self.logit_width) and (self.logit_width is None or 2 <= self.logit_width <= LOGIT_WIDTH_MAX),
             "logit_width", f"None (= act_width) or an integer in [2, {LOGIT_WIDTH_MAX}]")
        need(self.logit_width is None or self.logit_width <= self.acc_width, "logit_width",
             f"at most acc_width = {self.acc_width} (the router requantiser's output)")
        need(self.logit_frac is not None or self.act_frac < self.router_logit_width, "logit_width",
             f"more than act_frac = {self.act_frac} (the logit fraction while logit_frac is None)")
        need(int_or_none(self.logit_frac)
             and (self.logit_frac is None or 0 <= self.logit_frac < self.router_logit_width),
             "logit_frac", f"None (= act_frac) or an integer in [0, {self.router_logit_width - 1}] "
             f"(below the logit width)")

    # -- derived quantities ---------------------------------------------------------------
    @property
    def situ_bound(self) -> float:
        """``beta1 * beta2``: the bound of ``|h|`` (100 for K3)."""
        return self.beta1 * self.beta2

    @property
    def mul_factor_width(self) -> int:
        """Width of ``MUL``'s signed factor: ``max(mult_width, score_width + 1)``, an RMSNorm weight
        (``mult_width`` bits) or a sigmoid gate (unsigned, up to ``2**score_frac``)."""
        return max(self.mult_width, self.score_width + 1)

    @property
    def kda_unit_frac(self) -> int:
        """Fractional bits of the KDA mixer's l2-normalised ``q``, ``k``: ``act_width - 2`` (the unit
        format ``Q<act_width>.<act_width - 2>``, +-1.0 and a sign)."""
        return self.act_width - 2

    @property
    def kda_state_width(self) -> int:
        """Width of the KDA state ``S``: ``2 * act_width``."""
        return 2 * self.act_width

    @property
    def kda_state_frac(self) -> int:
        """Fractional bits of the KDA state ``S``: ``2 * act_frac`` (``act_frac`` more than ``v``)."""
        return 2 * self.act_frac

    @property
    def score_width(self) -> int:
        """Width of an unsigned sigmoid score, 1.0 included."""
        return self.score_frac + 1

    @property
    def attnres_candidates(self) -> int:
        """``N`` of the deepest Attention Residuals: the embedding, one representative per
        later block (``ceil(n_layers / attnres_block)`` in all) and the partial sum ``P``."""
        return -(-self.n_layers // self.attnres_block) + 1

    @property
    def mla_max_tokens(self) -> int:
        """The most keys (cached and new) one MLA query may attend to: ``S`` with ``S 2**(score_frac +
        in_width - 1) < 2**(ONLINE_WIDTH - 1)`` (the numerator bound of the online softmax) and ``S
        2**score_frac < 2**ONLINE_WIDTH`` (the running sum's); ``ATTEND``'s ``k`` at most."""
        return (1 << (ONLINE_WIDTH - 1 - self.score_frac - (self.in_width - 1))) - 1

    @property
    def weight_width(self) -> int:
        """Width of an unsigned routing weight, 1.0 included."""
        return self.weight_frac + 1

    @property
    def router_operand_width(self) -> int:
        """Operand width of the router GEMM: ``router_width``, or ``in_width`` when it is None."""
        return self.in_width if self.router_width is None else self.router_width

    @property
    def wide_router(self) -> bool:
        """``router_operand_width > in_width``: the router GEMM's operands are two ``in_width``-bit
        digits, and the nano-KPU builds ``SPLIT`` and ``REQUANT_WIDE`` (:data:`nanokpu.isa.WIDE_ROUTER_OPS`;
        without, they are :attr:`~nanokpu.isa.Err.BAD_OPCODE`)."""
        return self.router_operand_width > self.in_width

    @property
    def router_acc_width(self) -> int:
        """Accumulator width of the router GEMM: ``acc_width + 2 * (router_operand_width - in_width)``
        (each wider operand adds its extra bits to every product), so it is as exact as the others."""
        return self.acc_width + 2 * (self.router_operand_width - self.in_width)

    @property
    def router_logit_width(self) -> int:
        """Width of the router logits: ``logit_width``, or ``act_width`` when it is None."""
        return self.act_width if self.logit_width is None else self.logit_width

    @property
    def router_logit_frac(self) -> int:
        """Fraction bits of the router logits: ``logit_frac``, or ``act_frac`` when it is None."""
        return self.act_frac if self.logit_frac is None else self.logit_frac

    @property
    def is_mla_layer(self):
        """``is_mla_layer(L)`` for a 0-based layer index L: MLA or KDA by the K3 pattern."""
        def check(layer: int) -> bool:
            one_based = layer + 1
            return one_based % self.mla_period == 0 or one_based == self.n_layers
        return check

    def replace(self, **changes) -> KpuConfig:
        """A copy with ``changes`` applied, validated again."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}


PROFILES: dict[str, KpuConfig] = {
    # The whole nano-KPU on an ECP5-25F (OrangeCrab 25F); its GEMM engine alone on an iCE40 UP5K
    # (iCEBreaker): a 4x4 int8 array (16 MACs; the SB_MAC16 blocks in dual 8x8 mode); 24-bit
    # accumulators, exact for every GEMM the engine takes (k <= spad_b_depth/2 = 64 products of at
    # most 2**14: |sum| <= 2**20), which saves 2 of the UP5K's block RAMs and ~450 flip-flops.
    "tiny": KpuConfig(name="tiny", acc_width=24),
    # ECP5-85F: an 8x8 array on 64 of its 156 multipliers; the data scratchpad (2 Mbit, a
    # 16-token block takes 54,208 words) in 128 of its 208 block RAMs.
    "small": KpuConfig(
        name="small", d_model=256, d_latent=128, n_experts=64, top_k=4, d_expert=128,
        d_shared=256, d_dense=512, n_heads=4, q_lora_rank=64, kv_lora_rank=32,
        qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16, kda_head_dim=16, n_layers=12,
        attnres_block=4, rows=8, cols=8, act_lanes=4, route_lanes=4,
        spad_a_depth=4096, spad_b_depth=1024, spad_c_depth=2048, dmem_depth=1 << 16,
    ),
    # The real K3 shapes (the full layer does not fit in memory; the router, top-k,
    # Quantile Balancing and one expert do).
    "k3": KpuConfig(
        name="k3", d_model=7168, d_latent=3584, n_experts=896, top_k=16, d_expert=3072,
        d_shared=6144, d_dense=33792, n_heads=96, q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128, kda_head_dim=128, kda_conv=4,
        n_layers=93, mla_period=4, dense_layers=1, attnres_block=12,
        rows=8, cols=8, act_lanes=4, route_lanes=16,
        spad_a_depth=4096, spad_b_depth=1024, spad_c_depth=2048,
    ),
}


def profile(name: str, **overrides) -> KpuConfig:
    """The named profile, with ``overrides`` applied (validated)."""
    try:
        base = PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}: choose one of {sorted(PROFILES)}") from None
    return base.replace(**overrides) if overrides else base


def config_to_dict(cfg: KpuConfig) -> dict:
    """``cfg`` as a JSON-ready dict: every field by name, tuples as lists.

    :func:`config_from_dict` rebuilds the same config from it (also after ``json.dumps`` and
    ``json.loads``: Python writes floats exactly).
    """
    def plain(value):
        return [plain(v) for v in value] if isinstance(value, (tuple, list)) else value

    if not isinstance(cfg, KpuConfig):
        raise TypeError(f"cfg must be a KpuConfig, not {cfg!r}")
    return {name: plain(value) for name, value in cfg.as_dict().items()}


def config_from_dict(d: dict) -> KpuConfig:
    """The :class:`KpuConfig` of :func:`config_to_dict`'s ``d`` (lists back to tuples), validated.

    Fields missing from ``d`` take their defaults; an unknown key raises ValueError naming it.
    """
    def frozen(value):
        return tuple(frozen(v) for v in value) if isinstance(value, (tuple, list)) else value

    known = {f.name for f in dataclasses.fields(KpuConfig) if f.init}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown KpuConfig fields {unknown}")
    return KpuConfig(**{name: frozen(value) for name, value in d.items()})
