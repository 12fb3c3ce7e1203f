"""The nanokpu command line: help, the golden demo, clear errors."""

import subprocess
import sys

import pytest

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
    """(Every command's table: tests/commands/test_bad_input.py.)"""
    assert cli.main(["demo", "--tokens", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "nanokpu demo: error: argument --tokens: 0: must be an integer in [1, 4096]\n"


@pytest.mark.parametrize("argv", [["qb-demo", "--tokens", "0", "--out", "{tmp}"],
                                  ["bench-router", "--tokens", "0", "--out", "{tmp}/r.md"],
                                  ["board-run", "--board", "ulx3s", "--port", "/dev/null", "--tokens", "0"]])
def test_zero_tokens_is_one_clear_line_before_any_build(argv, capsys, tmp_path):
    assert cli.main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert f"nanokpu {argv[0]}: error: " in err and ("tokens = 0" in err or "--tokens: 0" in err)
    assert "Traceback" not in err


def test_one_gemm_only_on_the_icebreaker(capsys):
    assert cli.main(["board-run", "--board", "ulx3s", "--port", "/dev/null", "--gemm", "4", "4", "4"]) == 2
    err = capsys.readouterr().err
    assert "nanokpu board-run: error: gemm: one GEMM runs on a GEMM engine build (icebreaker), not on ulx3s" in err


def test_console_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "nanokpu.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "nanokpu" in out.stdout
