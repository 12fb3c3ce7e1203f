"""``nanokpu generate``: the Verilog of every unit of a profile, reproducible (``emit_src=False``).

The units are those of :data:`nanokpu.designs.UNITS`. ``rtl/<profile>/<unit>.v`` is the committed output and
``tests/test_generate.py`` fails when it is stale.
"""

from __future__ import annotations

from pathlib import Path

from nanokpu.commands import ROOT
from nanokpu.config import PROFILES, profile
from nanokpu.designs import UNITS, resolve_unit, top_name

#: The profiles whose Verilog is committed under rtl/.
COMMITTED_PROFILES = ("tiny", "small")

RTL_DIR = ROOT / "rtl"


def verilog_of(unit: str, cfg) -> str:
    from amaranth.back import verilog
    return verilog.convert(resolve_unit(unit)(cfg), name=top_name(unit), emit_src=False)


def generate(profile_name: str, out_dir: Path, units: list[str] | None = None) -> list[Path]:
    """Write ``<out_dir>/<unit>.v`` for ``units`` (default: all) of ``profile_name``."""
    cfg = profile(profile_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for unit in units or sorted(UNITS):
        path = out_dir / f"{unit}.v"
        path.write_text(verilog_of(unit, cfg))
        written.append(path)
    return written


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    parser.add_argument("--unit", action="append", choices=sorted(UNITS),
                        help="unit to generate (repeatable; default: all)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: rtl/<profile>)")


def run(args) -> int:
    out = args.out or RTL_DIR / args.profile
    for path in generate(args.profile, out, args.unit):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0
