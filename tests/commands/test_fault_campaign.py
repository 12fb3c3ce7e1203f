"""The fault campaign (sim/bench_fault.py, nanokpu/commands/fault_campaign.py) on the tiny nano-KPU.

One short campaign runs (every episode kind, about 20 s); the documented one is the command
``nanokpu fault-campaign`` (docs/fault_campaign.md). A campaign fails if any episode failed: a hang, a bus hang, a wrong
output, a wrong stop or a write outside the program's window.
"""

from __future__ import annotations

import argparse

import pytest

from nanokpu import cli
from nanokpu.commands import fault_campaign


@pytest.mark.slow(80)
def test_short_campaign(tmp_path):
    result = fault_campaign.campaign("tiny", runs=1, episodes=16, seed=5, tokens=2, pause=0.2, work=tmp_path)
    counts = result["counts"]
    assert not result["failures"], result["failures"]
    assert counts["episodes"] == 16 and counts["valid_programs"] >= 1 and counts["cycles"] > 0
    for kind in ("fuzz_programs", "bus_bursts", "hard_resets", "soft_resets"):   # every kind of episode ran
        assert counts[kind] >= 1, (kind, counts)
    text = fault_campaign.summary_markdown(result, "cmd", "tiny")
    assert "| hangs (program watchdog) | 0 |" in text and "`cmd`" in text
    assert "fuzzed programs that ran to the end (their scratchpad compared too) |" in text


@pytest.mark.parametrize("flag,value", [("--runs", "0"), ("--episodes", "-1"), ("--pause", "1.5")])
def test_bad_arguments_name_the_flag(flag, value, capsys):
    assert cli.main(["fault-campaign", flag, value]) == 2
    assert flag in capsys.readouterr().err


def test_registered_in_the_cli():
    parser = argparse.ArgumentParser()
    fault_campaign.add_arguments(parser)
    assert "fault-campaign" in cli.COMMANDS
