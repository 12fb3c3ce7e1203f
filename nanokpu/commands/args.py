"""Argument types of the ``nanokpu`` commands: argparse checks each value as it parses it, so a
bad one stops the command with one line naming its flag (exit status 2) before any work starts.

>>> parser.add_argument("--tokens", type=int_in(1, 64))
>>> parser.add_argument("--out", type=out_file)
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["int_in", "seed", "fraction", "positive_float", "out_file", "out_dir", "in_file"]

#: Largest seed: NumPy's generators and cocotb's RANDOM_SEED take 32-bit seeds.
SEED_MAX = 2 ** 32 - 1


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An integer in ``[lo, hi]`` (no upper bound if ``hi`` is None)."""
    allowed = f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {allowed}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{value}: must be {allowed}")
        return value

    parse.__name__ = "integer"
    return parse


#: A random seed: an integer in ``[0, SEED_MAX]``.
seed = int_in(0, SEED_MAX)


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number")
    return value


def fraction(text: str) -> float:
    """A number in ``[0, 1)``."""
    value = _float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value:g}: must be in [0, 1)")
    return value


def positive_float(text: str) -> float:
    """A finite number ``> 0``."""
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g}: must be > 0")
    return value


def _creatable(path: Path) -> None:
    """``path`` can be made: its nearest existing ancestor is a writable directory."""
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"{str(path)!r}: {str(ancestor)!r} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{str(path)!r}: {str(ancestor)!r} is not writable")


def out_file(text: str) -> Path:
    """A file the command will write: not a directory, and its folder exists or can be made."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: is a directory, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: is not writable")
    _creatable(path)
    return path


def out_dir(text: str) -> Path:
    """A directory the command will write into: not a file, and it exists or can be made."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: is a file, not a directory")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{text!r}: is not writable")
    else:
        _creatable(path)
    return path


def in_file(text: str) -> Path:
    """A file the command reads: it must exist."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: no such file")
    return path
