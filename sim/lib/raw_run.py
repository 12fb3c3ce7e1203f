"""The cocotb bench's block run replayed on the same Verilog by a C++ harness, no Python per cycle.

``sim/raw/harness.cpp`` drives the Verilator model of the nano-KPU from its own ``main()``: it
is the AXI host memory (cocotbext-axi's ``AxiRam`` timing, cycle for cycle, without pauses) and
replays the host's AXI4-Lite traffic that :class:`sim.lib.kpu_tb.TB` recorded (its
``transcript``). Inside the simulator, :func:`write_replay` writes that recording to a
directory; outside it, :func:`replay` builds the harness, runs it there and checks that it ran
the same thing: every register the host read after the run (``CYCLES`` first) and the whole
host memory image must equal the cocotb run's, else :class:`ReplayMismatch`. It returns both
runs' simulated clock cycles per second (the run phase only: start to the last poll of
``STATUS``; no build, no loading).

The replay directory holds ``image.bin`` (the host memory at the start), ``script.txt`` (the
harness's commands, described in ``harness.cpp``), ``cocotb.json`` (the register reads and the
run's clocks and wall seconds under cocotb), ``cocotb_final.bin`` (the host memory after the
cocotb run) and, once replayed, ``raw_final.bin``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from nanokpu.isa import STATUS_LAYOUT, Reg, ctrl_word
from sim.runner import SIM_BUILD, VERILATOR_WARNINGS, build_lock, verilator_env

__all__ = ["HARNESS", "ReplayMismatch", "raw_build", "replay", "write_replay"]

#: The harness's source.
HARNESS = Path(__file__).resolve().parent.parent / "raw" / "harness.cpp"

#: ``STATUS`` bits that are set while the program runs.
_BUSY_MASK = STATUS_LAYOUT.const({"busy": 1}).as_bits()


class ReplayMismatch(AssertionError):
    """The harness's run differs from the cocotb run it replays (a register read or host memory)."""


def write_replay(directory: Path, transcript: list[tuple], final: bytes, run: dict) -> None:
    """Inside the simulator: write a replay of one block run to ``directory`` (created).

    Parameters
    ----------
    directory : Path
        Where the files go (see the module's docstring).
    transcript : list of tuple
        :attr:`sim.lib.kpu_tb.TB.transcript`: ``("reset", high, low)``, ``("image", bytes)``,
        ``("write", addr, value)``, ``("run", poll, limit)`` and ``("read", addr, value)`` in
        the order the host did them; exactly one ``image`` and one ``run``.
    final : bytes
        The host memory from address 0 after the run (as long as the image).
    run : dict
        ``clocks`` and ``seconds`` of the cocotb run phase (:attr:`sim.lib.kpu_tb.TB.last_run`).
    """
    kinds = [entry[0] for entry in transcript]
    if kinds.count("image") != 1 or kinds.count("run") != 1:
        raise ValueError(f"a replay needs one image and one run, the transcript has {kinds}")
    directory.mkdir(parents=True, exist_ok=True)
    lines, reads = [], []
    for kind, *args in transcript:
        if kind == "image":
            (directory / "image.bin").write_bytes(args[0])
            lines.append("image image.bin")
        elif kind == "run":
            poll, limit = args
            lines.append(f"run {Reg.CTRL:#x} {ctrl_word(start=1):#x} {Reg.STATUS:#x} {_BUSY_MASK:#x} {poll} {limit}")
        elif kind == "read":
            addr, value = args
            reads.append([addr, value])
            lines.append(f"read {addr:#x}")
        elif kind in ("reset", "write"):
            lines.append(" ".join([kind, *(f"{a:#x}" for a in args)]))
        else:
            raise ValueError(f"unknown transcript entry {kind!r}")
    lines.append(f"dump raw_final.bin {len(final)}")
    (directory / "script.txt").write_text("\n".join(lines) + "\n")
    (directory / "cocotb_final.bin").write_bytes(final)
    (directory / "cocotb.json").write_text(json.dumps({"reads": reads, "run": run}))


def raw_build(cocotb_build: Path, build_args: tuple[str, ...] = ()) -> Path:
    """Build the harness on the Verilog of the cocotb build directory ``cocotb_build`` (the one
    :func:`sim.lib.kpu_launch.kpu_build` returned; its single ``<top>.v``), with the Verilator
    arguments that build used (``build_args``, e.g. :data:`sim.runner.FAST_BUILD`); returns the
    executable. Cached in ``sim_build/<top>-raw-<hash>`` (hash of the Verilog, the harness and
    the arguments), built under :func:`sim.runner.build_lock`."""
    sources = list(Path(cocotb_build).glob("*.v"))
    if len(sources) != 1:
        raise ValueError(f"{cocotb_build}: expected one Verilog file of a cocotb build, found {sources}")
    source = sources[0]
    top = source.stem
    args = [*VERILATOR_WARNINGS, *build_args]
    digest = hashlib.sha256((source.read_text() + HARNESS.read_text() + " ".join(args)).encode()).hexdigest()[:12]
    build_dir = SIM_BUILD / f"{top}-raw-{digest}"
    exe = build_dir / "harness"
    if exe.exists():
        return exe
    verilator_env()
    with build_lock():
        if exe.exists():
            return exe
        build_dir.mkdir(parents=True, exist_ok=True)
        verilog = build_dir / source.name
        shutil.copyfile(source, verilog)
        cmd = ["verilator", "--cc", "--exe", "--build", "--build-jobs", str(min(2, os.cpu_count() or 1)),
               "-Mdir", str(build_dir), "--top-module", top, "--prefix", "Vtop", "-o", "harness",
               *args, str(HARNESS), str(verilog)]
        log = build_dir / "build.log"
        with open(log, "w") as out:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
        if done.returncode or not exe.exists():
            raise RuntimeError(f"building the raw harness failed (exit {done.returncode}); see {log}")
    return exe


def replay(directory: Path, cocotb_build: Path, build_args: tuple[str, ...] = ()) -> dict:
    """Replay the run recorded in ``directory`` (:func:`write_replay`) on the harness built from
    ``cocotb_build`` (:func:`raw_build`), and check it against the cocotb run.

    Returns ``cycles`` (the KPU's ``CYCLES`` register, the same in both runs), ``cocotb`` and
    ``raw`` (each ``clocks``, ``seconds`` and ``cycles_per_s``: simulated clock cycles per wall
    second of the run phase), ``beats`` (AXI4 data beats read and written in the harness's run
    phase, the same bursts as cocotb's) and ``ratio`` (cocotb's cycles per second over the
    harness's).

    Raises :class:`ReplayMismatch` if a register read or a byte of the final host memory differs,
    RuntimeError if the harness fails.
    """
    directory = Path(directory)
    exe = raw_build(cocotb_build, build_args)
    done = subprocess.run([str(exe), "script.txt"], cwd=directory, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the raw harness failed in {directory}: {done.stderr.strip()}")
    reads, run = [], None
    for line in done.stdout.splitlines():
        kind, *fields = line.split()
        if kind == "read":
            reads.append([int(fields[0], 0), int(fields[1], 0)])
        elif kind == "run":
            run = {"clocks": int(fields[0]), "seconds": float(fields[1]), "beats": int(fields[3])}
    cocotb = json.loads((directory / "cocotb.json").read_text())
    if run is None:
        raise RuntimeError(f"the raw harness printed no run in {directory}: {done.stdout!r}")
    if [addr for addr, _ in reads] != [addr for addr, _ in cocotb["reads"]]:
        raise ReplayMismatch(f"{directory}: the harness read {len(reads)} registers, the cocotb run "
                             f"{len(cocotb['reads'])}")
    for (addr, want), (_, got) in zip(cocotb["reads"], reads, strict=True):
        if got != want:
            name = Reg(addr).name if addr in set(Reg) else f"{addr:#x}"
            raise ReplayMismatch(f"{directory}: the harness read {name} = {got} where the cocotb run read {want}")
    want, got = (directory / "cocotb_final.bin").read_bytes(), (directory / "raw_final.bin").read_bytes()
    if got != want:
        first = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        raise ReplayMismatch(f"{directory}: host memory differs from the cocotb run's from byte {first:#x} "
                             f"({sum(a != b for a, b in zip(got, want, strict=True))} bytes)")
    cycles = dict(cocotb["reads"]).get(int(Reg.CYCLES))
    if cycles is None:
        raise ValueError(f"{directory}: the cocotb run read no CYCLES to compare")
    out = {"cycles": cycles, "beats": run.pop("beats")}
    for key, r in (("cocotb", cocotb["run"]), ("raw", run)):
        out[key] = {**r, "cycles_per_s": r["clocks"] / r["seconds"]}
    out["ratio"] = out["cocotb"]["cycles_per_s"] / out["raw"]["cycles_per_s"]
    return out
