# amaranth: UnusedElaboratable=no
"""PC side of :class:`nanokpu.uart_bridge.UartBridge`: a unit's ports by name over a serial line.

:class:`BridgeClient` reads and writes the ports of the unit behind the bridge by their dotted
paths (``"cmd.payload"``, ``"c_out.valid"``); :func:`run_gemm` streams one GEMM through the GEMM
engine of the iCEBreaker build (``nanokpu synth --board icebreaker``) and returns its result;
:class:`~nanokpu.funcsim.FuncSim` runs a whole compiled block with its GEMMs done that way
(``nanokpu board-run --board icebreaker``).
The unit object only supplies the port map (:func:`~nanokpu.uart_bridge.port_map`): it is never
elaborated here.
"""

from __future__ import annotations

import time

import numpy as np

from nanokpu.config import KpuConfig
from nanokpu.gemm import GemmError, kpu_engine
from nanokpu.gemm_layout import a_words, b_words, c_matrix, command_word
from nanokpu.uart_bridge import CMD_PULSE, CMD_READ, CMD_WRITE, port_map

__all__ = ["BridgeClient", "run_gemm"]


class BridgeClient:
    """The ports of ``unit`` behind a :class:`~nanokpu.uart_bridge.UartBridge` on ``port``.

    Parameters
    ----------
    port
        The serial line: anything with ``write(bytes)`` and ``read(n) -> bytes`` (a pyserial
        ``Serial``, or the bench's model of the line).
    unit : wiring.Component
        The unit the bridge was built around (same class and config): its signature gives
        the byte map.

    The client keeps a copy of the bridge's input bytes and writes whole bytes from it; it
    starts by writing every one of them 0 (they keep what an earlier client left there).
    """

    def __init__(self, port, unit):
        self.port = port
        self.inputs, self.outputs = port_map(unit)
        in_bits = sum(width for _, width in self.inputs.values())
        self.shadow = bytearray(-(-in_bits // 8))
        self.port.write(b"".join(bytes([CMD_WRITE, i, 0]) for i in range(len(self.shadow))))

    def _field(self, space: dict, name: str) -> tuple[int, int]:
        if name not in space:
            raise ValueError(f"name = {name!r}: not a port of the unit; one of {sorted(space)}")
        return space[name]

    def set(self, name: str, value: int) -> None:
        """Drive input port ``name`` with ``value`` (its bits as an unsigned integer) until set
        again."""
        offset, width = self._field(self.inputs, name)
        value = int(value) & ((1 << width) - 1)
        first, last = offset // 8, (offset + width - 1) // 8
        word = int.from_bytes(self.shadow[first:last + 1], "little")
        shift = offset - 8 * first
        word = (word & ~(((1 << width) - 1) << shift)) | (value << shift)
        new = word.to_bytes(last + 1 - first, "little")
        out = bytearray()
        for i, byte in enumerate(new, first):
            if self.shadow[i] != byte:
                self.shadow[i] = byte
                out += bytes([CMD_WRITE, i, byte])
        if out:
            self.port.write(bytes(out))

    def pulse(self, name: str) -> None:
        """Raise the 1-bit input port ``name`` for exactly one clock cycle (a stream ``valid``
        or ``ready``: one beat moves if the other side is ready in that cycle)."""
        offset, width = self._field(self.inputs, name)
        if width != 1:
            raise ValueError(f"name = {name!r}: {width} bits wide; only a 1-bit port can be pulsed")
        i = offset // 8
        self.port.write(bytes([CMD_PULSE, i, self.shadow[i] | 1 << (offset % 8)]))

    def get(self, *names: str) -> list[int]:
        """The current values of output ports ``names`` (unsigned), read in one exchange; a
        port wider than a byte is read byte by byte, so read only what holds still."""
        fields = [self._field(self.outputs, n) for n in names]
        spans = [(offset // 8, (offset + width - 1) // 8) for offset, width in fields]
        addrs = sorted({a for first, last in spans for a in range(first, last + 1)})
        self.port.write(b"".join(bytes([CMD_READ, a]) for a in addrs))
        data = self.port.read(len(addrs))
        if len(data) != len(addrs):
            raise TimeoutError(f"the board answered {len(data)} of {len(addrs)} bytes")
        got = dict(zip(addrs, data, strict=True))
        values = []
        for (offset, width), (first, last) in zip(fields, spans, strict=True):
            word = int.from_bytes(bytes(got[a] for a in range(first, last + 1)), "little")
            values.append((word >> (offset - 8 * first)) & ((1 << width) - 1))
        return values

    def wait(self, name: str, timeout: float = 2.0) -> None:
        """Poll output port ``name`` until it is 1; ``TimeoutError`` after ``timeout`` seconds."""
        t0 = time.monotonic()
        while not self.get(name)[0]:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{name} still low after {timeout} s")

    def send(self, stream: str, words, timeout: float = 2.0) -> None:
        """Every word of ``words`` into the unit's input stream ``stream``, one beat each (the
        ``ready`` read before each ``valid`` pulse: it stays high until a beat moves)."""
        for word in words:
            self.set(f"{stream}.payload", word)
            self.wait(f"{stream}.ready", timeout)
            self.pulse(f"{stream}.valid")

    def receive(self, stream: str, n: int, timeout: float = 2.0) -> list[int]:
        """``n`` words out of the unit's output stream ``stream`` (a payload holds still while
        ``valid`` waits for ``ready``)."""
        words = []
        for _ in range(n):
            self.wait(f"{stream}.valid", timeout)
            words.append(self.get(f"{stream}.payload")[0])
            self.pulse(f"{stream}.ready")
        return words


def run_gemm(client: BridgeClient, cfg: KpuConfig, a, b, *, mult: int = 1, shift: int = 0,
             timeout: float = 2.0) -> np.ndarray:
    """``requantize(a @ b, mult, shift)`` on the :class:`~nanokpu.gemm.GemmEngine` of ``cfg``
    behind ``client``'s bridge (:func:`golden.intops.requantize` of :func:`~golden.intops.matmul_int`,
    saturated to the engine's ``out_width``): one command (load A, compute, store, scratchpad
    addresses 0), A and B streamed in, the ``[M, N]`` result read back. ``a`` is ``[M, K]``, ``b``
    ``[K, N]``, ``in_width``-bit integers. Raises ``RuntimeError`` naming the engine's
    :class:`~nanokpu.gemm.GemmError` when it refuses the command (a shape beyond its
    scratchpads), ``TimeoutError`` when a stream stalls for ``timeout`` seconds.
    """
    a, b = np.asarray(a), np.asarray(b)
    (m, k), (k2, n) = a.shape, b.shape
    if k2 != k:
        raise ValueError(f"b: {k2} rows, must equal the {k} columns of a")
    client.wait("cmd.ready", timeout)
    client.set("cmd.payload", command_word(cfg, m=m, k=k, n=n, mult=mult, shift=shift,
                                           load_a=1, compute=1, store=1))
    client.pulse("cmd.valid")
    t0 = time.monotonic()
    while True:  # the engine takes A words once it has checked the command, or refuses it
        ready, error, code = client.get("a_in.ready", "error", "error_code")
        if error:
            raise RuntimeError(f"the GEMM engine refused M={m} K={k} N={n}: {GemmError(code).name}")
        if ready:
            break
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"the GEMM engine took no A word within {timeout} s")
    client.send("a_in", a_words(cfg, a), timeout)
    client.send("b_in", b_words(cfg, b), timeout)
    words = client.receive("c_out", -(-m // cfg.rows) * n, timeout)
    out_width = client.outputs["c_out.payload"][1] // cfg.rows
    return c_matrix(cfg, words, m, n, out_width)


def gemm_client(port, cfg: KpuConfig) -> BridgeClient:
    """A :class:`BridgeClient` for the iCEBreaker build's unit: the GEMM engine of ``cfg`` as the
    nano-KPU has it (:func:`~nanokpu.gemm.kpu_engine`, ``acc_width``-bit results)."""
    return BridgeClient(port, kpu_engine(cfg))
