# amaranth: UnusedElaboratable=no
"""PC side of :class:`nanokpu.board.uart_bridge.UartBridge`: a unit's ports by name over a serial line.

:class:`BridgeClient` reads and writes the ports of the unit behind the bridge by their dotted
paths (``"cmd.payload"``, ``"c_out.valid"``); :func:`run_gemm` streams one GEMM through the GEMM
engine of the iCEBreaker build (``nanokpu synth --board icebreaker``) and returns its result;
:func:`run_block` runs a whole compiled block in :class:`~nanokpu.host.funcsim.FuncSim` with its
GEMMs done that way (``nanokpu board-run --board icebreaker``).
The unit object only supplies the port map (:func:`~nanokpu.board.uart_bridge.port_map`): it is never
elaborated here.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from nanokpu.bridge_protocol import (
    BREAK_DETECT_BITS,
    BURST_PARAMS,
    CMD_BURST,
    CMD_READ,
    CMD_STATUS,
    CMD_UNTIL,
    CMD_WRITE,
    RX_QUEUE_DEPTH,
    STATUS_BYTES_LOST,
    STATUS_WAIT_RAN_OUT,
    port_map,
)
from nanokpu.config import KpuConfig
from nanokpu.gemm_layout import GemmError, a_words, b_words, c_matrix, command_word
from nanokpu.host.funcsim import FuncSim
from nanokpu.isa import Err

__all__ = ["BridgeClient", "run_gemm", "run_block", "BREAK_BITS", "BREAK_SETTLE"]

#: Bit times of the client's break: twice the bridge's :data:`~nanokpu.board.uart_bridge.BREAK_DETECT_BITS`.
BREAK_BITS = 2 * BREAK_DETECT_BITS

#: Seconds the client waits after a break before it drops the bytes received: a USB serial
#: adapter passes on what it received up to 16 ms late.
BREAK_SETTLE = 0.05


class BridgeClient:
    """The ports of ``unit`` behind a :class:`~nanokpu.board.uart_bridge.UartBridge` on ``port``.

    Parameters
    ----------
    port
        The serial line: a pyserial ``Serial`` or anything with its ``write(bytes)``,
        ``read(n) -> bytes`` (a short read means the board did not answer), ``baudrate``,
        ``send_break(duration)`` and ``reset_input_buffer()`` (the bench's model of the line).
    unit : wiring.Component
        The unit the bridge was built around (same class and config): its signature gives
        the byte map.
    queue_depth : int
        The bridge's ``queue_depth`` (:data:`~nanokpu.board.uart_bridge.RX_QUEUE_DEPTH` unless it was
        built with another).

    The client keeps a copy of the bridge's input bytes and writes whole bytes from it; it
    starts with :meth:`reset` (a break: the unit and the bridge as after power-up, whatever an
    earlier client left behind) and reads the bridge's status (``TimeoutError`` if nothing
    answers).

    Commands that need no answer (:meth:`set`, :meth:`handshake`, :meth:`until`, the beats of
    :meth:`send` and :meth:`receive`) go out at once and the client goes on without waiting:
    the bridge queues them. The client only waits for the board when it needs a value
    (:meth:`get`, :meth:`receive`), at the end of a transfer (:meth:`sync`), and to keep at
    most ``queue_depth`` bytes unanswered (a status request each
    half queue, read when the queue would be full). ``traffic`` counts ``bytes_out``,
    ``bytes_in`` and ``waits`` (reads that wait for the board: round trips over the line).
    """

    def __init__(self, port, unit, queue_depth: int = RX_QUEUE_DEPTH):
        self.port, self.queue_depth = port, queue_depth
        self.inputs, self.outputs = port_map(unit)
        in_bits = sum(width for _, width in self.inputs.values())
        self.shadow = bytearray(-(-in_bits // 8))
        self.traffic = {"bytes_out": 0, "bytes_in": 0, "waits": 0}
        self.reset()

    def reset(self) -> None:
        """Reset the bridge and the unit with a break on the line (:data:`BREAK_BITS` bit times;
        :mod:`nanokpu.board.uart_bridge`): every input port 0, commands still queued dropped. Then
        drop what the line brought in meanwhile (replies not read, one cut off by the reset)
        and check that the bridge answers (:meth:`sync`)."""
        self.port.send_break(BREAK_BITS / self.port.baudrate)
        time.sleep(BREAK_SETTLE)
        self.port.reset_input_buffer()
        self.shadow[:] = bytes(len(self.shadow))
        self._sent = self._taken = self._asked = 0  # bytes written; taken by the bridge; up to the last reply asked
        self._pending = deque()   # (end of the command in bytes written, reply bytes, is a status reply)
        self._inbox = bytearray()  # replies to R read from the line and not yet taken
        self.sync()

    def _field(self, space: dict, name: str) -> tuple[int, int]:
        if name not in space:
            raise ValueError(f"name = {name!r}: not a port of the unit; one of {sorted(space)}")
        return space[name]

    def _bit(self, space: dict, name: str) -> tuple[int, int]:
        offset, width = self._field(space, name)
        if width != 1:
            raise ValueError(f"name = {name!r}: {width} bits wide; must be a 1-bit port")
        return offset // 8, 1 << (offset % 8)

    def _put(self, data: bytes, replies: int = 0, status: bool = False) -> None:
        self.port.write(data)
        self._sent += len(data)
        self.traffic["bytes_out"] += len(data)
        if replies:
            self._pending.append((self._sent, replies, status))
            self._asked = self._sent

    def _write(self, data: bytes, replies: int = 0, status: bool = False) -> None:
        """Send ``data`` (commands with ``replies`` reply bytes in all; a status request if
        ``status``), first reading replies while the bridge's queue could overflow (one byte is
        kept free for a status request)."""
        while self._sent + len(data) - self._taken > self.queue_depth - 1:
            self._collect()
        self._put(data, replies, status)
        if self._sent - self._asked >= self.queue_depth // 2:
            self._put(bytes([CMD_STATUS]), 1, status=True)

    def _collect(self, entries: int = 1) -> None:
        """Read the replies of the oldest ``entries`` unanswered commands, in one read (of a
        status request's reply if no command is unanswered)."""
        if not self._pending:
            self._put(bytes([CMD_STATUS]), 1, status=True)
        batch = [self._pending.popleft() for _ in range(min(entries, len(self._pending)))]
        n = sum(replies for _, replies, _ in batch)
        data = self.port.read(n)
        self.traffic["waits"] += 1
        self.traffic["bytes_in"] += len(data)
        if len(data) != n:
            raise TimeoutError(f"the board answered {len(data)} of {n} bytes")
        pos = 0
        for end, replies, status in batch:
            self._taken = end
            if not status:
                self._inbox += data[pos:pos + replies]
            elif data[pos] & STATUS_WAIT_RAN_OUT:
                raise TimeoutError("a wait for a port of the unit ran out (the bridge's wait_limit)")
            elif data[pos] & STATUS_BYTES_LOST:
                raise RuntimeError("the bridge lost bytes (its receive queue was full)")
            pos += replies

    def _take(self, n: int) -> bytes:
        """The next ``n`` reply bytes of ``R`` commands, in the order they were sent (one read)."""
        need, entries = n - len(self._inbox), 0
        for _, replies, status in self._pending:
            if need <= 0:
                break
            entries += 1
            need -= 0 if status else replies
        if entries:
            self._collect(entries)
        data = bytes(self._inbox[:n])
        del self._inbox[:n]
        return data

    def _read_commands(self, names) -> tuple[bytes, list]:
        """The ``R`` commands reading output ports ``names`` and how to decode their replies."""
        fields = [self._field(self.outputs, n) for n in names]
        spans = [(offset // 8, (offset + width - 1) // 8) for offset, width in fields]
        addrs = sorted({a for first, last in spans for a in range(first, last + 1)})
        return b"".join(bytes([CMD_READ, a]) for a in addrs), [addrs, fields, spans]

    @staticmethod
    def _decode(data: bytes, addrs, fields, spans) -> list[int]:
        got = dict(zip(addrs, data, strict=True))
        values = []
        for (offset, width), (first, last) in zip(fields, spans, strict=True):
            word = int.from_bytes(bytes(got[a] for a in range(first, last + 1)), "little")
            values.append((word >> (offset - 8 * first)) & ((1 << width) - 1))
        return values

    def _shadow_set(self, offset: int, width: int, value: int) -> list[int]:
        """Put ``value`` into the ``width`` input bits at bit ``offset`` of the copy of the
        input bytes; returns the indices of the bytes that changed."""
        value = int(value) & ((1 << width) - 1)
        first, last = offset // 8, (offset + width - 1) // 8
        word = int.from_bytes(self.shadow[first:last + 1], "little")
        shift = offset - 8 * first
        word = (word & ~(((1 << width) - 1) << shift)) | (value << shift)
        new = word.to_bytes(last + 1 - first, "little")
        changed = [i for i, byte in enumerate(new, first) if self.shadow[i] != byte]
        self.shadow[first:last + 1] = new
        return changed

    def set(self, name: str, value: int) -> None:
        """Drive input port ``name`` with ``value`` (its bits as an unsigned integer) until set
        again."""
        changed = self._shadow_set(*self._field(self.inputs, name), value)
        if changed:
            self._write(b"".join(bytes([CMD_WRITE, i, self.shadow[i]]) for i in changed))

    def handshake(self, name: str, partner: str) -> None:
        """Raise the 1-bit input port ``name`` until the 1-bit output port ``partner`` is 1 and
        lower it the cycle after: one stream beat moves (``name`` the ``valid`` of an input
        stream and ``partner`` its ``ready``, or ``ready`` and ``valid`` of an output stream).
        A one-byte ``B`` burst; does not wait here: a partner that stays 0 past the bridge's
        ``wait_limit`` raises ``TimeoutError`` from the next :meth:`sync`, :meth:`get` or
        :meth:`receive`, as :meth:`until` does."""
        i, bit = self._bit(self.inputs, name)
        r, m = self._bit(self.outputs, partner)
        self._write(bytes([CMD_BURST, i, i, bit, r, m, 0, self.shadow[i]]))

    def until(self, name: str) -> None:
        """Make the bridge take no further command until the 1-bit output port ``name`` is 1.
        Does not wait here: a wait that runs out (the bridge's ``wait_limit``, by default
        :data:`~nanokpu.board.uart_bridge.WAIT_LIMIT` cycles) raises ``TimeoutError`` from the next
        :meth:`sync`, :meth:`get` or :meth:`receive`."""
        i, bit = self._bit(self.outputs, name)
        self._write(bytes([CMD_UNTIL, i, bit]))

    def sync(self) -> None:
        """Wait until the bridge has taken every command sent; ``TimeoutError`` if a wait ran
        out since the last check, ``RuntimeError`` if the bridge lost bytes."""
        self._write(bytes([CMD_STATUS]), 1, status=True)
        self._collect(len(self._pending))

    def get(self, *names: str) -> list[int]:
        """The current values of output ports ``names`` (unsigned), read in one exchange; a
        port wider than a byte is read byte by byte, so read only what holds still."""
        commands, layout = self._read_commands(names)
        self._write(commands, len(layout[0]))
        return self._decode(self._take(len(layout[0])), *layout)

    def wait(self, name: str) -> None:
        """Return when output port ``name`` is 1 (:meth:`until`, then :meth:`sync`)."""
        self.until(name)
        self.sync()

    def send(self, stream: str, words) -> None:
        """Every word of ``words`` into the unit's input stream ``stream``, one beat each, then
        :meth:`sync`. When ``valid`` follows the payload (in the byte of its last bit or the
        next, as in an Amaranth stream) the beats go as ``B`` bursts, their payload bytes
        alone, each burst at most half the bridge's queue; else (or when a beat would not
        fit that) each beat is ``payload`` written and a :meth:`handshake` of ``valid``."""
        offset, width = self._field(self.inputs, f"{stream}.payload")
        valid_byte, valid_bit = self._bit(self.inputs, f"{stream}.valid")
        ready_byte, ready_bit = self._bit(self.outputs, f"{stream}.ready")
        first, last = offset // 8, (offset + width - 1) // 8
        size = valid_byte + 1 - first
        words = list(words)
        if valid_byte not in (last, last + 1) or 1 + BURST_PARAMS + size > self.queue_depth // 2:
            for word in words:
                self.set(f"{stream}.payload", word)
                self.handshake(f"{stream}.valid", f"{stream}.ready")
            self.sync()
            return
        per_burst = min(256, (self.queue_depth // 2 - 1 - BURST_PARAMS) // size)
        for start in range(0, len(words), per_burst):
            chunk = words[start:start + per_burst]
            data = bytearray([CMD_BURST, first, valid_byte, valid_bit, ready_byte, ready_bit, len(chunk) - 1])
            for word in chunk:
                self._shadow_set(offset, width, word)
                data += self.shadow[first:valid_byte + 1]
            self._write(bytes(data))
        self.sync()

    def receive(self, stream: str, n: int) -> list[int]:
        """``n`` words out of the unit's output stream ``stream`` (a wait for ``valid``, the
        payload read, a :meth:`handshake` of ``ready``, for each), then :meth:`sync`."""
        commands, layout = self._read_commands([f"{stream}.payload"])
        for _ in range(n):
            self.until(f"{stream}.valid")
            self._write(commands, len(layout[0]))
            self.handshake(f"{stream}.ready", f"{stream}.valid")
        k = len(layout[0])
        raw = self._take(n * k)
        words = [self._decode(raw[i:i + k], *layout)[0] for i in range(0, n * k, k)]
        self.sync()
        return words


def run_gemm(client: BridgeClient, cfg: KpuConfig, a, b, *, mult: int = 1, shift: int = 0,
             timeout: float = 2.0) -> np.ndarray:
    """``requantize(a @ b, mult, shift)`` on the :class:`~nanokpu.units.gemm.GemmEngine` of ``cfg``
    behind ``client``'s bridge (:func:`golden.intops.requantize` of :func:`~golden.intops.matmul_int`,
    saturated to the engine's ``out_width``): one command (load A, compute, store, scratchpad
    addresses 0), A and B streamed in, the ``[M, N]`` result read back. ``a`` is ``[M, K]``, ``b``
    ``[K, N]``, ``in_width``-bit integers. Raises ``RuntimeError`` naming the engine's
    :class:`~nanokpu.units.gemm.GemmError` when it refuses the command (a shape beyond its
    scratchpads) or did not check it within ``timeout`` seconds, ``TimeoutError`` when the
    board does not answer or a stream stalls (:meth:`BridgeClient.until`).
    """
    a, b = np.asarray(a), np.asarray(b)
    (m, k), (k2, n) = a.shape, b.shape
    if k2 != k:
        raise ValueError(f"b: {k2} rows, must equal the {k} columns of a")
    client.set("cmd.payload", command_word(cfg, m=m, k=k, n=n, mult=mult, shift=shift,
                                           load_a=1, compute=1, store=1))
    client.handshake("cmd.valid", "cmd.ready")
    t0 = time.monotonic()
    while True:  # the engine takes A words once it has checked the command, or refuses it
        ready, error, code = client.get("a_in.ready", "error", "error_code")
        if error:
            raise RuntimeError(f"the GEMM engine refused M={m} K={k} N={n}: {GemmError(code).name}")
        if ready:
            break
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"the GEMM engine took no A word within {timeout} s")
    client.send("a_in", a_words(cfg, a))
    client.send("b_in", b_words(cfg, b))
    words = client.receive("c_out", -(-m // cfg.rows) * n)
    out_width = client.outputs["c_out.payload"][1] // cfg.rows
    return c_matrix(cfg, words, m, n, out_width)


def run_block(client: BridgeClient, cfg: KpuConfig, prog) -> dict:
    """The compiled block ``prog`` in :class:`~nanokpu.host.funcsim.FuncSim`, its GEMMs on the
    iCEBreaker build behind ``client``: ``outputs``, ``instrs``, ``gemms`` and ``macs`` (those run on the board).
    Raises ``RuntimeError`` when the program stops with an error."""
    sim = FuncSim(cfg, prog.image, gemm=lambda a, b, mult, shift: run_gemm(client, cfg, a, b, mult=mult, shift=shift))
    res = sim.run(prog.instrs)
    if res.error != Err.NONE:
        raise RuntimeError(f"the program stopped with {res.error.name} at pc {res.pc}")
    return {"outputs": prog.outputs(sim.host), "instrs": res.retired, "gemms": len(res.gemms), "macs": res.macs,
            "traffic": client.traffic}
