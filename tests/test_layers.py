"""The import rules of the code base (pyproject.toml, ``[tool.importlinter]``) hold, and a broken
rule fails: an upward import added to a copy of the tree breaks the layers contract."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("nanokpu", "golden", "sim", "fpga")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter (the ``test`` extra) on the tree at ``root``, from this interpreter."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--no-cache"], cwd=root, env=env, capture_output=True, text=True)


def test_import_rules_hold():
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("nanokpu/units/pe.py", "import nanokpu.kpu.top", "layers"),                  # a unit imports the top level
    ("nanokpu/config.py", "import nanokpu.isa", "layers"),                        # config imports a contract
    ("nanokpu/host/funcsim.py", "import nanokpu.units.vector", "host software"),  # host software imports gateware
    ("golden/intops.py", "import nanokpu.units.pwl", "layers"),                   # the golden model imports gateware
    ("sim/runner.py", "import nanokpu.commands.simulate", "layers"),              # a bench imports a command
    ("nanokpu/units/router.py", "import golden.block", "units take only"),              # a unit imports the float model
])
def test_a_broken_rule_fails(tmp_path, module, line, contract):
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    out = lint_imports(tmp_path)
    assert out.returncode != 0, f"{module}: `{line}` was not caught\n{out.stdout}"
    broken = [s for s in out.stdout.splitlines() if s.rstrip().endswith("BROKEN")]
    assert any(contract in s for s in broken), out.stdout
