"""KpuConfig: profiles carry the right shapes; invalid values fail naming the field."""

import dataclasses

import pytest

from nanokpu.config import PROFILES, KpuConfig, profile


def test_k3_profile_has_the_real_shapes():
    k3 = profile("k3")
    assert (k3.d_model, k3.d_latent, k3.n_experts, k3.top_k, k3.d_expert) == (7168, 3584, 896, 16, 3072)
    assert (k3.n_heads, k3.q_lora_rank, k3.kv_lora_rank, k3.qk_nope_dim, k3.qk_rope_dim) == (
        96, 1536, 512, 128, 64)
    assert (k3.d_shared, k3.d_dense, k3.n_layers, k3.attnres_block) == (6144, 33792, 93, 12)
    assert (k3.beta1, k3.beta2, k3.situ_bound) == (4.0, 25.0, 100.0)


def test_k3_layer_pattern():
    k3 = profile("k3")
    mla = [L + 1 for L in range(k3.n_layers) if k3.is_mla_layer(L)]
    assert mla == list(range(4, 93, 4)) + [93]
    assert k3.n_layers - len(mla) == 69


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profiles_are_frozen_and_valid(name):
    cfg = profile(name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rows = 3
    assert cfg.replace() == cfg


@pytest.mark.parametrize("field, value, message", [
    ("top_k", 9, r"top_k = 9: must be in \[1, n_experts=8\]"),
    ("top_k", 0, "top_k = 0: must be a positive integer"),
    ("rows", 0, "rows = 0: must be a positive integer"),
    ("cols", -2, "cols"),
    ("d_latent", 12, "d_latent = 12: must be a divisor of d_model=32"),
    ("beta1", 0.0, "beta1 = 0.0: must be a positive number"),
    ("beta2", -25.0, "beta2"),
    ("rounding", "nearest", "rounding = 'nearest': must be one of"),
    ("dsp", "xilinx", r"dsp = 'xilinx': must be one of \('generic', 'ice40', 'ecp5'\)"),
    ("h_width", 15, r"h_width = 15: must be wide enough for \+-beta1\*beta2 = \+-100"),
    ("acc_width", 12, r"acc_width = 12: must be in \[2\*in_width=16, 64\]"),
    ("act_lanes", 0, "act_lanes"),
    ("route_lanes", 9, "route_lanes"),
    ("in_width", 8.0, "in_width = 8.0: must be a positive integer"),
    ("bias_width", 10, "bias_width"),
    ("norm_frac", 8, "norm_frac"),
])
def test_invalid_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=f"KpuConfig.{message}"):
        KpuConfig(**{field: value})


def test_unknown_profile():
    with pytest.raises(ValueError, match="unknown profile 'huge'"):
        profile("huge")


@pytest.mark.parametrize("name", ["tiny", "small", "k3"])
def test_accumulators_never_wrap_in_one_gemm(name):
    """Every GEMM the engine takes (k <= spad_b_depth/2) sums in acc_width bits exactly."""
    cfg = profile(name)
    largest = (1 << (cfg.in_width - 1)) ** 2 * (cfg.spad_b_depth // 2)
    assert largest < 1 << (cfg.acc_width - 1)
