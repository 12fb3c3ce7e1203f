"""nanokpu.host.kda: the KDA mixer lowered to a nano-KPU program, bit for bit against golden
kda_int on FuncSim (one call of T tokens, and decode steps in a row carrying the state in host
memory); its argument errors."""

import numpy as np
import pytest

from golden import fidelity, k3
from golden import kda as KD
from nanokpu.config import profile
from nanokpu.host.funcsim import FuncSim
from nanokpu.host.kda import compile_kda, read_state


def _mixer(scheme: str, seed: int, T: int):
    cfg = profile("tiny", layer_ops=True, **(fidelity.AFTER if scheme == "after" else {}))
    rng = np.random.default_rng(seed)
    Q, x_q = KD.quantize_kda(k3.init_kda(cfg, rng), rng.standard_normal((T, cfg.d_model)) * 2, cfg)
    return cfg, Q, x_q


@pytest.mark.parametrize("scheme", ["tensor", "after"])
@pytest.mark.parametrize("T", [1, 5])
def test_kda_program_is_kda_int(scheme, T):
    """One call of T tokens from a random state (S and the conv tails over their ranges): y and the
    state after it == golden kda_int's; per tensor and in the after scheme (per-channel weight
    scales: the conv's and the projections' requantisers from per-column tables; score_frac 16: the
    gate's sigmoid up to 2**16, MUL's factor 18 bits)."""
    cfg, Q, x_q = _mixer(scheme, T, T)
    rng = np.random.default_rng(T + 100)
    state = KD.random_state(cfg, rng)
    y, after = KD.kda_int(x_q, Q, cfg, state)
    prog = compile_kda(x_q, Q, cfg, state)
    sim = FuncSim(cfg, prog.image)
    res = sim.run(prog.instrs)
    assert res.error.name == "NONE", res
    got = read_state(prog, sim.host)
    assert np.array_equal(prog.outputs(sim.host), y)
    assert np.array_equal(got.S, after.S) and np.array_equal(got.conv, after.conv)
    assert not np.array_equal(after.S, state.S)          # the call moved the state


def test_kda_program_runs_decode_steps_in_a_row():
    """4 decode steps: the same program run again with the next token's x written into host memory,
    the state carried there by the program itself, == golden kda_int token by token (and == one call
    of the 4 tokens)."""
    cfg, Q, x_q = _mixer("tensor", 7, 4)
    prog = compile_kda(x_q[:1], Q, cfg)
    assert len(prog.instrs) == 40               # the README's figure
    host = bytearray(prog.image)
    state, ys = None, []
    for t in range(4):
        host[prog.symbols["x"]:prog.symbols["x"] + cfg.d_model] = x_q[t].astype(np.int8).tobytes()
        sim = FuncSim(cfg, host)
        assert sim.run(prog.instrs).error.name == "NONE"
        host = bytearray(sim.host)
        y, state = KD.kda_int(x_q[t:t + 1], Q, cfg, state)
        assert np.array_equal(prog.outputs(host), y), t
        ys.append(y)
    got = read_state(prog, host)
    assert np.array_equal(got.S, state.S) and np.array_equal(got.conv, state.conv)
    assert np.array_equal(np.concatenate(ys), KD.kda_int(x_q, Q, cfg)[0])


def test_kda_program_errors_name_the_argument():
    cfg, Q, x_q = _mixer("tensor", 1, 2)
    with pytest.raises(ValueError, match="layer_ops"):
        compile_kda(x_q, Q, profile("tiny"))
    with pytest.raises(ValueError, match="x_q"):
        compile_kda(x_q[:, :-1], Q, cfg)
    with pytest.raises(ValueError, match="x_q: 200 tokens"):            # the GEMM engine's limit
        compile_kda(np.zeros((200, cfg.d_model), dtype=np.int64), Q, cfg)
    with pytest.raises(ValueError, match="x_q: 4 tokens need"):         # the scratchpad's
        compile_kda(x_q[:1].repeat(4, axis=0), Q, cfg.replace(dmem_depth=1024))
    with pytest.raises(ValueError, match="imem_depth = 32"):
        compile_kda(x_q, Q, cfg.replace(imem_depth=32))
