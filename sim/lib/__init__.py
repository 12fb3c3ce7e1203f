"""Code shared by the cocotb benches of sim/.

- :mod:`sim.lib.kpu_tb`: the nano-KPU testbench :class:`~sim.lib.kpu_tb.TB` (clock, reset,
  the AXI4-Lite host and the AXI host memory, loading and running a program by polling
  ``STATUS``), used inside the simulator by ``bench_top`` and ``bench_fault``.
- :mod:`sim.lib.kpu_launch`: :func:`~sim.lib.kpu_launch.run_kpu_bench`, the one way the tests
  and the commands start those benches (build name, vendor models, build arguments, seed).
- :mod:`sim.lib.raw_run`: a block run of ``bench_top`` recorded, and replayed on the same Verilog
  by the C++ harness ``sim/raw/harness.cpp`` (no Python per cycle), checked equal to the cocotb
  run; ``nanokpu bench-block`` compares the two simulation speeds.
"""
