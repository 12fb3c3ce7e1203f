"""``nanokpu board-run``: the PC side of the board designs.

:class:`KpuClient` speaks the serial protocol of :mod:`nanokpu.uart_axil` over any transport
with ``write(bytes)`` and ``read(n) -> bytes`` (a pyserial ``Serial``, which
:meth:`KpuClient.open` makes; or a simulated line in the tests). :meth:`KpuClient.run_block`
runs a compiled block (:class:`nanokpu.compiler.Program`) the way the RTL bench does: host
image into the host memory, program into the instruction memory, the host window, start, poll
``STATUS``, the outputs read back and decoded by :meth:`Program.outputs`.

The command compiles a random ``tiny`` block, runs it on a board and checks the result bit for
bit against :func:`golden.block.latent_moe_int`. On the ULX3S builds (``ulx3s``, ``ulx3s-45f``)
the whole nano-KPU runs it.
On the iCEBreaker build (the GEMM engine behind the register bridge: the whole nano-KPU does not
fit the UP5K) the PC sequences the program in :class:`~nanokpu.funcsim.FuncSim` and every
``GEMM`` runs on the board (:func:`nanokpu.bridge_client.run_gemm`, the engine's requantiser
included), the other instructions on the PC. ``--gemm M K N`` runs one random GEMM on the
iCEBreaker instead, checked against :func:`golden.intops.requantize` of
:func:`golden.intops.matmul_int`::

    nanokpu board-run --port /dev/ttyUSB0 --tokens 8 --seed 1
    nanokpu board-run --board icebreaker --port /dev/ttyUSB1 --tokens 8 --seed 1
    nanokpu board-run --board icebreaker --port /dev/ttyUSB1 --gemm 16 32 16 --seed 1
"""

from __future__ import annotations

import time

from fpga.boards import BOARDS, KPU_UNIT
from nanokpu.isa import IMEM_BASE, LOADS_BASE, Err, Reg, encode_program
from nanokpu.uart_axil import CMD_READ, CMD_WRITE, DEFAULT_HOST_BYTES, KPU_BASE, MAX_WORDS, MEM_BASE

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

    def write_words(self, addr: int, words) -> None:
        """Write 32-bit ``words`` at byte address ``addr``, ``addr + 4``, ... of the bridge."""
        words = [int(w) & 0xFFFF_FFFF for w in words]
        for i in range(0, len(words), MAX_WORDS):
            chunk, a = words[i:i + MAX_WORDS], addr + 4 * i
            self.transport.write(bytes([CMD_WRITE]) + a.to_bytes(4, "little") + bytes([len(chunk) - 1])
                                 + b"".join(w.to_bytes(4, "little") for w in chunk))
            self._check("write", a)

    def read_words(self, addr: int, n: int) -> list[int]:
        """Read ``n`` 32-bit words at byte address ``addr``, ``addr + 4``, ... of the bridge."""
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
        self.write(KPU_BASE + Reg.CTRL, 2 | 4)       # soft reset, clear the routing load counters
        self.write_bytes(MEM_BASE, prog.image)
        self.write_bytes(KPU_BASE + IMEM_BASE, encode_program(prog.instrs))
        self.write(KPU_BASE + Reg.HOST_BASE, 0)
        self.write(KPU_BASE + Reg.HOST_SIZE, len(prog.image))
        self.write(KPU_BASE + Reg.CTRL, 1)
        t0 = time.monotonic()
        while (status := self.reg(Reg.STATUS)) & 1:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the block still runs after {timeout} s (pc {status >> 16})")
            time.sleep(poll)
        if status & 4 or not status & 2:
            raise RuntimeError(f"the nano-KPU stopped with {Err((status >> 8) & 0xFF).name} at pc {status >> 16}")
        start = min(prog.symbols["y"], prog.symbols["route"]) & ~3   # the outputs: only they are read back
        host = bytes(start) + self.read_bytes(MEM_BASE + start, len(prog.image) - start)
        return {"outputs": prog.outputs(host), "cycles": self.reg(Reg.CYCLES), "instrs": self.reg(Reg.INSTRS),
                "loads": self.read_words(KPU_BASE + LOADS_BASE, cfg.n_experts)}


def add_arguments(parser) -> None:
    parser.add_argument("--port", required=True, help="serial port of the board (e.g. /dev/ttyUSB0, COM3)")
    parser.add_argument("--baud", type=int, default=115200)
    parser.add_argument("--profile", default="tiny", help="the profile the board was built with")
    whole = " or ".join(b for b, spec in BOARDS.items() if spec.unit == KPU_UNIT)
    parts = " or ".join(b for b, spec in BOARDS.items() if spec.unit != KPU_UNIT)
    parser.add_argument("--board", default="ulx3s", choices=sorted(BOARDS),
                        help=f"the board build: {whole} (the whole nano-KPU runs the block) or {parts} "
                             "(the GEMM engine runs the block's GEMMs, the PC the rest)")
    parser.add_argument("--tokens", type=int, default=8, help="tokens of the block")
    parser.add_argument("--gemm", type=int, nargs=3, default=None, metavar=("M", "K", "N"),
                        help="icebreaker: run one random GEMM of this shape instead of a block")
    parser.add_argument("--seed", type=int, default=1, help="random block and batch, or GEMM operands")


def run(args) -> int:
    import numpy as np

    from golden.block import latent_moe_int, random_block
    from nanokpu.compiler import compile_block
    from nanokpu.config import profile

    cfg = profile(args.profile)
    whole_kpu = BOARDS[args.board].unit == KPU_UNIT
    if args.gemm is not None:
        if whole_kpu:
            raise ValueError(f"gemm: one GEMM runs on a GEMM engine build (icebreaker), not on {args.board}")
        return _run_gemm(args, cfg)
    Q, xq, _, _ = random_block(cfg, args.tokens, np.random.default_rng(args.seed))
    prog = compile_block(Q, xq, cfg)
    t0 = time.monotonic()
    if not whole_kpu:
        result = _run_block_on_gemm_board(args, cfg, prog)
        where = (f"{result['gemms']} GEMMs ({result['macs']} MACs) on the board, the rest on the PC; "
                 f"{_traffic_text(result['traffic'])}")
    else:
        result = KpuClient.open(args.port, args.baud).run_block(prog)
        where = f"{result['cycles']} cycles on the board"
    ref = latent_moe_int(xq, Q, cfg)
    exact = all(np.array_equal(result["outputs"][k], ref[k]) for k in ("y", "idx", "weights", "loads"))
    print(f"{args.profile} block, {args.tokens} tokens, seed {args.seed}: {result['instrs']} instructions, "
          f"{where} ({time.monotonic() - t0:.1f} s with the UART transfers); "
          f"bit-exact with golden.block.latent_moe_int: {'yes' if exact else 'NO'}")
    return 0 if exact else 1


def _run_block_on_gemm_board(args, cfg, prog) -> dict:
    """The compiled block ``prog`` in :class:`~nanokpu.funcsim.FuncSim`, its GEMMs on the
    iCEBreaker build: ``outputs``, ``instrs``, ``gemms`` and ``macs`` (those run on the board).
    Raises ``RuntimeError`` when the program stops with an error."""
    from nanokpu.bridge_client import gemm_client, run_gemm
    from nanokpu.funcsim import FuncSim

    client = gemm_client(serial_port(args.port, args.baud), cfg)
    sim = FuncSim(cfg, prog.image, gemm=lambda a, b, mult, shift: run_gemm(client, cfg, a, b, mult=mult, shift=shift))
    res = sim.run(prog.instrs)
    if res.error != Err.NONE:
        raise RuntimeError(f"the program stopped with {res.error.name} at pc {res.pc}")
    return {"outputs": prog.outputs(sim.host), "instrs": res.retired, "gemms": len(res.gemms), "macs": res.macs,
            "traffic": client.traffic}


def _traffic_text(traffic: dict) -> str:
    """``BridgeClient.traffic`` as a user reads it."""
    return (f"{traffic['bytes_out']:,} bytes to the board, {traffic['bytes_in']:,} back, "
            f"{traffic['waits']:,} waits for its answer")


def _run_gemm(args, cfg) -> int:
    """``board-run --board icebreaker --gemm M K N``: one random GEMM on the board, checked bit for bit."""
    import numpy as np

    from golden.intops import matmul_int, requantize
    from nanokpu.bridge_client import gemm_client, run_gemm

    m, k, n = args.gemm
    if min(m, k, n) < 1:
        raise ValueError(f"gemm = {m} {k} {n}: M, K and N must be at least 1")
    rng = np.random.default_rng(args.seed)
    a, b = rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, n))
    shift = max((k << 14).bit_length() - 8, 0)   # |a @ b| < k * 2**14: the result spans int8
    client = gemm_client(serial_port(args.port, args.baud), cfg)
    t0 = time.monotonic()
    got = run_gemm(client, cfg, a, b, mult=1, shift=shift)
    out_width = client.outputs["c_out.payload"][1] // cfg.rows
    want = requantize(matmul_int(a, b, cfg.acc_width), 1, shift, out_width, cfg.rounding)
    exact = np.array_equal(got, want)
    print(f"{cfg.name} GEMM [{m}, {k}] @ [{k}, {n}] >> {shift}, seed {args.seed}, on the board "
          f"({time.monotonic() - t0:.1f} s with the UART transfers; {_traffic_text(client.traffic)}): bit-exact with "
          f"golden.intops.requantize(matmul_int(...)): {'yes' if exact else 'NO'}")
    return 0 if exact else 1
