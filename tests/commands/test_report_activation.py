"""nanokpu.commands.report_activation: the command writes the report and plot; docs/activation.md is current."""

from nanokpu import cli
from nanokpu.commands import report_activation
from nanokpu.config import profile
from nanokpu.units.sigmoid import Sigmoid
from nanokpu.units.situ import Situ


def test_committed_report_matches_the_current_tables_and_latency():
    """Formats, table sizes and latency in docs/activation.md (cheap parts of the report):
    stale when a golden table or the pipeline changes; regenerate with `nanokpu report-activation`."""
    doc = (report_activation.DOCS / "activation.md").read_text()
    for key, cfg in report_activation.REPORT_CONFIGS.items():
        if key == "small":
            continue
        for line in report_activation._formats(key, cfg):
            assert line in doc, f"docs/activation.md is stale ({line!r}): run `nanokpu report-activation`"
    assert f"Latency: SiTU {Situ.latency} cycles, sigmoid {Sigmoid.latency} cycles" in doc
    assert (report_activation.DOCS / "activation_gate.png").exists()


def test_command_writes_report_and_plot(tmp_path, monkeypatch, capsys):
    narrow = profile("tiny", act_width=8, act_frac=4, situ_frac=6, h_width=12, h_frac=4)
    monkeypatch.setattr(report_activation, "REPORT_CONFIGS", {"tiny": narrow})
    assert cli.main(["report-activation", "--no-synth", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "activation.md").read_text()
    assert "## Error against the float64 formula" in text and "| h = gate * up |" in text
    assert "FPGA cost" not in text
    assert (tmp_path / "activation_gate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().out
