"""``nanokpu demo``: a profile's K3 layers and one LatentMoE block through the golden model.

Runs every layer of the profile in float64 (KDA/MLA by the K3 pattern, dense then LatentMoE
FFNs, Attention Residuals), then one LatentMoE block on both the float and the integer path,
and prints the routing loads, the SiTU bound and the integer-vs-float error.
"""

from __future__ import annotations

import time

import numpy as np

from golden import block, k3
from golden import intops as I
from nanokpu.commands.args import int_in, seed
from nanokpu.config import PROFILES, KpuConfig, profile


def layer_stack(cfg: KpuConfig, tokens: int, rng) -> list[str]:
    """Run all layers of ``cfg`` on random embeddings; one line per layer."""
    P = rng.standard_normal((tokens, cfg.d_model))
    Bl: list = []
    lines = []
    for L in range(cfg.n_layers):
        params = k3.init_layer(L, cfg, rng)
        P, Bl = k3.layer(L, P, Bl, params, cfg)
        mixer = "MLA" if cfg.is_mla_layer(L) else "KDA"
        ffn = "dense" if L < cfg.dense_layers else "LatentMoE"
        lines.append(f"  layer {L:2d}: {mixer} + {ffn:9s}  rms(P) = {np.sqrt(np.mean(P ** 2)):7.3f}  "
                     f"blocks = {len(Bl)}")
    return lines


def block_summary(cfg: KpuConfig, tokens: int, rng) -> list[str]:
    Q, x_q, y, idx = block.random_block(cfg, tokens, rng)
    out = block.latent_moe_int(x_q, Q, cfg)
    err = block.block_error(out["y"], y, cfg)
    loads = out["loads"]
    target = tokens * cfg.top_k / cfg.n_experts
    same = np.mean(block.same_routing(out["idx"], idx))
    g = np.arange(-(1 << (cfg.act_width - 1)), 1 << (cfg.act_width - 1))
    h_max = int(np.max(np.abs(I.gate_q(g, cfg))) * np.max(np.abs(I.up_q(g, cfg))))
    h_max >>= 2 * cfg.situ_frac - cfg.h_frac
    return [
        f"  routing loads (integer path, {tokens} tokens x top-{cfg.top_k} over {cfg.n_experts} "
        f"experts, target {target:g}): {loads.tolist()}",
        f"  experts used: {int(np.count_nonzero(loads))} of {cfg.n_experts}; max load / target = "
        f"{loads.max() / target:.2f}; same expert set as float: {same:.1%} of tokens",
        f"  SiTU bound: |h| <= beta1*beta2 = {cfg.situ_bound:g}; the largest fixed-point |h| over all "
        f"inputs is {h_max / 2 ** cfg.h_frac:.4f} in Q{cfg.h_width}.{cfg.h_frac} "
        f"(max {((1 << (cfg.h_width - 1)) - 1) / 2 ** cfg.h_frac:.4f}): no saturation logic needed",
        f"  integer vs float block output: cosine {err['cosine']:.5f}, max abs error "
        f"{err['max_abs']:.4f} (max |y| {np.abs(y).max():.3f}), rms relative error {err['rms_rel']:.4f}",
    ]


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    parser.add_argument("--tokens", type=int_in(1, 4096), default=32)
    parser.add_argument("--seed", type=seed, default=0)


def run(args) -> int:
    cfg = profile(args.profile)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    print(f"nano-KPU golden model, profile '{cfg.name}' (seed {args.seed}): d={cfg.d_model}, "
          f"latent={cfg.d_latent}, {cfg.n_experts} experts top-{cfg.top_k}, {cfg.n_layers} layers")
    if args.profile == "k3":
        print("  (the whole k3 layer does not fit in memory: only the routed block's router and "
              "one expert do; run the router demo `nanokpu qb-demo` instead)")
    else:
        print(f"{cfg.n_layers} float64 layers, {args.tokens} tokens:")
        for line in layer_stack(cfg, args.tokens, rng):
            print(line)
    print("one LatentMoE block, float64 and integer paths:")
    for line in block_summary(cfg, args.tokens, rng) if args.profile != "k3" else []:
        print(line)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0
