"""The address space and byte protocol of :class:`nanokpu.board.uart_axil.UartAxiBridge`: 32-bit
word reads and writes of the whole nano-KPU board design from a PC over 8N1 (the table is in
:mod:`nanokpu.board.uart_axil`); :class:`nanokpu.host.client.KpuClient` is the PC side."""

__all__ = ["KPU_BASE", "MEM_BASE", "CMD_WRITE", "CMD_READ", "RESP_OKAY", "RESP_SLVERR", "MAX_WORDS",
           "DEFAULT_HOST_BYTES"]

KPU_BASE = 0x0000_0000
MEM_BASE = 0x1000_0000
CMD_WRITE, CMD_READ = ord("W"), ord("R")
RESP_OKAY, RESP_SLVERR = 0, 2
#: Words a command moves at most.
MAX_WORDS = 256
#: Host memory of the board design: the largest ``tiny`` block image (20 tokens, the most its
#: scratchpad holds: 14,688 bytes of inputs, weights and outputs) rounded up to a power of two.
DEFAULT_HOST_BYTES = 16384
