"""The ``nanokpu`` subcommands, one module each: ``add_arguments(parser)`` and ``run(args) -> int``.

The top layer of the package: the only code besides :mod:`nanokpu.cli` that imports the cocotb
benches (:mod:`sim`) and the synthesis flows (:mod:`fpga`); nothing imports it but the CLI.
"""

from pathlib import Path

#: The repository root (the folder that holds ``rtl/``, ``docs/`` and ``fpga/``).
ROOT = Path(__file__).resolve().parents[2]

#: Where the commands write the reports they regenerate.
DOCS = ROOT / "docs"
