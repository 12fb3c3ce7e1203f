"""Every command refuses bad input with one line naming the flag and exit status 2, before any
work: the simulator and synthesis entry points are replaced by traps that fail the test if a
command reaches them."""

import pytest

import fpga.flow
import sim.runner
from nanokpu import cli
from nanokpu.commands import ROOT

FILE = "README.md"            # an existing file, where a directory is wanted
DIR = "docs"                  # an existing directory, where a file is wanted

#: (argv, text the one line must contain)
BAD = [
    (["flow", "--target", "bogus"], "argument --target: invalid choice: 'bogus'"),
    (["flow", "--seed", "-1"], "argument --seed: -1: must be an integer in [0, 4294967295]"),
    (["flow", "--profile", "k3"], "argument --profile: invalid choice: 'k3'"),
    (["demo", "--tokens", "100000000"], "argument --tokens: 100000000: must be an integer in [1, 4096]"),
    (["demo", "--tokens", "x"], "argument --tokens: 'x': must be an integer"),
    (["generate", "--out", FILE], "argument --out: 'README.md': is a file, not a directory"),
    (["generate", "--unit", "nosuch"], "argument --unit: invalid choice: 'nosuch'"),
    (["bench-router", "--route-lanes", "0"], "argument --route-lanes: 0: must be an integer >= 1"),
    (["bench-router", "--out", DIR], "argument --out: 'docs': is a directory, not a file"),
    (["qb-demo", "--tokens", "0"], "argument --tokens: 0: must be an integer >= 1"),
    (["qb-demo", "--profile", "tiny", "--tokens", "3"], "tokens = 3: tokens * top_k must be a multiple"),
    (["qb-demo", "--out", f"{FILE}/x"], "'README.md' is a file, not a directory"),
    (["bench-gemm", "--out", f"{FILE}/gemm.md"], "argument --out: 'README.md/gemm.md': 'README.md' is a file"),
    (["sim", "--tokens", "40"], "tokens = 40: the block needs 15,768 scratchpad words, dmem_depth = 8,192 "
                                "(at most 20 tokens for profile 'tiny')"),
    (["sim", "--profile", "k3"], "tokens = 8: the block needs"),
    (["sim", "--seed", "-1"], "argument --seed: -1: must be an integer in [0, 4294967295]"),
    (["sim", "--pause", "1"], "argument --pause: 1: must be in [0, 1)"),
    (["sim", "--dsp", "ice40"], "unrecognized arguments: --dsp ice40"),
    (["sim", "--layer", "3", "--steps", "300"], "tokens = 4, steps = 300: layer 3: x_q: 1 tokens after 303 cached: "
                                                "the W_kn0 GEMM (304 x 8 x 8) needs 608 words in the GEMM engine"),
    (["sim", "--layer", "1", "8"], "layer = 8: profile 'tiny' has layers 0 .. 7"),
    (["sim", "--layer", "-1"], "argument --layer: -1: must be an integer >= 0"),
    (["sim", "--layer", "1", "--steps", "-1"], "argument --steps: -1: must be an integer >= 0"),
    (["sim", "--layer", "1", "--tokens", "17"], "tokens = 17, steps = 4: layer 1: P: 17 tokens x 2 candidates x "
                                               "d_model 32: the score GEMM exceeds the GEMM engine"),
    (["bench-block", "--out", DIR], "argument --out: 'docs': is a directory, not a file"),
    (["bench-bridge", "--tokens", "2", "21"], "tokens = 21: the block needs"),
    (["board-run", "--port", "x", "--tokens", "40"], "tokens = 40: the block needs"),
    (["board-run", "--port", "x", "--gemm", "0", "1", "1"], "argument --gemm: 0: must be an integer >= 1"),
    (["board-run", "--port", "x", "--gemm", "4", "4", "4"], "gemm: one GEMM runs on a GEMM engine build"),
    (["board-run", "--port", "x", "--board", "nosuch"], "argument --board: invalid choice: 'nosuch'"),
    (["synth", "--target", "bogus"], "argument --target: invalid choice: 'bogus'"),
    (["synth", "--unit", "nosuch:f"], "argument --unit: unit = 'nosuch:f': No module named 'nosuch'"),
    (["synth", "--unit", "nanokpu.designs:nosuch"], "argument --unit: unit = 'nanokpu.designs:nosuch'"),
    (["synth", "--out", FILE], "argument --out: 'README.md': is a file, not a directory"),
    (["synth", "--against", "nosuch.json"], "argument --against: 'nosuch.json': no such file"),
    (["synth", "--freq", "0"], "argument --freq: 0: must be > 0"),
    (["synth", "--seed-tries", "0"], "argument --seed-tries: 0: must be an integer >= 1"),
    (["synth", "--pnr-timeout", "-1"], "pnr_timeout = -1.0"),
    (["synth", "--baud", "9600"], "baud = 9600: only a board build (--board) has a UART"),
    (["synth", "--board", "ulx3s", "--freq", "50"], "freq = 50.0: a board build's goal is its board's clock"),
    (["synth", "--target", "up5k", "--unit", "kpu"], "KpuConfig.dsp = 'ice40': the whole nano-KPU is built"),
    (["report-errors", "--out", f"{FILE}/x.md"], "'README.md' is a file, not a directory"),
    (["report-errors", "--seed", "x"], "argument --seed: 'x': must be an integer"),
    (["report-fidelity", "--seeds", "19"], "argument --seeds: 19: must be an integer in [20, 10000]"),
    (["report-fidelity", "--out", DIR], "argument --out: 'docs': is a directory, not a file"),
    (["fault-campaign", "--runs", "0"], "argument --runs: 0: must be an integer >= 1"),
    (["fault-campaign", "--pause", "1.5"], "argument --pause: 1.5: must be in [0, 1)"),
    (["fault-campaign", "--tokens", "21"], "tokens = 21: the block needs"),
    (["fault-campaign", "--out", DIR], "argument --out: 'docs': is a directory, not a file"),
    (["sweep", "--set", "nosuch=1"], "argument --set: 'nosuch=1': 'nosuch' is not a KpuConfig field"),
    (["sweep", "--target", "bogus"], "argument --target: invalid choice: 'bogus'"),
    (["report-activation", "--out", FILE], "argument --out: 'README.md': is a file, not a directory"),
    (["mutate", "--only", "nosuch"], "argument --only: invalid choice: 'nosuch'"),
]


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    """A command that builds a simulator model or runs Yosys fails the test."""
    def trap(*args, **kwargs):
        raise AssertionError("the command started work before it checked its arguments")
    for module, name in ((sim.runner, "build"), (sim.runner, "run_bench"), (fpga.flow, "synthesize"),
                         (fpga.flow, "run_tool")):
        monkeypatch.setattr(module, name, trap)


def test_every_command_is_in_the_table():
    assert {argv[0] for argv, _ in BAD} == set(cli.COMMANDS)


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(argv) for argv, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)   # README.md and docs/ as named in the table
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("nanokpu") and ": error: " in err, err
    assert message in err, err
