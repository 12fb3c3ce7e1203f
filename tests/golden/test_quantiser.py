"""The float-to-int path (golden.block.quantize_latent_moe, quantize_tensor, quant_multiplier)
checked on its own, against float64 computed here from the float weights, not against the
integer block that consumes its output (the RTL and FuncSim are compared with that block, so a
quantiser bug could not show there).

Thresholds are the largest relative rms error measured over seeds 0-9 (16 tokens) times a
margin of 1.3, per profile; a scale off by 5 % (a wrong gain, a scale from the wrong tensor)
exceeds each of them.
"""

import numpy as np
import pytest

from golden import block, k3
from golden import intops as I
from nanokpu.config import profile

#: Largest relative rms error measured over seeds 0-9, per stage: {profile: {stage: measured}}.
MEASURED = {
    "tiny": {"z": 0.0144, "logits": 0.0124, "shared expert": 0.0300, "routed expert": 0.0424},
    "small": {"z": 0.0171, "logits": 0.0156, "shared expert": 0.0359, "routed expert": 0.0531},
}
MARGIN = 1.3


def _rel(got, want) -> float:
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))


@pytest.mark.parametrize("width", [4, 8, 16])
def test_quantize_tensor_is_symmetric_round_to_nearest(width):
    """Scale max|w| / (2**(width-1) - 1); every element within half a step; the extreme hits
    the top code; zero stays zero; -w quantises to -w_q."""
    rng = np.random.default_rng(width)
    w = rng.standard_normal((7, 13)) * 3.0
    w[0, 0] = 0.0
    q, scale = block.quantize_tensor(w, width)
    qmax = (1 << (width - 1)) - 1
    assert scale == pytest.approx(np.max(np.abs(w)) / qmax, rel=1e-15)
    assert np.all(np.abs(q * scale - w) <= scale / 2 * (1 + 1e-12))
    assert np.max(np.abs(q)) == qmax and q[0, 0] == 0
    assert np.array_equal(block.quantize_tensor(-w, width)[0], -q)


def test_quantize_tensor_per_channel_scales_each_row():
    """Per output channel (rows of [n_out, n_in]): each row is its own per-tensor quantisation;
    an all-zero row takes scale 1."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((5, 9)) * np.array([[0.01], [1.0], [30.0], [0.0], [2.0]])
    q, scale = block.quantize_tensor(w, 8, per_channel=True)
    assert scale.shape == (5,) and scale[3] == 1.0 and not q[3].any()
    for r in (0, 1, 2, 4):
        qr, sr = block.quantize_tensor(w[r], 8)
        assert np.array_equal(q[r], qr) and scale[r] == sr


def test_quantize_tensor_with_a_given_scale():
    """A given scale is used as it is (round half-even, clipped to +-qmax), per tensor only."""
    w = np.array([-1.0, -0.0625, 0.046875, 0.078125, 5.0])
    q, scale = block.quantize_tensor(w, 8, scale=2.0 ** -5)
    assert scale == 2.0 ** -5 and q.tolist() == [-32, -2, 2, 2, 127]
    with pytest.raises(ValueError, match="per tensor"):
        block.quantize_tensor(w[None], 8, per_channel=True, scale=1.0)


def test_quant_multiplier_per_column_equals_one_by_one():
    """An array of scales gives a per-column Requant whose pairs are the scalar ones, including
    scales just below a power of two (which round up to it)."""
    cfg = profile("tiny")
    scales = np.concatenate([np.exp(np.random.default_rng(2).uniform(-30, 5, 200)),
                             2.0 ** np.arange(-20, 5) * (1 - 1e-9), [0.999999]])
    r = block.quant_multiplier(scales, 8, cfg)
    assert r.per_column and len(r.mult) == len(r.shift) == scales.size
    for s, m, sh in zip(scales, r.mult, r.shift, strict=True):
        one = block.quant_multiplier(float(s), 8, cfg)
        assert (one.mult, one.shift) == (m, sh) and m < 1 << cfg.mult_width
        assert abs(m / 2.0 ** sh - s) <= s * 2.0 ** -(cfg.mult_width - 1)


@pytest.mark.parametrize("scale", [1e-6, 0.013, 0.5, 1.0, 3.7, 200.0])
def test_quant_multiplier_approximates_the_scale(scale):
    """mult / 2**shift is the scale to mult_width - 1 bits: relative error <= 2**-(mult_width-1)."""
    cfg = profile("tiny")
    r = block.quant_multiplier(scale, 8, cfg)
    assert 1 << (cfg.mult_width - 1) <= r.mult < 1 << cfg.mult_width
    assert abs(r.mult / 2.0 ** r.shift - scale) <= scale * 2.0 ** -(cfg.mult_width - 1)


@pytest.mark.parametrize("name", ["tiny", "small"])
@pytest.mark.parametrize("seed", range(10))
def test_each_stage_tracks_float(name, seed):
    """Every quantised stage, fed quantised inputs, against the same stage in float64 on the
    float inputs: the down-projection, the router logits, the shared expert and each routed
    expert on its tokens (routed_scaling folded in)."""
    cfg = profile(name)
    act = 2.0 ** cfg.act_frac
    rng = np.random.default_rng(seed)
    P = k3.init_latent_moe(cfg, rng)
    x = rng.standard_normal((16, cfg.d_model))
    Q, xq = block.quantize_latent_moe(P, x, cfg)
    assert np.all(np.abs(xq * Q.x_scale - x) <= Q.x_scale / 2 * (1 + 1e-12)), f"seed {seed}: x"

    z = x @ P.W_down_lat.T
    zq = Q.rq_down_lat(I.matmul_int(xq, Q.W_down_lat.T, cfg.acc_width), cfg)
    got = {"z": _rel(zq * np.max(np.abs(z)) / ((1 << (cfg.out_width - 1)) - 1), z)}
    logits = Q.rq_router(I.matmul_int(xq, Q.W_r.T, cfg.acc_width), cfg) / act
    got["logits"] = _rel(logits, x @ P.W_r.T)
    got["shared expert"] = _rel(block.expert_int(xq, Q.shared, cfg) / act,
                                k3.situ_ffn(x, P.Ws_gate, P.Ws_up, P.Ws_down, cfg))
    idx, _, _ = k3.router(x, P.W_r, P.bias, cfg)
    routed = []
    for j in np.unique(idx):
        tok = np.flatnonzero((idx == j).any(axis=1))
        want = cfg.routed_scaling * k3.situ_ffn(z[tok], P.W_gate[j], P.W_up[j], P.W_down[j], cfg)
        routed.append(_rel(block.expert_int(zq[tok], Q.experts[j], cfg) / act, want))
    got["routed expert"] = max(routed)
    for stage, err in got.items():
        bound = MARGIN * MEASURED[name][stage]
        assert err <= bound, f"{name} seed {seed}: {stage} relative rms error {err:.4f} > {bound:.4f}"
