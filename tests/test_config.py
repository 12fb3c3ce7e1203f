"""KpuConfig: profiles carry the right shapes; invalid values fail naming the field."""

import dataclasses
import json

import pytest

from nanokpu.config import PROFILES, KpuConfig, config_from_dict, config_to_dict, profile


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
    ("beta1", 0.0, "beta1 = 0.0: must be a finite positive number"),
    ("routed_scaling", float("inf"), "routed_scaling = inf: must be a finite positive number"),
    ("rms_eps", float("nan"), "rms_eps = nan"),
    ("beta1", True, "beta1 = True"),
    ("kda_gate_min", float("-inf"), "kda_gate_min = -inf: must be a finite negative number"),
    ("kda_gate_min", "x", "kda_gate_min = 'x': must be a finite negative number"),
    ("name", 5, "name = 5: must be a non-empty string"),
    ("load_width", True, r"load_width = True: must be an integer in \[1, 32\]"),
    ("acc_width", 16, "acc_width = 16: must be at least 22: a GEMM sums up to spad_b_depth/2 = 64 products"),
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
    ("weight_scales", "row", r"weight_scales = 'row': must be one of \('tensor', 'channel'\)"),
    ("router_width", 7, r"router_width = 7: must be None \(= in_width\) or an integer in \[in_width=8, 16\]"),
    ("router_width", 17, r"router_width = 17: must be None \(= in_width\) or an integer in \[in_width=8, 16\]"),
    ("router_width", 16.0, "router_width = 16.0: must be None"),
    ("logit_width", 25, r"logit_width = 25: must be None \(= act_width\) or an integer in \[2, 24\]"),
    ("logit_width", 8, "logit_width = 8: must be more than act_frac = 8"),
    ("logit_frac", 16, r"logit_frac = 16: must be None \(= act_frac\) or an integer in \[0, 15\]"),
    ("logit_frac", -1, "logit_frac = -1"),
])
def test_invalid_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=f"KpuConfig.{message}"):
        KpuConfig(**{field: value})


def test_router_fields_resolve_to_the_defaults_and_bound_the_accumulator():
    """None means in_width / the act format; the router accumulator widens by two bits per extra
    operand bit and, times the multiplier, must fit 64 bits."""
    cfg = KpuConfig()
    assert (cfg.router_operand_width, cfg.router_acc_width, cfg.router_logit_width, cfg.router_logit_frac) == \
        (cfg.in_width, cfg.acc_width, cfg.act_width, cfg.act_frac)
    wide = KpuConfig(router_width=16, logit_width=20, logit_frac=16, weight_scales="channel")
    assert (wide.router_acc_width, wide.router_logit_width, wide.router_logit_frac) == (48, 20, 16)
    assert KpuConfig(in_width=18, acc_width=48, spad_b_depth=128).router_operand_width == 18
    with pytest.raises(ValueError, match="KpuConfig.router_width = 16: must be at most 12: the router accumulator"):
        KpuConfig(router_width=16, acc_width=40)
    with pytest.raises(ValueError, match=r"KpuConfig.router_width = 10: must be at most 2\*in_width = 8: a router "
                                         "operand is two in_width-bit digits"):
        KpuConfig(in_width=4, router_width=10)
    assert KpuConfig(in_width=4, router_width=8).router_acc_width == 40
    with pytest.raises(ValueError, match=r"KpuConfig.logit_width = 24: must be at most acc_width = 22 \(the router"):
        KpuConfig(acc_width=22, logit_width=24)


def test_unknown_profile():
    with pytest.raises(ValueError, match="unknown profile 'huge'"):
        profile("huge")


def test_accumulator_width_bound_is_tight():
    """The largest GEMM sum, 64 products of (-128) * (-128) = 2**20, needs 22 signed bits:
    22 is accepted, 21 refused, and the golden GEMM at that bound does not wrap at 22."""
    import numpy as np

    from golden.intops import matmul_int

    cfg = KpuConfig(acc_width=22, spad_b_depth=128)
    with pytest.raises(ValueError, match="acc_width = 21: must be at least 22"):
        KpuConfig(acc_width=21, spad_b_depth=128)
    a = np.full((1, cfg.spad_b_depth // 2), -128)
    assert matmul_int(a, a.T, cfg.acc_width)[0, 0] == 1 << 20


@pytest.mark.parametrize("cfg", [*PROFILES.values(),
                                 profile("small", dsp="ice40", rounding="floor", beta1=2.5, rms_eps=3e-7,
                                         acc_width=30, route_lanes=8),
                                 profile("small", weight_scales="channel", router_width=16, logit_width=20,
                                         logit_frac=16, score_frac=16, bias_width=20)],
                         ids=[*PROFILES, "small-overrides", "small-wide-router"])
def test_config_dict_round_trip_through_json(cfg):
    """config_to_dict is JSON-ready and config_from_dict rebuilds the same config, field types included."""
    d = json.loads(json.dumps(config_to_dict(cfg)))
    back = config_from_dict(d)
    assert back == cfg
    assert [type(getattr(back, f.name)) for f in dataclasses.fields(cfg)] == \
        [type(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)]


def test_config_from_dict_names_unknown_and_invalid_fields():
    assert config_to_dict(profile("tiny"))["name"] == "tiny"
    with pytest.raises(ValueError, match="unknown KpuConfig fields \\['lanes'\\]"):
        config_from_dict({"lanes": 4})
    with pytest.raises(ValueError, match="top_k = 9"):
        config_from_dict({**config_to_dict(profile("tiny")), "top_k": 9})
