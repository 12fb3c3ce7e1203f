"""The PC side of the whole nano-KPU board design (:class:`nanokpu.board.uart_axil.UartKpu`).

:class:`KpuClient` speaks the serial protocol of :mod:`nanokpu.host_protocol` over any transport
with ``write(bytes)`` and ``read(n) -> bytes`` (a pyserial ``Serial``, which
:meth:`KpuClient.open` makes; or a simulated line in the tests). :meth:`KpuClient.run_block`
runs a compiled block (:class:`nanokpu.host.compiler.Program`) the way the RTL bench does: host
image into the host memory, program into the instruction memory, the host window, start, poll
``STATUS``, the outputs read back and decoded by :meth:`Program.outputs`.
"""

from __future__ import annotations

import numbers
import time

from nanokpu.host_protocol import CMD_READ, CMD_WRITE, DEFAULT_HOST_BYTES, KPU_BASE, MAX_WORDS, MEM_BASE
from nanokpu.isa import IMEM_BASE, LOADS_BASE, Err, Reg, ctrl_word, encode_program, status_fields

__all__ = ["BusError", "KpuClient", "serial_port"]

_RESP = {0: "OKAY", 1: "EXOKAY", 2: "SLVERR", 3: "DECERR"}


def serial_port(port: str, baud: int = 115200, timeout: float = 2.0):
    """A pyserial ``Serial`` on ``port`` (8N1); ``RuntimeError`` when pyserial is missing."""
    try:
        import serial
    except ImportError as exc:
        raise RuntimeError("the board clients need pyserial: pip install pyserial") from exc
    return serial.Serial(port, baud, timeout=timeout)


class BusError(RuntimeError):
    """The bridge answered a command with a non-OKAY status byte."""


class KpuClient:
    """Word access to the board design and whole-block runs.

    Parameters
    ----------
    transport
        ``write(bytes)`` and ``read(n) -> bytes``; a short read means the board did not answer.
    host_bytes : int
        The board design's host memory size (``UartKpu(host_bytes=...)``).
    """

    def __init__(self, transport, host_bytes: int = DEFAULT_HOST_BYTES):
        self.transport, self.host_bytes = transport, host_bytes

    @classmethod
    def open(cls, port: str, baud: int = 115200, timeout: float = 2.0, **kwargs) -> KpuClient:
        """A client on serial port ``port`` (pyserial, :func:`serial_port`)."""
        return cls(serial_port(port, baud, timeout), **kwargs)

    # -- words ---------------------------------------------------------------------------
    def _read_exact(self, n: int) -> bytes:
        data = self.transport.read(n)
        if len(data) != n:
            raise TimeoutError(f"the board answered {len(data)} of {n} bytes")
        return data

    def _check(self, what: str, addr: int):
        status = self._read_exact(1)[0]
        if status:
            raise BusError(f"{what} at {addr:#010x}: {_RESP.get(status, status)}")

    @staticmethod
    def _span(addr, n: int) -> None:
        """``ValueError`` unless ``n`` words at byte address ``addr`` lie word-aligned in the
        bridge's 32-bit address space."""
        if not isinstance(addr, numbers.Integral) or isinstance(addr, bool) or addr % 4:
            raise ValueError(f"addr = {addr!r}: must be an integer multiple of 4")
        if not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"words = {n!r}: must be a non-negative integer")
        if addr < 0 or addr + 4 * n > 1 << 32:
            raise ValueError(f"addr = {addr:#x}: {n} words must lie in [0, 2**32)")

    def write_words(self, addr: int, words) -> None:
        """Write 32-bit ``words`` at byte address ``addr``, ``addr + 4``, ... of the bridge; a
        word is an integer in ``[-2**31, 2**32)`` (a negative one as its two's complement),
        ``addr`` a multiple of 4: anything else raises ``ValueError`` before a byte is sent."""
        words = list(words)
        for w in words:
            if not isinstance(w, numbers.Integral) or isinstance(w, bool) or not -(1 << 31) <= w < 1 << 32:
                raise ValueError(f"word = {w!r}: must be an integer in [-2**31, 2**32)")
        self._span(addr, len(words))
        words = [int(w) & 0xFFFF_FFFF for w in words]
        addr = int(addr)
        for i in range(0, len(words), MAX_WORDS):
            chunk, a = words[i:i + MAX_WORDS], addr + 4 * i
            self.transport.write(bytes([CMD_WRITE]) + a.to_bytes(4, "little") + bytes([len(chunk) - 1])
                                 + b"".join(w.to_bytes(4, "little") for w in chunk))
            self._check("write", a)

    def read_words(self, addr: int, n: int) -> list[int]:
        """Read ``n`` 32-bit words at byte address ``addr``, ``addr + 4``, ... of the bridge
        (``addr`` a multiple of 4, else ``ValueError``)."""
        self._span(addr, n)
        addr = int(addr)
        out = []
        for i in range(0, n, MAX_WORDS):
            k, a = min(MAX_WORDS, n - i), addr + 4 * i
            self.transport.write(bytes([CMD_READ]) + a.to_bytes(4, "little") + bytes([k - 1]))
            data = self._read_exact(4 * k)
            self._check("read", a)
            out += [int.from_bytes(data[4 * j:4 * j + 4], "little") for j in range(k)]
        return out

    def write(self, addr: int, value: int) -> None:
        self.write_words(addr, [value])

    def read(self, addr: int) -> int:
        return self.read_words(addr, 1)[0]

    def write_bytes(self, addr: int, data: bytes) -> None:
        """``data`` (zero-padded to whole words) at ``addr``."""
        data = bytes(data) + bytes(-len(data) % 4)
        self.write_words(addr, [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)])

    def read_bytes(self, addr: int, n: int) -> bytes:
        return b"".join(w.to_bytes(4, "little") for w in self.read_words(addr, -(-n // 4)))[:n]

    # -- the nano-KPU ----------------------------------------------------------------------
    def reg(self, reg: int) -> int:
        return self.read(KPU_BASE + reg)

    def run_block(self, prog, *, poll: float = 0.01, timeout: float = 60.0) -> dict:
        """Run the compiled block ``prog`` (image at host address 0) and return its
        ``outputs`` (:meth:`Program.outputs`), ``cycles``, ``instrs`` and the routing ``loads``
        counters. Raises ``ValueError`` when the board's configuration cannot hold ``prog``,
        ``RuntimeError`` when the nano-KPU stops with an error, ``TimeoutError`` after
        ``timeout`` seconds."""
        cfg = prog.cfg
        if len(prog.image) > self.host_bytes:
            raise ValueError(f"host_bytes = {self.host_bytes}: the image needs {len(prog.image)} bytes")
        dmem, imem = self.reg(Reg.INFO), self.reg(Reg.INFO_IMEM)
        if dmem != cfg.dmem_depth or imem < len(prog.instrs):
            raise ValueError(f"cfg: the board's nano-KPU has dmem_depth {dmem} and imem_depth {imem}; the "
                             f"program is for dmem_depth {cfg.dmem_depth} with {len(prog.instrs)} instructions")
        self.write(KPU_BASE + Reg.CTRL, ctrl_word(soft_reset=1, clear_loads=1))
        self.write_bytes(MEM_BASE, prog.image)
        self.write_bytes(KPU_BASE + IMEM_BASE, encode_program(prog.instrs))
        self.write(KPU_BASE + Reg.HOST_BASE, 0)
        self.write(KPU_BASE + Reg.HOST_SIZE, len(prog.image))
        self.write(KPU_BASE + Reg.CTRL, ctrl_word(start=1))
        t0 = time.monotonic()
        while (status := status_fields(self.reg(Reg.STATUS))).busy:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the block still runs after {timeout} s (pc {status.pc})")
            time.sleep(poll)
        if status.error or not status.done:
            raise RuntimeError(f"the nano-KPU stopped with {Err(status.code).name} at pc {status.pc}")
        start = min(prog.symbols["y"], prog.symbols["route"]) & ~3   # the outputs: only they are read back
        host = bytes(start) + self.read_bytes(MEM_BASE + start, len(prog.image) - start)
        return {"outputs": prog.outputs(host), "cycles": self.reg(Reg.CYCLES), "instrs": self.reg(Reg.INSTRS),
                "loads": self.read_words(KPU_BASE + LOADS_BASE, cfg.n_experts)}
