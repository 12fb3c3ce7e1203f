"""nanokpu.commands.progress: stages with elapsed time, plain lines off a terminal, a rich bar
on one, nothing with quiet."""

import io

import pytest

from nanokpu.commands.progress import Progress, add_quiet, duration


def test_plain_lines_off_a_terminal():
    out = io.StringIO()
    with Progress(stream=out) as progress:
        assert not progress.live, "a StringIO is not a terminal"
        with progress.stage("yosys"):
            pass
        progress.start(3, "points")
        progress.advance("a done")
        progress.advance("b done")
        progress.advance("c done")
        progress("a line from a flow")
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("] yosys ...") and lines[0].startswith("[")
    assert "] yosys done (0 s)" in lines[1]
    assert "[1/3] a done (~" in lines[2] and lines[2].endswith(" left)")
    assert "[3/3] c done" in lines[4] and "left" not in lines[4], "no estimate once all are done"
    assert lines[5] == "a line from a flow"


def test_quiet_prints_nothing():
    out = io.StringIO()
    with Progress(quiet=True, stream=out) as progress:
        with progress.stage("nextpnr"):
            progress.start(2)
            progress.advance("x")
        progress.line("y")
    assert out.getvalue() == ""


def test_a_failed_stage_says_so_and_raises():
    out = io.StringIO()
    progress = Progress(stream=out)
    with pytest.raises(RuntimeError), progress.stage("verilator"):
        raise RuntimeError("boom")
    assert "verilator failed after" in out.getvalue()


def test_estimate_from_the_mean_pace():
    progress = Progress(quiet=True)
    assert progress.estimate() is None
    progress.start(4)
    progress._t_bar -= 10.0      # as if the first step took 10 s
    progress.advance()
    assert progress.estimate() == pytest.approx(30.0, abs=0.5)


def test_a_live_bar_on_a_terminal():
    out = io.StringIO()
    with Progress(stream=out, live=True) as progress:
        progress.start(2, "points")
        progress.advance("first point")
        progress.advance("second point")
    assert "first point" in out.getvalue() and "second point" in out.getvalue()


def test_durations_and_the_flag():
    assert [duration(s) for s in (42, 210, 7200)] == ["42 s", "3.5 min", "2.0 h"]
    import argparse
    parser = argparse.ArgumentParser()
    add_quiet(parser)
    assert parser.parse_args(["-q"]).quiet and not parser.parse_args([]).quiet


@pytest.mark.parametrize("command", ["flow", "synth", "sim", "bench-block", "bench-gemm", "bench-router",
                                     "bench-bridge", "fault-campaign", "sweep"])
def test_every_long_command_takes_quiet(command):
    from nanokpu import cli
    assert cli.build_parser().parse_args([command, "--quiet"]).quiet
