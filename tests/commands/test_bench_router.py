"""``nanokpu bench-router`` (nanokpu/commands/bench_router.py): ``--scheme after`` measures the K3 router
at issue 26's score and bias formats on Verilator, bit-exact and at the same cycles per token."""

from __future__ import annotations

import pytest

from nanokpu import cli


@pytest.mark.slow(55)
def test_after_scheme_row(tmp_path, capsys):
    """16 lanes, no synthesis: 56 cycles per token (the score beats bind: R + k + 2 = 50), scores
    Q1.16 and bias Q20.16 named in the report."""
    out = tmp_path / "router.md"
    assert cli.main(["bench-router", "--scheme", "after", "--route-lanes", "16", "--tokens", "4", "--no-synth",
                     "--out", str(out), "-q"]) == 0
    text = out.read_text()
    assert "`nanokpu bench-router --profile k3 --scheme after --route-lanes 16`" in text
    assert "scores Q1.16 unsigned, bias Q20.16" in text
    assert "| 16 | 56 | 56 |" in text
    assert "route_lanes 16: 56 cycles/token" in capsys.readouterr().out
