"""The byte protocol of :class:`nanokpu.board.uart_bridge.UartBridge`: a PC reaches a unit's ports
over a serial line (8N1).

Every input port bit of the wrapped unit comes from a writable byte register, every output
port bit is readable. The flattened input ports (in signature order, least significant bit
first) form the byte-addressed space ``IN``; the output ports form ``OUT``.

:func:`port_map` gives each port's bit offset and width; :class:`nanokpu.host.bridge_client.BridgeClient`
is the PC side.

Protocol (host -> bridge; unknown command bytes are ignored):

==========  ==================  =========================================================
bytes       reply               effect
==========  ==================  =========================================================
``W a d``   none                ``IN[a] = d``
``R a``     ``OUT[a]``          read one output byte (0 beyond the end)
``U a m``   none                take no further command until ``OUT[a] & m`` is nonzero,
                                or ``wait_limit`` cycles have passed (then the status
                                byte's bit 0 is set)
``S``       status              bit 0: a ``U`` ran out, bit 1: bytes were lost (the
                                receive queue was full), both since the last ``S``, which
                                clears them
``B f l     none                a burst of ``n + 1`` stream beats of ``l - f + 1`` bytes
v r m n``                       each: a beat's bytes go to ``IN[f..l]``, the bits ``v``
+ beats                         of ``IN[l]`` (``valid``) set with the last; they stay
                                set until ``OUT[r] & m`` (``ready``) is nonzero, the
                                cycle the beat moves, or until ``wait_limit`` cycles
                                have passed (status bit 0); ``f <= l``
==========  ==================  =========================================================

A break on the line (``rx`` low for :data:`BREAK_DETECT_BITS` bit times or more) resets the
bridge and the unit: every ``IN`` byte 0, the queue empty, a reply being sent cut off, the
status clear. The bridge takes bytes again once ``rx`` has been high for 10 bit times after
it. :class:`~nanokpu.host.bridge_client.BridgeClient` starts with one, so a client that died in
the middle of a transfer leaves nothing behind for the next.

``W``, ``R``, ``U``, ``S`` and ``B`` are the ASCII bytes 0x57, 0x52, 0x55, 0x53 and 0x42;
``a`` and the parameters of ``B`` are one byte each. Received bytes wait in a queue of
``queue_depth`` bytes (by default :data:`RX_QUEUE_DEPTH`, one block RAM) while a ``U`` or a
burst's wait waits or a reply is being sent, so a PC can send a whole stream transfer without
waiting for an answer, as long as it never has more than ``queue_depth`` bytes unanswered.

A ``B`` moves a stream transfer as its payload bytes alone when the ``valid`` bit sits in the
last byte of the range (an Amaranth stream has it right after its payload), and follows the
stream rules: ``valid`` held until ``ready``, lowered the cycle after the beat moved. A
one-byte ``B`` (``f = l``, one beat) raises any 1-bit input for one handshake: ``valid`` of a
stream whose payload was written with ``W``, or ``ready`` of an output stream (``v`` its bit,
``r m`` its ``valid``), so there is no separate pulse command: every handshake is one.
"""

from __future__ import annotations

from amaranth import Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["CMD_WRITE", "CMD_READ", "CMD_UNTIL", "CMD_STATUS", "CMD_BURST", "BURST_PARAMS",
           "STATUS_WAIT_RAN_OUT", "STATUS_BYTES_LOST", "RX_QUEUE_DEPTH", "WAIT_LIMIT", "BAUD_TOLERANCE",
           "BREAK_DETECT_BITS", "BREAK_RELEASE_BITS", "port_map", "uart_divisor"]

CMD_WRITE, CMD_READ, CMD_UNTIL, CMD_STATUS, CMD_BURST = (ord(c) for c in "WRUSB")

#: Parameter bytes of a ``B`` command.
BURST_PARAMS = 6

#: Bits of the ``S`` reply.
STATUS_WAIT_RAN_OUT, STATUS_BYTES_LOST = 1, 2

#: Bytes the bridge holds while it is busy (a ``U`` waiting, a reply on the line).
RX_QUEUE_DEPTH = 512

#: Clock cycles a ``U`` waits at most (1.4 s at 12 MHz).
WAIT_LIMIT = 1 << 24

#: Bit times ``rx`` must stay low to count as a break: twice the longest low run of a byte
#: (a 0x00 is 9 low bits, its stop bit high).
BREAK_DETECT_BITS = 20

#: Bit times ``rx`` must stay high after a break before the receiver takes bytes again.
BREAK_RELEASE_BITS = 10

#: Largest relative difference between the bit rate asked for and ``clk_freq / divisor``: the
#: sampling point drifts by 10 times this over a frame (start, 8 data, stop bits), and the two
#: ends of the line together must stay well inside half a bit.
BAUD_TOLERANCE = 0.02


def port_map(unit: wiring.Component) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """Where :class:`UartBridge` puts the ports of ``unit``: ``(inputs, outputs)``, each a dict
    from the port's dotted path (``"cmd.payload"``, ``"a_in.valid"``) to ``(bit offset, width)``
    in the ``IN`` or ``OUT`` byte space (signature order, least significant bit first)."""
    spaces = {In: {}, Out: {}}
    pos = {In: 0, Out: 0}
    for path, member, value in unit.signature.flatten(unit):
        width = len(Value.cast(value))
        spaces[member.flow][".".join(map(str, path))] = (pos[member.flow], width)
        pos[member.flow] += width
    return spaces[In], spaces[Out]


def uart_divisor(clk_freq: int, baud: int) -> int:
    """Clock cycles per bit, ``round(clk_freq / baud)``, for a bit rate ``baud``; raises
    ``ValueError`` naming ``baud`` when it is not positive, when the divisor is below 4 (the
    receiver samples mid-bit) or when ``clk_freq / divisor`` misses ``baud`` by more than
    :data:`BAUD_TOLERANCE`."""
    if not isinstance(baud, int) or baud <= 0:
        raise ValueError(f"baud = {baud!r}: must be a positive integer")
    clk_freq = int(clk_freq)
    divisor = max(round(clk_freq / baud), 1)
    if divisor < 4:
        raise ValueError(f"baud = {baud!r}: must be at most clk_freq / 4 = {clk_freq // 4}")
    actual = clk_freq / divisor
    if abs(actual - baud) > BAUD_TOLERANCE * baud:
        near = " or ".join(str(round(clk_freq / d)) for d in (clk_freq // baud, clk_freq // baud + 1) if d >= 4)
        raise ValueError(f"baud = {baud!r}: a {clk_freq / 1e6:g} MHz clock gives {actual:.0f} baud "
                         f"({clk_freq} / {divisor}), more than {BAUD_TOLERANCE:.0%} off; the nearest "
                         f"exact rates are {near}")
    return divisor
