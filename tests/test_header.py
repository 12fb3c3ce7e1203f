"""nanokpu.h compiles with the system C compiler and its macros have the values of isa.py and the config.

The C program prints every macro; the values expected here come from nanokpu.isa, the
KpuConfig and (for STATUS and CTRL) the bit positions nanokpu.kpu.top decodes. ``cc`` is required:
the test fails without it (CI has one).
"""

import dataclasses
import shutil
import subprocess

import pytest

from nanokpu import isa
from nanokpu.config import profile
from nanokpu.header import c_header, config_value

#: STATUS = busy | done << 1 | error << 2 | err << 8 | pc << 16 and CTRL bits as nanokpu.kpu.top decodes them.
STATUS_SAMPLE = 1 | (0 << 1) | (1 << 2) | (isa.Err.OVERLAP << 8) | (37 << 16)
STATUS_EXPECTED = {"BUSY": 1, "DONE": 0, "ERROR": 1, "CODE": int(isa.Err.OVERLAP), "PC": 37}
CTRL_EXPECTED = {"CTRL_START": 1, "CTRL_SOFT_RESET": 2, "CTRL_CLEAR_LOADS": 4}

#: An instruction that sets every field (values distinct from their neighbours).
SAMPLE_INSTR = isa.Instr(op=isa.Op.GEMM, flags=isa.F_HOST_EXPERT | isa.F_RQ_EXPERT, m=3, k=0xBEEF, n=77,
                         a=0xABCDEF, b=0x123456, c=0xFEDCBA, host=0xDEADBEEF, stride=0x8000_0001,
                         mult=0x7654_3210, shift=63, width=8, target=0xFFF)


def expected_ints(cfg) -> dict[str, int]:
    """Macro name (without NANOKPU_) -> integer value, from isa.py and cfg."""
    values = {f"REG_{r.name}": int(r) for r in isa.Reg}
    values |= {f"REG_BUSY_{e.upper()}": isa.Reg.BUSY + 4 * i for i, e in enumerate(isa.EXECUTORS)}
    values |= {f"EXECUTOR_{e.upper()}": i for i, e in enumerate(isa.EXECUTORS)}
    values |= {"N_EXECUTORS": len(isa.EXECUTORS), "IMEM_BASE": isa.IMEM_BASE, "LOADS_BASE": isa.LOADS_BASE,
               "ADDR_WIDTH": isa.ADDR_WIDTH}
    values |= {f"OP_{op.name}": int(op) for op in isa.Op}
    values |= {f"ERR_{err.name}": int(err) for err in isa.Err}
    values |= {"F_M_COUNT": isa.F_M_COUNT, "F_HOST_EXPERT": isa.F_HOST_EXPERT, "F_RQ_EXPERT": isa.F_RQ_EXPERT}
    values |= {"INSTR_BITS": isa.INSTR_BITS, "INSTR_WORDS": isa.INSTR_WORDS, "INSTR_BYTES": 4 * isa.INSTR_WORDS}
    shift = 0
    for name, width in isa.FIELDS:
        values |= {f"INSTR_{name.upper()}_SHIFT": shift, f"INSTR_{name.upper()}_WIDTH": width}
        shift += width
    values |= {f.name.upper(): config_value(cfg, f.name) for f in dataclasses.fields(cfg)
               if type(config_value(cfg, f.name)) is int}
    values |= {"BUS_BYTES": isa.bus_bytes(cfg), "WORD_WIDTH": isa.word_width(cfg),
               "SCORE_WIDTH": cfg.score_width, "WEIGHT_WIDTH": cfg.weight_width}
    values |= CTRL_EXPECTED
    return values


def c_program(cfg) -> str:
    ints = "".join(f'    printf("{n} %lld\\n", (long long)(NANOKPU_{n}));\n' for n in expected_ints(cfg))
    strs = "".join(f'    printf("{f.name.upper()} %s\\n", NANOKPU_{f.name.upper()});\n'
                   for f in dataclasses.fields(cfg) if isinstance(getattr(cfg, f.name), str))
    reals = "".join(f'    printf("{f.name.upper()} %.17g\\n", (double)(NANOKPU_{f.name.upper()}));\n'
                    for f in dataclasses.fields(cfg) if isinstance(getattr(cfg, f.name), float))
    status = "".join(f'    printf("STATUS_{n} %lu %lu\\n", (unsigned long)NANOKPU_STATUS_{n}(s), '
                     f'(unsigned long)((s & NANOKPU_STATUS_{n}_MASK) >> NANOKPU_STATUS_{n}_SHIFT));\n'
                     for n in STATUS_EXPECTED)
    puts = "".join(f"    put(w, NANOKPU_INSTR_{name.upper()}_SHIFT, NANOKPU_INSTR_{name.upper()}_WIDTH, "
                   f"{getattr(SAMPLE_INSTR, name)}u);\n" for name, _ in isa.FIELDS)
    return f"""\
#include <stdint.h>
#include <stdio.h>
#include "nanokpu.h"
#include "nanokpu.h" /* the include guard */

static void put(uint32_t *w, unsigned shift, unsigned width, uint32_t value)
{{
    unsigned i;
    for (i = 0; i < width; i++)
        if ((value >> i) & 1u)
            w[(shift + i) / 32] |= 1u << ((shift + i) % 32);
}}

int main(void)
{{
    uint32_t s = {STATUS_SAMPLE}u;
    uint32_t w[NANOKPU_INSTR_WORDS] = {{0}};
    int i;
{ints}{strs}{reals}{status}{puts}    for (i = 0; i < NANOKPU_INSTR_WORDS; i++)
        printf("WORD%d %lu\\n", i, (unsigned long)w[i]);
    return 0;
}}
"""


def run_c(cfg, tmp_path) -> dict[str, str]:
    cc = shutil.which("cc")
    assert cc, "no C compiler `cc` on PATH: the header test needs one"
    (tmp_path / "nanokpu.h").write_text(c_header(cfg, f"nanokpu generate --profile {cfg.name}"))
    (tmp_path / "main.c").write_text(c_program(cfg))
    build = subprocess.run([cc, "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-o", "main", "main.c"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


@pytest.mark.parametrize("profile_name", ["tiny", "small"])
def test_header_compiles_and_matches_isa_and_config(profile_name, tmp_path):
    cfg = profile(profile_name)
    out = run_c(cfg, tmp_path)
    for name, value in expected_ints(cfg).items():
        assert int(out[name]) == value, f"NANOKPU_{name} = {out[name]}, expected {value}"
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, str):
            assert out[f.name.upper()] == value
        elif isinstance(value, float):
            assert float(out[f.name.upper()]) == value, f"NANOKPU_{f.name.upper()}"
    for name, value in STATUS_EXPECTED.items():
        assert out[f"STATUS_{name}"] == f"{value} {value}", f"NANOKPU_STATUS_{name}"
    assert [int(out[f"WORD{i}"]) for i in range(isa.INSTR_WORDS)] == SAMPLE_INSTR.words()


def test_header_tiny_spot_values(tmp_path):
    """A few values written out, so a naming slip on both sides cannot hide."""
    out = run_c(profile("tiny"), tmp_path)
    assert int(out["REG_STATUS"]) == 0x04
    assert int(out["REG_BUSY_GEMM"]) == 0x24
    assert int(out["IMEM_BASE"]) == 0x80000
    assert int(out["OP_GEMM"]) == 3
    assert int(out["ERR_BAD_SHAPE"]) == 3
    assert (int(out["INSTR_HOST_SHIFT"]), int(out["INSTR_HOST_WIDTH"])) == (136, 32)
    assert (int(out["ROWS"]), int(out["ACC_WIDTH"]), int(out["DMEM_DEPTH"])) == (4, 24, 8192)
    assert out["ROUNDING"] == "half_even"


def test_header_is_deterministic_and_names_its_command():
    cfg = profile("small")
    text = c_header(cfg, "nanokpu generate --profile small")
    assert text == c_header(profile("small"), "nanokpu generate --profile small")
    assert text.splitlines()[0].startswith("/* nanokpu.h: generated by `nanokpu generate --profile small`")
    assert "#ifndef NANOKPU_H" in text and text.endswith("#endif /* NANOKPU_H */\n")
    names = [line.split()[1] for line in text.splitlines() if line.startswith("#define")]
    assert len(names) == len(set(names))
    assert all(name.startswith("NANOKPU_") for name in names)


def test_hand_status_and_ctrl_values_agree_with_isa():
    """The STATUS sample and CTRL bits above (written from nanokpu.kpu.top) are isa's layouts."""
    fields = isa.status_fields(STATUS_SAMPLE)
    assert {name: getattr(fields, name.lower()) for name in STATUS_EXPECTED} == STATUS_EXPECTED
    assert {f"CTRL_{n.upper()}": isa.ctrl_word(**{n: 1}) for n, _ in isa.CTRL_LAYOUT} == CTRL_EXPECTED
