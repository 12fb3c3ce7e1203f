"""``nanokpu generate``: the Verilog of every unit of a profile, reproducible (``emit_src=False``), and the
config it was built from.

The units are those of :data:`nanokpu.designs.UNITS`. ``rtl/<profile>/`` is the committed output:
``<unit>.v``, ``config.json`` (the :class:`~nanokpu.config.KpuConfig`, read back by
:func:`read_config`) and ``nanokpu.h`` (the C header of :mod:`nanokpu.header`: register map,
opcodes, error codes, instruction layout and the config's sizes). ``tests/commands/test_generate.py``
fails when any of them is stale.
"""

from __future__ import annotations

import json
from pathlib import Path

from nanokpu.commands import ROOT
from nanokpu.commands.args import out_dir
from nanokpu.config import PROFILES, KpuConfig, config_from_dict, config_to_dict, profile
from nanokpu.designs import UNITS, resolve_unit, top_name
from nanokpu.header import c_header

#: The profiles whose Verilog is committed under rtl/.
COMMITTED_PROFILES = ("tiny", "small")

RTL_DIR = ROOT / "rtl"


def verilog_of(unit: str, cfg) -> str:
    from amaranth.back import verilog
    return verilog.convert(resolve_unit(unit)(cfg), name=top_name(unit), emit_src=False)


def config_json(cfg: KpuConfig) -> str:
    """``cfg`` as JSON (:func:`~nanokpu.config.config_to_dict`): one key per field, in field order."""
    return json.dumps(config_to_dict(cfg), indent=2) + "\n"


def read_config(path: Path) -> KpuConfig:
    """The config of a ``config.json`` written by :func:`config_json` (validated again)."""
    return config_from_dict(json.loads(Path(path).read_text()))


def artefacts(profile_name: str) -> dict[str, str]:
    """The files written next to the Verilog of ``profile_name``: file name -> text."""
    cfg = profile(profile_name)
    return {"config.json": config_json(cfg),
            "nanokpu.h": c_header(cfg, f"nanokpu generate --profile {profile_name}")}


def generate(profile_name: str, out_dir: Path, units: list[str] | None = None) -> list[Path]:
    """Write ``<out_dir>/<unit>.v`` for ``units`` (default: all) of ``profile_name``, and its
    :func:`artefacts` (``config.json``, ``nanokpu.h``)."""
    cfg = profile(profile_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for unit in units or sorted(UNITS):
        path = out_dir / f"{unit}.v"
        path.write_text(verilog_of(unit, cfg))
        written.append(path)
    for name, text in artefacts(profile_name).items():
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    return written


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    parser.add_argument("--unit", action="append", choices=sorted(UNITS),
                        help="unit to generate (repeatable; default: all); config.json and nanokpu.h are "
                             "always written")
    parser.add_argument("--out", type=out_dir, default=None,
                        help="output directory (default: rtl/<profile>)")


def run(args) -> int:
    out = args.out or RTL_DIR / args.profile
    for path in generate(args.profile, out, args.unit):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0
