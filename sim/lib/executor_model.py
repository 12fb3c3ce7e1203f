"""Behavioural models around one nano-KPU executor (:mod:`nanokpu.kpu.executors`) for the Amaranth
simulator: its scratchpad, and the controller's side of its handshake."""

from __future__ import annotations

__all__ = ["serve_scratchpad", "run_instruction"]


async def serve_scratchpad(ctx, port, spad: dict, one_write_port: bool = False, stall: float = 0.0,
                           rng=None, writes: list | None = None):
    """Serve the scratchpad client ``port`` (:func:`~nanokpu.kpu.spad.spad_client_signature`)
    from ``spad`` (word address -> value; absent words read 0) as
    :class:`~nanokpu.kpu.dmem.DataMemory` behaves: read data (``rd0``: every lane, the words
    from its address on) after the edge that took the read, held otherwise; a write (its
    enabled upper lanes too) lands at its edge. With ``one_write_port`` (ECP5's build)
    ``blocked`` is high in the cycle after a write, and a read issued then is not performed;
    with ``stall`` it is also high at random in that fraction of the cycles (``rng``, a NumPy
    Generator). Addresses wrap modulo ``2**len(addr)``. ``writes``, if given, gets each write's
    ``(addr, lanes written)``. Runs forever: add it with ``add_process``."""
    size, lanes = 1 << len(port.rd0.addr), len(port.rd0.lanes)
    async for _c, _r, e0, a0, e1, a1, wen, waddr, wdata, upper, upper_en, blocked in ctx.tick().sample(
            port.rd0.en, port.rd0.addr, port.rd1.en, port.rd1.addr, port.wr.en, port.wr.addr, port.wr.data,
            port.wr.upper, port.wr.upper_en, port.blocked):
        if e0 and not blocked:
            ctx.set(port.rd0.data, spad.get(a0, 0))
            for i in range(lanes):
                ctx.set(port.rd0.lanes[i], spad.get((a0 + i) % size, 0))
        if e1 and not blocked:
            ctx.set(port.rd1.data, spad.get(a1, 0))
        if wen:
            spad[waddr] = wdata
            for i in range(lanes - 1):
                if upper_en >> i & 1:
                    spad[(waddr + 1 + i) % size] = upper[i]
            if writes is not None:
                writes.append((waddr, 1 + bin(upper_en).count("1")))
        ctx.set(port.blocked, int(bool(wen) and one_write_port or bool(stall) and rng.random() < stall))


async def run_instruction(ctx, executor, fields: dict, limit: int = 100_000) -> dict:
    """Start ``executor`` on the decoded instruction ``fields`` (a mapping for its ``ins``), wait
    for ``done``; returns ``{"cycles": cycles from start to done, "error": its error}``."""
    ctx.set(executor.ins, fields)
    ctx.set(executor.start, 1)
    await ctx.tick()
    ctx.set(executor.start, 0)
    cycles = 1
    while not ctx.get(executor.done):
        await ctx.tick()
        cycles += 1
        assert cycles < limit, f"no done within {limit} cycles"
    return {"cycles": cycles, "error": ctx.get(executor.error)}
