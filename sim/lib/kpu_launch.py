"""Start the nano-KPU benches (``sim/bench_top.py``, ``sim/bench_fault.py``) on the top level.

:func:`run_kpu_bench` is the one place that names the build of a :class:`~nanokpu.kpu.top.NanoKPU`
config and hands the bench its config and seed (the nano-KPU simulates with ``dsp = "generic"``:
the ECP5 multipliers have no simulation model, and iCE40 builds only its units); the
tests (``tests/kpu/test_top.py``) and the commands (``nanokpu sim``, ``nanokpu fault-campaign``)
all go through it. Runs outside the simulator.
"""

from __future__ import annotations

from pathlib import Path

from nanokpu.config import KpuConfig
from sim.runner import FAST_BUILD, build, run_bench

__all__ = ["kpu_build", "kpu_build_name", "run_kpu_bench"]


def kpu_build_name(cfg: KpuConfig, tag: str = "") -> str:
    """The build name of the nano-KPU of ``cfg``: ``kpu_<profile><tag>``."""
    return f"kpu_{cfg.name}{tag}"


def _design(cfg: KpuConfig, dut, fast: bool, tag: str):
    """``(component, build name, build arguments)`` of the nano-KPU of ``cfg``."""
    from nanokpu.kpu.top import NanoKPU

    if dut is None:
        dut = NanoKPU(cfg)
    args = FAST_BUILD if fast else ()
    return dut, kpu_build_name(cfg, tag), args


def kpu_build(cfg: KpuConfig, *, waves: bool = False, fast: bool = False, tag: str = "", dut=None) -> Path:
    """Build the nano-KPU of ``cfg`` as :func:`run_kpu_bench` does (cached; returns the build
    directory): so that a caller can report the build apart from the run."""
    dut, name, args = _design(cfg, dut, fast, tag)
    return build(dut, name, waves=waves, build_args=args)


def run_kpu_bench(cfg: KpuConfig, test_module: str = "bench_top", *, testcase: str | list[str] | None = None,
                  seed: int = 1, params: dict | None = None, waves: bool = False, fast: bool = False,
                  tag: str = "", dut=None) -> Path:
    """Run the cocotb module ``test_module`` on the nano-KPU of ``cfg``; returns the results XML.

    Parameters
    ----------
    cfg : KpuConfig
        The design's config; the bench gets it through :func:`sim.runner.bench_config`.
    test_module : str
        ``bench_top`` or ``bench_fault``.
    testcase : str or list of str, optional
        The bench's tests to run (default: all).
    seed : int
        cocotb's seed and the bench's (``seed`` in its parameters).
    params : dict, optional
        The bench's other parameters (:func:`sim.runner.bench_params`); not ``seed``.
    waves : bool
        Trace a waveform (FST, or VCD without ``lz4.h``).
    fast : bool
        Compile the model without C++ optimisation (:data:`sim.runner.FAST_BUILD`): builds
        faster, runs slower; right for short benches bound by the Python bus models.
    tag : str
        Appended to the build name (``kpu_<profile><tag>``), for a design changed
        beyond its config (a test's monkeypatch).
    dut : NanoKPU, optional
        The component, if the caller has one of ``cfg`` already (converted to Verilog once
        over several runs); built from ``cfg`` otherwise.

    Raises :class:`sim.runner.BenchFailure` if a test of the bench fails.
    """
    params = dict(params or {})
    if "seed" in params:
        raise ValueError("params must not hold 'seed': pass seed= (it seeds cocotb and the bench)")
    dut, name, args = _design(cfg, dut, fast, tag)
    return run_bench(dut, name, test_module, config=cfg, testcase=testcase, seed=seed,
                     params={"seed": seed, **params}, waves=waves, build_args=args)
