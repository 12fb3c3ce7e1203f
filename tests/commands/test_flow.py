"""The main job (`nanokpu flow`): every step runs and the summary says what it did."""

import pytest

from nanokpu import cli


def test_flow_without_synthesis_says_so_and_a_mismatch_fails(capsys, monkeypatch):
    """--no-synth skips step 4 and says so; a run that is not bit-exact makes the flow fail and
    the summary say NOT (the RTL stubbed: the real chain is the test below)."""
    from nanokpu.commands import simulate

    runs = []

    def not_exact(cfg, tokens, seed, **kwargs):
        runs.append((cfg.name, tokens, seed))
        return {"bit_exact": False, "failure": "y differs"}

    monkeypatch.setattr(simulate, "simulate", not_exact)
    assert cli.main(["flow", "--no-synth", "--seed", "2"]) == 1
    out = capsys.readouterr().out
    assert runs == [("tiny", simulate.DEFAULT_TOKENS.get("tiny", 8), 2)]
    assert "simulated" in out and "NOT bit-exact" in out and "synthesis skipped" in out
    assert "== [4/4]" not in out


@pytest.mark.slow(425)
def test_flow_with_synthesis(capsys):
    assert cli.main(["flow"]) == 0
    out = capsys.readouterr().out
    assert "== [1/4] golden model" in out and "== [3/4] simulate" in out
    assert "bit-exact with the golden integer block" in out
    assert "generated" in out and "rtl/tiny/" in out
    assert "== [4/4] synthesize" in out and "synthesized for ecp5-25f" in out
    assert "Fmax" in out and "does not fit" not in out  # placed and routed on tiny's own part
