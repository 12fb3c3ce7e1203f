"""nanokpu.commands.report_fidelity: the command writes the report; docs/fidelity.md names the
current schemes. (The bounds themselves: tests/golden/test_fidelity.py.)"""

from golden import fidelity
from nanokpu import cli
from nanokpu.commands import report_fidelity
from nanokpu.config import profile


def test_committed_report_names_the_current_schemes():
    doc = (report_fidelity.DOCS / "fidelity.md").read_text()
    for line in (report_fidelity._fields(profile("k3")), report_fidelity._fields(
            fidelity.scheme(profile("k3"), fidelity.AFTER))):
        assert line in doc, f"docs/fidelity.md is stale ({line!r}): run `nanokpu report-fidelity`"
    for row in ("| tiny blocks | before |", "| small blocks | after |", "| K3 router shape | after |"):
        assert row in doc


def test_command_writes_every_row(tmp_path, monkeypatch, capsys):
    """The measurement cut to one seed and a few tokens per row (the real one takes minutes)."""
    real_router, real_blocks = fidelity.router_fidelity, fidelity.block_fidelity
    monkeypatch.setattr(fidelity, "router_fidelity",
                        lambda cfgs, seeds, tokens, progress=None: real_router(cfgs, seeds[:1], 2, progress))
    monkeypatch.setattr(fidelity, "block_fidelity",
                        lambda cfgs, seeds, blocks, n, progress=None: real_blocks(cfgs, seeds[:1], 1, n, progress))
    out = tmp_path / "fidelity.md"
    assert cli.main(["report-fidelity", "--seeds", "20", "--tokens", "20", "--out", str(out), "-q"]) == 0
    text = out.read_text()
    for row in ("tiny blocks", "small blocks", "K3 router shape"):
        for scheme in ("before", "after"):
            assert f"| {row} | {scheme} |" in text
    assert "## Reading it" in text and f"wrote {out}" in capsys.readouterr().out
