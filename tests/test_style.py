"""The code base stays ruff-clean (configuration in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_clean():
    """ruff comes with the ``test`` extra; it runs from this interpreter, not from PATH."""
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--quiet", "."], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
