"""The nanokpu command line: help, the golden demo, clear errors."""

import subprocess
import sys

from nanokpu import cli


def test_help_lists_subcommands(capsys):
    parser = cli.build_parser()
    help_text = parser.format_help()
    for name in cli.COMMANDS:
        assert name in help_text


def test_demo_prints_a_summary(capsys):
    assert cli.main(["demo", "--profile", "tiny", "--tokens", "16", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "MLA + LatentMoE" in out and "KDA + dense" in out
    assert "routing loads" in out and "SiTU bound" in out and "cosine" in out


def test_bad_input_is_one_clear_line(capsys):
    assert cli.main(["demo", "--tokens", "0"]) == 2
    err = capsys.readouterr().err
    assert "error: --tokens = 0" in err and "Traceback" not in err


def test_console_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "nanokpu.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "nanokpu" in out.stdout
