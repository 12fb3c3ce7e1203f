"""The main job (`nanokpu flow`): every step runs and the summary says what it did."""

import pytest

from nanokpu import cli


def test_flow_without_synthesis_says_so_and_a_mismatch_fails(capsys, monkeypatch):
    """--no-synth skips step 4 and says so; a block or a layer that is not bit-exact makes the flow
    fail and the summary say NOT (the RTL stubbed: the real chain is the test below)."""
    from nanokpu.commands import simulate

    runs = []

    def block(cfg, tokens, seed, **kwargs):
        runs.append((cfg.name, tokens, seed))
        return {"bit_exact": runs[-1] != ("tiny", 8, 2), "failure": "y differs", "cycles": 1}

    def layers(cfg, layers, tokens, steps, seed, **kwargs):
        runs.append((cfg.name, layers, tokens, steps, seed))
        return {"bit_exact": seed != 3, "failure": "P differs",
                "rows": [{"layer": L, "cycles": 1, "error": {"cosine": 1.0}} for L in layers]}

    monkeypatch.setattr(simulate, "simulate", block)
    monkeypatch.setattr(simulate, "simulate_layers", layers)
    monkeypatch.setattr(simulate, "format_layers", lambda r: "layer summary")
    monkeypatch.setattr(simulate, "format_summary", lambda cfg, r: "block summary")
    for seed in (2, 3):
        assert cli.main(["flow", "--no-synth", "--seed", str(seed)]) == 1
        out = capsys.readouterr().out
        assert "NOT bit-exact" in out and "synthesis skipped" in out and "== [4/4]" not in out
    assert runs == [("tiny", 8, 2), ("tiny", [0, 1, 3], 4, 2, 2), ("tiny", 8, 3), ("tiny", [0, 1, 3], 4, 2, 3)]


@pytest.mark.slow(240)
def test_flow_with_synthesis(capsys):
    """The main job as the README runs it, but for nextpnr (--no-pnr: the 40-minute CI budget;
    nextpnr runs in CI on smaller designs, tests/fpga/test_synth.py, and the main job's own place
    and route is run by hand before each landing): the block and layer on the RTL, Yosys on the
    whole KPU."""
    assert cli.main(["flow", "--no-pnr"]) == 0
    out = capsys.readouterr().out
    assert "== [1/4] golden model" in out and "== [3/4] simulate" in out
    assert "bit-exact with the golden integer block" in out
    assert "simulated layer 0 (KDA mixer, dense FFN; built with layer_ops)" in out
    assert "simulated layer 1 (KDA mixer, LatentMoE FFN; built with layer_ops)" in out
    assert "simulated layer 3 (MLA mixer, LatentMoE FFN; built with layer_ops)" in out
    assert "2 decode steps carrying the KDA state" in out and "2 decode steps carrying the MLA cache" in out
    assert out.count("bit-exact with the golden integer layer") == 3
    assert "generated" in out and "rtl/tiny/" in out
    assert "== [4/4] synthesize the nano-KPU for ecp5-25f (Yosys; takes minutes)" in out
    assert "synthesized for ecp5-25f: LUT" in out and "does not fit" not in out  # fits tiny's own part
    assert "place and route skipped (--no-pnr): no Fmax" in out and "Fmax " not in out
